/**
 * A `GradientBackend` in another process: the client of `agentfly trainer` (`actors/TrainerServer.ts`), so that a
 * run's learner steps can run on another machine (a GPU box, a larger CPU host) while chains, tools and rewards run
 * here. Every call of the service is one HTTP request whose body and reply are frames of typed arrays
 * (`internal/trainerWire.ts`): micro-batches go as their bytes, logprobs and weights come back as theirs.
 *
 * - **Exactly once.** Calls of a trainer are numbered; a call whose connection broke (refused, reset, a 502/503 on
 *   the way) is sent again with its number until `retryMillis` have passed, and the server answers a number it has
 *   already run with the reply it gave, so a step is never applied twice nor lost.
 * - **A trainer that lost its state** (the server restarted, or another run took the name over) answers with an
 *   unknown session: the call fails `Remote`, naming the fix (resume the run from its last checkpoint). One that
 *   stays unreachable fails `Unavailable`, and so does a call without an answer after `callMillis` (not sent again).
 * - **Long calls.** Calls go through `node:http`, not `fetch`, whose answers must begin within 5 minutes: a large
 *   model's step may take longer.
 * - **Checkpoints stay with the run**: `save` brings the trainer's checkpoint files (weights, AdamW moments, state)
 *   into `dir` here, `load` sends them back, so `--resume` works whichever trainer serves the resumed run.
 *
 * @since 0.1.0
 */
import { Clock, Effect, FileSystem, Option, Schema, Scope, Semaphore } from "effect"
import * as ModelConfig from "../model/ModelConfig.ts"
import type * as Qwen2 from "../model/Qwen2.ts"
import type * as Loss from "../Loss.ts"
import type * as LrSchedule from "../LrSchedule.ts"
import type * as Optimizer from "../Optimizer.ts"
import type * as Packing from "../Packing.ts"
import * as Checkpoint from "../Checkpoint.ts"
import * as HttpPost from "../internal/httpPost.ts"
import * as GradientBackend from "../GradientBackend.ts"
import * as Wire from "./internal/trainerWire.ts"

// ===== Models =====

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The trainer's API root, `http://HOST:PORT/v1`. */
  readonly url: string
  /** A shared secret (`Authorization: Bearer`, `AGENTFLY_TRAINER_TOKEN` on the server). */
  readonly token?: string | undefined
  /**
   * The trainer's name on the server (default `policy`): a run's policy and its frozen KL reference are two names.
   * Initialising a name replaces the trainer that held it.
   */
  readonly name?: string | undefined
  readonly model: ModelConfig.ModelConfig
  /** The model's output head: `value` trains a critic there (`OnnxTrainer.qwen2Value`); default `lm`. */
  readonly head?: Qwen2.Head | undefined
  readonly parameters: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
  readonly weights: GradientBackend.Weights
  readonly loss: Loss.Config
  readonly optimizer: Optimizer.Config
  readonly schedule: LrSchedule.Config
  /** The server's learner threads (its own `--workers` wins); default 1. */
  readonly workers?: number | undefined
  /** How long a call is sent again while the trainer cannot be reached (default 60 s). */
  readonly retryMillis?: number | undefined
  /** How long one call may wait for its answer (default 30 minutes: `learner.timeoutSeconds`). */
  readonly callMillis?: number | undefined
  /** Counters to add this trainer's traffic to (a run shares one between its trainers: {@link makeTraffic}). */
  readonly traffic?: Traffic | undefined
}

/**
 * What went over the wire: calls, calls sent again after a broken connection, bytes each way.
 *
 * @category models
 * @since 0.1.0
 */
export interface Traffic {
  calls: number
  retries: number
  sentBytes: number
  receivedBytes: number
}

/**
 * @category constructors
 * @since 0.1.0
 */
export const makeTraffic = (): Traffic => ({ calls: 0, retries: 0, sentBytes: 0, receivedBytes: 0 })

/**
 * A `GradientBackend` on a trainer server, with what only a remote one offers: its weights' summary without sending
 * them, and pushing them to inference servers from there (`learner.pushWeights`).
 *
 * @category models
 * @since 0.1.0
 */
export type RemoteTrainer = GradientBackend.GradientBackend["Service"] & {
  /** The weights' fingerprint (`Checkpoint.fingerprint`) and first non-finite value, computed on the server. */
  readonly summary: Effect.Effect<Summary, GradientBackend.GradientBackendError>
  /**
   * Has the server put its current weights on each inference server in `urls` (`PUT /v1/weights`) as `push.version`;
   * per server what happened (`WeightsPut.Outcome`, as JSON: `null`, `"newer"` or `{ fatal, message }`).
   */
  readonly push: (
    push: PushRequest,
    urls: ReadonlyArray<string>
  ) => Effect.Effect<Outcomes, GradientBackend.GradientBackendError>
  /** The last pushed version to `urls` again (servers that missed it); `"newer"` when the trainer holds a later one. */
  readonly catchUp: (
    push: PushRequest,
    urls: ReadonlyArray<string>
  ) => Effect.Effect<Outcomes, GradientBackend.GradientBackendError>
}

/**
 * @category models
 * @since 0.1.0
 */
export interface Summary {
  readonly fingerprint: string
  /** `name[index] = value` of the first NaN or infinite weight; undefined when all are finite. */
  readonly nonFinite: string | undefined
}

/**
 * A push as the trainer server makes it: the version, the run's id, the servers' token, a time limit per server.
 *
 * @category models
 * @since 0.1.0
 */
export interface PushRequest {
  readonly version: number
  readonly runId: string
  readonly token?: string | undefined
  readonly timeoutMs: number
}

/**
 * What a push did to one server: taken (`undefined`), `"newer"`, or why not (`fatal`: retrying cannot mend it).
 *
 * @category models
 * @since 0.1.0
 */
export type PushOutcome = undefined | "newer" | { readonly fatal: boolean; readonly message: string }

type Outcomes = ReadonlyArray<PushOutcome>


/** Where the server's messages name the checkpoint directory it wrote or read, the client's `dir` goes. */
export const checkpointMarker = "<checkpoint>"

const fail = <Tag extends GradientBackend.GradientBackendErrorReason["_tag"]>(
  reason: Tag,
  message: string,
  facts?: GradientBackend.GradientBackendErrorFacts<Tag>
) => GradientBackend.gradientBackendError(reason, message, facts)

/** Connection failures worth sending a call again for (the request may or may not have arrived). */
const transient = (status: number) => status === 502 || status === 503 || status === 504

const decodeJson = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))

// ===== State =====

/** Where the trainer is and how to reach it: what every request needs. */
interface Connection {
  readonly root: string
  readonly name: string
  /** `ROOT/trainer/NAME`: the operations' URLs are `base/OP`. */
  readonly base: string
  readonly auth: Readonly<Record<string, string>>
  /** How messages name the trainer: `the trainer at ROOT`. */
  readonly where: string
  readonly retryMillis: number
  readonly callMillis: number
  readonly traffic: Traffic
}

/** A trainer initialised on the server: its session, the numbering of its calls and what is cached of it. */
interface Session extends Connection {
  readonly fs: FileSystem.FileSystem
  readonly options: Options
  readonly session: string
  /** One call in flight, numbered: the server runs each number once. */
  readonly lock: Semaphore.Semaphore
  seq: number
  /**
   * The weights and their summary change only with an optimiser step or a load: between them a run asks for them
   * several times (the finite check, publishing, the journal's fingerprint), and they come over the wire once.
   */
  cached: GradientBackend.Weights | undefined
  summarized: Summary | undefined
}

const connectionOf = (options: Options): Connection => {
  const root = options.url.replace(/\/+$/, "")
  const name = options.name ?? "policy"
  return {
    root,
    name,
    base: `${root}/trainer/${encodeURIComponent(name)}`,
    auth: options.token === undefined ? {} : { authorization: `Bearer ${options.token}` },
    where: `the trainer at ${root}`,
    retryMillis: options.retryMillis ?? 60_000,
    callMillis: options.callMillis ?? 30 * 60_000,
    traffic: options.traffic ?? makeTraffic()
  }
}

// ===== Requests =====

/** Why a call fails `Unavailable` once sending it again is over (`why`: the last attempt's failure). */
const unreachable = (c: Connection, op: string, why: string, patience: number) =>
  fail(
    "Unavailable",
    `${c.where} could not be reached for ${Math.round(patience / 1000)} s (${op}: ${why}); start it with ` +
      "`agentfly trainer --host HOST --port PORT`" +
      (op === "init" ? " (learner.url names it)" : " and resume the run from its last checkpoint")
  )

/** One attempt: the reply, or why the connection failed. */
const attempt = (c: Connection, op: string, body: Uint8Array, headers: Readonly<Record<string, string>>) =>
  Effect.tryPromise({
    // Not `fetch`: it gives up on an answer after 5 minutes, and a large model's step may take longer.
    try: (signal) =>
      HttpPost.post(`${c.base}/${op}`, {
        headers: { ...c.auth, ...headers, "content-type": "application/octet-stream" },
        body,
        timeoutMs: c.callMillis,
        signal
      }),
    catch: (e) => (e as Error).message ?? String(e)
  }).pipe(Effect.result)

/** One request, sent again while the connection fails (for `patience` ms); the reply or a typed failure. */
const request = Effect.fnUntraced(function*(
  c: Connection,
  op: string,
  body: Uint8Array,
  headers: Readonly<Record<string, string>>,
  patience: number = c.retryMillis
) {
  const deadline = (yield* Clock.currentTimeMillis) + patience
  let wait = 100
  c.traffic.calls++
  for (let n = 0;; n++) {
    if (n > 0) c.traffic.retries++
    c.traffic.sentBytes += body.byteLength
    const reply = yield* attempt(c, op, body, headers)
    if (reply._tag === "Success") c.traffic.receivedBytes += reply.success.bytes.byteLength
    if (reply._tag === "Success" && !transient(reply.success.status)) return reply.success
    const why = reply._tag === "Failure" ? reply.failure : `HTTP ${reply.success.status}`
    if (why.startsWith("no answer within")) {
      // The server took the call and is still at it, or hung: sending it again would only wait behind it.
      return yield* fail(
        "Unavailable",
        `${c.where} gave no answer to ${op} within ${c.callMillis / 1000} s (learner.timeoutSeconds): ` +
          "it is hung or slower than that limit; raise it, or restart the trainer and resume the run from its " +
          "last checkpoint"
      )
    }
    if ((yield* Clock.currentTimeMillis) + wait > deadline) return yield* unreachable(c, op, why, patience)
    // Said once a call, and only when it is sent again.
    if (n === 0) yield* Effect.logWarning(`${c.where}: ${op} failed (${why}); sending it again`)
    yield* Effect.sleep(wait)
    wait = Math.min(wait * 2, 2_000)
  }
})

/** A reply's frame, or the failure it carries. */
const replyOf = (
  c: Connection,
  op: string,
  reply: HttpPost.Reply
): Effect.Effect<Wire.Frame, GradientBackend.GradientBackendError> => {
  if (reply.status === 200) {
    const frame = Wire.decode(reply.bytes)
    return typeof frame === "string"
      ? Effect.fail(fail("Remote", `${c.where} answered ${op} with ${frame}`))
      : Effect.succeed(frame)
  }
  const text = Buffer.from(reply.bytes).toString("utf8")
  // Not JSON: the status and the first bytes say enough.
  const parsed = Option.getOrUndefined(decodeJson(text)) as { error?: { message?: unknown; code?: unknown } } | null
  const error = (typeof parsed === "object" && parsed !== null ? parsed.error : undefined) ?? {}
  const message = typeof error.message === "string" ? error.message : text.slice(0, 300)
  if (typeof error.code === "string" && GradientBackend.isGradientBackendErrorTag(error.code)) {
    return Effect.fail(fail(error.code, message))
  }
  if (error.code === "unknown_session") {
    return Effect.fail(fail(
      "Remote",
      `${c.where} no longer holds this run's trainer "${c.name}" (${message}): it restarted or another run took the ` +
        "name over; resume the run from its last checkpoint"
    ))
  }
  return Effect.fail(fail("Remote", `${c.where} refused ${op} (HTTP ${reply.status}): ${message}`))
}

/** The headers of a session's call numbered `seq` (0: not numbered). */
const sessionHeaders = (s: Session, seq: number) => ({ "x-agentfly-session": s.session, "x-agentfly-seq": String(seq) })

/** A numbered call: one at a time, each with the next number. */
const call = (s: Session, op: string, body: Uint8Array = Wire.encode({})) =>
  s.lock.withPermits(1)(Effect.suspend(() => {
    s.seq++
    return Effect.flatMap(request(s, op, body, sessionHeaders(s, s.seq)), (r) => replyOf(s, op, r))
  }))

/** `effect`, after which the cached weights and summary are stale. */
const changes = <A, E, R>(s: Session, effect: Effect.Effect<A, E, R>) =>
  Effect.ensuring(effect, Effect.sync(() => {
    s.cached = undefined
    s.summarized = undefined
  }))

// ===== Init and close =====

/** The init frame: the model's config, loss, optimiser, schedule and workers, then its weights. */
const initFrame = (options: Options) =>
  Wire.encode({
    model: ModelConfig.toJson(options.model),
    ...(options.head === undefined || options.head === "lm" ? {} : { head: options.head }),
    loss: options.loss,
    optimizer: options.optimizer,
    schedule: options.schedule,
    workers: options.workers ?? 1
  }, options.parameters.map((p) => [p.name, options.weights.get(p.name)!] as const))

/** Initialises the trainer on the server: its session id. */
const open = Effect.fnUntraced(function*(c: Connection, options: Options) {
  // A trainer that is not there when the run starts is not waited for as long as one lost mid-run.
  const reply = yield* request(c, "init", initFrame(options), {}, Math.min(c.retryMillis, 5_000))
  const opened = yield* replyOf(c, "init", reply)
  const session = opened.header["session"]
  if (typeof session !== "string") return yield* fail("Remote", `${c.where} answered init without a session`)
  return session
})

/** Frees the trainer's memory on the server; a server already gone has nothing to free. */
const close = (s: Session) =>
  Effect.tryPromise((signal) =>
    fetch(`${s.base}/close`, {
      method: "POST",
      headers: { ...s.auth, ...sessionHeaders(s, 0) },
      signal: AbortSignal.any([signal, AbortSignal.timeout(5_000)])
    })
  ).pipe(Effect.ignore)

// ===== Operations =====

const numbers = (s: Session, frame: Wire.Frame, keys: ReadonlyArray<string>, op: string) => {
  const missing = keys.find((k) => typeof frame.header[k] !== "number")
  return missing === undefined
    ? Effect.succeed(frame.header as Record<string, number>)
    : Effect.fail(fail("Remote", `${s.where} answered ${op} without ${missing}`))
}

const copy = (w: GradientBackend.Weights): GradientBackend.Weights =>
  new Map([...w].map(([k, v]) => [k, Float32Array.from(v)]))

const forwardBackward = (s: Session, batch: Packing.MicroBatch) =>
  Effect.flatMap(call(s, "forward_backward", Wire.encodeBatch(batch)), (frame) => {
    const result = Wire.decodeResult(frame)
    return typeof result === "string" ? Effect.fail(fail("Remote", `${s.where}: ${result}`)) : Effect.succeed(result)
  })

const logprobs = (s: Session, batch: Packing.MicroBatch) =>
  Effect.flatMap(call(s, "logprobs", Wire.encodeBatch(batch)), (frame) => {
    const lp = frame.arrays.get("tokenLogprobs")
    return lp instanceof Float32Array
      ? Effect.succeed(lp)
      : Effect.fail(fail("Remote", `${s.where} answered logprobs without tokenLogprobs`))
  })

const optimStep = (s: Session) =>
  Effect.flatMap(
    changes(s, call(s, "optim_step")),
    (frame) => numbers(s, frame, ["step", "gradNorm", "lr"], "optim_step")
  ).pipe(Effect.map((h) => ({ step: h["step"]!, gradNorm: h["gradNorm"]!, lr: h["lr"]! })))

const weights = (s: Session) =>
  Effect.suspend(() =>
    s.cached !== undefined ? Effect.succeed(copy(s.cached)) : Effect.flatMap(call(s, "weights"), (frame) => {
      const weights = Wire.decodeWeights(frame, s.options.parameters)
      if (typeof weights === "string") return Effect.fail(fail("Remote", `${s.where}: ${weights}`))
      s.cached = weights
      return Effect.succeed(copy(weights))
    })
  )

const summary = (s: Session) =>
  Effect.suspend(() =>
    s.summarized !== undefined ? Effect.succeed(s.summarized) : Effect.flatMap(call(s, "summary"), (frame) => {
      const { fingerprint, nonFinite } = frame.header
      if (typeof fingerprint !== "string" || (nonFinite !== null && typeof nonFinite !== "string")) {
        return Effect.fail(fail("Remote", `${s.where} answered summary without a fingerprint`))
      }
      s.summarized = { fingerprint, nonFinite: nonFinite ?? undefined }
      return Effect.succeed(s.summarized)
    })
  )

// ----- Pushes -----

const pushHeader = (push: PushRequest, urls: ReadonlyArray<string>) => ({
  version: push.version,
  runId: push.runId,
  ...(push.token === undefined ? {} : { token: push.token }),
  timeoutMs: push.timeoutMs,
  urls
})

const isOutcome = (o: unknown): o is PushOutcome | null =>
  o === null || o === "newer" ||
  (typeof o === "object" && typeof (o as { message?: unknown }).message === "string" &&
    typeof (o as { fatal?: unknown }).fatal === "boolean")

const outcomesOf = (s: Session, op: string, urls: ReadonlyArray<string>) => (frame: Wire.Frame) => {
  const list = frame.header["outcomes"]
  if (!Array.isArray(list) || list.length !== urls.length || !list.every(isOutcome)) {
    return Effect.fail(fail("Remote", `${s.where} answered ${op} without an outcome per server`))
  }
  return Effect.succeed(list.map((o: PushOutcome | null) => o ?? undefined))
}

const push = (s: Session, push: PushRequest, urls: ReadonlyArray<string>) =>
  Effect.flatMap(call(s, "push", Wire.encode(pushHeader(push, urls))), outcomesOf(s, "push", urls))

// Not numbered (it changes nothing on the server), so it does not wait behind the learner's calls.
const catchUp = (s: Session, push: PushRequest, urls: ReadonlyArray<string>) =>
  request(s, "catch_up", Wire.encode(pushHeader(push, urls)), sessionHeaders(s, 0)).pipe(
    Effect.flatMap((r) => replyOf(s, "catch_up", r)),
    Effect.flatMap(outcomesOf(s, "catch_up", urls))
  )

// ----- Checkpoints -----

const save = Effect.fnUntraced(function*(s: Session, dir: string, meta: GradientBackend.CheckpointMeta) {
  const frame = yield* call(s, "save", Wire.encode({ meta }))
  // Whatever the checkpoint's size, its files (shards included) arrive by name; only checkpoint names are written.
  const names = [...frame.arrays.keys()]
  const stranger = names.find((name) => !Checkpoint.isFileName(name) || !(frame.arrays.get(name) instanceof Uint8Array))
  if (stranger !== undefined) return yield* fail("Remote", `${s.where} answered save with a file ${stranger}`)
  const lacking = Checkpoint.missingPart(names)
  if (lacking !== undefined) return yield* fail("Remote", `${s.where} answered save without ${lacking}`)
  const files = Checkpoint.inWriteOrder(names.filter((n) => n !== "trainer_state.json"))
    .map((f) => [f, frame.arrays.get(f)] as const)
  const io = (e: { message: string }) => fail("Checkpoint", `${dir}: ${e.message}`)
  yield* s.fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(io))
  // As `Checkpoint.save`: the state file goes last, by rename, so a crash leaves an incomplete checkpoint.
  yield* s.fs.remove(`${dir}/trainer_state.json`, { force: true }).pipe(Effect.mapError(io))
  for (const [file, bytes] of files) {
    const path = file === "trainer_state.json" ? `${dir}/${file}.tmp` : `${dir}/${file}`
    yield* s.fs.writeFile(path, bytes as Uint8Array).pipe(Effect.mapError(io))
  }
  yield* s.fs.rename(`${dir}/trainer_state.json.tmp`, `${dir}/trainer_state.json`).pipe(Effect.mapError(io))
})

const load = Effect.fnUntraced(function*(s: Session, dir: string) {
  const files: Array<readonly [string, Uint8Array]> = []
  const names = yield* Checkpoint.files(dir).pipe(
    Effect.provideService(FileSystem.FileSystem, s.fs),
    Effect.mapError((e) => fail("Checkpoint", e.message))
  )
  const lacking = Checkpoint.missingPart(names)
  if (lacking !== undefined) return yield* fail("Checkpoint", `${dir}/${lacking} is missing`)
  for (const file of names) {
    const path = `${dir}/${file}`
    const exists = yield* s.fs.exists(path).pipe(Effect.orElseSucceed(() => false))
    if (!exists) return yield* fail("Checkpoint", `${path} is missing`)
    files.push([file, yield* s.fs.readFile(path).pipe(Effect.mapError((e) => fail("Checkpoint", e.message)))])
  }
  const frame = yield* call(s, "load", Wire.encode({}, files)).pipe(
    Effect.mapError((e) => e.withMessage(e.message.replaceAll(checkpointMarker, dir)))
  )
  const meta = frame.header["meta"] as GradientBackend.CheckpointMeta | undefined
  if (typeof meta?.policyVersion !== "number" || !Array.isArray(meta.rngState)) {
    return yield* fail("Remote", `${s.where} answered load without the checkpoint's meta`)
  }
  return { policyVersion: meta.policyVersion, rngState: meta.rngState }
})

// ===== Constructors =====

/**
 * Initialises a trainer on the server with `options.weights` and a fresh optimiser, and returns it as a
 * `GradientBackend`; closing the scope frees it there.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("RemoteTrainer.make")(function*(
  options: Options
): Effect.fn.Return<RemoteTrainer, GradientBackend.GradientBackendError, Scope.Scope | FileSystem.FileSystem> {
  const connection = connectionOf(options)
  const s: Session = {
    ...connection,
    fs: yield* FileSystem.FileSystem,
    options,
    session: yield* open(connection, options),
    lock: yield* Semaphore.make(1),
    seq: 0,
    cached: undefined,
    summarized: undefined
  }
  yield* Effect.addFinalizer(() => close(s))
  return {
    forwardBackward: (batch) => forwardBackward(s, batch),
    logprobs: (batch) => logprobs(s, batch),
    optimStep: optimStep(s),
    // A discard that cannot reach the trainer leaves nothing to clear here; the next call reports the trainer.
    discard: Effect.ignore(call(s, "discard")),
    weights: weights(s),
    step: Effect.map(Effect.flatMap(call(s, "step"), (f) => numbers(s, f, ["step"], "step")), (h) => h["step"]!),
    summary: summary(s),
    push: (request, urls) => push(s, request, urls),
    catchUp: (request, urls) => catchUp(s, request, urls),
    save: (dir, meta) => save(s, dir, meta),
    load: (dir) => changes(s, load(s, dir))
  }
})
