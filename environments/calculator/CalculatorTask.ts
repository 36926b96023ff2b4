/**
 * The calculator task: arithmetic word problems (`question`, with the exact integer `answer`) that the policy
 * solves by calling the `calculator` tool; scored by `mathEqual`, optionally plus a weighted `toolCallFormat` term
 * (the task's one option: `{ "name": "calculator", "options": { "toolCallFormat": 0.2 } }`).
 *
 * The data comes from `examples/calculator/generate.ts` (seeded train, held-out, validation and demonstration
 * splits).
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import * as MathEqual from "../math/MathEqual.ts"
import * as ToolCallFormat from "../rewards/ToolCallFormat.ts"
import * as Calculator from "./Calculator.ts"

/**
 * The task's options: the weight of the tool-call format term (0: none).
 *
 * @category models
 * @since 0.1.0
 */
export const Options = Schema.Struct({
  toolCallFormat: Schema.optionalKey(Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)))
})

/**
 * The reward of a format weight: `mathEqual`, or `1·mathEqual + w·toolCallFormat`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const reward = (formatWeight: number): Reward.Reward<never> =>
  ToolCallFormat.withFormat(MathEqual.mathEqual, formatWeight, "1·mathEqual")

/**
 * The calculator task with a format weight.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (options: typeof Options.Type = {}): Task.Task =>
  Task.make("calculator", {
    description: "Arithmetic word problems solved with the calculator tool",
    row: Schema.Struct({ answer: Schema.String }),
    tools: [Calculator.calculator],
    reward: reward(options.toolCallFormat ?? 0),
    defaults: { systemPrompt: "Use the calculator tool.", maxTurns: 2 }
  })

/**
 * The task as a config names it (`"task": "calculator"`, with optional options).
 *
 * @category constructors
 * @since 0.1.0
 */
export const task = Task.withOptions("calculator", Options, make)
