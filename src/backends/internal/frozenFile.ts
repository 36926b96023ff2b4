/**
 * A LoRA run's frozen base in one file, for the trainer's worker threads (`OnnxTrainer.Options.workers` > 1).
 *
 * onnxruntime-node 1.30 refuses a tensor over a `SharedArrayBuffer` (`Invalid argument`), so a worker cannot be fed
 * the main thread's base; copying it to every worker cost a base a worker (BENCHMARKS.md, "lora"). Instead the
 * workers' training graphs take the base as external-data initializers read from this file, which onnxruntime maps
 * into memory rather than copying it: every session of every worker reads the same page-cache pages, one physical
 * copy per trainer. Two onnxruntime passes would copy it again, so the workers' sessions turn them off
 * ({@link sessionOptions}): pre-packing (a packed copy of each MatMul weight, per session) and constant folding
 * (`Transpose(W)` of an initializer folded into a transposed copy, per session). Neither changes a bit of the
 * results: the graph computes what it computes with the base as an input (test/src/Lora.test.ts).
 *
 * The file is written once per base and process ({@link acquire}): trainers over the same weights (a Tinker server's
 * adapters on one base) share it, and it is removed from its temporary folder when the last of them closes (a process
 * killed with `kill -9` leaves it behind in the system's temporary folder; a trainer opened after the last one closed
 * writes it again).
 */
import { Effect, Exit, FileSystem, Scope, Semaphore } from "effect"
import type * as ort from "onnxruntime-node"
import * as Graph from "../../onnx/Graph.ts"

/** The file's name in its folder (the `location` every initializer names). */
export const location = "frozen-base.bin"

/**
 * Each tensor starts at a multiple of this many bytes: page-aligned for `mmap` on every platform (64 KiB is
 * Windows' allocation granularity), so that no page holds two tensors.
 */
export const alignment = 65_536

/** Where each frozen weight lies in the file, and the file's size in bytes. */
export interface Layout {
  readonly entries: ReadonlyMap<string, Graph.ExternalData>
  readonly bytes: number
}

/** A written file: its folder (what onnxruntime resolves `location` against) and its layout. */
export interface FrozenFile extends Layout {
  readonly folder: string
}

/** float32 weights in order, each at the next multiple of {@link alignment}. */
export const layout = (
  parameters: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
): Layout => {
  const entries = new Map<string, Graph.ExternalData>()
  let offset = 0
  for (const { name, shape } of parameters) {
    const length = 4 * shape.reduce((a, b) => a * b, 1)
    entries.set(name, { location, offset, length })
    offset = Math.ceil((offset + length) / alignment) * alignment
  }
  const last = [...entries.values()].at(-1)
  return { entries, bytes: last === undefined ? 0 : last.offset + last.length }
}

/**
 * Writes `weights` (in `parameters`' order, as {@link layout} places them) into a fresh temporary folder that is
 * removed when the current scope closes. Writes the arrays themselves (no copy of the base in memory).
 */
export const write = Effect.fnUntraced(function*(
  parameters: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>,
  weights: ReadonlyMap<string, Float32Array>
) {
  const fs = yield* FileSystem.FileSystem
  const folder = yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-frozen-" })
  const { entries, bytes } = layout(parameters)
  yield* Effect.scoped(Effect.gen(function*() {
    const file = yield* fs.open(`${folder}/${location}`, { flag: "w" })
    let written = 0
    for (const { name } of parameters) {
      const w = weights.get(name)!, at = entries.get(name)!.offset
      if (at > written) yield* file.writeAll(new Uint8Array(at - written)) // zero padding up to the alignment
      yield* file.writeAll(new Uint8Array(w.buffer, w.byteOffset, w.byteLength))
      written = at + w.byteLength
    }
  }))
  return { folder, entries, bytes } satisfies FrozenFile
})

/** A written file and the trainers using it. */
interface Shared {
  readonly file: FrozenFile
  readonly scope: Scope.Closeable
  users: number
}

// Process-wide on purpose: "once per process" is the point. Keyed by the weights' identity, so that only trainers
// over the very same arrays share a file; the lock keeps two trainers starting at once from writing it twice.
const files = new WeakMap<ReadonlyMap<string, Float32Array>, Shared>()
const lock = Semaphore.makeUnsafe(1)

const release = (weights: ReadonlyMap<string, Float32Array>, shared: Shared) =>
  lock.withPermits(1)(Effect.suspend(() => {
    if (--shared.users > 0) return Effect.void
    files.delete(weights)
    return Scope.close(shared.scope, Exit.void)
  }))

/**
 * The file of `weights` for the current scope: the one another trainer of this process already holds for the same
 * arrays, or written ({@link write}). Removed when the last scope holding it closes. `parameters` must be the same
 * for the same weights (they are the model's frozen parameters).
 */
export const acquire = (
  parameters: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>,
  weights: ReadonlyMap<string, Float32Array>
) =>
  Effect.acquireRelease(
    lock.withPermits(1)(Effect.suspend(() => {
      const hit = files.get(weights)
      if (hit !== undefined) {
        hit.users++
        return Effect.succeed({ shared: hit, written: false })
      }
      return Effect.gen(function*() {
        const scope = yield* Scope.make()
        const file = yield* write(parameters, weights).pipe(
          Scope.provide(scope),
          Effect.onError(() => Scope.close(scope, Exit.void))
        )
        const shared: Shared = { file, scope, users: 1 }
        files.set(weights, shared)
        return { shared, written: true }
      })
    })),
    ({ shared }) => release(weights, shared)
  ).pipe(Effect.map(({ shared, written }) => ({ file: shared.file, written })))

/**
 * The options of a session whose graph reads the base from `folder`: the graph's bytes name no folder (the session
 * is made from bytes), pre-packing and constant folding off (see the module notes); other settings kept.
 */
export const sessionOptions = (
  options: ort.InferenceSession.SessionOptions,
  folder: string
): ort.InferenceSession.SessionOptions => {
  const extra = (options.extra ?? {}) as { readonly session?: object; readonly optimization?: object }
  return {
    ...options,
    extra: {
      ...extra,
      session: {
        ...extra.session,
        disable_prepacking: "1",
        model_external_initializers_file_folder_path: folder
      },
      optimization: { ...extra.optimization, disable_specified_optimizers: "ConstantFolding" }
    }
  }
}

/**
 * The graph's bytes with its frozen inputs as initializers in the file (the graph keeps its other inputs).
 */
export const modelBytes = (graph: Graph.Graph, file: Layout): Uint8Array =>
  Graph.toModelBytes(graph, { external: file.entries })
