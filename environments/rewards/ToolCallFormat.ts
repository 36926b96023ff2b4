/**
 * The `toolCallFormat` reward: the share of the assistant's tool-calling turns whose calls parsed and validated.
 *
 * Read from the trajectory's message view:
 * - a **tool turn** is an assistant message that has `tool_calls`, or whose text still contains an unparsed
 *   tool-call marker (`<tool_call>` by default: the parser could not extract the call, so the chain appended the
 *   raw text);
 * - a tool turn is **well formed** when it has at least one call and no tool message answering its calls is a
 *   format error — bad arguments or an unknown tool, recognised by `Tool.formatErrorOf` on an `is_error`
 *   observation. Failures at run time (timeouts, handler errors) are not format errors.
 *
 * Reward: well-formed tool turns / tool turns, or 0 when the trajectory has no tool turn (so that not calling
 * tools is never rewarded as well-formatted). Metrics: `turns`, `tool_turns`, `well_formed`, `format_errors`.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import { Message, Reward, Tool, Trajectory } from "../../src/index.ts"

/**
 * Counts the tool turns of a trajectory and how many are well formed.
 *
 * @category getters
 * @since 0.1.0
 */
export const countTurns = (trajectory: Trajectory.Trajectory, marker = "<tool_call>") => {
  const formatErrors = new Set<string>()
  let formatErrorCount = 0
  for (const m of trajectory.messages) {
    if (m.role === "tool" && m.is_error === true && Tool.formatErrorOf(Message.text(m.content)) !== undefined) {
      formatErrors.add(m.tool_call_id)
      formatErrorCount++
    }
  }
  let turns = 0
  let toolTurns = 0
  let wellFormed = 0
  for (const m of trajectory.messages) {
    if (m.role !== "assistant") continue
    turns++
    const calls = m.tool_calls ?? []
    if (calls.length === 0 && !Message.text(m.content).includes(marker)) continue
    toolTurns++
    if (calls.length > 0 && calls.every((c) => !formatErrors.has(c.id))) wellFormed++
  }
  return { turns, toolTurns, wellFormed, formatErrors: formatErrorCount }
}

/**
 * Makes the reward with another unparsed-call marker (e.g. `<function=` for XML-style templates).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (marker: string) =>
  Reward.make("toolCallFormat", {
    score: ({ trajectory }) =>
      Effect.sync(() => {
        const c = countTurns(trajectory, marker)
        return {
          reward: c.toolTurns === 0 ? 0 : c.wellFormed / c.toolTurns,
          metrics: { turns: c.turns, tool_turns: c.toolTurns, well_formed: c.wellFormed, format_errors: c.formatErrors }
        }
      })
  })

/**
 * The `toolCallFormat` reward for `<tool_call>` (Hermes / Qwen) templates.
 *
 * @category rewards
 * @since 0.1.0
 */
export const toolCallFormat = make("<tool_call>")
