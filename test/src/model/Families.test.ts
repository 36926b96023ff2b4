/**
 * The graph computes what Qwen3 and Llama 3 compute: cut-depth models at small widths against a plain-loop float64
 * forward written here from transformers' `modeling_qwen3.py` / `modeling_llama.py` (per-head q/k RMSNorm before
 * RoPE, `head_dim` independent of the width, `llama3` rope scaling), the KV cache against the full forward, and the
 * learner's gradients against central differences.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as ort from "onnxruntime-node"
import * as Autodiff from "../../../src/autodiff/Autodiff.ts"
import * as Loss from "../../../src/Loss.ts"
import * as ModelConfig from "../../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import * as Graph from "../../../src/onnx/Graph.ts"
import { batchFeeds, check } from "../../utils/gradcheck.ts"
import { randomWeights } from "../../utils/tinyModel.ts"
import * as published from "./fixtures/publishedConfigs.ts"

/** A published config cut to 2 layers and small widths, decoded as a folder's `config.json` would be. */
const cut = (json: Record<string, unknown>, overrides: Record<string, unknown>) =>
  Effect.runSync(ModelConfig.decode({
    ...json,
    vocab_size: 61,
    num_hidden_layers: 2,
    max_position_embeddings: 64,
    intermediate_size: 24,
    ...overrides
  }))

// Qwen3: head_dim 6 at width 16 with 4 heads (16 / 4 would be 4): queries 24 wide, o_proj maps 24 back to 16.
const qwen3 = cut(published.qwen3_06b, { hidden_size: 16, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 6 })
// Llama 3: llama3 scaling with pairs in all three regimes at head_dim 8 (wavelengths 2π·10000^(2j/8) = 6.3, 63,
// 628, 6283 against 64 / 4 = 16 and 64 / 1 = 64: kept, interpolated, stretched, stretched).
const llama = cut(published.llama32_1bInstruct, {
  hidden_size: 16,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 8,
  rope_theta: 10000,
  rope_scaling: {
    factor: 8,
    high_freq_factor: 4,
    low_freq_factor: 1,
    original_max_position_embeddings: 64,
    rope_type: "llama3"
  }
})
const families: ReadonlyArray<[string, ModelConfig.ModelConfig]> = [["Qwen3", qwen3], ["Llama 3", llama]]

// ===== A plain-loop reference, float64 =====

const matVec = (w: Float32Array, out: number, inp: number, x: ArrayLike<number>): Float64Array => {
  const y = new Float64Array(out)
  for (let o = 0; o < out; o++) {
    let s = 0
    for (let i = 0; i < inp; i++) s += w[o * inp + i]! * x[i]!
    y[o] = s
  }
  return y
}

/** RMSNorm of `x[offset, offset + n)` in place, scaled by `w`. */
const rmsNormAt = (x: Float64Array, offset: number, n: number, w: Float32Array, eps: number): void => {
  let ms = 0
  for (let i = 0; i < n; i++) ms += x[offset + i]! ** 2
  const inv = 1 / Math.sqrt(ms / n + eps)
  for (let i = 0; i < n; i++) x[offset + i] = x[offset + i]! * inv * w[i]!
}
const rmsNorm = (x: Float64Array, w: Float32Array, eps: number) => {
  const y = Float64Array.from(x)
  rmsNormAt(y, 0, y.length, w, eps)
  return y
}

/** transformers' `_compute_rope_parameters` / `_compute_llama3_parameters`, written as they are. */
const inverseFrequencies = (c: ModelConfig.ModelConfig): Array<number> => {
  const hd = ModelConfig.headDim(c)
  const invFreq = Array.from({ length: hd / 2 }, (_, j) => 1 / c.ropeTheta ** ((2 * j) / hd))
  const s = c.ropeScaling
  if (s === undefined || s === null || s.ropeType !== "llama3") return invFreq
  const lowFreqWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor
  const highFreqWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor
  return invFreq.map((f) => {
    const wavelen = (2 * Math.PI) / f
    const llama = wavelen > lowFreqWavelen ? f / s.factor : f
    const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor)
    const medium = !(wavelen < highFreqWavelen) && !(wavelen > lowFreqWavelen)
    return medium ? ((1 - smooth) * llama) / s.factor + smooth * llama : llama
  })
}

const rope = (x: Float64Array, offset: number, invFreq: ReadonlyArray<number>, pos: number): void => {
  const half = invFreq.length
  for (let j = 0; j < half; j++) {
    const a = pos * invFreq[j]!, cos = Math.cos(a), sin = Math.sin(a)
    const x1 = x[offset + j]!, x2 = x[offset + j + half]!
    x[offset + j] = x1 * cos - x2 * sin
    x[offset + j + half] = x2 * cos + x1 * sin
  }
}

/** Logits `[T][V]` of one unpadded sequence. */
const referenceLogits = (c: ModelConfig.ModelConfig, w: Qwen2.Weights, ids: ReadonlyArray<number>) => {
  const D = c.hiddenSize, hd = ModelConfig.headDim(c), H = c.numAttentionHeads, KV = c.numKeyValueHeads
  const G = H / KV, F = c.intermediateSize, invFreq = inverseFrequencies(c)
  const W = (n: string) => w.get(n)!
  const E = W("model.embed_tokens.weight")
  let xs = ids.map((id) => Float64Array.from(E.subarray(id * D, id * D + D)))
  for (let l = 0; l < c.numHiddenLayers; l++) {
    const p = `model.layers.${l}`
    const qs: Array<Float64Array> = [], ks: Array<Float64Array> = [], vs: Array<Float64Array> = []
    xs.forEach((x, t) => {
      const h = rmsNorm(x, W(`${p}.input_layernorm.weight`), c.rmsNormEps)
      const q = matVec(W(`${p}.self_attn.q_proj.weight`), H * hd, D, h)
      const k = matVec(W(`${p}.self_attn.k_proj.weight`), KV * hd, D, h)
      for (let i = 0; i < H; i++) {
        if (c.modelType === "qwen3") rmsNormAt(q, i * hd, hd, W(`${p}.self_attn.q_norm.weight`), c.rmsNormEps)
        rope(q, i * hd, invFreq, t)
      }
      for (let i = 0; i < KV; i++) {
        if (c.modelType === "qwen3") rmsNormAt(k, i * hd, hd, W(`${p}.self_attn.k_norm.weight`), c.rmsNormEps)
        rope(k, i * hd, invFreq, t)
      }
      qs.push(q), ks.push(k), vs.push(matVec(W(`${p}.self_attn.v_proj.weight`), KV * hd, D, h))
    })
    xs = xs.map((x, t) => {
      const o = new Float64Array(H * hd)
      for (let head = 0; head < H; head++) {
        const kv = Math.floor(head / G)
        const scores = Array.from({ length: t + 1 }, (_, s) => {
          let dot = 0
          for (let j = 0; j < hd; j++) dot += qs[t]![head * hd + j]! * ks[s]![kv * hd + j]!
          return dot / Math.sqrt(hd)
        })
        const max = Math.max(...scores), e = scores.map((s) => Math.exp(s - max)), z = e.reduce((a, b) => a + b)
        for (let s = 0; s <= t; s++) {
          for (let j = 0; j < hd; j++) o[head * hd + j]! += (e[s]! / z) * vs[s]![kv * hd + j]!
        }
      }
      const attn = matVec(W(`${p}.self_attn.o_proj.weight`), D, H * hd, o)
      const y = x.map((v, i) => v + attn[i]!)
      const h2 = rmsNorm(y, W(`${p}.post_attention_layernorm.weight`), c.rmsNormEps)
      const gate = matVec(W(`${p}.mlp.gate_proj.weight`), F, D, h2), up = matVec(W(`${p}.mlp.up_proj.weight`), F, D, h2)
      const down = matVec(W(`${p}.mlp.down_proj.weight`), D, F, gate.map((g, i) => (g / (1 + Math.exp(-g))) * up[i]!))
      return y.map((v, i) => v + down[i]!)
    })
  }
  const head = c.tieWordEmbeddings ? E : W("lm_head.weight")
  return xs.map((x) => matVec(head, c.vocabSize, D, rmsNorm(x, W("model.norm.weight"), c.rmsNormEps)))
}

// ===== Running the graphs =====

const i64 = (values: ReadonlyArray<number>, dims: ReadonlyArray<number>) =>
  new ort.Tensor("int64", BigInt64Array.from(values, BigInt), dims)

const session = (g: Graph.Graph) => Effect.promise(() => ort.InferenceSession.create(Graph.toModelBytes(g)))

const fullLogits = Effect.fnUntraced(function*(
  s: ort.InferenceSession,
  c: ModelConfig.ModelConfig,
  w: Qwen2.Weights,
  ids: ReadonlyArray<number>
) {
  const T = ids.length
  const feeds: Record<string, ort.Tensor> = {
    input_ids: i64(ids, [1, T]),
    attention_mask: i64(ids.map(() => 1), [1, T]),
    position_ids: i64(ids.map((_, i) => i), [1, T])
  }
  for (const spec of Qwen2.parameters(c)) feeds[spec.name] = new ort.Tensor("float32", w.get(spec.name)!, spec.shape)
  return (yield* Effect.promise(() => s.run(feeds)))["logits"]!.data as Float32Array
})

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!))
  return m
}

const ids = [3, 17, 5, 60, 0, 42, 9, 9, 31, 7, 28, 50, 1, 13, 36, 22, 44, 8, 19, 57]

describe("Qwen3 and Llama 3 graphs", () => {
  it("parameters follow the family: Qwen3's q/k norms and head_dim-wide projections; published sizes", () => {
    const names = Qwen2.parameters(qwen3).map((p) => p.name)
    assert.include(names, "model.layers.1.self_attn.q_norm.weight")
    assert.notInclude(names, "model.layers.0.self_attn.q_proj.bias")
    const shape = (c: ModelConfig.ModelConfig, n: string) => Qwen2.parameters(c).find((p) => p.name === n)?.shape
    assert.deepStrictEqual(shape(qwen3, "model.layers.0.self_attn.q_proj.weight"), [24, 16])
    assert.deepStrictEqual(shape(qwen3, "model.layers.0.self_attn.k_proj.weight"), [12, 16])
    assert.deepStrictEqual(shape(qwen3, "model.layers.0.self_attn.o_proj.weight"), [16, 24])
    assert.deepStrictEqual(shape(qwen3, "model.layers.0.self_attn.k_norm.weight"), [6])
    assert.isFalse(Qwen2.parameters(llama).some((p) => p.name.includes("_norm.weight") || p.name.endsWith("bias")))
    // Parameter counts of the published models (tied heads), as their model cards give them.
    const count = (json: Record<string, unknown>) =>
      Qwen2.parameters(Effect.runSync(ModelConfig.decode(json)))
        .reduce((n, p) => n + p.shape.reduce((a, b) => a * b), 0)
    assert.strictEqual(count(published.qwen25_05bInstruct), 494_032_768)
    assert.strictEqual(count(published.qwen25_15bInstruct), 1_543_714_304)
    assert.strictEqual(count(published.qwen3_06b), 596_049_920)
    assert.strictEqual(count(published.llama32_1bInstruct), 1_235_814_400)
    assert.strictEqual(count(published.smolLm2_135mInstruct), 134_515_008)
  })

  it("llama3 rope scaling keeps high frequencies, stretches low ones by the factor and blends between", () => {
    const c = Effect.runSync(ModelConfig.decode(published.llama32_1bInstruct))
    const scaled = Qwen2.ropeInverseFrequencies(c), factors = Qwen2.ropeFrequencyFactors(c)!
    const plain = Qwen2.ropeInverseFrequencies({ ...c, ropeScaling: null })
    assert.strictEqual(scaled.length, 32)
    assert.isUndefined(Qwen2.ropeFrequencyFactors({ ...c, ropeScaling: null }))
    inverseFrequencies(c).forEach((f, j) => assert.closeTo(scaled[j]!, f, 1e-15 + 1e-12 * f, `pair ${j}`))
    let kept = 0, stretched = 0, blended = 0
    plain.forEach((f, j) => {
      const wavelen = (2 * Math.PI) / f
      if (wavelen < 8192 / 4) (kept++, assert.strictEqual(factors[j], 1))
      else if (wavelen > 8192) (stretched++, assert.closeTo(factors[j]!, 32, 1e-9))
      else (blended++, assert.isTrue(factors[j]! > 1 && factors[j]! < 32))
      assert.closeTo(scaled[j]! * factors[j]!, f, 1e-12 * f)
    })
    assert.isTrue(kept > 0 && stretched > 0 && blended > 0)
  })

  for (const [family, c] of families) {
    it.effect(`${family}: the forward graph equals the float64 reference forward`, () =>
      Effect.gen(function*() {
        const w = randomWeights(c, 7)
        const { graph, weightInputs } = Qwen2.trainingGraph(c)
        assert.deepStrictEqual(Graph.problems(graph), [])
        assert.deepStrictEqual([...weightInputs].sort(), Qwen2.parameters(c).map((p) => p.name).sort())
        const documented = new Set<string>([...Qwen2.forwardOps.differentiable, ...Qwen2.forwardOps.nonDifferentiable])
        for (const node of graph.nodes) assert.isTrue(documented.has(node.op), node.op)
        const logits = yield* fullLogits(yield* session(graph), c, w, ids)
        const ref = referenceLogits(c, w, ids)
        ref.forEach((row, t) => {
          const got = logits.subarray(t * c.vocabSize, (t + 1) * c.vocabSize)
          assert.isBelow(maxAbsDiff(got, row), 1e-4, `position ${t}`)
        })
        // The family's own maths are visible at these sizes: without q/k norms or rope scaling the logits move.
        const plain: ModelConfig.ModelConfig = { ...c, modelType: "llama", ropeScaling: null }
        assert.isAbove(Math.max(...ref.map((row, t) => maxAbsDiff(row, referenceLogits(plain, w, ids)[t]!))), 1e-2)
      }))

    it.effect(`${family}: decoding with the KV cache gives the full forward's last logits`, () =>
      Effect.gen(function*() {
        const w = randomWeights(c, 11), V = c.vocabSize, hd = ModelConfig.headDim(c), KV = c.numKeyValueHeads
        const full = yield* fullLogits(yield* session(Qwen2.trainingGraph(c).graph), c, w, ids)
        const cached = yield* session(Qwen2.inferenceGraph(c, w))
        let past: Record<string, ort.Tensor> = {}
        for (let l = 0; l < c.numHiddenLayers; l++) {
          for (const n of ["key", "value"]) {
            past[`past.${l}.${n}`] = new ort.Tensor("float32", new Float32Array(0), [1, KV, 0, hd])
          }
        }
        // A prompt of 6 tokens, then one token a step.
        for (let end = 6, start = 0; end <= ids.length; start = end, end++) {
          const input = ids.slice(start, end)
          const out = yield* Effect.promise(() =>
            cached.run({
              ...past,
              input_ids: i64(input, [1, input.length]),
              attention_mask: i64(ids.slice(0, end).map(() => 1), [1, end]),
              position_ids: i64(input.map((_, i) => start + i), [1, input.length])
            })
          )
          const last = out["logits"]!.data as Float32Array
          assert.isBelow(maxAbsDiff(last, full.subarray((end - 1) * V, end * V)), 1e-4, `after ${end} tokens`)
          const next: Record<string, ort.Tensor> = {}
          for (let l = 0; l < c.numHiddenLayers; l++) {
            for (const n of ["key", "value"]) {
              const a = past[`past.${l}.${n}`]!, b = out[`new.${l}.${n}`]!
              const P = a.dims[2]!, T = b.dims[2]!
              const data = new Float32Array(KV * (P + T) * hd)
              for (let h = 0; h < KV; h++) {
                data.set((a.data as Float32Array).subarray(h * P * hd, (h + 1) * P * hd), h * (P + T) * hd)
                data.set((b.data as Float32Array).subarray(h * T * hd, (h + 1) * T * hd), (h * (P + T) + P) * hd)
              }
              next[`past.${l}.${n}`] = new ort.Tensor("float32", data, [1, KV, P + T, hd])
            }
          }
          past = next
        }
      }))
  }

  it.effect("Qwen3: the shared-prefix graph gives each chain the logits of its prompt and itself in one row", () =>
    Effect.gen(function*() {
      const c = qwen3, w = randomWeights(c, 5), V = c.vocabSize
      const { graph } = Qwen2.sharedPrefixGraph(c)
      const prompt = [4, 8, 15, 16], chains = [[23, 42, 0], [7, 1, 30]], masks = [[1, 1, 0], [1, 1, 1]]
      const feeds: Record<string, ort.Tensor> = {
        prefix_ids: i64(prompt, [1, 4]),
        prefix_mask: i64([1, 1, 1, 1], [1, 4]),
        prefix_positions: i64([0, 1, 2, 3], [1, 4]),
        input_ids: i64(chains.flat(), [2, 3]),
        attention_mask: i64(masks.flat(), [2, 3]),
        position_ids: i64([4, 5, 0, 4, 5, 6], [2, 3]),
        prefix_index: i64([0, 0], [2])
      }
      for (const spec of Qwen2.parameters(c)) {
        feeds[spec.name] = new ort.Tensor("float32", w.get(spec.name)!, spec.shape)
      }
      const s = yield* session(graph)
      const shared = yield* Effect.promise(() => s.run(feeds))
      const logits = shared["logits"]!.data as Float32Array
      for (const [row, chain] of chains.entries()) {
        const real = chain.filter((_, t) => masks[row]![t] === 1)
        const ref = referenceLogits(c, w, [...prompt, ...real])
        real.forEach((_, t) => {
          const got = logits.subarray((row * 3 + t) * V, (row * 3 + t + 1) * V)
          assert.isBelow(maxAbsDiff(got, ref[prompt.length + t]!), 1e-4, `chain ${row} token ${t}`)
        })
      }
    }))

  // As test/src/autodiff/Autodiff.test.ts checks Qwen2's: the learner's whole-model gradients in float64 against
  // central differences, on a batch with a padded row.
  const small = (c: ModelConfig.ModelConfig): ModelConfig.ModelConfig => ({
    ...c,
    vocabSize: 13,
    hiddenSize: 8,
    numAttentionHeads: 2,
    numKeyValueHeads: 1,
    intermediateSize: 12,
    headDim: c.modelType === "qwen3" ? 6 : 4
  })
  const B = 2, T = 5
  for (const [family, c] of families.map(([f, c]) => [f, small(c)] as const)) {
    it.effect(`${family}: the learner's whole-model gradients match central differences in float64`, () =>
      Effect.gen(function*() {
        const forward = Qwen2.trainingGraph(c)
        const tg = yield* Autodiff.trainingGraph(forward, { batch: B, length: T, loss: Loss.sft, dtype: "float64" })
        assert.strictEqual(tg.gradients.size, Qwen2.parameters(c).length)
        const weights = randomWeights(c, 11)
        const feeds = batchFeeds(tg.lossInputs, Qwen2.positionIds, (mask, batch, length) =>
          Loss.aggregationWeights("token-mean", mask, batch, length, Loss.totals(mask, batch, length)))
        for (const spec of Qwen2.parameters(c)) {
          feeds[spec.name] = { dtype: "float64", dims: spec.shape, data: weights.get(spec.name)! }
        }
        const s = yield* Effect.promise(() =>
          ort.InferenceSession.create(Graph.toModelBytes(tg.graph), { graphOptimizationLevel: "disabled" })
        )
        const { worst } = yield* check(s, feeds, forward.weightInputs, { samples: 4, h: 1e-5 })
        for (const w of forward.weightInputs) assert.isBelow(worst[w]!, 1e-5, `${w}: ${worst[w]}`)
      }))
  }
})
