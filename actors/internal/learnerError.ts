/**
 * Why one learner step (`Learner.update`) failed: a reason per stage (advantages, packing, the gradient backend, the
 * options, the sampler's logprobs), each with its cause. Re-exported by `actors/Learner.ts`.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"

/**
 * The advantages could not be computed (tag `Advantage`; `cause`: the `AdvantageError`).
 *
 * @category errors
 * @since 0.1.0
 */
export class AdvantageFailed extends Schema.TaggedError<AdvantageFailed>()("Advantage", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The batch could not be packed into micro-batches (tag `Packing`; `cause`: the `PackingError`).
 *
 * @category errors
 * @since 0.1.0
 */
export class PackingFailed extends Schema.TaggedError<PackingFailed>()("Packing", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The trainer failed (tag `Trainer`; `cause`: the `GradientBackendError`).
 *
 * @category errors
 * @since 0.1.0
 */
export class TrainerFailed extends Schema.TaggedError<TrainerFailed>()("Trainer", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The options contradict each other (e.g. a gae estimator without a critic).
 *
 * @category errors
 * @since 0.1.0
 */
export class Config extends Schema.TaggedError<Config>()("Config", { message: Schema.String }) {}

/**
 * Policy tokens without sampler logprobs, for a loss that needs them.
 *
 * @category errors
 * @since 0.1.0
 */
export class MissingLogprobs extends Schema.TaggedError<MissingLogprobs>()("MissingLogprobs", {
  message: Schema.String
}) {}

/**
 * Why the learner failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const LearnerErrorReason = Schema.Union([AdvantageFailed, PackingFailed, TrainerFailed, Config, MissingLogprobs])
export type LearnerErrorReason = typeof LearnerErrorReason.Type

/**
 * The learner failed. Handle reasons with `Effect.catchReason("LearnerError", "Trainer", …)`; `message` is the
 * reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class LearnerError extends Schema.TaggedError<LearnerError>()("LearnerError", {
  reason: LearnerErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `learnerError`; a reason left out is a compile error. */
const reasons = {
  Advantage: AdvantageFailed,
  Packing: PackingFailed,
  Trainer: TrainerFailed,
  Config,
  MissingLogprobs
} satisfies Record<
  LearnerErrorReason["_tag"],
  unknown
>

/**
 * A `LearnerError` of the reason tagged `tag`: `learnerError("Trainer", text, { cause })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const learnerError = <Tag extends LearnerErrorReason["_tag"]>(
  tag: Tag,
  message: string,
  facts?: Omit<ConstructorParameters<(typeof reasons)[Tag]>[0], "message">
): LearnerError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => LearnerErrorReason
  return new LearnerError({ reason: new Reason({ ...facts, message }) })
}
