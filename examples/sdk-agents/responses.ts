/**
 * The calculator agent written with the `openai` SDK's Responses API (`client.responses.create`, function tools,
 * `function_call` / `function_call_output` items), trained unchanged: only `baseURL` points at the gateway's
 * episode. With `chain: true` it sends only the new items and `previous_response_id` (the gateway stores each
 * response of the episode), else its whole history.
 *
 *   npx agentfly train examples/sdk-agents/responses.ts
 *
 * @since 0.1.0
 */
import OpenAI from "openai"
import type { FunctionTool, ResponseInputItem } from "openai/resources/responses/responses"
import type * as AgentTask from "../../src/AgentTask.ts"
import * as Calculator from "./calculator.ts"

const tools: Array<FunctionTool> = [{
  type: "function",
  name: "calculator",
  description: Calculator.description,
  parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
  strict: false
}]

/** The agent: ask, run the function calls it asks for, until it answers (at most `maxSteps` model calls). */
export const agent = (
  options: { readonly stream?: boolean; readonly chain?: boolean; readonly maxSteps?: number } = {}
) =>
async (input: AgentTask.Input<unknown>, client: AgentTask.Client): Promise<void> => {
  const openai = new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey, maxRetries: 0 })
  const history: Array<ResponseInputItem> = input.messages.flatMap((m): Array<ResponseInputItem> =>
    m.role === "user" ? [{ role: "user", content: m.content as string }] : []
  )
  let items: Array<ResponseInputItem> = [...history]
  let previous: string | undefined
  for (let step = 0; step < (options.maxSteps ?? 3); step++) {
    const request = {
      model: client.model,
      instructions: input.systemPrompt ?? null,
      input: items,
      tools,
      ...(options.chain === true && previous !== undefined ? { previous_response_id: previous } : {})
    }
    const response = options.stream === true
      ? await openai.responses.stream(request, { signal: client.signal }).finalResponse()
      : await openai.responses.create(request, { signal: client.signal })
    previous = response.id
    const outputs: Array<ResponseInputItem> = []
    for (const item of response.output) {
      if (item.type !== "function_call") continue
      const { expression } = JSON.parse(item.arguments) as { expression?: unknown }
      const output = Calculator.calculate(String(expression))
      outputs.push({ type: "function_call_output", call_id: item.call_id, output })
    }
    if (outputs.length === 0) return
    history.push(...(response.output as Array<ResponseInputItem>), ...outputs)
    items = options.chain === true ? outputs : [...history]
  }
}

export const task = Calculator.task("calculator-responses", agent())

export const config = Calculator.config("calculator-responses")
