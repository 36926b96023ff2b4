/**
 * A trainer server (`agentfly trainer`): the learner's forward/backward passes and optimiser steps
 * (`OnnxTrainer`) served over HTTP to runs elsewhere, whose `learner.url` points here (`RemoteTrainer` is the
 * client). The server needs no model folder: a run initialises a trainer with its model's config, weights, loss,
 * optimiser and schedule, and the server builds the training graph from them.
 *
 * - **Named trainers.** A run holds a trainer per name (`policy`, and `reference` for a KL term); initialising a name
 *   replaces whatever held it (its sessions and worker threads are closed) and hands out a new session id. A call
 *   with another session id answers 404 `unknown_session`.
 * - **Exactly once.** Calls carry a sequence number: the next number runs, the last one answers with its stored
 *   reply (the client sent it again after a broken connection; if it is still running, once it is done), anything
 *   else is refused (409 `out_of_order`). A call runs to its end even when its client went away.
 * - **Errors** come back as JSON `{ error: { message, code } }`, the code being the `GradientBackendError` reason.
 * - **Strangers** (`Options.token`, `internal/auth.ts`): with a token, every route answers 401 to a request without
 *   it, before its body is read or anything is looked up (no 404-vs-409 oracle); session ids are 128 random bits;
 *   at most `maxConcurrent` requests are answered at once (503 past it); a `catch_up` reaches only servers the
 *   trainer's pushes named. Without a token the server listens on loopback only.
 *
 * The wire: `GET /v1/trainer` → `{ service, executionProvider, workers, trainers }`;
 * `POST /v1/trainer/NAME/init` (frame: model config, loss, optimizer, schedule, workers; weights) → `{ session }`;
 * `POST /v1/trainer/NAME/OP` with `x-agentfly-session` and `x-agentfly-seq`, OP one of `forward_backward`,
 * `logprobs`, `optim_step`, `discard`, `weights`, `summary` (the weights' fingerprint and first non-finite value),
 * `push` (the current weights to inference servers as a version: `PUT /v1/weights` from here), `step`, `save`, `load`,
 * `close`, and `catch_up` (not numbered: the last pushed version to servers that missed it) (frames:
 * `internal/trainerWire.ts`).
 *
 * @since 0.1.0
 */
import { Clock, Deferred, Effect, Exit, FiberSet, FileSystem, Schema, Scope, Semaphore } from "effect"
import * as Http from "node:http"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as RemoteTrainer from "../src/backends/RemoteTrainer.ts"
import * as Wire from "../src/backends/internal/trainerWire.ts"
import * as Checkpoint from "../src/Checkpoint.ts"
import * as Optimizer from "../src/Optimizer.ts"
import * as GradientBackend from "../src/GradientBackend.ts"
import * as Auth from "./internal/auth.ts"
import { listen, readBody } from "./internal/http.ts"
import * as WeightsPut from "./internal/weightsPut.ts"
import type * as TinkerServer from "./tinker/TinkerServer.ts"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Default `127.0.0.1`. */
  readonly host?: string | undefined
  /** Default 0: a free port. */
  readonly port?: number | undefined
  /**
   * The shared secret(s) every request must bear (`Authorization: Bearer`; `AGENTFLY_TRAINER_TOKEN` or
   * `--token-file`), checked in constant time before anything else (`internal/auth.ts`). Without one the server
   * listens on loopback only: a non-loopback `host` without a token is refused at start.
   */
  readonly token?: string | ReadonlyArray<string> | undefined
  /**
   * Most requests answered at once (default 16); past it a request gets 503 `overloaded` before its body is read, so
   * that bodies (up to `maxBodyBytes` each) cannot pile up without bound.
   */
  readonly maxConcurrent?: number | undefined
  /**
   * URL prefixes a `push` may send weights to (default: any the authenticated run names). A `catch_up` goes only to
   * servers an earlier `push` of the same trainer named: a caller cannot send the run's weights elsewhere.
   */
  readonly allowPushUrls?: ReadonlyArray<string> | undefined
  /** Learner threads per trainer, whatever a run asks for (default: the run's `learner.workers`). */
  readonly workers?: number | undefined
  /** onnxruntime's execution provider (default `cpu`). */
  readonly executionProvider?: "cpu" | "cuda" | undefined
  /** Largest request body, in bytes (default 2 GiB: a checkpoint is three times the weights). */
  readonly maxBodyBytes?: number | undefined
  /**
   * A trainer no call reached for this long is closed (default 1 hour): a run killed without closing its trainers
   * leaves them here otherwise. A run that comes back later resumes from a checkpoint, which starts new ones.
   */
  readonly idleMillis?: number | undefined
  /** Told of every trainer a run initialises (the CLI prints it). */
  readonly onInit?: ((name: string, parameters: number, workers: number) => Effect.Effect<void>) | undefined
  /**
   * The Tinker API (`tinker/TinkerServer.ts#make`), served on the same port under `/api/v1/` with its own auth
   * (`X-API-Key`); absent: not served.
   */
  readonly tinker?: TinkerServer.Handler | undefined
}

interface Reply {
  readonly status: number
  readonly body: Uint8Array
  readonly type: "application/octet-stream" | "application/json"
}

/** A trainer a run initialised here, under its name. */
interface Hosted {
  readonly session: string
  readonly scope: Scope.Closeable
  readonly trainer: GradientBackend.GradientBackend["Service"]
  readonly parameters: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
  /** The number of the last call run (or running), and its reply once it is done. */
  seq: number
  reply: Deferred.Deferred<Reply> | undefined
  /** When a call last reached it or ended (`Clock` milliseconds): idle expiry counts from there. */
  lastCall: number
  running: boolean
  /** The version last pushed to inference servers, as the bytes they take (kept for catch-ups). */
  pushed: { readonly version: number; readonly bytes: Uint8Array } | undefined
  /** The servers this trainer's pushes named: the only ones a catch-up may reach. */
  readonly pushedTo: Set<string>
}

/** The server's state: its trainers by name. */
interface Server {
  readonly fs: FileSystem.FileSystem
  readonly options: Options
  readonly maxBodyBytes: number
  readonly idleMillis: number
  readonly auth: Auth.Tokens
  readonly gate: Auth.Gate
  readonly hosted: Map<string, Hosted>
  /** Inits and closes one at a time: a trainer's threads and sessions go before the next one's start. */
  readonly lifecycle: Semaphore.Semaphore
}

const json = (status: number, message: string, code: string): Reply => ({
  status,
  body: Buffer.from(JSON.stringify({ error: { message, code } })),
  type: "application/json"
})

const frame = (body: Uint8Array): Reply => ({ status: 200, body, type: "application/octet-stream" })

const refused = (e: GradientBackend.GradientBackendError): Reply =>
  json(e.reason._tag === "BadBatch" ? 400 : 422, e.message, e.reason._tag)

/** Failures are replies too: the one channel a caller reads. */
const replied = <R>(effect: Effect.Effect<Reply, Reply, R>) =>
  Effect.match(effect, { onFailure: (r) => r, onSuccess: (r) => r })

const InitHeader = Schema.Struct({
  model: Schema.Unknown,
  /** The model's output head: `value` for a critic (`OnnxTrainer.qwen2Value`); default the language-model head. */
  head: Schema.optionalKey(Schema.Literals(["lm", "value"])),
  loss: Loss.Config,
  optimizer: Optimizer.Config,
  schedule: LrSchedule.Config,
  workers: Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 64 }))
})

const PushHeader = Schema.Struct({
  version: Schema.Int,
  runId: Schema.String,
  token: Schema.optionalKey(Schema.String),
  timeoutMs: Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 3_600_000 })),
  urls: Schema.Array(Schema.String.check(Schema.isPattern(/^https?:\/\/[^\s]+$/))).check(Schema.isMaxLength(256))
})

// ===== Trainers' lives =====

/** Closes the trainer under `name`, if any (its sessions and worker threads). */
const drop = (server: Server, name: string) =>
  Effect.suspend(() => {
    const h = server.hosted.get(name)
    server.hosted.delete(name)
    return h === undefined ? Effect.void : Scope.close(h.scope, Exit.void)
  })

/** Closes every trainer no call reached for `idleMillis`. */
const closeIdle = (server: Server) =>
  server.lifecycle.withPermits(1)(Effect.gen(function*() {
    const now = yield* Clock.currentTimeMillis
    const idle = [...server.hosted].filter(([, h]) => !h.running && now - h.lastCall > server.idleMillis)
    for (const [name] of idle) {
      yield* drop(server, name)
      yield* Effect.logInfo(`trainer ${name}: closed after ${server.idleMillis / 1000} s without a call`)
    }
  }))

/** The trainer a run asks for: its model, weights, loss, optimiser and schedule from the init frame. */
const build = Effect.fnUntraced(function*(server: Server, body: Wire.Frame) {
  const header = yield* Schema.decodeUnknownEffect(InitHeader)(body.header).pipe(
    Effect.mapError((e) => json(400, `init: ${e.message}`, "invalid_request"))
  )
  const config = yield* ModelConfig.decode(header.model).pipe(
    Effect.mapError((e) => json(400, `init: the model config: ${e.message}`, "invalid_request"))
  )
  const model = header.head === "value" ? OnnxTrainer.qwen2Value(config) : OnnxTrainer.qwen2(config)
  const weights = Wire.decodeWeights(body, model.parameters)
  if (typeof weights === "string") return yield* Effect.fail(json(400, `init: ${weights}`, "invalid_request"))
  return { header, model, weights, workers: server.options.workers ?? header.workers }
})

/** Initialises the trainer `name` (closing the one that held it) and answers its new session id. */
const init = (server: Server, name: string, body: Wire.Frame) =>
  server.lifecycle.withPermits(1)(Effect.gen(function*() {
    const { header, model, weights, workers } = yield* build(server, body)
    yield* drop(server, name)
    const scope = yield* Scope.make()
    const { executionProvider } = server.options
    const made = yield* OnnxTrainer.make({
      model,
      weights,
      loss: header.loss,
      optimizer: header.optimizer,
      schedule: header.schedule,
      workers,
      ...(executionProvider === undefined ? {} : { executionProvider }),
      // One intra-op thread, as a local run: the sums then run in a fixed order and a step repeats to the bit.
      intraOpThreads: 1
    }).pipe(
      Effect.provideService(Scope.Scope, scope),
      Effect.provideService(FileSystem.FileSystem, server.fs),
      Effect.tapError(() => Scope.close(scope, Exit.void)),
      Effect.mapError(refused)
    )
    const now = yield* Clock.currentTimeMillis
    // 128 random bits: a session id is the only thing that tells one run's calls from another's.
    const session = Auth.randomId()
    server.hosted.set(name, {
      session,
      scope,
      trainer: made.trainer,
      parameters: model.parameters,
      seq: 0,
      reply: undefined,
      lastCall: now,
      running: false,
      pushed: undefined,
      pushedTo: new Set()
    })
    if (server.options.onInit !== undefined) {
      const parameters = model.parameters.reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0)
      yield* server.options.onInit(name, parameters, workers)
    }
    return frame(Wire.encode({ session }))
  }))

// ===== Checkpoints =====

const checkpointError = (e: { readonly message: string }) =>
  GradientBackend.gradientBackendError("Checkpoint", e.message, { cause: e })

/** A checkpoint's files through a directory of this machine's, its path hidden from messages. */
const viaDirectory = <A>(
  server: Server,
  use: (dir: string) => Effect.Effect<A, GradientBackend.GradientBackendError>
) =>
  Effect.acquireUseRelease(
    server.fs.makeTempDirectory({ prefix: "agentfly-trainer-" }).pipe(
      Effect.mapError((e) => json(500, `no temporary directory: ${e.message}`, "Checkpoint"))
    ),
    (dir) =>
      use(dir).pipe(Effect.mapError((e) =>
        refused(e.withMessage(e.message.replaceAll(dir, RemoteTrainer.checkpointMarker)))
      )),
    (dir) => server.fs.remove(dir, { recursive: true }).pipe(Effect.ignore)
  )

/** The trainer's checkpoint, written here and sent back as its files. */
const save = (server: Server, t: GradientBackend.GradientBackend["Service"], body: Wire.Frame) => {
  const meta = body.header["meta"] as GradientBackend.CheckpointMeta | undefined
  if (typeof meta?.policyVersion !== "number" || !Array.isArray(meta.rngState)) {
    return Effect.fail(json(400, "save: the header holds no meta { policyVersion, rngState }", "invalid_request"))
  }
  return viaDirectory(server, (dir) =>
    Effect.gen(function*() {
      yield* t.save(dir, meta)
      const files: Array<readonly [string, Uint8Array]> = []
      const names = yield* Checkpoint.files(dir).pipe(
        Effect.provideService(FileSystem.FileSystem, server.fs),
        Effect.mapError(checkpointError)
      )
      for (const file of names) {
        files.push([file, yield* server.fs.readFile(`${dir}/${file}`).pipe(Effect.mapError(checkpointError))])
      }
      return frame(Wire.encode({}, files))
    }))
}

/** A checkpoint's files, written here and loaded. */
const load = (server: Server, t: GradientBackend.GradientBackend["Service"], body: Wire.Frame) =>
  viaDirectory(server, (dir) =>
    Effect.gen(function*() {
      // Only a checkpoint's own file names are written (no paths); the state file last, as a save writes it.
      const names = [...body.arrays.keys()]
      const stranger = names.find((name) => !Checkpoint.isFileName(name) || !(body.arrays.get(name) instanceof Uint8Array))
      if (stranger !== undefined) return yield* checkpointError({ message: `load: ${stranger} is no checkpoint file` })
      const lacking = Checkpoint.missingPart(names)
      if (lacking !== undefined) return yield* checkpointError({ message: `load: no ${lacking} sent` })
      for (const file of Checkpoint.inWriteOrder(names.filter((n) => n !== "trainer_state.json"))) {
        yield* server.fs.writeFile(`${dir}/${file}`, body.arrays.get(file) as Uint8Array).pipe(Effect.mapError(checkpointError))
      }
      return frame(Wire.encode({ meta: yield* t.load(dir) }))
    }))

// ===== Pushes to inference servers =====

const pushHeader = (op: string, body: Wire.Frame) =>
  Schema.decodeUnknownEffect(PushHeader)(body.header).pipe(
    Effect.mapError((e) => json(400, `${op}: ${e.message}`, "invalid_request"))
  )

/** A push's URLs outside the operator's allow-list (`allowPushUrls`), refused. */
const disallowed = (server: Server, op: string, urls: ReadonlyArray<string>): Reply | undefined => {
  const allow = server.options.allowPushUrls
  const bad = allow === undefined ? undefined : urls.find((u) => !allow.some((prefix) => u.startsWith(prefix)))
  return bad === undefined ? undefined :
    json(403, `${op}: ${bad} is not an allowed inference server (--allow-push-url)`, "url_not_allowed")
}

/** `bytes` on every server in `header.urls`, and what each did. */
const putAll = (bytes: Uint8Array, header: typeof PushHeader.Type) =>
  Effect.map(
    Effect.promise(() => Promise.all(header.urls.map((url) => WeightsPut.put(url, bytes, header)))),
    (list) => frame(Wire.encode({ outcomes: list.map((o) => o ?? null) }))
  )

/** The trainer's current weights to every server listed, as a new version (kept for catch-ups). */
const push = (server: Server, h: Hosted, body: Wire.Frame) =>
  Effect.gen(function*() {
    const header = yield* pushHeader("push", body)
    const refusedUrl = disallowed(server, "push", header.urls)
    if (refusedUrl !== undefined) return refusedUrl
    for (const url of header.urls) h.pushedTo.add(url)
    const weights = yield* Effect.mapError(h.trainer.weights, refused)
    const bytes = WeightsPut.serialize(h.parameters, weights)
    if (typeof bytes === "string") return json(500, `push: ${bytes}`, "Remote")
    h.pushed = { version: header.version, bytes }
    return yield* putAll(bytes, header)
  })

/** A version pushed before, to one server again (it missed it); not numbered: it changes nothing here. */
const catchUp = (h: Hosted, body: Wire.Frame) =>
  Effect.gen(function*() {
    const header = yield* pushHeader("catch_up", body)
    const stranger = header.urls.find((u) => !h.pushedTo.has(u))
    if (stranger !== undefined) {
      return json(403, `catch_up: ${stranger} is not a server this trainer pushed to`, "url_not_allowed")
    }
    if (h.pushed === undefined || h.pushed.version !== header.version) {
      return frame(Wire.encode({ outcomes: header.urls.map(() => "newer") }))
    }
    return yield* putAll(h.pushed.bytes, header)
  })

// ===== Calls =====

/** The weights' fingerprint and first non-finite value. */
const summary = (h: Hosted, w: GradientBackend.Weights) => {
  const own = new Map(h.parameters.map((p) => [p.name, w.get(p.name)!] as const))
  return frame(Wire.encode({
    fingerprint: Checkpoint.fingerprint(own),
    nonFinite: Checkpoint.firstNonFinite(own) ?? null
  }))
}

/** Runs operation `op` of a numbered call on `h`'s trainer. */
const operate = (server: Server, h: Hosted, op: string, body: Wire.Frame): Effect.Effect<Reply, Reply> => {
  const batch = Effect.suspend(() => {
    const mb = Wire.decodeBatch(body)
    return typeof mb === "string" ? Effect.fail(json(400, `${op}: ${mb}`, "BadBatch")) : Effect.succeed(mb)
  })
  const t = h.trainer
  switch (op) {
    case "forward_backward":
      return batch.pipe(
        Effect.flatMap((mb) => Effect.mapError(t.forwardBackward(mb), refused)),
        Effect.map((r) => frame(Wire.encodeResult(r)))
      )
    case "logprobs":
      return batch.pipe(
        Effect.flatMap((mb) => Effect.mapError(t.logprobs(mb), refused)),
        Effect.map((lp) => frame(Wire.encode({}, [["tokenLogprobs", lp]])))
      )
    case "optim_step":
      return Effect.map(Effect.mapError(t.optimStep, refused), (r) => frame(Wire.encode({ ...r })))
    case "discard":
      return Effect.as(t.discard, frame(Wire.encode({})))
    case "weights":
      return Effect.map(
        Effect.mapError(t.weights, refused),
        (w) => frame(Wire.encode({}, h.parameters.map((p) => [p.name, w.get(p.name)!] as const)))
      )
    case "step":
      return Effect.map(Effect.mapError(t.step, refused), (step) => frame(Wire.encode({ step })))
    case "summary":
      return Effect.map(Effect.mapError(t.weights, refused), (w) => summary(h, w))
    case "push":
      return push(server, h, body)
    case "save":
      return save(server, t, body)
    case "load":
      return load(server, t, body)
    default:
      return Effect.fail(json(404, `no operation ${op}`, "not_found"))
  }
}

/** Runs call `seq` on `h`, its reply kept for a client that sends it again. */
const runNumbered = Effect.fnUntraced(function*(server: Server, h: Hosted, op: string, seq: number, body: Wire.Frame) {
  const reply = yield* Deferred.make<Reply>()
  h.seq = seq
  h.reply = reply
  h.running = true
  const result = yield* replied(operate(server, h, op, body)).pipe(
    Effect.ensuring(Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.sync(() => {
        h.running = false
        h.lastCall = now
      })
    ))
  )
  yield* Deferred.succeed(reply, result)
  return result
})

/** A call of a session: the next number runs, the last one gets its reply again (`catch_up`, `close`: unnumbered). */
const call = Effect.fnUntraced(function*(
  server: Server,
  name: string,
  op: string,
  session: string,
  seq: number,
  body: Wire.Frame
) {
  const h = server.hosted.get(name)
  if (h === undefined || h.session !== session) {
    return json(404, `no trainer "${name}" with session ${session} here`, "unknown_session")
  }
  h.lastCall = yield* Clock.currentTimeMillis
  if (op === "catch_up") return yield* replied(catchUp(h, body))
  if (op === "close") {
    yield* server.lifecycle.withPermits(1)(server.hosted.get(name) === h ? drop(server, name) : Effect.void)
    return frame(Wire.encode({}))
  }
  if (seq === h.seq && h.reply !== undefined) return yield* Deferred.await(h.reply)
  if (seq !== h.seq + 1) {
    return json(409, `call ${seq} of trainer "${name}" after call ${h.seq}`, "out_of_order")
  }
  return yield* runNumbered(server, h, op, seq, body)
})

// ===== HTTP =====

/** `GET /v1/trainer`: what this server is and which trainers it holds. */
const info = (server: Server): Reply => ({
  status: 200,
  body: Buffer.from(JSON.stringify({
    service: "agentfly-trainer",
    executionProvider: server.options.executionProvider ?? "cpu",
    workers: server.options.workers ?? null,
    trainers: [...server.hosted.keys()]
  })),
  type: "application/json"
})

/** A request's reply: its route, body and headers checked, then the init or the call it asks for. */
const route = (server: Server, req: Http.IncomingMessage) =>
  replied(Effect.gen(function*() {
    // Before anything that reads the body or reveals state: a stranger learns nothing, not even a route.
    if (!Auth.authorize(server.auth, req).ok) {
      return json(401, "a valid bearer token is required (AGENTFLY_TRAINER_TOKEN)", "unauthorized")
    }
    const path = (req.url ?? "/").split("?")[0]!.replace(/\/+$/, "")
    if (path === "/v1/trainer" && req.method === "GET") return info(server)
    const match = /^\/v1\/trainer\/([^/]+)\/([a-z_]+)$/.exec(path)
    if (match === null || req.method !== "POST") return json(404, `no route ${req.method} ${path}`, "not_found")
    const name = yield* Effect.try({
      try: () => decodeURIComponent(match[1]!),
      catch: () => json(400, `the trainer name in ${path} is not a valid URL component`, "invalid_request")
    })
    const op = match[2]!
    const bytes = yield* readBody(req, server.maxBodyBytes).pipe(
      Effect.mapError((e) => json(e.status, e.message, "invalid_request"))
    )
    const body = op === "close" && bytes.length === 0 ? { header: {}, arrays: new Map() } : Wire.decode(bytes)
    if (typeof body === "string") return json(400, `${op}: ${body}`, "invalid_request")
    if (op === "init") return yield* init(server, name, body)
    const session = req.headers["x-agentfly-session"]
    const seq = Number(req.headers["x-agentfly-seq"])
    if (typeof session !== "string" || !Number.isInteger(seq) || seq < 0) {
      return json(400, "x-agentfly-session and x-agentfly-seq headers are required", "invalid_request")
    }
    return yield* call(server, name, op, session, seq, body)
  }))

/** Writes `reply`, unless the client went away. */
const send = (res: Http.ServerResponse, reply: Reply) =>
  Effect.sync(() => {
    if (res.destroyed || res.headersSent) return
    // A refusal before the body was read closes the connection: Node would drain the rest otherwise.
    const close = Auth.closesConnection(reply.status) ? { connection: "close" } : {}
    res.writeHead(reply.status, { "content-type": reply.type, "content-length": reply.body.length, ...close })
    res.end(reply.body)
  })

/**
 * Serves trainers over HTTP in the current scope.
 *
 * @category constructors
 * @since 0.1.0
 */
export const serve = Effect.fn("TrainerServer.serve")(function*(
  options: Options = {}
): Effect.fn.Return<{ readonly port: number; readonly baseUrl: string }, never, Scope.Scope | FileSystem.FileSystem> {
  const host = options.host ?? "127.0.0.1"
  const auth = Auth.tokens(typeof options.token === "string" ? [options.token] : options.token ?? [])
  const problem = Auth.bindProblem(host, auth, "AGENTFLY_TRAINER_TOKEN or --token-file")
  if (problem !== undefined) return yield* Effect.die(new Error(problem))
  const run = yield* FiberSet.makeRuntime<never>()
  const server: Server = {
    fs: yield* FileSystem.FileSystem,
    options,
    maxBodyBytes: options.maxBodyBytes ?? 2 * 1024 * 1024 * 1024,
    idleMillis: options.idleMillis ?? 3_600_000,
    auth,
    gate: Auth.gate(options.maxConcurrent ?? 16),
    hosted: new Map(),
    lifecycle: yield* Semaphore.make(1)
  }
  yield* Effect.addFinalizer(() =>
    Effect.forEach([...server.hosted.keys()], (name) => drop(server, name), { discard: true })
  )
  // On Effect's clock, so that a test moves it with `TestClock.adjust`.
  yield* closeIdle(server).pipe(
    Effect.delay(Math.min(server.idleMillis, 60_000)),
    Effect.forever,
    Effect.forkScoped
  )
  const http = Http.createServer((req, res) => {
    if (options.tinker?.(req, res) === true) return
    // The call runs to its end when the client goes away: its reply is kept for the client's retry.
    const overloaded = json(503, `the server is answering ${server.gate.max} requests already; retry`, "overloaded")
    run(Auth.within(server.gate, route(server, req), Effect.succeed(overloaded)).pipe(
      Effect.catchDefect((defect) => Effect.succeed(json(500, `internal error: ${String(defect)}`, "defect"))),
      Effect.flatMap((reply) => send(res, reply))
    ))
  })
  const port = yield* listen(http, { port: options.port ?? 0, host })
  return { port, baseUrl: `http://${host}:${port}/v1` }
})
