import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import * as Loss from "../../src/Loss.ts"

const modes = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] as const

describe("Loss", () => {
  it("ppoToken: verl's clipped surrogate with dual clip, by hand", () => {
    const cfg = { clipLow: 0.2, clipHigh: 0.2, dualClip: 3 }
    const up = Loss.ppoToken(Math.log(1.5), 0, 1, cfg) // ratio 1.5, A = 1 → max(−1.5, −1.2) = −1.2
    assert.approximately(up.loss, -1.2, 1e-12)
    assert.isTrue(up.clipped)
    const dual = Loss.ppoToken(Math.log(5), 0, -1, cfg) // ratio 5, A = −1 → min(max(5, 1.2), 3) = 3
    assert.approximately(dual.loss, 3, 1e-12)
    assert.isTrue(dual.clippedLower)
    const low = Loss.ppoToken(Math.log(0.5), 0, -1, cfg) // ratio 0.5, A = −1 → max(0.5, 0.8) = 0.8
    assert.approximately(low.loss, 0.8, 1e-12)
    assert.isTrue(low.clipped)
    assert.isFalse(low.clippedLower)
    const inside = Loss.ppoToken(Math.log(1.1), 0, 2, cfg) // inside the trust region: −A·r
    assert.approximately(inside.loss, -2.2, 1e-12)
    assert.isFalse(inside.clipped)
    const higher = Loss.ppoToken(Math.log(1.25), 0, 1, { clipLow: 0.2, clipHigh: 0.28 }) // DAPO clip-higher
    assert.approximately(higher.loss, -1.25, 1e-12)
  })

  it("KL estimators k1 and k3, truncated importance weights", () => {
    assert.approximately(Loss.klToken(-1, -2, "k1"), 1, 1e-12)
    assert.approximately(Loss.klToken(-1, -2, "k3"), Math.exp(-1), 1e-12) // e^d − d − 1 with d = −1
    assert.strictEqual(Loss.klToken(-3, -3, "k3"), 0)
    assert.approximately(Loss.truncatedImportanceWeight(0, -0.5, 2), Math.exp(0.5), 1e-12)
    assert.strictEqual(Loss.truncatedImportanceWeight(0, -2, 2), 2)
  })

  it("penalizeRewards subtracts β·(log π − log π_ref) on response tokens only", () => {
    const out = Loss.penalizeRewards(
      Float64Array.of(0, 1),
      Float64Array.of(-1, -1),
      Float64Array.of(-2, -1.5),
      Uint8Array.of(0, 1),
      0.1
    )
    assert.deepStrictEqual([...out], [0, 1 - 0.1 * 0.5])
  })

  it("aggregate: verl's agg_loss by hand", () => {
    // two rows of length 3: losses [1, 2, 3] (mask 1 1 0) and [4, 5, 6] (mask 0 0 1)
    const l = [1, 2, 3, 4, 5, 6]
    const m = Uint8Array.of(1, 1, 0, 0, 0, 1)
    assert.approximately(Loss.aggregate(l, m, 2, 3, "token-mean"), 9 / 3, 1e-12)
    assert.approximately(Loss.aggregate(l, m, 2, 3, "seq-mean-token-sum"), (3 + 6) / 2, 1e-12)
    assert.approximately(Loss.aggregate(l, m, 2, 3, "seq-mean-token-mean"), (1.5 + 6) / 2, 1e-12)
    assert.approximately(Loss.aggregate(l, m, 2, 3, "seq-mean-token-sum-norm"), 9 / 3, 1e-12)
    assert.approximately(Loss.aggregate(l, m, 2, 3, "seq-mean-token-sum-norm", 10), 9 / 10, 1e-12)
  })

  for (const mode of modes) {
    it(`aggregationWeights(${mode}) split over micro-batches sums to the mini-batch aggregate`, () =>
      fc.assert(fc.property(
        fc.integer({ min: 1, max: 6 }),
        fc.integer({ min: 1, max: 7 }),
        fc.integer({ min: 0, max: 6 }),
        fc.infiniteStream(fc.tuple(fc.double({ min: -3, max: 3, noNaN: true }), fc.boolean())),
        (batch, length, cut, stream) => {
          const cells = batch * length
          const it = stream[Symbol.iterator]()
          const values = Array.from({ length: cells }, () => it.next().value as [number, boolean])
          const loss = values.map((v) => v[0])
          const mask = Uint8Array.from(values, (v) => (v[1] ? 1 : 0))
          const all = Loss.totals(mask, batch, length)
          const expected = Loss.aggregate(loss, mask, batch, length, mode, 9)
          // split rows into two micro-batches at `cut`
          const split = Math.min(cut, batch)
          let total = 0
          for (const [from, to] of [[0, split], [split, batch]] as const) {
            const sub = mask.subarray(from * length, to * length)
            const w = Loss.aggregationWeights(mode, sub, to - from, length, all, 9)
            for (let i = 0; i < w.length; i++) total += w[i]! * loss[from * length + i]!
          }
          assert.approximately(total, expected, 1e-5 * (1 + Math.abs(expected)))
        }
      )))
  }

  it("reference: nll is the weighted −log softmax of the targets", () => {
    const logits = [0, 1, 2, 0, 0, 0]
    const { loss, tokenLogprobs, stats } = Loss.reference(Loss.sft, {
      batch: 1,
      length: 2,
      targets: Int32Array.of(2, 1),
      mask: Uint8Array.of(1, 1),
      weights: Float32Array.of(0.5, 0.5)
    }, logits, 3)
    const lp0 = 2 - Math.log(1 + Math.E + Math.E ** 2)
    const lp1 = -Math.log(3)
    assert.approximately(tokenLogprobs[0]!, lp0, 1e-12)
    assert.approximately(loss, -0.5 * (lp0 + lp1), 1e-7)
    assert.approximately(stats.entropy, Math.log(3) + (-[0, 1, 2].reduce((h, x) => {
      const p = Math.exp(x - Math.log(1 + Math.E + Math.E ** 2))
      return h + p * Math.log(p)
    }, 0)), 1e-12)
  })
})
