/**
 * GSPO, CISPO and DAPO's pieces: the formulas by hand, and the emitted loss head against `Loss.reference` and
 * central differences (as `test/src/autodiff/Autodiff.test.ts` checks the other losses).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Autodiff from "../../src/autodiff/Autodiff.ts"
import * as Loss from "../../src/Loss.ts"
import * as Graph from "../../src/onnx/Graph.ts"
import { check, type Feed, noise, runWith, session } from "../utils/gradcheck.ts"

const B = 3
const T = 5
const V = 7

const logitsAsWeight = (): Autodiff.Forward => {
  const graph = Graph.make("head")
  const z = graph.input("z", "float32", ["batch", "seq", V])
  return { graph, logits: graph.op("Identity", [z]), weightInputs: [z] }
}

/** A batch whose old logprobs are the current ones plus noise of `spread`; one advantage per row. */
const lossFeeds = (config: Loss.Config, logits: ArrayLike<number>, spread: number) => {
  const n = B * T
  const targets = Int32Array.from({ length: n }, (_, i) => (i * 3 + 1) % V)
  const mask = Uint8Array.from({ length: n }, (_, i) => (i % T === 0 || i === n - 1 ? 0 : 1))
  const weights = Loss.aggregationWeights(config.aggregation, mask, B, T, Loss.totals(mask, B, T))
  const current = Loss.reference(Loss.sft, { batch: B, length: T, targets, mask, weights }, logits, V).tokenLogprobs
  const old = Float32Array.from(current, (lp, i) => lp + spread * noise(n, 5)[i]!)
  const sampler = Float32Array.from(old, (lp, i) => lp + 0.3 * noise(n, 6)[i]!)
  const rowAdvantage = [1.5, -0.7, 0.9]
  const advantages = Float32Array.from({ length: n }, (_, i) => rowAdvantage[Math.floor(i / T)]!)
  const batch: Loss.TokenBatch = {
    batch: B,
    length: T,
    targets,
    mask,
    weights,
    advantages,
    oldLogprobs: old,
    samplerLogprobs: sampler
  }
  const all: Record<string, Feed> = {
    targets: { dtype: "int64", dims: [B, T], data: targets },
    loss_weights: { dtype: "float64", dims: [B, T], data: weights },
    loss_mask: { dtype: "float64", dims: [B, T], data: mask },
    advantages: { dtype: "float64", dims: [B, T], data: advantages },
    old_logprobs: { dtype: "float64", dims: [B, T], data: old },
    sampler_logprobs: { dtype: "float64", dims: [B, T], data: sampler }
  }
  return { batch, all }
}

describe("Loss: GSPO, CISPO, DAPO by hand", () => {
  it("cispoToken: −A·r inside the range; past a bound the gradient is −A·bound, not PPO's zero", () => {
    const cfg = { clipLow: 0.2, clipHigh: 0.28 }
    const inside = Loss.cispoToken(Math.log(1.1), 0, 2, cfg)
    assert.approximately(inside.loss, -2.2, 1e-12)
    assert.isFalse(inside.clipped)
    // ratio 2 with A = 1: PPO's loss is flat there (gradient 0); CISPO's slope in log π is −A·1.28
    const h = 1e-6
    const slope = (lp: number, f: (lp: number) => number) => (f(lp + h) - f(lp - h)) / (2 * h)
    const lp = Math.log(2)
    assert.approximately(slope(lp, (x) => Loss.cispoToken(x, 0, 1, cfg).loss), -1.28, 1e-6)
    assert.approximately(slope(lp, (x) => Loss.ppoToken(x, 0, 1, cfg).loss), 0, 1e-9)
    assert.isTrue(Loss.cispoToken(lp, 0, 1, cfg).clipped)
    // below the range with A < 0: slope −A·0.8
    assert.approximately(slope(Math.log(0.5), (x) => Loss.cispoToken(x, 0, -1, cfg).loss), 0.8, 1e-6)
    // continuous at the bound
    const at = Math.log(1.28)
    assert.approximately(Loss.cispoToken(at + 1e-9, 0, 1, cfg).loss, Loss.cispoToken(at - 1e-9, 0, 1, cfg).loss, 1e-8)
    // clipLow ≥ 1: no lower bound (down to e^−20)
    assert.isFalse(Loss.cispoToken(Math.log(0.01), 0, 1, { clipLow: 1, clipHigh: 0.28 }).clipped)
  })

  it("gspo: one ratio per sequence, the geometric mean of its tokens' ratios over the mask", () => {
    const lp = Float64Array.of(-1, -2, -3, 0, -0.5, -0.5)
    const old = Float64Array.of(-1.2, -2.4, 9, -0.1, -0.5, -0.8)
    const mask = Uint8Array.of(1, 1, 0, 1, 0, 1)
    const s = Loss.sequenceRatios(lp, old, mask, 2, 3)
    assert.approximately(s[0]!, Math.exp((0.2 + 0.4) / 2), 1e-12) // the masked −3 vs 9 is left out
    assert.approximately(s[1]!, Math.exp((0.1 + 0.3) / 2), 1e-12)
    // the clip acts on the sequence: every token of a clipped sequence is clipped
    const cfg = { clipLow: 3e-4, clipHigh: 4e-4 }
    assert.approximately(Loss.gspoToken(s[0]!, 1, cfg).loss, -(1 + 4e-4), 1e-12)
    assert.isTrue(Loss.gspoToken(s[0]!, 1, cfg).clipped)
    assert.approximately(Loss.gspoToken(1.0001, 1, cfg).loss, -1.0001, 1e-12)
    assert.deepStrictEqual([...Loss.sequenceRatios(lp, old, new Uint8Array(6), 2, 3)], [1, 1])
  })

  it("gspo with one advantage per sequence and seq-mean-token-mean is the paper's sequence objective", () => {
    const logits = noise(B * T * V, 3).map((v) => 3 * v)
    const config = { ...Loss.gspo, clipLow: 0.1, clipHigh: 0.1 }
    const { batch } = lossFeeds(config, logits, 0.3)
    const ref = Loss.reference(config, batch, logits, V)
    const s = Loss.sequenceRatios(ref.tokenLogprobs, batch.oldLogprobs!, batch.mask, B, T)
    const a = [1.5, -0.7, 0.9]
    const objective = a.reduce((sum, A, i) => sum + Math.max(-A * s[i]!, -A * Math.min(Math.max(s[i]!, 0.9), 1.1)), 0)
    assert.approximately(ref.loss, objective / B, 1e-7) // float32 aggregation weights
  })

  it("overlongPenalty: DAPO's soft punishment", () => {
    const o = { maxTokens: 100, bufferTokens: 20 }
    assert.strictEqual(Loss.overlongPenalty(80, o), 0)
    assert.approximately(Loss.overlongPenalty(90, o), -0.5, 1e-12)
    assert.approximately(Loss.overlongPenalty(100, o), -1, 1e-12)
    assert.strictEqual(Loss.overlongPenalty(101, o), -1)
    assert.strictEqual(Loss.overlongPenalty(101, { ...o, factor: 0.5 }), -0.5)
  })

  it("the presets: GSPO's and CISPO's ranges, DAPO's clip-higher; policy-gradient guard", () => {
    assert.deepStrictEqual([Loss.gspo.clipLow, Loss.gspo.clipHigh, Loss.gspo.aggregation], [
      3e-4,
      4e-4,
      "seq-mean-token-mean"
    ])
    assert.deepStrictEqual([Loss.cispo.policyLoss, Loss.cispo.clipHigh], ["cispo", 0.28])
    assert.deepStrictEqual([Loss.dapo.clipLow, Loss.dapo.clipHigh, Loss.dapo.aggregation], [0.2, 0.28, "token-mean"])
    assert.isTrue(Loss.isPolicyGradient(Loss.gspo) && Loss.isPolicyGradient(Loss.cispo))
    assert.isFalse(Loss.isPolicyGradient(Loss.sft) || Loss.isPolicyGradient(Loss.value))
  })
})

const configs: ReadonlyArray<[string, Loss.Config, number]> = [
  ["gspo (sequence ratio), wide range so that some sequences clip and some do not", {
    ...Loss.gspo,
    clipLow: 0.03,
    clipHigh: 0.03
  }, 0.3],
  ["gspo with truncated IS and an entropy bonus, token-mean", {
    ...Loss.gspo,
    aggregation: "token-mean",
    clipLow: 0.03,
    clipHigh: 0.03,
    tisCap: 1.5,
    entropyCoef: 0.01
  }, 0.3],
  ["cispo, both bounds", { ...Loss.cispo, clipLow: 0.2 }, 0.4],
  ["cispo, no lower bound, seq-mean-token-sum", { ...Loss.cispo, aggregation: "seq-mean-token-sum" }, 0.4],
  ["dapo (clip-higher)", Loss.dapo, 0.4]
]

describe("loss head: GSPO, CISPO, DAPO against Loss.reference and central differences", () => {
  for (const [name, config, spread] of configs) {
    it.effect(name, () =>
      Effect.gen(function*() {
        const options = { batch: B, length: T, loss: config, dtype: "float64" } as const
        const tg = yield* Autodiff.trainingGraph(logitsAsWeight(), options)
        const s = yield* session(tg.graph)
        const logits = noise(B * T * V, 3).map((v) => 3 * v)
        const { batch, all } = lossFeeds(config, logits, spread)
        const feeds: Record<string, Feed> = { z: { dtype: "float64", dims: [B, T, V], data: logits } }
        for (const k of tg.lossInputs) feeds[k] = all[k]!
        const out = yield* runWith(s, feeds)
        const ref = Loss.reference(config, batch, logits, V)
        assert.approximately(out["loss"]![0]!, ref.loss, 1e-9)
        const r = ref.stats
        const expected = [r.tokens, r.clipped, r.clippedLower, r.approxKl, r.entropy, r.kl]
        expected.forEach((v, i) => assert.approximately(out["stats"]![i]!, v, 1e-9, `stat ${i}`))
        assert.isTrue(r.clipped > 0 && r.clipped < r.tokens, `some tokens clipped (${r.clipped} of ${r.tokens})`)
        const { worst } = yield* check(s, feeds, ["z"])
        assert.isBelow(worst["z"]!, 1e-6)
      }))
  }
})
