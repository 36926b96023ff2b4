import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Autodiff from "../../../src/autodiff/Autodiff.ts"
import * as ModelConfig from "../../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import * as Graph from "../../../src/onnx/Graph.ts"
import { check, runWith, session } from "../../utils/gradcheck.ts"
import { B, feedsFor, loss, model, T } from "../../utils/ppoFeeds.ts"

const c = model
const config = loss

/** Inputs 256 wide: large models' weight gradients are plain products from that width (`Backward.ts`). */
const wide = { ...c, hiddenSize: 256, intermediateSize: 256 }

const build = (largeModel: boolean, recompute = false, dtype: "float32" | "float64" = "float32") =>
  Autodiff.trainingGraph(Qwen2.trainingGraph(wide), { batch: B, length: T, loss: config, largeModel, recompute, dtype })

/** Weight gradients computed as `Gemm` with `transA` (the default's form). */
const transposedGemms = (tg: Autodiff.TrainingGraph) =>
  tg.graph.nodes.filter((n) =>
    n.op === "Gemm" && n.attributes["transA"]?.kind === "int" && n.attributes["transA"].value === 1
  ).length

describe("Autodiff for large models", () => {
  it("isLargeModel: 50 M parameters or more (static float inputs): the medium preset, not tiny or small", () => {
    const large = (cfg: ModelConfig.ModelConfig) => Autodiff.isLargeModel(Qwen2.trainingGraph(cfg))
    assert.isFalse(large({ ...ModelConfig.presets.tiny, vocabSize: 288 }))
    assert.isFalse(large({ ...ModelConfig.presets.small, vocabSize: 288 }))
    assert.isTrue(large({ ...ModelConfig.presets.medium, vocabSize: 288 }))
    assert.isFalse(large(c))
    assert.isFalse(Qwen2.isLarge(c))
    assert.isFalse(Qwen2.isLarge({ ...ModelConfig.presets.small, vocabSize: 288 }))
    assert.isTrue(Qwen2.isLarge({ ...ModelConfig.presets.medium, vocabSize: 288 }))
  })

  for (const recompute of [false, true]) {
    it.effect(`weight gradients as plain products on a transpose of dY give the default's loss and gradients${
      recompute ? " (with recompute)" : ""
    }`, () =>
      Effect.gen(function*() {
        const plain = yield* build(false, recompute)
        const large = yield* build(true, recompute)
        // Seven projections a layer, plus the untied parts: the default has one Gemm transA per weight gradient.
        assert.isAtLeast(transposedGemms(plain), 7 * c.numHiddenLayers)
        assert.strictEqual(transposedGemms(large), 0)
        // Weight gradients: dYᵀ·A on a transpose of dY (its last axis first), written as ∂W itself.
        assert.isAtLeast(
          large.graph.nodes.filter((n) =>
            n.op === "Transpose" && n.attributes["perm"]?.kind === "ints" &&
            n.attributes["perm"].value.join() === "2,0,1"
          ).length,
          7 * c.numHiddenLayers
        )
        // ... and not transposed back: the default transposes each Gemm's ∂Wᵀ, large models none.
        const swaps = (tg: Autodiff.TrainingGraph) =>
          tg.graph.nodes.filter((n) =>
            n.op === "Transpose" && n.attributes["perm"]?.kind === "ints" && n.attributes["perm"].value.join() === "1,0"
          ).length
        // (With recompute a layer's first gradient also orders the layer's recompute: that one's transpose stays.)
        assert.isAtLeast(swaps(plain) - swaps(large), (recompute ? 6 : 7) * c.numHiddenLayers)
        const a = yield* runWith(yield* session(plain.graph), feedsFor(plain, "float32", wide))
        const b = yield* runWith(yield* session(large.graph), feedsFor(large, "float32", wide))
        for (const out of ["loss", "token_logprobs", "stats"]) {
          a[out]!.forEach((x, i) => assert.strictEqual(b[out]![i], x, out)) // the forward is the same nodes
        }
        for (const [w, g] of plain.gradients) {
          const x = a[g]!
          const y = b[large.gradients.get(w)!]!
          let scale = 0, diff = 0
          for (let i = 0; i < x.length; i++) {
            scale = Math.max(scale, Math.abs(x[i]!))
            diff = Math.max(diff, Math.abs(y[i]! - x[i]!))
          }
          assert.isBelow(diff, 1e-5 * (scale + 1e-6), w)
        }
      }))
  }

  // Attention with each KV head's query heads as rows of one product (large models' training graphs), at a head
  // width whose scale is exact on the queries (4) and one where it stays on the scores (8).
  for (const hiddenSize of [8, 16]) {
    it.effect(`grouped queries (head width ${hiddenSize / 2}): the default's loss and gradients`, () =>
      Effect.gen(function*() {
        const cfg = { ...c, hiddenSize }
        const forward = (groupedQueries: boolean) => {
          const graph = Graph.make("grouped")
          return { graph, ...Qwen2.forward(graph, cfg, { kvCache: false, weights: "inputs", groupedQueries }) }
        }
        const build = (groupedQueries: boolean, dtype: "float32" | "float64" = "float32") =>
          Autodiff.trainingGraph(forward(groupedQueries), {
            batch: B,
            length: T,
            loss: config,
            largeModel: true,
            dtype
          })
        const plain = yield* build(false)
        const grouped = yield* build(true)
        // The keys' and values' gradients are summed over the group inside their products, not by a ReduceSum.
        const sums = (tg: Autodiff.TrainingGraph) => tg.graph.nodes.filter((n) => n.op === "ReduceSum").length
        assert.isAtMost(sums(grouped), sums(plain) - 2 * c.numHiddenLayers)
        const a = yield* runWith(yield* session(plain.graph), feedsFor(plain, "float32", cfg))
        const b = yield* runWith(yield* session(grouped.graph), feedsFor(grouped, "float32", cfg))
        for (const out of ["loss", "token_logprobs", ...[...plain.gradients].map(([w]) => w)]) {
          const x = a[plain.gradients.get(out) ?? out]!
          const y = b[grouped.gradients.get(out) ?? out]!
          let scale = 0
          for (let i = 0; i < x.length; i++) scale = Math.max(scale, Math.abs(x[i]!))
          for (let i = 0; i < x.length; i++) assert.approximately(y[i]!, x[i]!, 1e-5 * (scale + 1e-6), `${out}[${i}]`)
        }
        const tg = yield* build(true, "float64")
        const weights = Qwen2.parameters(cfg).map((p) => p.name)
        const { worst } = yield* check(yield* session(tg.graph), feedsFor(tg, "float64", cfg), weights, {
          samples: 4,
          h: 1e-5
        })
        for (const w of weights) assert.isBelow(worst[w]!, 1e-5, `${w}: ${worst[w]}`)
      }))
  }

  it.effect("large-model gradients match central differences in float64", () =>
    Effect.gen(function*() {
      const tg = yield* build(true, false, "float64")
      const weights = Qwen2.parameters(wide).map((p) => p.name)
      const { worst } = yield* check(yield* session(tg.graph), feedsFor(tg, "float64", wide), weights, {
        samples: 4,
        h: 1e-5
      })
      for (const w of weights) assert.isBelow(worst[w]!, 1e-5, `${w}: ${worst[w]}`)
    }))
})
