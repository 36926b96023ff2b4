/**
 * What the memory and sampling scripts (and the LoRA bench) build their models from: published model shapes, cheap
 * random weights and a synthetic micro-batch (no side effects: scripts import it).
 */
import * as ort from "onnxruntime-node"
import type * as Autodiff from "../src/autodiff/Autodiff.ts"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import type * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import type * as Packing from "../src/Packing.ts"

/** Qwen2.5-0.5B's published shapes (`config.json` of Qwen/Qwen2.5-0.5B-Instruct), cut to `layers`. */
export const qwen25Width = (layers: number): ModelConfig.ModelConfig => ({
  modelType: "qwen2",
  vocabSize: 151936,
  hiddenSize: 896,
  numHiddenLayers: layers,
  numAttentionHeads: 14,
  numKeyValueHeads: 2,
  intermediateSize: 4864,
  maxPositionEmbeddings: 32768,
  ropeTheta: 1000000,
  rmsNormEps: 1e-6,
  tieWordEmbeddings: true,
  attentionBias: true,
  learnedPositions: false
})

/** Cheap random weights (uniform, std ≈ 0.02; norms ones): `Qwen2.initWeights`' normal draws take a minute at 0.5 B. */
export const weightsOf = (c: ModelConfig.ModelConfig): Map<string, Float32Array> => {
  let s = 0x9e3779b9
  const out = new Map<string, Float32Array>()
  for (const spec of Qwen2.parameters(c)) {
    const data = new Float32Array(spec.shape.reduce((a, b) => a * b, 1))
    if (spec.init === "ones") data.fill(1)
    else if (spec.init === "normal") {
      for (let i = 0; i < data.length; i++) {
        s ^= s << 13, s ^= s >>> 17, s ^= s << 5
        data[i] = ((s >>> 0) / 4294967296 - 0.5) * 0.07
      }
    }
    out.set(spec.name, data)
  }
  return out
}

/** `batch` rows of `length` synthetic tokens, every token in the loss (an SFT-shaped micro-batch). */
export const microBatch = (c: ModelConfig.ModelConfig, batch: number, length: number): Packing.MicroBatch => {
  const n = batch * length
  const ids = Int32Array.from({ length: n }, (_, i) => (i * 7919) % c.vocabSize)
  return {
    batch,
    length,
    inputIds: ids,
    attentionMask: new Uint8Array(n).fill(1),
    targets: Int32Array.from(ids, (t) => (t + 1) % c.vocabSize),
    mask: new Uint8Array(n).fill(1),
    weights: new Float32Array(n).fill(1 / n),
    advantages: new Float32Array(n),
    samplerLogprobs: new Float32Array(n),
    refLogprobs: new Float32Array(n),
    sequenceIndex: Int32Array.from({ length: batch }, (_, i) => i),
    lossTokens: n
  }
}

/**
 * The float32 feeds of an SFT training graph's run on `mb`: the model's inputs, the loss's inputs the graph reads
 * and `weights` (the head's vocabulary views, where the graph has them, are the caller's to add).
 */
export const sftFeeds = (
  c: ModelConfig.ModelConfig,
  graph: Autodiff.TrainingGraph,
  mb: Packing.MicroBatch,
  weights: ReadonlyMap<string, Float32Array>,
  batch: number,
  length: number
): Record<string, ort.Tensor> => {
  const lossData: Record<string, () => ort.Tensor> = {
    targets: () => new ort.Tensor("int64", BigInt64Array.from(mb.targets, BigInt), [batch, length]),
    loss_weights: () => new ort.Tensor("float32", mb.weights, [batch, length]),
    loss_mask: () => new ort.Tensor("float32", Float32Array.from(mb.mask), [batch, length])
  }
  const feeds: Record<string, ort.Tensor> = { ...OnnxTrainer.qwen2(c).inputs(mb) }
  for (const name of graph.lossInputs) feeds[name] = lossData[name]!()
  for (const { name, dims } of graph.weights) feeds[name] = new ort.Tensor("float32", weights.get(name)!, [...dims])
  return feeds
}
