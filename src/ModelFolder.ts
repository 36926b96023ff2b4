/**
 * A model folder in Hugging Face layout: `config.json` (`model_type: "qwen2"`), the weights (`model.safetensors`, or
 * `model.safetensors.index.json` and its shards; F32, BF16 or F16, read by streaming), `tokenizer.json`,
 * `tokenizer_config.json` (with `chat_template` and `eos_token`) and optionally `generation_config.json`.
 * {@link load} validates every file against the others (weights against the config's parameter shapes, tokenizer
 * size against the vocabulary) and fails with a {@link ModelFolderError} naming the file (and tensor); {@link init}
 * writes a fresh folder from a preset with the byte-level tokenizer and a Qwen2.5-style chat template (Hermes
 * `<tool_call>` format).
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Path, Schema } from "effect"
import * as ByteTokenizer from "./ByteTokenizer.ts"
import * as ChatTemplate from "./ChatTemplate.ts"
import * as Finite from "./internal/finite.ts"
import * as ModelConfig from "./model/ModelConfig.ts"
import * as Qwen2 from "./model/Qwen2.ts"
import * as Safetensors from "./Safetensors.ts"
import * as Tokenizer from "./Tokenizer.ts"
import * as VisionConfig from "./VisionConfig.ts"
import * as VisionTower from "./model/VisionTower.ts"

// ===== Models =====

/**
 * The folder or a required file is missing.
 *
 * @category errors
 * @since 0.1.0
 */
export class NotFound extends Schema.TaggedError<NotFound>()("NotFound", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * `config.json` is not valid JSON or not a valid Qwen2 config.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidConfig extends Schema.TaggedError<InvalidConfig>()("InvalidConfig", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The weights are corrupt, do not match the config, or hold NaN or ±Infinity (`tensor`: the one at fault,
 * when one is; for non-finite values, `index` of the first and `count` of them in that tensor).
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidWeights extends Schema.TaggedError<InvalidWeights>()("InvalidWeights", {
  message: Schema.String,
  tensor: Schema.optionalKey(Schema.String),
  index: Schema.optionalKey(Schema.Int),
  count: Schema.optionalKey(Schema.Int),
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The tokenizer files are unusable, or the tokenizer has ids outside the model's vocabulary.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidTokenizer extends Schema.TaggedError<InvalidTokenizer>()("InvalidTokenizer", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * No usable chat template.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidTemplate extends Schema.TaggedError<InvalidTemplate>()("InvalidTemplate", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Reading or writing failed.
 *
 * @category errors
 * @since 0.1.0
 */
export class Io extends Schema.TaggedError<Io>()("Io", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Why a model folder could not be read or written.
 *
 * @category errors
 * @since 0.1.0
 */
export const ModelFolderErrorReason = Schema.Union([
  NotFound,
  InvalidConfig,
  InvalidWeights,
  InvalidTokenizer,
  InvalidTemplate,
  Io
])
export type ModelFolderErrorReason = typeof ModelFolderErrorReason.Type

/**
 * A model folder's `file` could not be read or written. Handle reasons with
 * `Effect.catchReason("ModelFolderError", "NotFound", …)`; `message` is the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class ModelFolderError extends Schema.TaggedError<ModelFolderError>()("ModelFolderError", {
  file: Schema.String,
  reason: ModelFolderErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `modelFolderError`; a reason left out is a compile error. */
const reasons = { NotFound, InvalidConfig, InvalidWeights, InvalidTokenizer, InvalidTemplate, Io } satisfies Record<
  ModelFolderErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message (`cause`, the `tensor` of `InvalidWeights`).
 *
 * @category errors
 * @since 0.1.0
 */
export type ModelFolderErrorFacts<Tag extends ModelFolderErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `ModelFolderError` of `file` for the reason tagged `tag`: `modelFolderError(file, "NotFound", text, { cause })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const modelFolderError = <Tag extends ModelFolderErrorReason["_tag"]>(
  file: string,
  tag: Tag,
  message: string,
  facts?: ModelFolderErrorFacts<Tag>
): ModelFolderError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => ModelFolderErrorReason
  return new ModelFolderError({ file, reason: new Reason({ ...facts, message }) })
}

/**
 * A loaded model folder.
 *
 * @category models
 * @since 0.1.0
 */
export interface ModelFolder {
  readonly dir: string
  /** A name for the model: the folder's base name (what `/v1/models` lists). */
  readonly name: string
  readonly config: ModelConfig.ModelConfig
  readonly weights: Qwen2.Weights
  readonly tokenizer: Tokenizer.Tokenizer
  readonly template: ChatTemplate.ChatTemplate
  /** Ids that end a turn: the template's stop tokens and `generation_config.json`'s `eos_token_id`. */
  readonly stopTokenIds: ReadonlyArray<number>
  /** The vision tower (`config.json`'s `vision_config`; `weights` then hold its `visual.*` tensors too). */
  readonly vision?: VisionTower.VlConfig | undefined
}

// ===== Reading =====

const parseJson = (text: string, file: string) =>
  Effect.try({
    try: () => JSON.parse(text) as unknown,
    catch: (cause) => modelFolderError(file, "InvalidConfig", `${file} is not valid JSON`, { cause })
  })

/**
 * Reads and validates `config.json`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const readConfig = Effect.fn("ModelFolder.readConfig")(function*(dir: string) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const file = path.join(dir, "config.json")
  const text = yield* fs.readFileString(file).pipe(
    Effect.mapError((cause) =>
      cause.reason._tag === "NotFound"
        ? modelFolderError(file, "NotFound", `cannot read ${file}`, { cause })
        : modelFolderError(file, "Io", `cannot read ${file}: ${cause.message}`, { cause })
    )
  )
  return yield* ModelConfig.decode(yield* parseJson(text, file)).pipe(
    Effect.mapError((e) => modelFolderError(file, "InvalidConfig", `${file}: ${e.message}`, { cause: e }))
  )
})

/**
 * A weights read failure as the folder's reason: a missing file is `NotFound`, one that cannot be read (permission,
 * a directory, the disk) is `Io`, and anything about the contents is `InvalidWeights` naming the tensor; the
 * safetensors error is the cause, and its message (which names the real cause) is kept.
 */
const weightsError = (e: Safetensors.SafetensorsError): ModelFolderError => {
  const tag = e.reason._tag
  if (tag === "NotFound") return modelFolderError(e.file, "NotFound", e.message, { cause: e })
  if (tag === "PermissionDenied" || tag === "NotAFile" || tag === "Io") {
    return modelFolderError(e.file, "Io", e.message, { cause: e })
  }
  const tensor = e.tensor
  const facts = tensor === undefined ? { cause: e } : { tensor, cause: e }
  return modelFolderError(e.file, "InvalidWeights", e.message, facts)
}

/**
 * Reads the weights as Hugging Face publishes them: `model.safetensors`, or `model.safetensors.index.json` and the
 * shards it names; F32, BF16 or F16, streamed tensor by tensor into `Float32Array`s (files of any size). Checks they
 * hold exactly the parameters of `config`, with their shapes, every value finite (`InvalidWeights` naming the first
 * tensor with a NaN or ±Infinity).
 *
 * @category constructors
 * @since 0.1.0
 */
export const readWeights = Effect.fn("ModelFolder.readWeights")(function*(
  dir: string,
  config: ModelConfig.ModelConfig,
  parameters: ReadonlyArray<Qwen2.ParameterSpec> = Qwen2.parameters(config)
) {
  const index = yield* Safetensors.readIndex(dir, "model").pipe(Effect.mapError(weightsError))
  const weights: Qwen2.Weights = yield* Safetensors.readTensors(index, parameters).pipe(
    Effect.mapError(weightsError)
  )
  // NaN or ±Infinity would be served and trained on unnoticed (only a checkpoint's save refused them).
  const bad = Finite.firstNonFinite(weights)
  if (bad !== undefined) {
    const file = index.tensors.get(bad.tensor)?.file ?? index.file
    const message = `${file}: ${Finite.describe(bad)}`
    return yield* modelFolderError(file, "InvalidWeights", message, {
      tensor: bad.tensor,
      index: bad.index,
      count: bad.count
    })
  }
  return weights
})

const stopIds = Effect.fnUntraced(function*(
  dir: string,
  tokenizer: Tokenizer.Tokenizer,
  template: ChatTemplate.ChatTemplate
) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const ids = new Set<number>()
  for (const t of template.stopTokens) {
    const id = tokenizer.tokenToId(t)
    if (id !== undefined) ids.add(id)
  }
  const file = path.join(dir, "generation_config.json")
  if (yield* fs.exists(file).pipe(Effect.orElseSucceed(() => false))) {
    const text = yield* fs.readFileString(file).pipe(
      Effect.mapError((cause) => modelFolderError(file, "Io", `cannot read ${file}`, { cause }))
    )
    const eos = ((yield* parseJson(text, file)) as { eos_token_id?: unknown } | null)?.eos_token_id
    for (const id of Array.isArray(eos) ? eos : [eos]) if (Number.isInteger(id)) ids.add(id as number)
  }
  return [...ids]
})

/** The folder's vision tower: `config.json`'s `vision_config` over the text model of `config`, if any. */
const readVision = Effect.fnUntraced(function*(dir: string, config: ModelConfig.ModelConfig) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const file = path.join(dir, "config.json")
  const text = yield* fs.readFileString(file).pipe(
    Effect.mapError((cause) => modelFolderError(file, "Io", `cannot read ${file}`, { cause }))
  )
  const vision = VisionTower.fromConfigJson(yield* parseJson(text, file))
  if (vision === undefined) return undefined
  if ("missing" in vision) {
    return yield* modelFolderError(file, "InvalidConfig", `${file}: ${vision.missing} is missing or not positive`)
  }
  const vl: VisionTower.VlConfig = { text: config, vision }
  return vl
})

/**
 * Every weight a checkpoint of this folder's model holds: the text model's, then the tower's when it has one (a run's
 * checkpoints of a `tiny-vl` policy keep the trained tower beside the language model).
 *
 * @category getters
 * @since 0.1.0
 */
export const parameters = (folder: Pick<ModelFolder, "config" | "vision">): ReadonlyArray<Qwen2.ParameterSpec> =>
  folder.vision === undefined ? Qwen2.parameters(folder.config) : VisionTower.allParameters(folder.vision)

/**
 * Loads and cross-validates a whole folder.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fn("ModelFolder.load")(function*(dir: string) {
  const path = yield* Path.Path
  const config = yield* readConfig(dir)
  const vision = yield* readVision(dir, config)
  const weights = yield* readWeights(dir, config, vision === undefined ? undefined : VisionTower.allParameters(vision))
  const tokenizerFile = path.join(dir, "tokenizer.json")
  const tokenizer = yield* Tokenizer.load(dir).pipe(
    Effect.mapError((e) =>
      modelFolderError(tokenizerFile, e.reason._tag === "NotFound" ? "NotFound" : "InvalidTokenizer", e.message, {
        cause: e
      })
    )
  )
  if (tokenizer.vocabSize > config.vocabSize) {
    return yield* modelFolderError(
      tokenizerFile,
      "InvalidTokenizer",
      `the tokenizer has ${tokenizer.vocabSize} ids but config.json's vocab_size is ${config.vocabSize}`
    )
  }
  const template = yield* ChatTemplate.load(dir).pipe(
    Effect.mapError((e) =>
      modelFolderError(path.join(dir, "tokenizer_config.json"), "InvalidTemplate", e.message, { cause: e })
    )
  )
  // A folder with Qwen2-VL's preprocessor_config.json has a vision tower: its template writes image tokens.
  const preprocessor = yield* VisionConfig.read(dir).pipe(
    Effect.mapError((e) =>
      modelFolderError(path.join(dir, "preprocessor_config.json"), "InvalidTemplate", e.message, { cause: e })
    )
  )
  const stopTokenIds = yield* stopIds(dir, tokenizer, template)
  const name = path.basename(path.resolve(dir))
  const folder: ModelFolder = {
    dir,
    name,
    config,
    weights,
    tokenizer,
    template: VisionConfig.applyTo(template, preprocessor),
    stopTokenIds,
    ...(vision === undefined ? {} : { vision })
  }
  return folder
})

// ===== Writing =====

/**
 * Writes `config.json` and the weights (parameters in {@link Qwen2.parameters} order), streamed: by default F32 in
 * one `model.safetensors` up to 2 GB, beyond that in shards with `model.safetensors.index.json` (see
 * {@link Safetensors.writeSharded}); `options` picks BF16 or another shard size, as an export does.
 *
 * @category constructors
 * @since 0.1.0
 */
export const writeModel = Effect.fn("ModelFolder.writeModel")(function*(
  dir: string,
  config: ModelConfig.ModelConfig,
  weights: Qwen2.Weights,
  options: Pick<Safetensors.WriteOptions, "dtype" | "maxShardBytes"> & {
    /** A vision tower: `config.json` gets its `vision_config` and the weights its `visual.*` tensors. */
    readonly vision?: VisionTower.VisionConfig | undefined
  } = {}
) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const io = (file: string) => (cause: unknown) => modelFolderError(file, "Io", `cannot write ${file}`, { cause })
  yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(io(dir)))
  const { vision, ...write } = options
  const specs = vision === undefined ? Qwen2.parameters(config) : VisionTower.allParameters({ text: config, vision })
  const tensors = specs.map((spec) => ({
    name: spec.name,
    shape: spec.shape,
    data: weights.get(spec.name)!
  }))
  const missing = tensors.find((t) => t.data === undefined)
  if (missing !== undefined) {
    const file = path.join(dir, "model.safetensors")
    return yield* modelFolderError(file, "InvalidWeights", `no weights for ${missing.name}`, { tensor: missing.name })
  }
  const configFile = path.join(dir, "config.json")
  const json = vision === undefined
    ? ModelConfig.toJson(config)
    : { ...ModelConfig.toJson(config), vision_config: VisionTower.toConfigJson(vision) }
  yield* fs.writeFileString(configFile, JSON.stringify(json, null, 2) + "\n").pipe(
    Effect.mapError(io(configFile))
  )
  yield* Safetensors.writeSharded(dir, "model", tensors, { ...write, metadata: { format: "pt" } }).pipe(
    Effect.mapError((e) => modelFolderError(e.file, "Io", e.message, { cause: e }))
  )
})

/**
 * @category models
 * @since 0.1.0
 */
export interface InitOptions {
  /** A text preset, or a vision-language one (`tiny-vl`: the folder also gets the tower, its tokens and pixels). */
  readonly preset: ModelConfig.PresetName | VisionTower.PresetName
  /** Seed of the random initialisation (default 0). */
  readonly seed?: number
}

/** A vision-language folder's weights, `config.json` with its `vision_config`, and `preprocessor_config.json`. */
const initVision = Effect.fnUntraced(function*(dir: string, vl: VisionTower.VlConfig, seed: number) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  yield* writeModel(dir, vl.text, VisionTower.initWeights(vl, seed), { vision: vl.vision })
  const file = path.join(dir, "preprocessor_config.json")
  yield* fs.writeFileString(file, JSON.stringify(VisionTower.preprocessorConfig(vl.vision), null, 2) + "\n").pipe(
    Effect.mapError((cause) => modelFolderError(file, "Io", `cannot write ${file}`, { cause }))
  )
})

/**
 * Writes a fresh model folder: the preset's architecture with randomly initialised weights, the byte-level
 * tokenizer (256 bytes plus ChatML/Qwen specials) and the Qwen2.5 chat template, whose tool calls are Hermes
 * `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks. The vocabulary is exactly the tokenizer's (the
 * preset's `vocabSize` is a placeholder), so every id the model can sample decodes. Returns the config written.
 *
 * @category constructors
 * @since 0.1.0
 */
export const init = Effect.fn("ModelFolder.init")(function*(dir: string, options: InitOptions) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const vl = options.preset === "tiny-vl" ? VisionTower.presets[options.preset] : undefined
  const preset = vl?.text ?? ModelConfig.presets[options.preset as ModelConfig.PresetName]
  const tokens = vl === undefined ? {} : { specialTokens: ByteTokenizer.visionSpecialTokens }
  const tokenizerVocab = ByteTokenizer.vocabSize(tokens)
  const eos = ByteTokenizer.defaultSpecialTokens.indexOf("<|im_end|>") + 256
  const endOfText = ByteTokenizer.defaultSpecialTokens.indexOf("<|endoftext|>") + 256
  const config: ModelConfig.ModelConfig = {
    ...preset,
    // Exactly the tokenizer's ids: a padded vocabulary would let a fresh policy sample ids no tokenizer can decode.
    vocabSize: tokenizerVocab,
    eosTokenId: eos
  }
  if (vl === undefined) yield* writeModel(dir, config, Qwen2.initWeights(config, options.seed ?? 0))
  else yield* initVision(dir, { text: config, vision: vl.vision }, options.seed ?? 0)
  yield* ByteTokenizer.writeModelFiles(dir, { ...tokens, chatTemplate: ChatTemplate.templates["qwen2.5"] }).pipe(
    Effect.mapError((cause) =>
      modelFolderError(dir, "Io", `cannot write tokenizer files in ${dir}`, { cause })
    )
  )
  const generationFile = path.join(dir, "generation_config.json")
  yield* fs.writeFileString(
    generationFile,
    JSON.stringify({ eos_token_id: [eos, endOfText], pad_token_id: endOfText, do_sample: true }, null, 2) + "\n"
  ).pipe(Effect.mapError((cause) =>
    modelFolderError(generationFile, "Io", `cannot write ${generationFile}`, { cause })
  ))
  return config
})
