/**
 * The two engines of the parity tests, on the same token ids: ours (the ONNX graph of `src/model/Qwen2.ts` on
 * onnxruntime-node, weights as inputs) and llama.cpp (node-llama-cpp's prebuilt CPU binary, never built or
 * downloaded here) on the GGUF file our exporter wrote. Both report, per position, llama.cpp's top 10 tokens with
 * their log-probabilities; greedy continuations come from each engine's own argmax.
 */
import { Effect } from "effect"
import type { Scope } from "effect"
import type { Llama, LlamaModel, Token } from "node-llama-cpp"
import { getLlama, LlamaLogLevel } from "node-llama-cpp"
import * as ort from "onnxruntime-node"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Graph from "../../src/onnx/Graph.ts"
import * as Sampling from "../../src/Sampling.ts"

/** One position's scores: llama.cpp's top tokens (best first) and log-probabilities. */
export interface Top {
  readonly tokens: ReadonlyArray<number>
  readonly logprobs: ReadonlyArray<number>
}

/**
 * Random weights that give a peaked next-token distribution (random weights at HF's std 0.02 give near-uniform
 * logits, where top-1 is decided by rounding): embeddings/head std `headStd`, projections `std`, norms 1 ± 0.1,
 * biases N(0, 0.1²) so every tensor the exporter maps changes the result.
 */
export const peakedWeights = (
  specs: ReadonlyArray<Qwen2.ParameterSpec>,
  seed: number,
  o: { readonly std: number; readonly headStd: number }
): Map<string, Float32Array> => {
  const r = Sampling.rng(seed)
  const weights = new Map<string, Float32Array>()
  for (const spec of specs) {
    const n = spec.shape.reduce((a, b) => a * b, 1)
    const data = new Float32Array(n)
    const head = spec.name === "model.embed_tokens.weight" || spec.name === "lm_head.weight"
    for (let i = 0; i < n; i++) {
      const z = Sampling.normal(r)
      data[i] = spec.init === "ones" ? 1 + 0.1 * z : spec.init === "zeros" ? 0.1 * z : z * (head ? o.headStd : o.std)
    }
    weights.set(spec.name, data)
  }
  return weights
}

/** Log-softmax of a logits row, in float64. */
export const logSoftmax = (row: ArrayLike<number>): Float64Array => {
  let max = -Infinity
  for (let i = 0; i < row.length; i++) max = Math.max(max, row[i]!)
  let sum = 0
  for (let i = 0; i < row.length; i++) sum += Math.exp(row[i]! - max)
  const lse = max + Math.log(sum)
  return Float64Array.from({ length: row.length }, (_, i) => row[i]! - lse)
}

export const argmax = (row: ArrayLike<number>): number => {
  let best = 0
  for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i
  return best
}

const i64 = (values: ReadonlyArray<number>, dims: ReadonlyArray<number>) =>
  new ort.Tensor("int64", BigInt64Array.from(values, BigInt), dims)

/** Our engine: full-sequence logits `[T, V]` (training graph) and a greedy continuation (KV-cache graph). */
export const ours = (c: ModelConfig.ModelConfig, weights: Qwen2.Weights) =>
  Effect.gen(function*() {
    const specs = Qwen2.parameters(c)
    const weightFeeds: Record<string, ort.Tensor> = {}
    for (const spec of specs) weightFeeds[spec.name] = new ort.Tensor("float32", weights.get(spec.name)!, spec.shape)
    const create = (g: Graph.Graph) => Effect.promise(() => ort.InferenceSession.create(Graph.toModelBytes(g)))
    const training = yield* create(Qwen2.trainingGraph(c).graph)
    // The decode graph real models' engines run: onnxruntime's fused kernels and the `logsumexp` output.
    const decoding = yield* create(Qwen2.inferenceGraph(c, "inputs", undefined, false, true))
    let maxLseDiff = 0
    const logits = (ids: ReadonlyArray<number>) =>
      Effect.promise(async () => {
        const T = ids.length
        const out = await training.run({
          ...weightFeeds,
          input_ids: i64(ids, [1, T]),
          attention_mask: i64(ids.map(() => 1), [1, T]),
          position_ids: i64(ids.map((_, i) => i), [1, T])
        })
        return out["logits"]!.data as Float32Array
      })
    const hd = ModelConfig.headDim(c), KV = c.numKeyValueHeads
    const greedy = (prompt: ReadonlyArray<number>, n: number) =>
      Effect.promise(async () => {
        let past: Array<Float32Array> = Array.from({ length: 2 * c.numHiddenLayers }, () => new Float32Array(0))
        let P = 0
        const out: Array<number> = []
        let next: ReadonlyArray<number> = prompt
        while (out.length < n) {
          const T = next.length
          const feeds: Record<string, ort.Tensor> = {
            ...weightFeeds,
            input_ids: i64(next, [1, T]),
            attention_mask: i64(Array.from({ length: P + T }, () => 1), [1, P + T]),
            position_ids: i64(next.map((_, i) => P + i), [1, T])
          }
          for (let i = 0; i < c.numHiddenLayers; i++) {
            feeds[`past.${i}.key`] = new ort.Tensor("float32", past[2 * i]!, [1, KV, P, hd])
            feeds[`past.${i}.value`] = new ort.Tensor("float32", past[2 * i + 1]!, [1, KV, P, hd])
          }
          const result = await decoding.run(feeds)
          past = past.map((old, j) => {
            const fresh = result[`new.${j >> 1}.${j % 2 === 0 ? "key" : "value"}`]!.data as Float32Array
            const merged = new Float32Array(KV * (P + T) * hd)
            for (let h = 0; h < KV; h++) {
              merged.set(old.subarray(h * P * hd, (h + 1) * P * hd), h * (P + T) * hd)
              merged.set(fresh.subarray(h * T * hd, (h + 1) * T * hd), (h * (P + T) + P) * hd)
            }
            return merged
          })
          P += T
          const row = result["logits"]!.data as Float32Array
          const lse = (result["logsumexp"]!.data as Float64Array)[0]!
          maxLseDiff = Math.max(maxLseDiff, Math.abs(lse - Sampling.logSumExp(row)))
          const token = argmax(row)
          out.push(token)
          next = [token]
        }
        return out
      })
    return {
      logits,
      greedy,
      /** The largest |Δ| between the decode graph's `logsumexp` and `Sampling.logSumExp` of its logits so far. */
      maxLseDiff: () => maxLseDiff,
      release: Effect.promise(() => Promise.all([training.release(), decoding.release()]))
    }
  })

/** llama.cpp on the CPU through node-llama-cpp's prebuilt binary (`build: "never"`: nothing is compiled here). */
export const llama: Effect.Effect<Llama> = Effect.promise(() =>
  getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: 2 })
)

export const loadModel = (
  engine: Llama,
  modelPath: string,
  vocabOnly = false
): Effect.Effect<LlamaModel, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.promise(() => engine.loadModel({ modelPath, gpuLayers: 0, vocabOnly })),
    (model) => Effect.promise(() => model.dispose())
  )

/**
 * A llama.cpp context that computes as our engine does: one sequence of up to 512 positions, F32 KV cache, no flash
 * attention, 2 threads (what parity and the sampling checks compare against).
 */
export const exactContext = (model: LlamaModel) =>
  model.createContext({
    contextSize: 512,
    batchSize: 512,
    sequences: 1,
    threads: 2,
    flashAttention: false,
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32"
  })

/**
 * llama.cpp's top `k` next tokens and their log-probabilities at every position of `ids` (F32 KV cache, no flash
 * attention), and a greedy continuation of `ids` by `n` tokens.
 */
export const llamaScores = (model: LlamaModel, ids: ReadonlyArray<number>, k: number, n: number) =>
  Effect.promise(async () => {
    const context = await exactContext(model)
    try {
      const sequence = context.getSequence()
      // node-llama-cpp 3.21 (the newest whose prebuilt binaries are all on the registry) gives each position's
      // probabilities over the vocabulary, computed by llama.cpp in float32; their logarithms are its log-probs.
      const asked = { probabilities: true }
      const results = await sequence.controlledEvaluate(ids.map((id) => [id as Token, { generateNext: asked }]))
      const top = (r: (typeof results)[number]): Top => {
        const probs = [...r!.next.probabilities!.entries()].sort((a, b) => b[1] - a[1]).slice(0, k)
        return { tokens: probs.map(([t]) => t as number), logprobs: probs.map(([, p]) => Math.log(p)) }
      }
      const tops = ids.map((_, i) => top(results[i]))
      const continuation: Array<number> = []
      let last = tops[tops.length - 1]!.tokens[0]!
      while (continuation.length < n) {
        continuation.push(last)
        if (continuation.length === n) break
        const [r] = await sequence.controlledEvaluate([[last as Token, { generateNext: asked }]])
        last = top(r).tokens[0]!
      }
      return { tops, continuation }
    } finally {
      await context.dispose()
    }
  })
