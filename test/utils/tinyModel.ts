/** A very small Qwen2 configuration and weights for fast engine tests, plus a no-cache reference forward pass. */
import { Effect } from "effect"
import * as ort from "onnxruntime-node"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Graph from "../../src/onnx/Graph.ts"
import * as Sampling from "../../src/Sampling.ts"

export const tinyConfig = (overrides: Partial<ModelConfig.ModelConfig> = {}): ModelConfig.ModelConfig => ({
  ...ModelConfig.presets.tiny,
  vocabSize: 61,
  hiddenSize: 32,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  intermediateSize: 48,
  maxPositionEmbeddings: 512,
  ...overrides
})

/** Weights large enough that the output distribution is far from uniform, with non-trivial norms and biases. */
export const randomWeights = (c: ModelConfig.ModelConfig, seed: number): Qwen2.Weights => {
  const w = Qwen2.initWeights(c, seed, 0.25)
  const r = Sampling.rng(seed + 1)
  for (const [name, data] of w) {
    if (name.endsWith("bias")) for (let i = 0; i < data.length; i++) data[i] = Sampling.normal(r) * 0.3
    if (name.endsWith("norm.weight")) for (let i = 0; i < data.length; i++) data[i] = 1 + Sampling.normal(r) * 0.2
  }
  return w
}

/** A no-cache forward pass over one whole sequence: logits `[T, V]`. */
export const makeReference = (c: ModelConfig.ModelConfig) =>
  Effect.gen(function*() {
    const session = yield* Effect.promise(() =>
      ort.InferenceSession.create(Graph.toModelBytes(Qwen2.trainingGraph(c).graph))
    )
    return (w: Qwen2.Weights, ids: ReadonlyArray<number>) =>
      Effect.promise(async () => {
        const T = ids.length
        const feeds: Record<string, ort.Tensor> = {
          input_ids: new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, T]),
          attention_mask: new ort.Tensor("int64", new BigInt64Array(T).fill(1n), [1, T]),
          position_ids: new ort.Tensor("int64", BigInt64Array.from(ids, (_, i) => BigInt(i)), [1, T])
        }
        for (const spec of Qwen2.parameters(c)) {
          feeds[spec.name] = new ort.Tensor("float32", w.get(spec.name)!, spec.shape)
        }
        const out = await session.run(feeds)
        return out["logits"]!.data as Float32Array
      })
  })

/** max |a − b| over every tensor, and max |b| (the scale the difference is judged against). */
export const maxDiff = (a: ReadonlyMap<string, Float32Array>, b: ReadonlyMap<string, Float32Array>) => {
  let diff = 0
  let scale = 0
  if ([...a.keys()].sort().join() !== [...b.keys()].sort().join()) throw new Error("the tensors differ in names")
  for (const [name, x] of a) {
    const y = b.get(name)!
    for (let i = 0; i < x.length; i++) {
      diff = Math.max(diff, Math.abs(x[i]! - y[i]!))
      scale = Math.max(scale, Math.abs(y[i]!))
    }
  }
  return { diff, scale }
}
