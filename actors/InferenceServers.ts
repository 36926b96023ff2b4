/**
 * Inference servers that follow the learner: a run's rollouts are sampled by `agentfly serve --accept-weights`
 * processes (on this machine or others, `engine.servers`), and every policy version the learner publishes is pushed
 * to all of them (`PUT /v1/weights`, safetensors) before any rollout asks for it.
 *
 * - **Sampling.** Each request goes to the least busy server that holds the version asked for or a newer one, as a
 *   token-in / token-out `/completions` call carrying `min_policy_version` (`OpenAiCompatSampler`); a server whose
 *   weights turn out older answers 409 and the request moves on. A server that fails (connection refused, a
 *   timeout, a 5xx, a 429) rests for a moment and the request is retried on the others, so a run survives a dead
 *   server while one is left; a request the servers refuse as bad (a 400) fails as it would on the local engine.
 * - **Weights.** `push` serializes the weights once and sends them to every server at once. It succeeds when at
 *   least one server took them; the others (down, restarted, slow) are brought up to date as soon as they answer
 *   again, before they serve anything. A server that refuses the weights themselves (wrong model, a bad token,
 *   started without `--accept-weights`) stops the run with a sentence naming it. A run whose learner is a trainer
 *   server has it push them instead (a `Carrier`): the weights then never come to this process.
 * - **Versions.** A sample's `policyVersion` is the version the server sampled it with: in `async` mode a rollout
 *   may run on weights newer than the version it asked for (never older); in `sync` mode nothing is pushed while a
 *   batch samples, so every token comes from the version asked for.
 * - **What was pushed.** A carrier that can tell (`Carrier.check`: a LoRA run's adapter digests) checks every
 *   sample against what it pushed for the version the server answered; a sample of anything else fails its request
 *   (`SamplerError` `AdapterMismatch`, never training data), and the server loads the version again.
 *
 * Sampling on several servers batches each server's requests with whatever else it decodes, so a run with servers
 * does not repeat to the digit as a local run does (what is sampled depends on timing); resume works the same.
 *
 * @since 0.1.0
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Clock, Effect, FiberSet, Redacted, Result } from "effect"
import type { Scope } from "effect"
import { HttpClient } from "effect/http"
import { randomUUID } from "node:crypto"
import * as OpenAiCompatSampler from "../src/backends/OpenAiCompatSampler.ts"
import { Sampler, samplerError } from "../src/Sampler.ts"
import type { SamplerError } from "../src/Sampler.ts"
import type { GenerateRequest, GenerateResult } from "../src/Sampler.ts"
import * as Auth from "./internal/auth.ts"
import { fetchMessage } from "./internal/http.ts"
import * as WeightsPut from "./internal/weightsPut.ts"
import { type RunError, runError } from "./RunError.ts"

// ===== Models =====

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The servers' API roots, e.g. `http://10.0.0.2:8000/v1`. */
  readonly urls: ReadonlyArray<string>
  /** The model's parameters, in the order the weights are serialized. */
  readonly parameters: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
  /**
   * The bearer token the servers were started with, sent on every request (health checks, sampling, pushes); default
   * the environment's `AGENTFLY_SERVE_TOKEN`, else `AGENTFLY_WEIGHTS_TOKEN`, if any.
   */
  readonly token?: string | undefined
  /**
   * Whether this process pushes weights (default true). A rollout worker only samples (the run, or its trainer
   * server, pushes): its servers are not asked whether they take its weights, so it needs no weights token.
   */
  readonly pushes?: boolean | undefined
  /** Time limit of one sampling attempt on one server (default 60 s: `engine.timeoutSeconds`). */
  readonly timeoutMs?: number | undefined
  /** Time limit of one push to one server (default 120 s). */
  readonly pushTimeoutMs?: number | undefined
  /** How long a request waits for a server able to serve it before it fails (default 60 s). */
  readonly giveUpMs?: number | undefined
  /** How long a failed server rests before it is tried again (default 1 s). */
  readonly restMs?: number | undefined
  /**
   * Who carries the weights to the servers: by default this process (`push` is given them); a trainer server that
   * holds them pushes them itself (`learner.url` with `learner.pushWeights`), so that they do not cross the network
   * twice, and `push` is called without them.
   */
  readonly carrier?: Carrier | undefined
  /** The model name requests use (default: the one each server lists); a LoRA run's adapter name. */
  readonly model?: string | undefined
}

/**
 * A pusher of weights other than this process: the trainer server that holds them.
 *
 * @category models
 * @since 0.1.0
 */
export interface Carrier {
  /** Puts its current weights on every server in `urls` as `push.version`; per server what happened. */
  readonly pushAll: (
    push: WeightsPut.Push,
    urls: ReadonlyArray<string>
  ) => Effect.Effect<ReadonlyArray<WeightsPut.Outcome>, RunError>
  /** Puts version `push.version` on `url` again (a catch-up); `"newer"` when it holds newer weights by now. */
  readonly pushOne: (push: WeightsPut.Push, url: string) => Effect.Effect<WeightsPut.Outcome>
  /**
   * Whether a sampled result is what was pushed for the version it answers (a LoRA adapter's digest): the failure
   * when it is not. A server answering one is made to load the version again; the request fails with it.
   */
  readonly check?: ((result: GenerateResult) => SamplerError | undefined) | undefined
  /**
   * The model a request to `url` for version `min` or newer names (a LoRA run's adapter, named by its version and
   * digest); undefined: `Options.model`.
   */
  readonly model?: ((url: string, min: number) => Effect.Effect<string | undefined>) | undefined
  /** Whether `url` takes what this carrier puts there, asked before anything is trained (default: the weights). */
  readonly probe?: ((url: string, token: string | undefined) => Effect.Effect<void, RunError>) | undefined
}

/**
 * One server as the run sees it.
 *
 * @category models
 * @since 0.1.0
 */
export interface ServerStatus {
  readonly url: string
  /** The version of this run's weights the server holds (undefined: none yet, or it lost them). */
  readonly version: number | undefined
  readonly inflight: number
  readonly served: number
  readonly failures: number
  readonly lastError: string | undefined
}

/**
 * @category models
 * @since 0.1.0
 */
export interface InferenceServers {
  /**
   * Sends version `version`'s weights to every server; fails only when no server took them, or one refused them.
   * Without `weights` the `carrier` pushes its own.
   */
  readonly push: (version: number, weights?: ReadonlyMap<string, Float32Array>) => Effect.Effect<void, RunError>
  /** A sampler whose every request is served with weights of version `version` or newer. */
  readonly sampler: (version: number) => Sampler["Service"]
  /** The last version pushed (undefined before the first push: no server holds this run's weights yet). */
  readonly pushed: Effect.Effect<number | undefined>
  /**
   * Figures for a step's metrics: `servers/up_to_date` (servers holding the last pushed version), and since the
   * previous read `servers/requests` (served) and `servers/failures` (failed requests and pushes).
   */
  readonly figures: Effect.Effect<Readonly<Record<string, number>>>
  readonly status: Effect.Effect<ReadonlyArray<ServerStatus>>
}

interface Server {
  readonly url: string
  /** Its sampler for requests of at least a version (one per version asked for; a few live at a time). */
  readonly samplers: Map<number, { readonly model: string; readonly sampler: Sampler["Service"] }>
  readonly model: string
  version: number | undefined
  inflight: number
  served: number
  failures: number
  restUntil: number
  lastError: string | undefined
  catchingUp: boolean
  /** False from a failure until it serves or takes weights again (each change is logged once). */
  healthy: boolean
}

/** The client's state: its servers, and the newest version pushed to them. */
interface State {
  readonly options: Options
  readonly servers: ReadonlyArray<Server>
  /** This run's id on the servers (`x-run-id`): versions increase within a run. */
  readonly runId: string
  readonly restMs: number
  /** Runs catch-ups in the background, for the life of the scope. */
  readonly background: (effect: Effect.Effect<unknown>) => unknown
  readonly http: HttpClient.HttpClient
  /** The newest version pushed, with its bytes when this process carries them (for catch-ups). */
  latest: { readonly version: number; readonly bytes: Uint8Array | undefined } | undefined
  /** Where `pick` starts, so that ties take turns. */
  turn: number
  /** The totals `figures` last reported. */
  counted: { readonly served: number; readonly failures: number }
}

// ===== Helpers =====

const serversError = (message: string) => runError("Servers", message)

/** A 409 saying the server's weights are older than the request asked for. */
const isBehind = (e: SamplerError) => e.reason._tag === "BadRequest" && e.message.includes("policy_version_behind")

/** A sampled result that another adapter than the published one produced (`Carrier.check`). */
const isMismatch = (e: SamplerError) => e.reason._tag === "AdapterMismatch"

/** Records a failure of `server`; the first after a success is logged (the run goes on with the others). */
const failed = (server: Server, message: string, now: number, restMs: number) =>
  Effect.suspend(() => {
    server.failures++
    server.lastError = message
    server.restUntil = now + restMs
    if (!server.healthy) return Effect.void
    server.healthy = false
    return Effect.logWarning(
      `inference server ${server.url} failed (${message}); its requests go to the other servers until it answers`
    )
  })

/** Records that `server` works (it served, or took weights); logged when it had failed. */
const works = (server: Server) =>
  Effect.suspend(() => {
    server.lastError = undefined
    if (server.healthy) return Effect.void
    server.healthy = true
    return Effect.logInfo(`inference server ${server.url} is back, at policy version ${server.version}`)
  })

// Negative versions are the warm-up's checks (`RunSchedule.warmupVersion`), not a number a user knows.
const versionName = (version: number) =>
  version < 0 ? "the warm-up's weights (a validation check)" : `policy version ${version}`

// ===== Connecting =====

const authorization = (options: Options): Record<string, string> => Auth.headers(options.token)

/** A server that refused the token (401): the fix is the token, not the server. */
class Refused extends Error {}

/** The model a server serves (`GET /v1/models`). */
const modelOf = (options: Options, url: string) =>
  Effect.tryPromise({
    try: async () => {
      const response = await fetch(`${url}/models`, {
        headers: authorization(options),
        signal: AbortSignal.timeout(10_000)
      })
      if (response.status === 401) throw new Refused(`HTTP 401: ${(await response.text()).slice(0, 300)}`)
      if (!response.ok) throw new Error(`HTTP ${response.status}: ${(await response.text()).slice(0, 300)}`)
      const body = await response.json() as { data?: Array<{ id?: unknown }> }
      const id = body.data?.[0]?.id
      if (typeof id !== "string") throw new Error("GET /models named no model")
      return id
    },
    catch: (e) =>
      serversError(
        e instanceof Refused
          ? `inference server ${url}: it refuses this run's token (${e.message}): set AGENTFLY_WEIGHTS_TOKEN (or ` +
            "AGENTFLY_SERVE_TOKEN) to the token the server was started with"
          : `inference server ${url} did not answer GET /models (${fetchMessage(e)}); start it with ` +
          "`agentfly serve --model-dir DIR --accept-weights --host HOST --port PORT` and list its API root " +
          "(http://HOST:PORT/v1) in engine.servers"
      )
  })

// Whether a server will take this run's weights, asked before anything is trained (a wrong token or a server
// without --accept-weights would otherwise surface at the first push, after the warm-up): a PUT without a version
// is refused by its first check that fails, and changes nothing.
const acceptsWeights = (options: Options, url: string) =>
  Effect.tryPromise({
    try: async () => {
      const response = await fetch(`${url}/weights`, {
        method: "PUT",
        headers: authorization(options),
        signal: AbortSignal.timeout(10_000)
      })
      const body = (await response.text()).slice(0, 300)
      if (response.status === 401) {
        throw new Error(
          `it refuses this run's token (${body}): set AGENTFLY_WEIGHTS_TOKEN to the token the server was started with`
        )
      }
      if (response.status === 404 || response.status === 405) {
        throw new Error(`it does not take weights (HTTP ${response.status}: ${body}): start it with --accept-weights`)
      }
    },
    catch: (e) => serversError(`inference server ${url} cannot follow this run's learner: ${(e as Error).message}`)
  })

/** A server as the run first sees it: its model known, its weights (when this process pushes) accepted. */
const connect = (options: Options, url: string) =>
  Effect.map(
    Effect.tap(modelOf(options, url), () =>
      options.pushes === false
        ? Effect.void
        : options.carrier?.probe !== undefined
        ? options.carrier.probe(url, options.token)
        : acceptsWeights(options, url)),
    (model): Server => ({
      url,
      model,
      samplers: new Map(),
      version: undefined,
      inflight: 0,
      served: 0,
      failures: 0,
      restUntil: 0,
      lastError: undefined,
      catchingUp: false,
      healthy: true
    })
  )

// ===== Weights =====

const pushOf = (state: State, version: number): WeightsPut.Push => ({
  version,
  runId: state.runId,
  token: state.options.token,
  timeoutMs: state.options.pushTimeoutMs ?? 120_000
})

/** Books what a push did to `server`: undefined when it took the weights (or holds newer), else the failure. */
const book = Effect.fnUntraced(function*(state: State, server: Server, version: number, outcome: WeightsPut.Outcome) {
  if (outcome === "newer") return undefined
  if (outcome === undefined) {
    server.version = version
    yield* works(server)
    return undefined
  }
  yield* failed(server, outcome.message, yield* Clock.currentTimeMillis, state.restMs)
  return outcome
})

/** One server takes version `version` again (from `bytes`, or from the carrier). */
const putOne = (state: State, server: Server, version: number, bytes: Uint8Array | undefined) => {
  const carrier = state.options.carrier
  const outcome = bytes !== undefined || carrier === undefined
    ? Effect.promise(() => WeightsPut.put(server.url, bytes!, pushOf(state, version)))
    : carrier.pushOne(pushOf(state, version), server.url)
  return Effect.flatMap(outcome, (o) => book(state, server, version, o))
}

/** Brings a server that missed a push (down, restarted) up to date, once it answers; in the background. */
const catchUp = (state: State, server: Server) => {
  const target = state.latest
  if (target === undefined || server.catchingUp || server.version === target.version) return
  server.catchingUp = true
  state.background(putOne(state, server, target.version, target.bytes).pipe(
    Effect.ensuring(Effect.sync(() => (server.catchingUp = false)))
  ))
}

/** Every server's outcome of pushing `version` (`weights` serialized here, or the carrier's own). */
const pushAll = Effect.fnUntraced(function*(
  state: State,
  version: number,
  weights?: ReadonlyMap<string, Float32Array>
) {
  const urls = state.servers.map((s) => s.url)
  if (weights === undefined && state.options.carrier !== undefined) {
    state.latest = { version, bytes: undefined }
    return yield* state.options.carrier.pushAll(pushOf(state, version), urls)
  }
  if (weights === undefined) return yield* serversError(`no weights to push as ${versionName(version)}`)
  const bytes = WeightsPut.serialize(state.options.parameters, weights)
  if (typeof bytes === "string") return yield* serversError(bytes)
  state.latest = { version, bytes }
  return yield* Effect.forEach(
    urls,
    (url) => Effect.promise(() => WeightsPut.put(url, bytes, pushOf(state, version))),
    { concurrency: "unbounded" }
  )
})

/** Pushes `version` to every server; fails when one refused the weights, or none took them. */
const push = Effect.fnUntraced(function*(state: State, version: number, weights?: ReadonlyMap<string, Float32Array>) {
  const outcomes = yield* pushAll(state, version, weights)
  const { servers } = state
  const failures = yield* Effect.forEach(servers, (s, i) => book(state, s, version, outcomes[i]))
  const refused = failures.findIndex((f) => f?.fatal === true)
  if (refused >= 0) {
    return yield* serversError(
      `inference server ${servers[refused]!.url} refused ${versionName(version)}'s weights ` +
        `(${failures[refused]!.message}); it must serve this model and run with --accept-weights ` +
        "(and AGENTFLY_WEIGHTS_TOKEN, when set, must match)"
    )
  }
  if (failures.every((f) => f !== undefined)) {
    return yield* serversError(
      `no inference server took ${versionName(version)}: ` +
        servers.map((s, i) => `${s.url} (${failures[i]!.message})`).join("; ")
    )
  }
})

// ===== Sampling =====

/** `server`'s sampler for requests of at least `min`: one attempt per call, a failing server is left at once. */
const samplerOf = (state: State, server: Server, min: number) =>
  Effect.flatMap(state.options.carrier?.model?.(server.url, min) ?? Effect.undefined, (named) => {
    const model = named ?? state.options.model ?? server.model
    const cached = server.samplers.get(min)
    if (cached !== undefined && cached.model === model) return Effect.succeed(cached.sampler)
    return OpenAiCompatSampler.make({
      baseUrl: server.url,
      model,
      retries: 0,
      timeoutMs: state.options.timeoutMs,
      apiKey: state.options.token === undefined ? undefined : Redacted.make(state.options.token),
      extraBody: { min_policy_version: min },
      // What a server that says no version (vLLM) and names no adapter is taken to have sampled: the version asked.
      policyVersion: min
    }).pipe(
      Effect.provideService(HttpClient.HttpClient, state.http),
      Effect.tap((sampler) =>
        Effect.sync(() => {
          server.samplers.set(min, { model, sampler })
          for (const v of server.samplers.keys()) if (v < min - 16) server.samplers.delete(v)
        })
      )
    )
  })

/**
 * The least busy server able to serve `min` now (ties in turn), starting catch-ups on the way. A client that never
 * pushed (a rollout worker: the trainer pushes) cannot know what the servers hold and tries each one that is not
 * resting; a server's 409 keeps it from sampling with older weights.
 */
const pick = (state: State, min: number, now: number): Server | undefined => {
  const { servers, latest } = state
  let best: Server | undefined
  for (let k = 0; k < servers.length; k++) {
    const s = servers[(state.turn + k) % servers.length]!
    if (now < s.restUntil) continue
    if (latest !== undefined && s.version !== latest.version) catchUp(state, s)
    if (latest !== undefined && (s.version === undefined || s.version < min)) continue
    if (best === undefined || s.inflight < best.inflight) best = s
  }
  state.turn++
  return best
}

/** Why a request found no server able to serve it for `giveUpMs`. */
const noServer = (state: State, min: number, waitedMs: number) =>
  samplerError(
    "Transport",
    `no inference server could serve policy version ≥ ${min} for ${Math.round(waitedMs / 1000)} s: ` +
      state.servers.map((s) =>
        `${s.url} (holds ${s.version ?? "no weights of this run"}` +
        `${s.lastError === undefined ? "" : `; ${s.lastError}`})`
      ).join("; ")
  )

/** One attempt of a request on `server`: its result, or the failure after booking it. */
const attempt = Effect.fnUntraced(function*(state: State, server: Server, min: number, request: GenerateRequest) {
  server.inflight++
  const result = yield* samplerOf(state, server, min).pipe(
    Effect.flatMap((sampler) => sampler.generate(request)),
    Effect.ensuring(Effect.sync(() => server.inflight--)),
    Effect.result
  )
  const wrong = result._tag === "Success" ? state.options.carrier?.check?.(result.success) : undefined
  if (wrong !== undefined) {
    // It acknowledged a load it did not make: it loads the version again before it serves, and nothing it
    // sampled is used.
    yield* failed(server, `${wrong.reason._tag}: ${wrong.message}`, yield* Clock.currentTimeMillis, state.restMs)
    server.version = undefined
    catchUp(state, server)
    return Result.fail(wrong)
  }
  if (result._tag === "Success") {
    server.served++
    if (server.version === undefined || result.success.policyVersion > server.version) {
      server.version = result.success.policyVersion
    }
    yield* works(server)
    return result
  }
  const e = result.failure
  if (isBehind(e)) {
    // Restarted, or it missed a push: it gets the newest weights before it serves again (from the trainer,
    // when this client never pushes: it waits a moment for them).
    server.version = undefined
    if (state.latest === undefined) server.restUntil = (yield* Clock.currentTimeMillis) + Math.min(state.restMs, 200)
    catchUp(state, server)
  } else if (e.isRetryable) {
    const rest = Math.max(state.restMs, e.retryAfterMs ?? 0)
    yield* failed(server, `${e.reason._tag}: ${e.message}`, yield* Clock.currentTimeMillis, rest)
  }
  return result
})

/** A request on the servers: moved on from a server that fails or is behind, until `giveUpMs` without one. */
const generate = Effect.fnUntraced(function*(
  state: State,
  min: number,
  request: GenerateRequest
): Effect.fn.Return<GenerateResult, SamplerError> {
  const start = yield* Clock.currentTimeMillis
  const giveUp = start + (state.options.giveUpMs ?? 60_000)
  for (let n = 0;; n++) {
    const now = yield* Clock.currentTimeMillis
    const server = pick(state, min, now)
    if (server === undefined) {
      if (now > giveUp) return yield* noServer(state, min, now - start)
      yield* Effect.sleep(Math.min(500, 20 * 2 ** Math.min(n, 5)))
      continue
    }
    const result = yield* attempt(state, server, min, request)
    if (result._tag === "Success") return result.success
    // A mismatch fails the request at once, so that it is counted (retried by the chain's policy, then masked).
    if (isMismatch(result.failure) || (!isBehind(result.failure) && !result.failure.isRetryable)) {
      return yield* result.failure
    }
  }
})

const status = (state: State) =>
  Effect.sync(() =>
    state.servers.map((s): ServerStatus => ({
      url: s.url,
      version: s.version,
      inflight: s.inflight,
      served: s.served,
      failures: s.failures,
      lastError: s.lastError
    }))
  )

const figures = (state: State) =>
  Effect.sync(() => {
    const served = state.servers.reduce((n, s) => n + s.served, 0)
    const failures = state.servers.reduce((n, s) => n + s.failures, 0)
    const { latest, counted } = state
    const out = {
      "servers/up_to_date": state.servers.filter((s) => latest !== undefined && s.version === latest.version).length,
      "servers/requests": served - counted.served,
      "servers/failures": failures - counted.failures
    }
    state.counted = { served, failures }
    return out
  })

// ===== Constructor =====

/**
 * Connects to the servers (each must answer `GET /v1/models` now) for the life of the scope.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("InferenceServers.make")(function*(
  given: Options
): Effect.fn.Return<InferenceServers, RunError, Scope.Scope> {
  const token = given.token ?? Auth.fromEnv("AGENTFLY_SERVE_TOKEN", "AGENTFLY_WEIGHTS_TOKEN")
  const options: Options = { ...given, token }
  if (options.urls.length === 0) return yield* serversError("engine.servers lists no server")
  const background = yield* FiberSet.makeRuntime<never>()
  // Sampling goes through node:http, not `fetch`: fetch gives up on an answer after 5 minutes whatever the
  // request's own limit (`timeoutMs`), and a long answer of a large model on a loaded server can take that long.
  const http = yield* NodeHttpClient.makeNodeHttp.pipe(
    Effect.provideService(NodeHttpClient.HttpAgent, yield* NodeHttpClient.makeAgent({ keepAlive: true }))
  )
  const servers = yield* Effect.forEach(
    options.urls.map((u) => u.replace(/\/+$/, "")),
    (url) => connect(options, url),
    { concurrency: "unbounded" }
  )
  const state: State = {
    options,
    servers,
    runId: randomUUID(),
    restMs: options.restMs ?? 1_000,
    background: (effect) => background(effect),
    http,
    latest: undefined,
    turn: 0,
    counted: { served: 0, failures: 0 }
  }
  return {
    push: (version, weights) => push(state, version, weights),
    sampler: (version) =>
      Sampler.of({
        generate: (request) => generate(state, version, request),
        policyVersion: Effect.succeed(version)
      }),
    pushed: Effect.sync(() => state.latest?.version),
    figures: figures(state),
    status: status(state)
  }
})
