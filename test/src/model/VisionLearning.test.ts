import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Autodiff from "../../../src/autodiff/Autodiff.ts"
import * as Loss from "../../../src/Loss.ts"
import * as VisionTower from "../../../src/model/VisionTower.ts"
import * as Optimizer from "../../../src/Optimizer.ts"
import * as Sampling from "../../../src/Sampling.ts"
import { type Feed, runWith, session } from "../../utils/gradcheck.ts"
import { randomWeights, tinyConfig } from "../../utils/tinyModel.ts"
import { smallVl } from "../../utils/visionModel.ts"

const PAD = 60, CLASSES = 4, B = 8, T = 4
const vl = smallVl(tinyConfig())

/** A 4×4 image of class `k`: a plain colour per class (channel k % 3 high or low), with a little noise. */
const picture = (k: number, seed: number): VisionTower.Pixels => {
  const r = Sampling.rng(seed)
  const data = Float32Array.from({ length: 48 }, (_, i) => {
    const channel = Math.floor(i / 16)
    return (channel === k % 3 ? (k < 3 ? 1 : -1) : 0) + 0.1 * (r.next() - 0.5)
  })
  return { width: 4, height: 4, data }
}

describe("learning through the vision tower", () => {
  it.effect("with the language model frozen, training the tower alone teaches it to answer from the image", () =>
    Effect.gen(function*() {
      const forward = VisionTower.trainingGraph(vl)
      // Only the tower is trained: whatever the answer needs must come through its gradients.
      const tower = forward.weightInputs.filter((n) => n.startsWith("visual."))
      const tg = yield* Autodiff.trainingGraph({ ...forward, weightInputs: tower }, {
        batch: B,
        length: T,
        loss: Loss.sft,
        dims: { images: B, patches: 4 }
      })
      const s = yield* session(tg.graph)
      // A frozen language model of weights large enough that its head can make one answer likely (at N(0, 0.1²)
      // its logits span too little for any direction of its last hidden state to give one answer half the mass).
      const weights = new Map([...VisionTower.initWeights(vl, 3, 0.1), ...randomWeights(vl.text, 3)])
      const state = Optimizer.makeState(new Map(tower.map((n) => [n, weights.get(n)!])))
      const batch = (seed: number) => {
        const classes = Array.from({ length: B }, (_, i) => i % CLASSES)
        const inputs = VisionTower.patchify(vl.vision, classes.map((k, i) => picture(k, seed * B + i)))
        const ids = classes.flatMap((k) => [1, 2, PAD, 3 + k])
        const feeds: Record<string, Feed> = {
          ...VisionTower.inputFeeds(vl.vision, inputs),
          input_ids: { dtype: "int64", dims: [B, T], data: ids },
          attention_mask: { dtype: "int64", dims: [B, T], data: ids.map(() => 1) },
          position_ids: { dtype: "int64", dims: [B, T], data: ids.map((_, i) => i % T) },
          image_token_index: { dtype: "int64", dims: [B, T], data: VisionTower.imageTokenIndex(ids, PAD, inputs) },
          // Predicting the answer (at the image's position 2: token 3 + k) is the only loss term.
          targets: { dtype: "int64", dims: [B, T], data: ids.map((_, i) => (i % T === 2 ? ids[i + 1]! : 0)) },
          loss_mask: { dtype: "float32", dims: [B, T], data: ids.map((_, i) => (i % T === 2 ? 1 : 0)) },
          loss_weights: { dtype: "float32", dims: [B, T], data: ids.map((_, i) => (i % T === 2 ? 1 / B : 0)) }
        }
        for (const spec of VisionTower.allParameters(vl)) {
          feeds[spec.name] = { dtype: "float32", dims: spec.shape, data: weights.get(spec.name)! }
        }
        return feeds
      }
      // Accuracy of the answer on held-out images: the most likely token is 3 + k (token_logprobs of the target
      // above log(1/2) means it has more than half the mass, so it is the argmax).
      const heldOut = (out: Record<string, Float64Array>) =>
        Array.from({ length: B }, (_, b) => out["token_logprobs"]![b * T + 2]! > Math.log(0.5) ? 1 : 0)
          .reduce((a: number, x: number) => a + x, 0) / B
      const before = yield* runWith(s, batch(1000))
      const params = new Map(tower.map((n) => [n, weights.get(n)!])) // updated in place, fed by reference
      for (let step = 0; step < 80; step++) {
        const out = yield* runWith(s, batch(step))
        const grads = new Map(tower.map((n) => [n, Float32Array.from(out[tg.gradients.get(n)!]!)]))
        Optimizer.step(params, grads, state, 1e-2, Optimizer.defaultConfig)
      }
      const after = yield* runWith(s, batch(1000))
      assert.isAtMost(heldOut(before), 0.5)
      assert.strictEqual(heldOut(after), 1)
      assert.isBelow(after["loss"]![0]!, 0.1 * before["loss"]![0]!)
    }))
})
