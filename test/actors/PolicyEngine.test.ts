import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { PolicyEngine, PolicyEngineError, StaleVersion, layerSampler, make } from "../../actors/PolicyEngine.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import { Sampler, SamplerError } from "../../src/Sampler.ts"
import type { GenerateRequest, GenerateResult } from "../../src/Sampler.ts"
import * as Sampling from "../../src/Sampling.ts"
import { makeReference, randomWeights, tinyConfig } from "../utils/tinyModel.ts"

const c = tinyConfig()
const w0 = randomWeights(c, 1)
const w1 = randomWeights(c, 2)

const prompts = [
  [1, 2, 3],
  [7, 8, 9, 10, 11, 12, 13, 14],
  [5],
  [40, 41, 42, 43, 44],
  [20, 3, 20, 3, 20, 3, 20, 3, 20, 3, 20]
]

const request = (
  promptTokenIds: ReadonlyArray<number>,
  sampling: Partial<GenerateRequest["sampling"]> = {}
): GenerateRequest => ({
  promptTokenIds,
  sampling: { temperature: 0.9, maxTokens: 24, ...sampling }
})

const generateAll = (
  engine: PolicyEngine["Service"],
  requests: ReadonlyArray<GenerateRequest>
) => Effect.forEach(requests, (r) => engine.generate(r), { concurrency: "unbounded" })

const maxAbsDiff = (a: ReadonlyArray<number>, b: ReadonlyArray<number>) =>
  a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i]!)), 0)

describe("PolicyEngine", () => {
  it.effect("greedy KV-cache decoding of a batch equals full recomputation, token for token", () =>
    Effect.gen(function*() {
      const engine = yield* make({ config: c, weights: w0 })
      const reference = yield* makeReference(c)
      const results = yield* generateAll(engine, prompts.map((p) => request(p, { temperature: 0, maxTokens: 20 })))
      for (const [i, prompt] of prompts.entries()) {
        const seq = [...prompt]
        const lps: Array<number> = []
        for (let step = 0; step < 20; step++) {
          const logits = yield* reference(w0, seq)
          const row = logits.subarray((seq.length - 1) * c.vocabSize, seq.length * c.vocabSize)
          const next = Sampling.argmax(row)
          lps.push(Sampling.logSoftmax(row)[next]!)
          seq.push(next)
        }
        assert.deepStrictEqual(results[i]!.tokenIds, seq.slice(prompt.length), `prompt ${i}`)
        assert.isBelow(maxAbsDiff(results[i]!.logprobs, lps), 1e-4)
        assert.strictEqual(results[i]!.finishReason, "length")
        assert.strictEqual(results[i]!.policyVersion, 0)
      }
      const stats = yield* engine.stats
      assert.strictEqual(stats.largestBatch, prompts.length) // all five decoded together
    }))

  it.effect("sampled logprobs equal log-softmax(logits / T) of a reference forward pass to 1e-4", () =>
    Effect.gen(function*() {
      const engine = yield* make({ config: c, weights: w0 })
      const reference = yield* makeReference(c)
      for (const [t, topK, topP] of [[0.7, undefined, undefined], [1.3, 5, undefined], [1, undefined, 0.8]] as const) {
        const prompt = [3, 1, 4, 1, 5, 9, 2, 6]
        const r = yield* engine.generate(request(prompt, {
          temperature: t,
          seed: 99,
          maxTokens: 30,
          ...(topK === undefined ? {} : { topK }),
          ...(topP === undefined ? {} : { topP })
        }))
        const logits = yield* reference(w0, [...prompt, ...r.tokenIds])
        const expected = r.tokenIds.map((id, j) => {
          const pos = prompt.length - 1 + j
          return Sampling.logSoftmax(logits.subarray(pos * c.vocabSize, (pos + 1) * c.vocabSize), t)[id]!
        })
        assert.isBelow(maxAbsDiff(r.logprobs, expected), 1e-4)
        assert.isAbove(new Set(r.tokenIds).size, 3)
      }
    }))

  it.effect("batching does not change results for a fixed seed, and requests join a running batch", () =>
    Effect.gen(function*() {
      const engine = yield* make({ config: c, weights: w0 })
      const requests = prompts.map((p, i) => request(p, { seed: 1000 + i, maxTokens: 16 + 8 * i, topP: 0.95 }))
      const alone: Array<GenerateResult> = []
      for (const r of requests) alone.push(yield* engine.generate(r))
      // Start a long request, then let the others arrive while it is decoding.
      const long = yield* engine.generate(request([9, 9, 9], { seed: 5, maxTokens: 120 })).pipe(Effect.forkChild)
      const longAlone = yield* make({ config: c, weights: w0 }).pipe(
        Effect.flatMap((e) => e.generate(request([9, 9, 9], { seed: 5, maxTokens: 120 })))
      )
      const together = yield* generateAll(engine, requests)
      const longResult = yield* Fiber.join(long)
      for (const [i, r] of together.entries()) {
        assert.deepStrictEqual(r.tokenIds, alone[i]!.tokenIds, `request ${i}`)
        assert.isBelow(maxAbsDiff(r.logprobs, alone[i]!.logprobs), 1e-5)
      }
      assert.deepStrictEqual(longResult.tokenIds, longAlone.tokenIds)
      const stats = yield* engine.stats
      assert.isAtLeast(stats.largestBatch, prompts.length) // the newcomers decoded alongside the long request
    }))

  it.effect("a group's chains share their prompt: it is prefilled once, and each chain samples with its own seed", () =>
    Effect.gen(function*() {
      const shared = [11, 12, 13, 14, 15, 16], other = [30, 31, 32]
      const requests = [
        ...Array.from({ length: 6 }, (_, i) => request(shared, { seed: 50 + i, maxTokens: 12 })),
        ...Array.from({ length: 2 }, (_, i) => request(other, { seed: 70 + i, maxTokens: 12 }))
      ]
      const engine = yield* make({ config: c, weights: w0 })
      const together = yield* generateAll(engine, requests)
      const stats = yield* engine.stats
      assert.strictEqual(stats.prefills, 1)
      assert.strictEqual(stats.prefillTokens, 2 * shared.length, "two distinct prompts, padded to the longer")
      const alone = yield* make({ config: c, weights: w0 })
      for (const [i, r] of requests.entries()) {
        const expected = yield* alone.generate(r)
        assert.deepStrictEqual(together[i]!.tokenIds, expected.tokenIds, `request ${i}`)
        assert.isBelow(maxAbsDiff(together[i]!.logprobs, expected.logprobs), 1e-5)
      }
      assert.isAbove(new Set(together.slice(0, 6).map((r) => r.tokenIds.join(","))).size, 1, "the chains differ")
    }))

  it.effect("a next turn reuses the finished turn's keys/values: only its new tokens are prefilled", () =>
    Effect.gen(function*() {
      const engine = yield* make({ config: c, weights: w0 })
      const prompts2 = [[4, 5, 6, 7], [8, 9]]
      const first = yield* generateAll(engine, prompts2.map((p, i) => request(p, { seed: 10 + i, maxTokens: 9 })))
      const before = yield* engine.stats
      // The next turns: each earlier conversation, its sampled tokens, then an observation of different lengths.
      const observations = [[50, 51, 52], [53]]
      const next = prompts2.map((p, i) =>
        request([...p, ...first[i]!.tokenIds, ...observations[i]!], { seed: 20 + i, maxTokens: 10 })
      )
      const continued = yield* generateAll(engine, next)
      const after = yield* engine.stats
      const cached = prompts2.reduce((n, p, i) => n + p.length + first[i]!.tokenIds.length - 1, 0)
      assert.strictEqual(after.reusedTokens - before.reusedTokens, cached, "all but each turn's last sampled token")
      const fresh = yield* make({ config: c, weights: w0 })
      for (const [i, r] of next.entries()) {
        const expected = yield* fresh.generate(r)
        assert.deepStrictEqual(continued[i]!.tokenIds, expected.tokenIds, `conversation ${i}`)
        assert.isBelow(maxAbsDiff(continued[i]!.logprobs, expected.logprobs), 1e-4)
      }
      assert.strictEqual((yield* fresh.stats).reusedTokens, 0)
      // A prompt that does not extend a retained sequence is computed whole.
      yield* engine.generate(request([4, 5, 60], { seed: 1, maxTokens: 3 }))
      assert.strictEqual((yield* engine.stats).reusedTokens, after.reusedTokens)
    }))

  // Real time: the swap has to happen while onnxruntime is busy decoding.
  it.live("updateWeights swaps weights without dropping requests in flight; each finishes on its version", () =>
    Effect.gen(function*() {
      const engine = yield* make({ config: c, weights: w0 })
      const greedy = (p: ReadonlyArray<number>, n: number) => request(p, { temperature: 0, maxTokens: n })
      const fresh0 = yield* make({ config: c, weights: w0 })
      const fresh1 = yield* make({ config: c, weights: w1, version: 1 })
      const expected0 = yield* fresh0.generate(greedy([2, 7, 1, 8], 300))
      const expected1 = yield* fresh1.generate(greedy([2, 7, 1, 8], 20))

      const inFlight = yield* engine.generate(greedy([2, 7, 1, 8], 300)).pipe(Effect.forkChild)
      while ((yield* engine.stats).running[0] !== 1) yield* Effect.sleep("1 millis")
      yield* engine.updateWeights(1, w1)
      assert.strictEqual(yield* engine.policyVersion, 1)
      const during = yield* engine.stats
      assert.strictEqual(during.running[0], 1) // the old request is still decoding on version 0
      assert.strictEqual(during.sessions, 2)
      const after = yield* engine.generate(greedy([2, 7, 1, 8], 20))
      const old = yield* Fiber.join(inFlight)
      assert.strictEqual(old.policyVersion, 0)
      assert.deepStrictEqual(old.tokenIds, expected0.tokenIds)
      assert.strictEqual(after.policyVersion, 1)
      assert.deepStrictEqual(after.tokenIds, expected1.tokenIds)
      assert.notDeepEqual(expected0.tokenIds.slice(0, 20), expected1.tokenIds)
      yield* engine.generate(greedy([1], 2))
      assert.strictEqual((yield* engine.stats).sessions, 1) // the drained version-0 session was released
    }))

  it.effect("weights fed as graph inputs give the same results, and update the same way", () =>
    Effect.gen(function*() {
      const baked = yield* make({ config: c, weights: w0 })
      const fed = yield* make({ config: c, weights: w0, weightsAs: "inputs" })
      const r = request([3, 4, 5], { seed: 8, maxTokens: 20 })
      const a = yield* baked.generate(r), b = yield* fed.generate(r)
      assert.deepStrictEqual(b.tokenIds, a.tokenIds)
      assert.isBelow(maxAbsDiff(b.logprobs, a.logprobs), 1e-5)
      yield* baked.updateWeights(1, w1)
      yield* fed.updateWeights(1, w1)
      const c1 = yield* baked.generate(r), d1 = yield* fed.generate(r)
      assert.deepStrictEqual(d1.tokenIds, c1.tokenIds)
      assert.strictEqual(d1.policyVersion, 1)
      assert.notDeepEqual(c1.tokenIds, a.tokenIds)
    }))

  it.effect("maxBatchSize caps the running batch; the rest wait for a slot with unchanged results", () =>
    Effect.gen(function*() {
      const engine = yield* make({ config: c, weights: w0, maxBatchSize: 2 })
      const requests = prompts.map((p, i) => request(p, { seed: i, maxTokens: 10 + i }))
      const together = yield* generateAll(engine, requests)
      assert.strictEqual((yield* engine.stats).largestBatch, 2)
      for (const [i, r] of requests.entries()) {
        assert.deepStrictEqual(together[i]!.tokenIds, (yield* engine.generate(r)).tokenIds)
      }
    }))

  it.effect("a defect in the decode loop fails the requests it touched and the engine keeps serving", () =>
    Effect.gen(function*() {
      const engine = yield* make({ config: c, weights: w0 })
      const error = yield* Effect.flip(engine.generate(request([1, 2, 3]), {
        onToken: () => {
          throw new Error("boom")
        }
      }))
      assert.strictEqual(error.reason._tag, "ServerError")
      assert.match(error.message, /boom/)
      const ok = yield* engine.generate(request([1, 2, 3], { maxTokens: 5 }))
      assert.strictEqual(ok.tokenIds.length, 5)
    }))

  it.effect("stop tokens, maxTokens and the context limit set the finish reason", () =>
    Effect.gen(function*() {
      const short = tinyConfig({ maxPositionEmbeddings: 12 })
      const engine = yield* make({ config: short, weights: randomWeights(short, 1) })
      const free = yield* engine.generate(request([1, 2, 3], { temperature: 0, maxTokens: 6 }))
      const stopAt = free.tokenIds[3]!
      const stopped = yield* engine.generate(
        request([1, 2, 3], { temperature: 0, maxTokens: 6, stopTokenIds: [stopAt] })
      )
      assert.deepStrictEqual(stopped.tokenIds, free.tokenIds.slice(0, free.tokenIds.indexOf(stopAt) + 1))
      assert.strictEqual(stopped.finishReason, "stop")
      const one = yield* engine.generate(request([1, 2, 3], { temperature: 0, maxTokens: 1 }))
      assert.deepStrictEqual(one, { ...one, tokenIds: [free.tokenIds[0]!], finishReason: "length" })
      const full = yield* engine.generate(request([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], { maxTokens: 100 }))
      assert.strictEqual(full.tokenIds.length, 3) // positions 10 and 11 fed, the token after position 11 sampled
      assert.strictEqual(full.finishReason, "length")
    }))

  it.effect("bad requests and bad weights are typed errors, and the engine keeps serving", () =>
    Effect.gen(function*() {
      const engine = yield* make({ config: c, weights: w0 })
      for (const [r, pattern] of [
        [request([]), /empty/],
        [request([1, 61]), /outside the vocabulary/],
        [request(new Array(513).fill(1)), /context holds 512/],
        [request([1], { maxTokens: 0 }), /maxTokens/],
        [request([1], { temperature: -1 }), /temperature/],
        [request([1], { topP: 0 }), /topP/]
      ] as const) {
        const error = yield* Effect.flip(engine.generate(r))
        assert.instanceOf(error, SamplerError)
        assert.strictEqual(error.reason._tag, "BadRequest")
        assert.match(error.message, pattern)
      }
      const missing = new Map(w1)
      missing.delete("model.norm.weight")
      const wrong = new Map(w1).set("model.norm.weight", new Float32Array(3))
      const extra = new Map(w1).set("model.extra_head.weight", new Float32Array(61 * 32))
      const cases = [[missing, "MissingWeight"], [wrong, "WeightShape"], [extra, "UnknownWeight"]] as const
      for (const [weights, reason] of cases) {
        const error = yield* Effect.flip(engine.updateWeights(1, weights))
        assert.instanceOf(error, PolicyEngineError)
        assert.strictEqual(error.reason._tag, reason)
        assert.strictEqual(error.message, error.reason.message)
      }
      const stale = yield* Effect.flip(engine.updateWeights(0, w1))
      assert.instanceOf(stale.reason, StaleVersion)
      assert.deepStrictEqual([stale.reason.version, stale.reason.current], [0, 0])
      assert.strictEqual(stale.message, "version 0 is not newer than the current version 0")
      const ok = yield* engine.generate(request([1, 2], { maxTokens: 3 }))
      assert.strictEqual(ok.tokenIds.length, 3)
      assert.strictEqual(ok.policyVersion, 0)
    }))

  it.live("the Sampler layer serves generate; closing the scope fails requests in flight with Closed", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(
        layerSampler.pipe(Layer.provideMerge(PolicyEngine.layer({ config: c, weights: w0, version: 3 }))),
        scope
      )
      const sampler = Context.get(context, Sampler)
      const r = yield* sampler.generate(request([4, 5], { maxTokens: 4 }))
      assert.strictEqual(r.policyVersion, 3)
      assert.strictEqual(yield* sampler.policyVersion, 3)
      const pending = yield* sampler.generate(request([4, 5], { maxTokens: 400 })).pipe(Effect.forkChild)
      yield* Effect.sleep("5 millis")
      yield* Scope.close(scope, Exit.void)
      const error = yield* Effect.flip(Fiber.join(pending))
      assert.strictEqual(error.reason._tag, "Closed")
      // A request submitted after the close fails at once too (it used to wait forever on a queue nobody drained).
      const late = yield* Effect.flip(
        sampler.generate(request([4, 5], { maxTokens: 4 })).pipe(Effect.timeout("5 seconds"))
      )
      assert.strictEqual(late._tag, "SamplerError")
      assert.strictEqual((late as SamplerError).reason._tag, "Closed")
    }))

  it("weights initialised from the same seed give the same parameters (sanity of the fixtures)", () => {
    assert.deepStrictEqual(Qwen2.initWeights(c, 3).get("model.norm.weight"), new Float32Array(32).fill(1))
  })
})
