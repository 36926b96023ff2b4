/**
 * The calculator agent written with the `openai` SDK's tool calling, trained unchanged: only `baseURL` points at
 * the gateway's episode.
 *
 *   npx agentfly train examples/sdk-agents/openai.ts
 *
 * @since 0.1.0
 */
import OpenAI from "openai"
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions"
import type * as AgentTask from "../../src/AgentTask.ts"
import * as Calculator from "./calculator.ts"

const tools: Array<ChatCompletionTool> = [{
  type: "function",
  function: {
    name: "calculator",
    description: Calculator.description,
    parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] }
  }
}]

/** The agent: ask, run the tool calls it asks for, until it answers (at most `maxSteps` model calls). */
export const agent = (options: { readonly stream?: boolean; readonly maxSteps?: number } = {}) =>
async (input: AgentTask.Input<unknown>, client: AgentTask.Client): Promise<void> => {
  const openai = new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey, maxRetries: 0 })
  const messages = [...input.messages] as Array<ChatCompletionMessageParam>
  for (let step = 0; step < (options.maxSteps ?? 3); step++) {
    const request = { model: client.model, messages, tools }
    const completion = options.stream === true
      ? await openai.chat.completions.stream(request, { signal: client.signal }).finalChatCompletion()
      : await openai.chat.completions.create(request, { signal: client.signal })
    const message = completion.choices[0]!.message
    messages.push(message)
    if (message.tool_calls === undefined || message.tool_calls.length === 0) return
    for (const call of message.tool_calls) {
      if (call.type !== "function") continue
      const { expression } = JSON.parse(call.function.arguments) as { expression?: unknown }
      messages.push({ role: "tool", tool_call_id: call.id, content: Calculator.calculate(String(expression)) })
    }
  }
}

export const task = Calculator.task("calculator-openai", agent())

export const config = Calculator.config("calculator-openai")
