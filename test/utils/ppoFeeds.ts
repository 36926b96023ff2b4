/**
 * The small PPO step the autodiff tests differentiate (2 rows × 5 tokens, a padded row end, KL and entropy terms):
 * the model, the loss and the feeds of a training graph, shared by the recompute and large-model tests.
 */
import type * as Autodiff from "../../src/autodiff/Autodiff.ts"
import * as Loss from "../../src/Loss.ts"
import type * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import { type Feed, noise } from "./gradcheck.ts"
import { randomWeights, tinyConfig } from "./tinyModel.ts"

export const B = 2
export const T = 5

export const model = tinyConfig({
  vocabSize: 13,
  hiddenSize: 8,
  numAttentionHeads: 2,
  numKeyValueHeads: 1,
  intermediateSize: 12,
  numHiddenLayers: 2,
  tieWordEmbeddings: true
})

export const loss: Loss.Config = { ...Loss.ppo, klCoef: 0.1, entropyCoef: 0.01 }

/**
 * Every input `tg` reads, in `dtype`: the batch, the inputs of `lossConfig` (its aggregation's token weights) and
 * `cfg`'s random weights (seed 11).
 */
export const feedsFor = (
  tg: Autodiff.TrainingGraph,
  dtype: "float32" | "float64",
  cfg: ModelConfig.ModelConfig = model,
  lossConfig: Loss.Config = loss
): Record<string, Feed> => {
  const n = B * T
  const attention = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0]
  const mask = Uint8Array.from({ length: n }, (_, i) => (i % T === 0 || i === n - 1 ? 0 : 1))
  const weights = randomWeights(cfg, 11)
  const f = (data: ArrayLike<number>): Feed => ({ dtype, dims: [B, T], data })
  const i64 = (data: ArrayLike<number>): Feed => ({ dtype: "int64", dims: [B, T], data })
  const feeds: Record<string, Feed> = {
    input_ids: i64([3, 1, 4, 1, 5, 9, 2, 6, 0, 0]),
    attention_mask: i64(attention),
    position_ids: i64([...Qwen2.positionIds(attention.slice(0, T)), ...Qwen2.positionIds(attention.slice(T))]),
    targets: i64(Array.from({ length: n }, (_, i) => (i * 5 + 2) % cfg.vocabSize)),
    loss_weights: f(Loss.aggregationWeights(lossConfig.aggregation, mask, B, T, Loss.totals(mask, B, T))),
    loss_mask: f(mask),
    advantages: f(noise(n, 9).map((v) => 2 * v)),
    old_logprobs: f(noise(n, 5).map((v) => -2.5 + 0.5 * v)),
    sampler_logprobs: f(noise(n, 6).map((v) => -2.5 + 0.5 * v)),
    ref_logprobs: f(noise(n, 8).map((v) => -2.5 + 0.5 * v))
  }
  for (const spec of Qwen2.parameters(cfg)) {
    feeds[spec.name] = { dtype, dims: spec.shape, data: weights.get(spec.name)! }
  }
  const used = new Set(tg.graph.inputs.map((i) => i.name))
  for (const k of Object.keys(feeds)) if (!used.has(k)) delete feeds[k]
  return feeds
}
