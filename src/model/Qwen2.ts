/**
 * The decoder of all three families the runtime computes, defined once: Qwen2/Qwen2.5 (`Qwen2ForCausalLM`), Qwen3
 * (`Qwen3ForCausalLM`) and Llama 3.x / SmolLM2 (`LlamaForCausalLM`). Token embedding, RMSNorm, rotary position
 * embeddings (RoPE, with Llama 3's `llama3` frequency scaling when the config asks for it), attention with
 * grouped-query heads of width `head_dim` (independent of the model's width for Qwen3), Qwen2's q/k/v biases or
 * Qwen3's per-head q/k RMSNorm, a SwiGLU MLP and a tied or untied output head. The module keeps its first family's
 * name.
 *
 * The model's maths are small functions (`rmsNorm`, `rope`, `attention`, `mlp`) written against the
 * {@link Graph.Graph} builder; {@link forward} wires them into a full forward pass. Serialising the graph is
 * `Graph.toModelBytes`'s job, so the same emitted nodes feed both the sampler (with a KV cache) and the learner's
 * autodiff (without one).
 *
 * **Graph interface.** Inputs: `input_ids [B, T]` int64; `attention_mask [B, P + T]` int64 (1 = real token,
 * 0 = padding; `P` is the cached length, 0 without a cache); `position_ids [B, T]` int64 (each token's index among
 * its sequence's real tokens, see {@link positionIds}); with a KV cache, `past.{i}.key|value [B, KV, P, hd]`.
 * Outputs: `logits [B, T, V]` float32 (`[B, 1, V]` with `lastTokenOnly`) and, with a cache, `new.{i}.key|value
 * [B, KV, T, hd]`: the new tokens' keys (rotated) and values only. The caller keeps the cache and appends them, so
 * that a decode step does not copy the whole cache out of onnxruntime; the cache's slots need not be contiguous
 * (the attention mask says which hold tokens). Weights use Hugging Face names and `[out, in]` layouts (see
 * {@link parameters}), as graph inputs (`weights: "inputs"`, the learner's choice) or initializers (frozen weights,
 * faster decoding).
 *
 * **Ops used** (what the learner's autodiff must handle): Gather, MatMul, Add, Mul, Sub, Sigmoid, Softmax,
 * Transpose, Reshape, Concat, Slice, Unsqueeze, ReduceMean, Sqrt, Reciprocal, Where; index/mask-only (no gradient):
 * Shape, Range, LessOrEqual, Cast, And; decoding only: Identity (the `new.*` outputs).
 *
 * @since 0.1.0
 */
import * as Lora from "../Lora.ts"
import * as Graph from "../onnx/Graph.ts"
import * as Sampling from "../Sampling.ts"
import * as ModelConfig from "./ModelConfig.ts"

/**
 * Every op the forward graphs emit: the set the learner's autodiff must differentiate (`differentiable`) or pass
 * through as index/mask computations (`nonDifferentiable`). Checked against the emitted graphs by the tests.
 *
 * @category models
 * @since 0.1.0
 */
export const forwardOps = {
  differentiable: [
    "Gather", "MatMul", "Add", "Mul", "Sub", "Sigmoid", "Softmax", "Transpose", "Reshape", "Concat", "Slice",
    "Unsqueeze", "ReduceMean", "Sqrt", "Reciprocal", "Where"
  ],
  nonDifferentiable: ["Shape", "Range", "LessOrEqual", "Cast", "And", "Identity"]
} as const

// ===== Parameters =====

/**
 * One parameter tensor: Hugging Face name, shape (`[out, in]` for projections) and how it is initialised.
 *
 * @category models
 * @since 0.1.0
 */
export interface ParameterSpec {
  readonly name: string
  readonly shape: ReadonlyArray<number>
  readonly init: "normal" | "ones" | "zeros"
}

/**
 * Weights by parameter name, float32, row-major.
 *
 * @category models
 * @since 0.1.0
 */
export type Weights = ReadonlyMap<string, Float32Array>

/**
 * The model's output: `lm` the language-model head (logits over the vocabulary), `value` a critic's value head
 * (`value_head.weight [1, hidden]`, zeros at first; one value per position, in place of the logits).
 *
 * @category models
 * @since 0.1.0
 */
export type Head = "lm" | "value"

/**
 * Every parameter of the model in a fixed order (embedding, layers, final norm, untied head). Per layer, in
 * Hugging Face's names: `input_layernorm`, `self_attn.{q,k,v}_proj` (`weight [heads·head_dim, hidden]`, biases with
 * `attentionBias`), `self_attn.o_proj [hidden, heads·head_dim]`, Qwen3's `self_attn.{q,k}_norm.weight [head_dim]`,
 * `post_attention_layernorm`, `mlp.{gate,up,down}_proj`.
 *
 * @category getters
 * @since 0.1.0
 */
export const parameters = (c: ModelConfig.ModelConfig, output: Head = "lm"): ReadonlyArray<ParameterSpec> => {
  const D = c.hiddenSize, hd = ModelConfig.headDim(c), F = c.intermediateSize
  const qOut = c.numAttentionHeads * hd, kvOut = c.numKeyValueHeads * hd
  const specs: Array<ParameterSpec> = [{ name: "model.embed_tokens.weight", shape: [c.vocabSize, D], init: "normal" }]
  if (c.learnedPositions) {
    specs.push({ name: "model.embed_positions.weight", shape: [c.maxPositionEmbeddings, D], init: "normal" })
  }
  for (let i = 0; i < c.numHiddenLayers; i++) {
    const p = `model.layers.${i}`
    specs.push({ name: `${p}.input_layernorm.weight`, shape: [D], init: "ones" })
    for (const [n, out] of [["q", qOut], ["k", kvOut], ["v", kvOut]] as const) {
      specs.push({ name: `${p}.self_attn.${n}_proj.weight`, shape: [out, D], init: "normal" })
      if (c.attentionBias) specs.push({ name: `${p}.self_attn.${n}_proj.bias`, shape: [out], init: "zeros" })
    }
    specs.push({ name: `${p}.self_attn.o_proj.weight`, shape: [D, qOut], init: "normal" })
    if (ModelConfig.hasQkNorm(c)) {
      specs.push({ name: `${p}.self_attn.q_norm.weight`, shape: [hd], init: "ones" })
      specs.push({ name: `${p}.self_attn.k_norm.weight`, shape: [hd], init: "ones" })
    }
    specs.push({ name: `${p}.post_attention_layernorm.weight`, shape: [D], init: "ones" })
    specs.push({ name: `${p}.mlp.gate_proj.weight`, shape: [F, D], init: "normal" })
    specs.push({ name: `${p}.mlp.up_proj.weight`, shape: [F, D], init: "normal" })
    specs.push({ name: `${p}.mlp.down_proj.weight`, shape: [D, F], init: "normal" })
  }
  specs.push({ name: "model.norm.weight", shape: [D], init: "ones" })
  if (output === "value") specs.push({ name: "value_head.weight", shape: [1, D], init: "zeros" })
  else if (!c.tieWordEmbeddings) specs.push({ name: "lm_head.weight", shape: [c.vocabSize, D], init: "normal" })
  return specs
}

/**
 * A critic's first weights: the policy's trunk (everything but its output head) and a value head of zeros, as verl
 * starts its critic from the actor's model.
 *
 * @category constructors
 * @since 0.1.0
 */
export const criticWeights = (c: ModelConfig.ModelConfig, policy: Weights): Map<string, Float32Array> =>
  new Map(parameters(c, "value").map((spec) => [
    spec.name,
    spec.name === "value_head.weight"
      ? new Float32Array(c.hiddenSize)
      : Float32Array.from(policy.get(spec.name) ?? new Float32Array(0))
  ]))

/**
 * Deterministic random initialisation from a seed: projections and embeddings ~ N(0, 0.02²) (Hugging Face's
 * `initializer_range`), norms 1, biases 0. The same seed gives the same weights on every platform.
 *
 * @category constructors
 * @since 0.1.0
 */
export const initWeights = (c: ModelConfig.ModelConfig, seed: number, std = 0.02): Map<string, Float32Array> => {
  const r = Sampling.rng(seed)
  const weights = new Map<string, Float32Array>()
  for (const spec of parameters(c)) {
    const n = spec.shape.reduce((a, b) => a * b, 1)
    const data = new Float32Array(n)
    if (spec.init === "ones") data.fill(1)
    else if (spec.init === "normal") for (let i = 0; i < n; i++) data[i] = Sampling.normal(r) * std
    weights.set(spec.name, data)
  }
  return weights
}

// ===== The model's maths, emitted through the builder =====

const i64 = (g: Graph.Graph, values: ReadonlyArray<number>): string => g.constant(Graph.int64([values.length], values))
const f32 = (g: Graph.Graph, value: number): string => g.constant(Graph.float32([], [value]))

/**
 * `x @ Wᵀ (+ b)` for a Hugging Face `[out, in]` weight. With `fused` (weights fed as inputs, whose `Transpose` would
 * run on every step): `x` flattened to its rows, one com.microsoft `FusedMatMul(x, W, transB = 1)`, and the rows'
 * shape restored. Flattened, a batch of rows is one product; `[batch, 1, in]` as it is ran one per row (measured
 * against a `Gemm` and an unflattened `FusedMatMul`: BENCHMARKS.md, "lora", "The engine reads the learner's base").
 */
const linear = (g: Graph.Graph, x: string, w: string, b?: string, fused?: Fused): string => {
  if (fused !== undefined) {
    const rows = g.op("Flatten", [x], { axis: Graph.int(-1) })
    const y = g.node("FusedMatMul", [rows, w], [g.fresh("FusedMatMul")], { transB: Graph.int(1) }, msDomain)[0]!
    const out = g.op("Reshape", [y, fused.rows()])
    return b === undefined ? out : g.op("Add", [out, b])
  }
  const y = g.op("MatMul", [x, g.op("Transpose", [w], { perm: Graph.ints([1, 0]) })])
  return b === undefined ? y : g.op("Add", [y, b])
}

/** Products with weights fed as inputs ({@link linear}): `rows()` is `[batch, seq, -1]`, the shape they restore. */
interface Fused {
  readonly rows: () => string
}

const msDomain = "com.microsoft"

/**
 * RMSNorm over the last axis: `x / sqrt(mean(x²) + eps) * w`.
 *
 * @category math
 * @since 0.1.0
 */
export const rmsNorm = (g: Graph.Graph, x: string, w: string, eps: number): string => {
  const ms = g.op("ReduceMean", [g.op("Mul", [x, x])], { axes: Graph.ints([-1]), keepdims: Graph.int(1) })
  const inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [ms, f32(g, eps)])])])
  return g.op("Mul", [g.op("Mul", [x, inv]), w])
}

/**
 * Each row's `max + log Σ exp(z − max)` of `[B, 1, V]` logits in float64, named `logsumexp` (`[B]`): the sampler's
 * normaliser. As separate nodes rather than `ReduceLogSumExp`, whose float64 path is scalar (0.84 vs 0.41 ms for
 * 151,936 entries); within 1e-13 of `Sampling.logSumExp`.
 */
const logSumExp = (g: Graph.Graph, logits: string): string => {
  const wide = g.op("Cast", [logits], { to: Graph.int(Graph.dataTypeCode.float64) })
  const max = g.op("ReduceMax", [wide], { axes: Graph.ints([1, 2]), keepdims: Graph.int(1) })
  const sum = g.op("ReduceSum", [g.op("Exp", [g.op("Sub", [wide, max])]), i64(g, [1, 2])], { keepdims: Graph.int(1) })
  return g.node("Reshape", [g.op("Add", [g.op("Log", [sum]), max]), i64(g, [-1])], ["logsumexp"])[0]!
}

/**
 * Rotary embedding on the last axis (width `hd`) in Hugging Face's rotate-half convention:
 * `[x1·cos − x2·sin, x2·cos + x1·sin]`, computed as `x·cos + rotateHalf(x)·sin` with full-width tables
 * (`cos`/`sin` of width `hd`, each half repeated, broadcasting against `x`) and `rotateHalf(x) = [−x2, x1] = x·R`
 * for a signed permutation matrix `R` (exact: one ±1 per column). Four ops and four in its gradient, where slicing
 * the halves and concatenating them took eight and eleven.
 *
 * @category math
 * @since 0.1.0
 */
export const rope = (g: Graph.Graph, x: string, cos: string, sin: string, hd: number): string => {
  const rotated = g.op("MatMul", [x, g.constant(rotateHalfMatrix(hd))])
  return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])
}

/** `R [hd, hd]` with `x·R = [−x2, x1]` for `x = [x1, x2]` (halves of width `hd/2`). */
const rotateHalfMatrix = (hd: number): Graph.TensorData => {
  const half = hd / 2
  const data = new Float32Array(hd * hd)
  for (let j = 0; j < half; j++) {
    data[(j + half) * hd + j] = -1 // output j (first half) = −x2[j]
    data[j * hd + j + half] = 1 // output half + j = x1[j]
  }
  return { dtype: "float32", dims: [hd, hd], data }
}

/**
 * Each rotary pair's wavelength over 2π, `1 / inv_freq` `[hd/2]`, in float64: `theta^(2j/hd)`, rescaled by
 * `rope_scaling` of type `llama3` (transformers' `_compute_llama3_parameters`: a wavelength above
 * `original_max_position_embeddings / low_freq_factor` is stretched by `factor`, one below
 * `original_max_position_embeddings / high_freq_factor` kept, and between them
 * `inv_freq · ((1 − s) / factor + s)` with `s = (original / wavelength − low) / (high − low)`).
 */
const ropePeriods = (c: ModelConfig.ModelConfig): Float64Array => {
  const hd = ModelConfig.headDim(c), half = hd / 2
  const periods = Float64Array.from({ length: half }, (_, j) => Math.pow(c.ropeTheta, (2 * j) / hd))
  const scaling = c.ropeScaling
  if (scaling?.ropeType !== "llama3") return periods
  const { factor, highFreqFactor, lowFreqFactor, originalMaxPositionEmbeddings: original } = scaling
  const lowFreqWavelen = original / lowFreqFactor, highFreqWavelen = original / highFreqFactor
  return periods.map((period) => {
    const wavelen = 2 * Math.PI * period
    if (wavelen < highFreqWavelen) return period
    if (wavelen > lowFreqWavelen) return period * factor
    const smooth = (original / wavelen - lowFreqFactor) / (highFreqFactor - lowFreqFactor)
    return period / ((1 - smooth) / factor + smooth)
  })
}

/**
 * RoPE's inverse frequencies `[hd/2]` (position `p` turns pair `j` by `p · inv_freq[j]`), with the config's
 * `rope_scaling` applied, in float64.
 *
 * @category math
 * @since 0.1.0
 */
export const ropeInverseFrequencies = (c: ModelConfig.ModelConfig): Float64Array =>
  ropePeriods(c).map((period) => 1 / period)

/**
 * The factors `rope_scaling` divides each unscaled inverse frequency by (`[hd/2]`, 1 where unchanged), as
 * llama.cpp's `rope_freqs.weight` holds them for Llama 3; `undefined` without scaling.
 *
 * @category math
 * @since 0.1.0
 */
export const ropeFrequencyFactors = (c: ModelConfig.ModelConfig): Float64Array | undefined => {
  if (c.ropeScaling?.ropeType !== "llama3") return undefined
  const hd = ModelConfig.headDim(c)
  return ropePeriods(c).map((period, j) => period / Math.pow(c.ropeTheta, (2 * j) / hd))
}

/**
 * Cos and sin tables `[maxPositions, hd/2]` for RoPE with base `theta` and the config's `rope_scaling`, computed
 * in float64.
 *
 * @category math
 * @since 0.1.0
 */
export const ropeTables = (c: ModelConfig.ModelConfig): { readonly cos: Float32Array; readonly sin: Float32Array } => {
  const periods = ropePeriods(c), half = periods.length, n = c.maxPositionEmbeddings
  const cos = new Float32Array(n * half), sin = new Float32Array(n * half)
  for (let p = 0; p < n; p++) {
    for (let j = 0; j < half; j++) {
      // A division, as before scaling existed: the presets' tables stay bit for bit.
      const angle = p / periods[j]!
      cos[p * half + j] = Math.cos(angle)
      sin[p * half + j] = Math.sin(angle)
    }
  }
  return { cos, sin }
}

/** A `[positions, hd/2]` table with each row's half repeated: `[positions, hd]`, for {@link rope}. */
const fullWidth = (table: Float32Array, hd: number): Float32Array => {
  const half = hd / 2
  const out = new Float32Array(table.length * 2)
  for (let p = 0; p < table.length / half; p++) {
    const row = table.subarray(p * half, (p + 1) * half)
    out.set(row, p * hd)
    out.set(row, p * hd + half)
  }
  return out
}

/** Shared per-forward values: RoPE factors and the additive attention mask. */
interface Context {
  readonly cos4: string // [B, 1, T, hd]
  readonly sin4: string
  readonly cos5: string // [B, T, 1, 1, hd]
  readonly sin5: string
  readonly maskBias: string // [B, 1, 1, T, P + T]: 0 where attention is allowed, -1e9 elsewhere
  /** With {@link ForwardOptions.groupedQueries}: the scores' shapes `[0, 0, G, T, P + T]` and `[0, 0, -1, P + T]`. */
  readonly grouped?: { readonly five: string; readonly four: string } | undefined
}

/** The shapes that {@link attend} reshapes a grouped layout's scores with, from the mask's dims. */
const groupedShapes = (g: Graph.Graph, c: ModelConfig.ModelConfig, maskBias: string): Context["grouped"] => {
  const G = c.numAttentionHeads / c.numKeyValueHeads
  const last = (start: number) => g.op("Shape", [maskBias], { start: Graph.int(start) })
  return {
    five: g.op("Concat", [i64(g, [0, 0, G]), last(3)], { axis: Graph.int(0) }),
    four: g.op("Concat", [i64(g, [0, 0, -1]), last(4)], { axis: Graph.int(0) })
  }
}

const context = (g: Graph.Graph, c: ModelConfig.ModelConfig, ids: string, mask: string, pos: string): Context => {
  const hd = ModelConfig.headDim(c), tables = ropeTables(c)
  const dims = [c.maxPositionEmbeddings, hd]
  const cosT = g.op("Gather", [g.constant({ dtype: "float32", dims, data: fullWidth(tables.cos, hd) }), pos])
  const sinT = g.op("Gather", [g.constant({ dtype: "float32", dims, data: fullWidth(tables.sin, hd) }), pos])
  const one = g.constant(Graph.int64([], [1])), zero = g.constant(Graph.int64([], [0]))
  const total = g.op("Gather", [g.op("Shape", [mask]), one], { axis: Graph.int(0) })
  const t = g.op("Gather", [g.op("Shape", [ids]), one], { axis: Graph.int(0) })
  const rows = g.op("Range", [g.op("Sub", [total, t]), total, one]) // absolute slots of the new tokens
  const cols = g.op("Range", [zero, total, one])
  const causal = g.op("LessOrEqual", [g.op("Unsqueeze", [cols, i64(g, [0])]), g.op("Unsqueeze", [rows, i64(g, [1])])])
  const pad = g.op("Unsqueeze", [g.op("Cast", [mask], { to: Graph.int(Graph.dataTypeCode.bool) }), i64(g, [1, 2, 3])])
  const allowed = g.op("And", [causal, pad])
  return {
    cos4: g.op("Unsqueeze", [cosT, i64(g, [1])]),
    sin4: g.op("Unsqueeze", [sinT, i64(g, [1])]),
    cos5: g.op("Unsqueeze", [cosT, i64(g, [2, 3])]),
    sin5: g.op("Unsqueeze", [sinT, i64(g, [2, 3])]),
    maskBias: g.op("Where", [allowed, f32(g, 0), f32(g, -1e9)])
  }
}

/** A LoRA adapter on a projection: its factors' value names and its scale. */
interface Adapted {
  readonly a: string
  readonly b: string
  readonly scale: number
  /** With dropout: the mask input the adapter's input is multiplied by (`Lora.dropoutMaskName`). */
  readonly mask?: string | undefined
}

/**
 * A parameter reference: a graph input or initializer name; with LoRA, also each adapted weight's adapter, and
 * `withRows` the same references for values whose rows are `rows` (a shared prompt's: `groups × prefix`).
 */
type Param = ((name: string) => string) & {
  readonly adapter?: (weight: string) => Adapted | undefined
  readonly withRows?: (rows: Lora.Rows) => Param
  /** Products with weights fed as inputs without a `Transpose` ({@link linear}). */
  readonly fused?: Fused | undefined
  /** Norms as onnxruntime's fused `SimplifiedLayerNormalization` kernel ({@link norm}): decode graphs only. */
  readonly kernels?: true
}

/**
 * The RMSNorm of `x` by the parameter `weight`: {@link rmsNorm}'s six nodes, or onnxruntime's one fused kernel where
 * `param` asks for it. A decode step at batch 1 runs ≈ 1,000 small nodes at a few µs each, so the 97 norms of
 * Qwen2.5-0.5B cost ≈ 2 ms a token as six nodes (of ≈ 74 ms); the kernel computes the same RMSNorm (parity with
 * llama.cpp is checked on it). The training graphs keep the six nodes: the autodiff differentiates those.
 */
const norm = (g: Graph.Graph, x: string, param: Param, weight: string, eps: number): string => {
  const w = param(weight)
  return param.kernels === true
    ? g.op("SimplifiedLayerNormalization", [x, w], { axis: Graph.int(-1), epsilon: Graph.float(eps) })
    : rmsNorm(g, x, w, eps)
}

/**
 * `x @ Wᵀ (+ b)` for the projection `weight`, plus its LoRA update `s · (x @ Aᵀ) @ Bᵀ` where it has an adapter
 * (PEFT's order: the base layer with its bias, then the update added). Without adapters the same nodes as
 * {@link linear}: the default graphs are unchanged.
 */
const project = (g: Graph.Graph, x: string, param: Param, weight: string, bias?: string): string => {
  const w = param(weight) // before the bias: graph inputs keep the order they had
  const fused = param.fused
  const y = linear(g, x, w, bias === undefined ? undefined : param(bias), fused)
  const adapted = param.adapter?.(weight)
  if (adapted === undefined) return y
  const input = adapted.mask === undefined ? x : g.op("Mul", [x, adapted.mask]) // PEFT's lora_dropout
  const down = linear(g, input, adapted.a, undefined, fused)
  const scaled = g.op("Mul", [down, f32(g, adapted.scale)]) // on the rank-wide values (r columns, not out)
  return g.op("Add", [y, linear(g, scaled, adapted.b, undefined, fused)])
}

/** Layer `i`'s rotated queries `[B, KV, G, T, hd]`, rotated keys and values `[B, KV, T, hd]` of normalised `h`. */
interface Projections {
  readonly q: string
  readonly k: string
  readonly v: string
}

const projections = (
  g: Graph.Graph,
  c: ModelConfig.ModelConfig,
  i: number,
  h: string,
  ctx: Context,
  param: Param
): Projections => {
  const hd = ModelConfig.headDim(c), KV = c.numKeyValueHeads, G = c.numAttentionHeads / KV
  const p = `model.layers.${i}.self_attn`
  const bias = (n: string) => (c.attentionBias ? `${p}.${n}_proj.bias` : undefined)
  // Qwen3 normalises each head of the queries and keys over its own width, before RoPE (Qwen3Attention).
  const headNorm = (x: string, n: string) =>
    ModelConfig.hasQkNorm(c) ? norm(g, x, param, `${p}.${n}_norm.weight`, c.rmsNormEps) : x
  const q = headNorm(
    g.op("Reshape", [project(g, h, param, `${p}.q_proj.weight`, bias("q")), i64(g, [0, 0, KV, G, hd])]),
    "q"
  )
  const k = headNorm(
    g.op("Reshape", [project(g, h, param, `${p}.k_proj.weight`, bias("k")), i64(g, [0, 0, KV, hd])]),
    "k"
  )
  const v = g.op("Reshape", [project(g, h, param, `${p}.v_proj.weight`, bias("v")), i64(g, [0, 0, KV, hd])])
  return {
    q: g.op("Transpose", [rope(g, q, ctx.cos5, ctx.sin5, hd)], { perm: Graph.ints([0, 2, 3, 1, 4]) }),
    // Keys are rotated after the head transpose, so that no other Transpose precedes the one in `kT` below.
    k: rope(g, g.op("Transpose", [k], { perm: Graph.ints([0, 2, 1, 3]) }), ctx.cos4, ctx.sin4, hd),
    v: g.op("Transpose", [v], { perm: Graph.ints([0, 2, 1, 3]) })
  }
}

/**
 * Layer `i`'s attention output (after `o_proj`) for projected tokens, over themselves and, with `past`, over a
 * decoding cache's keys and values before them (`[B, KV, P, hd]`).
 */
const attend = (
  g: Graph.Graph,
  c: ModelConfig.ModelConfig,
  i: number,
  { k, q, v }: Projections,
  ctx: Context,
  param: Param,
  past?: { readonly key: string; readonly value: string }
): string => {
  const hd = ModelConfig.headDim(c)
  const scale = 1 / Math.sqrt(hd)
  // A power-of-two scale (hd 16, 64, 256: Qwen2.5-0.5B, Llama-3.2-1B) is exact on either side of the product: it
  // scales the queries `[…, T, hd]` instead of the scores `[…, T, T]`, the same bits with hd/T of the products, in
  // the forward and in the backward. Other head widths (the presets' 32) keep the scale on the scores.
  const exact = Number.isInteger(Math.log2(scale))
  const queries = exact ? g.op("Mul", [q, f32(g, scale)]) : q
  if (ctx.grouped !== undefined && past === undefined) return attendGrouped(g, c, i, queries, k, v, ctx, param, exact)
  // Unsqueeze, then swap the last two axes: onnxruntime folds this swap into the product (FusedMatMul) where a
  // merged Transpose moving the time axis last was a strided copy, and the learner's MatMul rule recognises Xᵀ.
  const scoresWith = (keys: string) => {
    const kT = g.op("Transpose", [g.op("Unsqueeze", [keys, i64(g, [2])])], { perm: Graph.ints([0, 1, 2, 4, 3]) })
    const scores = g.op("MatMul", [queries, kT])
    return exact ? scores : g.op("Mul", [scores, f32(g, scale)])
  }
  const weighted = (probs: string, values: string) => g.op("MatMul", [probs, g.op("Unsqueeze", [values, i64(g, [2])])])
  let o: string // [B, KV, G, T, hd]
  if (past === undefined) {
    o = weighted(g.op("Softmax", [g.op("Add", [scoresWith(k), ctx.maskBias])], { axis: Graph.int(-1) }), v)
  } else {
    // Attention over the cache and the new tokens without concatenating them: only the scores (one per cached
    // slot) are joined.
    const scores = g.op("Concat", [scoresWith(past.key), scoresWith(k)], { axis: Graph.int(-1) })
    const probs = g.op("Softmax", [g.op("Add", [scores, ctx.maskBias])], { axis: Graph.int(-1) })
    const cached = g.op("Gather", [g.op("Shape", [past.key]), i64(g, [2])], { axis: Graph.int(0) })
    const last = i64(g, [-1])
    const toCache = g.op("Slice", [probs, i64(g, [0]), cached, last])
    const toNew = g.op("Slice", [probs, cached, i64(g, [2 ** 62]), last])
    o = g.op("Add", [weighted(toCache, past.value), weighted(toNew, v)])
  }
  const merged = g.op("Reshape", [g.op("Transpose", [o], { perm: Graph.ints([0, 3, 1, 2, 4]) }), i64(g, [0, 0, -1])])
  return project(g, merged, param, `model.layers.${i}.self_attn.o_proj.weight`)
}

/**
 * {@link attend} without a cache, with each KV head's G query heads as the rows of one product (`[B, KV, G·T, hd]`
 * against `[B, KV, hd, T]`) instead of G products of T rows broadcast over the group axis: 4 products a layer at
 * Qwen2.5-0.5B's shapes, not 28, and the keys' and values' gradients summed over the group inside their products
 * (not a ReduceSum after). Large models' training graphs only ({@link ForwardOptions.groupedQueries}): the sums of
 * the keys' and values' gradients are ordered differently.
 */
const attendGrouped = (
  g: Graph.Graph,
  c: ModelConfig.ModelConfig,
  i: number,
  queries: string,
  k: string,
  v: string,
  ctx: Context,
  param: Param,
  exact: boolean
): string => {
  const hd = ModelConfig.headDim(c)
  const { five, four } = ctx.grouped!
  const rows = g.op("Reshape", [queries, i64(g, [0, 0, -1, hd])])
  const kT = g.op("Transpose", [k], { perm: Graph.ints([0, 1, 3, 2]) })
  const product = g.op("Reshape", [g.op("MatMul", [rows, kT]), five])
  const scores = exact ? product : g.op("Mul", [product, f32(g, 1 / Math.sqrt(hd))])
  const probs = g.op("Softmax", [g.op("Add", [scores, ctx.maskBias])], { axis: Graph.int(-1) })
  const o = g.op("MatMul", [g.op("Reshape", [probs, four]), v]) // [B, KV, G·T, hd]
  const heads = g.op("Reshape", [o, i64(g, [0, 0, c.numAttentionHeads / c.numKeyValueHeads, -1, hd])])
  const merged = g.op("Transpose", [heads], { perm: Graph.ints([0, 3, 1, 2, 4]) })
  return project(g, g.op("Reshape", [merged, i64(g, [0, 0, -1])]), param, `model.layers.${i}.self_attn.o_proj.weight`)
}

/**
 * Grouped-query self-attention of layer `i` on normalised `h [B, T, D]`. Query head `kv·G + j` shares KV head `kv`
 * (Hugging Face's `repeat_kv` order); keys and values are never repeated in memory: queries are shaped
 * `[B, KV, G, T, hd]` and MatMul broadcasts over the group axis. With `past`, the new tokens attend to the cache
 * and to themselves, and their keys/values are returned as `new` (only they leave the graph).
 *
 * @category math
 * @since 0.1.0
 */
export const attention = (
  g: Graph.Graph,
  c: ModelConfig.ModelConfig,
  i: number,
  h: string,
  ctx: Context,
  param: Param,
  past?: { readonly key: string; readonly value: string; readonly newKey: string; readonly newValue: string }
): string => {
  const projected = projections(g, c, i, h, ctx, param)
  // Only the new keys and values leave the graph: returning the whole cache cost 17 of the 25 ms of a batch-64
  // decode step at 200 cached slots (onnxruntime-node copies every output out).
  if (past !== undefined) {
    g.node("Identity", [projected.k], [past.newKey])
    g.node("Identity", [projected.v], [past.newValue])
  }
  return attend(g, c, i, projected, ctx, param, past)
}

/**
 * SwiGLU MLP of layer `i`: `down(silu(gate(h)) · up(h))`.
 *
 * @category math
 * @since 0.1.0
 */
export const mlp = (g: Graph.Graph, i: number, h: string, param: Param): string => {
  const p = `model.layers.${i}.mlp`
  const gate = project(g, h, param, `${p}.gate_proj.weight`)
  const silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
  return project(g, g.op("Mul", [silu, project(g, h, param, `${p}.up_proj.weight`)]), param, `${p}.down_proj.weight`)
}

// ===== Forward graphs =====

/**
 * @category models
 * @since 0.1.0
 */
export interface ForwardOptions {
  /** Emit `past.*` inputs and `new.*` outputs. */
  readonly kvCache: boolean
  /** `"inputs"`: every weight is a graph input; a `Weights` map: weights are baked in as initializers. */
  readonly weights: "inputs" | Weights
  /** Compute logits for the last position only (`[B, 1, V]`), as decoding needs. */
  readonly lastTokenOnly?: boolean
  /** The output head (default `lm`); `value` gives `logits [B, T, 1]`, the values. */
  readonly head?: Head
  /**
   * LoRA adapters (`Lora.ts`) on the targeted projections, as graph inputs with PEFT's names. With weights as
   * `"inputs"`, the base weights stay graph inputs but are frozen: only the adapters are `weightInputs`, the ones
   * the learner's autodiff differentiates.
   */
  readonly lora?: Lora.Config | undefined
  /**
   * Replaces token embeddings before learned positions are added (`[B, T, D]` in and out): the vision tower's
   * image tokens at their `<|image_pad|>` positions (`VisionTower.ts`). Absent, no node is emitted.
   */
  readonly tokenEmbeddings?: ((g: Graph.Graph, embedded: string) => string) | undefined
  /**
   * Every product with a weight as com.microsoft `FusedMatMul(x, W, transB = 1)` rather than `MatMul(x,
   * Transpose(W))`: for a decode graph fed its weights as inputs, where each `Transpose` would run on every step, and
   * for a large model's weight initializers, which onnxruntime then pre-packs without folding a transposed copy.
   */
  readonly fusedProducts?: boolean
  /**
   * A decode graph for onnxruntime's fused kernels: norms as `SimplifiedLayerNormalization` and, with
   * `lastTokenOnly`, a float64 `logsumexp [B]` output of each row's logits (the sampler's normaliser, computed by
   * onnxruntime instead of 151,936 `Math.exp` calls in JavaScript, ≈ 2.4 ms a token). Not for training graphs.
   */
  readonly fusedKernels?: boolean
  /**
   * Attention without a cache with each KV head's query heads as the rows of one product ({@link attendGrouped}):
   * training graphs of large models ({@link isLarge}); it orders the keys' and values' gradient sums differently.
   */
  readonly groupedQueries?: boolean
}

/**
 * Whether `c` has at least 50 M parameters: real checkpoints and the `medium` preset, not the `tiny` and `small`
 * presets whose training arithmetic the README's figures depend on (the threshold of `Autodiff.isLargeModel` and of
 * the decode engine's fused kernels).
 *
 * @category guards
 * @since 0.1.0
 */
export const isLarge = (c: ModelConfig.ModelConfig): boolean =>
  parameters(c).reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0) >= 50e6

/**
 * Names of the values {@link forward} produced.
 *
 * @category models
 * @since 0.1.0
 */
export interface ForwardOutputs {
  readonly logits: string
  /** Graph input names of the weights (empty when they are initializers). */
  readonly weightInputs: ReadonlyArray<string>
}

/**
 * Emits the full forward pass into `g`, declaring its inputs and outputs (see the module notes for names and
 * shapes). Fails with a defect when a `Weights` map lacks a parameter or has a wrongly sized one; use
 * `ModelFolder`/`Safetensors` validation before building a graph from untrusted files.
 *
 * @category constructors
 * @since 0.1.0
 */
export const forward = (g: Graph.Graph, c: ModelConfig.ModelConfig, options: ForwardOptions): ForwardOutputs => {
  const output = options.head ?? "lm"
  const { param, weightInputs } = paramsOf(g, c, options.weights, output, options.lora, {
    masks: !options.kvCache,
    fused: options.fusedProducts === true,
    kernels: options.fusedKernels === true
  })
  const ids = g.input("input_ids", "int64", ["batch", "seq"])
  const mask = g.input("attention_mask", "int64", ["batch", options.kvCache ? "total" : "seq"])
  const pos = g.input("position_ids", "int64", ["batch", "seq"])
  const plain = context(g, c, ids, mask, pos)
  const grouped = options.groupedQueries === true && !options.kvCache
  const ctx = grouped ? { ...plain, grouped: groupedShapes(g, c, plain.maskBias) } : plain
  const hd = ModelConfig.headDim(c), KV = c.numKeyValueHeads
  let x = embed(g, c, ids, pos, param, options.tokenEmbeddings)
  for (let i = 0; i < c.numHiddenLayers; i++) {
    const p = `model.layers.${i}`
    const past = options.kvCache ?
      {
        key: g.input(`past.${i}.key`, "float32", ["batch", KV, "past", hd]),
        value: g.input(`past.${i}.value`, "float32", ["batch", KV, "past", hd]),
        newKey: `new.${i}.key`,
        newValue: `new.${i}.value`
      } :
      undefined
    const h = norm(g, x, param, `${p}.input_layernorm.weight`, c.rmsNormEps)
    x = g.op("Add", [x, attention(g, c, i, h, ctx, param, past)])
    x = g.op("Add", [x, mlpBlock(g, c, i, x, param)])
    if (past !== undefined) {
      g.output(past.newKey, "float32", ["batch", KV, "seq", hd])
      g.output(past.newValue, "float32", ["batch", KV, "seq", hd])
    }
  }
  if (options.lastTokenOnly === true) x = g.op("Slice", [x, i64(g, [-1]), i64(g, [2 ** 62]), i64(g, [1])])
  const logits = head(g, c, x, param, output)
  g.output(logits, "float32", [
    "batch",
    options.lastTokenOnly === true ? 1 : "seq",
    output === "value" ? 1 : c.vocabSize
  ])
  if (options.fusedKernels === true && options.lastTokenOnly === true && output === "lm") {
    g.output(logSumExp(g, logits), "float64", ["batch"])
  }
  return { logits, weightInputs }
}

/**
 * The training-shaped forward of a GRPO group's chains sharing their prompt: the prompts' tokens run once,
 * `prefix_ids [groups, prefix]` (`prefix_mask` 1 on real tokens, `prefix_positions`), and each chain's own tokens,
 * `input_ids [batch, seq]` (`attention_mask`, `position_ids` continuing its prompt's), attend to their prompt's keys
 * and values (`prefix_index [batch]`: which prompt) and to themselves, as a decoding step attends to its cache.
 * Logits `[batch, seq, V]` for the chains' tokens only: a prompt's tokens carry no loss. The maths of every token
 * are those of {@link trainingGraph} on the prompt and the chain in one row; the prompts' projections, attention
 * and MLP run once per group instead of once per chain.
 *
 * @category constructors
 * @since 0.1.0
 */
export const sharedPrefixGraph = (
  c: ModelConfig.ModelConfig,
  output: Head = "lm",
  lora?: Lora.Config
): { readonly graph: Graph.Graph } & ForwardOutputs => {
  const g = Graph.make(output === "value" ? "qwen2_value_train_shared" : "qwen2_train_shared")
  const { param, weightInputs } = paramsOf(g, c, "inputs", output, lora)
  const ofPrefix = param.withRows?.(["groups", "prefix"]) ?? param // the prompts' rows (their dropout masks)
  const prefixIds = g.input("prefix_ids", "int64", ["groups", "prefix"])
  const prefixMask = g.input("prefix_mask", "int64", ["groups", "prefix"])
  const prefixPos = g.input("prefix_positions", "int64", ["groups", "prefix"])
  const ids = g.input("input_ids", "int64", ["batch", "seq"])
  const mask = g.input("attention_mask", "int64", ["batch", "seq"])
  const pos = g.input("position_ids", "int64", ["batch", "seq"])
  const index = g.input("prefix_index", "int64", ["batch"])
  const ofChain = (value: string) => g.op("Gather", [value, index], { axis: Graph.int(0) })
  const prefixCtx = context(g, c, prefixIds, prefixMask, prefixPos)
  // A chain's mask covers its prompt's slots then its own: the decoding layout, with the prompt as the cache.
  const ctx = context(g, c, ids, g.op("Concat", [ofChain(prefixMask), mask], { axis: Graph.int(1) }), pos)
  let prefix = embed(g, c, prefixIds, prefixPos, param)
  let x = embed(g, c, ids, pos, param)
  for (let i = 0; i < c.numHiddenLayers; i++) {
    const norm = param(`model.layers.${i}.input_layernorm.weight`)
    const shared = projections(g, c, i, rmsNorm(g, prefix, norm, c.rmsNormEps), prefixCtx, ofPrefix)
    const own = projections(g, c, i, rmsNorm(g, x, norm, c.rmsNormEps), ctx, param)
    // The prompt's keys and values joined before the chain's own: the gradient of a Concat of keys is a Split of
    // keys, where joining the scores (as decoding does) made it a Pad of every score (1.4 s of 9.4 s profiled).
    const keys = g.op("Concat", [ofChain(shared.k), own.k], { axis: Graph.int(2) })
    const values = g.op("Concat", [ofChain(shared.v), own.v], { axis: Graph.int(2) })
    x = g.op("Add", [x, attend(g, c, i, { q: own.q, k: keys, v: values }, ctx, param)])
    x = g.op("Add", [x, mlpBlock(g, c, i, x, param)])
    // The last layer needs only the prompt's keys and values.
    if (i + 1 < c.numHiddenLayers) {
      prefix = g.op("Add", [prefix, attend(g, c, i, shared, prefixCtx, ofPrefix)])
      prefix = g.op("Add", [prefix, mlpBlock(g, c, i, prefix, ofPrefix)])
    }
  }
  const logits = head(g, c, x, param, output)
  g.output(logits, "float32", ["batch", "seq", output === "value" ? 1 : c.vocabSize])
  return { graph: g, logits, weightInputs }
}

/** Token (and learned position) embeddings of `ids`; `replace` swaps some token embeddings (image tokens). */
const embed = (
  g: Graph.Graph,
  c: ModelConfig.ModelConfig,
  ids: string,
  pos: string,
  param: Param,
  replace?: (g: Graph.Graph, embedded: string) => string
): string => {
  const gathered = g.op("Gather", [param("model.embed_tokens.weight"), ids], { axis: Graph.int(0) })
  const x = replace === undefined ? gathered : replace(g, gathered)
  if (!c.learnedPositions) return x
  return g.op("Add", [x, g.op("Gather", [param("model.embed_positions.weight"), pos], { axis: Graph.int(0) })])
}

/** Layer `i`'s MLP on its normalised input (the residual is the caller's). */
const mlpBlock = (g: Graph.Graph, c: ModelConfig.ModelConfig, i: number, x: string, param: Param): string =>
  mlp(g, i, norm(g, x, param, `model.layers.${i}.post_attention_layernorm.weight`, c.rmsNormEps), param)

/** The final norm and the output head: `logits` (the values, for a value head). */
const head = (g: Graph.Graph, c: ModelConfig.ModelConfig, x: string, param: Param, output: Head = "lm"): string => {
  const normed = norm(g, x, param, "model.norm.weight", c.rmsNormEps)
  const w = param(
    output === "value" ? "value_head.weight" : c.tieWordEmbeddings ? "model.embed_tokens.weight" : "lm_head.weight"
  )
  if (param.fused !== undefined) {
    // The head's input may be the last position only: its own rows' shape.
    const shape = g.op("Concat", [g.op("Slice", [g.op("Shape", [normed]), i64(g, [0]), i64(g, [2])]), i64(g, [-1])], {
      axis: Graph.int(0)
    })
    return g.node("Identity", [linear(g, normed, w, undefined, { rows: () => shape })], ["logits"])[0]!
  }
  return g.node("MatMul", [normed, g.op("Transpose", [w], { perm: Graph.ints([1, 0]) })], ["logits"])[0]!
}

/**
 * Weight references: graph inputs (declared on first use, in order) or initializers from `weights`. With `lora`,
 * the adapters are graph inputs too, and with weights as inputs only they are `weightInputs` (the base is frozen).
 */
const paramsOf = (
  g: Graph.Graph,
  c: ModelConfig.ModelConfig,
  weights: "inputs" | Weights,
  output: Head = "lm",
  lora?: Lora.Config,
  how: { readonly masks: boolean; readonly fused: boolean; readonly kernels?: boolean } = { masks: true, fused: false }
): { readonly param: Param; readonly weightInputs: Array<string> } => {
  const specs = new Map<string, { readonly shape: ReadonlyArray<number> }>(
    parameters(c, output).map((s) => [s.name, s])
  )
  const weightInputs: Array<string> = []
  const declared = new Set<string>()
  const options = { weights }
  const input = (name: string, trained: boolean) => {
    if (declared.has(name)) return name
    declared.add(name)
    g.input(name, "float32", specs.get(name)!.shape)
    if (trained) weightInputs.push(name)
    return name
  }
  const adapters = new Map(
    lora === undefined ? [] : Lora.sites(c, lora).map((site) => [site.weight, site] as const)
  )
  if (lora !== undefined) for (const p of Lora.parameters(c, lora)) specs.set(p.name, p)
  // Dropout masks are inputs of the training graphs only (the trainer feeds them; decoding has none).
  const dropout = lora !== undefined && (lora.dropout ?? 0) > 0 && weights === "inputs" && how.masks
  const adapterOf = (rows: Lora.Rows) => (weight: string): Adapted | undefined => {
    const site = adapters.get(weight)
    if (site === undefined || lora === undefined) return undefined
    const adapted = { a: input(site.a, true), b: input(site.b, true), scale: Lora.scaling(lora) }
    if (!dropout) return adapted
    const mask = Lora.dropoutMaskName(rows, weight)
    if (!declared.has(mask)) {
      declared.add(mask)
      g.input(mask, "float32", [...rows, site.inFeatures])
    }
    return { ...adapted, mask }
  }
  const plain = (name: string): string => {
    const spec = specs.get(name)!
    if (options.weights === "inputs") return input(name, lora === undefined)
    if (g.initializers.has(name)) return name
    const data = options.weights.get(name)
    const n = spec.shape.reduce((a, b) => a * b, 1)
    if (data === undefined || data.length !== n) {
      throw new Error(`weight ${name}: expected ${n} floats [${spec.shape.join(", ")}], got ${data?.length ?? "none"}`)
    }
    return g.initializer(name, { dtype: "float32", dims: spec.shape, data })
  }
  // `[batch, seq, -1]` of the tokens' rows, made on first use.
  let rows: string | undefined
  const fused: Fused | undefined = !how.fused ? undefined : {
    rows: () =>
      rows ??= g.op("Concat", [g.op("Shape", ["input_ids"]), i64(g, [-1])], { axis: Graph.int(0) })
  }
  const withRows = (rows: Lora.Rows): Param =>
    Object.assign((name: string) => plain(name), { adapter: adapterOf(rows), fused })
  const param: Param = lora === undefined
    ? fused !== undefined ? Object.assign(plain, { fused }) : plain
    : Object.assign(plain, { adapter: adapterOf(["batch", "seq"]), withRows, fused })
  return { param: how.kernels === true ? Object.assign(param, { kernels: true as const }) : param, weightInputs }
}

/**
 * The training-shaped forward the learner differentiates: no KV cache, weights as graph inputs, logits for every
 * position `[B, T, V]`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const trainingGraph = (
  c: ModelConfig.ModelConfig,
  output: Head = "lm",
  lora?: Lora.Config
): { readonly graph: Graph.Graph } & ForwardOutputs => {
  const graph = Graph.make(output === "value" ? "qwen2_value_train" : "qwen2_train")
  const groupedQueries = isLarge(c)
  return { graph, ...forward(graph, c, { kvCache: false, weights: "inputs", head: output, lora, groupedQueries }) }
}

/**
 * The sampler's graph: KV cache, last-position logits, weights as initializers (or inputs).
 *
 * With `lora`, the LoRA decode graph instead: the base and the adapters are all graph inputs (a version's engine
 * feeds the base's arrays as they are and swaps only the adapter), each targeted projection computes
 * `x·Wᵀ + s·(x·Aᵀ)·Bᵀ`, and every product with a weight is a `FusedMatMul` with `transB = 1`, so that no
 * `Transpose` of a weight runs per step. With `fused` (and weights as `"inputs"`) the same products without an
 * adapter: the full fine-tuning engine that feeds a published version's arrays. Without either the graph is exactly
 * the one it always was. `kernels`: onnxruntime's fused kernels and the `logsumexp` output
 * ({@link ForwardOptions.fusedKernels}), which real models' engines decode with.
 *
 * @category constructors
 * @since 0.1.0
 */
export const inferenceGraph = (
  c: ModelConfig.ModelConfig,
  weights: "inputs" | Weights,
  lora?: Lora.Config,
  fused = false,
  kernels = false
): Graph.Graph => {
  if (lora === undefined && !(fused && weights === "inputs")) {
    const graph = Graph.make("qwen2_decode")
    forward(graph, c, { kvCache: true, weights, lastTokenOnly: true, fusedKernels: kernels })
    return graph
  }
  const graph = Graph.make(lora === undefined ? "qwen2_fused_decode" : "qwen2_lora_decode")
  forward(graph, c, {
    kvCache: true,
    weights: "inputs",
    lastTokenOnly: true,
    lora,
    fusedProducts: true,
    fusedKernels: kernels
  })
  return graph
}

/**
 * Position ids for a row of the attention mask: each real token's index among the real tokens so far (padding
 * gets 0). Left-padded and right-padded rows both get positions 0, 1, 2, … on their real tokens.
 *
 * @category math
 * @since 0.1.0
 */
export const positionIds = (mask: ArrayLike<number>): Array<number> => {
  let n = 0
  return Array.from({ length: mask.length }, (_, i) => (mask[i] ? n++ : 0))
}
