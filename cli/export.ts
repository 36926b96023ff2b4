/**
 * `agentfly export SOURCE [--checkpoint RUN/checkpoints/step-NNNNNN] --format gguf|hf --out PATH
 * [--dtype f32|f16|q8_0|bf16] [--overwrite]`: writes a model as a GGUF file that llama.cpp, Ollama and LM
 * Studio run (F32, F16 or Q8_0, with the tokenizer and the chat template), or as a Hugging Face folder that
 * transformers, vLLM and SGLang load (BF16 or F32 safetensors, `config.json`, `tokenizer.json`,
 * `tokenizer_config.json` with the chat template, `generation_config.json`).
 *
 * SOURCE is a model folder, a run's output directory (its newest checkpoint, on the model its `config.json` names)
 * or one of its checkpoints (`RUN/checkpoints/step-NNNNNN`); `--checkpoint` names the checkpoint explicitly. A LoRA
 * run's checkpoint (a PEFT adapter folder) is merged into its base, `W + (alpha/r)·B·A`, as PEFT's
 * `merge_and_unload` does; `--adapter DIR` merges any PEFT LoRA adapter folder into the source's weights.
 *
 * Everything is read and checked before anything is written, and the output is written under a temporary name and
 * renamed when complete: a refusal or a failure leaves no half-written output.
 *
 * @since 0.1.0
 */
import { Console, Effect, FileSystem, Option, Path, Schema } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import type { PlatformError } from "effect/PlatformError"
import * as Journal from "../actors/Journal.ts"
import * as Gguf from "../src/Gguf.ts"
import * as Lora from "../src/Lora.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import { exitOnFailure } from "./train.ts"

// ===== Models =====

/**
 * Export formats: a GGUF file, a Hugging Face folder, or (`gguf-lora`) a LoRA adapter alone as llama.cpp's GGUF LoRA.
 *
 * @category models
 * @since 0.1.0
 */
export type Format = "gguf" | "hf" | "gguf-lora"

/**
 * Element types on disk: GGUF takes `f32` (default), `f16` or `q8_0` (llama.cpp's 8-bit blocks: matrices quantised,
 * norms and biases F32, as its converter writes `--outtype q8_0`); a Hugging Face folder `bf16` (default, as models
 * are published) or `f32`.
 *
 * @category models
 * @since 0.1.0
 */
export type DType = "f32" | "f16" | "q8_0" | "bf16"

/**
 * @category models
 * @since 0.1.0
 */
export interface ExportOptions {
  /** A model folder, a run's output directory or one of its checkpoints. */
  readonly modelDir: string
  /** A run's checkpoint whose weights replace the folder's (`RUN/checkpoints/step-NNNNNN`). */
  readonly checkpoint?: string | undefined
  readonly format: Format
  readonly out: string
  readonly dtype?: DType | undefined
  /** Replace an existing output (refused otherwise). */
  readonly overwrite?: boolean | undefined
  /**
   * A PEFT LoRA adapter folder (`adapter_config.json`, `adapter_model.safetensors`) merged into the source's weights
   * before writing. A LoRA run's checkpoint is an adapter folder itself: its adapter is merged without this.
   */
  readonly adapter?: string | undefined
}

/**
 * The output is there and `--overwrite` was not given.
 *
 * @category errors
 * @since 0.1.0
 */
export class OutputExists extends Schema.TaggedError<OutputExists>()("OutputExists", { message: Schema.String }) {}

/**
 * A run's directory or checkpoint whose model folder cannot be found (no `config.json` naming `model.path`, or no
 * checkpoint in the run).
 *
 * @category errors
 * @since 0.1.0
 */
export class UnknownSource extends Schema.TaggedError<UnknownSource>()("UnknownSource", { message: Schema.String }) {}

/**
 * A dtype the format does not take.
 *
 * @category errors
 * @since 0.1.0
 */
export class UnsupportedDType extends Schema.TaggedError<UnsupportedDType>()("UnsupportedDType", {
  message: Schema.String
}) {}

/**
 * Why an export was refused or failed: the output exists, a dtype the format does not take, or the model folder,
 * the checkpoint or the writer's own error (its message kept).
 *
 * @category errors
 * @since 0.1.0
 */
export class ExportError extends Schema.TaggedError<ExportError>()("ExportError", {
  out: Schema.String,
  reason: Schema.Union([OutputExists, UnsupportedDType, UnknownSource]),
  cause: Schema.optionalKey(Schema.Defect())
}) {
  override get message(): string {
    return this.reason.message
  }
}

const dtypes: Readonly<Record<Format, ReadonlyArray<DType>>> = {
  gguf: ["f32", "f16", "q8_0"],
  hf: ["bf16", "f32"],
  "gguf-lora": ["f32"]
}

// ===== Steps =====

/** The dtype to write, refusing one the format does not take. */
const dtypeOf = (options: ExportOptions): Effect.Effect<DType, ExportError> => {
  const allowed = dtypes[options.format], dtype = options.dtype ?? allowed[0]!
  return allowed.includes(dtype)
    ? Effect.succeed(dtype)
    : Effect.fail(
      new ExportError({
        out: options.out,
        reason: new UnsupportedDType({
          message: `--dtype ${dtype} is not written as ${options.format} ` +
            `(${options.format} takes ${allowed.join(", ")})`
        })
      })
    )
}

/** Refuses an existing output unless `--overwrite`. */
const checkOutput = Effect.fnUntraced(function*(options: ExportOptions) {
  const fs = yield* FileSystem.FileSystem
  if (options.overwrite !== true && (yield* fs.exists(options.out))) {
    return yield* new ExportError({
      out: options.out,
      reason: new OutputExists({ message: `${options.out} exists (--overwrite to replace it)` })
    })
  }
})

/** The model folder a run's `config.json` names (`model.path`, absolute as a run writes it). */
const runModel = Effect.fnUntraced(function*(run: string, out: string) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const file = path.join(run, "config.json")
  const config = (yield* fs.exists(file)) ? yield* readJson(file) : undefined
  const model = (config?.["model"] as { path?: unknown } | undefined)?.path
  if (typeof model !== "string") {
    const message = `${run} looks like a training run, but ${file} names no model.path: give the model folder and ` +
      `--checkpoint`
    return yield* new ExportError({ out, reason: new UnknownSource({ message }) })
  }
  return path.resolve(run, model)
})

/**
 * The model folder and checkpoint SOURCE stands for: a checkpoint (`trainer_state.json`) on its run's model, a run
 * (`checkpoints/`, `journal.jsonl`) at its newest checkpoint, else a model folder.
 */
const resolveSource = Effect.fnUntraced(function*(options: ExportOptions) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const source = options.modelDir
  if (options.checkpoint !== undefined) return { modelDir: source, checkpoint: options.checkpoint }
  if (yield* fs.exists(path.join(source, "trainer_state.json"))) {
    const run = path.dirname(path.dirname(path.resolve(source)))
    return { modelDir: yield* runModel(run, options.out), checkpoint: source }
  }
  const checkpoints = path.join(source, "checkpoints")
  if ((yield* fs.exists(checkpoints)) && (yield* fs.exists(path.join(source, "journal.jsonl")))) {
    const steps = (yield* fs.readDirectory(checkpoints)).filter((n) => n.startsWith("step-")).sort()
    if (steps.length === 0) {
      const message = `${source} is a training run without checkpoints (none in ${checkpoints})`
      return yield* new ExportError({ out: options.out, reason: new UnknownSource({ message }) })
    }
    return { modelDir: yield* runModel(source, options.out), checkpoint: path.join(checkpoints, steps.at(-1)!) }
  }
  return { modelDir: source, checkpoint: undefined }
})

/**
 * The folder's model, with the checkpoint's weights when one is given (checked against the run's journal). A LoRA
 * run's checkpoint holds the adapter alone: it is merged into the base its `adapter_config.json` names (a checkpoint
 * when the run started from one with `model.from`, else the folder). `adapter`, a PEFT folder, is merged last.
 */
const loadModel = Effect.fnUntraced(function*(source: {
  readonly modelDir: string
  readonly checkpoint: string | undefined
}, adapter: string | undefined) {
  const fs = yield* FileSystem.FileSystem
  const folder = yield* ModelFolder.load(source.modelDir)
  const verified = (dir: string) =>
    Effect.map(Journal.verifiedCheckpoint(dir, Qwen2.parameters(folder.config)), (l) => l.weights as Qwen2.Weights)
  let weights: Qwen2.Weights = folder.weights
  const checkpoint = source.checkpoint
  if (checkpoint !== undefined && (yield* fs.exists(`${checkpoint}/adapter_config.json`))) {
    const read = yield* Lora.load(checkpoint, folder.config)
    const trained = yield* Journal.verifiedCheckpoint(checkpoint, Lora.parameters(folder.config, read.config))
    const base = read.baseModel !== undefined && (yield* fs.exists(`${read.baseModel}/trainer_state.json`))
      ? yield* verified(read.baseModel)
      : folder.weights
    weights = Lora.merge(folder.config, read.config, base, trained.weights)
  } else if (checkpoint !== undefined) weights = yield* verified(checkpoint)
  if (adapter !== undefined) {
    const read = yield* Lora.load(adapter, folder.config)
    weights = Lora.merge(folder.config, read.config, weights, read.adapter)
  }
  return { folder, weights }
})

const readJson = Effect.fnUntraced(function*(file: string) {
  const fs = yield* FileSystem.FileSystem
  return JSON.parse(yield* fs.readFileString(file)) as Record<string, unknown>
})

/** `tokenizer_config.json` with the chat template the folder loaded (a template file beside it is folded in). */
const tokenizerConfigOf = Effect.fnUntraced(function*(folder: ModelFolder.ModelFolder) {
  const path = yield* Path.Path
  const config = yield* readJson(path.join(folder.dir, "tokenizer_config.json"))
  return { ...config, chat_template: folder.template.source }
})

/** Replaces `out` with `written` (a complete temporary output beside it). */
const replace = Effect.fnUntraced(function*(written: string, out: string) {
  const fs = yield* FileSystem.FileSystem
  if (yield* fs.exists(out)) yield* fs.remove(out, { recursive: true })
  yield* fs.rename(written, out)
})

type Writer = (
  options: ExportOptions,
  folder: ModelFolder.ModelFolder,
  weights: Qwen2.Weights,
  dtype: DType
) => Effect.Effect<
  string,
  Gguf.GgufError | ModelFolder.ModelFolderError | PlatformError,
  FileSystem.FileSystem | Path.Path
>

const writeGguf: Writer = Effect.fnUntraced(function*(
  options: ExportOptions,
  folder: ModelFolder.ModelFolder,
  weights: Qwen2.Weights,
  dtype: DType
) {
  const path = yield* Path.Path
  // The same type in the metadata (`general.file_type`) and in the tensors.
  const type = dtype === "f16" ? "F16" : dtype === "q8_0" ? "Q8_0" : "F32"
  const contents = yield* Gguf.fromHf({
    name: folder.name,
    config: ModelConfig.toJson(folder.config),
    tensors: Qwen2.parameters(folder.config).map((s) => ({ name: s.name, shape: s.shape, data: weights.get(s.name)! })),
    tokenizer: yield* readJson(path.join(folder.dir, "tokenizer.json")),
    tokenizerConfig: yield* tokenizerConfigOf(folder)
  }, options.out, type)
  const partial = `${options.out}.export-partial`
  yield* Gguf.write(partial, contents, type)
  yield* replace(partial, options.out)
  return `gguf ${dtype.toUpperCase()}, ${contents.tensors.length} tensors`
})

const writeHf: Writer = Effect.fnUntraced(function*(
  options: ExportOptions,
  folder: ModelFolder.ModelFolder,
  weights: Qwen2.Weights,
  dtype: DType
) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const partial = `${options.out}.export-partial`
  yield* fs.remove(partial, { recursive: true, force: true })
  yield* ModelFolder.writeModel(partial, folder.config, weights, { dtype: dtype === "bf16" ? "BF16" : "F32" })
  const torchDtype = dtype === "bf16" ? "bfloat16" : "float32"
  const json = (value: unknown) => JSON.stringify(value, null, 2) + "\n"
  yield* fs.writeFileString(path.join(partial, "config.json"), json(ModelConfig.toJson(folder.config, { torchDtype })))
  yield* fs.copyFile(path.join(folder.dir, "tokenizer.json"), path.join(partial, "tokenizer.json"))
  yield* fs.writeFileString(path.join(partial, "tokenizer_config.json"), json(yield* tokenizerConfigOf(folder)))
  const generation = path.join(folder.dir, "generation_config.json")
  const bos = folder.config.bosTokenId
  const generationConfig = (yield* fs.exists(generation))
    ? yield* readJson(generation)
    : { eos_token_id: folder.stopTokenIds, ...(bos === undefined ? {} : { bos_token_id: bos }) }
  yield* fs.writeFileString(path.join(partial, "generation_config.json"), json(generationConfig))
  yield* replace(partial, options.out)
  return `Hugging Face folder, ${dtype.toUpperCase()} safetensors`
})

/**
 * A LoRA adapter alone as llama.cpp's GGUF LoRA: `--adapter DIR`'s, else the LoRA checkpoint's (SOURCE or
 * `--checkpoint`), for the model folder it adapts.
 */
const writeGgufLora = Effect.fnUntraced(function*(
  options: ExportOptions,
  source: { readonly modelDir: string; readonly checkpoint: string | undefined }
) {
  const fs = yield* FileSystem.FileSystem
  const folder = yield* ModelFolder.load(source.modelDir)
  const dir = options.adapter ?? source.checkpoint
  if (dir === undefined || !(yield* fs.exists(`${dir}/adapter_config.json`))) {
    const message = `--format gguf-lora writes a LoRA adapter: give --adapter DIR or a LoRA run's checkpoint ` +
      `(a folder with adapter_config.json)`
    return yield* new ExportError({ out: options.out, reason: new UnknownSource({ message }) })
  }
  const read = yield* Lora.load(dir, folder.config)
  const contents = yield* Gguf.fromLora({
    name: `${folder.name}-lora`,
    config: ModelConfig.toJson(folder.config),
    alpha: read.config.alpha,
    tensors: Lora.parameters(folder.config, read.config).map((p) => ({ ...p, data: read.adapter.get(p.name)! }))
  }, options.out)
  const partial = `${options.out}.export-partial`
  yield* Gguf.write(partial, contents, "F32").pipe(
    Effect.tapError(() => fs.remove(partial, { force: true }).pipe(Effect.ignore))
  )
  yield* replace(partial, options.out)
  return `wrote ${options.out}: GGUF LoRA adapter of ${dir} (r ${read.config.rank}, alpha ${read.config.alpha}, ` +
    `${contents.tensors.length} tensors) for ${folder.name}`
})

/**
 * Exports a model folder (or a checkpoint of it) as GGUF or as a Hugging Face folder, or a LoRA adapter as a GGUF
 * LoRA; returns the line printed.
 *
 * @category constructors
 * @since 0.1.0
 */
export const exportModel = Effect.fn("export")(function*(options: ExportOptions) {
  const fs = yield* FileSystem.FileSystem
  const dtype = yield* dtypeOf(options)
  yield* checkOutput(options)
  const source = yield* resolveSource(options)
  if (options.format === "gguf-lora") return yield* writeGgufLora(options, source)
  const { folder, weights } = yield* loadModel(source, options.adapter)
  const partial = `${options.out}.export-partial`
  const write = options.format === "gguf" ? writeGguf : writeHf
  const written = yield* write(options, folder, weights, dtype).pipe(
    Effect.tapError(() => fs.remove(partial, { recursive: true, force: true }).pipe(Effect.ignore))
  )
  const c = folder.config
  return `wrote ${options.out}: ${written}; ${c.modelType}, ${c.numHiddenLayers} layers, width ${c.hiddenSize}, ` +
    `vocab ${c.vocabSize}` + (source.checkpoint === undefined ? "" : `, weights of ${source.checkpoint}`) +
    (options.adapter === undefined ? "" : `, merged with the adapter ${options.adapter}`)
})

/**
 * @category commands
 * @since 0.1.0
 */
export const exportCommand = Command.make(
  "export",
  {
    modelDir: Argument.String("source").pipe(
      Argument.withDescription(
        "A model folder, a training run's output directory (its newest checkpoint) or one of its checkpoints"
      )
    ),
    checkpoint: Flag.Directory("checkpoint").pipe(
      Flag.withDescription("Export a training run's weights at this checkpoint (RUN/checkpoints/step-NNNNNN)"),
      Flag.optional
    ),
    format: Flag.Literals("format", ["gguf", "hf", "gguf-lora"]).pipe(
      Flag.withDescription(
        "gguf: one file for llama.cpp/Ollama/LM Studio; hf: a Hugging Face folder; gguf-lora: a LoRA adapter alone " +
          "for llama.cpp's --lora"
      )
    ),
    out: Flag.String("out").pipe(Flag.withDescription("The GGUF file or the folder to write")),
    dtype: Flag.Literals("dtype", ["f32", "f16", "q8_0", "bf16"]).pipe(
      Flag.withDescription("gguf: f32 (default), f16 or q8_0; hf: bf16 (default) or f32"),
      Flag.optional
    ),
    overwrite: Flag.Boolean("overwrite").pipe(
      Flag.withDescription("Replace an existing output"),
      Flag.withDefault(false)
    ),
    adapter: Flag.Directory("adapter").pipe(
      Flag.withDescription(
        "A PEFT LoRA adapter folder to merge into the weights (a LoRA run's checkpoint is merged anyway)"
      ),
      Flag.optional
    )
  },
  Effect.fn("exportCommand")(function*({ modelDir, checkpoint, format, out, dtype, overwrite, adapter }) {
    const line = yield* exportModel({
      modelDir,
      checkpoint: Option.getOrUndefined(checkpoint),
      adapter: Option.getOrUndefined(adapter),
      format,
      out,
      dtype: Option.getOrUndefined(dtype),
      overwrite
    }).pipe(exitOnFailure)
    if (line !== undefined) yield* Console.log(line)
  })
).pipe(Command.withDescription("Export a model or a checkpoint as GGUF (llama.cpp, Ollama) or a Hugging Face folder"))
