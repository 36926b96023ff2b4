/**
 * What the SDK examples share: the calculator they call (the project's exact evaluator), the row Schema and
 * reward of the calculator questions, and the run config. Each example (`openai.ts`, `vercel.ts`, `agents.ts`,
 * `responses.ts`, `anthropic.ts`) is the same agent written with one SDK, unchanged but for its base URL.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as Calculator from "../../environments/calculator/Calculator.ts"
import * as MathEqual from "../../environments/math/MathEqual.ts"
import * as AgentTask from "../../src/AgentTask.ts"

/** The system prompt the tiny policy's demonstrations use. */
export const systemPrompt = "Use the calculator tool."

export const description = "Evaluate an arithmetic expression, e.g. (12 - 45) * 203"

/** The calculator as an SDK tool's `execute`: the value as text, or the error the model reads. */
export const calculate = (expression: string): string => {
  const value = Calculator.evaluate(expression)
  return value instanceof Calculator.CalculatorError ? `Error: ${value.message}` : Calculator.format(value)
}

/** The calculator questions' task around an agent function: `mathEqual` scores the final answer. */
export const task = (name: string, agent: AgentTask.AgentFunction<{ readonly answer: string }>) =>
  AgentTask.make(name, {
    description: "Arithmetic word problems, answered by an SDK agent with a calculator tool",
    row: Schema.Struct({ answer: Schema.String }),
    agent,
    reward: MathEqual.mathEqual,
    timeout: "60 seconds",
    defaults: { systemPrompt, maxNewTokens: 96, maxContextTokens: 256, renderTools: false }
  })

/**
 * The run config of an example (paths relative to this folder): the calculator demo's, with the SDK agent as the
 * policy's harness. The data comes from `npx tsx examples/calculator/generate.ts examples/calculator/data 12345`.
 */
export const config = (name: string) => ({
  name,
  seed: 1,
  output: `../../runs/${name}`,
  model: { path: "../../runs/models/calculator-tiny", preset: "tiny", initSeed: 1 },
  data: { train: "../calculator/data/train.jsonl", eval: "../calculator/data/heldout.jsonl" },
  agent: { numChains: 8, temperature: 1 },
  warmup: {
    data: "../calculator/data/demos.jsonl",
    steps: 700,
    lr: 0.002,
    warmupSteps: 100,
    batchSize: 16,
    stopAt: { data: "../calculator/data/validation.jsonl", accuracy: 0.2, every: 25, from: 300, size: 50 }
  },
  algorithm: { steps: 40, groupsPerStep: 8, lr: 0.0003, lrSchedule: "cosine", microBatchSize: 16 },
  eval: { every: 20, size: 100 },
  checkpoint: { every: 20 }
})
