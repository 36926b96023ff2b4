/**
 * A `PolicyTrainer` in another process: the client of `agentfly trainer` (`actors/TrainerServer.ts`), so that a
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
import { Effect, FileSystem, Scope, Semaphore } from "effect"
import { randomUUID } from "node:crypto"
import * as ModelConfig from "../model/ModelConfig.ts"
import type * as Qwen2 from "../model/Qwen2.ts"
import type * as Loss from "../Loss.ts"
import type * as LrSchedule from "../LrSchedule.ts"
import type * as Optimizer from "../Optimizer.ts"
import type * as Packing from "../Packing.ts"
import * as HttpPost from "../internal/httpPost.ts"
import * as PolicyTrainer from "../PolicyTrainer.ts"
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
  readonly weights: PolicyTrainer.Weights
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
 * A `PolicyTrainer` on a trainer server, with what only a remote one offers: its weights' summary without sending
 * them, and pushing them to inference servers from there (`learner.pushWeights`).
 *
 * @category models
 * @since 0.1.0
 */
export type RemoteTrainer = PolicyTrainer.PolicyTrainer["Service"] & {
  /** The weights' fingerprint (`Checkpoint.fingerprint`) and first non-finite value, computed on the server. */
  readonly summary: Effect.Effect<Summary, PolicyTrainer.PolicyTrainerError>
  /**
   * Has the server put its current weights on each inference server in `urls` (`PUT /v1/weights`) as `push.version`;
   * per server what happened (`WeightsPut.Outcome`, as JSON: `null`, `"newer"` or `{ fatal, message }`).
   */
  readonly push: (push: PushRequest, urls: ReadonlyArray<string>) => Effect.Effect<Outcomes, PolicyTrainer.PolicyTrainerError>
  /** The last pushed version to `urls` again (servers that missed it); `"newer"` when the trainer holds a later one. */
  readonly catchUp: (push: PushRequest, urls: ReadonlyArray<string>) => Effect.Effect<Outcomes, PolicyTrainer.PolicyTrainerError>
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

/** The checkpoint files a trainer's `save` writes (`Checkpoint.save`), the state file last. */
export const checkpointFiles = ["model.safetensors", "optimizer.safetensors", "trainer_state.json"] as const

/** Where the server's messages name the checkpoint directory it wrote or read, the client's `dir` goes. */
export const checkpointMarker = "<checkpoint>"

const fail = <Tag extends PolicyTrainer.PolicyTrainerErrorReason["_tag"]>(
  reason: Tag,
  message: string,
  facts?: PolicyTrainer.PolicyTrainerErrorFacts<Tag>
) => PolicyTrainer.policyTrainerError(reason, message, facts)

/** Connection failures worth sending a call again for (the request may or may not have arrived). */
const transient = (status: number) => status === 502 || status === 503 || status === 504

// ===== Constructors =====

/**
 * Initialises a trainer on the server with `options.weights` and a fresh optimiser, and returns it as a
 * `PolicyTrainer`; closing the scope frees it there.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("RemoteTrainer.make")(function*(
  options: Options
): Effect.fn.Return<RemoteTrainer, PolicyTrainer.PolicyTrainerError, Scope.Scope | FileSystem.FileSystem> {
  const fs = yield* FileSystem.FileSystem
  const root = options.url.replace(/\/+$/, "")
  const name = options.name ?? "policy"
  const base = `${root}/trainer/${encodeURIComponent(name)}`
  const retryMillis = options.retryMillis ?? 60_000
  const callMillis = options.callMillis ?? 30 * 60_000
  const auth: Record<string, string> = options.token === undefined ? {} : { authorization: `Bearer ${options.token}` }
  const where = `the trainer at ${root}`
  const traffic = options.traffic ?? makeTraffic()

  /** One request, sent again while the connection fails; the reply's frame or a typed failure. */
  const request = (op: string, body: Uint8Array, headers: Record<string, string>, patience = retryMillis) =>
    Effect.gen(function*() {
      const deadline = Date.now() + patience
      let wait = 100
      traffic.calls++
      for (let attempt = 0;; attempt++) {
        if (attempt > 0) traffic.retries++
        traffic.sentBytes += body.byteLength
        const reply = yield* Effect.tryPromise({
          // Not `fetch`: it gives up on an answer after 5 minutes, and a large model's step may take longer.
          try: (signal) =>
            HttpPost.post(`${base}/${op}`, {
              headers: { ...auth, ...headers, "content-type": "application/octet-stream" },
              body,
              timeoutMs: callMillis,
              signal
            }),
          catch: (e) => (e as Error).message ?? String(e)
        }).pipe(Effect.result)
        if (reply._tag === "Success") traffic.receivedBytes += reply.success.bytes.byteLength
        if (reply._tag === "Success" && !transient(reply.success.status)) return reply.success
        const why = reply._tag === "Failure" ? reply.failure : `HTTP ${reply.success.status}`
        if (attempt === 0) yield* Effect.logWarning(`${where}: ${op} failed (${why}); sending it again`)
        if (why.startsWith("no answer within")) {
          // The server took the call and is still at it, or hung: sending it again would only wait behind it.
          return yield* fail(
            "Unavailable",
            `${where} gave no answer to ${op} within ${callMillis / 1000} s (learner.timeoutSeconds): ` +
              "it is hung or slower than that limit; raise it, or restart the trainer and resume the run from its " +
              "last checkpoint"
          )
        }
        if (Date.now() + wait > deadline) {
          return yield* fail(
            "Unavailable",
            `${where} could not be reached for ${Math.round(patience / 1000)} s (${op}: ${why}); start it with ` +
              "`agentfly trainer --host HOST --port PORT`" +
              (op === "init" ? " (learner.url names it)" : " and resume the run from its last checkpoint")
          )
        }
        yield* Effect.sleep(wait)
        wait = Math.min(wait * 2, 2_000)
      }
    })

  /** A reply's frame, or the failure it carries. */
  const replyOf = (op: string, reply: { readonly status: number; readonly bytes: Uint8Array }) => {
    if (reply.status === 200) {
      const frame = Wire.decode(reply.bytes)
      return typeof frame === "string" ? Effect.fail(fail("Remote", `${where} answered ${op} with ${frame}`)) : Effect.succeed(frame)
    }
    let error: { message?: unknown; code?: unknown } = {}
    try {
      error = (JSON.parse(Buffer.from(reply.bytes).toString("utf8")) as { error?: typeof error }).error ?? {}
    } catch {
      // Not JSON: the status and the first bytes say enough.
    }
    const message = typeof error.message === "string" ? error.message : Buffer.from(reply.bytes).toString("utf8").slice(0, 300)
    if (typeof error.code === "string" && PolicyTrainer.isPolicyTrainerErrorTag(error.code)) {
      return Effect.fail(fail(error.code, message))
    }
    if (error.code === "unknown_session") {
      return Effect.fail(fail(
        "Remote",
        `${where} no longer holds this run's trainer "${name}" (${message}): it restarted or another run took the ` +
          "name over; resume the run from its last checkpoint"
      ))
    }
    return Effect.fail(fail("Remote", `${where} refused ${op} (HTTP ${reply.status}): ${message}`))
  }

  // ----- Init -----

  const init = Wire.encode({
    model: ModelConfig.toJson(options.model),
    ...(options.head === undefined || options.head === "lm" ? {} : { head: options.head }),
    loss: options.loss,
    optimizer: options.optimizer,
    schedule: options.schedule,
    workers: options.workers ?? 1
  }, options.parameters.map((p) => [p.name, options.weights.get(p.name)!] as const))
  // A trainer that is not there when the run starts is not waited for as long as one lost mid-run.
  const opened = yield* Effect.flatMap(request("init", init, {}, Math.min(retryMillis, 5_000)), (r) => replyOf("init", r))
  const session = opened.header["session"]
  if (typeof session !== "string") return yield* fail("Remote", `${where} answered init without a session`)

  // One call in flight, numbered: the server runs each number once.
  const lock = yield* Semaphore.make(1)
  let seq = 0
  const call = (op: string, body: Uint8Array = Wire.encode({})) =>
    lock.withPermits(1)(Effect.suspend(() => {
      seq++
      return Effect.flatMap(
        request(op, body, { "x-agentfly-session": session, "x-agentfly-seq": String(seq) }),
        (r) => replyOf(op, r)
      )
    }))

  yield* Effect.addFinalizer(() =>
    // Frees the trainer's memory on the server; a server already gone has nothing to free.
    Effect.tryPromise((signal) =>
      fetch(`${base}/close`, {
        method: "POST",
        headers: { ...auth, "x-agentfly-session": session, "x-agentfly-seq": "0" },
        signal: AbortSignal.any([signal, AbortSignal.timeout(5_000)])
      })
    ).pipe(Effect.ignore)
  )

  const numbers = (frame: Wire.Frame, keys: ReadonlyArray<string>, op: string) => {
    const missing = keys.find((k) => typeof frame.header[k] !== "number")
    return missing === undefined
      ? Effect.succeed(frame.header as Record<string, number>)
      : Effect.fail(fail("Remote", `${where} answered ${op} without ${missing}`))
  }

  // The weights change only with an optimiser step or a load: between them a run asks for them several times (the
  // finite check, publishing, the journal's fingerprint), and they come over the wire once.
  let cached: PolicyTrainer.Weights | undefined
  let summarized: Summary | undefined
  const changes = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.ensuring(effect, Effect.sync(() => {
      cached = undefined
      summarized = undefined
    }))

  const outcomesOf = (op: string, urls: ReadonlyArray<string>) => (frame: Wire.Frame) => {
    const list = frame.header["outcomes"]
    const valid = (o: unknown): o is PushOutcome | null =>
      o === null || o === "newer" ||
      (typeof o === "object" && typeof (o as { message?: unknown }).message === "string" &&
        typeof (o as { fatal?: unknown }).fatal === "boolean")
    if (!Array.isArray(list) || list.length !== urls.length || !list.every(valid)) {
      return Effect.fail(fail("Remote", `${where} answered ${op} without an outcome per server`))
    }
    return Effect.succeed(list.map((o: PushOutcome | null) => o ?? undefined))
  }
  const pushHeader = (push: PushRequest, urls: ReadonlyArray<string>) => ({
    version: push.version,
    runId: push.runId,
    ...(push.token === undefined ? {} : { token: push.token }),
    timeoutMs: push.timeoutMs,
    urls
  })
  const copy = (w: PolicyTrainer.Weights): PolicyTrainer.Weights =>
    new Map([...w].map(([k, v]) => [k, Float32Array.from(v)]))

  const save = (dir: string, meta: PolicyTrainer.CheckpointMeta) =>
    Effect.gen(function*() {
      const frame = yield* call("save", Wire.encode({ meta }))
      const files = checkpointFiles.map((f) => [f, frame.arrays.get(f)] as const)
      const missing = files.find(([, bytes]) => !(bytes instanceof Uint8Array))
      if (missing !== undefined) return yield* fail("Remote", `${where} answered save without ${missing[0]}`)
      const io = (e: { message: string }) => fail("Checkpoint", `${dir}: ${e.message}`)
      yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(io))
      // As `Checkpoint.save`: the state file goes last, by rename, so a crash leaves an incomplete checkpoint.
      yield* fs.remove(`${dir}/trainer_state.json`, { force: true }).pipe(Effect.mapError(io))
      for (const [file, bytes] of files) {
        const path = file === "trainer_state.json" ? `${dir}/${file}.tmp` : `${dir}/${file}`
        yield* fs.writeFile(path, bytes as Uint8Array).pipe(Effect.mapError(io))
      }
      yield* fs.rename(`${dir}/trainer_state.json.tmp`, `${dir}/trainer_state.json`).pipe(Effect.mapError(io))
    })

  const load = (dir: string) =>
    Effect.gen(function*() {
      const files: Array<readonly [string, Uint8Array]> = []
      for (const file of checkpointFiles) {
        const path = `${dir}/${file}`
        const exists = yield* fs.exists(path).pipe(Effect.orElseSucceed(() => false))
        if (!exists) return yield* fail("Checkpoint", `${path} is missing`)
        files.push([file, yield* fs.readFile(path).pipe(Effect.mapError((e) => fail("Checkpoint", e.message)))])
      }
      const frame = yield* call("load", Wire.encode({}, files)).pipe(
        Effect.mapError((e) => e.withMessage(e.message.replaceAll(checkpointMarker, dir)))
      )
      const meta = frame.header["meta"] as PolicyTrainer.CheckpointMeta | undefined
      if (typeof meta?.policyVersion !== "number" || !Array.isArray(meta.rngState)) {
        return yield* fail("Remote", `${where} answered load without the checkpoint's meta`)
      }
      return { policyVersion: meta.policyVersion, rngState: meta.rngState }
    })

  return {
    forwardBackward: (batch: Packing.MicroBatch) =>
      Effect.flatMap(call("forward_backward", Wire.encodeBatch(batch)), (frame) => {
        const result = Wire.decodeResult(frame)
        return typeof result === "string" ? Effect.fail(fail("Remote", `${where}: ${result}`)) : Effect.succeed(result)
      }),
    logprobs: (batch: Packing.MicroBatch) =>
      Effect.flatMap(call("logprobs", Wire.encodeBatch(batch)), (frame) => {
        const lp = frame.arrays.get("tokenLogprobs")
        return lp instanceof Float32Array
          ? Effect.succeed(lp)
          : Effect.fail(fail("Remote", `${where} answered logprobs without tokenLogprobs`))
      }),
    optimStep: Effect.flatMap(
      changes(call("optim_step")),
      (frame) => numbers(frame, ["step", "gradNorm", "lr"], "optim_step")
    ).pipe(Effect.map((h) => ({ step: h["step"]!, gradNorm: h["gradNorm"]!, lr: h["lr"]! }))),
    // A discard that cannot reach the trainer leaves nothing to clear here; the next call reports the trainer.
    discard: Effect.ignore(call("discard")),
    weights: Effect.suspend(() =>
      cached !== undefined ? Effect.succeed(copy(cached)) : Effect.flatMap(call("weights"), (frame) => {
        const weights = Wire.decodeWeights(frame, options.parameters)
        if (typeof weights === "string") return Effect.fail(fail("Remote", `${where}: ${weights}`))
        cached = weights
        return Effect.succeed(copy(weights))
      })
    ),
    step: Effect.map(Effect.flatMap(call("step"), (f) => numbers(f, ["step"], "step")), (h) => h["step"]!),
    summary: Effect.suspend(() =>
      summarized !== undefined ? Effect.succeed(summarized) : Effect.flatMap(call("summary"), (frame) => {
        const { fingerprint, nonFinite } = frame.header
        if (typeof fingerprint !== "string" || (nonFinite !== null && typeof nonFinite !== "string")) {
          return Effect.fail(fail("Remote", `${where} answered summary without a fingerprint`))
        }
        summarized = { fingerprint, nonFinite: nonFinite ?? undefined }
        return Effect.succeed(summarized)
      })
    ),
    push: (push, urls) =>
      Effect.flatMap(call("push", Wire.encode(pushHeader(push, urls))), outcomesOf("push", urls)),
    // Not numbered (it changes nothing on the server), so it does not wait behind the learner's calls.
    catchUp: (push, urls) =>
      request("catch_up", Wire.encode(pushHeader(push, urls)), { "x-agentfly-session": session, "x-agentfly-seq": "0" })
        .pipe(Effect.flatMap((r) => replyOf("catch_up", r)), Effect.flatMap(outcomesOf("catch_up", urls))),
    save,
    load: (dir) => changes(load(dir))
  }
})

/**
 * A new trainer name for a session of its own (tests, benches): `prefix-<random>`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const uniqueName = (prefix: string): string => `${prefix}-${randomUUID().slice(0, 8)}`
