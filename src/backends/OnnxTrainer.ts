/**
 * The local `GradientBackend`: the model's training graph (forward, loss head and reverse-mode gradients, built by
 * `autodiff/Autodiff.ts`) runs on onnxruntime-node; gradients accumulate over micro-batches in float32; AdamW with
 * clipping and the learning-rate schedule runs in TypeScript (`Optimizer.ts`).
 *
 * Shapes are static, so one `InferenceSession` exists per micro-batch shape `(batch, length)`, created on first use
 * and kept in a small LRU cache (creation costs 0.1–0.5 s; `Packing` rounds lengths to limit distinct shapes).
 * Weights are fed as graph inputs from the optimiser's own arrays: nothing is re-serialised per step.
 *
 * Memory (see `MemoryEstimate.ts` and `scripts/learner-memory.ts`): the weights, AdamW's two moments and the
 * gradient accumulator (16 bytes a parameter, 12 with the moments in bfloat16: `Options.moments`; the first
 * micro-batch of a step writes its gradients straight into the accumulator), the activations of a micro-batch,
 * onnxruntime-node's copy of the gradients at the end of each run (freed at once: `Options.releaseOutputs`), and the
 * output head in tiles of tokens × vocabulary (`autodiff/ChunkedHead.ts`): a whole micro-batch's logits are never held.
 *
 * Determinism: on the CPU execution provider the same weights and batches give bit-identical results with one
 * intra-op thread (each worker trainer's), which is what makes checkpoint resume exact. With two (the single
 * trainer's default) the embeddings' gradient, a scatter-add over repeated token ids, can sum in another order: the
 * `tiny` preset at 16 × 192 tokens gave 2 different gradients in 4 runs (a 0.5 B run's `kill -9` resume still ended
 * on the unbroken run's weights, BENCHMARKS.md "0.5 B end to end with today's code").
 *
 * Data parallelism (`workers: n > 1`): onnxruntime-node runs a session synchronously on the calling thread, and
 * the tiny model's ops are too small for intra-op threads to help, so a second core stays idle. With `n` worker
 * threads each micro-batch's rows are split into `n` contiguous shards that run concurrently, each worker with its
 * own sessions compiled from the same model bytes for its shard's shape. The loss is a weighted sum over tokens and
 * the statistics are masked sums, so shard results add up exactly (up to float summation order); token logprobs
 * concatenate along rows. Each worker accumulates its gradients in its own shared buffer; at `optimStep` the
 * workers sum the buffers (in worker order) and apply AdamW (`Optimizer.step`, the same maths) over disjoint slices
 * of the parameters, which live in shared memory. A LoRA run's frozen base is not copied to the workers: their
 * graphs read it from one file written once, which onnxruntime maps (`internal/frozenFile.ts`).
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Layer, Scope, Semaphore } from "effect"
import type { Duration } from "effect"
import * as ort from "onnxruntime-node"
import * as Autodiff from "../autodiff/Autodiff.ts"
import * as CollectGarbage from "../internal/collectGarbage.ts"
import * as NativeKernels from "../internal/nativeKernels.ts"
import * as Checkpoint from "../Checkpoint.ts"
import * as Loss from "../Loss.ts"
import * as Lora from "../Lora.ts"
import * as LrSchedule from "../LrSchedule.ts"
import type * as ModelConfig from "../model/ModelConfig.ts"
import * as Qwen2 from "../model/Qwen2.ts"
import * as Graph from "../onnx/Graph.ts"
import * as Optimizer from "../Optimizer.ts"
import type * as Packing from "../Packing.ts"
import * as GradientBackend from "../GradientBackend.ts"
import * as FrozenFile from "./internal/frozenFile.ts"
import * as TrainerPool from "./internal/trainerPool.ts"
import type * as TrainerWorker from "./internal/trainerWorker.ts"

// ===== Models =====

/**
 * A differentiable model: its parameters, a builder for its training-shaped forward graph and the model-specific
 * inputs of a micro-batch.
 *
 * @category models
 * @since 0.1.0
 */
export interface Model {
  readonly parameters: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
  readonly vocabSize: number
  readonly forward: () => Autodiff.Forward
  /** The forward of micro-batches with shared prompts (`Packing.MicroBatch.prefix`); absent = not supported. */
  readonly sharedForward?: (() => Autodiff.Forward) | undefined
  readonly inputs: (batch: Packing.MicroBatch, context?: InputContext) => Record<string, ort.Tensor>
  /**
   * Weights the graph reads as inputs but never trains (a LoRA run's base, fed by `inputs`): held once, never
   * copied, and included by reference in the trainer's `weights`.
   */
  readonly frozen?: {
    readonly parameters: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
    readonly weights: GradientBackend.Weights
  }
  /** Starting values of the parameters that `Options.weights` lacks (a fresh LoRA adapter). */
  readonly initial?: GradientBackend.Weights
  /** With LoRA, checkpoints also hold the adapter in PEFT's layout (`adapter_config.json`'s contents). */
  readonly adapterConfig?: Readonly<Record<string, unknown>>
  /** Sizes of the graph's own dimensions a micro-batch sets (a vision model's `images`, `patches`). */
  readonly dims?: ((batch: Packing.MicroBatch) => Readonly<Record<string, number>>) | undefined
}

/**
 * What a micro-batch's inputs may depend on besides its data: whether it trains (dropout on) and a seed the trainer
 * derives from the optimiser step and the micro-batch's place in it (the same after a resume).
 *
 * @category models
 * @since 0.1.0
 */
export interface InputContext {
  readonly training: boolean
  readonly seed: number
}

/**
 * The Qwen2 model of `model/Qwen2.ts`: inputs `input_ids`, `attention_mask`, `position_ids` (the micro-batch's own,
 * or counted along real tokens only, so right padding does not shift them); with shared prompts
 * (`Qwen2.sharedPrefixGraph`), also `prefix_ids`, `prefix_mask`, `prefix_positions` and `prefix_index`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const qwen2 = (config: ModelConfig.ModelConfig): Model => ({
  parameters: Qwen2.parameters(config),
  vocabSize: config.vocabSize,
  forward: () => Qwen2.trainingGraph(config),
  sharedForward: () => Qwen2.sharedPrefixGraph(config),
  inputs: (mb) => {
    const dims = [mb.batch, mb.length]
    const prefix = mb.prefix === undefined ? {} : prefixInputs(mb.prefix)
    const positions = mb.positionIds ?? new Int32Array(mb.batch * mb.length)
    for (let b = 0; b < mb.batch && mb.positionIds === undefined; b++) {
      let p = 0
      for (let t = 0; t < mb.length; t++) {
        const i = b * mb.length + t
        positions[i] = mb.attentionMask[i] ? p++ : 0
      }
    }
    return {
      input_ids: new ort.Tensor("int64", int64s(mb.inputIds), dims),
      attention_mask: new ort.Tensor("int64", int64s(mb.attentionMask), dims),
      position_ids: new ort.Tensor("int64", int64s(positions), dims),
      ...prefix
    }
  }
})

/**
 * A critic on the Qwen2 trunk (`Qwen2.Head` `value`): the same inputs as {@link qwen2} (shared prompts included),
 * one value per position in place of the logits; trained with `Loss.value`, whose "token logprobs" are the values.
 *
 * @category constructors
 * @since 0.1.0
 */
export const qwen2Value = (config: ModelConfig.ModelConfig): Model => ({
  parameters: Qwen2.parameters(config, "value"),
  vocabSize: config.vocabSize,
  forward: () => Qwen2.trainingGraph(config, "value"),
  sharedForward: () => Qwen2.sharedPrefixGraph(config, "value"),
  inputs: qwen2(config).inputs
})

/**
 * The Qwen2 model with LoRA adapters (`Lora.ts`) on `settings.targets`: the parameters are the adapter's alone
 * (PEFT's names), so only they get gradients and AdamW moments; the base is a frozen graph input fed from `base`'s
 * own arrays (the `ort.Tensor`s wrap them: nothing is copied per step). Fresh adapters start as PEFT's do (`B` = 0:
 * the model's function is the base's). `baseModel` is what `adapter_config.json` names as
 * `base_model_name_or_path`.
 *
 * **Gotchas** The frozen output head is chunked as a trained one is (`ChunkedHead`, without its ∂W). With
 * `workers > 1` the worker threads read the base from one file written once into a temporary folder (shared by
 * the process's trainers over the same base: `internal/frozenFile.ts`; onnxruntime maps it, every worker's sessions
 * share its pages); the disk needs room for the base in float32.
 *
 * @category constructors
 * @since 0.1.0
 */
export const qwen2Lora = (
  config: ModelConfig.ModelConfig,
  settings: Lora.Config,
  base: GradientBackend.Weights,
  baseModel: string
): Model => {
  const plain = qwen2(config)
  const frozen = Qwen2.parameters(config)
  let tensors: Record<string, ort.Tensor> | undefined
  const baseTensors = () =>
    tensors ??= Object.fromEntries(frozen.map((p) => [p.name, new ort.Tensor("float32", base.get(p.name)!, p.shape)]))
  return {
    parameters: Lora.parameters(config, settings),
    vocabSize: config.vocabSize,
    forward: () => Qwen2.trainingGraph(config, "lm", settings),
    sharedForward: () => Qwen2.sharedPrefixGraph(config, "lm", settings),
    inputs: (mb, context) => {
      const rows: Array<{ readonly rows: Lora.Rows; readonly batch: number; readonly length: number }> = [
        { rows: ["batch", "seq"], batch: mb.batch, length: mb.length },
        ...(mb.prefix === undefined ? [] : [{ rows: ["groups", "prefix"] as const, ...mb.prefix }])
      ]
      const seed = ((settings.seed ?? 0) * 0x9e3779b1 + (context?.seed ?? 0)) >>> 0
      const masks = Lora.dropoutMasks(config, settings, rows, context?.training ?? false, seed)
      const maskTensors = Object.fromEntries([...masks].map(([k, m]) => [k, new ort.Tensor("float32", m.data, m.dims)]))
      return { ...plain.inputs(mb), ...baseTensors(), ...maskTensors }
    },
    frozen: { parameters: frozen, weights: base },
    initial: Lora.init(config, settings),
    adapterConfig: Lora.adapterConfig(settings, baseModel)
  }
}

const prefixInputs = (prefix: Packing.Prefix): Record<string, ort.Tensor> => {
  const dims = [prefix.batch, prefix.length]
  const positions = Int32Array.from(prefix.attentionMask, (m, i) => (m ? i % prefix.length : 0))
  return {
    prefix_ids: new ort.Tensor("int64", int64s(prefix.inputIds), dims),
    prefix_mask: new ort.Tensor("int64", int64s(prefix.attentionMask), dims),
    prefix_positions: new ort.Tensor("int64", int64s(positions), dims),
    prefix_index: new ort.Tensor("int64", int64s(prefix.index), [prefix.index.length])
  }
}

const littleEndian = new Uint8Array(Uint32Array.of(1).buffer)[0] === 1

/**
 * 32-bit integers widened to int64, written as two 32-bit words where the platform is little-endian: 40× faster
 * than `BigInt64Array.from(values, BigInt)`, which allocates a BigInt per element (0.05 ms per 512 ids, four
 * arrays per shard and step on the trainer's critical path).
 */
const int64s = (values: ArrayLike<number>): BigInt64Array => {
  if (!littleEndian) return BigInt64Array.from(Array.from(values), (v) => BigInt(v))
  const out = new BigInt64Array(values.length)
  const words = new Int32Array(out.buffer)
  for (let i = 0; i < values.length; i++) {
    const v = values[i]!
    words[2 * i] = v
    words[2 * i + 1] = v >> 31 // the sign extension
  }
  return out
}

/**
 * Trainer options.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly model: Model
  /** Initial weights; copied. Every parameter of the model must be present with the right size. */
  readonly weights: GradientBackend.Weights
  readonly loss: Loss.Config
  readonly optimizer: Optimizer.Config
  readonly schedule: LrSchedule.Config
  /** onnxruntime execution provider. `cuda` needs an onnxruntime-node build with the CUDA provider. Default `cpu`. */
  readonly executionProvider?: "cpu" | "cuda"
  /** Intra-op threads per session (default 2; 1 per worker when `workers > 1`). */
  readonly intraOpThreads?: number
  /**
   * Data-parallel worker threads (default 1: everything runs on the calling thread). With `n > 1`, micro-batch rows
   * are split into `n` contiguous shards run concurrently on `n` worker threads, started on first use and
   * terminated when the trainer's scope closes. Results match the single-thread trainer up to float summation
   * order and are deterministic for a given `n`.
   *
   * **Gotchas**
   *
   * A failed `forwardBackward` (an onnxruntime error or a crashed worker) discards every gradient accumulated since
   * the last `optimStep` (other shards may already have added theirs); a crashed worker's pool is replaced by fresh
   * threads on the next call. A worker crashing inside `optimStep` can leave that update half-applied.
   */
  readonly workers?: number
  /**
   * Tokens per chunk of the output head (`Autodiff.Options.headChunk`): default about 64 MiB of logits a chunk
   * (the plain head when a micro-batch fits in one), `0` the plain head.
   */
  readonly headChunk?: number
  /**
   * Activation recompute (`Autodiff.Options.recompute`): each decoder layer keeps only its input from the forward
   * pass and recomputes its inside in the backward. Default false.
   *
   * **Gotchas**
   *
   * A saving only where malloc returns freed memory: glibc keeps the blocks a run frees below its mmap threshold, so
   * the forward's freed activations stay resident and the end-of-run gradient copies land on top of them. Measured
   * with `scripts/learner-memory.ts` (0.5 B's width, 12 layers, 2 × 512 tokens): 8.13 → 8.30 GiB by default,
   * 7.75 → 6.72 GiB with `MALLOC_MMAP_THRESHOLD_=1048576`, at 1.2× the CPU time (BENCHMARKS.md, "real shapes").
   * A run's config turns it on with `learner.recompute`; the threshold is set in the environment that starts the
   * process (`bin/agentfly.mjs` says why not by default).
   */
  readonly recompute?: boolean
  /**
   * How AdamW's moments are stored (`Optimizer.Precision`): `float32` (default, 8 bytes a parameter for the two) or
   * `bfloat16` (4 bytes, stochastic rounding keyed by step and element: deterministic, resume exact). Checkpoints
   * hold them as they are (F32 or BF16); a checkpoint of the other precision is converted when loaded.
   */
  readonly moments?: Optimizer.Precision
  /**
   * Free onnxruntime-node's JavaScript copies of the gradients right after each micro-batch (their buffers detached,
   * then a garbage collection: `internal/collectGarbage.ts`). Default: when the gradients are 256 MiB or more (the
   * copies of one step were otherwise still resident during the next: 4 bytes a parameter at the peak; tens to
   * hundreds of ms a micro-batch, against steps of seconds at those sizes).
   */
  readonly releaseOutputs?: boolean
  /** Sessions kept per shape (default 8). */
  readonly maxSessions?: number
  /**
   * onnxruntime's CPU memory arena (and memory pattern) for the trainer's sessions. Off by default: each session's
   * arena would hold its peak working set for as long as the session lives (one session per micro-batch shape and
   * worker): 3.4 GB instead of about 1.2 GB on the calculator demo's RL phase, for learner steps 4–9 % faster.
   */
  readonly memoryArena?: boolean
  /**
   * Let idle intra-op threads spin (onnxruntime's default). Off by default: on a machine shared with other
   * processes, spinning threads fight for the cores (measured 2.4× slower steps under load, equal when idle).
   */
  readonly allowSpinning?: boolean
}

const fail = <Tag extends GradientBackend.GradientBackendErrorReason["_tag"]>(
  reason: Tag,
  message: string,
  facts?: GradientBackend.GradientBackendErrorFacts<Tag>
) => GradientBackend.gradientBackendError(reason, message, facts)

const errorMessage = (u: unknown) => (u instanceof Error ? u.message : String(u))

/** Contiguous row ranges `[start, end)` of `rows` split over at most `workers` shards, as equal as possible. */
export const shardRanges = (rows: number, workers: number): Array<readonly [number, number]> => {
  const k = Math.max(1, Math.min(workers, rows))
  const base = Math.floor(rows / k)
  const extra = rows % k
  const out: Array<readonly [number, number]> = []
  for (let i = 0, start = 0; i < k; i++) {
    const end = start + base + (i < extra ? 1 : 0)
    out.push([start, end])
    start = end
  }
  return out
}

/** Rows `[r0, r1)` of a micro-batch, as compact copies (cheap to send to a worker). */
const shardOf = (mb: Packing.MicroBatch, r0: number, r1: number): Packing.MicroBatch => {
  const from = r0 * mb.length
  const to = r1 * mb.length
  const mask = mb.mask.slice(from, to)
  return {
    batch: r1 - r0,
    length: mb.length,
    inputIds: mb.inputIds.slice(from, to),
    attentionMask: mb.attentionMask.slice(from, to),
    positionIds: mb.positionIds?.slice(from, to),
    prefix: mb.prefix === undefined ? undefined : prefixShard(mb.prefix, r0, r1),
    targets: mb.targets.slice(from, to),
    mask,
    weights: mb.weights.slice(from, to),
    advantages: mb.advantages.slice(from, to),
    samplerLogprobs: mb.samplerLogprobs.slice(from, to),
    refLogprobs: mb.refLogprobs.slice(from, to),
    oldLogprobs: mb.oldLogprobs?.slice(from, to),
    sequenceIndex: mb.sequenceIndex.slice(r0, r1),
    lossTokens: mask.reduce((n, m) => n + (m !== 0 ? 1 : 0), 0),
    ...(mb.images === undefined ? {} : { images: mb.images.slice(r0, r1) })
  }
}

/**
 * The prompts rows `[r0, r1)` continue, in their order, renumbered; as many prompt rows as the micro-batch's (the
 * rest empty), so that a shard's shape does not depend on how the groups fell.
 */
const prefixShard = (prefix: Packing.Prefix, r0: number, r1: number): Packing.Prefix => {
  const used = [...new Set(prefix.index.subarray(r0, r1))]
  const L = prefix.length
  const inputIds = new Int32Array(prefix.batch * L)
  const attentionMask = new Uint8Array(prefix.batch * L)
  used.forEach((k, j) => {
    inputIds.set(prefix.inputIds.subarray(k * L, (k + 1) * L), j * L)
    attentionMask.set(prefix.attentionMask.subarray(k * L, (k + 1) * L), j * L)
  })
  const index = Int32Array.from(prefix.index.subarray(r0, r1), (k) => used.indexOf(k))
  return { batch: prefix.batch, length: L, inputIds, attentionMask, index }
}

/** Shard results in shard order: losses and statistics summed, token logprobs concatenated along rows. */
const combine = (
  mb: Packing.MicroBatch,
  shards: ReadonlyArray<readonly [number, number]>,
  results: ReadonlyArray<TrainerWorker.RunResult>
): GradientBackend.MicroBatchResult => {
  const tokenLogprobs = new Float32Array(mb.batch * mb.length)
  const stats: [number, number, number, number, number, number] = [0, 0, 0, 0, 0, 0]
  let loss = 0
  results.forEach((r, j) => {
    loss += r.loss
    for (let k = 0; k < 6; k++) stats[k]! += r.stats[k]!
    tokenLogprobs.set(r.tokenLogprobs, shards[j]![0] * mb.length)
  })
  const [tokens, clipped, clippedLower, approxKl, entropy, kl] = stats
  return { loss, tokenLogprobs, tokens, clipped, clippedLower, approxKl, entropy, kl }
}

const toFeed = (t: ort.Tensor): TrainerWorker.Feed =>
  t.type === "int64"
    ? { type: "int64", data: t.data as BigInt64Array, dims: t.dims }
    : { type: "float32", data: t.data as Float32Array, dims: t.dims }

const layoutOf = (parameters: Model["parameters"]): TrainerWorker.Layout => {
  const lengths = parameters.map((p) => p.shape.reduce((a, b) => a * b, 1))
  const offsets = lengths.map((_, i) => lengths.slice(0, i).reduce((a, b) => a + b, 0))
  return { names: parameters.map((p) => p.name), offsets, lengths, total: lengths.reduce((a, b) => a + b, 0) }
}

const sharedViews = (buffer: SharedArrayBuffer, layout: TrainerWorker.Layout) =>
  new Map(layout.names.map((name, i) => [name, new Float32Array(buffer, layout.offsets[i]! * 4, layout.lengths[i]!)]))

/** Per-parameter views of shared moments: float32, or bfloat16 bits. */
const momentViews = (
  buffer: SharedArrayBuffer,
  layout: TrainerWorker.Layout,
  precision: Optimizer.Precision
): Map<string, Optimizer.Moment> =>
  precision === "float32"
    ? sharedViews(buffer, layout)
    : new Map(layout.names.map((name, i) =>
      [name, new Uint16Array(buffer, layout.offsets[i]! * 2, layout.lengths[i]!)] as const
    ))

interface Compiled {
  readonly session: ort.InferenceSession
  readonly graph: Autodiff.TrainingGraph
  /** Set once released (by eviction or at scope close), so that the session is released exactly once. */
  released: boolean
}

/** With workers, the weights, Adam's moments and the gradients live in shared memory that the threads read. */
interface SharedMemory {
  readonly params: SharedArrayBuffer
  readonly m: SharedArrayBuffer
  readonly v: SharedArrayBuffer
  readonly accum: SharedArrayBuffer
  /** One gradient buffer per worker. */
  readonly grads: ReadonlyArray<SharedArrayBuffer>
}

const sharedMemory = (layout: TrainerWorker.Layout, workers: number, moments: Optimizer.Precision): SharedMemory => ({
  params: new SharedArrayBuffer(layout.total * 4),
  m: new SharedArrayBuffer(layout.total * (moments === "float32" ? 4 : 2)),
  v: new SharedArrayBuffer(layout.total * (moments === "float32" ? 4 : 2)),
  accum: new SharedArrayBuffer(layout.total * 4),
  grads: Array.from({ length: workers }, () => new SharedArrayBuffer(layout.total * 4))
})

/** AdamW's zero state: its own arrays, or views of the shared moments that the workers update. */
const initialState = (
  params: ReadonlyMap<string, Float32Array>,
  shared: SharedMemory | undefined,
  layout: TrainerWorker.Layout,
  precision: Optimizer.Precision
): Optimizer.State =>
  shared === undefined
    ? Optimizer.makeState(params, precision)
    : { step: 0, m: momentViews(shared.m, layout, precision), v: momentViews(shared.v, layout, precision) }

/** A shard shape's training graph and its serialised model, which every worker compiles its own session from. */
interface GraphEntry {
  readonly graph: Autodiff.TrainingGraph
  readonly bytes: Uint8Array
}

// ===== Trainer state =====

/**
 * What a trainer holds and changes between calls. `make` builds it; the functions below take it first, as the
 * functions of Effect's `Pool.ts` take the pool. They do not lock: `make` runs each operation that changes the state
 * under the trainer's lock, so no two of them interleave.
 */
interface Trainer {
  readonly options: Options
  readonly model: Model
  /** Data-parallel worker threads (1: everything runs on the calling thread). */
  readonly workers: number
  readonly layout: TrainerWorker.Layout
  /** Present with workers only. */
  readonly shared: SharedMemory | undefined
  /** The weights by parameter name (views of `shared.params` with workers). */
  readonly params: Map<string, Float32Array>
  /** AdamW's step and moments; replaced by `load` without workers (with workers, views of `shared.m`, `shared.v`). */
  optimizerState: Optimizer.State
  /** The gradients accumulated since the last step (with workers: the workers' sum, written by `reduce`). */
  readonly accum: Map<string, Float32Array>
  /** Micro-batches accumulated since the last step. */
  accumulated: number
  /** Sessions by shape key, most recently used last (without workers). */
  readonly sessions: Map<string, Compiled>
  readonly sessionOptions: ort.InferenceSession.SessionOptions
  /** The scope the trainer was made in: sessions and threads are released when it closes. */
  readonly scope: Scope.Scope
  readonly fs: FileSystem.FileSystem

  // ----- Worker threads (workers > 1) -----

  pool: TrainerPool.Pool | undefined
  /** Threads started and not yet exited, over every pool this trainer has had. */
  liveThreads: number
  /** Session keys compiled on each worker of the current pool. */
  compiledOn: Array<Set<string>>
  /** Shards accumulated per worker since the last step (0: the worker's next shard overwrites its buffer). */
  readonly shardsAccumulated: Array<number>
  readonly everyWorker: ReadonlyArray<number>
  /** Bumped whenever the weights change, so that workers refresh their private copies. */
  weightsVersion: number
  /** Graphs by shard shape, most recently used last; at least 2 (one call uses up to 2 shard sizes). */
  readonly graphs: Map<string, GraphEntry>
  /** The model's frozen inputs' names (none without LoRA). */
  readonly frozenNames: ReadonlySet<string>
  /** With workers and frozen weights: the file the workers' sessions map them from, acquired on first use. */
  frozenFile: FrozenFile.FrozenFile | undefined
  /** Where the file is held: closed after the threads are (their sessions map it until they end). */
  readonly frozenScope: Scope.Scope
  /** How many times this trainer wrote the frozen weights to a file (for tests: at most once; 0 when shared). */
  frozenWrites: number
}

// ----- Graphs and sessions -----

const sessionOptionsOf = (options: Options, workers: number): ort.InferenceSession.SessionOptions => ({
  executionProviders: [options.executionProvider ?? "cpu"],
  intraOpNumThreads: options.intraOpThreads ?? (workers > 1 ? 1 : 2),
  interOpNumThreads: 1,
  executionMode: "sequential",
  graphOptimizationLevel: "all",
  // onnxruntime's CPU arena keeps each session's largest working set (its activations and gradients, ≈ 100 MB
  // per worker and shape for the tiny preset at 4,096 tokens) for the session's lifetime, and a trainer keeps up
  // to `maxSessions` shapes per worker: 3.0 GB of RSS on the calculator demo's RL phase. Without it the tensors go
  // back to malloc after each run. The memory pattern goes with the arena: without one it allocates each run's
  // whole plan as one fresh block, mapped and faulted in anew every run (steps 1.45× slower); tensor by tensor,
  // malloc reuses the memory of the run before (1.04–1.09×, see BENCHMARKS.md).
  enableCpuMemArena: options.memoryArena === true,
  enableMemPattern: options.memoryArena === true,
  extra: { session: { intra_op: { allow_spinning: options.allowSpinning === true ? "1" : "0" } } }
})

const release = (c: Compiled) =>
  Effect.suspend(() => {
    if (c.released) return Effect.void
    c.released = true
    return Effect.tryPromise(() => c.session.release()).pipe(Effect.ignore)
  })

const buildGraph = (trainer: Trainer, mb: Packing.MicroBatch, withGradients: boolean) => {
  const { batch, length, prefix } = mb
  const forward = prefix === undefined ? trainer.model.forward : trainer.model.sharedForward
  if (forward === undefined) {
    return Effect.fail(fail("BadBatch", "this model has no graph for micro-batches with shared prompts"))
  }
  const dims = {
    ...(prefix === undefined ? {} : { groups: prefix.batch, prefix: prefix.length }),
    ...trainer.model.dims?.(mb)
  }
  const { loss, headChunk, recompute } = trainer.options
  return Autodiff.trainingGraph(forward(), {
    batch,
    length,
    dims,
    loss,
    withGradients,
    recompute: recompute === true,
    ...(headChunk === undefined ? {} : { headChunk })
  })
    .pipe(Effect.mapError((e) => fail("Graph", e.message, { cause: e })))
}

/** One graph a shape: the rows', and the shared prompts' if any. */
const shapeKey = (model: Model, mb: Packing.MicroBatch, withGradients: boolean) =>
  `${withGradients ? "train" : "fwd"}:${mb.batch}x${mb.length}` +
  (mb.prefix === undefined ? "" : `+${mb.prefix.batch}x${mb.prefix.length}`) +
  (model.dims === undefined ? "" : `+${JSON.stringify(model.dims(mb))}`)

/** The session for a micro-batch's shape: from the LRU cache, or created (and released when the scope closes). */
const compile = Effect.fnUntraced(function*(trainer: Trainer, mb: Packing.MicroBatch, withGradients: boolean) {
  const { sessions, options } = trainer
  const key = shapeKey(trainer.model, mb, withGradients)
  const hit = sessions.get(key)
  if (hit !== undefined) {
    sessions.delete(key)
    sessions.set(key, hit) // most recently used last
    return hit
  }
  const graph = yield* buildGraph(trainer, mb, withGradients)
  const bytes = Graph.toModelBytes(graph.graph)
  const session = yield* Effect.tryPromise({
    try: () => ort.InferenceSession.create(bytes, trainer.sessionOptions),
    catch: (u) => fail("Session", `${options.executionProvider ?? "cpu"}: ${errorMessage(u)}`, { cause: u })
  })
  const compiled: Compiled = { session, graph, released: false }
  sessions.set(key, compiled)
  yield* Scope.addFinalizer(trainer.scope, release(compiled))
  if (sessions.size > (options.maxSessions ?? 8)) {
    const [oldest, evicted] = sessions.entries().next().value!
    sessions.delete(oldest)
    yield* release(evicted)
  }
  return compiled
})

// ----- Micro-batches: checks, feeds, results -----

const validate = (model: Model, mb: Packing.MicroBatch): GradientBackend.GradientBackendError | undefined => {
  const cells = mb.batch * mb.length
  if (!(mb.batch > 0 && mb.length > 0)) return fail("BadBatch", `empty micro-batch ${mb.batch} × ${mb.length}`)
  for (const [name, a] of Object.entries(mb)) {
    if (ArrayBuffer.isView(a) && name !== "sequenceIndex" && (a as Uint8Array).length !== cells) {
      return fail("BadBatch", `${name} has ${(a as Uint8Array).length} entries, expected ${cells}`)
    }
  }
  for (const ids of [mb.inputIds, mb.targets, mb.prefix?.inputIds ?? []]) {
    for (let i = 0; i < ids.length; i++) {
      if (ids[i]! < 0 || ids[i]! >= model.vocabSize) {
        return fail("BadBatch", `token id ${ids[i]} at ${i} is outside the vocabulary of ${model.vocabSize}`)
      }
    }
  }
  return mb.prefix === undefined ? undefined : validatePrefix(mb.prefix, mb.batch)
}

const validatePrefix = (prefix: Packing.Prefix, rows: number): GradientBackend.GradientBackendError | undefined => {
  const cells = prefix.batch * prefix.length
  if (!(prefix.batch > 0 && prefix.length > 0)) {
    return fail("BadBatch", `empty prompts ${prefix.batch} × ${prefix.length}`)
  }
  if (prefix.inputIds.length !== cells || prefix.attentionMask.length !== cells || prefix.index.length !== rows) {
    return fail("BadBatch", `prompts ${prefix.batch} × ${prefix.length} for ${rows} rows: arrays of other sizes`)
  }
  const bad = prefix.index.findIndex((k) => !(k >= 0 && k < prefix.batch))
  if (bad === -1) return undefined
  return fail("BadBatch", `row ${bad} continues prompt ${prefix.index[bad]} of ${prefix.batch}`)
}

/** The graph's non-weight inputs for a micro-batch: the model's own and the loss head's. */
const batchFeeds = (
  model: Model,
  graph: Autodiff.TrainingGraph,
  mb: Packing.MicroBatch,
  context?: InputContext
): Record<string, ort.Tensor> => {
  const dims = [mb.batch, mb.length]
  const f32 = (a: Float32Array | Uint8Array) =>
    new ort.Tensor("float32", a instanceof Float32Array ? a : Float32Array.from(a), dims)
  const data: Record<string, () => ort.Tensor> = {
    targets: () => new ort.Tensor("int64", int64s(mb.targets), dims),
    loss_weights: () => f32(mb.weights),
    loss_mask: () => f32(mb.mask),
    advantages: () => f32(mb.advantages),
    // Without a recomputed proximal policy the sampler's logprobs stand in for the old policy.
    old_logprobs: () => f32(mb.oldLogprobs ?? mb.samplerLogprobs),
    sampler_logprobs: () => f32(mb.samplerLogprobs),
    ref_logprobs: () => f32(mb.refLogprobs)
  }
  const out: Record<string, ort.Tensor> = { ...model.inputs(mb, context) }
  for (const name of graph.lossInputs) out[name] = data[name]!()
  return out
}

/**
 * A micro-batch's input context: training or not, and a seed from the optimiser step, the micro-batches accumulated
 * in it and the shard (all restored or reset by a checkpoint load, so a resumed run draws what the unbroken one did).
 */
const inputContext = (trainer: Trainer, training: boolean, shard: number): InputContext => ({
  training,
  seed: (trainer.optimizerState.step * 65_537 + trainer.accumulated * 257 + shard) >>> 0
})

/** Every input of a session: the micro-batch's and the weights, fed from the optimiser's own arrays. */
const feeds = (trainer: Trainer, c: Compiled, mb: Packing.MicroBatch): Record<string, ort.Tensor> => {
  const out = batchFeeds(trainer.model, c.graph, mb, inputContext(trainer, c.graph.gradients.size > 0, 0))
  for (const { name, dims: d } of c.graph.weights) {
    out[name] = new ort.Tensor("float32", trainer.params.get(name)!, [...d])
  }
  return Object.assign(out, viewFeeds(c.graph, out))
}

/** The graph's views of weights (`Autodiff.TrainingGraph.views`) from the weights fed in `feeds`. */
export const viewFeeds = (
  graph: Pick<Autodiff.TrainingGraph, "views">,
  feeds: Readonly<Record<string, ort.Tensor>>
): Record<string, ort.Tensor> =>
  Autodiff.viewFeeds(
    graph.views,
    (name) => ({ data: feeds[name]!.data as Float32Array, dims: feeds[name]!.dims }),
    (data, dims) => new ort.Tensor(data instanceof Float64Array ? "float64" : "float32", data, [...dims])
  )

/**
 * With `into`, the gradients are written straight into those arrays (onnxruntime's pre-allocated outputs), so that
 * no native copy of every gradient exists beside them at the end of the run (onnxruntime-node still returns a
 * JavaScript copy, garbage at once).
 */
const run = (trainer: Trainer, c: Compiled, mb: Packing.MicroBatch, into?: ReadonlyMap<string, Float32Array>) =>
  Effect.tryPromise({
    try: () => {
      if (into === undefined) return c.session.run(feeds(trainer, c, mb))
      const fetches: Record<string, ort.Tensor | null> = { loss: null, token_logprobs: null, stats: null }
      for (const { name, dims } of c.graph.weights) {
        fetches[c.graph.gradients.get(name)!] = new ort.Tensor("float32", into.get(name)!, [...dims])
      }
      return c.session.run(feeds(trainer, c, mb), fetches)
    },
    catch: (u) => fail("Run", errorMessage(u), { cause: u })
  })

const summarize = (out: ort.InferenceSession.OnnxValueMapType): GradientBackend.MicroBatchResult => {
  const stats = out["stats"]!.data as Float32Array
  return {
    loss: (out["loss"]!.data as Float32Array)[0]!,
    tokenLogprobs: out["token_logprobs"]!.data as Float32Array,
    tokens: stats[0]!,
    clipped: stats[1]!,
    clippedLower: stats[2]!,
    approxKl: stats[3]!,
    entropy: stats[4]!,
    kl: stats[5]!
  }
}

// ----- Worker threads (workers > 1) -----

// No zero fill: the first micro-batch after a clear overwrites the accumulators (and `gradients` zeroes them).
const clear = (trainer: Trainer) => {
  trainer.shardsAccumulated.fill(0)
  trainer.accumulated = 0
}

/** Closes the pool, if any, waiting up to `wait` for its threads; the next pooled call starts fresh ones. */
/**
 * A closed trainer lets go of its weights, gradients and moments (without workers: theirs live in shared memory the
 * record keeps), so that whoever still holds its service, such as a learner slot that replaces it by a trainer built
 * from a copy of its weights, does not keep them alive: at 0.5 B the warm-up's trainer held 4.6 GiB beside the RL
 * trainer that replaced it (BENCHMARKS.md, "0.5 B end to end on 2 cores").
 */
const letGo = (trainer: Trainer): void => {
  if (trainer.shared !== undefined) return
  trainer.params.clear()
  trainer.accum.clear()
  trainer.optimizerState.m.clear()
  trainer.optimizerState.v.clear()
}

const dropPool = (trainer: Trainer, wait: Duration.Input = "5 seconds") =>
  Effect.suspend(() => {
    const p = trainer.pool
    trainer.pool = undefined
    return p === undefined ? Effect.void : p.close(wait)
  })

/** The worker pool, started on first use and replaced when broken (which discards the accumulated gradients). */
const usePool = Effect.fnUntraced(function*(trainer: Trainer) {
  const { workers, layout, shared } = trainer
  const broken = trainer.pool?.broken()
  if (broken !== undefined) {
    yield* dropPool(trainer)
    if (trainer.accumulated > 0) {
      clear(trainer)
      return yield* fail("Run", `${broken}; the gradients accumulated since the last step were discarded`)
    }
  }
  if (trainer.pool !== undefined) return trainer.pool
  // onnxruntime-node takes no SharedArrayBuffer tensors: the workers map a frozen base from one file instead.
  const file = yield* frozenFileOf(trainer)
  const sessionOptions = file === undefined
    ? trainer.sessionOptions
    : FrozenFile.sessionOptions(trainer.sessionOptions, file.folder)
  const p = yield* TrainerPool.start(Array.from({ length: workers }, (_, index) => ({
    index,
    layout,
    params: shared!.params,
    m: shared!.m,
    v: shared!.v,
    moments: trainer.options.moments ?? "float32",
    accum: shared!.accum,
    grads: shared!.grads,
    slice: [Math.floor(layout.total * index / workers), Math.floor(layout.total * (index + 1) / workers)] as const,
    sessionOptions,
    releaseOutputs: releasesOutputs(trainer.options, layout)
  })), () => trainer.liveThreads--)
  trainer.liveThreads += p.size
  trainer.pool = p
  trainer.compiledOn = Array.from({ length: workers }, () => new Set())
  return p
})

/**
 * The file of the model's frozen weights (none without), held until the trainer's scope closes: shared with the
 * other trainers of this process over the same weights, or written.
 */
const frozenFileOf = (trainer: Trainer) =>
  Effect.suspend(() => {
    const frozen = trainer.model.frozen
    if (frozen === undefined || trainer.frozenFile !== undefined) return Effect.succeed(trainer.frozenFile)
    return FrozenFile.acquire(frozen.parameters, frozen.weights).pipe(
      Effect.map(({ file, written }) => {
        trainer.frozenFile = file
        if (written) trainer.frozenWrites++
        return file
      }),
      Effect.provideService(FileSystem.FileSystem, trainer.fs),
      Effect.provideService(Scope.Scope, trainer.frozenScope),
      Effect.mapError((e) => fail("Session", `the frozen weights' file: ${e.message}`, { cause: e }))
    )
  })

/** After a failed pooled call: a broken pool is replaced on the next call, and its gradients are lost. */
const afterFailure = (trainer: Trainer, clearGradients: boolean) =>
  Effect.suspend(() => {
    const broken = trainer.pool?.broken() !== undefined
    if (clearGradients || broken) clear(trainer)
    return broken ? dropPool(trainer) : Effect.void
  })

/** A shard's graph from the LRU cache or built; an evicted graph's sessions are released on every worker. */
const graphFor = Effect.fnUntraced(
  function*(trainer: Trainer, p: TrainerPool.Pool, mb: Packing.MicroBatch, grads: boolean) {
    const { graphs } = trainer
    const key = shapeKey(trainer.model, mb, grads)
    const hit = graphs.get(key)
    graphs.delete(key)
    const file = trainer.frozenFile
    const entry = hit ?? (yield* Effect.map(buildGraph(trainer, mb, grads), (graph) => ({
      graph,
      bytes: file === undefined ? Graph.toModelBytes(graph.graph) : FrozenFile.modelBytes(graph.graph, file)
    })))
    graphs.set(key, entry)
    if (graphs.size > Math.max(2, trainer.options.maxSessions ?? 8)) {
      const oldest = graphs.keys().next().value!
      graphs.delete(oldest)
      for (const [j, keys] of trainer.compiledOn.entries()) {
        if (keys.delete(oldest)) yield* Effect.ignore(p.request(j, { op: "release", key: oldest }))
      }
    }
    return { key, ...entry }
  }
)

/**
 * A micro-batch split into contiguous row shards, one a worker, run concurrently and combined in shard order; with
 * gradients, each worker adds its shard's to its own buffer.
 */
const runShards = Effect.fnUntraced(function*(trainer: Trainer, mb: Packing.MicroBatch, withGradients: boolean) {
  const { shardsAccumulated } = trainer
  const p = yield* usePool(trainer)
  const shards = shardRanges(mb.batch, p.size)
  const pieces = shards.map(([r0, r1]) => shardOf(mb, r0, r1))
  const entries: Array<Effect.Success<ReturnType<typeof graphFor>>> = []
  for (const piece of pieces) entries.push(yield* graphFor(trainer, p, piece, withGradients))
  const results = yield* Effect.forEach(shards, (_, j) =>
    Effect.gen(function*() {
      const { key, graph, bytes } = entries[j]!
      if (!trainer.compiledOn[j]!.has(key)) {
        const gradients = [...graph.gradients]
        yield* p.request(j, { op: "compile", key, bytes, weights: graph.weights, gradients, views: graph.views })
        trainer.compiledOn[j]!.add(key)
      }
      const plain: Record<string, TrainerWorker.Feed> = {}
      const context = inputContext(trainer, withGradients, j)
      for (const [name, t] of Object.entries(batchFeeds(trainer.model, graph, pieces[j]!, context))) {
        if (!trainer.frozenNames.has(name)) plain[name] = toFeed(t) // the workers hold the frozen inputs
      }
      const accumulate = !withGradients ? "none" : shardsAccumulated[j] === 0 ? "set" : "add"
      const version = trainer.weightsVersion
      const out = yield* p.request(j, { op: "run", key, version, feeds: plain, accumulate })
      return out.run!
    }), { concurrency: "unbounded" })
  if (withGradients) for (let j = 0; j < shards.length; j++) shardsAccumulated[j]!++
  return combine(mb, shards, results)
})

/**
 * accum ← Σ over workers of their gradient buffers, each worker summing its own slice; returns the global norm
 * from the slices' norms (summed in worker order: deterministic, though not in `Optimizer.globalNorm`'s order).
 */
const reduce = (trainer: Trainer, p: TrainerPool.Pool) => {
  const sources = trainer.shardsAccumulated.flatMap((n, j) => (n > 0 ? [j] : []))
  const request: TrainerWorker.Request = { op: "reduce", sources }
  return Effect.forEach(trainer.everyWorker, (j) => p.request(j, request), { concurrency: "unbounded" })
    .pipe(Effect.map((outs) => Math.sqrt(outs.reduce((sum, o) => sum + o.norm! * o.norm!, 0))))
}

// ----- The trainer's operations -----

const forwardBackward = (trainer: Trainer, mb: Packing.MicroBatch) =>
  Effect.gen(function*() {
    const bad = validate(trainer.model, mb)
    if (bad !== undefined) return yield* bad
    if (trainer.shared !== undefined) {
      const result = yield* runShards(trainer, mb, true).pipe(Effect.onError(() => afterFailure(trainer, true)))
      trainer.accumulated++
      return result
    }
    const c = yield* compile(trainer, mb, true)
    return yield* accumulate(trainer, c, mb)
  })

const releasesOutputs = (options: Options, layout: TrainerWorker.Layout) =>
  options.releaseOutputs ?? layout.total * 4 >= CollectGarbage.worthCollecting

/** One micro-batch's gradients into the accumulators: written by the first micro-batch, added by the next ones. */
const accumulate = (trainer: Trainer, c: Compiled, mb: Packing.MicroBatch) =>
  Effect.map(run(trainer, c, mb, trainer.accumulated === 0 ? trainer.accum : undefined), (out) => {
    for (const [w, gradName] of trainer.accumulated === 0 ? [] : c.graph.gradients) {
      const g = out[gradName]!.data as Float32Array
      const acc = trainer.accum.get(w)!
      NativeKernels.addInto(acc, g)
    }
    trainer.accumulated++
    const result = summarize(out)
    // onnxruntime-node's copies of the gradients: freed now, before anything else comes on top (`collectGarbage.ts`).
    if (releasesOutputs(trainer.options, trainer.layout)) {
      const keep = new Set<ArrayBufferLike>([...trainer.accum.values()].map((a) => a.buffer))
      CollectGarbage.release([...c.graph.gradients.values()].map((name) => out[name]!.data as Float32Array), keep)
    }
    return result
  })

/** AdamW over the accumulated gradients: on this thread, or in the workers over disjoint slices. */
const applyUpdate = (trainer: Trainer, lr: number, scale: number) => {
  const { options, optimizerState: state } = trainer
  if (trainer.shared === undefined) {
    return Effect.sync(() => Optimizer.step(trainer.params, trainer.accum, state, lr, options.optimizer, scale))
  }
  const p = trainer.pool!
  const request: TrainerWorker.Request = { op: "adam", step: state.step, lr, scale, config: options.optimizer }
  trainer.weightsVersion++ // before the update: even a failed one may have changed some slices
  return Effect.forEach(trainer.everyWorker, (j) => p.request(j, request), { concurrency: "unbounded", discard: true })
    .pipe(Effect.map(() => ++state.step))
}

const optimStep = (trainer: Trainer) =>
  Effect.uninterruptible(Effect.gen(function*() {
    if (trainer.accumulated === 0) return yield* fail("NothingAccumulated", "optimStep before any forwardBackward")
    const gradNorm = trainer.shared === undefined
      ? Optimizer.globalNorm(trainer.accum)
      : yield* reduce(trainer, yield* usePool(trainer))
    if (!Number.isFinite(gradNorm)) {
      clear(trainer)
      return yield* fail("NonFiniteGradient", `gradient norm is ${gradNorm}; the update was skipped`)
    }
    const lr = LrSchedule.at(trainer.options.schedule, trainer.optimizerState.step)
    const scale = Optimizer.clipScale(gradNorm, trainer.options.optimizer.maxGradNorm)
    const step = yield* applyUpdate(trainer, lr, scale)
    clear(trainer)
    return { step, gradNorm, lr }
  }).pipe(Effect.onError(() => afterFailure(trainer, true))))

const logprobs = (trainer: Trainer, mb: Packing.MicroBatch) =>
  Effect.gen(function*() {
    const bad = validate(trainer.model, mb)
    if (bad !== undefined) return yield* bad
    if (trainer.shared !== undefined) {
      return yield* runShards(trainer, mb, false).pipe(Effect.onError(() => afterFailure(trainer, false)))
    }
    return summarize(yield* run(trainer, yield* compile(trainer, mb, false), mb))
  })

/** The trained weights, copied, after the frozen ones (by reference: they never change). */
const snapshot = (trainer: Trainer) =>
  new Map<string, Float32Array>([
    ...(trainer.model.frozen?.weights ?? []),
    ...[...trainer.params].map(([k, v]) => [k, Float32Array.from(v)] as const)
  ])

const save = (trainer: Trainer, dir: string, meta: GradientBackend.CheckpointMeta) =>
  Effect.suspend(() =>
    Checkpoint.save(dir, {
      weights: trainer.model.parameters.map(({ name, shape }) => ({ name, shape, data: trainer.params.get(name)! })),
      optimizer: trainer.optimizerState,
      policyVersion: meta.policyVersion,
      rngState: meta.rngState
    }, trainer.model.adapterConfig === undefined ? {} : { adapterConfig: trainer.model.adapterConfig })
  ).pipe(
    Effect.provideService(FileSystem.FileSystem, trainer.fs),
    Effect.mapError((e) => fail("Checkpoint", e.message, { cause: e }))
  )

const load = (trainer: Trainer, dir: string) =>
  Effect.gen(function*() {
    const loaded = yield* Checkpoint.load(dir, trainer.model.parameters)
    for (const [name, w] of loaded.weights) trainer.params.get(name)!.set(w)
    const precision = trainer.options.moments ?? "float32"
    const as = (moment: Optimizer.Moment) => Optimizer.convertMoment(moment, precision)
    if (trainer.shared === undefined) {
      const { step, m, v } = loaded.optimizer
      trainer.optimizerState = {
        step,
        m: new Map([...m].map(([k, x]) => [k, as(x)])),
        v: new Map([...v].map(([k, x]) => [k, as(x)]))
      }
    } else {
      // The moments stay in shared memory, where the workers update them.
      const state = trainer.optimizerState
      for (const [name, m] of loaded.optimizer.m) setMoment(state.m.get(name)!, as(m))
      for (const [name, v] of loaded.optimizer.v) setMoment(state.v.get(name)!, as(v))
      state.step = loaded.optimizer.step
    }
    trainer.weightsVersion++
    clear(trainer)
    return { policyVersion: loaded.policyVersion, rngState: loaded.rngState }
  }).pipe(
    Effect.provideService(FileSystem.FileSystem, trainer.fs),
    Effect.mapError((e) => fail("Checkpoint", e.message, { cause: e }))
  )

/** `from`'s values into `into`, both of one precision (`Optimizer.convertMoment` made them so). */
const setMoment = (into: Optimizer.Moment, from: Optimizer.Moment) => {
  if (into instanceof Float32Array && from instanceof Float32Array) into.set(from)
  else if (into instanceof Uint16Array && from instanceof Uint16Array) into.set(from)
}

/** A copy of the gradients accumulated since the last optimiser step (for checks and benchmarks). */
const gradients = (trainer: Trainer) =>
  Effect.gen(function*() {
    if (trainer.pool !== undefined && trainer.accumulated > 0) yield* reduce(trainer, trainer.pool)
    else if (trainer.accumulated === 0) for (const a of trainer.accum.values()) a.fill(0)
    return new Map([...trainer.accum].map(([k, v]) => [k, Float32Array.from(v)]))
  })

// ===== Constructors =====

/** The first parameter whose weights are missing or of another size than its shape, said; else undefined. */
const sizeProblem = (
  specs: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>,
  get: (name: string) => Float32Array | undefined,
  what: string
): string | undefined => {
  for (const { name, shape } of specs) {
    const w = get(name), n = shape.reduce((a, b) => a * b, 1)
    if (w === undefined || w.length !== n) {
      return `${what} ${name}: expected ${n} floats [${shape}], got ${w?.length ?? "none"}`
    }
  }
  return undefined
}

/**
 * The worker threads (for tests): how many are alive, how many requests they are running (or have queued), a way to
 * kill one as a crash would, and a way to close them with a given wait (the next call starts fresh threads); the
 * bytes of weights each holds in private copies, and the file of the frozen weights and how often it was written.
 */
const threadsOf = (trainer: Trainer) => ({
  live: Effect.sync(() => trainer.liveThreads),
  held: Effect.suspend(() => {
    const p = trainer.pool
    if (p === undefined) return Effect.succeed([])
    return Effect.forEach(trainer.everyWorker, (j) => Effect.map(p.request(j, { op: "held" }), (o) => o.held!))
  }),
  frozen: Effect.sync(() => ({ file: trainer.frozenFile, writes: trainer.frozenWrites })),
  inFlight: Effect.sync(() => trainer.pool?.inFlight() ?? 0),
  kill: (index: number) => Effect.suspend(() => (trainer.pool === undefined ? Effect.void : trainer.pool.kill(index))),
  close: (wait: Duration.Input) => dropPool(trainer, wait)
})

/**
 * The trainer's own copy of its initial weights (into `shared` views with workers), or what is wrong with them.
 * A function of its own, so that no closure of `make` refers to `options`: one that did kept the caller's map alive
 * with the trainer (V8 keeps a captured variable in a context every closure of the scope shares), and at 0.5 B an RL
 * trainer built from the warm-up's weights held that copy, 1.84 GiB, to the end of the run (BENCHMARKS.md, "0.5 B
 * end to end on 2 cores").
 */
const initialParams = (
  options: Options,
  sharedParams: Map<string, Float32Array> | undefined
): Map<string, Float32Array> | string => {
  const { model } = options
  const initial = (name: string) => options.weights.get(name) ?? model.initial?.get(name)
  const wrong = sizeProblem(model.parameters, initial, "weight")
  if (wrong !== undefined) return wrong
  const params = new Map<string, Float32Array>()
  for (const { name } of model.parameters) {
    const w = initial(name)!, p = sharedParams?.get(name)
    params.set(name, p === undefined ? Float32Array.from(w) : (p.set(w), p))
  }
  return params
}

/**
 * `options` without the caller's initial weights (copied into `params`), so that the record does not keep that map
 * alive. Property descriptors, not a spread: a caller may pass getters (the Tinker server's live learning rate and
 * AdamW settings), which a spread would read once.
 */
const withoutWeights = (options: Options): Options =>
  Object.defineProperties({}, {
    ...Object.getOwnPropertyDescriptors(options),
    weights: { value: new Map(), enumerable: true }
  }) as Options

/**
 * A local trainer in the current scope (sessions are released when it closes).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("OnnxTrainer.make")(function*(options: Options) {
  const { model } = options
  const workers = options.workers ?? 1
  if (!(Number.isInteger(workers) && workers >= 1)) {
    return yield* fail("Session", `workers must be a positive integer, got ${workers}`)
  }
  const bad = sizeProblem(model.frozen?.parameters ?? [], (name) => model.frozen!.weights.get(name), "frozen weight")
  if (bad !== undefined) return yield* fail("BadBatch", bad)
  const layout = layoutOf(model.parameters)
  const shared = workers > 1 ? sharedMemory(layout, workers, options.moments ?? "float32") : undefined
  const sharedParams = shared === undefined ? undefined : sharedViews(shared.params, layout)
  const params = initialParams(options, sharedParams)
  if (typeof params === "string") return yield* fail("BadBatch", params)
  const lock = yield* Semaphore.make(1)
  const shardsAccumulated = Array.from({ length: workers }, () => 0)
  const scope = yield* Effect.scope
  const frozenScope = yield* Scope.fork(scope)
  const trainer: Trainer = {
    options: withoutWeights(options),
    model,
    workers,
    layout,
    shared,
    params,
    optimizerState: initialState(params, shared, layout, options.moments ?? "float32"),
    accum: shared === undefined
      ? new Map([...params].map(([k, v]) => [k, new Float32Array(v.length)]))
      : sharedViews(shared.accum, layout),
    accumulated: 0,
    sessions: new Map(),
    sessionOptions: sessionOptionsOf(options, workers),
    scope,
    fs: yield* FileSystem.FileSystem,
    pool: undefined,
    liveThreads: 0,
    compiledOn: [],
    shardsAccumulated,
    everyWorker: shardsAccumulated.map((_, j) => j),
    weightsVersion: 0,
    graphs: new Map(),
    frozenNames: new Set(model.frozen?.parameters.map((p) => p.name) ?? []),
    frozenFile: undefined,
    frozenScope,
    frozenWrites: 0
  }
  yield* Scope.addFinalizer(scope, dropPool(trainer)) // runs before `frozenScope`, forked earlier, is closed
  yield* Scope.addFinalizer(scope, Effect.sync(() => letGo(trainer)))

  const locked = lock.withPermits(1)
  const service = GradientBackend.GradientBackend.of({
    forwardBackward: (batch) => locked(forwardBackward(trainer, batch)),
    logprobs: (batch) => Effect.map(locked(logprobs(trainer, batch)), (r) => r.tokenLogprobs),
    optimStep: locked(optimStep(trainer)),
    discard: locked(Effect.sync(() => clear(trainer))),
    // With workers, AdamW runs off this thread: a snapshot waits for the step to finish.
    weights: shared === undefined ? Effect.sync(() => snapshot(trainer)) : locked(Effect.sync(() => snapshot(trainer))),
    step: Effect.sync(() => trainer.optimizerState.step),
    save: (dir, meta) => locked(save(trainer, dir, meta)),
    load: (dir) => locked(load(trainer, dir))
  })
  const threads = threadsOf(trainer)
  return {
    trainer: service,
    logprobs: (batch: Packing.MicroBatch) => locked(logprobs(trainer, batch)),
    gradients: locked(gradients(trainer)),
    threads
  }
})

/**
 * A frozen reference policy for the KL penalty: logprobs of a micro-batch's targets under fixed `weights`, from a
 * forward-only graph (no gradients). Pass it as `Learner.Options.reference`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeReference = Effect.fn("OnnxTrainer.makeReference")(function*(
  model: Model,
  weights: GradientBackend.Weights,
  options: Pick<Options, "executionProvider" | "intraOpThreads" | "allowSpinning"> = {}
) {
  const frozen = yield* make({
    ...options,
    model,
    weights,
    loss: Loss.sft,
    optimizer: Optimizer.defaultConfig,
    schedule: LrSchedule.constant(0)
  })
  return (batch: Packing.MicroBatch) => Effect.map(frozen.logprobs(batch), (r) => r.tokenLogprobs)
})

/**
 * The trainer as a `GradientBackend` layer.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (
  options: Options
): Layer.Layer<GradientBackend.GradientBackend, GradientBackend.GradientBackendError, FileSystem.FileSystem> =>
  Layer.effect(GradientBackend.GradientBackend, Effect.map(make(options), (t) => t.trainer))
