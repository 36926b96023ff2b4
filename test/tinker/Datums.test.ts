/**
 * Tinker datums ↔ our micro-batches: a packed micro-batch survives the trip through datums and JSON, and the losses
 * our learner computes on the rebuilt batch are Tinker's (SkyRL's `skyrl/tinker/loss_fns.py`, written out below as
 * plain loops).
 */
import { assert, describe, it } from "@effect/vitest"
import { Schema } from "effect"
import * as fc from "fast-check"
import * as Loss from "../../src/Loss.ts"
import * as Packing from "../../src/Packing.ts"
import * as Datums from "../../src/tinker/Datums.ts"
import * as Types from "../../src/tinker/Types.ts"

const sequence = (n: number, seed: number): Packing.Sequence => {
  const prompt = 3 + (seed % 4)
  const rand = (i: number) => Math.sin(seed * 97 + i * 13) * 0.5
  return {
    tokenIds: Int32Array.from({ length: n }, (_, i) => (seed * 31 + i * 7) % 50),
    lossMask: Uint8Array.from({ length: n }, (_, i) => (i >= prompt ? 1 : 0)),
    samplerLogprobs: Float32Array.from({ length: n }, (_, i) => -1 - Math.abs(rand(i))),
    advantages: Float32Array.from({ length: n }, () => (seed % 3) - 1 + 0.25)
  }
}

/** Datums as the client sends them: through JSON and the Schemas, as the server receives them. */
const overTheWire = (data: ReadonlyArray<Types.Datum>): ReadonlyArray<Types.Datum> => {
  const body = Schema.encodeSync(Schema.Array(Types.Datum))(data)
  return Schema.decodeUnknownSync(Schema.Array(Types.Datum))(JSON.parse(JSON.stringify(body)))
}

const same = (a: Packing.MicroBatch, b: Packing.MicroBatch, withAdvantages: boolean) => {
  assert.strictEqual(b.batch, a.batch)
  assert.strictEqual(b.length, a.length)
  assert.strictEqual(b.lossTokens, a.lossTokens)
  for (const k of ["inputIds", "attentionMask", "targets", "mask", "weights"] as const) {
    assert.deepStrictEqual(b[k], a[k], k)
  }
  if (withAdvantages) {
    assert.deepStrictEqual(b.advantages, a.advantages)
    assert.deepStrictEqual(b.samplerLogprobs, a.samplerLogprobs)
  }
}

const roundTrip = (
  lengths: ReadonlyArray<number>,
  aggregation: Loss.AggregationMode,
  lossFn: Datums.Supported
) => {
  const sequences = lengths.map((n, i) => sequence(n, i + 1))
  const packed = Packing.packUnsafe(sequences, { tokenBudget: 4096, aggregation })
  for (const mb of packed.microBatches) {
    const data = Datums.fromMicroBatch(mb, lossFn)
    assert.isFalse(Datums.isRefusal(data))
    const back = Datums.toMicroBatch(overTheWire(data as Array<Types.Datum>), lossFn)
    assert.isFalse(Datums.isRefusal(back))
    same(mb, back as Packing.MicroBatch, lossFn !== "cross_entropy")
  }
}

describe("Datums", () => {
  it("a packed micro-batch → datums → JSON → micro-batch is the same batch, every aggregation mode", () => {
    fc.assert(fc.property(
      fc.array(fc.integer({ min: 5, max: 40 }), { minLength: 1, maxLength: 6 }),
      fc.constantFrom(...Loss.AggregationMode.literals),
      fc.constantFrom("cross_entropy" as const, "importance_sampling" as const, "ppo" as const, "cispo" as const),
      roundTrip
    ))
  })

  it("a datum becomes a row: inputs, shifted targets, weights as the loss mask; padding to 16", () => {
    const datum: Types.Datum = {
      model_input: { chunks: [{ tokens: [5, 6], type: "encoded_text" }, { tokens: [7], type: "encoded_text" }] },
      loss_fn_inputs: {
        target_tokens: { data: [6, 7, 8], dtype: "int64" },
        weights: { data: [0, 1, 0.5], dtype: "float32" }
      }
    }
    const empty: Types.Datum = {
      model_input: { chunks: [] },
      loss_fn_inputs: { target_tokens: { data: [], dtype: "int64" } }
    }
    const mb = Datums.toMicroBatch([datum, empty], "cross_entropy")
    assert.isFalse(Datums.isRefusal(mb))
    const m = mb as Packing.MicroBatch
    assert.strictEqual(m.length, 16)
    assert.deepStrictEqual(Array.from(m.inputIds.subarray(0, 4)), [5, 6, 7, 0])
    assert.deepStrictEqual(Array.from(m.targets.subarray(0, 4)), [6, 7, 8, 0])
    assert.deepStrictEqual(Array.from(m.mask.subarray(0, 4)), [0, 1, 1, 0])
    assert.deepStrictEqual(Array.from(m.weights.subarray(0, 4)), [0, 1, 0.5, 0])
    assert.deepStrictEqual(Array.from(m.sequenceIndex), [0, -1])
    assert.strictEqual(m.lossTokens, 2)
  })

  it("weights default to 1 (SkyRL's default), for RL losses too", () => {
    const mb = Datums.toMicroBatch([{
      model_input: { chunks: [{ tokens: [1, 2], type: "encoded_text" }] },
      loss_fn_inputs: {
        target_tokens: { data: [2, 3], dtype: "int64" },
        logprobs: { data: [-1, -2], dtype: "float32" },
        advantages: { data: [0.5, 0.5], dtype: "float32" }
      }
    }], "importance_sampling", { lengthMultiple: 1 }) as Packing.MicroBatch
    assert.deepStrictEqual(Array.from(mb.weights), [1, 1])
    assert.deepStrictEqual(Array.from(mb.samplerLogprobs), [-1, -2])
    assert.deepStrictEqual(Array.from(mb.advantages), [0.5, 0.5])
  })

  describe("our loss on the rebuilt batch is Tinker's", () => {
    const vocab = 7
    const batch = (lossFn: Datums.Supported) => {
      const data: Array<Types.Datum> = [0, 1].map((r) => ({
        model_input: { chunks: [{ tokens: [1, 2, 3, 4], type: "encoded_text" as const }] },
        loss_fn_inputs: {
          target_tokens: { data: [2, 3, 4, 5 - r], dtype: "int64" as const },
          weights: { data: [0, 1, 0.5, 1], dtype: "float32" as const },
          ...(lossFn === "cross_entropy" ? {} : {
            logprobs: { data: [-1.5, -2, -0.5, -3 + r], dtype: "float32" as const },
            advantages: { data: [0, 1.5, -0.75, r === 0 ? 2 : -1], dtype: "float32" as const }
          })
        }
      }))
      const mb = Datums.toMicroBatch(data, lossFn, { lengthMultiple: 1 }) as Packing.MicroBatch
      const logits = Float64Array.from({ length: mb.batch * mb.length * vocab }, (_, i) => Math.sin(i * 1.7) * 2)
      const logprob = (i: number) => Loss.logSoftmax(logits, i * vocab, vocab, 1)[mb.targets[i]!]!
      return { mb, logits, logprob }
    }
    const ours = (lossFn: Datums.Supported, config?: Record<string, number>) => {
      const { mb, logits } = batch(lossFn)
      const loss = Datums.lossConfig(lossFn, config) as Loss.Config
      return Loss.reference(loss, { ...mb, oldLogprobs: mb.samplerLogprobs }, logits, vocab).loss
    }
    /** SkyRL's `loss_fns.py`: Σ_t w_t · ℓ_t. */
    const tinker = (lossFn: Datums.Supported, token: (lp: number, old: number, a: number) => number) => {
      const { mb, logprob } = batch(lossFn)
      let sum = 0
      for (let i = 0; i < mb.batch * mb.length; i++) {
        if (mb.weights[i] === 0) continue
        sum += mb.weights[i]! * token(logprob(i), mb.samplerLogprobs[i]!, mb.advantages[i]!)
      }
      return sum
    }

    it("cross_entropy: −w · log π", () => {
      assert.approximately(ours("cross_entropy"), tinker("cross_entropy", (lp) => -lp), 1e-9)
    })

    it("importance_sampling: −w · r · A, never clipped", () => {
      const expected = tinker("importance_sampling", (lp, old, a) => -Math.exp(lp - old) * a)
      assert.approximately(ours("importance_sampling"), expected, 1e-9)
    })

    it("ppo: −w · min(r · A, clip(r, lo, hi) · A), default and configured thresholds", () => {
      for (const [lo, hi] of [[0.8, 1.2], [0.5, 3]] as const) {
        const expected = tinker("ppo", (lp, old, a) => {
          const r = Math.exp(lp - old)
          return -Math.min(r * a, Math.min(Math.max(r, lo), hi) * a)
        })
        const config = lo === 0.8 ? undefined : { clip_low_threshold: lo, clip_high_threshold: hi }
        assert.approximately(ours("ppo", config), expected, 1e-9)
      }
      // The defaults clip somewhere in this batch: otherwise the test above would not tell ppo from IS.
      assert.notStrictEqual(ours("ppo").toFixed(9), ours("importance_sampling").toFixed(9))
    })

    it("cispo: the gradient in log π is Tinker's −w · sg(clip(r, lo, hi)) · A", () => {
      const loss = Datums.lossConfig("cispo") as Loss.Config
      for (const [lp, old, a] of [[-1, -1.1, 2], [-0.2, -2, 1], [-3, -0.5, -1], [-1, -1, 0.5]] as const) {
        const h = 1e-6
        const numeric = (Loss.cispoToken(lp + h, old, a, loss).loss - Loss.cispoToken(lp - h, old, a, loss).loss) /
          (2 * h)
        const r = Math.exp(lp - old)
        assert.approximately(numeric, -Math.min(Math.max(r, 0.8), 1.2) * a, 1e-5)
      }
    })
  })

  describe("refusals say what is wrong", () => {
    const ok: Types.Datum = {
      model_input: { chunks: [{ tokens: [1, 2], type: "encoded_text" }] },
      loss_fn_inputs: { target_tokens: { data: [2, 3], dtype: "int64" } }
    }
    const refused = (m: unknown, fragment: string) => {
      assert.isTrue(Datums.isRefusal(m), JSON.stringify(m))
      assert.include((m as Datums.Refusal).refused, fragment)
    }
    it("losses and settings", () => {
      refused(Datums.lossConfig("dro"), "dro")
      refused(Datums.lossConfig("ppo", { beta: 1 }), "beta")
      refused(Datums.lossConfig("cross_entropy", { clip_low_threshold: 0.9 }), "clip_low_threshold")
      refused(Datums.lossConfig("ppo", { clip_low_threshold: 1.5 }), "clip")
      assert.deepStrictEqual(Datums.lossConfig("ppo", { clip_low_threshold: 0.9, clip_high_threshold: 1.3 }), {
        ...Loss.sft,
        policyLoss: "ppo",
        clipLow: 1 - 0.9,
        clipHigh: 1.3 - 1
      })
    })
    it("datums", () => {
      const withInputs = (loss_fn_inputs: Types.LossFnInputs): Types.Datum => ({ ...ok, loss_fn_inputs })
      const targets = ok.loss_fn_inputs["target_tokens"]!
      refused(Datums.toMicroBatch([], "cross_entropy"), "empty")
      refused(Datums.toMicroBatch([ok], "ppo"), "needs loss_fn_inputs.logprobs")
      refused(Datums.toMicroBatch([withInputs({ target_tokens: targets, mask: targets })], "cross_entropy"), "mask")
      const short = withInputs({ target_tokens: { data: [2], dtype: "int64" } })
      refused(Datums.toMicroBatch([short], "cross_entropy"), "1 values for 2 tokens")
      refused(Datums.toMicroBatch([ok], "cross_entropy", { vocabSize: 3 }), "token id 3")
      const audio: Types.Datum = { ...ok, model_input: { chunks: [{ dmel: "", type: "dmel" }] } }
      refused(Datums.toMicroBatch([audio], "cross_entropy"), "dmel")
      const sparse = withInputs({
        target_tokens: { ...targets, shape: [2], sparse_crow_indices: [0], sparse_col_indices: [0] }
      })
      refused(Datums.toMicroBatch([sparse], "cross_entropy"), "sparse")
    })
  })
})
