/**
 * The `toolCallFormat` reward: the share of the assistant's tool-calling turns whose calls parsed and validated.
 *
 * Read from the trajectory's message view:
 * - the tool messages after an assistant message (up to the next one) belong to that turn;
 * - a **tool turn** is an assistant turn that attempted a call: it has `tool_calls`, or its text still contains an
 *   unparsed tool-call marker (`<tool_call>` by default), or an error observation follows it that answers none of
 *   its calls (how the rollout chain reports that the parser could not extract a call), or it is the last turn
 *   of a trajectory that ended `ParseFailed` (a turn cut by max tokens or the context budget inside a call);
 * - a **format error** is an `is_error` observation of the turn that is either a format error of the tool actor
 *   (bad arguments or an unknown tool, recognised by `Tool.formatErrorOf`) or such parser feedback. Failures at
 *   run time (timeouts, handler errors) are not format errors; the cut last turn of a `ParseFailed` ending is one;
 * - a tool turn is **well formed** when it has at least one call and no format error.
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
  let turns = 0
  let toolTurns = 0
  let wellFormed = 0
  let formatErrors = 0
  // The assistant turn being read: its call ids, whether it attempted a call, whether something was malformed.
  let current: { ids: Set<string>; attempted: boolean; malformed: boolean } | undefined
  const close = () => {
    if (current === undefined || !current.attempted) return
    toolTurns++
    if (!current.malformed && current.ids.size > 0) wellFormed++
  }
  for (const m of trajectory.messages) {
    if (m.role === "assistant") {
      close()
      turns++
      const calls = m.tool_calls ?? []
      current = {
        ids: new Set(calls.map((c) => c.id)),
        attempted: calls.length > 0 || Message.text(m.content).includes(marker),
        malformed: false
      }
    } else if (m.role === "tool" && m.is_error === true && current !== undefined) {
      // A format error answering one of the turn's calls, or error feedback answering none of them (the chain's
      // report that the parser could not extract a call).
      if (Tool.formatErrorOf(Message.text(m.content)) !== undefined || !current.ids.has(m.tool_call_id)) {
        formatErrors++
        current.attempted = true
        current.malformed = true
      }
    }
  }
  // A chain that ended on a call it could not parse (a turn cut by max tokens inside `<tool_call>`): its last turn
  // lost the unreadable block from the message view and nothing answered it, yet it was a failed call.
  const last = trajectory.messages.at(-1)
  if (trajectory.errorReason === "ParseFailed" && last?.role === "assistant" && current !== undefined) {
    formatErrors++
    current.attempted = true
    current.malformed = true
  }
  close()
  return { turns, toolTurns, wellFormed, formatErrors }
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
 * @category constructors
 * @since 0.1.0
 */
export const toolCallFormat = make("<tool_call>")

/**
 * `reward`, or with weight `w > 0` the sum `reward + w·toolCallFormat` named `<name> + <w>·toolCallFormat`: the
 * format term a task's `toolCallFormat` option adds (a signal for well-formed calls while every answer is wrong).
 *
 * @category combinators
 * @since 0.1.0
 */
export const withFormat = <R>(reward: Reward.Reward<R>, w: number, name: string = reward.name): Reward.Reward<R> =>
  w === 0 ? reward : Reward.combine(`${name} + ${w}·toolCallFormat`, [
    { reward, weight: 1 },
    { reward: toolCallFormat, weight: w }
  ])
