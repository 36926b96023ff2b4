/**
 * The calculator agent written with the OpenAI Agents SDK (`Agent` + `tool` + `run`), on its chat-completions
 * model, trained unchanged: only the client's `baseURL` points at the gateway's episode.
 *
 *   npx agentfly train examples/sdk-agents/agents.ts
 *
 * @since 0.1.0
 */
import { Agent, MaxTurnsExceededError, OpenAIChatCompletionsModel, run, setTracingDisabled, tool } from "@openai/agents"
import OpenAI from "openai"
import { z } from "zod"
import type * as AgentTask from "../../src/AgentTask.ts"
import * as Calculator from "./calculator.ts"

// Traces would go to OpenAI's servers: training runs keep them local.
setTracingDisabled(true)

const calculator = tool({
  name: "calculator",
  description: Calculator.description,
  parameters: z.object({ expression: z.string() }),
  execute: async ({ expression }) => Calculator.calculate(expression)
})

/** The agent: instructions, one tool, at most `maxTurns` model calls. */
export const agent = (options: { readonly stream?: boolean; readonly maxTurns?: number } = {}) =>
async (input: AgentTask.Input<unknown>, client: AgentTask.Client): Promise<void> => {
  const model = new OpenAIChatCompletionsModel(
    new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey, maxRetries: 0 }),
    client.model
  )
  const calculatorAgent = new Agent({
    name: "calculator",
    instructions: input.systemPrompt ?? Calculator.systemPrompt,
    model,
    tools: [calculator]
  })
  const question = input.question ?? ""
  const maxTurns = options.maxTurns ?? 3
  try {
    if (options.stream === true) {
      const result = await run(calculatorAgent, question, { maxTurns, signal: client.signal, stream: true })
      await result.completed
      if (result.error !== null) throw result.error
    } else await run(calculatorAgent, question, { maxTurns, signal: client.signal })
  } catch (e) {
    // An agent still calling tools at its step limit ends its episode there (the reward reads its transcript).
    if (!(e instanceof MaxTurnsExceededError)) throw e
  }
}

export const task = Calculator.task("calculator-agents", agent())

export const config = Calculator.config("calculator-agents")
