/**
 * An OpenAI-compatible HTTP server in front of the local {@link PolicyEngine}: `GET /v1/models`,
 * `POST /v1/completions` (text or token-id prompts) and `POST /v1/chat/completions` (messages, `tools`, tool calls
 * parsed back into `tool_calls`); both stream as server-sent events with `stream: true`.
 *
 * **Token ids.** Every choice carries `token_ids` (the sampled ids) and the response carries `policy_version`, so
 * the project's own `OpenAiCompatSampler` (and vLLM-style clients) can train on exactly what was sampled. The
 * vLLM extensions `return_token_ids`, `return_tokens_as_token_ids` (logprob tokens written `token_id:<id>`),
 * `stop_token_ids`, `top_k`, `skip_special_tokens` and `include_stop_str_in_output` are accepted.
 *
 * **Prompt logprobs** (a distillation teacher's scores, `docs/algorithms.md`): vLLM's `prompt_logprobs: k` (0–20)
 * on `/v1/completions` adds to each choice the logprob of every prompt token given the ones before it, in vLLM's
 * shape (`[null, { "<id>": { logprob, rank, decoded_token }, …k likeliest }, …]`), computed on the engine's own
 * session with the weights it serves now (`PolicyEngine.score`), always at temperature 1 (vLLM's raw logprobs,
 * whatever the request samples with). Not with `stream: true`, nor on chat. `POST /tokenize` (at the root, as
 * vLLM's) answers a text's ids.
 *
 * **Fields** (`internal/openAiRequest.ts`, shared with the gateway; the wire format both speak is
 * `internal/openAiWire.ts`): every field of OpenAI's documented request is
 * accepted, those not served ignored (`tool_choice`, penalties, `user`, `metadata`, ...); a field that is neither
 * OpenAI's nor read here, or a value outside OpenAI's range (`temperature` 0–2, `n` ≥ 1, ...), is a 400 naming it
 * in `param`, in OpenAI's words.
 *
 * **Errors.** A bad request gets an OpenAI-style body `{ error: { message, type, param, code } }` with a 4xx
 * status (400 invalid request, 404 unknown route or model, 405, 413 body too large); an engine failure is a 5xx.
 * The server never crashes on input. Every check (the body, the parameters, the chat template, tokenization, the
 * context, the vocabulary, the limits below) runs before the status line is written, so a bad `stream: true`
 * request gets the same 4xx JSON body as the same request without streaming; only an engine failure during
 * sampling can end a stream with an error event.
 *
 * **Limits** ({@link Options}, checked in this order, each before the work it bounds): the body size (from
 * `Content-Length`, then as it is read); the number of prompts (before the body is decoded); the tokens a request
 * asks for, its prompts' tokens plus `max_tokens` per prompt (token-id prompts and `max_tokens` are counted before
 * any text is tokenized; text is tokenized prompt by prompt against what is left). A text longer than the context
 * (or the budget) by its length alone is refused untokenized, and a long text is tokenized in pieces only until it
 * passes the limit (`internal/promptBudget.ts`).
 *
 * **Fair scheduling.** The server, not the engine's first-come queue, decides which sequence joins the batch: at most
 * `maxRunning` sequences are in the engine at once, at most `maxRunningPerRequest` of one request, and a free place
 * goes to the requests with a waiting sequence in turn. A request of 20,000 prompts then holds a few places of the
 * batch, and a small request sent beside it starts at the next step and decodes in a batch that is not full (a
 * decode step of the tiny model takes several times longer at batch 32 than at batch 1, so a small request decoded
 * beside a full batch is that much slower even when it never waits). The price is a lone many-prompt request's
 * batch: `maxRunningPerRequest` instead of the engine's `maxBatchSize` (BENCHMARKS.md, `bench/server.ts`).
 * Requests of one prompt each (what `OpenAiCompatSampler` sends) are one lane each and fill the batch as before.
 *
 * **Weights that follow a learner** ({@link Options} `acceptWeights`, `agentfly serve --accept-weights`): `PUT
 * /v1/weights` with a safetensors body (every parameter of the model, float32 or 16-bit, Hugging Face names) and an
 * `x-policy-version` header swaps the engine's weights; requests already decoding finish on their version, new ones
 * use the new one. A request may carry `min_policy_version` (this server's extension): a server whose weights are
 * older answers 409 `policy_version_behind` instead of sampling, so that a trainer's rollouts never use weights
 * older than it asked for (`actors/InferenceServers.ts`). The versions are the pushing run's (`x-run-id`): within a
 * run they must increase (else 409 `stale_policy_version`), and another run's push replaces the weights whatever
 * its version. A bad body is a 400 naming the tensor, a missing or wrong bearer token (when one is set) a 401.
 *
 * **LoRA adapters** (`internal/openAiServerAdapters.ts`, with `acceptWeights` and {@link Options} `loraBase`): vLLM's
 * `POST /v1/load_lora_adapter` / `unload_lora_adapter` (`{ lora_name, lora_path }`, a PEFT folder on this machine);
 * a request whose `model` names a loaded adapter samples with it, and its response carries `lora_adapter: { name,
 * digest, policy_version }` so that a trainer can check it sampled what it published.
 *
 * **Strangers** ({@link Options} `token`, `internal/auth.ts`): with a token, every route answers 401 to a request
 * without it, before its body is read; at most `maxConcurrent` requests are answered at once (503 past it). Without a
 * token the server listens on loopback only.
 *
 * **Streaming.** Tokens are written as they are sampled (the engine's per-token callback). With `tools`, text is
 * streamed until a tool-call tag starts; the parsed calls follow in one `tool_calls` delta at the end.
 *
 * The server is plain `node:http` owned by a scope: closing the scope stops listening, ends open connections and
 * interrupts the requests they were waiting for.
 *
 * @since 0.1.0
 */
import * as Http from "node:http"
import { Effect, FiberSet, Semaphore } from "effect"
import type { Scope } from "effect"
import * as Checkpoint from "../src/Checkpoint.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Safetensors from "../src/Safetensors.ts"
import * as Auth from "./internal/auth.ts"
import * as HttpActor from "./internal/http.ts"
import * as Fair from "./internal/fairScheduler.ts"
import * as Adapters from "./internal/openAiServerAdapters.ts"
import * as Answers from "./internal/openAiServerAnswers.ts"
import * as State from "./internal/openAiServerState.ts"
import * as Tokenize from "./internal/openAiServerTokenize.ts"
import * as Wire from "./internal/openAiWire.ts"
import { charsPerTokenBound } from "./internal/promptBudget.ts"
import { PolicyEngine } from "./PolicyEngine.ts"

// ===== Models =====

/**
 * What the server needs to know about the model besides the engine: its name and text-side files.
 *
 * @category models
 * @since 0.1.0
 */
export type Model = State.Model

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Default `127.0.0.1`. */
  readonly host?: string
  /** Default 0: a free port. */
  readonly port?: number
  /** Largest request body accepted, in bytes (default 4 MiB: 20,000 prompts of 40 token ids). */
  readonly maxBodyBytes?: number
  /** Most prompts in one `/v1/completions` request (default 32,768). */
  readonly maxPrompts?: number
  /**
   * Most tokens one request may ask for: the sum over its prompts of the prompt's tokens plus its `max_tokens`
   * (capped at the context, which no sequence outgrows). Default 2,097,152: 32,768 prompts of 64 tokens, or about
   * two minutes of the tiny model's decoding.
   */
  readonly maxRequestTokens?: number
  /**
   * Most sequences the server keeps in the engine at once (default 32): set it to the engine's `maxBatchSize`, so
   * that every sequence the server admits joins the batch at the next step instead of queueing in the engine.
   */
  readonly maxRunning?: number
  /**
   * Most sequences of one request in the engine at once (default 6). Lower it for latency beside large requests,
   * raise it (up to `maxRunning`) for the throughput of a lone many-prompt request. On the tiny model (CPU, batch 32)
   * a small request beside a 20,000-prompt one took 1.5–1.6× its time alone at 4, 1.6–1.7× at 6, 1.7–2.4× at 8
   * and 5–7× at 32; the lone large request decoded at roughly 40–90 % of its whole-batch rate at 6
   * (`bench/server.ts`).
   */
  readonly maxRunningPerRequest?: number
  /**
   * Render a chat request's `tools` into the prompt (default true). A policy trained with `agent.renderTools: false`
   * learned its tools from demonstrations and never saw their schemas: serve it with false, and its tool calls are
   * still parsed against the request's `tools`.
   */
  readonly renderTools?: boolean
  /**
   * Accept new weights from a learner over `PUT /v1/weights` (default: not accepted, a 404). With `token`, the
   * request must carry `Authorization: Bearer <token>`.
   */
  readonly acceptWeights?: { readonly token?: string | undefined } | undefined
  /**
   * The base weights LoRA adapters are merged into (`POST /v1/load_lora_adapter`, with `acceptWeights`): the model
   * folder's. Without them a load is refused.
   */
  readonly loraBase?: Qwen2.Weights | undefined
  /**
   * Bearer token(s) every route requires (`AGENTFLY_SERVE_TOKEN` or `agentfly serve --token-file`), checked in
   * constant time before anything else; the weights token (`acceptWeights.token`, `AGENTFLY_WEIGHTS_TOKEN`) is
   * accepted on every route too, and when it is set only it may replace the weights. With neither, every client is
   * served, and the server listens on loopback only: a non-loopback `host` without a token is refused at start.
   */
  readonly token?: string | ReadonlyArray<string> | undefined
  /** Most requests answered at once (default 256); past it a request gets 503 `overloaded` before its body is read. */
  readonly maxConcurrent?: number
}

/**
 * The defaults of {@link Options} (the `agentfly serve` flags show the same values).
 *
 * @category models
 * @since 0.1.0
 */
export const defaults = {
  host: "127.0.0.1",
  maxBodyBytes: 4 * 1024 * 1024,
  maxPrompts: 32_768,
  maxRequestTokens: 2_097_152,
  maxRunning: 32,
  maxRunningPerRequest: 6,
  maxConcurrent: 256
} as const

/**
 * A running server.
 *
 * @category models
 * @since 0.1.0
 */
export interface Server {
  readonly port: number
  /** The API root, e.g. `http://127.0.0.1:8000/v1`. */
  readonly baseUrl: string
}

// ===== Weights =====

/** The `x-policy-version` of a push, checked against the requester's rights first. */
const pushedVersion = (state: State.ServerState, req: Http.IncomingMessage): Effect.Effect<number, Wire.ApiError> => {
  const accept = state.limits.acceptWeights
  if (accept === undefined) {
    const message = "this server does not accept weights (start it with --accept-weights)"
    return Effect.fail(new Wire.ApiError({ status: 404, message, code: "weights_not_accepted" }))
  }
  if (req.method !== "PUT") return Effect.fail(Wire.notAllowed(req.method ?? "GET", "/v1/weights", "PUT"))
  if (state.weightsAuth !== undefined && !Auth.authorize(state.weightsAuth, req).ok) {
    const message = "a valid bearer token is required to replace the weights"
    return Effect.fail(new Wire.ApiError({ status: 401, message, code: "unauthorized" }))
  }
  const header = req.headers["x-policy-version"]
  const version = typeof header === "string" && /^-?\d+$/.test(header.trim()) ? Number(header) : undefined
  return version === undefined || !Number.isSafeInteger(version) ?
    Effect.fail(Wire.invalid("the x-policy-version header must be an integer policy version", "x-policy-version")) :
    Effect.succeed(version)
}

/** Swaps the engine's weights for a push's, labelled `version`, unless they are this run's and not newer. */
const swapWeights = (state: State.ServerState, version: number, from: string, weights: Qwen2.Weights) =>
  state.pushing.withPermits(1)(Effect.gen(function*() {
    const current = yield* State.currentLabel(state)
    if (from === state.owner && version <= current) {
      return yield* new Wire.ApiError({
        status: 409,
        message: `policy version ${version} is not newer than this server's ${current}`,
        code: "stale_policy_version"
      })
    }
    const next = (yield* state.engine.policyVersion) + 1
    yield* state.engine.updateWeights(next, weights).pipe(Effect.mapError((e) =>
      new Wire.ApiError({ status: e.reason._tag === "SessionFailed" ? 500 : 400, message: e.message })
    ))
    state.labels.set(next, version)
    // Results of older generations may still be decoding; a few dozen pushes back is plenty.
    if (state.labels.size > 64) state.labels.delete(state.labels.keys().next().value!)
    state.owner = from
    return { policy_version: version }
  }))

/** `PUT /v1/weights`: a learner's new weights, checked tensor by tensor before the engine swaps them in. */
const putWeights = Effect.fnUntraced(function*(state: State.ServerState, req: Http.IncomingMessage) {
  const version = yield* pushedVersion(state, req)
  const bytes = yield* Wire.readBytes(req, state.maxWeightBytes)
  const weights = yield* Safetensors.parse(bytes, "the request body").pipe(
    Effect.flatMap((parsed) => Safetensors.readFloat32(parsed, "the request body", state.parameters)),
    Effect.mapError((e) => Wire.invalid(e.message))
  )
  const bad = Checkpoint.firstNonFinite(weights)
  if (bad !== undefined) return yield* Wire.invalid(`the weights are not finite (${bad}); nothing was replaced`)
  const from = typeof req.headers["x-run-id"] === "string" ? req.headers["x-run-id"] : ""
  return yield* swapWeights(state, version, from, weights)
})

// ===== Routes =====

/** The state a request samples with: the base's, or a loaded LoRA adapter's that its `model` names. */
const stateFor = (state: State.ServerState, body: unknown): Effect.Effect<State.ServerState, Wire.ApiError> => {
  const name = (body as { model?: unknown } | null)?.model
  const target = Adapters.stateFor(state, name)
  if (target !== undefined) return Effect.succeed(target)
  const served = [state.model.name, ...state.adapters.loaded.keys()].map((n) => JSON.stringify(n)).join(", ")
  const message = `model ${JSON.stringify(name)} does not exist; this server has ${served}`
  return Effect.fail(new Wire.ApiError({ status: 404, message, param: "model", code: "model_not_found" }))
}

const models = Effect.fnUntraced(function*(state: State.ServerState) {
  const created = yield* State.now
  const version = yield* State.currentLabel(state)
  return {
    object: "list",
    data: [
      { id: state.model.name, object: "model", created, owned_by: "agentfly", policy_version: version },
      ...Adapters.modelEntries(state, created)
    ]
  }
})

/** A sampling route: POST only; `stream: true` answered as events, else as one JSON body. */
const sampling = (
  state: State.ServerState,
  req: Http.IncomingMessage,
  res: Http.ServerResponse,
  path: string,
  whole: (state: State.ServerState, body: unknown) => Effect.Effect<unknown, Wire.ApiError>,
  stream: (state: State.ServerState, body: unknown, res: Http.ServerResponse) => Effect.Effect<void, Wire.ApiError>
): Effect.Effect<void, Wire.ApiError> =>
  req.method !== "POST" ?
    Effect.fail(Wire.notAllowed(req.method ?? "GET", path, "POST")) :
    Wire.readJson(req, state.limits.maxBodyBytes).pipe(
      Effect.flatMap((body) =>
        Effect.flatMap(stateFor(state, body), (target) =>
          (body as { stream?: unknown } | null)?.stream === true ?
            stream(target, body, res) :
            Effect.flatMap(whole(target, body), (value) => Wire.sendJson(res, 200, Adapters.stamp(target, value))))
      )
    )

const route = (
  state: State.ServerState,
  req: Http.IncomingMessage,
  res: Http.ServerResponse
): Effect.Effect<void, Wire.ApiError> => {
  // Before the route, the body or any state: a stranger gets the same 401 everywhere.
  if (!Auth.authorize(state.auth, req).ok) {
    return Effect.fail(Wire.unauthorized("AGENTFLY_SERVE_TOKEN, or AGENTFLY_WEIGHTS_TOKEN"))
  }
  const path = (req.url ?? "/").split("?")[0]!.replace(/\/+$/, "")
  switch (path) {
    case "/v1/models":
      return Effect.flatMap(models(state), (value) => Wire.sendJson(res, 200, value))
    case "/v1/weights":
      return Effect.flatMap(putWeights(state, req), (value) => Wire.sendJson(res, 200, value))
    case "/v1/load_lora_adapter":
      return Effect.flatMap(Adapters.load(state, req), (value) => Wire.sendJson(res, 200, value))
    case "/v1/unload_lora_adapter":
      return Effect.flatMap(Adapters.unload(state, req), (value) => Wire.sendJson(res, 200, value))
    case "/v1/completions":
      return sampling(state, req, res, path, Answers.completions, Answers.completionsStream)
    case "/v1/chat/completions":
      return sampling(state, req, res, path, Answers.chat, Answers.chatStream)
    case "/tokenize":
      return req.method !== "POST" ?
        Effect.fail(Wire.notAllowed(req.method ?? "GET", path, "POST")) :
        Wire.readJson(req, state.limits.maxBodyBytes).pipe(
          Effect.flatMap((body) => Effect.flatMap(stateFor(state, body), (target) => Tokenize.tokenize(target, body))),
          Effect.flatMap((value) => Wire.sendJson(res, 200, value))
        )
    default:
      return Effect.fail(Wire.notFound(`no route ${req.method} ${path}`))
  }
}

// ===== Constructor =====

/**
 * Starts the server in the current scope.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("OpenAiServer.make")(function*(model: Model, options: Options = {}) {
  const engine = yield* PolicyEngine
  const config = engine.config
  const run = yield* FiberSet.makeRuntime<never>()
  const limits = { ...defaults, ...options }
  const weightsToken = options.acceptWeights?.token
  const own = typeof options.token === "string" ? [options.token] : options.token ?? []
  const auth = Auth.tokens([...own, weightsToken])
  const problem = Auth.bindProblem(limits.host, auth, "AGENTFLY_SERVE_TOKEN or --token-file")
  if (problem !== undefined) return yield* Effect.die(new Error(problem))
  const parameters = Qwen2.parameters(config)
  const state: State.ServerState = {
    engine,
    config,
    model,
    limits,
    perRequest: Math.max(1, Math.min(limits.maxRunningPerRequest, limits.maxRunning)),
    slots: Fair.makeSlots(limits.maxRunning),
    charsPerToken: charsPerTokenBound(model.tokenizer),
    labels: new Map(),
    owner: undefined,
    pushing: yield* Semaphore.make(1),
    parameters,
    maxWeightBytes: parameters.reduce((n, p) => n + 4 * p.shape.reduce((a, b) => a * b, 1), 0) + (1 << 20),
    counter: { ids: 0 },
    adapters: {
      base: options.loraBase,
      scope: yield* Effect.scope,
      loaded: new Map(),
      maxBatchSize: limits.maxRunning
    },
    auth,
    weightsAuth: weightsToken === undefined || weightsToken === "" ? undefined : Auth.tokens([weightsToken]),
    gate: Auth.gate(limits.maxConcurrent)
  }
  const respond = (req: Http.IncomingMessage, res: Http.ServerResponse) =>
    Auth.within(state.gate, route(state, req, res), Effect.fail(Wire.overloaded(state.gate.max)))
  const server = Http.createServer(Wire.handler(run, respond))
  const port = yield* HttpActor.listen(server, { port: options.port ?? 0, host: limits.host })
  const result: Server = { port, baseUrl: `http://${limits.host}:${port}/v1` }
  return result
}) satisfies (model: Model, options?: Options) => Effect.Effect<Server, never, PolicyEngine | Scope.Scope>
