/**
 * The error algebra of rollouts and its declared policy (design principle 4).
 *
 * Every failure that reaches a rollout chain is a `RolloutError` with a `reason`. Each reason maps to a `Policy`
 * that says what the runtime does about it:
 *
 * | policy        | effect on the chain / run                                                                   |
 * |---------------|---------------------------------------------------------------------------------------------|
 * | `retry`       | the failing step is retried under the run's retry `Schedule`; when retries run out, the     |
 * |               | reason's fallback policy (`mask` by default) applies                                        |
 * | `feedback`    | the error becomes an observation (an `is_error` tool message) and the chain continues       |
 * | `zero_reward` | the chain ends; the trajectory is kept, scored 0 and counts in its group's baseline         |
 * | `mask`        | the chain ends; the trajectory is kept with `masked: true` and left out of loss and baseline |
 * | `drop_group`  | the chain ends and its whole group is dropped (never reaches the learner)                   |
 * | `abort_run`   | the run fails with this error; every chain is interrupted and releases what it holds        |
 *
 * Defects (bugs) are not reasons: the chain that died is restarted from scratch under the run's defect
 * `Schedule`, and masked with reason `ChainDefect` once restarts run out. A defect never takes down the run.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import type { SamplerError } from "./Sampler.ts"

/**
 * Why a rollout step failed.
 *
 * @category models
 * @since 0.1.0
 */
export const Reason = Schema.Literals([
  "SamplerTransient", // sampler timeout, overload, 5xx, transport: worth retrying
  "SamplerRejected", // the sampler refused the request (e.g. a prompt longer than its context)
  "SamplerUnusable", // the backend cannot serve token-in/token-out (no token ids) or was shut down
  "ParseFailed", // the assistant turn could not be parsed (malformed tool call)
  "ToolFailed", // a tool call failed in a way the model can react to
  "EnvFailed", // the environment crashed or a step failed
  "LeaseFailed", // no environment could be leased (pool closed, lease timeout)
  "RewardFailed", // the reward function failed
  "TemplateFailed", // the chat template or tokenizer failed (e.g. a history rewrite it cannot segment)
  "ChainDefect" // a defect in the chain, after its restarts ran out
])
export type Reason = typeof Reason.Type

/**
 * What to do about a reason.
 *
 * @category models
 * @since 0.1.0
 */
export const Policy = Schema.Literals(["retry", "feedback", "zero_reward", "mask", "drop_group", "abort_run"])
export type Policy = typeof Policy.Type

/**
 * A failure inside a rollout, with the reason that selects its policy.
 *
 * @category errors
 * @since 0.1.0
 */
export class RolloutError extends Schema.TaggedError<RolloutError>()("RolloutError", {
  reason: Reason,
  message: Schema.String,
  chainId: Schema.optionalKey(Schema.String)
}) {
  get isRetryable(): boolean {
    return this.reason === "SamplerTransient" || this.reason === "LeaseFailed" || this.reason === "EnvFailed"
  }
}

/**
 * The default policy of each reason.
 *
 * **Details**
 *
 * Transient sampler failures and lease failures are retried; a broken tool call or a failing tool is shown to
 * the model; a failing reward scores 0 (the trajectory is still a valid sample of the policy); a crashed
 * environment, a refused request, a template failure or a defect masks the trajectory; a backend that cannot
 * serve token ids aborts the run, since no chain can produce trainable data with it.
 *
 * @category constructors
 * @since 0.1.0
 */
export const defaultPolicies: { readonly [R in Reason]: Policy } = {
  SamplerTransient: "retry",
  SamplerRejected: "mask",
  SamplerUnusable: "abort_run",
  ParseFailed: "feedback",
  ToolFailed: "feedback",
  EnvFailed: "mask",
  LeaseFailed: "retry",
  RewardFailed: "zero_reward",
  TemplateFailed: "mask",
  ChainDefect: "mask"
}

/**
 * Per-reason overrides of `defaultPolicies`. `afterRetry` is the policy applied when a `retry` reason runs out of
 * retries (default `mask`).
 *
 * @category models
 * @since 0.1.0
 */
export interface Policies {
  readonly overrides?: { readonly [R in Reason]?: Policy } | undefined
  readonly afterRetry?: Exclude<Policy, "retry"> | undefined
}

/**
 * The policy for a reason under the given overrides.
 *
 * **Gotchas**
 *
 * `feedback` only makes sense for failures that happen between sampling and the next observation (parsing, tools);
 * for other reasons the chain treats `feedback` as `mask`, since there is nothing the model could read.
 *
 * @category constructors
 * @since 0.1.0
 */
export const policyFor = (reason: Reason, policies?: Policies): Policy =>
  policies?.overrides?.[reason] ?? defaultPolicies[reason]

/**
 * The policy applied once retries of a `retry` reason are exhausted.
 *
 * @category constructors
 * @since 0.1.0
 */
export const afterRetry = (policies?: Policies): Exclude<Policy, "retry"> => policies?.afterRetry ?? "mask"

/**
 * Whether a reason's `feedback` policy can be honoured (the model can observe the error as a tool message).
 *
 * @category guards
 * @since 0.1.0
 */
export const canFeedBack = (reason: Reason): boolean =>
  reason === "ParseFailed" || reason === "ToolFailed" || reason === "EnvFailed"

/**
 * Maps a sampler failure to its rollout reason.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromSamplerError = (error: SamplerError, chainId?: string): RolloutError =>
  new RolloutError({
    reason: error.isRetryable
      ? "SamplerTransient"
      : error.reason._tag === "BadRequest"
      ? "SamplerRejected"
      : "SamplerUnusable",
    message: `sampler ${error.reason._tag}: ${error.message}`,
    ...(chainId === undefined ? {} : { chainId })
  })

