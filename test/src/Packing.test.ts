import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Loss from "../../src/Loss.ts"
import * as Packing from "../../src/Packing.ts"

const seq = (n: number, policyFrom: number, base = 0): Packing.Sequence => ({
  tokenIds: Int32Array.from({ length: n }, (_, i) => base + i + 1),
  lossMask: Uint8Array.from({ length: n }, (_, i) => (i >= policyFrom ? 1 : 0)),
  samplerLogprobs: Float32Array.from({ length: n }, (_, i) => -i / 10),
  advantages: Float32Array.from({ length: n }, () => base)
})

describe("Packing", () => {
  it.effect("shifts targets and per-token data by one, pads rows and respects the budget", () =>
    Effect.gen(function*() {
      const seqs = [seq(5, 2, 100), seq(20, 10, 200), seq(3, 1, 300)]
      const { microBatches, totals } = yield* Packing.pack(seqs, {
        tokenBudget: 32,
        lengthMultiple: 8,
        aggregation: "token-mean"
      })
      // longest first: [20] alone (24 × 1 ≤ 32), then [5, 3] padded to 8
      assert.deepStrictEqual(microBatches.map((m) => [m.batch, m.length]), [[1, 24], [2, 8]])
      for (const m of microBatches) assert.isTrue(m.batch * m.length <= 32)
      assert.deepStrictEqual(totals, { tokens: 3 + 10 + 2, sequences: 3 })
      const second = microBatches[1]!
      assert.deepStrictEqual([...second.sequenceIndex], [0, 2])
      // row 0 = sequence 0: ids 101..105, targets 102..105, loss on targets at positions ≥ 2 → t = 1, 2, 3
      assert.deepStrictEqual([...second.inputIds.subarray(0, 8)], [101, 102, 103, 104, 105, 0, 0, 0])
      assert.deepStrictEqual([...second.targets.subarray(0, 8)], [102, 103, 104, 105, 0, 0, 0, 0])
      assert.deepStrictEqual([...second.mask.subarray(0, 8)], [0, 1, 1, 1, 0, 0, 0, 0])
      assert.deepStrictEqual([...second.attentionMask.subarray(0, 8)], [1, 1, 1, 1, 1, 0, 0, 0])
      assert.approximately(second.samplerLogprobs[1]!, -0.2, 1e-7)
      assert.strictEqual(second.advantages[1], 100)
      // token-mean weights are 1 / (all loss tokens of the mini-batch)
      assert.approximately(second.weights[1]!, 1 / 15, 1e-7)
      const sum = microBatches.reduce((s, m) => s + m.weights.reduce((a, w) => a + w, 0), 0)
      assert.approximately(sum, 1, 1e-6)
    }))

  it.effect("micro-batched weights reproduce every aggregation mode of the whole batch", () =>
    Effect.gen(function*() {
      const seqs = Array.from({ length: 7 }, (_, i) => seq(4 + 3 * i, 2 + (i % 3), i))
      for (const mode of [
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm"
      ] as const) {
        const { microBatches } = yield* Packing.pack(
          seqs,
          { tokenBudget: 64, lengthMultiple: 4, aggregation: mode, normLength: 32 }
        )
        assert.isTrue(microBatches.length > 1)
        // per-token loss = target id; compare with the loss over one unpacked batch
        let packed = 0
        for (const m of microBatches) for (let i = 0; i < m.weights.length; i++) packed += m.weights[i]! * m.targets[i]!
        const whole = yield* Packing.pack(
          seqs,
          { tokenBudget: 10_000, lengthMultiple: 4, aggregation: mode, normLength: 32 }
        )
        const one = whole.microBatches[0]!
        const expected = Loss.aggregate(one.targets, one.mask, one.batch, one.length, mode, 32)
        assert.approximately(packed, expected, 1e-4 * Math.abs(expected))
      }
    }))

  it.effect("padRows fills every micro-batch to the budget with empty rows", () =>
    Effect.gen(function*() {
      const seqs = [seq(5, 2, 100), seq(20, 10, 200), seq(3, 1, 300)]
      const { microBatches } = yield* Packing.pack(
        seqs,
        { tokenBudget: 48, lengthMultiple: 8, aggregation: "token-mean", padRows: true }
      )
      // longest first: [20, 5] fill the 24-token rows; [3] alone gets 5 empty rows of 8
      assert.deepStrictEqual(microBatches.map((m) => [m.batch, m.length]), [[2, 24], [6, 8]])
      assert.deepStrictEqual([...microBatches[0]!.sequenceIndex], [1, 0])
      assert.deepStrictEqual([...microBatches[1]!.sequenceIndex], [2, -1, -1, -1, -1, -1])
      const padding = microBatches[1]!.attentionMask.subarray(8)
      assert.isTrue(padding.every((v) => v === 0))
      const sum = microBatches.reduce((s, m) => s + m.weights.reduce((a, w) => a + w, 0), 0)
      assert.approximately(sum, 1, 1e-6)
    }))

  it.effect("rowSteps pads a partly filled micro-batch to the next step of the capacity only", () =>
    Effect.gen(function*() {
      const seqs = [seq(8, 2), seq(8, 2), seq(8, 2), seq(8, 2), seq(8, 2)]
      const options = { tokenBudget: 64, lengthMultiple: 8, aggregation: "token-mean" as const, padRows: true }
      // capacity 8 rows; steps of ⌈8 / 4⌉ = 2 rows: 5 rows pad to 6, not 8
      const stepped = yield* Packing.pack(seqs, { ...options, rowSteps: 4 })
      assert.deepStrictEqual(stepped.microBatches.map((m) => [m.batch, m.length]), [[6, 8]])
      assert.deepStrictEqual([...stepped.microBatches[0]!.sequenceIndex], [0, 1, 2, 3, 4, -1])
      const full = yield* Packing.pack(seqs, options)
      assert.deepStrictEqual(full.microBatches.map((m) => [m.batch, m.length]), [[8, 8]])
      // the same loss weights on the real rows
      assert.deepStrictEqual([...stepped.microBatches[0]!.weights], [...full.microBatches[0]!.weights.subarray(0, 48)])
    }))

  it.effect("a sequence over the budget and mismatched arrays are typed errors", () =>
    Effect.gen(function*() {
      const long = yield* Effect.flip(Packing.pack([seq(40, 1)], { tokenBudget: 32, aggregation: "token-mean" }))
      assert.strictEqual(long.reason._tag, "SequenceTooLong")
      const which = yield* Packing.pack([seq(8, 1), seq(40, 1)], { tokenBudget: 32, aggregation: "token-mean" }).pipe(
        Effect.as(undefined),
        Effect.catchReason("PackingError", "SequenceTooLong", ({ sequence, tokens }) =>
          Effect.succeed({ sequence, tokens }))
      )
      assert.deepStrictEqual(which, { sequence: 1, tokens: 40 })
      // Within the budget but past the model's positions.
      const past = yield* Effect.flip(
        Packing.pack([seq(20, 1)], { tokenBudget: 64, maxLength: 16, aggregation: "token-mean" })
      )
      assert.strictEqual(past.reason._tag, "SequenceTooLong")
      assert.include(past.message, "more than the model's 16 positions")
      const fits = yield* Packing.pack([seq(16, 1)], { tokenBudget: 64, maxLength: 16, aggregation: "token-mean" })
      assert.strictEqual(fits.microBatches.length, 1)
      const bad = yield* Effect.flip(
        Packing.pack([{ ...seq(4, 1), lossMask: Uint8Array.of(1) }], { tokenBudget: 32, aggregation: "token-mean" })
      )
      assert.strictEqual(bad.reason._tag, "ShapeMismatch")
    }))
})
