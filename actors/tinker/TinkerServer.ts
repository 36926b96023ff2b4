/**
 * The Tinker API served over the local learner and engine (`agentfly trainer --tinker-model …`): the subset of
 * routes the official SDK calls (`src/tinker/Types.ts#routes`), JSON bodies decoded and answers encoded with the
 * Schemas of `src/tinker/Types.ts`, so that this server cannot drift from the API our client speaks.
 *
 * - **Auth**: the SDK's `X-API-Key` header, checked in constant time against the server's keys before a body is read;
 *   a wrong or missing key answers 401 `{ detail }` (FastAPI's error body, as SkyRL answers). Without keys the
 *   server listens on loopback only. `healthz` answers everyone.
 * - **Futures** (`Futures.ts`): training, weights and sampling calls answer an `UntypedAPIFuture` at once;
 *   `retrieve_future` waits up to `pollMillis` for the outcome, then answers `TryAgainResponse`; a failed future
 *   answers `RequestFailedResponse` with its category (`user`: the request was at fault). Retries bearing the same
 *   `X-Idempotency-Key` (or `(model_id, seq_id)`) get the same future; the state directory's log survives restarts.
 * - **Errors** of the request itself: 400 (a base model this server does not serve, with the ones it does), 404
 *   (unknown session, model or future), 409 (a `seq_id` reused for another request), 415 (a protobuf body: the SDK
 *   ≥ 0.25 posts `forward_backward` so; see `docs/tinker.md`), 422 (a body the Schemas refuse), 429 past `quota`.
 *
 * @since 0.1.0
 */
import { Deferred, Duration, Effect, FiberSet, FileSystem, Schema } from "effect"
import type { Scope } from "effect"
import * as Http from "node:http"
import * as Types from "../../src/tinker/Types.ts"
import * as Auth from "../internal/auth.ts"
import { listen, readBody } from "../internal/http.ts"
import * as Archives from "./Archives.ts"
import * as FutureLog from "./FutureLog.ts"
import * as Futures from "./Futures.ts"
import * as Models from "./Models.ts"

// ===== Models =====

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The base models `create_model` may name (a model folder each, by name). */
  readonly bases: ReadonlyArray<Models.Base>
  /** Keys a request's `X-API-Key` must match; none: no auth (then loopback only). */
  readonly apiKeys?: ReadonlyArray<string> | undefined
  /**
   * Where the request log and checkpoints live; a server started again on it resumes every model and future. Absent:
   * a temporary directory, removed with the server.
   */
  readonly stateDir?: string | undefined
  /** Default `127.0.0.1`. */
  readonly host?: string | undefined
  /** Default 0: a free port. */
  readonly port?: number | undefined
  /** Most futures accepted per API key; past it 429 (a simulated quota, for clients' tests). Default: no limit. */
  readonly quota?: number | undefined
  /**
   * Publications of sampler weights between snapshots of a model's state (default 20; 0: none): a restart replays
   * the calls since a model's last snapshot only.
   */
  readonly snapshotEvery?: number | undefined
  /**
   * Each model's learner threads (default 1). A client that wants an in-process run's numbers to the bit asks for a
   * server with that run's `learner.workers`: data parallelism sums in another order.
   */
  readonly workers?: number | undefined
  /** How long `retrieve_future` waits for an outcome before it answers `try_again` (default 1000 ms). */
  readonly pollMillis?: number | undefined
  /** Largest request body (default 256 MiB). */
  readonly maxBodyBytes?: number | undefined
  /** Runs before each future's work (tests hold one pending with it). */
  readonly beforeRun?: ((route: string, id: string) => Effect.Effect<void>) | undefined
  /** Whether to drop the answer of a future-making request after accepting it (tests of a lost answer). */
  readonly dropAnswer?: ((route: string) => boolean) | undefined
  /** Sees every request body received and every body sent, by route (the contract tests decode them). */
  readonly onBody?:
    | ((route: string, direction: "request" | "response", status: number, body: unknown) => void)
    | undefined
}

/**
 * A reply: a status, and a body that is JSON.
 *
 * @category models
 * @since 0.1.0
 */
export interface Reply {
  readonly status: number
  readonly body: unknown
  readonly headers?: Readonly<Record<string, string>>
}

interface Server {
  readonly options: Options
  readonly state: Futures.State
  readonly keys: Auth.Tokens
  readonly used: Map<number, number>
}

const ok = (body: unknown): Reply => ({ status: 200, body })
const error = (status: number, detail: string, headers?: Record<string, string>): Reply => ({
  status,
  body: Types.encodeJson(Types.ErrorBody, { detail }),
  ...(headers === undefined ? {} : { headers })
})

/** Failures are replies too. */
const replied = <R>(effect: Effect.Effect<Reply, Reply, R>) =>
  Effect.match(effect, { onFailure: (r) => r, onSuccess: (r) => r })

// ===== Bodies =====

const decodeBody = <S extends Schema.Codec<any, any, never, never>>(schema: S, route: string, bytes: Uint8Array) =>
  Schema.decodeUnknownEffect(Schema.fromJsonString(schema))(Buffer.from(bytes).toString("utf8")).pipe(
    Effect.mapError((e) => error(422, `${route}: ${e.message}`))
  )

const { isFutureRoute } = Futures
type FutureRoute = Futures.FutureRoute

/** What the acceptance needs from a decoded body. */
const describe = (server: Server, route: FutureRoute, raw: unknown, decoded: unknown, key: string | undefined) =>
  Effect.gen(function*() {
    // Every future-making request names its model and `seq_id` by these keys (create_model names a session).
    const body = decoded as { readonly model_id?: string | undefined; readonly seq_id?: number | undefined }
    const base: Futures.Request = { route, body: raw, request: decoded, key, model: body.model_id, seq: body.seq_id }
    if (route === "create_model") {
      const request = decoded as Types.CreateModelRequest
      if (!server.state.sessions.has(request.session_id)) return yield* Effect.fail(error(404, "Session not found"))
      const found = server.options.bases.find((b) => b.name === request.base_model)
      if (found === undefined) {
        const names = server.options.bases.map((b) => b.name).join(", ")
        return yield* Effect.fail(error(400, `unknown base model ${request.base_model}; this server serves ${names}`))
      }
      const lora = Models.loraOf(request.lora_config)
      if (lora !== undefined && "category" in lora) return yield* Effect.fail(error(400, lora.error))
      return { ...base, model: undefined, seq: undefined, create: { base: found, lora } }
    }
    if (route === "load_weights" && body.model_id === undefined) {
      return yield* Effect.fail(error(400, "load_weights: create-via-load (session_id) is not supported here"))
    }
    if (base.model !== undefined && !server.state.slots.has(base.model)) {
      return yield* Effect.fail(error(404, "Model not found"))
    }
    return base
  })

/** A future-making request: accepted once (a retry gets its future), counted against the key's quota. */
const acceptFuture = (
  server: Server,
  route: FutureRoute,
  client: number,
  req: Http.IncomingMessage,
  bytes: Uint8Array
) =>
  Effect.gen(function*() {
    const raw = asJson(bytes)
    const body = yield* Schema.decodeUnknownEffect(Futures.schemaOf(route))(raw).pipe(
      Effect.mapError((e) => error(422, `${route}: ${raw === undefined ? "the body is not JSON" : e.message}`))
    )
    const header = req.headers[Types.headers.idempotencyKey.toLowerCase()]
    const request = yield* describe(server, route, raw, body, typeof header === "string" ? header : undefined)
    const used = server.used.get(client) ?? 0
    const quota = server.options.quota
    const known = request.key !== undefined && server.state.byKey.has(request.key)
    if (quota !== undefined && used >= quota && !known) {
      return error(429, `quota of ${quota} requests used up`, { "retry-after": "1" })
    }
    const accepted = yield* Futures.accept(server.state, request)
    if (accepted === "conflict") return error(409, "Training request sequence number was reused")
    if (accepted.fresh) server.used.set(client, used + 1)
    const { future } = accepted
    return ok(Types.encodeJson(Types.UntypedAPIFuture, {
      request_id: future.id,
      ...(future.model === undefined ? {} : { model_id: future.model })
    }))
  })

/** `retrieve_future`: the outcome, once there is one within `pollMillis`; else `try_again`. */
const retrieve = (server: Server, bytes: Uint8Array) =>
  Effect.gen(function*() {
    const { request_id } = yield* decodeBody(Types.FutureRetrieveRequest, "retrieve_future", bytes)
    const future = server.state.futures.get(request_id)
    if (future === undefined) return error(404, "Future not found")
    const outcome = yield* Deferred.await(future.done).pipe(
      Effect.timeoutOption(Duration.millis(server.options.pollMillis ?? 1000))
    )
    if (outcome._tag === "None") {
      return ok(Types.encodeJson(Types.TryAgainResponse, { type: "try_again", request_id, queue_state: "active" }))
    }
    const o = outcome.value
    return ok("failed" in o ? Types.encodeJson(Types.RequestFailedResponse, o.failed) : o.ok)
  })

const parseJson = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))

/** A body as JSON, for `onBody` (undefined when it is none). */
const asJson = (bytes: Uint8Array): unknown => {
  const parsed = parseJson(Buffer.from(bytes).toString("utf8"))
  return parsed._tag === "Some" ? parsed.value : undefined
}

// ===== Routes =====

/** The answers that need no future. */
const immediate = (server: Server, route: string, bytes: Uint8Array) =>
  Effect.gen(function*() {
    const { state } = server
    switch (route) {
      case "client_config": {
        yield* decodeBody(Types.ClientConfigRequest, route, bytes)
        // Every default: an SDK that reads `proto_write_fwdbwd` (before 0.25) then posts forward_backward as JSON.
        const defaults = Schema.decodeUnknownSync(Types.ClientConfigResponse)({})
        return ok(Types.encodeJson(Types.ClientConfigResponse, defaults))
      }
      case "get_server_capabilities":
        return ok(Types.encodeJson(Types.GetServerCapabilitiesResponse, {
          supported_models: server.options.bases.map((b) => ({
            model_name: b.name,
            max_context_length: b.config.maxPositionEmbeddings
          }))
        }))
      case "create_session": {
        yield* decodeBody(Types.CreateSessionRequest, route, bytes)
        const id = `session-${Auth.randomId()}`
        yield* state.log.append({ t: "session", id })
        state.sessions.add(id)
        return ok(Types.encodeJson(Types.CreateSessionResponse, { type: "create_session", session_id: id }))
      }
      case "session_heartbeat": {
        const { session_id } = yield* decodeBody(Types.SessionHeartbeatRequest, route, bytes)
        if (!state.sessions.has(session_id)) return error(404, "Session not found")
        return ok(Types.encodeJson(Types.SessionHeartbeatResponse, { type: "session_heartbeat" }))
      }
      case "create_sampling_session": {
        const request = yield* decodeBody(Types.CreateSamplingSessionRequest, route, bytes)
        if (!state.sessions.has(request.session_id)) return error(404, "Session not found")
        if ((request.base_model === undefined) === (request.model_path === undefined)) {
          return error(400, "Exactly one of base_model or model_path must be provided")
        }
        // A sampling session is the path it samples (or the base model): nothing to keep.
        const id = request.model_path ?? `base:${request.base_model}`
        return ok(Types.encodeJson(Types.CreateSamplingSessionResponse, {
          type: "create_sampling_session",
          sampling_session_id: id
        }))
      }
      case "get_info": {
        const { model_id } = yield* decodeBody(Types.GetInfoRequest, route, bytes)
        const slot = state.slots.get(model_id)
        if (slot === undefined || slot.base === undefined) return error(404, "Model not found")
        return ok(Models.info(model_id, slot.base, slot.lora))
      }
      default:
        return error(404, `no route /api/v1/${route}`)
    }
  })

/** The route a request names under `/api/v1/`, or undefined. */
const routeOf = (req: Http.IncomingMessage): string | undefined => {
  const path = (req.url ?? "/").split("?")[0]!.replace(/\/+$/, "")
  const m = /^\/api\/v1\/([a-z_]+(?:\/[a-z_]+)?)$/.exec(path)
  // `client/config` is the one route with a slash: its name here is `client_config` (`Types.routes`).
  return m === null ? undefined : m[1]!.replace("/", "_")
}

/**
 * The reply to a request under `/api/v1/`.
 *
 * @category constructors
 * @since 0.1.0
 */
const answer = (server: Server, req: Http.IncomingMessage, route: string) =>
  replied(Effect.gen(function*() {
    if (route === "healthz" && req.method === "GET") return ok(Types.encodeJson(Types.HealthResponse, { status: "ok" }))
    const presented = req.headers[Types.headers.apiKey.toLowerCase()]
    const key = typeof presented === "string" ? presented : undefined
    const client = Auth.required(server.keys) ? Auth.match(server.keys, key) : 0
    if (client === -1) return error(401, "a valid X-API-Key header is required")
    if (route === "get_server_capabilities" && req.method === "GET") {
      return yield* immediate(server, route, new Uint8Array())
    }
    if (req.method !== "POST") return error(405, `${req.method} /api/v1/${route} is not served`)
    if ((req.headers["content-type"] ?? "").includes("application/x-protobuf")) {
      return error(415, `${route}: protobuf bodies are not accepted here; send JSON (docs/tinker.md)`)
    }
    const bytes = yield* readBody(req, server.options.maxBodyBytes ?? 256 * 1024 * 1024).pipe(
      Effect.mapError((e) => error(e.status, e.message))
    )
    server.options.onBody?.(route, "request", 0, asJson(bytes))
    if (route === "retrieve_future") return yield* retrieve(server, bytes)
    if (isFutureRoute(route)) return yield* acceptFuture(server, route, client, req, bytes)
    return yield* immediate(server, route, bytes)
  }))

/**
 * Handles `req` when it is under `/api/v1/` (true), else leaves it (false): how another server mounts this one.
 *
 * @category models
 * @since 0.1.0
 */
export type Handler = (req: Http.IncomingMessage, res: Http.ServerResponse) => boolean

const send = (res: Http.ServerResponse, reply: Reply) =>
  Effect.sync(() => {
    if (res.destroyed || res.headersSent) return
    const body = Buffer.from(JSON.stringify(reply.body))
    const close = Auth.closesConnection(reply.status) ? { connection: "close" } : {}
    res.writeHead(reply.status, {
      "content-type": "application/json",
      "content-length": body.length,
      ...close,
      ...reply.headers
    })
    res.end(body)
  })

/**
 * The Tinker API's handler over the state in `options.stateDir`, in the current scope (the scope's end stops its
 * models and futures).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("TinkerServer.make")(function*(
  options: Options
): Effect.fn.Return<Handler, never, Scope.Scope | FileSystem.FileSystem> {
  const fs = yield* FileSystem.FileSystem
  const dir = options.stateDir ?? (yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-tinker-" }).pipe(Effect.orDie))
  yield* fs.makeDirectory(`${dir}/checkpoints`, { recursive: true }).pipe(Effect.orDie)
  const log = yield* FutureLog.open(`${dir}/requests.jsonl`)
  const { bases, beforeRun } = options
  const state = yield* Futures.make({
    bases,
    checkpoints: `${dir}/checkpoints`,
    snapshots: `${dir}/snapshots`,
    snapshotEvery: options.snapshotEvery ?? 20,
    workers: options.workers ?? 1,
    beforeRun
  }, log)
  const server: Server = { options, state, keys: Auth.tokens(options.apiKeys ?? []), used: new Map() }
  const run = yield* FiberSet.makeRuntime<never>()
  const archives = Archives.handler(`${dir}/checkpoints`, server.keys, (effect) => {
    run(Effect.provideService(effect, FileSystem.FileSystem, fs))
  })
  return (req, res) => {
    if (archives(req, res)) return true
    const route = routeOf(req)
    if (route === undefined) return false
    run(answer(server, req, route).pipe(
      Effect.catchDefect((defect) => Effect.succeed(error(500, `internal error: ${String(defect)}`))),
      Effect.flatMap((reply) => {
        options.onBody?.(route, "response", reply.status, reply.body)
        const drop = reply.status === 200 && isFutureRoute(route) && options.dropAnswer?.(route) === true
        return drop ? Effect.sync(() => void res.destroy()) : send(res, reply)
      })
    ))
    return true
  }
})

/**
 * Serves the Tinker API on its own port in the current scope.
 *
 * @category constructors
 * @since 0.1.0
 */
export const serve = Effect.fn("TinkerServer.serve")(function*(
  options: Options
): Effect.fn.Return<{ readonly port: number; readonly baseUrl: string }, never, Scope.Scope | FileSystem.FileSystem> {
  const host = options.host ?? "127.0.0.1"
  const problem = Auth.bindProblem(host, Auth.tokens(options.apiKeys ?? []), "an API key (--tinker-api-key-file)")
  if (problem !== undefined) return yield* Effect.die(new Error(problem))
  const handle = yield* make(options)
  const http = Http.createServer((req, res) => {
    if (!handle(req, res)) {
      res.writeHead(404, { "content-type": "application/json" })
      res.end(JSON.stringify({ detail: `no route ${req.url}` }))
    }
  })
  const port = yield* listen(http, { port: options.port ?? 0, host })
  return { port, baseUrl: `http://${host}:${port}` }
})
