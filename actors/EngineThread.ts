/**
 * Policy engines on a thread of their own. onnxruntime-node's `session.run` executes synchronously on the thread
 * that calls it, so an engine on the main thread decodes in turns with everything else there: the chains, their
 * tools and rewards, and the learner's coordination of its worker threads. On this thread the engine decodes while
 * the main thread works, and an async run's learner trains on the other core instead of waiting for the main
 * thread between its messages.
 *
 * `make` returns the same `PolicyEngine` service as `PolicyEngine.make`, with the same results: a request's seed is
 * drawn on the calling side (from its `Random`) when it has none, and an engine's results never depend on batching.
 * One thread hosts every engine made through it; it starts on the first `make` and again on the next one after it
 * died, and ends with the scope. A thread that dies fails every request waiting on it with a `SamplerError` of
 * reason `Closed`, naming the exit. Errors cross the thread with their reasons (`engineWorker.toWire`).
 *
 * @since 0.1.0
 */
import { Effect, Random, Scope, Semaphore } from "effect"
import { Worker } from "node:worker_threads"
import { samplerError } from "../src/Sampler.ts"
import type { GenerateRequest, GenerateResult, SamplerError } from "../src/Sampler.ts"
import * as PolicyEngine from "./PolicyEngine.ts"
import { fromWire } from "./internal/engineWorker.ts"
import type * as EngineWorker from "./internal/engineWorker.ts"

const workerUrl = new URL("./internal/engineWorker.mjs", import.meta.url)

/**
 * @category models
 * @since 0.1.0
 */
export interface EngineThread {
  /** A policy engine on the thread, closed with the current scope. */
  readonly make: (
    options: PolicyEngine.Options
  ) => Effect.Effect<PolicyEngine.PolicyEngine["Service"], PolicyEngine.PolicyEngineError, Scope.Scope>
  /** Makes the thread fail as a bug in it would (for tests of the failure path). */
  readonly crash: Effect.Effect<void>
}

interface Thread {
  readonly worker: Worker
  dead: string | undefined
}

type Answer = Effect.Effect<unknown, SamplerError | PolicyEngine.PolicyEngineError>

interface Waiting {
  readonly resume: (answer: Answer) => void
  readonly onToken: ((tokenId: number, logprob: number) => void) | undefined
}

const sessionFailed = (message: string) =>
  new PolicyEngine.PolicyEngineError({ reason: new PolicyEngine.SessionFailed({ message }) })

/**
 * Building an engine or swapping its weights failed: a sampler-side failure (the thread died) counts as a
 * session's.
 */
const engineErrorOf = (e: SamplerError | PolicyEngine.PolicyEngineError) =>
  e._tag === "PolicyEngineError" ? e : sessionFailed(e.message)

/** Starts a thread and waits until it is ready to take requests. */
const start = Effect.callback<Worker, PolicyEngine.PolicyEngineError>((resume) => {
  const worker = new Worker(workerUrl, { workerData: { engineThread: true } satisfies EngineWorker.Init })
  const off = () => {
    worker.off("message", onReady)
    worker.off("error", onError)
    worker.off("exit", onExit)
  }
  const failed = (message: string) => {
    off()
    resume(Effect.fail(sessionFailed(message)))
  }
  const onReady = () => {
    off()
    resume(Effect.succeed(worker))
  }
  const onError = (e: Error) => failed(`the engine thread failed to start: ${e.message}`)
  const onExit = (code: number) => failed(`the engine thread exited with code ${code} while starting`)
  worker.once("message", onReady)
  worker.once("error", onError)
  worker.once("exit", onExit)
  return Effect.promise(() => worker.terminate())
})

/** What the thread's caller side holds: the thread now and every request waiting on it, by id. */
interface State {
  /** The thread now; `dead` says why it ended. */
  thread: Thread | undefined
  readonly waiting: Map<number, Waiting>
  readonly opening: Map<number, (answer: Effect.Effect<void, PolicyEngine.PolicyEngineError>) => void>
  readonly closing: Map<number, () => void>
  nextId: number
  nextEngine: number
  /** One start at a time: engines made together (an async run's next batch beside this one) share the thread. */
  readonly starting: Semaphore.Semaphore
}

/** Routes a reply of the thread to whom waits for it. */
const onMessage = (state: State, reply: EngineWorker.Reply) => {
  switch (reply.op) {
    case "tokens": {
      const data = reply.data
      for (let i = 0; i < data.length; i += 3) state.waiting.get(data[i]!)?.onToken?.(data[i + 1]!, data[i + 2]!)
      return
    }
    case "done":
    case "failed": {
      const w = state.waiting.get(reply.id)
      if (w === undefined) return // an interrupted request
      state.waiting.delete(reply.id)
      return w.resume(reply.op === "done" ? Effect.succeed(reply.result) : Effect.fail(fromWire(reply.error)))
    }
    case "opened": {
      const resume = state.opening.get(reply.engine)
      state.opening.delete(reply.engine)
      return resume?.(reply.error === undefined ? Effect.void : Effect.fail(engineErrorOf(fromWire(reply.error))))
    }
    case "closed": {
      const resume = state.closing.get(reply.engine)
      state.closing.delete(reply.engine)
      return resume?.()
    }
  }
}

/** The thread died: everything waiting on it fails, and the next `make` starts another. */
const onDeath = (state: State, message: string) => {
  const { thread, waiting, opening, closing } = state
  if (thread === undefined || thread.dead !== undefined) return
  thread.dead = message
  const closed = samplerError("Closed", message)
  for (const w of waiting.values()) w.resume(Effect.fail(closed))
  waiting.clear()
  const failure = sessionFailed(message)
  for (const resume of opening.values()) resume(Effect.fail(failure))
  opening.clear()
  for (const resume of closing.values()) resume()
  closing.clear()
}

/** The live thread, started if there is none (or it died). */
const live = (state: State) =>
  Semaphore.withPermits(state.starting, 1)(Effect.gen(function*() {
    if (state.thread !== undefined && state.thread.dead === undefined) return state.thread
    const worker = yield* start
    const current: Thread = { worker, dead: undefined }
    state.thread = current
    worker.on("message", (reply: EngineWorker.Reply) => onMessage(state, reply))
    const died = (message: string) => state.thread === current && onDeath(state, message)
    worker.on("error", (e) => died(`the engine thread crashed: ${e.message}`))
    worker.on("exit", (code) => died(`the engine thread exited with code ${code}`))
    return current
  }))

/** Asks the live thread to end (`exit`) or to fail (`crash`), and waits until it has. */
const endThread = (state: State, op: "exit" | "crash") =>
  Effect.suspend(() => {
    const t = state.thread
    if (t === undefined || t.dead !== undefined) return Effect.void
    return Effect.callback<void>((resume) => {
      t.worker.once("exit", () => resume(Effect.void))
      t.worker.postMessage({ op } satisfies EngineWorker.Request)
    }).pipe(
      // The thread closes its engines and exits by itself. Never `terminate`: terminating it while onnxruntime
      // runs a session aborts the whole process (onnxruntime-node throws a C++ exception it cannot deliver). One
      // still busy after 10 s is unreferenced (it no longer keeps the process alive) and ends when its run does.
      Effect.timeoutOrElse({ duration: "10 seconds", orElse: () => Effect.sync(() => t.worker.unref()) })
    )
  })

/** Posts a request and waits for its answer; leaving early interrupts it on the thread. */
const call = <A>(
  state: State,
  on: Thread,
  request: (id: number) => EngineWorker.Request,
  onToken?: (tokenId: number, logprob: number) => void
) =>
  Effect.callback<A, SamplerError | PolicyEngine.PolicyEngineError>((resume) => {
    if (on.dead !== undefined) return resume(Effect.fail(samplerError("Closed", on.dead)))
    const id = state.nextId++
    state.waiting.set(id, { resume: resume as (answer: Answer) => void, onToken })
    on.worker.postMessage(request(id))
    return Effect.sync(() => {
      if (state.waiting.delete(id)) on.worker.postMessage({ op: "interrupt", id } satisfies EngineWorker.Request)
    })
  })

/** Opens engine number `engine` on the thread `on`, and closes it with the current scope. */
const openEngine = (state: State, on: Thread, engine: number, options: PolicyEngine.Options) =>
  Effect.gen(function*() {
    const { worker } = on
    yield* Effect.callback<void, PolicyEngine.PolicyEngineError>((resume) => {
      state.opening.set(engine, resume)
      worker.postMessage({ op: "open", engine, options } satisfies EngineWorker.Request)
    })
    yield* Effect.addFinalizer(() =>
      Effect.callback<void>((resume) => {
        if (on.dead !== undefined) return resume(Effect.void)
        state.closing.set(engine, () => resume(Effect.void))
        worker.postMessage({ op: "close", engine } satisfies EngineWorker.Request)
      })
    )
  })

/** A policy engine on the thread, closed with the current scope. */
const makeEngine = (state: State, options: PolicyEngine.Options) =>
  Effect.gen(function*() {
    const on = yield* live(state)
    const engine = state.nextEngine++
    yield* openEngine(state, on, engine, options)
    let version = options.version ?? 0
    const generate = (request: GenerateRequest, generateOptions?: PolicyEngine.GenerateOptions) =>
      Effect.gen(function*() {
        // The seed is drawn here, from the caller's `Random`, as the engine would draw it on this thread.
        const seeded = request.sampling.seed !== undefined
          ? request
          : { ...request, sampling: { ...request.sampling, seed: yield* Random.nextInt } }
        const onToken = generateOptions?.onToken, images = generateOptions?.images
        return yield* call<GenerateResult>(
          state,
          on,
          (id) => ({
            op: "generate",
            engine,
            id,
            request: seeded,
            stream: onToken !== undefined,
            ...(images === undefined ? {} : { images })
          }),
          onToken
        )
      }) as Effect.Effect<GenerateResult, SamplerError>
    return PolicyEngine.PolicyEngine.of({
      config: options.config,
      generate,
      updateWeights: (v, weights) =>
        call<null>(state, on, (id) => ({
          op: "update",
          engine,
          id,
          version: v,
          weights: weights as Map<string, Float32Array>
        })).pipe(
          Effect.mapError(engineErrorOf),
          Effect.tap(() => Effect.sync(() => void (version = v)))
        ) as Effect.Effect<void, PolicyEngine.PolicyEngineError>,
      policyVersion: Effect.sync(() => version),
      stats: call<PolicyEngine.Stats>(state, on, (id) => ({ op: "stats", engine, id })).pipe(
        Effect.orDie
      )
    })
  })

/**
 * The engine thread, ended with the current scope.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make: Effect.Effect<EngineThread, never, Scope.Scope> = Effect.gen(function*() {
  const state: State = {
    thread: undefined,
    waiting: new Map(),
    opening: new Map(),
    closing: new Map(),
    nextId: 1,
    nextEngine: 1,
    starting: yield* Semaphore.make(1)
  }
  yield* Effect.addFinalizer(() => endThread(state, "exit"))
  return {
    make: (options) => makeEngine(state, options),
    crash: endThread(state, "crash")
  } satisfies EngineThread
})
