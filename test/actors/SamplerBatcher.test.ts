import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Layer, Result, Schedule, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as SamplerBatcher from "../../actors/SamplerBatcher.ts"
import * as Sampler from "../../src/Sampler.ts"

const request = (id: number): Sampler.GenerateRequest => ({
  promptTokenIds: [id],
  sampling: { temperature: 1, maxTokens: 8 }
})

/** An engine that records its batches and answers `[id, id + 1]` for prompt `[id]`, optionally after a latch. */
const recordingEngine = (latch?: Deferred.Deferred<void>) => {
  const batches: Array<ReadonlyArray<number>> = []
  let running = 0
  let peakRunning = 0
  const engine = Sampler.SamplerEngine.of({
    generateBatch: (requests) =>
      Effect.gen(function*() {
        batches.push(requests.map((r) => r.promptTokenIds[0]!))
        running++
        peakRunning = Math.max(peakRunning, running)
        if (latch !== undefined) yield* Deferred.await(latch)
        running--
        return requests.map((r) => {
          const id = r.promptTokenIds[0]!
          return id < 0
            ? Result.fail(Sampler.samplerError("BadRequest", `bad ${id}`))
            : Result.succeed({
              tokenIds: [id, id + 1],
              logprobs: [-0.1, -0.2],
              finishReason: "stop" as const,
              policyVersion: 2
            })
        })
      }),
    policyVersion: Effect.succeed(2)
  })
  return { engine, batches, peak: () => peakRunning }
}

describe("SamplerBatcher", () => {
  it.effect("coalesces concurrent calls into batches and routes each answer to its caller", () =>
    Effect.gen(function*() {
      const latch = yield* Deferred.make<void>()
      const { batches, engine } = recordingEngine(latch)
      const { sampler } = yield* SamplerBatcher.make(engine, { maxBatchSize: 4, maxWaitMs: 0 })
      const fiber = yield* Effect.forEach([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], (id) => sampler.generate(request(id)), {
        concurrency: "unbounded"
      }).pipe(Effect.forkChild)
      yield* Effect.yieldNow
      yield* Deferred.succeed(latch, undefined)
      const results = yield* Fiber.join(fiber)
      assert.deepStrictEqual(results.map((r) => r.tokenIds), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9].map((id) => [id, id + 1]))
      assert.isTrue(results.every((r) => r.policyVersion === 2))
      assert.isTrue(batches.every((b) => b.length <= 4))
      assert.strictEqual(batches.flat().length, 10)
      // The first batch went out with the first request; the rest queued behind the running batch and filled up.
      assert.isTrue(batches.length <= 4, `batches: ${JSON.stringify(batches)}`)
    }))

  it.effect("waits up to maxWait for a batch to fill", () =>
    Effect.gen(function*() {
      const { batches, engine } = recordingEngine()
      const { sampler } = yield* SamplerBatcher.make(engine, { maxBatchSize: 3, maxWaitMs: 100 })
      const first = yield* sampler.generate(request(1)).pipe(Effect.forkChild)
      yield* TestClock.adjust(50)
      assert.strictEqual(batches.length, 0)
      const second = yield* sampler.generate(request(2)).pipe(Effect.forkChild)
      yield* TestClock.adjust(49)
      assert.strictEqual(batches.length, 0)
      yield* TestClock.adjust(1)
      yield* Fiber.join(first)
      yield* Fiber.join(second)
      assert.deepStrictEqual(batches, [[1, 2]])
      // A full batch does not wait.
      const full = yield* Effect.forEach([3, 4, 5], (id) => sampler.generate(request(id)), {
        concurrency: "unbounded"
      }).pipe(Effect.forkChild)
      yield* Fiber.join(full)
      assert.deepStrictEqual(batches[1], [3, 4, 5])
    }))

  it.effect("back-pressure: a saturated engine bounds the mailbox and suspends further callers", () =>
    Effect.gen(function*() {
      const latch = yield* Deferred.make<void>()
      const { batches, engine, peak } = recordingEngine(latch)
      const { batcher, sampler } = yield* SamplerBatcher.make(engine, {
        maxBatchSize: 2,
        maxWaitMs: 0,
        maxConcurrentBatches: 1,
        mailboxCapacity: 3
      })
      let answered = 0
      const fiber = yield* Effect.forEach(
        Array.from({ length: 20 }, (_, i) => i),
        (id) => sampler.generate(request(id)).pipe(Effect.tap(() => Effect.sync(() => answered++))),
        { concurrency: "unbounded" }
      ).pipe(Effect.forkChild)
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
      const stats = yield* batcher.stats
      assert.strictEqual(batches.length, 1, "one batch in the engine")
      assert.strictEqual(stats.inFlightBatches, 1)
      assert.strictEqual(stats.queued, 3, "mailbox full; the other 15 callers are suspended")
      assert.strictEqual(answered, 0)
      yield* Deferred.succeed(latch, undefined)
      const results = yield* Fiber.join(fiber)
      assert.strictEqual(results.length, 20)
      assert.strictEqual(peak(), 1, "never more than maxConcurrentBatches in the engine")
      assert.isTrue(batches.every((b) => b.length <= 2))
    }))

  it.effect("overflow: fail turns callers away with a typed Overloaded error", () =>
    Effect.gen(function*() {
      const latch = yield* Deferred.make<void>()
      const { engine } = recordingEngine(latch)
      const { batcher, sampler } = yield* SamplerBatcher.make(engine, {
        maxBatchSize: 1,
        maxWaitMs: 0,
        mailboxCapacity: 2,
        overflow: "fail"
      })
      const fiber = yield* Effect.forEach(
        [0, 1, 2, 3, 4, 5],
        (id) => Effect.result(sampler.generate(request(id))),
        { concurrency: "unbounded" }
      ).pipe(Effect.forkChild)
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
      yield* Deferred.succeed(latch, undefined)
      const results = yield* Fiber.join(fiber)
      const overloaded = results.filter((r) => Result.isFailure(r) && r.failure.reason._tag === "Overloaded")
      assert.isAbove(overloaded.length, 0)
      assert.strictEqual(results.filter(Result.isSuccess).length + overloaded.length, 6)
      assert.strictEqual((yield* batcher.stats).rejected, overloaded.length)
    }))

  it.effect("a failed request fails alone; an engine defect fails only its batch", () =>
    Effect.gen(function*() {
      const { engine } = recordingEngine()
      let calls = 0
      const flaky = Sampler.SamplerEngine.of({
        generateBatch: (requests) => calls++ === 1 ? Effect.die("engine bug") : engine.generateBatch(requests),
        policyVersion: engine.policyVersion
      })
      const { sampler } = yield* SamplerBatcher.make(flaky, { maxBatchSize: 2, maxWaitMs: 0 })
      const first = yield* Effect.forEach([1, -1], (id) => Effect.result(sampler.generate(request(id))), {
        concurrency: "unbounded"
      })
      assert.isTrue(Result.isSuccess(first[0]!))
      assert.isTrue(Result.isFailure(first[1]!) && first[1].failure.reason._tag === "BadRequest")
      const died = yield* Effect.exit(sampler.generate(request(5)))
      assert.isTrue(Exit.hasDies(died))
      const after = yield* sampler.generate(request(6))
      assert.deepStrictEqual(after.tokenIds, [6, 7])
    }))

  it.effect("closing the batcher fails queued and in-flight requests with Closed", () =>
    Effect.gen(function*() {
      const latch = yield* Deferred.make<void>()
      const { engine } = recordingEngine(latch)
      const scope = yield* Scope.make()
      const { sampler } = yield* SamplerBatcher.make(engine, {
        maxBatchSize: 1,
        maxWaitMs: 0,
        restart: Schedule.recurs(0)
      }).pipe(Scope.provide(scope))
      const fiber = yield* Effect.forEach([1, 2, 3], (id) => Effect.result(sampler.generate(request(id))), {
        concurrency: "unbounded"
      }).pipe(Effect.forkChild)
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
      yield* Scope.close(scope, Exit.void)
      const results = yield* Fiber.join(fiber)
      assert.deepStrictEqual(
        results.map((r) => Result.isFailure(r) ? r.failure.reason._tag : "ok"),
        ["Closed", "Closed", "Closed"]
      )
      const late = yield* Effect.flip(sampler.generate(request(4)))
      assert.strictEqual(late.reason._tag, "Closed")
    }))

  it.effect("a caller that gives up before its batch is sent is skipped", () =>
    Effect.gen(function*() {
      const latch = yield* Deferred.make<void>()
      const { batches, engine } = recordingEngine(latch)
      const { sampler } = yield* SamplerBatcher.make(engine, { maxBatchSize: 1, maxWaitMs: 0 })
      const busy = yield* sampler.generate(request(1)).pipe(Effect.forkChild)
      const quitter = yield* sampler.generate(request(2)).pipe(Effect.forkChild)
      const stayer = yield* sampler.generate(request(3)).pipe(Effect.forkChild)
      for (let i = 0; i < 3; i++) yield* Effect.yieldNow
      yield* Fiber.interrupt(quitter)
      yield* Deferred.succeed(latch, undefined)
      yield* Fiber.join(busy)
      yield* Fiber.join(stayer)
      assert.deepStrictEqual(batches, [[1], [3]])
    }))

  it.effect("rejects invalid options with a typed SchemaError", () =>
    Effect.gen(function*() {
      const { engine } = recordingEngine()
      const error = yield* Effect.flip(SamplerBatcher.make(engine, { maxBatchSize: 0 }))
      assert.strictEqual(error._tag, "SchemaError")
    }))

  it.effect("layerOverSampler batches in front of any Sampler", () =>
    Effect.gen(function*() {
      const sampler = yield* Sampler.Sampler
      const batcher = yield* SamplerBatcher.SamplerBatcher
      const results = yield* Effect.forEach([1, 2, 3], (id) => sampler.generate(request(id)), {
        concurrency: "unbounded"
      })
      assert.deepStrictEqual(results.map((r) => r.tokenIds), [[1], [2], [3]])
      const stats = yield* batcher.stats
      assert.strictEqual(stats.requests, 3)
    }).pipe(
      Effect.provide(
        SamplerBatcher.layerOverSampler({ maxBatchSize: 8, maxWaitMs: 0 }).pipe(
          Layer.provide(Sampler.layerScripted((request) => [request.promptTokenIds[0]!]))
        )
      )
    ))
})
