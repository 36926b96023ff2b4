/**
 * The configuration of the decoder, read from and written to a Hugging Face `config.json` as the three families
 * agents use publish it: Qwen2/Qwen2.5 (`model_type: "qwen2"`, `Qwen2ForCausalLM`), Qwen3 (`"qwen3"`,
 * `Qwen3ForCausalLM`: per-head q/k RMSNorm, `head_dim` independent of the width) and Llama 3.x / SmolLM2
 * (`"llama"`, `LlamaForCausalLM`, `rope_scaling` of type `llama3`); plus the `tiny`, `small` and `medium` presets
 * of the embedded policy.
 *
 * Decoding reads every key these models publish. What the graph cannot compute (another `model_type` or
 * architecture, an active sliding window smaller than the positions, a rope type other than `default` and `llama3`,
 * another activation, MLP or output-projection biases, transformers 5's `rope_parameters`) is refused before any
 * work, with a message naming the key, its value and what is supported. Keys that change nothing the graph computes
 * (`initializer_range`, `use_cache`, `pretraining_tp`, …) stay ignored.
 *
 * @since 0.1.0
 */
import { Effect, Schema, SchemaTransformation } from "effect"

const PositiveInt = Schema.Int.check(Schema.isGreaterThan(0))
const PositiveNumber = Schema.Number.check(Schema.isGreaterThan(0))
const TokenIds = Schema.Union([Schema.Int, Schema.Array(Schema.Int)])

/**
 * The families the graph computes, by `model_type`, with the architecture each publishes.
 *
 * @category models
 * @since 0.1.0
 */
export const architectures = {
  qwen2: "Qwen2ForCausalLM",
  qwen3: "Qwen3ForCausalLM",
  llama: "LlamaForCausalLM"
} as const

/**
 * A `model_type` the graph computes.
 *
 * @category models
 * @since 0.1.0
 */
export type Family = keyof typeof architectures

const families = Object.keys(architectures) as ReadonlyArray<Family>
const ropeTypes = ["default", "llama3"] as const

/**
 * `rope_scaling` of type `llama3` (Llama 3.1–3.3): inverse frequencies with a wavelength above
 * `originalMaxPositionEmbeddings / lowFreqFactor` are divided by `factor`, those below
 * `originalMaxPositionEmbeddings / highFreqFactor` kept, and those between interpolated smoothly (transformers'
 * `_compute_llama3_parameters`).
 *
 * @category models
 * @since 0.1.0
 */
export const Llama3RopeScaling = Schema.Struct({
  ropeType: Schema.Literal("llama3"),
  factor: PositiveNumber,
  lowFreqFactor: PositiveNumber,
  highFreqFactor: PositiveNumber,
  originalMaxPositionEmbeddings: PositiveInt
}).pipe(Schema.encodeKeys({
  ropeType: "rope_type",
  lowFreqFactor: "low_freq_factor",
  highFreqFactor: "high_freq_factor",
  originalMaxPositionEmbeddings: "original_max_position_embeddings"
}))

/**
 * `rope_scaling`: `null` or `{ rope_type: "default" }` (plain RoPE), or {@link Llama3RopeScaling}. A `type` key
 * (the older spelling) is read as `rope_type`.
 *
 * @category models
 * @since 0.1.0
 */
export const RopeScaling = Schema.Union([
  Schema.Struct({ ropeType: Schema.Literal("default") }).pipe(Schema.encodeKeys({ ropeType: "rope_type" })),
  Llama3RopeScaling
])
export type RopeScaling = typeof RopeScaling.Type

const Fields = Schema.Struct({
  modelType: Schema.Literals(families),
  vocabSize: PositiveInt,
  hiddenSize: PositiveInt,
  numHiddenLayers: PositiveInt,
  numAttentionHeads: PositiveInt,
  numKeyValueHeads: PositiveInt,
  intermediateSize: PositiveInt,
  maxPositionEmbeddings: PositiveInt,
  ropeTheta: PositiveNumber.pipe(Schema.withDecodingDefaultKey(Effect.succeed(10000))),
  rmsNormEps: PositiveNumber.pipe(Schema.withDecodingDefaultKey(Effect.succeed(1e-6))),
  tieWordEmbeddings: Schema.Boolean.pipe(Schema.withDecodingDefaultKey(Effect.succeed(false))),
  /**
   * Biases on the q, k and v projections. Qwen2 has them and its `config.json` omits the key (default `true` for
   * `qwen2`); Qwen3 and Llama publish `false` (their default), and `true` there (which would add an `o_proj` bias
   * too) is refused.
   */
  attentionBias: Schema.Boolean.pipe(Schema.withDecodingDefaultKey(Effect.succeed(true))),
  /**
   * Adds learned absolute position embeddings (`model.embed_positions.weight`, GPT-2 style) to the token
   * embeddings, on top of RoPE. Not part of any published family (our own extension); off by default. Tiny
   * byte-level policies learn to copy digit strings from their context much sooner with them.
   */
  learnedPositions: Schema.Boolean.pipe(Schema.withDecodingDefaultKey(Effect.succeed(false))),
  bosTokenId: Schema.optionalKey(TokenIds),
  eosTokenId: Schema.optionalKey(TokenIds),
  /** Per-head width when the model gives it (Qwen3: 128 at width 1024 with 16 heads); see {@link headDim}. */
  headDim: Schema.optionalKey(PositiveInt),
  ropeScaling: Schema.optionalKey(Schema.NullOr(RopeScaling)),
  /** The dtype the published weights are stored in (`bfloat16`, …; absent: `float32`), for an exporter. */
  torchDtype: Schema.optionalKey(Schema.String),
  /** Qwen's sliding-window keys, kept for the round trip; an active window must cover every position. */
  useSlidingWindow: Schema.optionalKey(Schema.Boolean),
  slidingWindow: Schema.optionalKey(Schema.NullOr(PositiveInt)),
  maxWindowLayers: Schema.optionalKey(Schema.Int)
})

const shapeCheck = Schema.makeFilter<typeof Fields.Type>((c) => {
  const issues: Array<string> = []
  // Kept with an explicit head_dim too (every published model of these families has it): a folder whose head
  // count was edited is refused here rather than at its weights' shapes.
  if (c.hiddenSize % c.numAttentionHeads !== 0) {
    issues.push(`hidden_size ${c.hiddenSize} is not a multiple of num_attention_heads ${c.numAttentionHeads}`)
  } else if (headDim(c) % 2 !== 0) {
    issues.push(`head dimension ${headDim(c)} must be even for rotary embeddings`)
  }
  if (c.numAttentionHeads % c.numKeyValueHeads !== 0) {
    issues.push(
      `num_attention_heads ${c.numAttentionHeads} is not a multiple of num_key_value_heads ${c.numKeyValueHeads}`
    )
  }
  if (c.ropeScaling?.ropeType === "llama3" && c.ropeScaling.highFreqFactor <= c.ropeScaling.lowFreqFactor) {
    issues.push(
      `rope_scaling.high_freq_factor ${c.ropeScaling.highFreqFactor} must be greater than low_freq_factor ` +
        `${c.ropeScaling.lowFreqFactor}`
    )
  }
  return issues
})

const Config = Fields.check(shapeCheck).pipe(Schema.encodeKeys({
  modelType: "model_type",
  vocabSize: "vocab_size",
  hiddenSize: "hidden_size",
  numHiddenLayers: "num_hidden_layers",
  numAttentionHeads: "num_attention_heads",
  numKeyValueHeads: "num_key_value_heads",
  intermediateSize: "intermediate_size",
  maxPositionEmbeddings: "max_position_embeddings",
  ropeTheta: "rope_theta",
  rmsNormEps: "rms_norm_eps",
  tieWordEmbeddings: "tie_word_embeddings",
  attentionBias: "attention_bias",
  learnedPositions: "learned_position_embeddings",
  bosTokenId: "bos_token_id",
  eosTokenId: "eos_token_id",
  headDim: "head_dim",
  ropeScaling: "rope_scaling",
  torchDtype: "torch_dtype",
  useSlidingWindow: "use_sliding_window",
  slidingWindow: "sliding_window",
  maxWindowLayers: "max_window_layers"
}))

// ===== Refusals =====

const show = (value: unknown): string => JSON.stringify(value) ?? String(value)
const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)
const isFamily = (u: unknown): u is Family => typeof u === "string" && (families as ReadonlyArray<string>).includes(u)

/** Vision-language families, refused with one message that says why and what the embedded tower is instead. */
const visionLanguage: Readonly<Record<string, string>> = {
  qwen2_vl: "Qwen2VLForConditionalGeneration",
  qwen2_5_vl: "Qwen2_5_VLForConditionalGeneration"
}

const visionRefusal = (raw: Record<string, unknown>): string | undefined => {
  const type = raw["model_type"]
  const named = Array.isArray(raw["architectures"]) ? raw["architectures"] : []
  const architecture = named.find((a) => Object.values(visionLanguage).includes(a)) ??
    (typeof type === "string" ? visionLanguage[type] : undefined)
  if (architecture === undefined) return undefined
  return `architectures ${show(architecture)} (model_type ${show(type)}) is a vision-language model this engine ` +
    `does not read: its tower's window attention and its language model's M-RoPE (rope_scaling "mrope") are not ` +
    `computed here; the embedded vision tower (src/model/VisionTower.ts, preset "tiny-vl") attends over whole ` +
    `images with 1-D text positions. Supported: ${Object.values(architectures).join(", ")}`
}

/** What a published `config.json` asks for that the graph cannot compute: one message per key. */
const refusals = (raw: Record<string, unknown>): Array<string> => {
  const vision = visionRefusal(raw)
  if (vision !== undefined) return [vision]
  const issues: Array<string> = []
  const type = raw["model_type"]
  if (type !== undefined && !isFamily(type)) {
    issues.push(`model_type ${show(type)} is not supported (supported: ${families.join(", ")})`)
  }
  const known = Object.values(architectures) as ReadonlyArray<string>
  if (Array.isArray(raw["architectures"])) {
    for (const a of raw["architectures"]) {
      if (!known.includes(a)) {
        issues.push(`architectures ${show(a)} is not supported (supported: ${known.join(", ")})`)
      } else if (isFamily(type) && a !== architectures[type]) {
        issues.push(`architectures ${show(a)} does not match model_type "${type}" (expected "${architectures[type]}")`)
      }
    }
  }
  if (raw["hidden_act"] !== undefined && raw["hidden_act"] !== "silu") {
    issues.push(`hidden_act ${show(raw["hidden_act"])} is not supported (supported: silu)`)
  }
  if (raw["mlp_bias"] !== undefined && raw["mlp_bias"] !== false) {
    issues.push(`mlp_bias ${show(raw["mlp_bias"])} is not supported (supported: false)`)
  }
  if (raw["attention_bias"] === true && isFamily(type) && type !== "qwen2") {
    issues.push(`attention_bias true is not supported for model_type "${type}" (supported: false)`)
  }
  if (raw["rope_parameters"] !== undefined) {
    issues.push(
      `rope_parameters ${show(raw["rope_parameters"])} is not supported (supported: rope_theta and rope_scaling, ` +
        `transformers 4's layout)`
    )
  }
  const scaling = raw["rope_scaling"]
  if (isRecord(scaling)) {
    const key = scaling["rope_type"] !== undefined ? "rope_type" : "type"
    const ropeType = scaling[key]
    if (!(ropeTypes as ReadonlyArray<unknown>).includes(ropeType)) {
      issues.push(`rope_scaling.${key} ${show(ropeType)} is not supported (supported: ${ropeTypes.join(", ")})`)
    }
  }
  issues.push(...slidingRefusals(raw))
  return issues
}

/**
 * An active sliding window changes the maths only where it is shorter than the positions the model runs; Qwen
 * slides on the layers from `max_window_layers` on when `use_sliding_window` is set (transformers 4.5x writes the
 * result out as `layer_types`).
 */
const slidingRefusals = (raw: Record<string, unknown>): Array<string> => {
  const layerTypes = raw["layer_types"]
  const layers = typeof raw["num_hidden_layers"] === "number" ? raw["num_hidden_layers"] : 0
  const firstSliding = typeof raw["max_window_layers"] === "number" ? raw["max_window_layers"] : 0
  let key: string, sliding: number
  if (Array.isArray(layerTypes)) {
    const other = layerTypes.find((t) => t !== "full_attention" && t !== "sliding_attention")
    if (other !== undefined) {
      return [`layer_types ${show(other)} is not supported (supported: full_attention, sliding_attention)`]
    }
    key = "layer_types", sliding = layerTypes.filter((t) => t === "sliding_attention").length
  } else {
    key = "use_sliding_window", sliding = raw["use_sliding_window"] === true ? Math.max(0, layers - firstSliding) : 0
  }
  const window = raw["sliding_window"], positions = raw["max_position_embeddings"]
  if (sliding === 0 || typeof window !== "number" || typeof positions !== "number" || window >= positions) return []
  return [
    `${key} ${show(raw[key])} is not supported: an active sliding_window ${window} is smaller than ` +
    `max_position_embeddings ${positions} (supported: use_sliding_window false, or a window of at least ` +
    `max_position_embeddings)`
  ]
}

/**
 * Fills what a published config leaves to its family (`attention_bias`; `rope_scaling.type` read as `rope_type`)
 * and leaves out keys that only restate a default (`head_dim` equal to the width over the heads, `torch_dtype`
 * `float32`, what {@link toJson} writes), so that a config read back from {@link toJson} equals the one written.
 */
const normalize = (raw: Record<string, unknown>): Record<string, unknown> => {
  const out = { ...raw }
  const width = out["hidden_size"], heads = out["num_attention_heads"]
  if (typeof width === "number" && typeof heads === "number" && out["head_dim"] === width / heads) {
    delete out["head_dim"]
  }
  if (out["torch_dtype"] === "float32") delete out["torch_dtype"]
  if (out["attention_bias"] === undefined && isFamily(out["model_type"])) {
    out["attention_bias"] = out["model_type"] === "qwen2"
  }
  const scaling = out["rope_scaling"]
  if (isRecord(scaling) && scaling["rope_type"] === undefined && scaling["type"] !== undefined) {
    const { type, ...rest } = scaling
    out["rope_scaling"] = { ...rest, rope_type: type }
  }
  return out
}

const Published = Schema.Record(Schema.String, Schema.Unknown).check(Schema.makeFilter(refusals))

/**
 * A model configuration. Decodes a Hugging Face `config.json` object (snake_case keys; keys the graph does not
 * depend on are ignored, keys asking for what it cannot compute are refused) and encodes back to one.
 *
 * @category models
 * @since 0.1.0
 */
export const ModelConfig = Published.pipe(Schema.decodeTo(
  Config,
  SchemaTransformation.transform({
    decode: (raw: Record<string, unknown>) => normalize(raw) as typeof Config.Encoded,
    encode: (encoded: typeof Config.Encoded): Record<string, unknown> => ({ ...encoded })
  })
))
export type ModelConfig = typeof ModelConfig.Type

/**
 * Per-head width: the config's `head_dim` when it gives one (Qwen3, Llama 3.2), else `hiddenSize /
 * numAttentionHeads`. Queries are `numAttentionHeads · headDim` wide, keys and values `numKeyValueHeads · headDim`.
 *
 * @category getters
 * @since 0.1.0
 */
export const headDim = (c: {
  readonly headDim?: number | undefined
  readonly hiddenSize: number
  readonly numAttentionHeads: number
}): number => c.headDim ?? c.hiddenSize / c.numAttentionHeads

/**
 * Whether the model normalises each query and key head (Qwen3's `q_norm` / `k_norm`).
 *
 * @category getters
 * @since 0.1.0
 */
export const hasQkNorm = (c: ModelConfig): boolean => c.modelType === "qwen3"

/**
 * Names of the presets `agentfly init-model --preset` accepts.
 *
 * @category models
 * @since 0.1.0
 */
export type PresetName = "tiny" | "small" | "medium"

/**
 * Preset architectures for the embedded CPU policy. The vocabulary size is a placeholder that
 * `ModelFolder.init` raises to cover the tokenizer (the byte-level tokenizer has 256 bytes plus chat specials).
 *
 * - `tiny`: 2 layers, width 128, 4 heads (each with its own KV head), SwiGLU 512, untied head, learned positions
 *   on top of RoPE: ≈0.6 M parameters besides the embeddings; decodes thousands of tokens/s on 2 CPU cores.
 * - `small`: 4 layers, width 256, 8 query heads sharing 2 KV heads, SwiGLU 1024.
 * - `medium`: 12 layers, width 768, 12 query heads sharing 4 KV heads, SwiGLU 3072, tied head: ≈104 M parameters
 *   (GPT-2 small's size), for sizing what a bigger model needs (`bench/memory.ts`); far too slow to train on a
 *   laptop CPU.
 *
 * @category constructors
 * @since 0.1.0
 */
export const presets: Readonly<Record<PresetName, ModelConfig>> = {
  tiny: {
    modelType: "qwen2",
    vocabSize: 288,
    hiddenSize: 128,
    numHiddenLayers: 2,
    numAttentionHeads: 4,
    // Measured on the calculator warm-up (batch 16, LR 2e-3): with 2 shared KV heads two of three seeds had not
    // started copying digits after 1,000 steps; with one KV head per query head all three start at 550–650 steps.
    numKeyValueHeads: 4,
    intermediateSize: 512,
    maxPositionEmbeddings: 512,
    ropeTheta: 10000,
    rmsNormEps: 1e-6,
    // Measured on the calculator warm-up (batch 16, LR 2e-3): with tied embeddings and RoPE alone the model never
    // learned to copy digits from its context in 1,800 steps (digit NLL stuck at ln 10); with learned positions and
    // an untied head it starts copying after ~450 steps.
    tieWordEmbeddings: false,
    attentionBias: true,
    learnedPositions: true
  },
  small: {
    modelType: "qwen2",
    vocabSize: 288,
    hiddenSize: 256,
    numHiddenLayers: 4,
    numAttentionHeads: 8,
    numKeyValueHeads: 2,
    intermediateSize: 1024,
    maxPositionEmbeddings: 1024,
    ropeTheta: 10000,
    rmsNormEps: 1e-6,
    tieWordEmbeddings: true,
    attentionBias: true,
    learnedPositions: false
  },
  medium: {
    modelType: "qwen2",
    vocabSize: 288,
    hiddenSize: 768,
    numHiddenLayers: 12,
    numAttentionHeads: 12,
    numKeyValueHeads: 4,
    intermediateSize: 3072,
    maxPositionEmbeddings: 1024,
    ropeTheta: 10000,
    rmsNormEps: 1e-6,
    tieWordEmbeddings: true,
    attentionBias: true,
    learnedPositions: false
  }
}

/**
 * Decodes a parsed `config.json`, refusing what the graph cannot compute (see the module notes).
 *
 * @category decoding
 * @since 0.1.0
 */
export const decode = Schema.decodeUnknownEffect(ModelConfig)

/**
 * Encodes to a `config.json` object in the family's Hugging Face layout: its `architectures` and `model_type`,
 * `head_dim`, `rope_scaling` when set, `hidden_act` and `torch_dtype` (`float32` unless the writer stores its
 * weights in another dtype: pass the dtype written).
 *
 * @category encoding
 * @since 0.1.0
 */
export const toJson = (
  c: ModelConfig,
  options: { readonly torchDtype?: string } = {}
): Record<string, unknown> => ({
  architectures: [architectures[c.modelType]],
  ...Schema.encodeSync(ModelConfig)(c),
  head_dim: headDim(c),
  hidden_act: "silu",
  torch_dtype: options.torchDtype ?? "float32"
})
