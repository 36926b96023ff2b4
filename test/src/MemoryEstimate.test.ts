import { assert, describe, it } from "@effect/vitest"
import * as MemoryEstimate from "../../src/MemoryEstimate.ts"
import { qwen25Width } from "../../scripts/shapes.ts"

const GiB = 1024 ** 3

// Qwen2.5-0.5B's shapes at `layers` layers (the memory scripts build the same).
const qwen = qwen25Width

const learner = { microBatchSize: 4, sequenceLength: 512, workers: 1, engine: false }

describe("MemoryEstimate", () => {
  it("counts Qwen2.5-0.5B's 494 M parameters and splits 16 bytes a parameter between weights and AdamW", () => {
    const e = MemoryEstimate.estimate(qwen(24), learner)
    assert.strictEqual(e.parameters, 494_032_768)
    assert.strictEqual(e.weights, 4 * e.parameters)
    assert.strictEqual(e.optimizer, 8 * e.parameters)
    const parts = e.weights + e.gradients + e.optimizer + e.activations + e.head + e.extra
    assert.strictEqual(e.total, parts)
  })

  it("is within 15 % of the measured peak at one layer (4.04 GiB, scripts/learner-memory.ts), and not below it", () => {
    const total = MemoryEstimate.estimate(qwen(1), learner).total / GiB
    assert.approximately(total, 4.04, 0.6)
    assert.isAtLeast(total, 4.04) // an estimate under the peak would let a run start that the OOM killer ends
  })

  it("a LoRA run's gradients and moments are its adapters': within 15 % of its measured peak (lora-memory.ts)", () => {
    // Rank 16 on all seven projections of the 24 layers: 8,798,208 adapter parameters; 2 × 512 tokens, 6.94 GiB.
    const lora = { ...learner, microBatchSize: 2, trainedParameters: 8_798_208 }
    const e = MemoryEstimate.estimate(qwen(24), lora)
    assert.strictEqual(e.optimizer, 8 * 8_798_208)
    assert.strictEqual(e.weights, 4 * e.parameters)
    assert.approximately(e.total / GiB, 6.94, 1.04)
    const full = MemoryEstimate.estimate(qwen(24), { ...learner, microBatchSize: 2 })
    assert.isBelow(e.total, full.total / 2)
    // Workers copy the adapter each and share one mapped file of the base, whatever their number.
    const [two, four] = [2, 4].map((workers) => MemoryEstimate.estimate(qwen(24), { ...lora, workers }))
    assert.strictEqual(two!.weights, 8 * e.parameters + 2 * 4 * 8_798_208)
    assert.strictEqual(four!.weights - two!.weights, 2 * 4 * 8_798_208)
  })

  it("activations grow with layers and tokens, the head is capped by its chunk, workers add private copies", () => {
    const one = MemoryEstimate.estimate(qwen(2), learner)
    const long = MemoryEstimate.estimate(qwen(2), { ...learner, sequenceLength: 1024 })
    assert.isAbove(long.activations, 2 * one.activations) // attention scores grow with the square of the length
    assert.strictEqual(long.head, one.head)
    const two = MemoryEstimate.estimate(qwen(2), { ...learner, workers: 2 })
    assert.strictEqual(two.weights, 3 * one.weights)
    assert.isAbove(two.gradients, one.gradients)
  })

  it("a run that fits is not refused; one that does not is refused with settings that fit, each checked", () => {
    assert.isUndefined(MemoryEstimate.check(qwen(2), learner, 64 * GiB))
    const settings = { ...learner, microBatchSize: 16, workers: 2 }
    const available = 20 * GiB
    const refused = MemoryEstimate.check(qwen(24), settings, available)!
    assert.strictEqual(refused._tag, "OutOfMemory")
    assert.isAbove(refused.estimate, available)
    assert.isAbove(refused.fits.length, 0)
    for (const f of refused.fits) {
      assert.isAtMost(f.estimate, available)
      const fit = MemoryEstimate.estimate(qwen(24), { ...settings, ...f })
      assert.strictEqual(fit.total, f.estimate)
    }
    // Two workers hold two more copies of the weights and gradients: only one worker fits, with 4 rows.
    assert.deepStrictEqual(refused.fits.map((f) => [f.microBatchSize, f.workers]), [[4, 1]])
    assert.include(refused.message, "algorithm.microBatchSize 4 with learner.workers 1")
    assert.include(refused.message, "494 M parameters")
  })

  it("bfloat16 moments halve the optimizer's part; recompute keeps one layer's inside and 2·D floats a layer", () => {
    const plain = MemoryEstimate.estimate(qwen(24), learner)
    const bf16 = MemoryEstimate.estimate(qwen(24), { ...learner, moments: "bfloat16" })
    assert.strictEqual(bf16.optimizer, 4 * plain.parameters)
    assert.strictEqual(plain.total - bf16.total, 4 * plain.parameters)
    const re = MemoryEstimate.estimate(qwen(24), { ...learner, recompute: true })
    const oneLayer = MemoryEstimate.estimate(qwen(1), learner).activations
    assert.strictEqual(re.activations, oneLayer + 4 * 4 * 512 * 2 * 896 * 24)
    assert.isBelow(re.activations / plain.activations, 1 / 3)
  })

  it("a run refused at its micro-batch is offered bfloat16 moments or recompute where either alone fits", () => {
    const settings = { ...learner, microBatchSize: 2 }
    const plain = MemoryEstimate.estimate(qwen(24), settings).total
    const bf16 = MemoryEstimate.estimate(qwen(24), { ...settings, moments: "bfloat16" }).total
    const re = MemoryEstimate.estimate(qwen(24), { ...settings, recompute: true }).total
    assert.isBelow(re, bf16) // at 2 × 512 tokens the activations outweigh 4 bytes a parameter
    const refused = MemoryEstimate.check(qwen(24), settings, (bf16 + plain) / 2)!
    assert.deepStrictEqual(refused.fits.slice(-2), [
      { microBatchSize: 2, workers: 1, moments: "bfloat16", estimate: bf16 },
      { microBatchSize: 2, workers: 1, recompute: true, estimate: re }
    ])
    assert.include(refused.message, `algorithm.microBatchSize 2 with learner.workers 1 and learner.moments "bfloat16"`)
    // Where neither alone fits, both together are offered; a run that has both already is offered neither.
    const both = MemoryEstimate.estimate(qwen(24), { ...settings, moments: "bfloat16", recompute: true }).total
    const tight = MemoryEstimate.check(qwen(24), settings, (both + re) / 2)!
    assert.deepStrictEqual(tight.fits.at(-1), {
      microBatchSize: 2,
      workers: 1,
      moments: "bfloat16",
      recompute: true,
      estimate: both
    })
    assert.include(tight.message, "and learner.recompute true")
    const already = MemoryEstimate.check(qwen(24), { ...settings, moments: "bfloat16", recompute: true }, both - 1)!
    assert.isTrue(already.fits.every((f) => f.microBatchSize < 2))
  })

  it("a model too large for any setting says so", () => {
    const refused = MemoryEstimate.check(qwen(24), learner, 2 * GiB)!
    assert.deepStrictEqual(refused.fits, [])
    assert.include(refused.message, "no micro-batch size, worker count or context length fits")
  })

  it("where no micro-batch fits at the run's context, a shorter context that fits one row is offered", () => {
    const long = { ...learner, sequenceLength: 8192 }
    const available = MemoryEstimate.estimate(qwen(24), { ...long, sequenceLength: 1024, microBatchSize: 1 }).total
    const refused = MemoryEstimate.check(qwen(24), long, available + 1)!
    assert.deepStrictEqual(refused.fits, [])
    assert.include(refused.message, "no micro-batch size or worker count fits at 8192 tokens a row; this would: ")
    assert.include(refused.message, "agent.maxContextTokens 1024 with algorithm.microBatchSize 1 with learner.workers 1")
  })
})
