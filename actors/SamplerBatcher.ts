/**
 * The batching actor in front of a sampling engine. Many rollout chains call `Sampler.generate` concurrently;
 * the batcher coalesces their requests into engine batches of at most `maxBatchSize`, waiting at most `maxWait`
 * after the first request of a batch for more to arrive, and keeps at most `maxConcurrentBatches` batches in the
 * engine at once.
 *
 * Back-pressure: when the engine is saturated the batcher stops taking requests, its bounded mailbox
 * (`mailboxCapacity`) fills up and further `generate` calls suspend until there is room (`overflow: "suspend"`),
 * or fail at once with a `SamplerError` of reason `Overloaded` (`overflow: "fail"`, for callers that must not
 * block).
 *
 * Supervision: the receive loop restarts under `restart` (a `Schedule`) after a defect, keeping the requests in
 * its mailbox. A defect inside one engine batch fails only that batch's requests. When the batcher's scope
 * closes, queued and in-flight requests fail with a `SamplerError` of reason `Closed`.
 *
 * @since 0.1.0
 */
import { Clock, Context, Deferred, Duration, Effect, Exit, FiberSet, Layer, Option, Queue, Result, Schedule,
  Schema, Semaphore } from "effect"
import type { Scope } from "effect"
import { engineFromSampler, Sampler, SamplerEngine, samplerError } from "../src/Sampler.ts"
import type { GenerateRequest, GenerateResult, SamplerError } from "../src/Sampler.ts"

// ===== Models =====

/**
 * Options of the batching actor.
 *
 * @category models
 * @since 0.1.0
 */
export const Options = Schema.Struct({
  /** Largest batch handed to the engine. */
  maxBatchSize: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)),
  /** How long (ms) a batch waits for more requests after its first one; 0 sends what is there at once. */
  maxWaitMs: Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)),
  /** Batches in the engine at once; the engine counts as saturated when they are all running. */
  maxConcurrentBatches: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)),
  /** Requests that may wait for a batch; beyond this, callers suspend (or fail with `Overloaded`). */
  mailboxCapacity: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)),
  overflow: Schema.Literals(["suspend", "fail"])
})
export type Options = typeof Options.Type

/**
 * Defaults: batches of 32 within 2 ms, one batch in the engine, a mailbox of 4 batches, suspending callers.
 *
 * @category constructors
 * @since 0.1.0
 */
export const defaultOptions: Options = {
  maxBatchSize: 32,
  maxWaitMs: 2,
  maxConcurrentBatches: 1,
  mailboxCapacity: 128,
  overflow: "suspend"
}

/**
 * Counters of a batcher, for metrics and tests.
 *
 * @category models
 * @since 0.1.0
 */
export interface Stats {
  /** Requests currently waiting in the mailbox. */
  readonly queued: number
  /** Batches currently running in the engine. */
  readonly inFlightBatches: number
  readonly batches: number
  readonly requests: number
  /** Size of the largest batch sent so far. */
  readonly largestBatch: number
  /** Callers turned away with `Overloaded` (`overflow: "fail"`). */
  readonly rejected: number
  /** Restarts of the receive loop after a defect. */
  readonly restarts: number
}

/**
 * The batcher's own service: its stats. The batcher also provides `Sampler`.
 *
 * @category services
 * @since 0.1.0
 */
export class SamplerBatcher extends Context.Service<SamplerBatcher, {
  readonly stats: Effect.Effect<Stats>
}>()("agentfly/actors/SamplerBatcher") {}

interface Pending {
  readonly request: GenerateRequest
  readonly deferred: Deferred.Deferred<GenerateResult, SamplerError>
  cancelled: boolean
}

const closed = samplerError("Closed", "the sampler batcher was shut down")

// ===== Constructors =====

/**
 * Starts a batcher over `engine` in the current scope and returns the batching `Sampler` and its stats.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fnUntraced(function*(
  engine: SamplerEngine["Service"],
  options?: Partial<Options> & {
    /** Restart policy of the receive loop after a defect (default: capped exponential, as in effect/cluster). */
    readonly restart?: Schedule.Schedule<unknown, unknown> | undefined
  }
): Effect.fn.Return<
  { readonly sampler: Sampler["Service"]; readonly batcher: SamplerBatcher["Service"] },
  Schema.SchemaError,
  Scope.Scope
> {
  const { restart, ...given } = options ?? {}
  const opts = yield* Schema.decodeUnknownEffect(Options)({ ...defaultOptions, ...given })
  const queue = yield* Queue.bounded<Pending>(opts.mailboxCapacity)
  const permits = yield* Semaphore.make(opts.maxConcurrentBatches)
  const batchFibers = yield* FiberSet.make<void>()
  const counters = { inFlightBatches: 0, batches: 0, requests: 0, largestBatch: 0, rejected: 0, restarts: 0 }

  // Runs in the batch fiber: every request gets an answer, whatever happens to the engine call.
  const runBatch = (batch: ReadonlyArray<Pending>) =>
    engine.generateBatch(batch.map((p) => p.request)).pipe(
      Effect.exit,
      Effect.flatMap((exit) =>
        Effect.sync(() => {
          if (Exit.isFailure(exit)) {
            for (const p of batch) Deferred.doneUnsafe(p.deferred, Exit.failCause(exit.cause))
            return
          }
          const results = exit.value
          for (let i = 0; i < batch.length; i++) {
            const result = results[i]
            Deferred.doneUnsafe(
              batch[i]!.deferred,
              result === undefined
                ? Exit.fail(
                  samplerError(
                    "ServerError",
                    `engine answered ${results.length} results for a batch of ${batch.length}`
                  )
                )
                : Result.isSuccess(result)
                ? Exit.succeed(result.success)
                : Exit.fail(result.failure)
            )
          }
        })
      ),
      Effect.onInterrupt(() => Effect.sync(() => failAll(batch, closed))),
      Effect.ensuring(Effect.sync(() => counters.inFlightBatches--))
    )

  // Waits for a first request, then up to `maxWaitMs` for the batch to fill.
  const collect = Effect.gen(function*() {
    const batch = yield* Queue.takeBetween(queue, 1, opts.maxBatchSize)
    if (opts.maxWaitMs > 0 && batch.length < opts.maxBatchSize) {
      const deadline = (yield* Clock.currentTimeMillis) + opts.maxWaitMs
      while (batch.length < opts.maxBatchSize) {
        const remaining = deadline - (yield* Clock.currentTimeMillis)
        if (remaining <= 0) break
        const more = yield* Queue.takeBetween(queue, 1, opts.maxBatchSize - batch.length).pipe(
          Effect.timeoutOption(Duration.millis(remaining))
        )
        if (Option.isNone(more)) break
        batch.push(...more.value)
      }
    }
    return batch.filter((p) => !p.cancelled)
  })

  const loop = Effect.gen(function*() {
    // A permit is held by each running batch: with all permits out the loop stops taking requests.
    yield* Semaphore.take(permits, 1)
    const batch = yield* collect.pipe(Effect.onError(() => Semaphore.release(permits, 1)))
    if (batch.length === 0) return yield* Semaphore.release(permits, 1)
    counters.batches++
    counters.requests += batch.length
    counters.largestBatch = Math.max(counters.largestBatch, batch.length)
    counters.inFlightBatches++
    yield* FiberSet.run(batchFibers, runBatch(batch).pipe(Effect.ensuring(Semaphore.release(permits, 1))))
  }).pipe(Effect.forever)

  const defectSchedule = restart ?? Schedule.min([Schedule.exponential(500, 1.5), Schedule.spaced("10 seconds")])
  yield* loop.pipe(
    Effect.sandbox,
    Effect.tapError((cause) =>
      Effect.sync(() => counters.restarts++).pipe(Effect.andThen(Effect.logError("SamplerBatcher loop defect", cause)))
    ),
    Effect.retry(defectSchedule),
    Effect.forkScoped
  )
  // Finalizers run in reverse: first fail whatever still waits in the mailbox, then close it.
  yield* Effect.addFinalizer(() => Queue.shutdown(queue))
  yield* Effect.addFinalizer(() =>
    Effect.flatMap(Queue.clear(queue), (rest) => Effect.sync(() => failAll(rest, closed)))
  )

  const enqueue = (pending: Pending): Effect.Effect<void, SamplerError> => {
    if (opts.overflow === "fail") {
      if (Queue.offerUnsafe(queue, pending)) return Effect.void
      counters.rejected++
      return Effect.fail(samplerError("Overloaded", "sampler batcher mailbox is full"))
    }
    return Effect.flatMap(Queue.offer(queue, pending), (accepted) => accepted ? Effect.void : Effect.fail(closed))
  }

  const sampler = Sampler.of({
    generate: (request) =>
      Effect.suspend(() => {
        const pending: Pending = { request, deferred: Deferred.makeUnsafe(), cancelled: false }
        return enqueue(pending).pipe(
          Effect.andThen(Deferred.await(pending.deferred)),
          // A caller that gives up leaves its request to be skipped if it has not been sent yet.
          Effect.onInterrupt(() => Effect.sync(() => (pending.cancelled = true)))
        )
      }),
    policyVersion: engine.policyVersion
  })
  const batcher = SamplerBatcher.of({
    stats: Effect.map(Queue.size(queue), (queued) => ({ queued, ...counters }))
  })
  return { sampler, batcher }
})

const failAll = (batch: ReadonlyArray<Pending>, error: SamplerError) => {
  for (const p of batch) Deferred.doneUnsafe(p.deferred, Exit.fail(error))
}

// ===== Layers =====

/**
 * Provides a batching `Sampler` (and `SamplerBatcher`) over the `SamplerEngine` in context.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (
  options?: Partial<Options> & { readonly restart?: Schedule.Schedule<unknown, unknown> | undefined }
): Layer.Layer<Sampler | SamplerBatcher, Schema.SchemaError, SamplerEngine> =>
  Layer.effectContext(Effect.gen(function*() {
    const { batcher, sampler } = yield* make(yield* SamplerEngine, options)
    return Context.make(Sampler, sampler).pipe(Context.add(SamplerBatcher, batcher))
  }))

/**
 * Puts a batcher in front of the `Sampler` in context (a backend with no batch entry point): requests are still
 * sent one by one, but at most `maxBatchSize × maxConcurrentBatches` at a time, with the batcher's
 * back-pressure.
 *
 * @category layers
 * @since 0.1.0
 */
export const layerOverSampler = (
  options?: Partial<Options> & { readonly restart?: Schedule.Schedule<unknown, unknown> | undefined }
): Layer.Layer<Sampler | SamplerBatcher, Schema.SchemaError, Sampler> =>
  Layer.effectContext(Effect.gen(function*() {
    const { batcher, sampler } = yield* make(engineFromSampler(yield* Sampler), options)
    return Context.make(Sampler, sampler).pipe(Context.add(SamplerBatcher, batcher))
  }))
