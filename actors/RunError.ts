/**
 * Why a training run stopped: one error for the whole run, whose `reason` is a class per way it can fail, each with
 * its message and, where one caused it, the `cause` (as `SamplerError` and `Resource.LeaseError` carry theirs).
 * Handle a reason with `Effect.catchReason("RunError", "Resume", …)`; a reason's `message` is the run's.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as NoSpace from "../src/internal/diskFull.ts"

const fields = {
  message: Schema.String,
  /** What failed underneath (an I/O error, a learner or sampler error), when something did. */
  cause: Schema.optionalKey(Schema.Defect())
}

/**
 * A rollout failed with an `abort_run` policy.
 *
 * @category errors
 * @since 0.1.0
 */
export class Rollout extends Schema.TaggedError<Rollout>()("Rollout", fields) {}

/**
 * A learner or warm-up step failed.
 *
 * @category errors
 * @since 0.1.0
 */
export class Learner extends Schema.TaggedError<Learner>()("Learner", fields) {}

/**
 * Saving or loading a checkpoint failed.
 *
 * @category errors
 * @since 0.1.0
 */
export class Checkpoint extends Schema.TaggedError<Checkpoint>()("Checkpoint", fields) {}

/**
 * The journal or the metrics files could not be written or read.
 *
 * @category errors
 * @since 0.1.0
 */
export class Journal extends Schema.TaggedError<Journal>()("Journal", fields) {}

/**
 * The journal and the run do not agree (another config, an unreadable `config.json`).
 *
 * @category errors
 * @since 0.1.0
 */
export class Resume extends Schema.TaggedError<Resume>()("Resume", fields) {}

/**
 * The warm-up reached its step cap short of its target (`warmup.stopAt.onMiss: "fail"`).
 *
 * @category errors
 * @since 0.1.0
 */
export class Warmup extends Schema.TaggedError<Warmup>()("Warmup", fields) {}

/**
 * More than `maxFailureShare` of a step's trajectories failed for infrastructure reasons.
 *
 * @category errors
 * @since 0.1.0
 */
export class Failures extends Schema.TaggedError<Failures>()("Failures", fields) {}

/**
 * The task cannot run: missing environment services, an environment that cannot start, prompts that fill the
 * context.
 *
 * @category errors
 * @since 0.1.0
 */
export class Task extends Schema.TaggedError<Task>()("Task", fields) {}

/**
 * A dataset row does not match the task's row Schema.
 *
 * @category errors
 * @since 0.1.0
 */
export class Data extends Schema.TaggedError<Data>()("Data", fields) {}

/**
 * A learner or warm-up step made the loss or the weights NaN or infinite (nothing is saved after it).
 *
 * @category errors
 * @since 0.1.0
 */
export class NonFinite extends Schema.TaggedError<NonFinite>()("NonFinite", fields) {}

/**
 * A write found no space left on the device (ENOSPC).
 *
 * @category errors
 * @since 0.1.0
 */
export class DiskFull extends Schema.TaggedError<DiskFull>()("DiskFull", fields) {}

/**
 * The inference servers of `engine.servers` cannot be reached, or refuse the learner's weights.
 *
 * @category errors
 * @since 0.1.0
 */
export class Servers extends Schema.TaggedError<Servers>()("Servers", fields) {}

/**
 * The rollout workers of `rollout.workers` cannot be reached, disagree with the run, or all failed.
 *
 * @category errors
 * @since 0.1.0
 */
export class Workers extends Schema.TaggedError<Workers>()("Workers", fields) {}

/**
 * Rollouts returned groups that do not answer their request (rows, ids, chains, policy versions, token ids,
 * logprobs: `BatchCheck`): a broken or forged answer, refused whole and never trained on.
 *
 * @category errors
 * @since 0.1.0
 */
export class Mismatch extends Schema.TaggedError<Mismatch>()("Mismatch", fields) {}

/**
 * Why a run stopped.
 *
 * @category errors
 * @since 0.1.0
 */
export const RunErrorReason = Schema.Union([
  Rollout,
  Learner,
  Checkpoint,
  Journal,
  Resume,
  Warmup,
  Failures,
  Task,
  Data,
  NonFinite,
  DiskFull,
  Servers,
  Workers,
  Mismatch
])
export type RunErrorReason = typeof RunErrorReason.Type

/**
 * A training run failed. `message` is its reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class RunError extends Schema.TaggedError<RunError>()("RunError", { reason: RunErrorReason }) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag; a reason left out is a compile error. */
const reasons = {
  Rollout,
  Learner,
  Checkpoint,
  Journal,
  Resume,
  Warmup,
  Failures,
  Task,
  Data,
  NonFinite,
  DiskFull,
  Servers,
  Workers,
  Mismatch
} satisfies Record<RunErrorReason["_tag"], unknown>

/**
 * A `RunError` of the reason tagged `tag`: `runError("Resume", "…")`, `runError("Learner", e.message, e)`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const runError = (tag: RunErrorReason["_tag"], message: string, cause?: unknown): RunError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string; readonly cause?: unknown }) => RunErrorReason
  return new RunError({ reason: new Reason(cause === undefined ? { message } : { message, cause }) })
}

/**
 * Wraps any failure as a `RunError` of reason `tag` with its message and the failure as its cause; a full disk
 * becomes `DiskFull`, whatever `tag` says, with the words that tell the user what to do.
 *
 * @category constructors
 * @since 0.1.0
 */
export const wrap = (tag: RunErrorReason["_tag"]) => (e: unknown): RunError => {
  if (e instanceof RunError) return e
  const message = typeof e === "object" && e !== null && "message" in e ? String(e.message) : String(e)
  if (!NoSpace.isDiskFull(e)) return runError(tag, message, e)
  return runError(
    "DiskFull",
    message.startsWith(NoSpace.marker)
      ? message
      : `${NoSpace.marker}: ${message}; free space on its filesystem, then resume`,
    e
  )
}
