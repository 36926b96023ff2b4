/**
 * Learner checkpoints: everything needed to resume training bit-for-bit on CPU.
 *
 * A checkpoint is a directory:
 * - `model.safetensors`: the weights (float32, Hugging Face names), loadable by any safetensors reader;
 * - `optimizer.safetensors`: AdamW moments as `m.<name>` and `v.<name>`;
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
import type * as Optimizer from "./Optimizer.ts"
import * as DiskFull from "./internal/diskFull.ts"
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
 * Why a checkpoint could not be saved or loaded.
 *
 * @category errors
 * @since 0.1.0
 */
export class CheckpointError extends Schema.TaggedError<CheckpointError>()("CheckpointError", {
  reason: Schema.Literals(["NotFound", "Incomplete", "Corrupt", "Mismatch", "NonFinite", "DiskFull", "Io"]),
  path: Schema.String,
  message: Schema.String
}) {}

const io = (path: string) => (e: { readonly message: string }) =>
  DiskFull.isDiskFull(e)
    ? new CheckpointError({
      reason: "DiskFull",
      path,
      message: `${DiskFull.marker}: could not write ${path}; free space on its filesystem, then resume`
    })
    : new CheckpointError({ reason: "Io", path, message: e.message })

/**
 * FNV-1a over the bytes of every tensor, in name order: equal fingerprints mean bit-identical weights (with
 * overwhelming probability). The run journal records it after every learner step and checkpoint.
 *
 * @category getters
 * @since 0.1.0
 */
export const fingerprint = (weights: ReadonlyMap<string, Float32Array>): string => {
  let h1 = 0x811c9dc5
  let h2 = 0x01000193
  for (const name of [...weights.keys()].sort()) {
    const w = weights.get(name)!
    const bytes = new Uint8Array(w.buffer, w.byteOffset, w.byteLength)
    for (let i = 0; i < bytes.length; i++) {
      h1 = Math.imul(h1 ^ bytes[i]!, 0x01000193)
      h2 = Math.imul(h2 ^ bytes[i]!, 0x5bd1e995)
    }
  }
  return (h1 >>> 0).toString(16).padStart(8, "0") + (h2 >>> 0).toString(16).padStart(8, "0")
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
  tensors: Iterable<readonly [string, Float32Array]>
): string | undefined => {
  for (const [name, data] of tensors) {
    for (let i = 0; i < data.length; i++) {
      if (!Number.isFinite(data[i]!)) return `${name}[${i}] = ${data[i]}`
    }
  }
  return undefined
}

// ===== Save =====

/**
 * Writes a checkpoint into `dir` (created if needed; existing files are replaced).
 *
 * @category constructors
 * @since 0.1.0
 */
export const save = Effect.fn("Checkpoint.save")(function*(dir: string, state: State) {
  const fs = yield* FileSystem.FileSystem
  const bad = firstNonFinite(state.weights.map((w) => [w.name, w.data] as const)) ??
    firstNonFinite(state.optimizer.m) ?? firstNonFinite(state.optimizer.v)
  if (bad !== undefined) {
    return yield* new CheckpointError({ reason: "NonFinite", path: dir, message: `not saved: ${bad} is not finite` })
  }
  yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(io(dir)))
  const statePath = `${dir}/trainer_state.json`
  // Remove the commit marker first: a crash below leaves an Incomplete checkpoint, not a mix of old and new.
  if (yield* fs.exists(statePath).pipe(Effect.mapError(io(statePath)))) {
    yield* fs.remove(statePath).pipe(Effect.mapError(io(statePath)))
  }
  const model = Safetensors.serialize(state.weights, { format: "pt" })
  const moments = state.weights.flatMap((w) => [
    { name: `m.${w.name}`, shape: w.shape, data: state.optimizer.m.get(w.name)! },
    { name: `v.${w.name}`, shape: w.shape, data: state.optimizer.v.get(w.name)! }
  ])
  yield* fs.writeFile(`${dir}/model.safetensors`, model).pipe(Effect.mapError(io(`${dir}/model.safetensors`)))
  yield* fs.writeFile(`${dir}/optimizer.safetensors`, Safetensors.serialize(moments)).pipe(
    Effect.mapError(io(`${dir}/optimizer.safetensors`))
  )
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

// ===== Load =====

const readTensors = Effect.fnUntraced(function*(
  fs: FileSystem.FileSystem,
  path: string,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
) {
  if (!(yield* fs.exists(path).pipe(Effect.mapError(io(path))))) {
    return yield* new CheckpointError({ reason: "Incomplete", path, message: `${path} is missing` })
  }
  const bytes = yield* fs.readFile(path).pipe(Effect.mapError(io(path)))
  const file = yield* Safetensors.parse(bytes, path).pipe(
    Effect.mapError((e) => new CheckpointError({ reason: "Corrupt", path, message: e.message }))
  )
  const out = new Map<string, Float32Array>()
  for (const { name, shape } of expected) {
    const t = file.tensors.get(name)
    if (t === undefined) {
      return yield* new CheckpointError({ reason: "Mismatch", path, message: `tensor ${name} is missing` })
    }
    if (t.dtype !== "F32" || t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      return yield* new CheckpointError({
        reason: "Mismatch",
        path,
        message: `tensor ${name}: ${t.dtype} [${t.shape}] where F32 [${shape}] is expected`
      })
    }
    // Copy into a fresh aligned array (the bytes may be a view into a pooled Node Buffer).
    const data = new Float32Array(t.bytes.byteLength / 4)
    new Uint8Array(data.buffer).set(t.bytes)
    out.set(name, data)
  }
  if (file.tensors.size !== expected.length) {
    const extra = [...file.tensors.keys()].filter((k) => !expected.some((e) => e.name === k))
    return yield* new CheckpointError({ reason: "Mismatch", path, message: `unexpected tensors: ${extra.join(", ")}` })
  }
  return out
})

/**
 * Reads a checkpoint, checking it holds exactly the `expected` weights with their shapes.
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
    return yield* new CheckpointError({ reason: "NotFound", path: dir, message: `no checkpoint at ${dir}` })
  }
  const statePath = `${dir}/trainer_state.json`
  if (!(yield* fs.exists(statePath).pipe(Effect.mapError(io(statePath))))) {
    return yield* new CheckpointError({ reason: "Incomplete", path: statePath, message: `${statePath} is missing` })
  }
  const text = yield* fs.readFileString(statePath).pipe(Effect.mapError(io(statePath)))
  const meta = yield* decodeStateFile(text).pipe(
    Effect.mapError((e) => new CheckpointError({ reason: "Corrupt", path: statePath, message: e.message }))
  )
  const modelPath = `${dir}/model.safetensors`
  const weights = yield* readTensors(fs, modelPath, expected)
  const moments = yield* readTensors(
    fs,
    `${dir}/optimizer.safetensors`,
    expected.flatMap((e) => [{ name: `m.${e.name}`, shape: e.shape }, { name: `v.${e.name}`, shape: e.shape }])
  )
  const bad = firstNonFinite(weights) ?? firstNonFinite(moments)
  if (bad !== undefined) {
    return yield* new CheckpointError({ reason: "NonFinite", path: dir, message: `${dir}: ${bad} is not finite` })
  }
  const hash = fingerprint(weights)
  if (meta.weightsHash !== undefined && meta.weightsHash !== hash) {
    return yield* new CheckpointError({
      reason: "Corrupt",
      path: modelPath,
      message: `${modelPath} does not hold the weights saved (fingerprint ${hash}, saved ${meta.weightsHash})`
    })
  }
  const optimizer: Optimizer.State = {
    step: meta.step,
    m: new Map(expected.map((e) => [e.name, moments.get(`m.${e.name}`)!])),
    v: new Map(expected.map((e) => [e.name, moments.get(`v.${e.name}`)!]))
  }
  return { weights, optimizer, policyVersion: meta.policyVersion, rngState: meta.rngState, weightsHash: hash }
})
