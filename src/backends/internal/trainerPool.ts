/**
 * The main-thread end of the data-parallel trainer's worker threads (`trainerWorker.ts`): starting them, one
 * request/reply per message, and shutting them down. A worker that crashes or exits fails every request waiting on
 * it with a `GradientBackendError` ("Run") and marks the pool broken; the trainer then discards the pool.
 */
import { Effect, Result } from "effect"
import type { Duration } from "effect"
import { Worker } from "node:worker_threads"
import * as GradientBackend from "../../GradientBackend.ts"
import type * as TrainerWorker from "./trainerWorker.ts"

const workerUrl = new URL("./trainerWorker.mjs", import.meta.url)

const fail = <Tag extends GradientBackend.GradientBackendErrorReason["_tag"]>(
  reason: Tag,
  message: string,
  facts?: GradientBackend.GradientBackendErrorFacts<Tag>
) => GradientBackend.gradientBackendError(reason, message, facts)

/** A request without its id (the pool numbers them). */
export type Request = TrainerWorker.Request

type Reply = Effect.Effect<TrainerWorker.Output, GradientBackend.GradientBackendError>

export interface Pool {
  readonly size: number
  /**
   * Sends one request to worker `index` and waits for its reply. Interrupted, it still waits for the reply before
   * it ends (the thread cannot be stopped inside onnxruntime).
   */
  readonly request: (index: number, request: Request) => Reply
  /** Requests sent and not answered yet, interrupted ones included. */
  readonly inFlight: () => number
  /** Why the pool cannot be used any more (a worker crashed or exited), or undefined. */
  readonly broken: () => string | undefined
  /** Makes one thread fail as a bug in it would (for tests of the failure path); returns once it has exited. */
  readonly kill: (index: number) => Effect.Effect<void>
  /** Asks every thread to release its sessions and end; waits up to `wait` for them (see `start`). */
  readonly close: (wait: Duration.Input) => Effect.Effect<void>
}

interface Waiting {
  readonly index: number
  readonly resume: (effect: Reply) => void
}

const spawn = (init: TrainerWorker.Init) =>
  Effect.try({
    try: () => new Worker(workerUrl, { workerData: init }),
    catch: (u) => fail("Session", `worker ${init.index} could not start: ${u instanceof Error ? u.message : u}`)
  }).pipe(Effect.flatMap((worker) =>
    Effect.callback<Worker, GradientBackend.GradientBackendError>((resume) => {
      const off = () => {
        worker.off("message", onReady)
        worker.off("error", onError)
        worker.off("exit", onExit)
      }
      const onReady = () => {
        off()
        resume(Effect.succeed(worker))
      }
      const onError = (e: Error) => {
        off()
        resume(Effect.fail(fail("Session", `worker ${init.index} failed to start: ${e.message}`)))
      }
      const onExit = (code: number) => {
        off()
        resume(Effect.fail(fail("Session", `worker ${init.index} exited with code ${code} while starting`)))
      }
      worker.once("message", onReady)
      worker.once("error", onError)
      worker.once("exit", onExit)
      return Effect.promise(() => worker.terminate())
    })
  ))

/** The pool's state, shared by the workers' listeners and the pool's operations. */
interface State {
  readonly workers: ReadonlyArray<Worker>
  readonly onExit: () => void
  readonly waiting: Map<number, Waiting>
  // Requests posted and not answered, by id (with their thread): whether their callers still wait or not.
  readonly unanswered: Map<number, number>
  readonly exited: Array<boolean>
  nextId: number
  broken: string | undefined
  closing: boolean
}

const failWaiting = (state: State, index: number, message: string) => {
  if (!state.closing) state.broken ??= message
  for (const [id, w] of state.waiting) {
    if (w.index !== index) continue
    state.waiting.delete(id)
    w.resume(Effect.fail(fail("Run", message)))
  }
}

const listen = (state: State, worker: Worker, index: number) => {
  worker.on("message", (reply: TrainerWorker.Reply) => {
    state.unanswered.delete(reply.id)
    const w = state.waiting.get(reply.id)
    if (w === undefined) return // already failed (the thread crashed or exited)
    state.waiting.delete(reply.id)
    w.resume(
      reply.ok ? Effect.succeed(reply.output) : Effect.fail(fail(reply.reason, `worker ${index}: ${reply.message}`))
    )
  })
  worker.on("error", (e) => failWaiting(state, index, `worker ${index} crashed: ${e.message}`))
  worker.on("exit", (code) => {
    state.exited[index] = true
    for (const [id, i] of state.unanswered) if (i === index) state.unanswered.delete(id)
    state.onExit()
    failWaiting(state, index, `worker ${index} exited with code ${code}`)
  })
}

const request = (state: State, index: number, req: Request) =>
  Effect.callback<TrainerWorker.Output, GradientBackend.GradientBackendError>((resume) => {
    if (state.broken !== undefined || state.exited[index]) {
      return resume(Effect.fail(fail("Run", state.broken ?? `worker ${index} has exited`)))
    }
    const id = state.nextId++
    state.waiting.set(id, { index, resume })
    state.unanswered.set(id, index)
    state.workers[index]!.postMessage({ ...req, id })
    // An interrupted caller still waits for the reply (or the thread's end): the thread may be inside
    // onnxruntime, which cannot stop there, and a process that exits meanwhile aborts with a `Napi::Error` (as a
    // SIGTERM during a warm-up did: a closing pool waits 5 s for its threads, a big model's shard takes longer).
    return Effect.callback<void>((done) => {
      if (state.waiting.has(id)) state.waiting.set(id, { index, resume: () => done(Effect.void) })
      else done(Effect.void)
    })
  })

// A thread is never terminated: terminating one while onnxruntime runs a session aborts the whole process
// (onnxruntime-node throws a C++ exception it cannot deliver), and a big model's step can outlast any wait. It is
// asked to end (`close`: after releasing its sessions, once its queue reaches the request) or to fail (`crash`:
// at once, as a bug in it would), and ends by itself.
const end = (state: State, index: number, op: "close" | "crash") =>
  state.exited[index] ? Effect.void : Effect.callback<void>((resume) => {
    state.workers[index]!.once("exit", () => resume(Effect.void))
    state.workers[index]!.postMessage({ op, id: 0 })
  })

// A thread still busy after `wait` is unreferenced (it no longer keeps the process alive) and ends when its
// step does.
const close = (state: State, wait: Duration.Input) =>
  Effect.suspend(() => {
    state.closing = true
    return Effect.forEach(state.workers, (worker, index) =>
      end(state, index, "close").pipe(
        Effect.timeoutOrElse({ duration: wait, orElse: () => Effect.sync(() => worker.unref()) })
      ), { concurrency: "unbounded", discard: true })
  })

/**
 * Starts `inits.length` workers (in parallel); if one fails to start, the others are terminated. `onExit` runs
 * when a thread of the pool ends, for whatever reason.
 */
export const start = (
  inits: ReadonlyArray<TrainerWorker.Init>,
  onExit: () => void = () => {}
): Effect.Effect<Pool, GradientBackend.GradientBackendError> =>
  Effect.gen(function*() {
    const started = yield* Effect.forEach(inits, (init) => Effect.result(spawn(init)), { concurrency: "unbounded" })
    const workers = started.filter(Result.isSuccess).map((r) => r.success)
    const failed = started.find(Result.isFailure)
    if (failed !== undefined) {
      yield* Effect.forEach(workers, (w) => Effect.promise(() => w.terminate()), { discard: true })
      return yield* failed.failure
    }
    const state: State = {
      workers,
      onExit,
      waiting: new Map(),
      unanswered: new Map(),
      exited: workers.map(() => false),
      nextId: 1,
      broken: undefined,
      closing: false
    }
    workers.forEach((worker, index) => listen(state, worker, index))
    return {
      size: workers.length,
      request: (index, req) => request(state, index, req),
      inFlight: () => state.unanswered.size,
      broken: () => state.broken,
      kill: (index) => end(state, index, "crash"),
      close: (wait) => close(state, wait)
    } satisfies Pool
  })
