/**
 * The policy-update backend interface: what the learner actor needs from whatever computes gradients and applies
 * the optimiser. The local implementation (`backends/OnnxTrainer.ts`) differentiates the model's ONNX graph on
 * onnxruntime-node (execution provider `cpu` or `cuda` by configuration); an external trainer (a Python worker, a
 * remote service) implements the same service.
 *
 * Protocol of one optimiser step: `forwardBackward` once per micro-batch (gradients accumulate; the aggregation
 * weights in each micro-batch already divide by the whole mini-batch's totals), then `optimStep` applies AdamW with
 * gradient clipping and the learning-rate schedule and clears the accumulators.
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer, Ref, Schema } from "effect"
import type * as Packing from "./Packing.ts"

// ===== Models =====

/**
 * Statistics of one micro-batch, as sums over its loss tokens (see `Loss.StatSums`), plus its share of the loss.
 *
 * @category models
 * @since 0.1.0
 */
export interface MicroBatchResult {
  /** This micro-batch's contribution to the mini-batch loss (they sum to it). */
  readonly loss: number
  /** `[batch × length]` logprobs of the targets under the current weights. */
  readonly tokenLogprobs: Float32Array
  readonly tokens: number
  readonly clipped: number
  readonly clippedLower: number
  readonly approxKl: number
  readonly entropy: number
  readonly kl: number
}

/**
 * Result of an optimiser step.
 *
 * @category models
 * @since 0.1.0
 */
export interface OptimResult {
  /** Optimiser steps applied so far (after this one). */
  readonly step: number
  /** Global gradient norm before clipping. */
  readonly gradNorm: number
  readonly lr: number
}

/**
 * Named float32 weights (Hugging Face names).
 *
 * @category models
 * @since 0.1.0
 */
export type Weights = ReadonlyMap<string, Float32Array>

/**
 * Extra state saved with a checkpoint by the caller (policy version, RNG state of the run).
 *
 * @category models
 * @since 0.1.0
 */
export interface CheckpointMeta {
  readonly policyVersion: number
  readonly rngState: ReadonlyArray<number>
}

/**
 * The micro-batch is malformed (array sizes, token ids outside the vocabulary).
 *
 * @category errors
 * @since 0.1.0
 */
export class BadBatch extends Schema.TaggedError<BadBatch>()("BadBatch", { message: Schema.String }) {}

/**
 * The training graph could not be built (autodiff).
 *
 * @category errors
 * @since 0.1.0
 */
export class Graph extends Schema.TaggedError<Graph>()("Graph", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * onnxruntime could not create a session (e.g. the execution provider is missing).
 *
 * @category errors
 * @since 0.1.0
 */
export class Session extends Schema.TaggedError<Session>()("Session", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * onnxruntime failed while running.
 *
 * @category errors
 * @since 0.1.0
 */
export class Run extends Schema.TaggedError<Run>()("Run", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * NaN/Inf gradients: the update was skipped and the accumulators cleared.
 *
 * @category errors
 * @since 0.1.0
 */
export class NonFiniteGradient extends Schema.TaggedError<NonFiniteGradient>()("NonFiniteGradient", {
  message: Schema.String
}) {}

/**
 * `optimStep` without a `forwardBackward` since the last step.
 *
 * @category errors
 * @since 0.1.0
 */
export class NothingAccumulated extends Schema.TaggedError<NothingAccumulated>()("NothingAccumulated", {
  message: Schema.String
}) {}

/**
 * Saving or loading failed.
 *
 * @category errors
 * @since 0.1.0
 */
export class Checkpoint extends Schema.TaggedError<Checkpoint>()("Checkpoint", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * A remote trainer could not be reached (for longer than its retry window).
 *
 * @category errors
 * @since 0.1.0
 */
export class Unavailable extends Schema.TaggedError<Unavailable>()("Unavailable", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * A remote trainer refused the call or lost the run's state (it restarted): resume from a checkpoint.
 *
 * @category errors
 * @since 0.1.0
 */
export class Remote extends Schema.TaggedError<Remote>()("Remote", { message: Schema.String }) {}

/**
 * Why a trainer call failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const GradientBackendErrorReason = Schema.Union([
  BadBatch,
  Graph,
  Session,
  Run,
  NonFiniteGradient,
  NothingAccumulated,
  Checkpoint,
  Unavailable,
  Remote
])
export type GradientBackendErrorReason = typeof GradientBackendErrorReason.Type

/**
 * A failed trainer call. Handle reasons with `Effect.catchReason("GradientBackendError", "NonFiniteGradient", …)`;
 * `message` is the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class GradientBackendError extends Schema.TaggedError<GradientBackendError>()("GradientBackendError", {
  reason: GradientBackendErrorReason
}) {
  /** A skipped non-finite step can be retried with the next batch; the others need a fix. */
  get isRetryable(): boolean {
    return this.reason._tag === "NonFiniteGradient"
  }
  override get message(): string {
    return this.reason.message
  }
  /** The same error, its reason's cause kept, saying `message`. */
  withMessage(message: string): GradientBackendError {
    const { cause } = this.reason
    const Reason = reasons[this.reason._tag] as new(fields: {
      readonly message: string
      readonly cause?: unknown
    }) => GradientBackendErrorReason
    return new GradientBackendError({ reason: new Reason(cause === undefined ? { message } : { message, cause }) })
  }
}

/** Each reason's class by its tag, for `gradientBackendError`; a reason left out is a compile error. */
const reasons = {
  BadBatch,
  Graph,
  Session,
  Run,
  NonFiniteGradient,
  NothingAccumulated,
  Checkpoint,
  Unavailable,
  Remote
} satisfies Record<GradientBackendErrorReason["_tag"], unknown>

/**
 * Whether `tag` names a reason (a remote trainer's or a worker thread's answer carries the tag as text).
 *
 * @category guards
 * @since 0.1.0
 */
export const isGradientBackendErrorTag = (tag: string): tag is GradientBackendErrorReason["_tag"] =>
  Object.hasOwn(reasons, tag)

/**
 * The facts a reason carries besides its message (the `cause` of `Graph`, `Session`, `Run`, `Checkpoint`,
 * `Unavailable`).
 *
 * @category errors
 * @since 0.1.0
 */
export type GradientBackendErrorFacts<Tag extends GradientBackendErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `GradientBackendError` of the reason tagged `tag`: `gradientBackendError("Run", text, { cause })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const gradientBackendError = <Tag extends GradientBackendErrorReason["_tag"]>(
  tag: Tag,
  message: string,
  facts?: GradientBackendErrorFacts<Tag>
): GradientBackendError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => GradientBackendErrorReason
  return new GradientBackendError({ reason: new Reason({ ...facts, message }) })
}

// ===== Service =====

/**
 * The GradientBackend service.
 *
 * @category services
 * @since 0.1.0
 */
export class GradientBackend extends Context.Service<GradientBackend, {
  /** Forward and backward over one micro-batch; gradients accumulate until `optimStep`. */
  readonly forwardBackward: (batch: Packing.MicroBatch) => Effect.Effect<MicroBatchResult, GradientBackendError>
  /** Forward only: `[batch × length]` logprobs of the targets under the current weights (nothing accumulates). */
  readonly logprobs: (batch: Packing.MicroBatch) => Effect.Effect<Float32Array, GradientBackendError>
  /** Clip, AdamW-update, clear the accumulators. */
  readonly optimStep: Effect.Effect<OptimResult, GradientBackendError>
  /** Clears the accumulated gradients without an update (a step abandoned half-way must not leak into the next). */
  readonly discard: Effect.Effect<void>
  /** A snapshot copy of the current weights (a remote trainer may fail to send them). */
  readonly weights: Effect.Effect<Weights, GradientBackendError>
  /** Optimiser steps applied so far. */
  readonly step: Effect.Effect<number, GradientBackendError>
  /** Writes weights, optimiser state, step and `meta` to a checkpoint directory. */
  readonly save: (dir: string, meta: CheckpointMeta) => Effect.Effect<void, GradientBackendError>
  /** Restores a checkpoint written by `save`; returns its meta. */
  readonly load: (dir: string) => Effect.Effect<CheckpointMeta, GradientBackendError>
}>()("agentfly/src/GradientBackend") {}

// ===== Fakes =====

/**
 * What {@link layerRecording} recorded.
 *
 * @category models
 * @since 0.1.0
 */
export interface Recording {
  readonly microBatches: ReadonlyArray<Packing.MicroBatch>
  readonly steps: number
}

/**
 * A fake trainer that records micro-batches and counts steps, with fixed weights; returns `logprob` (default 0) for
 * every token, or what `logprob(batch)` gives (a critic's values, for a fake critic). For testing learners, trainers
 * and pipelines without a model.
 *
 * @category layers
 * @since 0.1.0
 */
export const layerRecording = (
  weights: Weights = new Map(),
  logprob: number | ((batch: Packing.MicroBatch) => Float32Array) = 0
): Layer.Layer<GradientBackend | RecordingRef> =>
  Layer.effectContext(Effect.gen(function*() {
    const ref = yield* Ref.make<Recording>({ microBatches: [], steps: 0 })
    const trainer = GradientBackend.of({
      forwardBackward: (batch) =>
        Ref.update(ref, (r) => ({ ...r, microBatches: [...r.microBatches, batch] })).pipe(Effect.as({
          loss: 0,
          tokenLogprobs: new Float32Array(batch.batch * batch.length),
          tokens: batch.lossTokens,
          clipped: 0,
          clippedLower: 0,
          approxKl: 0,
          entropy: 0,
          kl: 0
        })),
      logprobs: (batch) =>
        Effect.sync(() =>
          typeof logprob === "number" ? new Float32Array(batch.batch * batch.length).fill(logprob) : logprob(batch)
        ),
      optimStep: Ref.modify(ref, (r) => [{ step: r.steps + 1, gradNorm: 0, lr: 0 }, { ...r, steps: r.steps + 1 }]),
      discard: Effect.void,
      weights: Effect.sync(() => new Map([...weights].map(([k, v]) => [k, Float32Array.from(v)]))),
      step: Effect.map(Ref.get(ref), (r) => r.steps),
      save: () => Effect.void,
      load: () => Effect.succeed({ policyVersion: 0, rngState: [] })
    })
    return Context.make(GradientBackend, trainer).pipe(Context.add(RecordingRef, ref))
  }))

/**
 * The recording of {@link layerRecording}.
 *
 * @category services
 * @since 0.1.0
 */
export class RecordingRef
  extends Context.Service<RecordingRef, Ref.Ref<Recording>>()("agentfly/src/GradientBackend/Recording")
{}
