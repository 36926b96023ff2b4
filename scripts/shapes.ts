/**
 * Published model shapes the memory and sampling scripts build models at (no side effects: scripts import it).
 */
import type * as ModelConfig from "../src/model/ModelConfig.ts"

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
