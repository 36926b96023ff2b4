import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Autodiff from "../../../src/autodiff/Autodiff.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import { check, runWith, session } from "../../utils/gradcheck.ts"
import { B, feedsFor, loss, model, T } from "../../utils/ppoFeeds.ts"

const c = model
const config = loss

const build = (recompute: boolean, dtype: "float32" | "float64" = "float32") =>
  Autodiff.trainingGraph(Qwen2.trainingGraph(c), { batch: B, length: T, loss: config, recompute, dtype })

describe("Autodiff activation recompute", () => {
  it.effect("re-emits each layer's forward in the backward, and gives the same loss and gradients", () =>
    Effect.gen(function*() {
      const plain = yield* build(false)
      const re = yield* build(true)
      const count = (tg: Autodiff.TrainingGraph, op: string) => tg.graph.nodes.filter((n) => n.op === op).length
      // Each layer's Softmax (attention) once more, the head's and the non-layer nodes not.
      assert.strictEqual(count(re, "Softmax"), count(plain, "Softmax") + c.numHiddenLayers)
      assert.isAbove(re.graph.nodes.filter((n) => n.outputs.some((o) => o.includes("_re"))).length, 50)
      const a = yield* runWith(yield* session(plain.graph), feedsFor(plain, "float32"))
      const b = yield* runWith(yield* session(re.graph), feedsFor(re, "float32"))
      for (const out of ["loss", "token_logprobs", "stats"]) {
        a[out]!.forEach((x, i) => assert.strictEqual(b[out]![i], x, out)) // the forward is the same nodes
      }
      for (const [w, g] of plain.gradients) {
        const x = a[g]!
        const y = b[re.gradients.get(w)!]!
        let scale = 0
        for (let i = 0; i < x.length; i++) scale = Math.max(scale, Math.abs(x[i]!))
        for (let i = 0; i < x.length; i++) assert.approximately(y[i]!, x[i]!, 1e-5 * (scale + 1e-6), `${w}[${i}]`)
      }
    }))

  it.effect("gradients with recompute match central differences in float64", () =>
    Effect.gen(function*() {
      const tg = yield* build(true, "float64")
      const weights = Qwen2.parameters(c).map((p) => p.name)
      const { worst } = yield* check(yield* session(tg.graph), feedsFor(tg, "float64"), weights, {
        samples: 4,
        h: 1e-5
      })
      for (const w of weights) assert.isBelow(worst[w]!, 1e-5, `${w}: ${worst[w]}`)
    }))
})
