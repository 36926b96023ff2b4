import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Autodiff from "../../../src/autodiff/Autodiff.ts"
import * as Loss from "../../../src/Loss.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import * as Graph from "../../../src/onnx/Graph.ts"
import { check, type Feed, noise, runWith, session } from "../../utils/gradcheck.ts"
import { randomWeights, tinyConfig } from "../../utils/tinyModel.ts"

const B = 2
const T = 5
const V = 7

/** A "model" whose logits are the weight itself: isolates the loss head. */
const logitsAsWeight = (): Autodiff.Forward => {
  const graph = Graph.make("head")
  const z = graph.input("z", "float32", ["batch", "seq", V])
  return { graph, logits: graph.op("Identity", [z]), weightInputs: [z] }
}

const lossFeeds = (config: Loss.Config, logits: ArrayLike<number>) => {
  const n = B * T
  const targets = Int32Array.from({ length: n }, (_, i) => (i * 3 + 1) % V)
  const mask = Uint8Array.from({ length: n }, (_, i) => (i % T === 0 || i === n - 1 ? 0 : 1))
  const weights = Loss.aggregationWeights(config.aggregation, mask, B, T, Loss.totals(mask, B, T))
  // old logprobs: the current ones shifted by noise, so ratios fall inside and outside the clip range
  const current = Loss.reference(Loss.sft, { batch: B, length: T, targets, mask, weights }, logits, V).tokenLogprobs
  const old = Float32Array.from(current, (lp, i) => lp + 0.4 * noise(n, 5)[i]!)
  const sampler = Float32Array.from(old, (lp, i) => lp + 0.3 * noise(n, 6)[i]!)
  const ref = Float32Array.from(current, (lp, i) => lp + 0.5 * noise(n, 8)[i]!)
  const advantages = Float32Array.from(noise(n, 9), (v) => 2 * v)
  const batch: Loss.TokenBatch = {
    batch: B,
    length: T,
    targets,
    mask,
    weights,
    advantages,
    oldLogprobs: old,
    samplerLogprobs: sampler,
    refLogprobs: ref
  }
  const all: Record<string, Feed> = {
    targets: { dtype: "int64", dims: [B, T], data: targets },
    loss_weights: { dtype: "float64", dims: [B, T], data: weights },
    loss_mask: { dtype: "float64", dims: [B, T], data: mask },
    advantages: { dtype: "float64", dims: [B, T], data: advantages },
    old_logprobs: { dtype: "float64", dims: [B, T], data: old },
    sampler_logprobs: { dtype: "float64", dims: [B, T], data: sampler },
    ref_logprobs: { dtype: "float64", dims: [B, T], data: ref }
  }
  return { batch, all }
}

const configs: ReadonlyArray<[string, Loss.Config]> = [
  ["sft (masked NLL)", Loss.sft],
  ["grpo (seq-mean-token-mean) with truncated IS", { ...Loss.grpo, tisCap: 1.5 }],
  ["dr.grpo (seq-mean-token-sum-norm)", Loss.drGrpo],
  ["grpo at sampling temperature 1.5", { ...Loss.grpo, temperature: 1.5 }],
  ["ppo dual clip + k3 KL + entropy bonus", { ...Loss.ppo, klCoef: 0.1, entropyCoef: 0.01 }],
  [
    "clip-higher + k1 KL, seq-mean-token-sum",
    { ...Loss.ppo, clipHigh: 0.28, klCoef: 0.05, klEstimator: "k1", aggregation: "seq-mean-token-sum" }
  ]
]

describe("Autodiff loss head", () => {
  for (const [name, config] of configs) {
    it.effect(`${name}: matches Loss.reference and central differences`, () =>
      Effect.gen(function*() {
        const tg = yield* Autodiff.trainingGraph(
          logitsAsWeight(),
          { batch: B, length: T, loss: config, dtype: "float64" }
        )
        const s = yield* session(tg.graph)
        const logits = noise(B * T * V, 3).map((v) => 3 * v)
        const { batch, all } = lossFeeds(config, logits)
        const feeds: Record<string, Feed> = { z: { dtype: "float64", dims: [B, T, V], data: logits } }
        for (const k of tg.lossInputs) feeds[k] = all[k]!
        const out = yield* runWith(s, feeds)
        const ref = Loss.reference(config, batch, logits, V)
        assert.approximately(out["loss"]![0]!, ref.loss, 1e-9)
        for (let i = 0; i < B * T; i++) assert.approximately(out["token_logprobs"]![i]!, ref.tokenLogprobs[i]!, 1e-9)
        const s6 = out["stats"]!
        const r = ref.stats
        const expected = [r.tokens, r.clipped, r.clippedLower, r.approxKl, r.entropy, r.kl]
        expected.forEach((v, i) => assert.approximately(s6[i]!, v, 1e-9, `stat ${i}`))
        if (config.policyLoss === "ppo") assert.isTrue(r.clipped > 0 && r.clipped < r.tokens, "some tokens clipped")
        const { worst } = yield* check(s, feeds, ["z"])
        assert.isBelow(worst["z"]!, 1e-6)
      }))
  }
})

describe("Autodiff value head (a critic's clipped value loss)", () => {
  it.effect("matches Loss.reference and central differences, with some tokens clipped and some not", () =>
    Effect.gen(function*() {
      const graph = Graph.make("values")
      const z = graph.input("z", "float32", ["batch", "seq", 1])
      const forward = { graph, logits: graph.op("Identity", [z]), weightInputs: [z] }
      const config = { ...Loss.value, clipLow: 0.2 }
      const tg = yield* Autodiff.trainingGraph(forward, { batch: B, length: T, loss: config, dtype: "float64" })
      assert.deepStrictEqual([...tg.lossInputs], ["loss_weights", "loss_mask", "advantages", "old_logprobs"])
      const n = B * T
      // Per token: the value, the old value and the return; the clipped term is the larger where the value moved
      // more than ε away from the old one, towards the return (tokens 1, 3, 6 and 9).
      const values = [0.1, 2.0, -0.4, -1.5, 0.3, 0.7, 0.9, 0.05, -0.2, 1.1]
      const old = Float64Array.from([0.5, 0.2, -0.3, 0.4, 0.35, -0.9, 0.1, 0.0, 0.6, -0.3])
      const returns = [1.0, 2.5, 0.2, -2.0, -0.6, 0.6, 1.5, 0.3, -1.0, 1.0]
      const mask = Uint8Array.from({ length: n }, (_, i) => (i % T === 0 ? 0 : 1))
      const weights = Loss.aggregationWeights(config.aggregation, mask, B, T, Loss.totals(mask, B, T))
      const feeds: Record<string, Feed> = {
        z: { dtype: "float64", dims: [B, T, 1], data: values },
        loss_weights: { dtype: "float64", dims: [B, T], data: weights },
        loss_mask: { dtype: "float64", dims: [B, T], data: mask },
        advantages: { dtype: "float64", dims: [B, T], data: returns },
        old_logprobs: { dtype: "float64", dims: [B, T], data: old }
      }
      const s = yield* session(tg.graph)
      const out = yield* runWith(s, feeds)
      const batch: Loss.TokenBatch = {
        batch: B,
        length: T,
        targets: new Int32Array(n),
        mask,
        weights,
        advantages: Float32Array.from(returns),
        oldLogprobs: Float32Array.from(old)
      }
      const ref = Loss.reference(config, batch, values, 1)
      assert.approximately(out["loss"]![0]!, ref.loss, 1e-6)
      for (let i = 0; i < n; i++) assert.approximately(out["token_logprobs"]![i]!, values[i]!, 1e-12)
      const r = ref.stats
      const expected = [r.tokens, r.clipped, 0, r.approxKl, 0, 0]
      expected.forEach((v, i) => assert.approximately(out["stats"]![i]!, v, 1e-5, `stat ${i}`))
      assert.isTrue(r.clipped > 0 && r.clipped < r.tokens, `some tokens clipped: ${r.clipped} of ${r.tokens}`)
      const { worst } = yield* check(s, feeds, ["z"])
      assert.isBelow(worst["z"]!, 1e-6)
    }))
})

describe("Autodiff on the Qwen2 model", () => {
  const c = tinyConfig({
    vocabSize: 13,
    hiddenSize: 8,
    numAttentionHeads: 2,
    numKeyValueHeads: 1,
    intermediateSize: 12
  })
  const ids = [3, 1, 4, 1, 5, 9, 2, 6, 0, 0]
  const attention = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0]
  const modelFeeds = (dtype: "float64" | "float32", weights: Qwen2.Weights, cfg = c) => {
    const feeds: Record<string, Feed> = {
      input_ids: { dtype: "int64", dims: [B, T], data: ids },
      attention_mask: { dtype: "int64", dims: [B, T], data: attention },
      position_ids: {
        dtype: "int64",
        dims: [B, T],
        data: [...Qwen2.positionIds(attention.slice(0, T)), ...Qwen2.positionIds(attention.slice(T))]
      }
    }
    for (const spec of Qwen2.parameters(cfg)) feeds[spec.name] = {
      dtype,
      dims: spec.shape,
      data: weights.get(spec.name)!
    }
    return feeds
  }

  // The PPO loss here sees old logprobs far from the model's (most ratios clipped), so its gradient flows mostly
  // through the KL and entropy terms; the NLL variants exercise the full path from every token's logprob.
  const variants: ReadonlyArray<[string, Partial<typeof c>, Loss.Config]> = [
    ["GQA, tied embeddings, q/k/v biases, PPO + KL + entropy", { tieWordEmbeddings: true }, {
      ...Loss.ppo,
      klCoef: 0.1,
      entropyCoef: 0.01
    }],
    ["GQA, tied embeddings, NLL", { tieWordEmbeddings: true }, Loss.sft],
    ["GQA, untied head, NLL", { tieWordEmbeddings: false }, Loss.sft],
    ["multi-head (no grouping), no biases, NLL", { numKeyValueHeads: 2, attentionBias: false }, Loss.sft]
  ]
  for (const [variant, overrides, config] of variants) {
    it.effect(`whole-model gradients (${variant}) match central differences in float64`, () =>
      Effect.gen(function*() {
        const cfg = { ...c, ...overrides }
        const forward = Qwen2.trainingGraph(cfg)
        const tg = yield* Autodiff.trainingGraph(forward, { batch: B, length: T, loss: config, dtype: "float64" })
        assert.strictEqual(tg.gradients.size, Qwen2.parameters(cfg).length)
        const s = yield* session(tg.graph)
        const weights = randomWeights(cfg, 11)
        const logits = new Float64Array(B * T * V) // only shapes matter for the auxiliary inputs
        const { all } = lossFeeds(config, logits)
        const feeds = modelFeeds("float64", weights, cfg)
        for (const k of tg.lossInputs) {
          feeds[k] = {
            ...all[k]!,
            data: k === "targets" ? Array.from(all[k]!.data, (v) => v % cfg.vocabSize) : all[k]!.data
          }
        }
        const { worst } = yield* check(s, feeds, forward.weightInputs, { samples: 4, h: 1e-5 })
        for (const w of forward.weightInputs) assert.isBelow(worst[w]!, 1e-5, `${w}: ${worst[w]}`)
      }))
  }

  it.effect("every gradient output is written by the node computing it, not copied by an Identity at the end", () =>
    Effect.gen(function*() {
      for (const tieWordEmbeddings of [true, false]) {
        const cfg = { ...c, tieWordEmbeddings }
        const tg = yield* Autodiff.trainingGraph(Qwen2.trainingGraph(cfg), { batch: B, length: T, loss: Loss.sft })
        assert.strictEqual(tg.gradients.size, Qwen2.parameters(cfg).length)
        // an Identity kept every gradient in a buffer of onnxruntime's until the end of the run (4 bytes a parameter)
        const copies = tg.graph.nodes.filter((n) => n.op === "Identity" && n.outputs[0]!.startsWith("grad."))
        assert.deepStrictEqual(copies.map((n) => n.outputs[0]), [])
        const produced = new Set(tg.graph.nodes.flatMap((n) => n.outputs))
        for (const name of tg.gradients.values()) assert.isTrue(produced.has(name), name)
      }
    }))

  it.effect("a critic's whole-model gradients (value head, clipped value loss) match central differences", () =>
    Effect.gen(function*() {
      const forward = Qwen2.trainingGraph(c, "value")
      const tg = yield* Autodiff.trainingGraph(forward, { batch: B, length: T, loss: Loss.value, dtype: "float64" })
      assert.strictEqual(tg.gradients.size, Qwen2.parameters(c, "value").length)
      assert.isTrue(tg.weights.some((w) => w.name === "value_head.weight" && w.dims.join() === "1,8"))
      const s = yield* session(tg.graph)
      // A value head of random weights (zeros at first in a run) so that gradients reach the trunk.
      const weights = new Map(Qwen2.criticWeights(c, randomWeights(c, 11)))
      weights.set("value_head.weight", Float32Array.from(noise(8, 12)))
      const feeds = modelFeeds("float64", new Map(), c)
      for (const spec of Qwen2.parameters(c)) delete feeds[spec.name]
      for (const spec of Qwen2.parameters(c, "value")) {
        feeds[spec.name] = { dtype: "float64", dims: spec.shape, data: weights.get(spec.name)! }
      }
      const mask = Uint8Array.from({ length: B * T }, (_, i) => (i % T === 0 ? 0 : 1))
      const f64 = (data: ArrayLike<number>): Feed => ({ dtype: "float64", dims: [B, T], data })
      feeds["loss_weights"] = f64(Loss.aggregationWeights("token-mean", mask, B, T, Loss.totals(mask, B, T)))
      feeds["loss_mask"] = f64(mask)
      feeds["advantages"] = f64(noise(B * T, 13))
      feeds["old_logprobs"] = f64(noise(B * T, 14).map((v) => 0.1 * v))
      const { worst } = yield* check(s, feeds, forward.weightInputs, { samples: 4, h: 1e-5 })
      for (const w of forward.weightInputs) assert.isBelow(worst[w]!, 1e-5, `${w}: ${worst[w]}`)
    }))

  it.effect("the float32 training graph agrees with float64 (max rel. error < 1e-3)", () =>
    Effect.gen(function*() {
      const forward64 = Qwen2.trainingGraph(c)
      const forward32 = Qwen2.trainingGraph(c)
      const g64 = yield* Autodiff.trainingGraph(forward64, { batch: B, length: T, loss: Loss.sft, dtype: "float64" })
      const g32 = yield* Autodiff.trainingGraph(forward32, { batch: B, length: T, loss: Loss.sft })
      const weights = randomWeights(c, 5)
      const { all } = lossFeeds(Loss.sft, new Float64Array(B * T * V))
      const run = (tg: Autodiff.TrainingGraph, dtype: "float64" | "float32") =>
        Effect.gen(function*() {
          const feeds = modelFeeds(dtype, weights)
          for (const k of tg.lossInputs) feeds[k] = { ...all[k]!, dtype: k === "targets" ? "int64" : dtype }
          return yield* runWith(yield* session(tg.graph), feeds)
        })
      const a = yield* run(g64, "float64")
      const b = yield* run(g32, "float32")
      assert.approximately(b["loss"]![0]!, a["loss"]![0]!, 1e-4 * Math.abs(a["loss"]![0]!))
      for (const [w, name] of g64.gradients) {
        const x = a[name]!
        const y = b[g32.gradients.get(w)!]!
        let diff = 0
        let scale = 0
        for (let i = 0; i < x.length; i++) {
          diff = Math.max(diff, Math.abs(x[i]! - y[i]!))
          scale = Math.max(scale, Math.abs(x[i]!))
        }
        assert.isBelow(diff / (scale + 1e-12), 1e-3, w)
      }
    }))
})
