/**
 * A rollout chain's context folding (`src/ContextPolicy.ts`): when it is due, and the fold itself (a folding turn the
 * policy writes, a summary tool's call, or neither), over what a chain holds. `actors/RolloutChain.ts` calls it
 * before a turn when its config has a context policy.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import type { Context } from "effect"
import type { AssistantTurn, ToolRunner, Transcript } from "../../src/ChainPorts.ts"
import * as ContextPolicy from "../../src/ContextPolicy.ts"
import { text } from "../../src/Message.ts"
import type { Conversation } from "../../src/Message.ts"
import * as RolloutError from "../../src/RolloutError.ts"
import { settle, withPolicy } from "./chainPolicy.ts"
import type { ChainEnded, Ending, Settings } from "./chainPolicy.ts"

/**
 * What folding reads and updates of a chain.
 *
 * @category models
 * @since 0.1.0
 */
export interface FoldingChain {
  readonly spec: { readonly chainId: string }
  readonly config: Settings & { readonly maxContextTokens?: number | undefined; readonly tools: ToolRunner }
  readonly env: Context.Context<never>
  /** How many messages of the prompt every folded context keeps. */
  readonly head: number
  folds: number
}

/**
 * Whether the chain folds now: the open segment is at its share of the budget, the chain has folds left, and a fold
 * would remove something (a format that cannot fold is refused by {@link fold}).
 *
 * @category predicates
 * @since 0.1.0
 */
export const due = (chain: FoldingChain, policy: ContextPolicy.ContextPolicy, transcript: Transcript): boolean => {
  const context = transcript.context
  if (chain.folds >= policy.maxFolds) return false
  if (!ContextPolicy.due(policy, transcript.length(), chain.config.maxContextTokens)) return false
  return context === undefined || ContextPolicy.keptFrom(context(), chain.head, policy.keepTurns) > chain.head
}

/**
 * Folds the context as the policy says: `fold` first asks for a summary (the instruction, a user message of source
 * `env`) and samples the folding turn with `sample` (trained, in the segment it closes; it counts against the
 * context budget, not against `maxTurns`; a turn cut by the budget is still the summary); `tool` calls the summary
 * tool; then the transcript starts a new segment over the folded context. Returns the chain's ending when the
 * budget ran out before the folding turn.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fold = Effect.fnUntraced(function*(
  chain: FoldingChain,
  policy: ContextPolicy.ContextPolicy,
  transcript: Transcript,
  sample: (maxTokens: number) => Effect.Effect<AssistantTurn, RolloutError.RolloutError | ChainEnded>
): Effect.fn.Return<Ending | undefined, RolloutError.RolloutError | ChainEnded> {
  const { config } = chain
  const { context, fold: restart } = transcript
  if (context === undefined || restart === undefined) {
    const message = `this format cannot fold its context (policy ${policy.policy})`
    const error = new RolloutError.RolloutError({ reason: "TemplateFailed", message, chainId: chain.spec.chainId })
    return yield* settle(config, error)
  }
  const before = context()
  let summary: string | undefined
  if (policy.policy === "fold") {
    yield* withPolicy(config, transcript.appendObservations([{ role: "user", content: policy.instruction }]))
    const remaining = config.maxContextTokens! - transcript.length()
    if (remaining <= 0) return { termination: "context_length" }
    const turn = yield* sample(Math.min(policy.summaryTokens, remaining))
    summary = text(turn.message.content)
  } else if (policy.policy === "tool") {
    summary = yield* toolSummary(chain, policy, before)
  }
  const folded = ContextPolicy.folded(before, chain.head, policy.keepTurns, summary)
  yield* withPolicy(config, restart(folded, policy.policy))
  chain.folds++
  return undefined
})

/** The summary tool's observation on the turns a fold removes; a failed call is the tool's failure (`ToolFailed`). */
const toolSummary = Effect.fnUntraced(function*(
  chain: FoldingChain,
  policy: ContextPolicy.ContextPolicy,
  before: Conversation
): Effect.fn.Return<string, RolloutError.RolloutError | ChainEnded> {
  const { config } = chain
  const args = policy.toolArgument === undefined
    ? {}
    : { [policy.toolArgument]: ContextPolicy.foldedText(before, chain.head, policy.keepTurns) }
  const name = policy.tool!
  const call = { id: `fold_${chain.folds}`, type: "function" as const, function: { name, arguments: args } }
  const ran = yield* withPolicy(config, config.tools.executeTurn([call], chain.env))
  const message = ran.messages[0]
  if (message === undefined || (message.role === "tool" && message.is_error === true)) {
    const said = message === undefined ? "no result" : text(message.content)
    return yield* settle(
      config,
      new RolloutError.RolloutError({
        reason: "ToolFailed",
        message: `the summary tool "${name}" failed: ${said}`,
        chainId: chain.spec.chainId
      })
    )
  }
  return text(message.content)
})
