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
 * **Fields** (`internal/openAiRequest.ts`, shared with the gateway): every field of OpenAI's documented request is
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
 * passes the limit ({@link encodeWithin}).
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
 * **Streaming.** Tokens are written as they are sampled (the engine's per-token callback). With `tools`, text is
 * streamed until a tool-call tag starts; the parsed calls follow in one `tool_calls` delta at the end.
 *
 * The server is plain `node:http` owned by a scope: closing the scope stops listening, ends open connections and
 * interrupts the requests they were waiting for.
 *
 * @since 0.1.0
 */
import { createHash } from "node:crypto"
import * as Http from "node:http"
import { Clock, Data, Deferred, Effect, Fiber, FiberSet, Option, Schema, Semaphore } from "effect"
import type { Scope } from "effect"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import * as Checkpoint from "../src/Checkpoint.ts"
import type * as Message from "../src/Message.ts"
import type { ModelConfig } from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Safetensors from "../src/Safetensors.ts"
import type { FinishReason, GenerateRequest, GenerateResult, SamplerError, SamplingParams } from "../src/Sampler.ts"
import type * as Tokenizer from "../src/Tokenizer.ts"
import * as SchemaIssues from "../src/internal/schemaIssues.ts"
import * as ToolCallParser from "../src/ToolCallParser.ts"
import * as HttpActor from "./internal/http.ts"
import * as OpenAiRequest from "./internal/openAiRequest.ts"
import { PolicyEngine, validateRequest } from "./PolicyEngine.ts"

// ===== Models =====

/**
 * What the server needs to know about the model besides the engine: its name and text-side files.
 *
 * @category models
 * @since 0.1.0
 */
export interface Model {
  readonly name: string
  readonly tokenizer: Tokenizer.Tokenizer
  readonly template: ChatTemplate.ChatTemplate
  /** Ids that end a turn: they stop every completion unless the request sets `ignore_eos` (vLLM's extension). */
  readonly stopTokenIds: ReadonlyArray<number>
}

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
   * a small request beside a 20,000-prompt one took 1.5–1.6× its time alone at 4, 1.6–1.7× at 6, 1.7–2.4× at 8 and
   * 5–7× at 32; the lone large request decoded at roughly 40–90 % of its whole-batch rate at 6 (`bench/server.ts`).
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
  maxRunningPerRequest: 6
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

/** An error answered to the client (internal: never leaves this module). */
class ApiError extends Data.TaggedError("ApiError")<{
  readonly status: number
  readonly message: string
  readonly param?: string
  readonly code?: string
}> {}

const invalid = (message: string, param?: string) =>
  new ApiError(param === undefined ? { status: 400, message } : { status: 400, message, param })

// ===== Request schemas =====

const Sampling = {
  model: Schema.optionalKey(Schema.String),
  max_tokens: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  max_completion_tokens: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  temperature: Schema.optionalKey(Schema.NullOr(Schema.Number)),
  top_p: Schema.optionalKey(Schema.NullOr(Schema.Number)),
  top_k: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  seed: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  n: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  stop: Schema.optionalKey(Schema.NullOr(Schema.Union([Schema.String, Schema.Array(Schema.String)]))),
  stop_token_ids: Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.Int))),
  ignore_eos: Schema.optionalKey(Schema.Boolean),
  stream: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  /** `include_usage`: a streamed chat ends with a chunk of usage (no choices), as OpenAI's does. */
  stream_options: Schema.optionalKey(
    Schema.NullOr(Schema.Struct({ include_usage: Schema.optionalKey(Schema.NullOr(Schema.Boolean)) }))
  ),
  skip_special_tokens: Schema.optionalKey(Schema.Boolean),
  include_stop_str_in_output: Schema.optionalKey(Schema.Boolean),
  return_token_ids: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  return_tokens_as_token_ids: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  /** This server's extension: refuse (409) rather than sample with weights older than this policy version. */
  min_policy_version: Schema.optionalKey(Schema.NullOr(Schema.Int))
}

const CompletionRequest = Schema.Struct({
  ...Sampling,
  prompt: Schema.Union([
    Schema.String,
    Schema.Array(Schema.Int),
    Schema.Array(Schema.String),
    Schema.Array(Schema.Array(Schema.Int))
  ]),
  logprobs: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  echo: Schema.optionalKey(Schema.NullOr(Schema.Boolean))
})

const ChatCompletionRequest = Schema.Struct({
  ...Sampling,
  messages: Schema.Array(Schema.Unknown).check(Schema.isMinLength(1)),
  tools: Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.Unknown))),
  tool_choice: Schema.optionalKey(Schema.Unknown),
  logprobs: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  top_logprobs: Schema.optionalKey(Schema.NullOr(Schema.Int))
})

type SamplingFields = { readonly [K in keyof typeof Sampling]?: (typeof Sampling)[K]["Type"] }

// A Schema refusal as OpenAI's: `max_tokens: Expected number | null, got "5"`, the field in `param`; then the rules
// both servers share (`internal/openAiRequest.ts`): a field that is neither OpenAI's nor read here, a value out of
// OpenAI's range, `n` > 1.
const decode = <S extends Schema.Struct<Schema.Struct.Fields> & { readonly DecodingServices: never }>(
  schema: S,
  body: unknown,
  endpoint: OpenAiRequest.Endpoint
) =>
  Schema.decodeUnknownEffect(schema)(body).pipe(
    Effect.mapError((e) => {
      const [first] = SchemaIssues.formatIssues(schema, e.issue)
      const param = first === undefined ? undefined : /^([A-Za-z_]+)/.exec(first)?.[1]
      return invalid(first ?? e.message, param)
    }),
    Effect.tap(() => {
      const refused = OpenAiRequest.check(body as Record<string, unknown>, endpoint, Object.keys(schema.fields))
      if (refused === undefined) return Effect.void
      const { code, ...rest } = refused
      return Effect.fail(new ApiError({ status: 400, ...rest, ...(code === undefined ? {} : { code }) }))
    })
  )

// ===== Helpers =====

/** Decoded text of `ids` that ends in an incomplete UTF-8 sequence is held back until it completes. */
const stableText = (text: string): string => (text.endsWith("\uFFFD") ? text.replace(/\uFFFD+$/, "") : text)

const makeText = (model: Model, skipSpecial: boolean) => {
  const special = new Set(
    [...model.tokenizer.addedTokens.entries()].filter(([t]) => t.startsWith("<|")).map(([, id]) => id)
  )
  return (ids: ReadonlyArray<number>): string =>
    model.tokenizer.decode(ids.filter((id) => model.tokenizer.isValidId(id) && !(skipSpecial && special.has(id))))
}

// ===== Parameters and limits =====

/**
 * The sampling parameters of a request, whose ranges `decode` checked (the engine checks them again, in its names,
 * with {@link validateRequest}); the stops checked against the model.
 */
const samplingOf = Effect.fnUntraced(function*(model: Model, config: ModelConfig, body: SamplingFields, chat: boolean) {
  const maxTokens = body.max_completion_tokens ?? body.max_tokens ?? (chat ? 256 : 16)
  const temperature = body.temperature ?? 1
  const topP = body.top_p ?? undefined
  const topK = body.top_k ?? undefined
  const stopIds = new Set(body.stop_token_ids ?? [])
  const badStop = [...stopIds].find((id) => id < 0 || id >= config.vocabSize)
  if (badStop !== undefined) {
    const message = `stop_token_ids: ${badStop} is outside the vocabulary [0, ${config.vocabSize})`
    return yield* invalid(message, "stop_token_ids")
  }
  if (body.ignore_eos !== true) for (const id of model.stopTokenIds) stopIds.add(id)
  const stops = body.stop === undefined || body.stop === null ?
    [] :
    typeof body.stop === "string" ?
    [body.stop] :
    body.stop
  // A stop string is text: its tokens as the model writes it ("\n", "é" in two bytes, "<|im_end|>"); this server
  // stops on single tokens, so a string of several is refused rather than matched on something else.
  for (const s of stops) {
    const ids = model.tokenizer.encode(s)
    if (ids.length !== 1) {
      return yield* invalid(
        `stop string ${JSON.stringify(s)} is ${ids.length} tokens, not a single token; this server stops on single ` +
          "tokens: use stop_token_ids",
        "stop"
      )
    }
    stopIds.add(ids[0]!)
  }
  const sampling: SamplingParams = {
    temperature,
    maxTokens,
    stopTokenIds: [...stopIds],
    ...(topP === undefined ? {} : { topP }),
    ...(topK === undefined || topK === -1 ? {} : { topK }),
    ...(body.seed === undefined || body.seed === null ? {} : { seed: body.seed })
  }
  return sampling
})

/** The engine's own checks (prompt, context, vocabulary, parameters) as a 400, before anything is answered. */
const checked = (config: ModelConfig, request: GenerateRequest, param: string) => {
  const error = validateRequest(config, request)
  return error === undefined ? Effect.succeed(request) : Effect.fail(invalid(error.message, param))
}

/**
 * The most characters one token can stand for. A vocabulary's token strings are at least as long as the text they
 * decode to (byte-level BPE writes one character per byte, SentencePiece `▁` per space, byte fallback `<0xNN>` per
 * byte); the factor 4 covers normalizers that shorten text before it is split (NFC composes at most 3 code units
 * into one).
 */
const charsPerTokenBound = (tokenizer: Tokenizer.Tokenizer): number => {
  let longest = 1
  for (let id = 0; id < tokenizer.vocabSize; id++) longest = Math.max(longest, tokenizer.idToToken(id)?.length ?? 0)
  for (const token of tokenizer.addedTokens.keys()) longest = Math.max(longest, token.length)
  return 4 * longest
}

/** Texts longer than this are counted in pieces of about `piece` characters before they are tokenized whole. */
const piece = 4096

const isSpace = (c: string | undefined) => c === undefined || /\s/.test(c)

/**
 * Where to cut `text` near `at`: at a space between two non-spaces, where the pre-tokenizers of GPT-2-style
 * byte-level BPE (Qwen, Llama 3) and SentencePiece split anyway, so the pieces' tokens are the whole text's; else
 * (a run of `piece / 2` characters without such a space) right at `at`, keeping surrogate pairs whole.
 */
const cutNear = (text: string, at: number): { readonly at: number; readonly exact: boolean } => {
  for (let i = at; i > at - piece / 2; i--) {
    if (text[i] === " " && !isSpace(text[i - 1]) && !isSpace(text[i + 1])) return { at: i, exact: true }
  }
  const code = text.charCodeAt(at)
  return { at: code >= 0xdc00 && code <= 0xdfff ? at - 1 : at, exact: false }
}

/**
 * The token ids of `text` if there are at most `limit`, else a count known to exceed it (`exact: false`: a lower
 * bound). A text longer than `limit × charsPerToken` is refused from its length; one longer than two pieces is
 * first tokenized piece by piece, stopping as soon as the count passes `limit` (with a slack of 16 tokens per cut
 * that is not at a space, where a piece's tokens may differ from the whole text's). Only a text within the limit
 * is tokenized whole, so a 4 MB prompt costs at most about `limit` tokens' worth of tokenizing.
 *
 * **Gotchas**: a single word of hundreds of thousands of letters is still slow to tokenize within the limit
 * (@huggingface/tokenizers' BPE is quadratic in a word's length); the body limit bounds it.
 *
 * @category validation
 * @since 0.1.0
 */
export const encodeWithin = (
  tokenizer: Tokenizer.Tokenizer,
  charsPerToken: number,
  text: string,
  limit: number
): { readonly ids: ReadonlyArray<number> } | { readonly over: number; readonly exact: boolean } => {
  const lower = Math.ceil(text.length / charsPerToken)
  if (lower > limit) return { over: lower, exact: false }
  if (text.length > 2 * piece) {
    let count = 0, slack = 0
    for (let from = 0; from < text.length;) {
      const cut = from + piece >= text.length ? { at: text.length, exact: true } : cutNear(text, from + piece)
      count += tokenizer.encode(text.slice(from, cut.at)).length
      if (!cut.exact) slack += 16
      if (count > limit + slack) return { over: count - slack, exact: false }
      from = cut.at
    }
  }
  const ids = tokenizer.encode(text)
  return ids.length > limit ? { over: ids.length, exact: true } : { ids }
}

/** What a prompt of `n` known tokens adds to a request's token budget: its tokens and its completion's. */
const asked = (config: ModelConfig, sampling: SamplingParams, promptTokens: number) =>
  promptTokens + Math.min(sampling.maxTokens, config.maxPositionEmbeddings)

const tooManyTokens = (n: number, exact: boolean, max: number, param: string) =>
  invalid(
    `the request asks for ${exact ? "" : "at least "}${n} tokens (its prompts' tokens plus max_tokens per prompt); ` +
      `this server takes at most ${max} per request`,
    param
  )

const overContext = (n: number, exact: boolean, config: ModelConfig, param: string) =>
  invalid(
    `the prompt has ${exact ? "" : "at least "}${n} tokens; the context holds ${config.maxPositionEmbeddings}`,
    param
  )

// ===== Fair scheduling =====

/** One request's sequences waiting for a place in the batch. */
interface Lane {
  readonly waiting: Array<Deferred.Deferred<void>>
  /** In `Slots.turns`. */
  queued: boolean
}

/** The places in the engine's batch, given to the requests with a waiting sequence in turn. */
interface Slots {
  readonly capacity: number
  running: number
  readonly turns: Array<Lane>
}

const grant = (slots: Slots): void => {
  while (slots.running < slots.capacity && slots.turns.length > 0) {
    const lane = slots.turns.shift()!
    const next = lane.waiting.shift()!
    if (lane.waiting.length > 0) slots.turns.push(lane)
    else lane.queued = false
    slots.running++
    Deferred.doneUnsafe(next, Effect.void)
  }
}

const leave = (slots: Slots): void => {
  slots.running--
  grant(slots)
}

/**
 * Runs `effect` (one sequence) once its lane's turn comes and the batch has a free place, and frees the place when
 * it ends. A sequence interrupted while it waits gives its turn up (or its place, if it was granted meanwhile).
 */
const withSlot = <A, E, R>(slots: Slots, lane: Lane, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.uninterruptibleMask((restore) => {
    const turn = Deferred.makeUnsafe<void>()
    lane.waiting.push(turn)
    if (!lane.queued) {
      lane.queued = true
      slots.turns.push(lane)
    }
    grant(slots)
    const giveUp = Effect.sync(() => {
      if (Deferred.isDoneUnsafe(turn)) return leave(slots)
      lane.waiting.splice(lane.waiting.indexOf(turn), 1)
      if (lane.waiting.length === 0 && lane.queued) {
        lane.queued = false
        slots.turns.splice(slots.turns.indexOf(lane), 1)
      }
    })
    return restore(Deferred.await(turn)).pipe(
      Effect.onInterrupt(() => giveUp),
      Effect.andThen(Effect.ensuring(restore(effect), Effect.sync(() => leave(slots))))
    )
  })

const samplerError = (e: SamplerError) =>
  new ApiError(
    e.reason._tag === "BadRequest" ?
      { status: 400, message: e.message } :
      e.reason._tag === "Overloaded" ?
      { status: 429, message: e.message } :
      { status: e.reason._tag === "Closed" ? 503 : 500, message: e.message, code: e.reason._tag }
  )

const parseArguments = (args: string): unknown =>
  Option.getOrElse(Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))(args), () => args)

const roles = ["system", "user", "assistant", "tool"]

/** OpenAI messages → our Message schema: tool-call arguments arrive as JSON strings. */
const conversation = (body: typeof ChatCompletionRequest.Type) => {
  // A role the API does not know is named as such, not as a mismatch with each of the union's members.
  const badRole = body.messages.findIndex((m) => !roles.includes((m as { role?: unknown })?.role as string))
  if (badRole !== -1) {
    const role = (body.messages[badRole] as { role?: unknown })?.role
    return Effect.fail(invalid(
      `messages[${badRole}].role: expected "system", "user", "assistant" or "tool", got ${JSON.stringify(role)}`,
      `messages[${badRole}].role`
    ))
  }
  const messages = body.messages.map((m) => {
    const calls = (m as { tool_calls?: unknown }).tool_calls
    if (!Array.isArray(calls)) return m
    return {
      ...(m as object),
      tool_calls: calls.map((c) => {
        const fn = (c as { function?: { arguments?: unknown } })?.function
        // A malformed argument string stays a string: the template renders it as the model wrote it.
        return typeof fn?.arguments === "string" ?
          { ...c, function: { ...fn, arguments: parseArguments(fn.arguments) } } :
          c
      })
    }
  })
  return ChatTemplate.decodeConversation({ messages, tools: body.tools ?? [] }).pipe(
    Effect.mapError((e) => invalid(e.message, "messages"))
  )
}

const openAiToolCalls = (calls: ReadonlyArray<Message.ToolCall>) =>
  calls.map((c, index) => ({
    index,
    id: c.id,
    type: "function" as const,
    function: {
      name: c.function.name,
      arguments: typeof c.function.arguments === "string" ? c.function.arguments : JSON.stringify(c.function.arguments)
    }
  }))

const finishOf = (reason: FinishReason, calls: number) => (calls > 0 ? "tool_calls" : reason)

const usage = (prompt: number, completion: number) => ({
  prompt_tokens: prompt,
  completion_tokens: completion,
  total_tokens: prompt + completion
})

/** The body's bytes within `maxBody` (`internal/http.ts`), its failures as API errors. */
const readBytes = (req: Http.IncomingMessage, maxBody: number) =>
  Effect.mapError(HttpActor.readBody(req, maxBody), (e) => new ApiError({ status: e.status, message: e.message }))

/** The body as JSON; a body over `maxBody` is refused from its `Content-Length`, or as soon as it passes the limit. */
const readBody = (req: Http.IncomingMessage, maxBody: number) =>
  Effect.flatMap(readBytes(req, maxBody), (bytes) =>
    Effect.try({
      try: () => JSON.parse(bytes.toString("utf8")) as unknown,
      catch: () => invalid("the request body is not valid JSON")
    }))

/** Prompts in a raw `/v1/completions` body, counted before it is decoded. */
const promptCount = (raw: unknown): number => {
  const prompt = (raw as { prompt?: unknown } | null)?.prompt
  return Array.isArray(prompt) && prompt.length > 0 && typeof prompt[0] !== "number" ? prompt.length : 1
}

const sendJson = (res: Http.ServerResponse, status: number, value: unknown) =>
  Effect.sync(() => {
    if (res.headersSent) return res.end()
    res.writeHead(status, { "content-type": "application/json" })
    res.end(JSON.stringify(value))
  })

const errorBody = (e: ApiError) => ({
  error: {
    message: e.message,
    type: e.status >= 500 ? "server_error" : "invalid_request_error",
    param: e.param ?? null,
    code: e.code ?? null
  }
})

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
  const perRequest = Math.max(1, Math.min(limits.maxRunningPerRequest, limits.maxRunning))
  const slots: Slots = { capacity: Math.max(1, limits.maxRunning), running: 0, turns: [] }
  const charsPerToken = charsPerTokenBound(model.tokenizer)
  let counter = 0
  const nextId = (prefix: string) => `${prefix}-${++counter}`
  const now = Effect.map(Clock.currentTimeMillis, (ms) => Math.floor(ms / 1000))

  /** One sequence of a request (its lane), once the fair scheduler gives it a place in the batch. */
  const generate = (lane: Lane, request: GenerateRequest, onToken?: (id: number, lp: number) => void) =>
    withSlot(slots, lane, engine.generate(request, { onToken }).pipe(Effect.mapError(samplerError))).pipe(
      Effect.map((result) => ({ ...result, policyVersion: labelOf(result.policyVersion) }))
    )
  const newLane = (): Lane => ({ waiting: [], queued: false })

  // The policy version a client sees is the label its learner pushed the weights with. The engine's own versions
  // count pushes (they must increase), and a new run may push versions below the last run's: `owner` is the run
  // whose weights these are, and a push from another run replaces them whatever its version (one run at a time).
  const labels = new Map<number, number>()
  let owner: string | undefined
  const labelOf = (engineVersion: number) => labels.get(engineVersion) ?? engineVersion
  const currentLabel = Effect.map(engine.policyVersion, labelOf)
  const pushing = yield* Semaphore.make(1)

  /** A request's `min_policy_version` against the weights new requests get now. */
  const atLeast = (min: number | null | undefined) =>
    min === undefined || min === null ? Effect.void : Effect.flatMap(currentLabel, (current) =>
      current >= min ? Effect.void : Effect.fail(
        new ApiError({
          status: 409,
          message: `this server's weights are policy version ${current}; the request asks for at least ${min}`,
          param: "min_policy_version",
          code: "policy_version_behind"
        })
      ))

  const parameters = Qwen2.parameters(config)
  // Every parameter's float32 bytes, plus room for the safetensors header.
  const maxWeightBytes = parameters.reduce((n, p) => n + 4 * p.shape.reduce((a, b) => a * b, 1), 0) + (1 << 20)

  /** `PUT /v1/weights`: a learner's new weights, checked tensor by tensor before the engine swaps them in. */
  const putWeights = (req: Http.IncomingMessage) =>
    Effect.gen(function*() {
      const accept = options.acceptWeights
      if (accept === undefined) {
        return yield* new ApiError({
          status: 404,
          message: "this server does not accept weights (start it with --accept-weights)",
          code: "weights_not_accepted"
        })
      }
      if (req.method !== "PUT") {
        return yield* new ApiError({ status: 405, message: `${req.method} is not allowed on /v1/weights; use PUT` })
      }
      if (accept.token !== undefined && req.headers.authorization !== `Bearer ${accept.token}`) {
        const message = "a valid bearer token is required to replace the weights"
        return yield* new ApiError({ status: 401, message, code: "unauthorized" })
      }
      const header = req.headers["x-policy-version"]
      const version = typeof header === "string" && /^-?\d+$/.test(header.trim()) ? Number(header) : undefined
      if (version === undefined || !Number.isSafeInteger(version)) {
        return yield* invalid("the x-policy-version header must be an integer policy version", "x-policy-version")
      }
      const bytes = yield* readBytes(req, maxWeightBytes)
      const weights = yield* Safetensors.parse(bytes, "the request body").pipe(
        Effect.flatMap((parsed) => Safetensors.readFloat32(parsed, "the request body", parameters)),
        Effect.mapError((e) => invalid(e.message))
      )
      const bad = Checkpoint.firstNonFinite(weights)
      if (bad !== undefined) return yield* invalid(`the weights are not finite (${bad}); nothing was replaced`)
      const from = typeof req.headers["x-run-id"] === "string" ? req.headers["x-run-id"] : ""
      return yield* pushing.withPermits(1)(Effect.gen(function*() {
        const current = yield* currentLabel
        if (from === owner && version <= current) {
          return yield* new ApiError({
            status: 409,
            message: `policy version ${version} is not newer than this server's ${current}`,
            code: "stale_policy_version"
          })
        }
        const next = (yield* engine.policyVersion) + 1
        yield* engine.updateWeights(next, weights).pipe(Effect.mapError((e) =>
          new ApiError({ status: e.reason._tag === "SessionFailed" ? 500 : 400, message: e.message })
        ))
        labels.set(next, version)
        // Results of older generations may still be decoding; a few dozen pushes back is plenty.
        if (labels.size > 64) labels.delete(labels.keys().next().value!)
        owner = from
        return { policy_version: version }
      }))
    })

  /** Tokenizes `text` (a prompt, or a rendered chat) within the context and what is left of the budget. */
  const encodePrompt = (text: string, left: number, param: string) => {
    const encoded = encodeWithin(model.tokenizer, charsPerToken, text, Math.min(config.maxPositionEmbeddings, left))
    if ("ids" in encoded) return Effect.succeed(encoded.ids)
    return Effect.fail(
      encoded.over > config.maxPositionEmbeddings ?
        overContext(encoded.over, encoded.exact, config, param) :
        tooManyTokens(limits.maxRequestTokens - left + encoded.over, false, limits.maxRequestTokens, param)
    )
  }

  const completionText = (result: GenerateResult, ids: ReadonlyArray<number>, body: SamplingFields) => {
    const keepStop = body.include_stop_str_in_output === true
    const shown = result.finishReason === "stop" && !keepStop ? ids.slice(0, -1) : ids
    return makeText(model, body.skip_special_tokens ?? true)(shown)
  }

  /** Every check of a `/v1/completions` body, cheapest first; nothing is sampled and no status line is written. */
  const completionRequests = Effect.fnUntraced(function*(raw: unknown, stream: boolean) {
    const count = promptCount(raw)
    if (count > limits.maxPrompts) {
      const message = `the request has ${count} prompts; this server takes at most ${limits.maxPrompts}`
      return yield* invalid(message, "prompt")
    }
    if (stream && count !== 1) return yield* invalid("stream: true takes a single prompt", "prompt")
    const body = yield* decode(CompletionRequest, raw, "completion")
    yield* atLeast(body.min_policy_version)
    const prompts: ReadonlyArray<string | ReadonlyArray<number>> =
      typeof body.prompt === "string" ? [body.prompt] : body.prompt.length > 0 && typeof body.prompt[0] === "number"
      ? [body.prompt as ReadonlyArray<number>]
      : (body.prompt as ReadonlyArray<string | ReadonlyArray<number>>)
    if (prompts.length === 0) return yield* invalid("the prompt is empty", "prompt")
    const sampling = yield* samplingOf(model, config, body, false)
    // The budget before any text is tokenized: token-id prompts exactly, text prompts by their length.
    let known = 0, bound = 0
    for (const p of prompts) {
      known += typeof p === "string" ? asked(config, sampling, 0) : asked(config, sampling, p.length)
      if (typeof p === "string") bound += Math.ceil(p.length / charsPerToken)
    }
    if (known + bound > limits.maxRequestTokens) {
      return yield* tooManyTokens(known + bound, bound === 0, limits.maxRequestTokens, "prompt")
    }
    const requests: Array<GenerateRequest> = []
    for (const p of prompts) {
      let ids = p as ReadonlyArray<number>
      if (typeof p === "string") {
        ids = yield* encodePrompt(p, limits.maxRequestTokens - known, "prompt")
        known += ids.length
        // Tokenizing thousands of prompts must not stall the decode loop (the same thread) for long.
        if (requests.length % 64 === 63) yield* Effect.yieldNow
      }
      requests.push(yield* checked(config, { promptTokenIds: ids, sampling }, "prompt"))
    }
    return { body, requests }
  })

  const logprobToken = (id: number, asIds: boolean) => (asIds ? `token_id:${id}` : model.tokenizer.decode([id]))

  /** `stream: true` on /v1/completions: one event per sampled token (its text delta may be empty). */
  const completionsStream = Effect.fnUntraced(function*(raw: unknown, res: Http.ServerResponse) {
    const { body, requests } = yield* completionRequests(raw, true)
    const request = requests[0]!
    const id = nextId("cmpl"), created = yield* now
    const event = (choice: Record<string, unknown>) =>
      `data: ${
        JSON.stringify({
          id,
          object: "text_completion",
          created,
          model: model.name,
          choices: [{ index: 0, ...choice }]
        })
      }\n\n`
    const text = makeText(model, body.skip_special_tokens ?? true)
    const stop = new Set(request.sampling.stopTokenIds)
    const asIds = body.return_tokens_as_token_ids === true
    const withLogprobs = body.logprobs !== undefined && body.logprobs !== null
    const shown: Array<number> = []
    let sent = 0
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" })
    const onToken = (tokenId: number, logprob: number) => {
      if (!stop.has(tokenId) || body.include_stop_str_in_output === true) shown.push(tokenId)
      const current = stableText(text(shown))
      const delta = current.length > sent ? current.slice(sent) : ""
      sent = Math.max(sent, current.length)
      res.write(event({
        text: delta,
        token_ids: [tokenId],
        logprobs: withLogprobs ? { tokens: [logprobToken(tokenId, asIds)], token_logprobs: [logprob] } : null,
        finish_reason: null
      }))
    }
    const result = yield* generate(newLane(), request, onToken)
    const full = text(shown)
    res.write(event({
      text: full.length > sent ? full.slice(sent) : "",
      token_ids: [],
      finish_reason: result.finishReason,
      policy_version: result.policyVersion
    }))
    res.end("data: [DONE]\n\n")
  })

  const completions = Effect.fnUntraced(function*(raw: unknown) {
    const { body, requests } = yield* completionRequests(raw, false)
    const lane = newLane()
    const results = yield* Effect.forEach(requests, (r) => generate(lane, r), { concurrency: perRequest })
    const asIds = body.return_tokens_as_token_ids === true
    const choices = results.map((result, index) => ({
      index,
      text: completionText(result, result.tokenIds, body),
      token_ids: result.tokenIds,
      prompt_token_ids: requests[index]!.promptTokenIds,
      logprobs: body.logprobs === undefined || body.logprobs === null ? null : {
        tokens: result.tokenIds.map((id) => logprobToken(id, asIds)),
        token_logprobs: result.logprobs,
        top_logprobs: result.tokenIds.map((id, i) => ({ [logprobToken(id, asIds)]: result.logprobs[i]! })),
        text_offset: result.tokenIds.map(() => 0)
      },
      finish_reason: result.finishReason,
      policy_version: result.policyVersion
    }))
    const promptTokens = requests.reduce((n, r) => n + r.promptTokenIds.length, 0)
    const completionTokens = results.reduce((n, r) => n + r.tokenIds.length, 0)
    return {
      id: nextId("cmpl"),
      object: "text_completion",
      created: yield* now,
      model: model.name,
      choices,
      usage: usage(promptTokens, completionTokens),
      policy_version: results[0]!.policyVersion
    }
  })

  /** Every check of a `/v1/chat/completions` body; the rendered conversation is tokenized within the limits. */
  const chatRequest = Effect.fnUntraced(function*(raw: unknown) {
    const body = yield* decode(ChatCompletionRequest, raw, "chat")
    yield* atLeast(body.min_policy_version)
    const sampling = yield* samplingOf(model, config, body, true)
    const { messages, tools } = yield* conversation(body)
    const rendered = options.renderTools === false ? [] : tools
    const text = yield* model.template.render(messages, { addGenerationPrompt: true, tools: rendered }).pipe(
      Effect.mapError((e) => invalid(e.message, "messages"))
    )
    const ids = yield* encodePrompt(text, limits.maxRequestTokens - asked(config, sampling, 0), "messages")
    const request = yield* checked(config, { promptTokenIds: ids, sampling }, "messages")
    return { body, tools, request }
  })

  const toolCallsOf = (text: string, tools: ReadonlyArray<unknown>, prompt: ReadonlyArray<number>) => {
    if (tools.length === 0) return { content: text, toolCalls: [] as ReadonlyArray<Message.ToolCall> }
    // Ids unique across a conversation's answers (as OpenAI's: its history holds every turn's calls), and the same
    // for the same seeded answer: a hash of the prompt and the answer.
    const digest = createHash("sha256").update(Int32Array.from(prompt)).update(text).digest("hex").slice(0, 12)
    const parsed = ToolCallParser.parse(model.template.toolCallFormat, text, { idPrefix: `call_${digest}_` })
    return { content: parsed.content, toolCalls: parsed.toolCalls }
  }

  const chatLogprobs = (result: GenerateResult) => ({
    content: result.tokenIds.map((id, i) => {
      const token = model.tokenizer.decode([id])
      return { token, logprob: result.logprobs[i]!, bytes: [...new TextEncoder().encode(token)], top_logprobs: [] }
    })
  })

  const chat = Effect.fnUntraced(function*(raw: unknown) {
    const { body, tools, request } = yield* chatRequest(raw)
    const ids = request.promptTokenIds
    const result = yield* generate(newLane(), request)
    const text = completionText(result, result.tokenIds, { ...body, include_stop_str_in_output: false })
    const { content, toolCalls } = toolCallsOf(text, tools, ids)
    return {
      id: nextId("chatcmpl"),
      object: "chat.completion",
      created: yield* now,
      model: model.name,
      choices: [{
        index: 0,
        message: {
          role: "assistant",
          content: toolCalls.length > 0 && content === "" ? null : content,
          ...(toolCalls.length > 0 ? { tool_calls: openAiToolCalls(toolCalls) } : {})
        },
        logprobs: body.logprobs === true ? chatLogprobs(result) : null,
        finish_reason: finishOf(result.finishReason, toolCalls.length),
        token_ids: result.tokenIds,
        policy_version: result.policyVersion
      }],
      prompt_token_ids: ids,
      usage: usage(ids.length, result.tokenIds.length),
      policy_version: result.policyVersion
    }
  })

  const chatStream = Effect.fnUntraced(function*(raw: unknown, res: Http.ServerResponse) {
    const { body, tools, request } = yield* chatRequest(raw)
    const id = nextId("chatcmpl"), created = yield* now
    const chunk = (delta: Record<string, unknown>, finish: string | null, extra: Record<string, unknown> = {}) =>
      `data: ${
        JSON.stringify({
          id,
          object: "chat.completion.chunk",
          created,
          model: model.name,
          choices: [{ index: 0, delta, finish_reason: finish, ...extra }]
        })
      }\n\n`
    const text = makeText(model, true)
    const stop = new Set(request.sampling.stopTokenIds)
    const sampled: Array<number> = []
    let sent = 0, holding = false
    const toolOpen = tools.length > 0 ? "<tool_call>" : undefined
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" })
    res.write(chunk({ role: "assistant", content: "" }, null))
    const onToken = (tokenId: number, logprob: number) => {
      if (stop.has(tokenId)) return
      sampled.push(tokenId)
      if (holding) return
      let current = stableText(text(sampled))
      const tag = toolOpen === undefined ? -1 : current.indexOf(toolOpen)
      if (tag >= 0) {
        holding = true
        current = current.slice(0, tag)
      } else if (toolOpen !== undefined) {
        // Hold back a suffix that could be the start of the tool-call tag.
        for (let k = Math.min(toolOpen.length - 1, current.length); k > 0; k--) {
          if (toolOpen.startsWith(current.slice(current.length - k))) {
            current = current.slice(0, current.length - k)
            break
          }
        }
      }
      if (current.length > sent) {
        const delta = current.slice(sent)
        const logprobs = { logprobs: { content: [{ token: delta, logprob, top_logprobs: [] }] } }
        res.write(chunk({ content: delta }, null, body.logprobs === true ? logprobs : {}))
        sent = current.length
      }
    }
    const result = yield* generate(newLane(), request, onToken)
    const full = text(sampled)
    const { content, toolCalls } = toolCallsOf(full, tools, request.promptTokenIds)
    if (toolCalls.length === 0 && full.length > sent) res.write(chunk({ content: full.slice(sent) }, null))
    else if (toolCalls.length > 0) {
      const rest = content.length > sent ? content.slice(sent) : ""
      res.write(chunk({ ...(rest === "" ? {} : { content: rest }), tool_calls: openAiToolCalls(toolCalls) }, null))
    }
    const finish = finishOf(result.finishReason, toolCalls.length)
    res.write(chunk({}, finish, { token_ids: result.tokenIds, policy_version: result.policyVersion }))
    if (body.stream_options?.include_usage === true) {
      const counts = usage(request.promptTokenIds.length, result.tokenIds.length)
      res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: model.name, choices: [], usage: counts })}\n\n`)
    }
    res.end("data: [DONE]\n\n")
  })

  const checkModel = (body: unknown) => {
    const name = (body as { model?: unknown } | null)?.model
    return typeof name === "string" && name !== model.name ?
      Effect.fail(
        new ApiError({
          status: 404,
          message: `model ${JSON.stringify(name)} does not exist; this server has ${JSON.stringify(model.name)}`,
          param: "model",
          code: "model_not_found"
        })
      ) :
      Effect.void
  }

  const route = (req: Http.IncomingMessage, res: Http.ServerResponse): Effect.Effect<void, ApiError> => {
    const path = (req.url ?? "/").split("?")[0]!.replace(/\/+$/, "")
    const post = (
      handler: (body: unknown) => Effect.Effect<unknown, ApiError>,
      stream: (body: unknown, res: Http.ServerResponse) => Effect.Effect<void, ApiError>
    ) =>
      req.method !== "POST" ?
        Effect.fail(new ApiError({ status: 405, message: `${req.method} is not allowed on ${path}; use POST` })) :
        readBody(req, limits.maxBodyBytes).pipe(
          Effect.tap(checkModel),
          Effect.flatMap((body) =>
            (body as { stream?: unknown } | null)?.stream === true ?
              stream(body, res) :
              Effect.flatMap(handler(body), (value) => sendJson(res, 200, value))
          )
        )
    switch (path) {
      case "/v1/models":
        return Effect.flatMap(Effect.all([now, currentLabel]), ([created, version]) =>
          sendJson(res, 200, {
            object: "list",
            data: [{ id: model.name, object: "model", created, owned_by: "agentfly", policy_version: version }]
          }))
      case "/v1/weights":
        return Effect.flatMap(putWeights(req), (value) => sendJson(res, 200, value))
      case "/v1/completions":
        return post(completions, completionsStream)
      case "/v1/chat/completions":
        return post(chat, chatStream)
      default:
        return Effect.fail(new ApiError({ status: 404, message: `no route ${req.method} ${path}` }))
    }
  }

  const handle = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
    const fiber = run(
      route(req, res).pipe(
        Effect.catch((e) =>
          res.headersSent ?
            // Mid-stream failure: report it as a final event, then end the stream.
            Effect.sync(() => res.end(`data: ${JSON.stringify(errorBody(e))}\n\ndata: [DONE]\n\n`)) :
            sendJson(res, e.status, errorBody(e))
        ),
        Effect.catchDefect((defect) =>
          sendJson(res, 500, errorBody(new ApiError({ status: 500, message: `internal error: ${String(defect)}` })))
        )
      )
    )
    res.on("close", () => {
      if (!res.writableFinished) run(Fiber.interrupt(fiber))
    })
  }

  const server = Http.createServer(handle)
  const port = yield* HttpActor.listen(server, { port: options.port ?? 0, host: limits.host })
  const result: Server = { port, baseUrl: `http://${limits.host}:${port}/v1` }
  return result
}) satisfies (model: Model, options?: Options) => Effect.Effect<Server, never, PolicyEngine | Scope.Scope>
