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
 * - **Errors** come back as JSON `{ error: { message, code } }`, the code being the `PolicyTrainerError` reason.
 *
 * The wire: `GET /v1/trainer` → `{ service, executionProvider, workers, trainers }`;
 * `POST /v1/trainer/NAME/init` (frame: model config, loss, optimizer, schedule, workers; the weights) → `{ session }`;
 * `POST /v1/trainer/NAME/OP` with `x-agentfly-session` and `x-agentfly-seq`, OP one of `forward_backward`,
 * `logprobs`, `optim_step`, `discard`, `weights`, `summary` (the weights' fingerprint and first non-finite value),
 * `push` (the current weights to inference servers as a version: `PUT /v1/weights` from here), `step`, `save`, `load`,
 * `close`, and `catch_up` (not numbered: the last pushed version to servers that missed it) (frames:
 * `internal/trainerWire.ts`).
 *
 * @since 0.1.0
 */
import { Deferred, Effect, Exit, FiberSet, FileSystem, Schema, Scope, Semaphore } from "effect"
import * as Http from "node:http"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as RemoteTrainer from "../src/backends/RemoteTrainer.ts"
import * as Wire from "../src/backends/internal/trainerWire.ts"
import * as Checkpoint from "../src/Checkpoint.ts"
import * as Optimizer from "../src/Optimizer.ts"
import * as PolicyTrainer from "../src/PolicyTrainer.ts"
import { listen, readBody } from "./internal/http.ts"
import * as WeightsPut from "./internal/weightsPut.ts"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Default `127.0.0.1`. */
  readonly host?: string | undefined
  /** Default 0: a free port. */
  readonly port?: number | undefined
  /** A shared secret every request must bear (`Authorization: Bearer`; `AGENTFLY_TRAINER_TOKEN`). */
  readonly token?: string | undefined
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
}

interface Reply {
  readonly status: number
  readonly body: Uint8Array
  readonly type: "application/octet-stream" | "application/json"
}

interface Hosted {
  readonly session: string
  readonly scope: Scope.Closeable
  readonly trainer: PolicyTrainer.PolicyTrainer["Service"]
  readonly parameters: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
  seq: number
  reply: Deferred.Deferred<Reply> | undefined
  lastCall: number
  running: boolean
  /** The version last pushed to inference servers, as the bytes they take (kept for catch-ups). */
  pushed: { readonly version: number; readonly bytes: Uint8Array } | undefined
}

const json = (status: number, message: string, code: string): Reply => ({
  status,
  body: Buffer.from(JSON.stringify({ error: { message, code } })),
  type: "application/json"
})

const frame = (body: Uint8Array): Reply => ({ status: 200, body, type: "application/octet-stream" })

const refused = (e: PolicyTrainer.PolicyTrainerError): Reply =>
  json(e.reason._tag === "BadBatch" ? 400 : 422, e.message, e.reason._tag)

const InitHeader = Schema.Struct({
  model: Schema.Unknown,
  /** The model's output head: `value` for a critic (`OnnxTrainer.qwen2Value`); default the language-model head. */
  head: Schema.optionalKey(Schema.Literals(["lm", "value"])),
  loss: Loss.Config,
  optimizer: Optimizer.Config,
  schedule: LrSchedule.Config,
  workers: Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 64 }))
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
  const fs = yield* FileSystem.FileSystem
  const run = yield* FiberSet.makeRuntime<never>()
  const host = options.host ?? "127.0.0.1"
  const maxBodyBytes = options.maxBodyBytes ?? 2 * 1024 * 1024 * 1024
  const hosted = new Map<string, Hosted>()
  // Inits and closes one at a time: a trainer's threads and sessions go before the next one's start.
  const lifecycle = yield* Semaphore.make(1)
  let sessions = 0

  const drop = (name: string) =>
    Effect.suspend(() => {
      const h = hosted.get(name)
      hosted.delete(name)
      return h === undefined ? Effect.void : Scope.close(h.scope, Exit.void)
    })
  yield* Effect.addFinalizer(() => Effect.forEach([...hosted.keys()], drop, { discard: true }))
  const idleMillis = options.idleMillis ?? 3_600_000
  yield* lifecycle.withPermits(1)(Effect.suspend(() =>
    Effect.forEach(
      [...hosted].filter(([, h]) => !h.running && Date.now() - h.lastCall > idleMillis),
      ([name]) => Effect.andThen(drop(name), Effect.logInfo(`trainer ${name}: closed after ${idleMillis / 1000} s without a call`)),
      { discard: true }
    )
  )).pipe(
    Effect.delay(Math.min(idleMillis, 60_000)),
    Effect.forever,
    Effect.forkScoped
  )

  const init = (name: string, body: Wire.Frame) =>
    lifecycle.withPermits(1)(Effect.gen(function*() {
      const header = yield* Schema.decodeUnknownEffect(InitHeader)(body.header).pipe(
        Effect.mapError((e) => json(400, `init: ${e.message}`, "invalid_request"))
      )
      const config = yield* ModelConfig.decode(header.model).pipe(
        Effect.mapError((e) => json(400, `init: the model config: ${e.message}`, "invalid_request"))
      )
      const model = header.head === "value" ? OnnxTrainer.qwen2Value(config) : OnnxTrainer.qwen2(config)
      const weights = Wire.decodeWeights(body, model.parameters)
      if (typeof weights === "string") return yield* Effect.fail(json(400, `init: ${weights}`, "invalid_request"))
      yield* drop(name)
      const scope = yield* Scope.make()
      const workers = options.workers ?? header.workers
      const made = yield* OnnxTrainer.make({
        model,
        weights,
        loss: header.loss,
        optimizer: header.optimizer,
        schedule: header.schedule,
        workers,
        ...(options.executionProvider === undefined ? {} : { executionProvider: options.executionProvider }),
        // One intra-op thread, as a local run: the sums then run in a fixed order and a step repeats to the bit.
        intraOpThreads: 1
      }).pipe(
        Effect.provideService(Scope.Scope, scope),
        Effect.provideService(FileSystem.FileSystem, fs),
        Effect.tapError(() => Scope.close(scope, Exit.void)),
        Effect.mapError(refused)
      )
      const session = `${name}-${++sessions}-${Date.now().toString(36)}`
      hosted.set(name, {
        session,
        scope,
        trainer: made.trainer,
        parameters: model.parameters,
        seq: 0,
        reply: undefined,
        lastCall: Date.now(),
        running: false,
        pushed: undefined
      })
      if (options.onInit !== undefined) {
        yield* options.onInit(name, model.parameters.reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0), workers)
      }
      return frame(Wire.encode({ session }))
    }))

  /** A checkpoint's files through a directory of this machine's, its path hidden from messages. */
  const viaDirectory = <A>(use: (dir: string) => Effect.Effect<A, PolicyTrainer.PolicyTrainerError>) =>
    Effect.acquireUseRelease(
      fs.makeTempDirectory({ prefix: "agentfly-trainer-" }).pipe(
        Effect.mapError((e) => json(500, `no temporary directory: ${e.message}`, "Checkpoint"))
      ),
      (dir) =>
        use(dir).pipe(Effect.mapError((e) =>
          refused(e.withMessage(e.message.replaceAll(dir, RemoteTrainer.checkpointMarker)))
        )),
      (dir) => fs.remove(dir, { recursive: true }).pipe(Effect.ignore)
    )

  const checkpointError = (e: { readonly message: string }) =>
    PolicyTrainer.policyTrainerError("Checkpoint", e.message, { cause: e })

  /** The trainer's checkpoint, written here and sent back as its files. */
  const save = (t: PolicyTrainer.PolicyTrainer["Service"], body: Wire.Frame) => {
    const meta = body.header["meta"] as PolicyTrainer.CheckpointMeta | undefined
    if (typeof meta?.policyVersion !== "number" || !Array.isArray(meta.rngState)) {
      return Effect.fail(json(400, "save: the header holds no meta { policyVersion, rngState }", "invalid_request"))
    }
    return viaDirectory((dir) =>
      Effect.gen(function*() {
        yield* t.save(dir, meta)
        const files: Array<readonly [string, Uint8Array]> = []
        for (const file of RemoteTrainer.checkpointFiles) {
          files.push([file, yield* fs.readFile(`${dir}/${file}`).pipe(Effect.mapError(checkpointError))])
        }
        return frame(Wire.encode({}, files))
      })
    )
  }

  /** A checkpoint's files, written here and loaded. */
  const load = (t: PolicyTrainer.PolicyTrainer["Service"], body: Wire.Frame) =>
    viaDirectory((dir) =>
      Effect.gen(function*() {
        for (const file of RemoteTrainer.checkpointFiles) {
          const bytes = body.arrays.get(file)
          if (!(bytes instanceof Uint8Array)) return yield* checkpointError({ message: `load: no ${file} sent` })
          yield* fs.writeFile(`${dir}/${file}`, bytes).pipe(Effect.mapError(checkpointError))
        }
        return frame(Wire.encode({ meta: yield* t.load(dir) }))
      })
    )

  const PushHeader = Schema.Struct({
    version: Schema.Int,
    runId: Schema.String,
    token: Schema.optionalKey(Schema.String),
    timeoutMs: Schema.Int.check(Schema.isGreaterThan(0)),
    urls: Schema.Array(Schema.String)
  })
  const pushHeader = (op: string, body: Wire.Frame) =>
    Schema.decodeUnknownEffect(PushHeader)(body.header).pipe(
      Effect.mapError((e) => json(400, `${op}: ${e.message}`, "invalid_request"))
    )
  /** `bytes` on every server in `header.urls`, and what each did. */
  const putAll = (bytes: Uint8Array, header: typeof PushHeader.Type) =>
    Effect.map(
      Effect.promise(() => Promise.all(header.urls.map((url) => WeightsPut.put(url, bytes, header)))),
      (list) => frame(Wire.encode({ outcomes: list.map((o) => o ?? null) }))
    )

  /** The trainer's current weights to every server listed, as a new version (kept for catch-ups). */
  const push = (h: Hosted, body: Wire.Frame) =>
    Effect.gen(function*() {
      const header = yield* pushHeader("push", body)
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
      if (h.pushed === undefined || h.pushed.version !== header.version) {
        return frame(Wire.encode({ outcomes: header.urls.map(() => "newer") }))
      }
      return yield* putAll(h.pushed.bytes, header)
    })

  const operate = (h: Hosted, op: string, body: Wire.Frame): Effect.Effect<Reply, Reply> => {
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
        return Effect.map(Effect.mapError(t.weights, refused), (w) => {
          const own = new Map(h.parameters.map((p) => [p.name, w.get(p.name)!] as const))
          return frame(Wire.encode({
            fingerprint: Checkpoint.fingerprint(own),
            nonFinite: Checkpoint.firstNonFinite(own) ?? null
          }))
        })
      case "push":
        return push(h, body)
      case "save":
        return save(t, body)
      case "load":
        return load(t, body)
      default:
        return Effect.fail(json(404, `no operation ${op}`, "not_found"))
    }
  }

  /** A numbered call: the next number runs, the last one gets its reply again. */
  const call = (name: string, op: string, session: string, seq: number, body: Wire.Frame) =>
    Effect.gen(function*() {
      const h = hosted.get(name)
      if (h === undefined || h.session !== session) {
        return json(404, `no trainer "${name}" with session ${session} here`, "unknown_session")
      }
      h.lastCall = Date.now()
      if (op === "catch_up") return yield* Effect.match(catchUp(h, body), { onFailure: (r) => r, onSuccess: (r) => r })
      if (op === "close") {
        yield* lifecycle.withPermits(1)(hosted.get(name) === h ? drop(name) : Effect.void)
        return frame(Wire.encode({}))
      }
      if (seq === h.seq && h.reply !== undefined) return yield* Deferred.await(h.reply)
      if (seq !== h.seq + 1) {
        return json(409, `call ${seq} of trainer "${name}" after call ${h.seq}`, "out_of_order")
      }
      const reply = yield* Deferred.make<Reply>()
      h.seq = seq
      h.reply = reply
      h.running = true
      const result = yield* Effect.match(operate(h, op, body), { onFailure: (r) => r, onSuccess: (r) => r }).pipe(
        Effect.ensuring(Effect.sync(() => {
          h.running = false
          h.lastCall = Date.now()
        }))
      )
      yield* Deferred.succeed(reply, result)
      return result
    })

  const route = (req: Http.IncomingMessage) =>
    Effect.gen(function*() {
      const path = (req.url ?? "/").split("?")[0]!.replace(/\/+$/, "")
      if (options.token !== undefined && req.headers.authorization !== `Bearer ${options.token}`) {
        return json(401, "a valid bearer token is required (AGENTFLY_TRAINER_TOKEN)", "unauthorized")
      }
      if (path === "/v1/trainer" && req.method === "GET") {
        const info = {
          service: "agentfly-trainer",
          executionProvider: options.executionProvider ?? "cpu",
          workers: options.workers ?? null,
          trainers: [...hosted.keys()]
        }
        return { status: 200, body: Buffer.from(JSON.stringify(info)), type: "application/json" } as const
      }
      const match = /^\/v1\/trainer\/([^/]+)\/([a-z_]+)$/.exec(path)
      if (match === null || req.method !== "POST") return json(404, `no route ${req.method} ${path}`, "not_found")
      const name = decodeURIComponent(match[1]!)
      const op = match[2]!
      const bytes = yield* readBody(req, maxBodyBytes).pipe(
        Effect.mapError((e) => json(e.status, e.message, "invalid_request"))
      )
      const body = op === "close" && bytes.length === 0 ? { header: {}, arrays: new Map() } : Wire.decode(bytes)
      if (typeof body === "string") return json(400, `${op}: ${body}`, "invalid_request")
      if (op === "init") return yield* init(name, body)
      const session = req.headers["x-agentfly-session"]
      const seq = Number(req.headers["x-agentfly-seq"])
      if (typeof session !== "string" || !Number.isInteger(seq) || seq < 0) {
        return json(400, "x-agentfly-session and x-agentfly-seq headers are required", "invalid_request")
      }
      return yield* call(name, op, session, seq, body)
    }).pipe(Effect.match({ onFailure: (r) => r, onSuccess: (r) => r }))

  const server = Http.createServer((req, res) => {
    // The call runs to its end when the client goes away: its reply is kept for the client's retry.
    run(route(req).pipe(
      Effect.catchDefect((defect) => Effect.succeed(json(500, `internal error: ${String(defect)}`, "defect"))),
      Effect.flatMap((reply) =>
        Effect.sync(() => {
          if (res.destroyed || res.headersSent) return
          res.writeHead(reply.status, {
            "content-type": reply.type,
            "content-length": reply.body.length
          })
          res.end(reply.body)
        })
      )
    ))
  })
  const port = yield* listen(server, { port: options.port ?? 0, host })
  return { port, baseUrl: `http://${host}:${port}/v1` }
})
