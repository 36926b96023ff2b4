/**
 * The calculator agent written with the Vercel AI SDK (`generateText` with a tool and `stopWhen`), through the
 * OpenAI-compatible provider, trained unchanged: only `baseURL` points at the gateway's episode.
 *
 *   npx agentfly train examples/sdk-agents/vercel.ts
 *
 * @since 0.1.0
 */
import { createOpenAICompatible } from "@ai-sdk/openai-compatible"
import { generateText, stepCountIs, streamText, tool } from "ai"
import { z } from "zod"
import type * as AgentTask from "../../src/AgentTask.ts"
import * as Calculator from "./calculator.ts"

const calculator = tool({
  description: Calculator.description,
  inputSchema: z.object({ expression: z.string() }),
  execute: async ({ expression }) => Calculator.calculate(expression)
})

/** The agent: `generateText` (or `streamText`) runs the tool loop for at most `maxSteps` steps. */
export const agent = (options: { readonly stream?: boolean; readonly maxSteps?: number } = {}) =>
async (input: AgentTask.Input<unknown>, client: AgentTask.Client): Promise<void> => {
  const provider = createOpenAICompatible({ name: "agentfly", baseURL: client.baseURL, apiKey: client.apiKey })
  const request = {
    model: provider.chatModel(client.model),
    instructions: input.systemPrompt ?? Calculator.systemPrompt,
    prompt: input.question ?? "",
    tools: { calculator },
    stopWhen: stepCountIs(options.maxSteps ?? 3),
    maxRetries: 0,
    abortSignal: client.signal
  }
  if (options.stream === true) {
    const result = streamText({ ...request, onError: () => {} })
    await result.consumeStream({ onError: (e) => { throw e } })
    await result.text
  } else await generateText(request)
}

export const task = Calculator.task("calculator-vercel", agent())

export const config = Calculator.config("calculator-vercel")
