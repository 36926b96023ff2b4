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
 * @since 0.1.0
 */
import { Effect, FileSystem, Layer, Scope, Semaphore } from "effect"
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
  readonly inputs: (batch: Packing.MicroBatch) => Record<string, ort.Tensor>
}

/**
 * The Qwen2 model of `model/Qwen2.ts`: inputs `input_ids`, `attention_mask`, `position_ids` (positions count real
 * tokens only, so right padding does not shift them).
 *
 * @category constructors
 * @since 0.1.0
 */
export const qwen2 = (config: ModelConfig.ModelConfig): Model => ({
  parameters: Qwen2.parameters(config),
  vocabSize: config.vocabSize,
  forward: () => Qwen2.trainingGraph(config),
  inputs: (mb) => {
    const dims = [mb.batch, mb.length]
    const positions = new BigInt64Array(mb.batch * mb.length)
    for (let b = 0; b < mb.batch; b++) {
      let p = 0
      for (let t = 0; t < mb.length; t++) {
        const i = b * mb.length + t
        positions[i] = mb.attentionMask[i] ? BigInt(p++) : 0n
      }
    }
    return {
      input_ids: new ort.Tensor("int64", BigInt64Array.from(mb.inputIds, BigInt), dims),
      attention_mask: new ort.Tensor("int64", BigInt64Array.from(mb.attentionMask, BigInt), dims),
      position_ids: new ort.Tensor("int64", positions, dims)
    }
  }
})

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
  /** Intra-op threads (default 2). */
  readonly intraOpThreads?: number
  /** Sessions kept per shape (default 8). */
  readonly maxSessions?: number
  /**
   * Let idle intra-op threads spin (onnxruntime's default). Off by default: on a machine shared with other
   * processes, spinning threads fight for the cores (measured 2.4× slower steps under load, equal when idle).
   */
  readonly allowSpinning?: boolean
}

const fail = (reason: PolicyTrainer.PolicyTrainerErrorReason, message: string) =>
  new PolicyTrainer.PolicyTrainerError({ reason, message })

const errorMessage = (u: unknown) => (u instanceof Error ? u.message : String(u))

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
  const params = new Map<string, Float32Array>()
  for (const { name, shape } of model.parameters) {
    const w = options.weights.get(name)
    const n = shape.reduce((a, b) => a * b, 1)
    if (w === undefined || w.length !== n) {
      return yield* fail("BadBatch", `weight ${name}: expected ${n} floats [${shape}], got ${w?.length ?? "none"}`)
    }
    params.set(name, Float32Array.from(w))
  }
  let state = Optimizer.makeState(params)
  const accum = new Map([...params].map(([k, v]) => [k, new Float32Array(v.length)]))
  let accumulated = 0
  const sessions = new Map<string, Compiled>()
  const lock = yield* Semaphore.make(1)
  const scope = yield* Effect.scope
  const fs = yield* FileSystem.FileSystem

  const sessionOptions: ort.InferenceSession.SessionOptions = {
    executionProviders: [options.executionProvider ?? "cpu"],
    intraOpNumThreads: options.intraOpThreads ?? 2,
    interOpNumThreads: 1,
    executionMode: "sequential",
    graphOptimizationLevel: "all",
    extra: { session: { intra_op: { allow_spinning: options.allowSpinning === true ? "1" : "0" } } }
  }

  const release = (c: Compiled) =>
    Effect.suspend(() => {
      if (c.released) return Effect.void
      c.released = true
      return Effect.tryPromise(() => c.session.release()).pipe(Effect.ignore)
    })

  const compile = Effect.fnUntraced(function*(batch: number, length: number, withGradients: boolean) {
    const key = `${withGradients ? "train" : "fwd"}:${batch}x${length}`
    const hit = sessions.get(key)
    if (hit !== undefined) {
      sessions.delete(key)
      sessions.set(key, hit) // most recently used last
      return hit
    }
    const graph = yield* Autodiff.trainingGraph(model.forward(), { batch, length, loss: options.loss, withGradients })
      .pipe(Effect.mapError((e) => fail("Graph", e.message)))
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
    for (const ids of [mb.inputIds, mb.targets]) {
      for (let i = 0; i < cells; i++) {
        if (ids[i]! < 0 || ids[i]! >= model.vocabSize) {
          return fail("BadBatch", `token id ${ids[i]} at ${i} is outside the vocabulary of ${model.vocabSize}`)
        }
      }
    }
    return undefined
  }

  const feeds = (c: Compiled, mb: Packing.MicroBatch): Record<string, ort.Tensor> => {
    const dims = [mb.batch, mb.length]
    const f32 = (a: Float32Array | Uint8Array) =>
      new ort.Tensor("float32", a instanceof Float32Array ? a : Float32Array.from(a), dims)
    const data: Record<string, () => ort.Tensor> = {
      targets: () => new ort.Tensor("int64", BigInt64Array.from(mb.targets, BigInt), dims),
      loss_weights: () => f32(mb.weights),
      loss_mask: () => f32(mb.mask),
      advantages: () => f32(mb.advantages),
      // Without a recomputed proximal policy the sampler's logprobs stand in for the old policy.
      old_logprobs: () => f32(mb.oldLogprobs ?? mb.samplerLogprobs),
      sampler_logprobs: () => f32(mb.samplerLogprobs),
      ref_logprobs: () => f32(mb.refLogprobs)
    }
    const out: Record<string, ort.Tensor> = { ...model.inputs(mb) }
    for (const name of c.graph.lossInputs) out[name] = data[name]!()
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

  const forwardBackward = (mb: Packing.MicroBatch) =>
    lock.withPermits(1)(Effect.gen(function*() {
      const bad = validate(mb)
      if (bad !== undefined) return yield* bad
      const c = yield* compile(mb.batch, mb.length, true)
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

  const clear = () => {
    for (const a of accum.values()) a.fill(0)
    accumulated = 0
  }

  const optimStep = lock.withPermits(1)(Effect.gen(function*() {
    if (accumulated === 0) return yield* fail("NothingAccumulated", "optimStep before any forwardBackward")
    const gradNorm = Optimizer.globalNorm(accum)
    if (!Number.isFinite(gradNorm)) {
      clear()
      return yield* fail("NonFiniteGradient", `gradient norm is ${gradNorm}; the update was skipped`)
    }
    const lr = LrSchedule.at(options.schedule, state.step)
    const scale = Optimizer.clipScale(gradNorm, options.optimizer.maxGradNorm)
    const step = Optimizer.step(params, accum, state, lr, options.optimizer, scale)
    clear()
    return { step, gradNorm, lr }
  }))

  const logprobs = (mb: Packing.MicroBatch) =>
    lock.withPermits(1)(Effect.gen(function*() {
      const bad = validate(mb)
      if (bad !== undefined) return yield* bad
      return summarize(yield* run(yield* compile(mb.batch, mb.length, false), mb))
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
      state = loaded.optimizer
      clear()
      return { policyVersion: loaded.policyVersion, rngState: loaded.rngState }
    })).pipe(Effect.provideService(FileSystem.FileSystem, fs), Effect.mapError((e) => fail("Checkpoint", e.message)))

  const trainer = PolicyTrainer.PolicyTrainer.of({
    forwardBackward,
    logprobs: (batch) => Effect.map(logprobs(batch), (r) => r.tokenLogprobs),
    optimStep,
    discard: lock.withPermits(1)(Effect.sync(clear)),
    weights: Effect.sync(snapshot),
    step: Effect.sync(() => state.step),
    save,
    load
  })
  /** A copy of the gradients accumulated since the last optimiser step (for checks and benchmarks). */
  const gradients = Effect.sync(() => new Map([...accum].map(([k, v]) => [k, Float32Array.from(v)])))
  return { trainer, logprobs, gradients }
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
