import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as OnnxTrainer from "../../../src/backends/OnnxTrainer.ts"
import * as OnnxTrainerVision from "../../../src/backends/OnnxTrainerVision.ts"
import * as Loss from "../../../src/Loss.ts"
import * as LrSchedule from "../../../src/LrSchedule.ts"
import * as VisionTower from "../../../src/model/VisionTower.ts"
import * as Optimizer from "../../../src/Optimizer.ts"
import * as Packing from "../../../src/Packing.ts"
import * as Sampling from "../../../src/Sampling.ts"
import { tinyConfig } from "../../utils/tinyModel.ts"
import { smallVl } from "../../utils/visionModel.ts"

const PAD = 60
const vl = smallVl(tinyConfig())

/** A 4×4 image of class `k`: a plain colour per class, with a little noise. */
const picture = (k: number, seed: number): VisionTower.Pixels => {
  const r = Sampling.rng(seed)
  const data = Float32Array.from({ length: 48 }, (_, i) =>
    (Math.floor(i / 16) === k % 3 ? (k < 3 ? 1 : -1) : 0) + 0.1 * (r.next() - 0.5))
  return { width: 4, height: 4, data }
}

/** Image questions (answer 3 + class, the image at the end of the prompt) beside text-only sequences. */
const dataset = (seed: number): ReadonlyArray<Packing.Sequence> => [
  ...Array.from({ length: 8 }, (_, i) => ({
    tokenIds: Int32Array.of(1, 2, 7, PAD, 3 + (i % 4)),
    lossMask: Uint8Array.of(0, 0, 0, 0, 1),
    images: [picture(i % 4, seed * 8 + i)]
  })),
  ...Array.from({ length: 4 }, (_, i) => ({
    tokenIds: Int32Array.of(9, 10 + i, 20 + i, 30 + i),
    lossMask: Uint8Array.of(0, 0, 1, 1)
  }))
]

const options = (workers: number): OnnxTrainer.Options => ({
  model: OnnxTrainerVision.qwen2Vl(vl, PAD),
  weights: VisionTower.initWeights(vl, 3),
  loss: Loss.sft,
  optimizer: Optimizer.defaultConfig,
  schedule: LrSchedule.constant(1e-2, 5),
  workers
})

const pack = (seed: number, sharePrefix = false) =>
  Packing.pack(dataset(seed), { tokenBudget: 32, lengthMultiple: 8, aggregation: "token-mean", sharePrefix })

describe("OnnxTrainer with a vision tower", () => {
  it.effect("trains on image sequences beside text ones until it answers held-out images, on 1 or 2 workers", () =>
    Effect.gen(function*() {
      const { microBatches } = yield* pack(0)
      assert.isAbove(microBatches.length, 1)
      assert.isTrue(microBatches.some((mb) => mb.images !== undefined) && microBatches.some((mb) => !mb.images))
      const one = yield* OnnxTrainer.make(options(1))
      const two = yield* OnnxTrainer.make(options(2))
      // The same first loss when the rows (and their images) are split over two workers.
      const first = yield* Effect.forEach(microBatches, (mb) => one.trainer.forwardBackward(mb))
      const split = yield* Effect.forEach(microBatches, (mb) => two.trainer.forwardBackward(mb))
      first.forEach((r, i) => assert.approximately(split[i]!.loss, r.loss, 1e-5))
      yield* one.trainer.optimStep
      for (let step = 1; step < 60; step++) {
        for (const mb of (yield* pack(step)).microBatches) yield* one.trainer.forwardBackward(mb)
        yield* one.trainer.optimStep
      }
      // Held-out images: every answer has more than half the mass.
      const heldOut = yield* pack(1000)
      let answers = 0
      for (const mb of heldOut.microBatches) {
        if (mb.images === undefined) continue
        const logprobs = yield* one.trainer.logprobs(mb)
        mb.sequenceIndex.forEach((sequence, row) => {
          if (sequence < 0 || mb.images![row]!.length === 0) return
          const at = row * mb.length + 3 // the image's pad predicts the answer
          assert.isTrue(mb.mask[at] === 1)
          assert.isAbove(logprobs[at]!, Math.log(0.5), `row ${row}`)
          answers++
        })
      }
      assert.strictEqual(answers, 8)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.effect("sequences with images are never in shared-prompt groups; the others still are", () =>
    Effect.gen(function*() {
      const same = Array.from({ length: 3 }, (_, i) => ({
        tokenIds: Int32Array.of(1, 2, 3, 4, 5, 6, 7, 8, 9, PAD, 10 + i),
        lossMask: Uint8Array.of(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)
      }))
      const withImages = same.map((s, i) => ({ ...s, images: [picture(i, 1)] }))
      const grouped = yield* Packing.pack(same, { tokenBudget: 64, aggregation: "token-mean", sharePrefix: true })
      assert.isTrue(grouped.microBatches.some((mb) => mb.prefix !== undefined))
      const apart = yield* Packing.pack(withImages, { tokenBudget: 64, aggregation: "token-mean", sharePrefix: true })
      assert.isTrue(apart.microBatches.every((mb) => mb.prefix === undefined))
      assert.deepStrictEqual(apart.microBatches.flatMap((mb) => mb.images ?? []).flat().length, 3)
    }))
})
