/**
 * LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): a frozen projection
 * `W [out, in]` plus a trainable low-rank update, `y = x·Wᵀ + s · (x·Aᵀ)·Bᵀ` with `A [r, in]`, `B [out, r]`
 * and `s = alpha / r`, exactly as PEFT's `LoraLayer` computes it (`lora_B(lora_A(dropout(x))) * scaling`).
 *
 * The adapter's tensors carry PEFT's names, `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`
 * (`huggingface/peft` `docs/source/developer_guides/checkpoint.md`: the keys of a saved state dict start with
 * `base_model.model.`, the adapter name `default` is stripped, `lora_A`/`lora_B` are `nn.Linear`s so `A` is
 * `[r, in]` and `B` `[out, r]`), so the learner's own tensors are the PEFT state dict: a checkpoint's
 * `adapter_model.safetensors` and `adapter_config.json` ({@link adapterConfig}) load in PEFT, vLLM and SGLang as
 * they are. Initialisation follows PEFT's default (`init_lora_weights=True`): `A` Kaiming-uniform with `a = √5`,
 * i.e. U(−1/√in, 1/√in), and `B` zeros, so a fresh adapter leaves the model's function unchanged bit for bit.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Schema } from "effect"
import * as ModelConfig from "./model/ModelConfig.ts"
import * as Safetensors from "./Safetensors.ts"
import * as Sampling from "./Sampling.ts"

// ===== Models =====

/**
 * The projections an adapter may target, by the module names Hugging Face (and PEFT's `target_modules`) use.
 *
 * @category models
 * @since 0.1.0
 */
export const moduleNames = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] as const
export type ModuleName = (typeof moduleNames)[number]

/**
 * `model.lora` of a run: the rank `r`, `alpha` (the update is scaled by `alpha / rank`), the dropout on the
 * adapter's input (PEFT's `lora_dropout`) and the target modules by name.
 *
 * @category models
 * @since 0.1.0
 */
export const Config = Schema.Struct({
  rank: Schema.Int.check(Schema.isGreaterThan(0)),
  alpha: Schema.Number.check(Schema.isGreaterThan(0)),
  dropout: Schema.optionalKey(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 0.95 }))),
  targets: Schema.Array(Schema.String).check(Schema.isMinLength(1)),
  /** Seeds `A`'s initialisation (default 0). */
  seed: Schema.optionalKey(Schema.Int)
})
export type Config = typeof Config.Type

/**
 * A target the model does not have, or another setting that cannot apply to it.
 *
 * @category errors
 * @since 0.1.0
 */
export class LoraError extends Schema.TaggedError<LoraError>()("LoraError", {
  message: Schema.String
}) {}

/**
 * One adapted projection of one layer: the base weight it adapts and its two factors' names and shapes.
 *
 * @category models
 * @since 0.1.0
 */
export interface Site {
  readonly layer: number
  readonly module: ModuleName
  /** The frozen weight's Hugging Face name (`model.layers.N.self_attn.q_proj.weight`). */
  readonly weight: string
  readonly a: string
  readonly b: string
  readonly inFeatures: number
  readonly outFeatures: number
}

const block = (module: ModuleName) => (moduleNames.indexOf(module) < 4 ? "self_attn" : "mlp")

/**
 * The modules of `model` that an adapter may target (every family the graph computes has all seven).
 *
 * @category getters
 * @since 0.1.0
 */
export const modulesOf = (_model: ModelConfig.ModelConfig): ReadonlyArray<ModuleName> => moduleNames

/**
 * Checks `config` against `model`: every target one of its modules (an unknown name is refused, naming the ones
 * the model has), no target twice, dropout below 1.
 *
 * @category constructors
 * @since 0.1.0
 */
export const validate = (config: Config, model: ModelConfig.ModelConfig): LoraError | undefined => {
  const has = modulesOf(model)
  const unknown = config.targets.filter((t) => !(has as ReadonlyArray<string>).includes(t))
  if (unknown.length > 0) {
    return new LoraError({
      message: `model.lora.targets: ${unknown.map((t) => JSON.stringify(t)).join(", ")} ` +
        `${unknown.length === 1 ? "is not a module" : "are not modules"} of this model; it has ${has.join(", ")}`
    })
  }
  const twice = config.targets.find((t, i) => config.targets.indexOf(t) !== i)
  if (twice !== undefined) return new LoraError({ message: `model.lora.targets names ${twice} twice` })
  if (!Number.isInteger(config.rank) || config.rank < 1) {
    return new LoraError({ message: `model.lora.rank must be a positive integer, got ${config.rank}` })
  }
  return undefined
}

/**
 * Every adapted projection, layer by layer in the model's module order (PEFT's state dict order does not matter:
 * tensors are looked up by name).
 *
 * @category getters
 * @since 0.1.0
 */
export const sites = (model: ModelConfig.ModelConfig, config: Config): ReadonlyArray<Site> => {
  const D = model.hiddenSize, F = model.intermediateSize, hd = ModelConfig.headDim(model)
  const q = model.numAttentionHeads * hd, kv = model.numKeyValueHeads * hd
  const dims: Record<ModuleName, readonly [number, number]> = {
    q_proj: [D, q],
    k_proj: [D, kv],
    v_proj: [D, kv],
    o_proj: [q, D],
    gate_proj: [D, F],
    up_proj: [D, F],
    down_proj: [F, D]
  }
  const out: Array<Site> = []
  for (let layer = 0; layer < model.numHiddenLayers; layer++) {
    for (const module of moduleNames) {
      if (!config.targets.includes(module)) continue
      const path = `model.layers.${layer}.${block(module)}.${module}`
      const [inFeatures, outFeatures] = dims[module]
      out.push({
        layer,
        module,
        weight: `${path}.weight`,
        a: `base_model.model.${path}.lora_A.weight`,
        b: `base_model.model.${path}.lora_B.weight`,
        inFeatures,
        outFeatures
      })
    }
  }
  return out
}

/**
 * The adapter's tensors with their shapes: per site `lora_A [r, in]` then `lora_B [out, r]`.
 *
 * @category getters
 * @since 0.1.0
 */
export const parameters = (
  model: ModelConfig.ModelConfig,
  config: Config
): ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }> =>
  sites(model, config).flatMap((s) => [
    { name: s.a, shape: [config.rank, s.inFeatures] },
    { name: s.b, shape: [s.outFeatures, config.rank] }
  ])

/**
 * The scale of the update, `alpha / rank` (PEFT's `scaling` without rsLoRA).
 *
 * @category getters
 * @since 0.1.0
 */
export const scaling = (config: Config): number => config.alpha / config.rank

/**
 * A fresh adapter: `A` ~ U(−1/√in, 1/√in) from `config.seed`, `B` zeros (PEFT's default initialisation).
 *
 * @category constructors
 * @since 0.1.0
 */
export const init = (model: ModelConfig.ModelConfig, config: Config): Map<string, Float32Array> => {
  const r = Sampling.rng(config.seed ?? 0)
  const out = new Map<string, Float32Array>()
  for (const s of sites(model, config)) {
    const bound = 1 / Math.sqrt(s.inFeatures)
    out.set(s.a, Float32Array.from({ length: config.rank * s.inFeatures }, () => (2 * r.next() - 1) * bound))
    out.set(s.b, new Float32Array(s.outFeatures * config.rank))
  }
  return out
}

/**
 * `W + s · B·A` for every adapted weight of `base` (fresh arrays, accumulated in float64 per element); the other
 * weights are `base`'s own arrays, and adapter tensors in `base` (one map may hold both) are left out. What PEFT's
 * `merge_and_unload` computes.
 *
 * @category combinators
 * @since 0.1.0
 */
export const merge = (
  model: ModelConfig.ModelConfig,
  config: Config,
  base: ReadonlyMap<string, Float32Array>,
  adapter: ReadonlyMap<string, Float32Array>
): Map<string, Float32Array> => {
  const out = new Map([...base].filter(([name]) => !isAdapterTensor(name)))
  const s = scaling(config), r = config.rank
  for (const site of sites(model, config)) {
    const w = base.get(site.weight), a = adapter.get(site.a), b = adapter.get(site.b)
    if (w === undefined || a === undefined || b === undefined) continue
    const merged = Float32Array.from(w)
    const { inFeatures: n, outFeatures: m } = site
    const row = new Float64Array(n)
    for (let o = 0; o < m; o++) {
      row.fill(0)
      for (let k = 0; k < r; k++) {
        const bk = b[o * r + k]!
        if (bk === 0) continue
        for (let i = 0; i < n; i++) row[i]! += bk * a[k * n + i]!
      }
      for (let i = 0; i < n; i++) merged[o * n + i]! += s * row[i]!
    }
    out.set(site.weight, merged)
  }
  return out
}

/**
 * Whether `weights` holds an adapter tensor.
 *
 * @category predicates
 * @since 0.1.0
 */
export const hasAdapter = (weights: ReadonlyMap<string, unknown>): boolean => {
  for (const name of weights.keys()) if (isAdapterTensor(name)) return true
  return false
}

/**
 * Whether `name` is an adapter tensor's (`…lora_A.weight` / `…lora_B.weight`).
 *
 * @category predicates
 * @since 0.1.0
 */
export const isAdapterTensor = (name: string): boolean =>
  name.endsWith(".lora_A.weight") || name.endsWith(".lora_B.weight")

/**
 * The adapter's tensors of `weights` (a LoRA trainer's weights hold the base by reference, then the adapter).
 *
 * @category getters
 * @since 0.1.0
 */
export const adapterOf = (weights: ReadonlyMap<string, Float32Array>): Map<string, Float32Array> =>
  new Map([...weights].filter(([name]) => isAdapterTensor(name)))

// ===== Dropout =====

/**
 * The symbolic rows of the values a projection reads: a micro-batch's `batch × seq`, or its shared prompts'
 * `groups × prefix`.
 *
 * @category models
 * @since 0.1.0
 */
export type Rows = readonly ["batch", "seq"] | readonly ["groups", "prefix"]

/**
 * The graph input holding the dropout mask of `weight`'s adapter input over `rows` (`[rows…, in]`).
 *
 * @category getters
 * @since 0.1.0
 */
export const dropoutMaskName = (rows: Rows, weight: string): string => `lora_dropout.${rows[0]}.${weight}`

/**
 * The dropout masks of a micro-batch (PEFT's `nn.Dropout(p)` on each adapter's input, in training mode): each
 * element 0 with probability `p`, else `1 / (1 − p)`, drawn from `seed` (the trainer derives it from the optimiser
 * step and the micro-batch's place in it, so that a resumed run draws the same masks); all ones when not training
 * (PEFT in eval mode: log-probabilities, the KL reference).
 *
 * @category constructors
 * @since 0.1.0
 */
export const dropoutMasks = (
  model: ModelConfig.ModelConfig,
  config: Config,
  shapes: ReadonlyArray<{ readonly rows: Rows; readonly batch: number; readonly length: number }>,
  training: boolean,
  seed: number
): Map<string, { readonly dims: ReadonlyArray<number>; readonly data: Float32Array }> => {
  const p = config.dropout ?? 0
  const out = new Map<string, { readonly dims: ReadonlyArray<number>; readonly data: Float32Array }>()
  if (p <= 0) return out
  const r = Sampling.rng(seed), keep = 1 / (1 - p)
  for (const { rows, batch, length } of shapes) {
    for (const site of sites(model, config)) {
      const data = new Float32Array(batch * length * site.inFeatures)
      if (!training) data.fill(1)
      else for (let i = 0; i < data.length; i++) data[i] = r.next() < p ? 0 : keep
      out.set(dropoutMaskName(rows, site.weight), { dims: [batch, length, site.inFeatures], data })
    }
  }
  return out
}

// ===== PEFT files =====

/**
 * `adapter_config.json` as PEFT writes it for this adapter (`peft_type: "LORA"`, `task_type: "CAUSAL_LM"`).
 *
 * @category encoding
 * @since 0.1.0
 */
export const adapterConfig = (config: Config, baseModel: string) => ({
  base_model_name_or_path: baseModel,
  peft_type: "LORA",
  task_type: "CAUSAL_LM",
  r: config.rank,
  lora_alpha: config.alpha,
  lora_dropout: config.dropout ?? 0,
  target_modules: moduleNames.filter((m) => config.targets.includes(m)),
  bias: "none",
  fan_in_fan_out: false,
  inference_mode: true,
  init_lora_weights: true,
  modules_to_save: null,
  use_rslora: false,
  use_dora: false,
  rank_pattern: {},
  alpha_pattern: {},
  revision: null
})

const AdapterConfigFile = Schema.Struct({
  peft_type: Schema.Literal("LORA"),
  r: Schema.Int,
  lora_alpha: Schema.Number,
  lora_dropout: Schema.optionalKey(Schema.Number),
  target_modules: Schema.Union([Schema.Array(Schema.String), Schema.String]),
  base_model_name_or_path: Schema.optionalKey(Schema.NullOr(Schema.String)),
  use_rslora: Schema.optionalKey(Schema.Boolean),
  use_dora: Schema.optionalKey(Schema.Boolean),
  fan_in_fan_out: Schema.optionalKey(Schema.Boolean)
})

/**
 * Writes `adapter_config.json` and `adapter_model.safetensors` (F32, PEFT's names) into `dir`.
 *
 * @category encoding
 * @since 0.1.0
 */
export const save = Effect.fn("Lora.save")(function*(
  dir: string,
  model: ModelConfig.ModelConfig,
  config: Config,
  adapter: ReadonlyMap<string, Float32Array>,
  baseModel: string
) {
  const fs = yield* FileSystem.FileSystem
  const tensors = parameters(model, config).map((p) => ({ ...p, data: adapter.get(p.name)! }))
  const missing = tensors.find((t) => t.data === undefined)
  if (missing !== undefined) return yield* new LoraError({ message: `the adapter has no tensor ${missing.name}` })
  yield* Safetensors.writeSharded(dir, "adapter_model", tensors, { metadata: { format: "pt" } }).pipe(
    Effect.mapError((e) => new LoraError({ message: e.message }))
  )
  const json = JSON.stringify(adapterConfig(config, baseModel), null, 2) + "\n"
  yield* fs.writeFileString(`${dir}/adapter_config.json`, json).pipe(
    Effect.mapError((e) => new LoraError({ message: `cannot write ${dir}/adapter_config.json: ${e.message}` }))
  )
})

/**
 * Reads a PEFT LoRA adapter folder for `model`: its settings and tensors, checked (a LoRA adapter, targets the model
 * has, no rsLoRA/DoRA/fan-in-fan-out, every tensor present with PEFT's shape).
 *
 * @category decoding
 * @since 0.1.0
 */
export const load = Effect.fn("Lora.load")(function*(dir: string, model: ModelConfig.ModelConfig) {
  const fs = yield* FileSystem.FileSystem
  const path = `${dir}/adapter_config.json`
  const text = yield* fs.readFileString(path).pipe(
    Effect.mapError((e) => new LoraError({ message: `cannot read ${path}: ${e.message}` }))
  )
  const file = yield* Schema.decodeUnknownEffect(Schema.fromJsonString(AdapterConfigFile))(text).pipe(
    Effect.mapError((e) => new LoraError({ message: `${path}: ${e.message}` }))
  )
  const unsupported = file.use_rslora === true ? "use_rslora" : file.use_dora === true ? "use_dora" :
    file.fan_in_fan_out === true ? "fan_in_fan_out" : undefined
  if (unsupported !== undefined) {
    return yield* new LoraError({ message: `${path}: ${unsupported} is not supported (plain LoRA only)` })
  }
  const targets = typeof file.target_modules === "string" ? [file.target_modules] : file.target_modules
  const config: Config = { rank: file.r, alpha: file.lora_alpha, targets, dropout: file.lora_dropout ?? 0 }
  const bad = validate(config, model)
  if (bad !== undefined) return yield* new LoraError({ message: `${path}: ${bad.message}` })
  const adapter = yield* Safetensors.readFloat32Files(dir, parameters(model, config), "adapter_model").pipe(
    Effect.mapError((e) => new LoraError({ message: e.message }))
  )
  return { config, adapter, baseModel: file.base_model_name_or_path ?? undefined }
})
