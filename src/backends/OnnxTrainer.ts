/**
 * The local `PolicyTrainer`: the model's training graph (forward, loss head and reverse-mode gradients, built by
 * `autodiff/Autodiff.ts`) runs on onnxruntime-node; gradients accumulate over micro-batches in float32; AdamW with
 * clipping and the learning-rate schedule runs in TypeScript (`Optimizer.ts`).
 *
 * Shapes are static, so one `InferenceSession` exists per micro-batch shape `(batch, length)`, created on first use
 * and kept in a small LRU cache (creation costs 0.1–0.5 s; `Packing` rounds lengths to limit distinct shapes).
 * Weights are fed as graph inputs from the optimiser's own arrays: nothing is re-serialised per step.
 *
 * Determinism: on the CPU execution provider the same weights, batches and thread count give bit-identical
 * results, which is what makes checkpoint resume exact.
 *
 * Data parallelism (`workers: n > 1`): onnxruntime-node runs a session synchronously on the calling thread, and
 * the tiny model's ops are too small for intra-op threads to help, so a second core stays idle. With `n` worker
 * threads each micro-batch's rows are split into `n` contiguous shards that run concurrently, each worker with its
 * own sessions compiled from the same model bytes for its shard's shape. The loss is a weighted sum over tokens and
 * the statistics are masked sums, so shard results add up exactly (up to float summation order); token logprobs
 * concatenate along rows. Each worker accumulates its gradients in its own shared buffer; at `optimStep` the
 * workers sum the buffers (in worker order) and apply AdamW (`Optimizer.step`, the same maths) over disjoint slices
 * of the parameters, which live in shared memory.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Layer, Scope, Semaphore } from "effect"
import type { Duration } from "effect"
import * as ort from "onnxruntime-node"
import * as Autodiff from "../autodiff/Autodiff.ts"
import * as Checkpoint from "../Checkpoint.ts"
import * as Loss from "../Loss.ts"
import * as LrSchedule from "../LrSchedule.ts"
import type * as ModelConfig from "../model/ModelConfig.ts"
import * as Qwen2 from "../model/Qwen2.ts"
import * as Graph from "../onnx/Graph.ts"
import * as Optimizer from "../Optimizer.ts"
import type * as Packing from "../Packing.ts"
import * as PolicyTrainer from "../PolicyTrainer.ts"
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
  readonly inputs: (batch: Packing.MicroBatch) => Record<string, ort.Tensor>
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
  readonly weights: PolicyTrainer.Weights
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

const fail = (reason: PolicyTrainer.PolicyTrainerErrorReason, message: string) =>
  new PolicyTrainer.PolicyTrainerError({ reason, message })

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
    lossTokens: mask.reduce((n, m) => n + (m !== 0 ? 1 : 0), 0)
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
): PolicyTrainer.MicroBatchResult => {
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

interface Compiled {
  readonly session: ort.InferenceSession
  readonly graph: Autodiff.TrainingGraph
  /** Set once released (by eviction or at scope close), so that the session is released exactly once. */
  released: boolean
}

// ===== Constructors =====

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
  const layout = layoutOf(model.parameters)
  // With workers, the weights, Adam's moments and the gradients live in shared memory that the threads read.
  const shared = workers > 1
    ? {
      params: new SharedArrayBuffer(layout.total * 4),
      m: new SharedArrayBuffer(layout.total * 4),
      v: new SharedArrayBuffer(layout.total * 4),
      accum: new SharedArrayBuffer(layout.total * 4),
      grads: Array.from({ length: workers }, () => new SharedArrayBuffer(layout.total * 4))
    }
    : undefined
  const sharedParams = shared === undefined ? undefined : sharedViews(shared.params, layout)
  const params = new Map<string, Float32Array>()
  for (const { name, shape } of model.parameters) {
    const w = options.weights.get(name)
    const n = shape.reduce((a, b) => a * b, 1)
    if (w === undefined || w.length !== n) {
      return yield* fail("BadBatch", `weight ${name}: expected ${n} floats [${shape}], got ${w?.length ?? "none"}`)
    }
    const p = sharedParams?.get(name)
    params.set(name, p === undefined ? Float32Array.from(w) : (p.set(w), p))
  }
  let state: Optimizer.State = shared === undefined
    ? Optimizer.makeState(params)
    : { step: 0, m: sharedViews(shared.m, layout), v: sharedViews(shared.v, layout) }
  const accum = shared === undefined
    ? new Map([...params].map(([k, v]) => [k, new Float32Array(v.length)]))
    : sharedViews(shared.accum, layout)
  let accumulated = 0
  const sessions = new Map<string, Compiled>()
  const lock = yield* Semaphore.make(1)
  const scope = yield* Effect.scope
  const fs = yield* FileSystem.FileSystem

  const sessionOptions: ort.InferenceSession.SessionOptions = {
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
  }

  const release = (c: Compiled) =>
    Effect.suspend(() => {
      if (c.released) return Effect.void
      c.released = true
      return Effect.tryPromise(() => c.session.release()).pipe(Effect.ignore)
    })

  const buildGraph = (mb: Packing.MicroBatch, withGradients: boolean) => {
    const { batch, length, prefix } = mb
    const forward = prefix === undefined ? model.forward : model.sharedForward
    if (forward === undefined) {
      return Effect.fail(fail("BadBatch", "this model has no graph for micro-batches with shared prompts"))
    }
    const dims = prefix === undefined ? {} : { groups: prefix.batch, prefix: prefix.length }
    return Autodiff.trainingGraph(forward(), { batch, length, dims, loss: options.loss, withGradients })
      .pipe(Effect.mapError((e) => fail("Graph", e.message)))
  }

  /** One graph a shape: the rows', and the shared prompts' if any. */
  const shapeKey = (mb: Packing.MicroBatch, withGradients: boolean) =>
    `${withGradients ? "train" : "fwd"}:${mb.batch}x${mb.length}` +
    (mb.prefix === undefined ? "" : `+${mb.prefix.batch}x${mb.prefix.length}`)

  const compile = Effect.fnUntraced(function*(mb: Packing.MicroBatch, withGradients: boolean) {
    const key = shapeKey(mb, withGradients)
    const hit = sessions.get(key)
    if (hit !== undefined) {
      sessions.delete(key)
      sessions.set(key, hit) // most recently used last
      return hit
    }
    const graph = yield* buildGraph(mb, withGradients)
    const bytes = Graph.toModelBytes(graph.graph)
    const session = yield* Effect.tryPromise({
      try: () => ort.InferenceSession.create(bytes, sessionOptions),
      catch: (u) => fail("Session", `${options.executionProvider ?? "cpu"}: ${errorMessage(u)}`)
    })
    const compiled: Compiled = { session, graph, released: false }
    sessions.set(key, compiled)
    yield* Scope.addFinalizer(scope, release(compiled))
    if (sessions.size > (options.maxSessions ?? 8)) {
      const [oldest, evicted] = sessions.entries().next().value!
      sessions.delete(oldest)
      yield* release(evicted)
    }
    return compiled
  })

  const validate = (mb: Packing.MicroBatch): PolicyTrainer.PolicyTrainerError | undefined => {
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

  const validatePrefix = (prefix: Packing.Prefix, rows: number): PolicyTrainer.PolicyTrainerError | undefined => {
    const cells = prefix.batch * prefix.length
    if (!(prefix.batch > 0 && prefix.length > 0)) {
      return fail("BadBatch", `empty prompts ${prefix.batch} × ${prefix.length}`)
    }
    if (prefix.inputIds.length !== cells || prefix.attentionMask.length !== cells || prefix.index.length !== rows) {
      return fail("BadBatch", `prompts ${prefix.batch} × ${prefix.length} for ${rows} rows: arrays of other sizes`)
    }
    const bad = prefix.index.findIndex((k) => !(k >= 0 && k < prefix.batch))
    return bad === -1 ? undefined : fail("BadBatch", `row ${bad} continues prompt ${prefix.index[bad]} of ${prefix.batch}`)
  }

  /** The graph's non-weight inputs for a micro-batch: the model's own and the loss head's. */
  const batchFeeds = (graph: Autodiff.TrainingGraph, mb: Packing.MicroBatch): Record<string, ort.Tensor> => {
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
    const out: Record<string, ort.Tensor> = { ...model.inputs(mb) }
    for (const name of graph.lossInputs) out[name] = data[name]!()
    return out
  }

  const feeds = (c: Compiled, mb: Packing.MicroBatch): Record<string, ort.Tensor> => {
    const out = batchFeeds(c.graph, mb)
    for (const { name, dims: d } of c.graph.weights) out[name] = new ort.Tensor("float32", params.get(name)!, [...d])
    return out
  }

  const run = (c: Compiled, mb: Packing.MicroBatch) =>
    Effect.tryPromise({ try: () => c.session.run(feeds(c, mb)), catch: (u) => fail("Run", errorMessage(u)) })

  const summarize = (out: ort.InferenceSession.OnnxValueMapType): PolicyTrainer.MicroBatchResult => {
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

  let pool: TrainerPool.Pool | undefined
  /** Threads started and not yet exited, over every pool this trainer has had. */
  let liveThreads = 0
  /** Session keys compiled on each worker of the current pool. */
  let compiledOn: Array<Set<string>> = []
  /** Shards accumulated per worker since the last step (0: the worker's next shard overwrites its buffer). */
  const shardsAccumulated = Array.from({ length: workers }, () => 0)
  const everyWorker = shardsAccumulated.map((_, j) => j)
  /** Bumped whenever the weights change, so that workers refresh their private copies. */
  let weightsVersion = 0
  /** Graphs by shard shape, most recently used last; at least 2 (one call uses up to 2 shard sizes). */
  const graphs = new Map<string, { readonly graph: Autodiff.TrainingGraph; readonly bytes: Uint8Array }>()

  // No zero fill: the first micro-batch after a clear overwrites the accumulators (and `gradients` zeroes them).
  const clear = () => {
    shardsAccumulated.fill(0)
    accumulated = 0
  }

  const dropPool = Effect.suspend(() => {
    const p = pool
    pool = undefined
    return p === undefined ? Effect.void : p.close("5 seconds")
  })
  yield* Scope.addFinalizer(scope, dropPool)

  const usePool = Effect.gen(function*() {
    const broken = pool?.broken()
    if (broken !== undefined) {
      yield* dropPool
      if (accumulated > 0) {
        clear()
        return yield* fail("Run", `${broken}; the gradients accumulated since the last step were discarded`)
      }
    }
    if (pool !== undefined) return pool
    const p = yield* TrainerPool.start(Array.from({ length: workers }, (_, index) => ({
      index,
      layout,
      params: shared!.params,
      m: shared!.m,
      v: shared!.v,
      accum: shared!.accum,
      grads: shared!.grads,
      slice: [Math.floor(layout.total * index / workers), Math.floor(layout.total * (index + 1) / workers)] as const,
      sessionOptions
    })), () => liveThreads--)
    liveThreads += p.size
    pool = p
    compiledOn = Array.from({ length: workers }, () => new Set())
    return p
  })

  /** After a failed pooled call: a broken pool is replaced on the next call, and its gradients are lost. */
  const afterFailure = (clearGradients: boolean) =>
    Effect.suspend(() => {
      const broken = pool?.broken() !== undefined
      if (clearGradients || broken) clear()
      return broken ? dropPool : Effect.void
    })

  const graphFor = Effect.fnUntraced(function*(p: TrainerPool.Pool, mb: Packing.MicroBatch, grads: boolean) {
    const key = shapeKey(mb, grads)
    const hit = graphs.get(key)
    graphs.delete(key)
    const entry = hit ?? (yield* Effect.map(buildGraph(mb, grads), (graph) => ({
      graph,
      bytes: Graph.toModelBytes(graph.graph)
    })))
    graphs.set(key, entry)
    if (graphs.size > Math.max(2, options.maxSessions ?? 8)) {
      const oldest = graphs.keys().next().value!
      graphs.delete(oldest)
      for (const [j, keys] of compiledOn.entries()) {
        if (keys.delete(oldest)) yield* Effect.ignore(p.request(j, { op: "release", key: oldest }))
      }
    }
    return { key, ...entry }
  })

  const runShards = Effect.fnUntraced(function*(mb: Packing.MicroBatch, withGradients: boolean) {
    const p = yield* usePool
    const shards = shardRanges(mb.batch, p.size)
    const pieces = shards.map(([r0, r1]) => shardOf(mb, r0, r1))
    const entries: Array<Effect.Success<ReturnType<typeof graphFor>>> = []
    for (const piece of pieces) entries.push(yield* graphFor(p, piece, withGradients))
    const results = yield* Effect.forEach(shards, (_, j) =>
      Effect.gen(function*() {
        const { key, graph, bytes } = entries[j]!
        if (!compiledOn[j]!.has(key)) {
          const gradients = [...graph.gradients]
          yield* p.request(j, { op: "compile", key, bytes, weights: graph.weights, gradients })
          compiledOn[j]!.add(key)
        }
        const plain: Record<string, TrainerWorker.Feed> = {}
        for (const [name, t] of Object.entries(batchFeeds(graph, pieces[j]!))) plain[name] = toFeed(t)
        const accumulate = !withGradients ? "none" : shardsAccumulated[j] === 0 ? "set" : "add"
        const out = yield* p.request(j, { op: "run", key, version: weightsVersion, feeds: plain, accumulate })
        return out.run!
      }), { concurrency: "unbounded" })
    if (withGradients) for (let j = 0; j < shards.length; j++) shardsAccumulated[j]!++
    return combine(mb, shards, results)
  })

  /**
   * accum ← Σ over workers of their gradient buffers, each worker summing its own slice; returns the global norm
   * from the slices' norms (summed in worker order: deterministic, though not in `Optimizer.globalNorm`'s order).
   */
  const reduce = (p: TrainerPool.Pool) => {
    const sources = shardsAccumulated.flatMap((n, j) => (n > 0 ? [j] : []))
    return Effect.forEach(everyWorker, (j) => p.request(j, { op: "reduce", sources }), { concurrency: "unbounded" })
      .pipe(Effect.map((outs) => Math.sqrt(outs.reduce((sum, o) => sum + o.norm! * o.norm!, 0))))
  }

  // ----- The trainer -----

  const forwardBackward = (mb: Packing.MicroBatch) =>
    lock.withPermits(1)(Effect.gen(function*() {
      const bad = validate(mb)
      if (bad !== undefined) return yield* bad
      if (shared !== undefined) {
        const result = yield* runShards(mb, true).pipe(Effect.onError(() => afterFailure(true)))
        accumulated++
        return result
      }
      const c = yield* compile(mb, true)
      const out = yield* run(c, mb)
      for (const [w, gradName] of c.graph.gradients) {
        const g = out[gradName]!.data as Float32Array
        const acc = accum.get(w)!
        if (accumulated === 0) acc.set(g) // the first micro-batch: a copy, not an addition to zeros
        else for (let i = 0; i < acc.length; i++) acc[i]! += g[i]!
      }
      accumulated++
      return summarize(out)
    }))

  /** AdamW over the accumulated gradients: on this thread, or in the workers over disjoint slices. */
  const applyUpdate = (lr: number, scale: number) => {
    if (shared === undefined) {
      return Effect.sync(() => Optimizer.step(params, accum, state, lr, options.optimizer, scale))
    }
    const p = pool!
    const request: TrainerWorker.Request = { op: "adam", step: state.step, lr, scale, config: options.optimizer }
    weightsVersion++ // before the update: even a failed one may have changed some slices
    return Effect.forEach(everyWorker, (j) => p.request(j, request), { concurrency: "unbounded", discard: true })
      .pipe(Effect.map(() => ++state.step))
  }

  const optimStep = lock.withPermits(1)(Effect.uninterruptible(Effect.gen(function*() {
    if (accumulated === 0) return yield* fail("NothingAccumulated", "optimStep before any forwardBackward")
    const gradNorm = shared === undefined ? Optimizer.globalNorm(accum) : yield* reduce(yield* usePool)
    if (!Number.isFinite(gradNorm)) {
      clear()
      return yield* fail("NonFiniteGradient", `gradient norm is ${gradNorm}; the update was skipped`)
    }
    const lr = LrSchedule.at(options.schedule, state.step)
    const scale = Optimizer.clipScale(gradNorm, options.optimizer.maxGradNorm)
    const step = yield* applyUpdate(lr, scale)
    clear()
    return { step, gradNorm, lr }
  }).pipe(Effect.onError(() => afterFailure(true)))))

  const logprobs = (mb: Packing.MicroBatch) =>
    lock.withPermits(1)(Effect.gen(function*() {
      const bad = validate(mb)
      if (bad !== undefined) return yield* bad
      if (shared !== undefined) return yield* runShards(mb, false).pipe(Effect.onError(() => afterFailure(false)))
      return summarize(yield* run(yield* compile(mb, false), mb))
    }))

  const snapshot = () => new Map([...params].map(([k, v]) => [k, Float32Array.from(v)]))

  const save = (dir: string, meta: PolicyTrainer.CheckpointMeta) =>
    lock.withPermits(1)(Effect.suspend(() =>
      Checkpoint.save(dir, {
        weights: model.parameters.map((p) => ({ name: p.name, shape: p.shape, data: params.get(p.name)! })),
        optimizer: state,
        policyVersion: meta.policyVersion,
        rngState: meta.rngState
      })
    )).pipe(Effect.provideService(FileSystem.FileSystem, fs), Effect.mapError((e) => fail("Checkpoint", e.message)))

  const load = (dir: string) =>
    lock.withPermits(1)(Effect.gen(function*() {
      const loaded = yield* Checkpoint.load(dir, model.parameters)
      for (const [name, w] of loaded.weights) params.get(name)!.set(w)
      if (shared === undefined) state = loaded.optimizer
      else {
        // The moments stay in shared memory, where the workers update them.
        for (const [name, m] of loaded.optimizer.m) state.m.get(name)!.set(m)
        for (const [name, v] of loaded.optimizer.v) state.v.get(name)!.set(v)
        state.step = loaded.optimizer.step
      }
      weightsVersion++
      clear()
      return { policyVersion: loaded.policyVersion, rngState: loaded.rngState }
    })).pipe(Effect.provideService(FileSystem.FileSystem, fs), Effect.mapError((e) => fail("Checkpoint", e.message)))

  const trainer = PolicyTrainer.PolicyTrainer.of({
    forwardBackward,
    logprobs: (batch) => Effect.map(logprobs(batch), (r) => r.tokenLogprobs),
    optimStep,
    discard: lock.withPermits(1)(Effect.sync(clear)),
    // With workers, AdamW runs off this thread: a snapshot waits for the step to finish.
    weights: shared === undefined ? Effect.sync(snapshot) : lock.withPermits(1)(Effect.sync(snapshot)),
    step: Effect.sync(() => state.step),
    save,
    load
  })
  /** A copy of the gradients accumulated since the last optimiser step (for checks and benchmarks). */
  const gradients = lock.withPermits(1)(Effect.gen(function*() {
    if (pool !== undefined && accumulated > 0) yield* reduce(pool)
    else if (accumulated === 0) for (const a of accum.values()) a.fill(0)
    return new Map([...accum].map(([k, v]) => [k, Float32Array.from(v)]))
  }))
  /**
   * The worker threads (for tests): how many are alive, how many requests they are running (or have queued), a way
   * to kill one as a crash would, and a way to close them with a given wait (the next call starts fresh threads).
   */
  const threads = {
    live: Effect.sync(() => liveThreads),
    inFlight: Effect.sync(() => pool?.inFlight() ?? 0),
    kill: (index: number) => Effect.suspend(() => (pool === undefined ? Effect.void : pool.kill(index))),
    close: (wait: Duration.Input) =>
      Effect.suspend(() => {
        const p = pool
        pool = undefined
        return p === undefined ? Effect.void : p.close(wait)
      })
  }
  return { trainer, logprobs, gradients, threads }
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
  weights: PolicyTrainer.Weights,
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
 * The trainer as a `PolicyTrainer` layer.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (
  options: Options
): Layer.Layer<PolicyTrainer.PolicyTrainer, PolicyTrainer.PolicyTrainerError, FileSystem.FileSystem> =>
  Layer.effect(PolicyTrainer.PolicyTrainer, Effect.map(make(options), (t) => t.trainer))
