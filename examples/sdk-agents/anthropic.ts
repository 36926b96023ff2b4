/**
 * The calculator agent written with Anthropic's SDK (`@anthropic-ai/sdk`: `messages.create`, `tool_use` and
 * `tool_result` blocks), trained unchanged: only `baseURL` points at the gateway's episode (without its `/v1`, which
 * the SDK adds).
 *
 *   npx agentfly train examples/sdk-agents/anthropic.ts
 *
 * @since 0.1.0
 */
import Anthropic from "@anthropic-ai/sdk"
import type * as AgentTask from "../../src/AgentTask.ts"
import * as Calculator from "./calculator.ts"

const tools: Array<Anthropic.Tool> = [{
  name: "calculator",
  description: Calculator.description,
  input_schema: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] }
}]

/** The agent: ask, run the tools it uses, until it answers (at most `maxSteps` model calls). */
export const agent = (options: { readonly stream?: boolean; readonly maxSteps?: number } = {}) =>
async (input: AgentTask.Input<unknown>, client: AgentTask.Client): Promise<void> => {
  // The SDK adds `/v1` itself.
  const baseURL = client.baseURL.replace(/\/v1$/, "")
  const anthropic = new Anthropic({ baseURL, apiKey: client.apiKey, maxRetries: 0 })
  const messages: Array<Anthropic.MessageParam> = input.messages.flatMap((m): Array<Anthropic.MessageParam> =>
    m.role === "user" ? [{ role: "user", content: m.content as string }] : []
  )
  for (let step = 0; step < (options.maxSteps ?? 3); step++) {
    const request = {
      model: client.model,
      max_tokens: 1024,
      ...(input.systemPrompt === undefined ? {} : { system: input.systemPrompt }),
      messages,
      tools
    }
    const reply = options.stream === true
      ? await anthropic.messages.stream(request, { signal: client.signal }).finalMessage()
      : await anthropic.messages.create(request, { signal: client.signal })
    messages.push({ role: "assistant", content: reply.content })
    const results: Array<Anthropic.ToolResultBlockParam> = []
    for (const block of reply.content) {
      if (block.type !== "tool_use") continue
      const { expression } = block.input as { expression?: unknown }
      results.push({ type: "tool_result", tool_use_id: block.id, content: Calculator.calculate(String(expression)) })
    }
    if (results.length === 0) return
    messages.push({ role: "user", content: results })
  }
}

export const task = Calculator.task("calculator-anthropic", agent())

export const config = Calculator.config("calculator-anthropic")
