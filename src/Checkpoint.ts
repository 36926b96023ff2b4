/**
 * Learner checkpoints: everything needed to resume training bit-for-bit on CPU.
 *
 * A checkpoint is a directory:
 * - `model.safetensors`: the weights (float32, Hugging Face names), loadable by any safetensors reader;
 * - `optimizer.safetensors`: AdamW moments as `m.<name>` and `v.<name>` (F32, or BF16 bit for bit when the run keeps
 *   them in bfloat16: `Optimizer.Precision`);
 * - `trainer_state.json`: format tag, optimiser step, policy version, the run's RNG state, the weight names and the
 *   weights' {@link fingerprint}.
 *
 * `trainer_state.json` is written last, after both tensor files, so a checkpoint interrupted mid-write has no state
 * file and is reported as `Incomplete` rather than loaded half-written. A load checks what it read: every tensor
 * present with its shape, every value finite (`NonFinite`), and the weights' fingerprint equal to the one saved
 * (`Corrupt`: a file altered or damaged after the save). Anything unreadable is a typed `CheckpointError`, never a
 * crash.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Schema } from "effect"
import { createHash } from "node:crypto"
import type * as Optimizer from "./Optimizer.ts"
import * as DiskFullCheck from "./internal/diskFull.ts"
import * as Safetensors from "./Safetensors.ts"

// ===== Models =====

/**
 * A named tensor with its shape.
 *
 * @category models
 * @since 0.1.0
 */
export interface NamedTensor {
  readonly name: string
  readonly shape: ReadonlyArray<number>
  readonly data: Float32Array
}

/**
 * What a checkpoint holds.
 *
 * @category models
 * @since 0.1.0
 */
export interface State {
  readonly weights: ReadonlyArray<NamedTensor>
  readonly optimizer: Optimizer.State
  readonly policyVersion: number
  readonly rngState: ReadonlyArray<number>
}

const StateFile = Schema.Struct({
  format: Schema.Literal("agentfly-checkpoint/1"),
  step: Schema.Int,
  policyVersion: Schema.Int,
  rngState: Schema.Array(Schema.Number),
  weights: Schema.Array(Schema.String),
  /** Absent in checkpoints written before it was added. */
  weightsHash: Schema.optionalKey(Schema.String)
})
const decodeStateFile = Schema.decodeUnknownEffect(Schema.fromJsonString(StateFile))

/**
 * No checkpoint at the path.
 *
 * @category errors
 * @since 0.1.0
 */
export class NotFound extends Schema.TaggedError<NotFound>()("NotFound", { message: Schema.String }) {}

/**
 * A file of the checkpoint is missing (a save that did not finish).
 *
 * @category errors
 * @since 0.1.0
 */
export class Incomplete extends Schema.TaggedError<Incomplete>()("Incomplete", { message: Schema.String }) {}

/**
 * A file was altered or damaged after the save (unreadable, or not the weights saved).
 *
 * @category errors
 * @since 0.1.0
 */
export class Corrupt extends Schema.TaggedError<Corrupt>()("Corrupt", {
  message: Schema.String,
  /** The parse error, when a file could not be read. */
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The checkpoint does not hold the weights expected (a tensor missing, of another shape, or one too many).
 *
 * @category errors
 * @since 0.1.0
 */
export class Mismatch extends Schema.TaggedError<Mismatch>()("Mismatch", { message: Schema.String }) {}

/**
 * A weight or optimizer moment is NaN or infinite.
 *
 * @category errors
 * @since 0.1.0
 */
export class NonFinite extends Schema.TaggedError<NonFinite>()("NonFinite", { message: Schema.String }) {}

/**
 * A write found no space left on the device (ENOSPC).
 *
 * @category errors
 * @since 0.1.0
 */
export class DiskFull extends Schema.TaggedError<DiskFull>()("DiskFull", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Any other file system failure.
 *
 * @category errors
 * @since 0.1.0
 */
export class Io extends Schema.TaggedError<Io>()("Io", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Why a checkpoint could not be saved or loaded.
 *
 * @category errors
 * @since 0.1.0
 */
export const CheckpointErrorReason = Schema.Union([NotFound, Incomplete, Corrupt, Mismatch, NonFinite, DiskFull, Io])
export type CheckpointErrorReason = typeof CheckpointErrorReason.Type

/**
 * A checkpoint could not be saved or loaded at `path`. Handle reasons with
 * `Effect.catchReason("CheckpointError", "NotFound", …)`; `message` is the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class CheckpointError extends Schema.TaggedError<CheckpointError>()("CheckpointError", {
  path: Schema.String,
  reason: CheckpointErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `checkpointError`; a reason left out is a compile error. */
const reasons = { NotFound, Incomplete, Corrupt, Mismatch, NonFinite, DiskFull, Io } satisfies Record<
  CheckpointErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message (the `cause` of `Corrupt`, `DiskFull` and `Io`).
 *
 * @category errors
 * @since 0.1.0
 */
export type CheckpointErrorFacts<Tag extends CheckpointErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `CheckpointError` at `path` for the reason tagged `tag`: `checkpointError(dir, "NotFound", text)`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const checkpointError = <Tag extends CheckpointErrorReason["_tag"]>(
  path: string,
  tag: Tag,
  message: string,
  facts?: CheckpointErrorFacts<Tag>
): CheckpointError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => CheckpointErrorReason
  return new CheckpointError({ path, reason: new Reason({ ...facts, message }) })
}

const io = (path: string) => (e: { readonly message: string }) =>
  DiskFullCheck.isDiskFull(e)
    ? checkpointError(
      path,
      "DiskFull",
      `${DiskFullCheck.marker}: could not write ${path}; free space on its filesystem, then resume`,
      { cause: e }
    )
    : checkpointError(path, "Io", e.message, { cause: e })

/**
 * SHA-256 over every tensor's name and bytes, in name order, cut to 16 hex digits: equal fingerprints mean
 * bit-identical weights (with overwhelming probability). The run journal records it after every learner step and
 * checkpoint, so its cost counts at real sizes: ≈ 1.5 s a GB on 2 busy cores, where the byte loop of FNV-1a it
 * replaced took ≈ 2.8 s.
 *
 * @category getters
 * @since 0.1.0
 */
export const fingerprint = (weights: ReadonlyMap<string, Float32Array>): string => {
  const hash = createHash("sha256")
  for (const name of [...weights.keys()].sort()) {
    const w = weights.get(name)!
    hash.update(name)
    hash.update(new Uint8Array(w.buffer, w.byteOffset, w.byteLength))
  }
  return hash.digest("hex").slice(0, 16)
}

/**
 * The first value that is NaN or ±Infinity in named tensors, as `name[index] = value` (undefined when all are
 * finite). A learner step that produced one, or a checkpoint that holds one, is refused: such weights only ever
 * sample garbage.
 *
 * @category getters
 * @since 0.1.0
 */
export const firstNonFinite = (
  tensors: Iterable<readonly [string, Float32Array | Optimizer.Moment]>
): string | undefined => {
  for (const [name, data] of tensors) {
    if (data instanceof Uint16Array) {
      // bfloat16 bits (optimizer moments): NaN or ±Infinity when the exponent's 8 bits are all set.
      for (let i = 0; i < data.length; i++) {
        if ((data[i]! & 0x7f80) === 0x7f80) return `${name}[${i}] = ${data[i]! & 0x7f ? NaN : "±Infinity"}`
      }
      continue
    }
    for (let i = 0; i < data.length; i++) {
      if (!Number.isFinite(data[i]!)) return `${name}[${i}] = ${data[i]}`
    }
  }
  return undefined
}

// ===== Save =====

/**
 * @category models
 * @since 0.1.0
 */
export interface SaveOptions {
  /** Shard size limit of the weight and optimizer files (default 2 GB; tests set it low to exercise shards). */
  readonly maxShardBytes?: number
  /**
   * A LoRA run's adapter settings (`adapter_config.json`'s contents): the weights, which are then the adapter's
   * tensors under PEFT's names, are also written as PEFT's `adapter_model.safetensors` beside that file, so the
   * checkpoint folder loads in PEFT, vLLM and SGLang as it is.
   */
  readonly adapterConfig?: Readonly<Record<string, unknown>>
}

/** A write failure of the tensor files, at the file it names: `DiskFull` when the disk is, else `Io`. */
const writeError = (e: Safetensors.SafetensorsError) => io(e.file)(e)

/**
 * Writes a checkpoint into `dir` (created if needed; existing files are replaced). The weights and the moments are
 * streamed as F32 safetensors, sharded past `maxShardBytes` as Hugging Face shards them, so a model of any size
 * saves without a second copy in memory.
 *
 * @category constructors
 * @since 0.1.0
 */
export const save = Effect.fn("Checkpoint.save")(function*(dir: string, state: State, options: SaveOptions = {}) {
  const fs = yield* FileSystem.FileSystem
  const bad = firstNonFinite(state.weights.map((w) => [w.name, w.data] as const)) ??
    firstNonFinite(state.optimizer.m) ?? firstNonFinite(state.optimizer.v)
  if (bad !== undefined) {
    return yield* checkpointError(dir, "NonFinite", `not saved: ${bad} is not finite`)
  }
  yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(io(dir)))
  const statePath = `${dir}/trainer_state.json`
  // Remove the commit marker first: a crash below leaves an Incomplete checkpoint, not a mix of old and new.
  if (yield* fs.exists(statePath).pipe(Effect.mapError(io(statePath)))) {
    yield* fs.remove(statePath).pipe(Effect.mapError(io(statePath)))
  }
  const moments = state.weights.flatMap((w) => [
    { name: `m.${w.name}`, shape: w.shape, data: state.optimizer.m.get(w.name)! },
    { name: `v.${w.name}`, shape: w.shape, data: state.optimizer.v.get(w.name)! }
  ])
  const shards = options.maxShardBytes === undefined ? {} : { maxShardBytes: options.maxShardBytes }
  yield* Safetensors.writeSharded(dir, "model", state.weights, { ...shards, metadata: { format: "pt" } }).pipe(
    Effect.mapError(writeError)
  )
  // bfloat16 moments are written as BF16, bit for bit (an exact resume reads back what the run held).
  const bf16 = moments.length > 0 && moments[0]!.data instanceof Uint16Array
  yield* Safetensors.writeSharded(dir, "optimizer", moments, { ...shards, dtype: bf16 ? "BF16" : "F32" }).pipe(
    Effect.mapError(writeError)
  )
  if (options.adapterConfig !== undefined) {
    yield* Safetensors.writeSharded(dir, "adapter_model", state.weights, { ...shards, metadata: { format: "pt" } })
      .pipe(Effect.mapError(writeError))
    const config = `${dir}/adapter_config.json`
    yield* fs.writeFileString(config, JSON.stringify(options.adapterConfig, null, 2) + "\n").pipe(
      Effect.mapError(io(config))
    )
  }
  const json = JSON.stringify({
    format: "agentfly-checkpoint/1",
    step: state.optimizer.step,
    policyVersion: state.policyVersion,
    rngState: state.rngState,
    weights: state.weights.map((w) => w.name),
    weightsHash: fingerprint(new Map(state.weights.map((w) => [w.name, w.data])))
  })
  yield* fs.writeFileString(`${statePath}.tmp`, json).pipe(Effect.mapError(io(statePath)))
  yield* fs.rename(`${statePath}.tmp`, statePath).pipe(Effect.mapError(io(statePath)))
})

/**
 * The files of the checkpoint in `dir`, in the order a copy should write them: tensor files and their indexes
 * (`model*`, `optimizer*`), then `trainer_state.json` last, the commit marker. A copy made in this order (as a remote
 * trainer sends a checkpoint) is never mistaken for a complete one while under way.
 *
 * @category getters
 * @since 0.1.0
 */
export const files = Effect.fn("Checkpoint.files")(function*(dir: string) {
  const fs = yield* FileSystem.FileSystem
  const entries = yield* fs.readDirectory(dir).pipe(Effect.mapError(io(dir)))
  return inWriteOrder(entries.filter(isTensorFile))
})

/** A checkpoint's tensor file or shard index: `model*` or `optimizer*` safetensors, nothing else (no paths). */
const isTensorFile = (name: string): boolean =>
  /^(model|optimizer)(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?$/.test(name)

/**
 * Whether `name` is one of a checkpoint's files (a tensor file, a shard index or `trainer_state.json`): what a
 * trainer server accepts as a file name sent to it.
 *
 * @category predicates
 * @since 0.1.0
 */
export const isFileName = (name: string): boolean => name === "trainer_state.json" || isTensorFile(name)

/**
 * The first part of a checkpoint that `names` (its file names) lack: `model.safetensors`, `optimizer.safetensors`
 * (either may be shards and their index) or `trainer_state.json`; `undefined` when all are there.
 *
 * @category getters
 * @since 0.1.0
 */
export const missingPart = (names: ReadonlyArray<string>): string | undefined =>
  ["model.safetensors", "optimizer.safetensors", "trainer_state.json"].find((needed) =>
    !names.some((name) => name === needed || name.startsWith(needed.replace(".safetensors", "-")))
  )

/**
 * Tensor file names in the order a copy writes them, `trainer_state.json` appended last: shards before their index
 * (the index names them, so it is written once they are all there).
 *
 * @category getters
 * @since 0.1.0
 */
export const inWriteOrder = (tensorFiles: ReadonlyArray<string>): Array<string> => {
  const rank = (f: string) => (f.endsWith(".index.json") ? 1 : 0)
  return [...tensorFiles].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b)).concat("trainer_state.json")
}

// ===== Load =====

/** A read failure of the tensor files: a missing file (the only file, or a shard) means a save that did not finish. */
const readError = (e: Safetensors.SafetensorsError): CheckpointError => {
  switch (e.reason._tag) {
    case "NotFound":
      // A missing shard's message names the index that lists it; a missing single file's only says it is missing.
      const message = e.message.startsWith("cannot read") ? `${e.file} is missing` : e.message
      return checkpointError(e.file, "Incomplete", message)
    case "PermissionDenied":
    case "NotAFile":
    case "Io":
      return checkpointError(e.file, "Io", e.message, { cause: e })
    default:
      return checkpointError(e.file, "Corrupt", e.message, { cause: e })
  }
}

/** The index of `prefix`'s tensors, checked to hold exactly `expected` with their shapes, in one of `dtypes`. */
const checkedIndex = Effect.fnUntraced(function*(
  dir: string,
  prefix: "model" | "optimizer",
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>,
  dtypes: ReadonlyArray<Safetensors.DType>
) {
  const index = yield* Safetensors.readIndex(dir, prefix).pipe(Effect.mapError(readError))
  const path = index.file
  for (const { name, shape } of expected) {
    const t = index.tensors.get(name)
    if (t === undefined) {
      return yield* checkpointError(path, "Mismatch", `tensor ${name} is missing`)
    }
    if (!dtypes.includes(t.dtype) || t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      const what = `tensor ${name}: ${t.dtype} [${t.shape}] where ${dtypes.join(" or ")} [${shape}] is expected`
      return yield* checkpointError(t.file, "Mismatch", what)
    }
  }
  if (index.tensors.size !== expected.length) {
    const extra = [...index.tensors.keys()].filter((k) => !expected.some((e) => e.name === k))
    return yield* checkpointError(path, "Mismatch", `unexpected tensors: ${extra.join(", ")}`)
  }
  return index
})

/** The weights: F32 only (a checkpoint holds them exactly). */
const readWeights = (
  dir: string,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
) =>
  Effect.flatMap(
    checkedIndex(dir, "model", expected, ["F32"]),
    (index) => Safetensors.readTensors(index, expected).pipe(Effect.mapError(readError))
  )

/** AdamW's moments: F32, or BF16 kept as bits (`Optimizer.Precision` "bfloat16"). */
const readMoments = (
  dir: string,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
) =>
  Effect.flatMap(
    checkedIndex(dir, "optimizer", expected, ["F32", "BF16"]),
    (index) => Safetensors.readTensorsKeepingBf16(index, expected).pipe(Effect.mapError(readError))
  )

/**
 * Reads a checkpoint, checking it holds exactly the `expected` weights with their shapes. Tensor files are streamed
 * (single or sharded, of any size); checkpoints written before sharding (one `model.safetensors` and one
 * `optimizer.safetensors`) load as they did.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fn("Checkpoint.load")(function*(
  dir: string,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
) {
  const fs = yield* FileSystem.FileSystem
  if (!(yield* fs.exists(dir).pipe(Effect.mapError(io(dir))))) {
    return yield* checkpointError(dir, "NotFound", `no checkpoint at ${dir}`)
  }
  const statePath = `${dir}/trainer_state.json`
  if (!(yield* fs.exists(statePath).pipe(Effect.mapError(io(statePath))))) {
    return yield* checkpointError(statePath, "Incomplete", `${statePath} is missing`)
  }
  const text = yield* fs.readFileString(statePath).pipe(Effect.mapError(io(statePath)))
  const meta = yield* decodeStateFile(text).pipe(
    Effect.mapError((e) => checkpointError(statePath, "Corrupt", e.message, { cause: e }))
  )
  const weights = yield* readWeights(dir, expected)
  const moments = yield* readMoments(
    dir,
    expected.flatMap((e) => [{ name: `m.${e.name}`, shape: e.shape }, { name: `v.${e.name}`, shape: e.shape }])
  )
  const bad = firstNonFinite(weights) ?? firstNonFinite(moments)
  if (bad !== undefined) {
    return yield* checkpointError(dir, "NonFinite", `${dir}: ${bad} is not finite`)
  }
  const hash = fingerprint(weights)
  if (meta.weightsHash !== undefined && meta.weightsHash !== hash) {
    const modelPath = yield* weightsFile(dir)
    return yield* checkpointError(
      modelPath,
      "Corrupt",
      `${modelPath} does not hold the weights saved (fingerprint ${hash}, saved ${meta.weightsHash})`
    )
  }
  const optimizer: Optimizer.State = {
    step: meta.step,
    m: new Map(expected.map((e) => [e.name, moments.get(`m.${e.name}`)!])),
    v: new Map(expected.map((e) => [e.name, moments.get(`v.${e.name}`)!]))
  }
  return { weights, optimizer, policyVersion: meta.policyVersion, rngState: meta.rngState, weightsHash: hash }
})

/** The file that names the weights: the index of sharded weights, else `model.safetensors`. */
const weightsFile = Effect.fnUntraced(function*(dir: string) {
  const fs = yield* FileSystem.FileSystem
  const index = `${dir}/model.safetensors.index.json`
  return (yield* fs.exists(index).pipe(Effect.orElseSucceed(() => false))) ? index : `${dir}/model.safetensors`
})
