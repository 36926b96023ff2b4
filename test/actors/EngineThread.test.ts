import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Random } from "effect"
import * as EngineThread from "../../actors/EngineThread.ts"
import { fromWire, toWire } from "../../actors/internal/engineWorker.ts"
import { MissingWeight, PolicyEngineError, StaleVersion, make } from "../../actors/PolicyEngine.ts"
import { BadRequest, samplerError, SamplerError } from "../../src/Sampler.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import { randomWeights, tinyConfig } from "../utils/tinyModel.ts"

const c = tinyConfig()
const w0 = randomWeights(c, 1)
const w1 = randomWeights(c, 2)

const requests: ReadonlyArray<GenerateRequest> = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [5], [40, 41, 42, 43]].map((
  promptTokenIds,
  i
) => ({ promptTokenIds, sampling: { temperature: 0.9, maxTokens: 24, seed: 100 + i } }))

describe("EngineThread", () => {
  it("an error keeps its reason and the reason's facts through postMessage (a structured clone)", () => {
    const cross = (e: unknown) => fromWire(structuredClone(toWire(e)))
    for (
      const error of [
        samplerError("Overloaded", "busy", { retryAfterMs: 250 }),
        samplerError("ServerError", "HTTP 503", { status: 503, retryAfterMs: 10 }),
        samplerError("BadRequest", "too long", { status: 400 }),
        samplerError("Closed", "engine 3 is closed")
      ]
    ) {
      const back = cross(error)
      assert.instanceOf(back, SamplerError)
      assert.deepStrictEqual((back as SamplerError).reason, error.reason)
      assert.strictEqual(back.message, error.message)
    }
    const stale = new PolicyEngineError({ reason: new StaleVersion({ version: 2, current: 3, message: "2 < 3" }) })
    const engine = cross(stale)
    assert.instanceOf(engine, PolicyEngineError)
    assert.instanceOf((engine as PolicyEngineError).reason, StaleVersion)
    assert.deepStrictEqual((engine as PolicyEngineError).reason, stale.reason)
    assert.strictEqual(engine.message, "2 < 3")
    // Anything else (a defect's value) arrives as a ServerError naming it.
    const defect = cross(new Error("boom"))
    assert.deepStrictEqual([defect._tag, (defect as SamplerError).reason._tag, defect.message], [
      "SamplerError",
      "ServerError",
      "boom"
    ])
  })

  it.effect("an engine on the thread gives the same tokens and logprobs as one on this thread", () =>
    Effect.gen(function*() {
      const here = yield* make({ config: c, weights: w0 })
      const thread = yield* EngineThread.make
      const there = yield* thread.make({ config: c, weights: w0 })
      // One at a time: prompts prefilled together are left-padded, which moves logits in their last bits, and which
      // requests meet in a prefill depends on timing (`LocalPolicy.prefillAlone` is how runs avoid it).
      const a = yield* Effect.forEach(requests, (r) => here.generate(r))
      const b = yield* Effect.forEach(requests, (r) => there.generate(r))
      assert.deepStrictEqual(b, a)
      assert.isAbove(a[0]!.tokenIds.length, 0)
      // Without a seed, both draw it from the caller's Random: the same seed gives the same results.
      const unseeded = { promptTokenIds: [3, 4, 5], sampling: { temperature: 1, maxTokens: 16 } }
      const x = yield* here.generate(unseeded).pipe(Random.withSeed(7))
      const y = yield* there.generate(unseeded).pipe(Random.withSeed(7))
      assert.deepStrictEqual(y, x)
      const stats = yield* there.stats
      assert.strictEqual(stats.generatedTokens, b.reduce((n, r) => n + r.tokenIds.length, 0) + y.tokenIds.length)
    }).pipe(Effect.scoped))

  it.effect("streams every token, in order, before the result; several engines share one thread", () =>
    Effect.gen(function*() {
      const thread = yield* EngineThread.make
      const e0 = yield* thread.make({ config: c, weights: w0 })
      const e1 = yield* thread.make({ config: c, weights: w1, version: 5 })
      const streamed: Array<number> = []
      const r0 = yield* e0.generate(requests[1]!, { onToken: (t) => void streamed.push(t) })
      assert.deepStrictEqual(streamed, r0.tokenIds)
      const r1 = yield* e1.generate(requests[1]!)
      assert.strictEqual(r1.policyVersion, 5)
      assert.notDeepEqual(r1.tokenIds, r0.tokenIds)
      // Weights follow: e0 on w1 now samples what e1 samples.
      yield* e0.updateWeights(6, w1)
      assert.strictEqual(yield* e0.policyVersion, 6)
      const r2 = yield* e0.generate(requests[1]!)
      assert.deepStrictEqual(r2.tokenIds, r1.tokenIds)
      assert.strictEqual(r2.policyVersion, 6)
    }).pipe(Effect.scoped))

  it.effect("typed errors cross the thread: a bad request, a stale version, a closed engine", () =>
    Effect.gen(function*() {
      const thread = yield* EngineThread.make
      const engine = yield* thread.make({ config: c, weights: w0, version: 3 })
      const bad = yield* engine.generate({
        promptTokenIds: [c.vocabSize + 5],
        sampling: { temperature: 1, maxTokens: 4 }
      })
        .pipe(Effect.flip)
      assert.strictEqual(bad._tag, "SamplerError")
      assert.strictEqual(bad.reason._tag, "BadRequest")
      assert.instanceOf(bad.reason, BadRequest)
      assert.include(bad.message, "outside the vocabulary")
      const stale = yield* engine.updateWeights(2, w1).pipe(Effect.flip)
      assert.instanceOf(stale, PolicyEngineError)
      assert.instanceOf(stale.reason, StaleVersion)
      assert.strictEqual(stale.message, "version 2 is not newer than the current version 3")
      const missing = yield* thread.make({ config: c, weights: new Map() }).pipe(Effect.flip)
      assert.instanceOf(missing.reason, MissingWeight)
      assert.strictEqual(missing.message, `missing ${(missing.reason as MissingWeight).weight}`)
    }).pipe(Effect.scoped))

  it.live(
    "an interrupted request stops on the thread; a dead thread fails its requests, and the next engine gets a new one",
    () =>
      Effect.gen(function*() {
        const thread = yield* EngineThread.make
        const engine = yield* thread.make({ config: c, weights: w0 })
        const long = { promptTokenIds: [1, 2], sampling: { temperature: 1, maxTokens: 10_000, seed: 1 } }
        const fiber = yield* engine.generate(long).pipe(Effect.forkChild)
        yield* Effect.sleep("50 millis")
        yield* Fiber.interrupt(fiber)
        const after = yield* engine.generate(requests[0]!)
        assert.isAbove(after.tokenIds.length, 0) // the thread went on serving
        const stats = yield* engine.stats
        assert.isBelow(stats.generatedTokens, 2_000) // the interrupted request stopped decoding
        // The thread fails under a running request.
        const running = yield* engine.generate(long).pipe(Effect.forkChild)
        yield* Effect.sleep("50 millis")
        yield* thread.crash
        const exit = yield* Fiber.await(running)
        assert.isTrue(Exit.isFailure(exit))
        const failure = yield* engine.generate(requests[0]!).pipe(Effect.flip)
        assert.strictEqual(failure.reason._tag, "Closed")
        // Engines made at the same moment share the one thread: its failure fails both.
        const [a, b] = yield* Effect.all([
          thread.make({ config: c, weights: w0 }),
          thread.make({ config: c, weights: w1 })
        ], {
          concurrency: 2
        })
        yield* thread.crash
        assert.strictEqual((yield* a.generate(requests[0]!).pipe(Effect.flip)).reason._tag, "Closed")
        assert.strictEqual((yield* b.generate(requests[0]!).pipe(Effect.flip)).reason._tag, "Closed")
        const fresh = yield* thread.make({ config: c, weights: w0 })
        const again = yield* fresh.generate(requests[0]!)
        assert.deepStrictEqual(again, after)
      }).pipe(Effect.scoped),
    60_000
  )
})
