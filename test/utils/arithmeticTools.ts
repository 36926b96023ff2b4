/** Two small tools shared by rollout tests: `add` (returns a number) and the terminal `answer`. */
import { Effect, Schema } from "effect"
import * as Tool from "../../src/Tool.ts"

export const Add = Tool.make("add", {
  description: "Add two numbers",
  parameters: Schema.Struct({ a: Schema.Number, b: Schema.Number }),
  success: Schema.Number,
  handler: ({ a, b }) => Effect.succeed(a + b)
})

export const Answer = Tool.make("answer", {
  description: "Give the final answer",
  parameters: Schema.Struct({ value: Schema.Number }),
  terminal: true,
  handler: ({ value }) => Effect.succeed(String(value))
})
