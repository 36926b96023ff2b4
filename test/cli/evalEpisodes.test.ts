/**
 * `agentfly eval --episodes N`: a last turn cut inside a tool call is printed as what happened, not as an empty
 * `assistant:` line (the chain drops the unreadable block from the message view).
 */
import { assert, describe, it } from "@effect/vitest"
import * as Eval from "../../cli/eval.ts"
import type * as Trajectory from "../../src/Trajectory.ts"

const cutEpisode = (error: string | undefined): Trajectory.Trajectory => ({
  trajectoryId: "t",
  groupId: "g",
  chainId: "c",
  messages: [
    { role: "user", content: "What is 6*7?" },
    {
      role: "assistant",
      content: "",
      tool_calls: [{ id: "a", type: "function", function: { name: "calculator", arguments: { expression: "6*7" } } }]
    },
    { role: "tool", content: "42", tool_call_id: "a" },
    { role: "assistant", content: "" }
  ],
  segments: [],
  termination: "stop",
  reward: 0,
  rewardStatus: "scored",
  metrics: {},
  trainable: true,
  masked: false,
  ...(error === undefined ? {} : { errorReason: "ParseFailed", error })
})

describe("agentfly eval --episodes", () => {
  it("a last turn cut inside a tool call is said, not printed as an empty assistant line", () => {
    const printed = Eval.episodeOf(0, cutEpisode(
      "ParseFailed: the turn was cut by max tokens inside a tool call: <tool_call> is never closed with </tool_call>"
    ))
    const lines = printed.trimEnd().split("\n")
    assert.strictEqual(lines.at(-1), "assistant: [cut by max tokens inside a tool call]")
    assert.strictEqual(lines.at(-2), "tool: 42")
    const budget = Eval.episodeOf(
      0,
      cutEpisode("ParseFailed: the turn was cut by the context budget inside a tool call")
    )
    assert.strictEqual(budget.trimEnd().split("\n").at(-1), "assistant: [cut by the context budget inside a tool call]")
  })

  it("an empty last turn of a chain that ended otherwise is printed as it is", () => {
    assert.strictEqual(Eval.episodeOf(0, cutEpisode(undefined)).trimEnd().split("\n").at(-1), "assistant:")
  })
})
