/**
 * Trajectory fixtures for reward and tool tests: a message view with no token segments.
 */
import type { Message, Trajectory } from "../../src/index.ts"

let nextId = 0

export const trajectoryOf = (
  messages: ReadonlyArray<Message.Message>,
  row?: Record<string, unknown>
): Trajectory.Trajectory => ({
  trajectoryId: `t${nextId}`,
  groupId: "g",
  chainId: `c${nextId++}`,
  messages,
  segments: [],
  termination: "no_tool_call",
  reward: 0,
  rewardStatus: "pending",
  metrics: {},
  trainable: true,
  masked: false,
  ...(row === undefined ? {} : { row })
})

/** A one-turn conversation whose final assistant text is `response`. */
export const answered = (response: string, row?: Record<string, unknown>): Trajectory.Trajectory =>
  trajectoryOf([
    { role: "user", content: "question" },
    { role: "assistant", content: response }
  ], row)
