/**
 * Context policies: what a rollout chain does when its conversation nears the context budget, instead of ending at
 * `agent.maxContextTokens` (AgentFly's context folding, `reference/agentfly.md` §2.6).
 *
 * Before a turn, when the open segment holds at least `at × maxContextTokens` tokens, the chain folds:
 * - `drop`: the oldest turns go; the prompt (the conversation's first messages) and the last `keepTurns` turns stay;
 * - `fold`: the policy is asked to summarise (`instruction`, a user message) and writes the summary in a turn of its
 *   own (a **folding turn**, sampled and trained like any other); the new context is the prompt, the summary and the
 *   last `keepTurns` turns;
 * - `tool`: the summary comes from the task's tool `tool` (called with the folded conversation's text as its
 *   `toolArgument`, when one is named); nothing is sampled.
 *
 * Each fold closes the open segment and starts a new one from a fresh render of the new context, all of it prompt
 * (mask 0): the turns kept and the summary were trained in the segment where the policy wrote them and are not
 * trained again; a folding turn is trained in the segment it closes.
 *
 * **Segment rewards.** A trajectory's reward is split over its segments as AgentFly's `REWARD_DECOMPOSITION` does
 * (`segmentReward`): `last` (default: the whole reward on the last segment, as without folding), `broadcast` (the
 * reward on every segment), `uniform` (`reward / n` each), `geometric` (segment `k` of `n` gets
 * `γ^(n−1−k) · reward`). The learner puts each segment's reward on that segment's last policy token; the
 * estimator decides what it means (see `docs/context-folding.md`).
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import * as Message from "./Message.ts"
import type * as Trajectory from "./Trajectory.ts"

// ===== Models =====

/**
 * What to do when the context nears its budget.
 *
 * @category models
 * @since 0.1.0
 */
export const Kind = Schema.Literals(["none", "drop", "fold", "tool"])
export type Kind = typeof Kind.Type

/**
 * How a trajectory's reward is split over its segments (AgentFly's `REWARD_DECOMPOSITION`).
 *
 * @category models
 * @since 0.1.0
 */
export const SegmentReward = Schema.Literals(["last", "broadcast", "uniform", "geometric"])
export type SegmentReward = typeof SegmentReward.Type

/**
 * The default instruction of a folding turn.
 *
 * @category constants
 * @since 0.1.0
 */
export const defaultInstruction =
  "Your context is almost full. Summarise what you have learned and done so far, and what is left to do, " +
  "in a few lines. The earlier turns will be replaced by your summary."

/**
 * The prefix of the user message that carries a summary into the new context.
 *
 * @category constants
 * @since 0.1.0
 */
export const summaryPrefix = "[Summary of earlier turns]: "

const withDefault = <S extends Schema.Top>(schema: S, value: S["Encoded"]) =>
  schema.pipe(Schema.withDecodingDefaultKey<S, never>(Effect.succeed(value)))

const Fields = Schema.Struct({
  /** What to do when the context nears its budget (default `none`: the chain ends at the budget, as before). */
  policy: withDefault(Kind, "none"),
  /** The share of `maxContextTokens` at which the context folds, in (0, 1]. */
  at: withDefault(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1, exclusiveMinimum: true })), 0.75),
  /** The last turns kept verbatim after a fold (a turn: an assistant message and the observations after it). */
  keepTurns: withDefault(Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 1_000 })), 1),
  /** `fold`: the user message that asks the policy for its summary. */
  instruction: withDefault(Schema.String.check(Schema.isMinLength(1)), defaultInstruction),
  /** `fold`: the most tokens of the folding turn. */
  summaryTokens: withDefault(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 1_048_576 })), 64),
  /** `tool`: the name of the task's tool that writes the summary. */
  tool: Schema.optionalKey(Schema.String.check(Schema.isMinLength(1))),
  /** `tool`: the tool's parameter that receives the folded conversation's text (none: called without arguments). */
  toolArgument: Schema.optionalKey(Schema.String.check(Schema.isMinLength(1))),
  /** How a trajectory's reward is split over its segments. */
  segmentReward: withDefault(SegmentReward, "last"),
  /** `geometric`: the discount per segment from the last, in [0, 1]. */
  gamma: withDefault(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1 })), 0.9),
  /** The most folds of one chain (then it ends at the budget as without a policy). */
  maxFolds: withDefault(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 10_000 })), 100)
})

/**
 * A context policy, as `agent.context` of a run's config or a task's `defaults.context` writes it; every key but
 * `policy` has a default (`{ "policy": "drop" }` is a whole policy). `tool` is required with `policy: "tool"`.
 *
 * @category models
 * @since 0.1.0
 */
export const ContextPolicy = Fields.check(
  Schema.makeFilter((p) =>
    p.policy !== "tool" || p.tool !== undefined ||
    `context.policy "tool" needs context.tool: the name of the task's tool that writes the summary`
  )
)
export type ContextPolicy = typeof ContextPolicy.Type
export type Encoded = typeof ContextPolicy.Encoded

/**
 * A policy from its encoded form, defaults filled in; throws on a bad one (for code and tests: configs decode
 * `ContextPolicy` and report the issue).
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeUnsafe = (encoded: Encoded): ContextPolicy => Schema.decodeUnknownSync(ContextPolicy)(encoded)

// ===== Folding =====

/**
 * Whether the context folds before the next turn: a policy other than `none`, a budget, and an open segment of at
 * least `at × budget` tokens.
 *
 * @category predicates
 * @since 0.1.0
 */
export const due = (policy: ContextPolicy, tokens: number, budget: number | undefined): boolean =>
  policy.policy !== "none" && budget !== undefined && tokens >= policy.at * budget

/**
 * The start of the last `keep` turns of `messages` after the first `head` (a turn starts at an assistant message);
 * `messages.length` when `keep` is 0 or no turn follows the head.
 *
 * @category getters
 * @since 0.1.0
 */
export const keptFrom = (messages: ReadonlyArray<Message.Message>, head: number, keep: number): number => {
  let from = messages.length
  let kept = 0
  for (let i = messages.length - 1; i >= head && kept < keep; i--) {
    if (messages[i]!.role === "assistant") {
      from = i
      kept++
    }
  }
  return from
}

/**
 * The context after a fold: the first `head` messages (the prompt), the summary as a user message when there is
 * one, then the last `keepTurns` turns. `messages` is the conversation as the template renders it; a summary of an
 * earlier fold (right after the head) is replaced, not kept.
 *
 * @category combinators
 * @since 0.1.0
 */
export const folded = (
  messages: ReadonlyArray<Message.Message>,
  head: number,
  keepTurns: number,
  summary: string | undefined
): Array<Message.Message> => {
  const kept = messages.slice(keptFrom(messages, head, keepTurns))
  const summaryMessage: Array<Message.Message> = summary === undefined
    ? []
    : [{ role: "user", content: summaryPrefix + summary.trim() }]
  return [...messages.slice(0, head), ...summaryMessage, ...kept]
}

/**
 * The text of the turns a fold removes (after the head, before the kept turns), one message a line as
 * `role: text`: what a summarising tool reads.
 *
 * @category getters
 * @since 0.1.0
 */
export const foldedText = (messages: ReadonlyArray<Message.Message>, head: number, keepTurns: number): string =>
  messages.slice(head, keptFrom(messages, head, keepTurns)).map((m) => `${m.role}: ${Message.text(m.content)}`)
    .join("\n")

// ===== Segment rewards =====

/**
 * A trajectory's reward split over `n` segments as `mode` says (AgentFly's `decompose_trajectory_reward`).
 *
 * @category combinators
 * @since 0.1.0
 */
export const decompose = (reward: number, n: number, mode: SegmentReward, gamma: number): Array<number> =>
  Array.from({ length: n }, (_, k) => {
    switch (mode) {
      case "last":
        return k === n - 1 ? reward : 0
      case "broadcast":
        return reward
      case "uniform":
        return reward / n
      case "geometric":
        return gamma ** (n - 1 - k) * reward
    }
  })

/**
 * The trajectory with its reward split over its segments (`Segment.reward`), as the policy's `segmentReward` says.
 * A trajectory without segments is returned as it is.
 *
 * @category combinators
 * @since 0.1.0
 */
export const withSegmentRewards = (
  trajectory: Trajectory.Trajectory,
  policy: Pick<ContextPolicy, "segmentReward" | "gamma">
): Trajectory.Trajectory => {
  const n = trajectory.segments.length
  if (n === 0) return trajectory
  const rewards = decompose(trajectory.reward, n, policy.segmentReward, policy.gamma)
  return { ...trajectory, segments: trajectory.segments.map((segment, k) => ({ ...segment, reward: rewards[k]! })) }
}
