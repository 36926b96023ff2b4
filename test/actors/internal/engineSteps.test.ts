import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect } from "effect"
import { advance, continued } from "../../../actors/internal/engineSteps.ts"
import type { Seq } from "../../../actors/internal/engineSteps.ts"
import * as KvCache from "../../../actors/internal/kvCache.ts"
import * as ModelConfig from "../../../src/model/ModelConfig.ts"
import type { GenerateResult, SamplerError } from "../../../src/Sampler.ts"
import * as Sampling from "../../../src/Sampling.ts"

/** A greedy sequence (its token is the row's argmax) with `filled` tokens in the cache. */
const seqOf = (fields: { maxTokens?: number; stop?: Array<number>; filled?: number; cancelled?: boolean }): Seq => ({
  deferred: Deferred.makeUnsafe<GenerateResult, SamplerError>(),
  prompt: [1, 2],
  params: { temperature: 0 },
  rng: Sampling.rng(1),
  stop: new Set(fields.stop ?? []),
  maxTokens: fields.maxTokens ?? 100,
  tokenIds: [],
  logprobs: [],
  onToken: undefined,
  filled: fields.filled ?? 2,
  cancelled: fields.cancelled ?? false,
  prefix: undefined
})

const stats = () => ({
  decodeSteps: 0,
  prefills: 0,
  prefillTokens: 0,
  reusedTokens: 0,
  generatedTokens: 0,
  largestBatch: 0
})

describe("engineSteps", () => {
  it.effect("advance: a stop token or the last token ends a sequence, a cancelled one is skipped, the rest go on", () =>
    Effect.gen(function*() {
      const config = { ...ModelConfig.presets.tiny, maxPositionEmbeddings: 16 }
      const engine = { vocabSize: 4, config, stats: stats() }
      const seqs = [
        seqOf({ stop: [2] }), // samples 2, its stop token
        seqOf({ maxTokens: 1 }), // samples 1, its one token
        seqOf({ cancelled: true }),
        seqOf({}), // samples 3 and goes on
        seqOf({ filled: 16 }) // samples 0 with the context full
      ]
      const seen: Array<number> = []
      seqs[3] = { ...seqs[3]!, onToken: (token) => seen.push(token) }
      const logits = Float32Array.from([
        [0, 0, 5, 0],
        [0, 5, 0, 0],
        [5, 0, 0, 0],
        [0, 0, 0, 5],
        [5, 0, 0, 0]
      ].flat())
      const kept = advance(engine, { version: 7 }, seqs, logits)
      assert.deepStrictEqual(kept, [3])
      assert.strictEqual(engine.stats.generatedTokens, 4)
      assert.deepStrictEqual(seen, [3])
      assert.deepStrictEqual(seqs[2]!.tokenIds, [])
      assert.isFalse(yield* Deferred.isDone(seqs[2]!.deferred))
      assert.isFalse(yield* Deferred.isDone(seqs[3]!.deferred))
      assert.deepStrictEqual(seqs[3]!.tokenIds, [3])
      const ended = yield* Effect.forEach([0, 1, 4], (i) => Deferred.await(seqs[i]!.deferred))
      assert.deepStrictEqual(ended.map((r) => [r.tokenIds, r.finishReason, r.policyVersion]), [
        [[2], "stop", 7],
        [[1], "length", 7],
        [[0], "length", 7]
      ])
      // Greedy: the plain log-softmax at the sampled token.
      assert.closeTo(ended[0]!.logprobs[0]!, 5 - Math.log(Math.exp(5) + 3), 1e-6)
    }))

  it("continued takes the longest retained sequence the prompt extends (the oldest on a tie), once", () => {
    const prefix = () => KvCache.emptyPrefix(2)
    const [a, b, c, d, e] = [prefix(), prefix(), prefix(), prefix(), prefix()]
    const g = {
      retained: [
        { tokens: [1, 2], prefix: a },
        { tokens: [1, 2, 3], prefix: b },
        { tokens: [1, 2, 3, 4], prefix: c }, // as long as the prompt: nothing left to compute, not a continuation
        { tokens: [1, 9, 3], prefix: d }, // not a prefix of the prompt
        { tokens: [1, 7, 3], prefix: e } // as long as b, but no prefix either
      ]
    }
    // The prefix comes back with how many images it covers (none here): its cache arrays are the retained ones.
    const taken = (prompt: ReadonlyArray<number>) => continued(g, prompt)
    const first = taken([1, 2, 3, 4])
    assert.strictEqual(first?.data, b.data)
    assert.strictEqual(first?.images, 0)
    assert.strictEqual(taken([1, 2, 3, 4])?.data, a.data)
    assert.strictEqual(taken([1, 2, 3, 4]), undefined)
    assert.deepStrictEqual(g.retained.map((r) => r.prefix), [c, d, e])
    g.retained.push({ tokens: [1, 3], prefix: a }, { tokens: [1, 3], prefix: b })
    assert.strictEqual(taken([1, 3, 5])?.data, a.data)
  })
})
