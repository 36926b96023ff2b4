/**
 * `agentfly eval --demos FILE`: a teacher's sampled episodes as demonstrations for an SFT warm-up. Right and wrong
 * answers are both written (SFT on the teacher's samples, not on its correct ones); episodes that ended with an error
 * and those the warm-up would refuse are not; each row is the episode's messages as they were.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Eval from "../../cli/eval.ts"
import { task } from "../../examples/guess/task.ts"
import type * as Message from "../../src/Message.ts"
import type * as Trajectory from "../../src/Trajectory.ts"

const toolName = task.tools[0]!.name

const episode = (
  id: string,
  args: unknown,
  options: { readonly reward?: number; readonly name?: string; readonly error?: string } = {}
): Trajectory.Trajectory => ({
  trajectoryId: id,
  groupId: "g",
  chainId: id,
  messages: [
    { role: "user", content: "Find my number from 1 to 15." },
    {
      role: "assistant",
      content: "",
      tool_calls: [{ id: "c", type: "function", function: { name: options.name ?? toolName, arguments: args } }]
    },
    { role: "tool", content: "higher", tool_call_id: "c" },
    { role: "assistant", content: `Your number is ${id}.` }
  ] as ReadonlyArray<Message.Message>,
  segments: [],
  termination: options.error === undefined ? "stop" : "error",
  reward: options.reward ?? 1,
  rewardStatus: "scored",
  metrics: {},
  trainable: true,
  masked: false,
  ...(options.error === undefined ? {} : { errorReason: "ParseFailed", error: options.error })
})

describe("agentfly eval --demos", () => {
  it("writes right and wrong episodes as they were; not those that failed or that a warm-up would refuse", () => {
    const right = episode("8", { n: 8 }), wrong = episode("3", { n: 3 }, { reward: 0 })
    const written = Eval.demonstrationRows(task, [
      right,
      episode("cut", { n: 4 }, { error: "ParseFailed: the turn was cut by max tokens inside a tool call" }),
      episode("unknown", { n: 4 }, { name: "search_web" }),
      episode("typo", { guesss: 4 }),
      wrong
    ])
    assert.isTrue(written.endsWith("\n"))
    const rows = written.trimEnd().split("\n").map((line) => JSON.parse(line))
    assert.deepStrictEqual(rows, [{ messages: right.messages }, { messages: wrong.messages }])
    assert.strictEqual(Eval.demonstrationRows(task, []), "")
  })
})
