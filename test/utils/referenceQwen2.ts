/**
 * A plain-loop Qwen2 forward pass for one unpadded sequence, written from the Hugging Face modeling code
 * (`modeling_qwen2.py`), independent of the ONNX emission: the oracle the graphs are checked against.
 */
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import type * as Qwen2 from "../../src/model/Qwen2.ts"

const matVec = (w: Float32Array, out: number, inp: number, x: ArrayLike<number>, b?: Float32Array): Float64Array => {
  const y = new Float64Array(out)
  for (let o = 0; o < out; o++) {
    let s = b ? b[o]! : 0
    for (let i = 0; i < inp; i++) s += w[o * inp + i]! * x[i]!
    y[o] = s
  }
  return y
}

const rmsNorm = (x: Float64Array, w: Float32Array, eps: number): Float64Array => {
  let ms = 0
  for (const v of x) ms += v * v
  const inv = 1 / Math.sqrt(ms / x.length + eps)
  return x.map((v, i) => v * inv * w[i]!)
}

const rope = (x: Float64Array, offset: number, hd: number, pos: number, theta: number): void => {
  const half = hd / 2
  for (let j = 0; j < half; j++) {
    const a = pos / Math.pow(theta, (2 * j) / hd), cos = Math.cos(a), sin = Math.sin(a)
    const x1 = x[offset + j]!, x2 = x[offset + j + half]!
    x[offset + j] = x1 * cos - x2 * sin
    x[offset + j + half] = x2 * cos + x1 * sin
  }
}

/** Logits `[T][V]` for one sequence. */
export const referenceLogits = (
  c: ModelConfig.ModelConfig,
  w: Qwen2.Weights,
  ids: ReadonlyArray<number>
): Array<Float64Array> => {
  const D = c.hiddenSize, hd = ModelConfig.headDim(c), H = c.numAttentionHeads, KV = c.numKeyValueHeads
  const G = H / KV, F = c.intermediateSize
  const W = (n: string) => w.get(n)!
  const E = W("model.embed_tokens.weight")
  const P = c.learnedPositions ? W("model.embed_positions.weight") : undefined
  let xs = ids.map((id, t) => {
    const x = Float64Array.from(E.subarray(id * D, id * D + D))
    if (P !== undefined) for (let j = 0; j < D; j++) x[j]! += P[t * D + j]!
    return x
  })
  for (let l = 0; l < c.numHiddenLayers; l++) {
    const p = `model.layers.${l}`
    const bias = (n: string) => (c.attentionBias ? W(`${p}.self_attn.${n}_proj.bias`) : undefined)
    const qs: Array<Float64Array> = [], ks: Array<Float64Array> = [], vs: Array<Float64Array> = []
    xs.forEach((x, t) => {
      const h = rmsNorm(x, W(`${p}.input_layernorm.weight`), c.rmsNormEps)
      const q = matVec(W(`${p}.self_attn.q_proj.weight`), H * hd, D, h, bias("q"))
      const k = matVec(W(`${p}.self_attn.k_proj.weight`), KV * hd, D, h, bias("k"))
      for (let i = 0; i < H; i++) rope(q, i * hd, hd, t, c.ropeTheta)
      for (let i = 0; i < KV; i++) rope(k, i * hd, hd, t, c.ropeTheta)
      qs.push(q), ks.push(k), vs.push(matVec(W(`${p}.self_attn.v_proj.weight`), KV * hd, D, h, bias("v")))
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
      const act = gate.map((g, i) => (g / (1 + Math.exp(-g))) * up[i]!)
      const down = matVec(W(`${p}.mlp.down_proj.weight`), D, F, act)
      return y.map((v, i) => v + down[i]!)
    })
  }
  const head = c.tieWordEmbeddings ? E : W("lm_head.weight")
  return xs.map((x) => matVec(head, c.vocabSize, D, rmsNorm(x, W("model.norm.weight"), c.rmsNormEps)))
}
