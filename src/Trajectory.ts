/**
 * The token-level trajectory: the unit that flows from rollout chains to the learner.
 *
 * A trajectory is one or more segments; each segment is one training sequence made of ordered spans. Every span
 * records where its tokens came from (`source`). Policy spans hold the exact ids the policy sampled, with their
 * logprobs and the policy version that produced them. The loss mask is provenance: 1 exactly where
 * `source === "policy"` (design principle 2). A trajectory has several segments only when a chat template
 * rewrote history (e.g. Qwen3 drops earlier `<think>` blocks), so that no sequence silently drifts from what the
 * policy saw, or when a context policy folded the conversation (`src/ContextPolicy.ts`): each fold starts a new
 * segment, and a segment may carry a reward of its own (`Segment.reward`).
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import { ImageRef } from "./Image.ts"
import { Message, text } from "./Message.ts"

/**
 * Where a span's tokens came from.
 * - `prompt`: the rendered prompt (system, user turns, tool list).
 * - `policy`: sampled by the policy; the only trainable source.
 * - `tool`: a tool observation, rendered by the template.
 * - `env`: an environment message (e.g. a user turn injected by an environment).
 * - `template`: scaffolding the template adds between turns (role headers, separators).
 *
 * @category models
 * @since 0.1.0
 */
export const Source = Schema.Literals(["prompt", "policy", "tool", "env", "template"])
export type Source = typeof Source.Type

/**
 * A run of tokens from one source. `logprobs` and `policyVersion` are present on policy spans only, with one
 * logprob per token. `image` marks an image span: its tokens are the image's placeholder tokens (one
 * `<|image_pad|>` per merged patch), whose embeddings the vision tower supplies; its source is the message's
 * (`prompt`, `tool`, `env`), so it is never trained on. The pixels are in the message view's image part of the same
 * hash, and beside a run's samples in `images/<sha256>.png` (`Image.sidecarPath`).
 *
 * @category models
 * @since 0.1.0
 */
export const Span = Schema.Struct({
  source: Source,
  tokenIds: Schema.Array(Schema.Int),
  logprobs: Schema.optionalKey(Schema.Array(Schema.Number)),
  policyVersion: Schema.optionalKey(Schema.Int),
  image: Schema.optionalKey(ImageRef)
})
export type Span = typeof Span.Type

/**
 * One training sequence: ordered spans. `messageCount` is how many messages of the trajectory's message view the
 * segment covers. `reward`, when set, is this segment's share of the trajectory's reward (a folded trajectory's
 * segment rewards, `ContextPolicy.withSegmentRewards`): the learner puts it on the segment's last policy token.
 *
 * @category models
 * @since 0.1.0
 */
export const Segment = Schema.Struct({
  spans: Schema.Array(Span),
  messageCount: Schema.Int,
  reward: Schema.optionalKey(Schema.Number)
})
export type Segment = typeof Segment.Type

/**
 * Why a chain ended.
 *
 * @category models
 * @since 0.1.0
 */
export const Termination = Schema.Literals([
  "answer", // a terminal tool (e.g. `answer`) ran
  "no_tool_call", // the assistant replied without calling a tool
  "max_turns",
  "context_length", // the token budget of the context ran out
  "stop", // the sampler stopped on max tokens / a stop token without a parseable turn end
  "error", // an error whose policy ends the chain
  "episode_end", // the environment ended the episode (`episodeEnd` says why: solved, failed, ...)
  "interrupted"
])
export type Termination = typeof Termination.Type

/**
 * How the reward of a trajectory came about. `not_applicable` and `failed` trajectories are excluded from their
 * group's baseline.
 *
 * @category models
 * @since 0.1.0
 */
export const RewardStatus = Schema.Literals(["scored", "not_applicable", "failed", "pending"])
export type RewardStatus = typeof RewardStatus.Type

/**
 * A finished (or in-progress) trajectory.
 *
 * - `trainable` is false for trajectories whose tokens were not sampled by a policy we control (e.g. a black-box
 *   chat-completions API): they are usable for evaluation and SFT data, never for policy-gradient losses.
 * - `masked` is true when an error policy decided the trajectory must not contribute to the loss.
 *
 * @category models
 * @since 0.1.0
 */
export const Trajectory = Schema.Struct({
  trajectoryId: Schema.String,
  groupId: Schema.String,
  chainId: Schema.String,
  messages: Schema.Array(Message),
  segments: Schema.Array(Segment),
  termination: Termination,
  reward: Schema.Number,
  rewardStatus: RewardStatus,
  metrics: Schema.Record(Schema.String, Schema.Number),
  trainable: Schema.Boolean,
  masked: Schema.Boolean,
  /** The dataset row's extra fields, passed through to rewards. */
  row: Schema.optionalKey(Schema.Record(Schema.String, Schema.Unknown)),
  /** A short description of the error that ended the chain (`termination === "error"`) or failed its reward. */
  error: Schema.optionalKey(Schema.String),
  /** The `RolloutError` reason behind `error` (`EnvFailed`, `RewardFailed`, ...), for per-reason counts. */
  errorReason: Schema.optionalKey(Schema.String),
  /** Why the environment ended the episode, when `termination === "episode_end"`. */
  episodeEnd: Schema.optionalKey(Schema.String)
})
export type Trajectory = typeof Trajectory.Type

/**
 * A group: the `numChains` trajectories sampled for one dataset row (the unit of GRPO).
 *
 * @category models
 * @since 0.1.0
 */
export const Group = Schema.Struct({
  groupId: Schema.String,
  rowIndex: Schema.Int,
  trajectories: Schema.Array(Trajectory)
})
export type Group = typeof Group.Type

// ===== Derived views =====

/**
 * Total number of tokens of a segment.
 *
 * @category getters
 * @since 0.1.0
 */
export const segmentLength = (segment: Segment): number =>
  segment.spans.reduce((n, span) => n + span.tokenIds.length, 0)

/**
 * The segment cut to its first `maxTokens` tokens (the same segment when it is no longer). A chain's context budget
 * caps what the policy samples, but a tool's output can still run past it; those trailing observation tokens are
 * cut so that no training sequence is longer than the context (and the model's positions) allow.
 *
 * @category combinators
 * @since 0.1.0
 */
export const clipSegment = (segment: Segment, maxTokens: number): Segment => {
  if (segmentLength(segment) <= maxTokens) return segment
  const spans: Array<Span> = []
  let left = maxTokens
  for (const span of segment.spans) {
    if (left <= 0) break
    if (span.tokenIds.length <= left) spans.push(span)
    else {
      spans.push({
        ...span,
        tokenIds: span.tokenIds.slice(0, left),
        ...(span.logprobs === undefined ? {} : { logprobs: span.logprobs.slice(0, left) })
      })
    }
    left -= span.tokenIds.length
  }
  return { ...segment, spans }
}

/**
 * Whether any segment of the trajectory carries a reward of its own.
 *
 * @category predicates
 * @since 0.1.0
 */
export const hasSegmentRewards = (trajectory: Trajectory): boolean =>
  trajectory.segments.some((segment) => segment.reward !== undefined)

/**
 * Writes a trajectory's segment rewards into `out` (the token rewards of its segments concatenated, from `offset`):
 * each segment's reward is added on its last policy token. A segment without a policy token (a fold right after a
 * fold) adds its reward to the last policy token before it, or, when none came before, to the next one; a segment
 * without a reward adds nothing. Returns `out`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const placeSegmentRewards = (trajectory: Trajectory, out: Float64Array, offset = 0): Float64Array => {
  let start = offset
  let lastPolicy = -1
  let carried = 0
  for (const segment of trajectory.segments) {
    const mask = lossMask(segment)
    const last = mask.lastIndexOf(1)
    if (last >= 0) lastPolicy = start + last
    const reward = (segment.reward ?? 0) + (last >= 0 ? carried : 0)
    if (last >= 0) carried = 0
    if (lastPolicy >= 0) out[lastPolicy] = out[lastPolicy]! + reward
    else carried += reward
    start += mask.length
  }
  return out
}

/**
 * All token ids of a segment, in order.
 *
 * @category getters
 * @since 0.1.0
 */
export const tokenIds = (segment: Segment): Int32Array => {
  const out = new Int32Array(segmentLength(segment))
  let offset = 0
  for (const span of segment.spans) {
    out.set(span.tokenIds, offset)
    offset += span.tokenIds.length
  }
  return out
}

/**
 * The loss mask of a segment: 1 exactly on tokens the policy sampled, 0 elsewhere.
 *
 * @category getters
 * @since 0.1.0
 */
export const lossMask = (segment: Segment): Uint8Array => {
  const out = new Uint8Array(segmentLength(segment))
  let offset = 0
  for (const span of segment.spans) {
    if (span.source === "policy") out.fill(1, offset, offset + span.tokenIds.length)
    offset += span.tokenIds.length
  }
  return out
}

/**
 * Per-token sampler logprobs aligned with `tokenIds`; `NaN` where the token was not sampled by the policy.
 *
 * @category getters
 * @since 0.1.0
 */
export const logprobs = (segment: Segment): Float32Array => {
  const out = new Float32Array(segmentLength(segment)).fill(Number.NaN)
  let offset = 0
  for (const span of segment.spans) {
    if (span.source === "policy" && span.logprobs !== undefined) out.set(span.logprobs, offset)
    offset += span.tokenIds.length
  }
  return out
}

/**
 * Per-token source labels aligned with `tokenIds`.
 *
 * @category getters
 * @since 0.1.0
 */
export const sources = (segment: Segment): ReadonlyArray<Source> =>
  segment.spans.flatMap((span) => span.tokenIds.map(() => span.source))

/**
 * Number of tokens the policy generated across all segments.
 *
 * @category getters
 * @since 0.1.0
 */
export const policyTokenCount = (trajectory: Trajectory): number =>
  trajectory.segments.reduce(
    (n, segment) => n + segment.spans.reduce((m, s) => m + (s.source === "policy" ? s.tokenIds.length : 0), 0),
    0
  )

/**
 * The oldest policy version that sampled any token of the trajectory (for staleness checks); undefined when the
 * trajectory has no policy tokens.
 *
 * @category getters
 * @since 0.1.0
 */
export const oldestPolicyVersion = (trajectory: Trajectory): number | undefined => {
  let oldest: number | undefined
  for (const segment of trajectory.segments) {
    for (const span of segment.spans) {
      if (span.policyVersion !== undefined && (oldest === undefined || span.policyVersion < oldest)) {
        oldest = span.policyVersion
      }
    }
  }
  return oldest
}

/**
 * The text of the last assistant message, or "" when there is none.
 *
 * @category getters
 * @since 0.1.0
 */
export const lastAssistantText = (trajectory: Trajectory): string => {
  for (let i = trajectory.messages.length - 1; i >= 0; i--) {
    const message = trajectory.messages[i]!
    if (message.role === "assistant") {
      return text(message.content)
    }
  }
  return ""
}

/**
 * The final response as AgentFly defines it: the text of the last assistant **or tool** message (after an
 * `answer` tool call, the final response is that tool's observation).
 *
 * @category getters
 * @since 0.1.0
 */
export const finalResponse = (trajectory: Trajectory): string => {
  for (let i = trajectory.messages.length - 1; i >= 0; i--) {
    const message = trajectory.messages[i]!
    if (message.role === "assistant" || message.role === "tool") {
      return text(message.content)
    }
  }
  return ""
}

/**
 * Number of assistant turns.
 *
 * @category getters
 * @since 0.1.0
 */
export const turnCount = (trajectory: Trajectory): number =>
  trajectory.messages.reduce((n, m) => n + (m.role === "assistant" ? 1 : 0), 0)

/**
 * A reward's accuracy metric: `accuracy` or `acc`, bare or in a reward's namespace (`reward/mathEqual/acc`).
 *
 * @category getters
 * @since 0.1.0
 */
export const accuracyMetric = (metrics: Trajectory["metrics"]): number | undefined =>
  metrics["accuracy"] ?? metrics["acc"] ??
    Object.entries(metrics).find(([key]) => key.endsWith("/accuracy") || key.endsWith("/acc"))?.[1]

/**
 * Whether a trajectory solved its task, as a run's accuracy counts it when the task sets no `correct`: its reward's
 * accuracy metric is 1 ({@link accuracyMetric}), or, without one, its reward is at least 1. A partial-credit reward
 * (a hint's penalty, a format term) still counts a solved task through its `acc` metric.
 *
 * @category getters
 * @since 0.1.0
 */
export const isCorrect = (trajectory: Trajectory): boolean => {
  const metric = accuracyMetric(trajectory.metrics)
  return metric !== undefined ? metric >= 1 : trajectory.reward >= 1
}

/**
 * Whether a group's scored, trainable trajectories have different rewards: the only source of a learning signal
 * under a group-relative estimator (GRPO, Dr.GRPO, RLOO), whose advantages are rewards relative to the group's.
 *
 * @category getters
 * @since 0.1.0
 */
export const rewardsDiffer = (group: Group): boolean => {
  const rewards = group.trajectories.filter((t) => t.trainable && !t.masked && t.rewardStatus === "scored")
    .map((t) => t.reward)
  return rewards.some((r) => r !== rewards[0])
}
