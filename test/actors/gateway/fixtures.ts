/**
 * Shared parts of the gateway tests: the byte tokenizer with the qwen2.5 template, a scripted token sampler that
 * writes Hermes tool calls as a small calculator agent's policy would, and helpers to open an episode.
 */
import { Effect } from "effect"
import type OpenAI from "openai"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as ByteTokenizer from "../../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../../src/ChatTemplate.ts"
import * as Sampler from "../../../src/Sampler.ts"
import * as Tokenizer from "../../../src/Tokenizer.ts"
import * as Trajectory from "../../../src/Trajectory.ts"

export const tokenizer = Effect.runSync(
  Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig(""))
)
export const template = ChatTemplate.builtinTemplate("qwen2.5")
export const format = ChainFormat.fromTemplate({ tokenizer, template })
export const imEnd = tokenizer.tokenToId("<|im_end|>")!

/** The ids a policy samples for `text`, ending its turn. */
export const turn = (text: string): Array<number> => [...tokenizer.encode(text), imEnd]

export const call = (name: string, args: Record<string, unknown>) =>
  `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`

/**
 * A calculator policy over the rendered prompt: with no tool response yet it calls `calculator` on the question's
 * expression (twice, in parallel, when the question says "both"); after one it answers with the last result.
 */
export const calculatorPolicy = (prompt: string): string => {
  const responses = [...prompt.matchAll(/<tool_response>\n([\s\S]*?)\n<\/tool_response>/g)].map((m) => m[1]!)
  const lastUser = prompt.lastIndexOf("<|im_start|>user")
  const question = prompt.slice(lastUser)
  if (responses.length > 0 && !question.includes("What is") && !question.includes("both")) {
    return `The answer is ${responses.at(-1)}.`
  }
  const both = /both ([\d+*-]+) and ([\d+*-]+)/.exec(question)
  if (both !== null) {
    return call("calculator", { expression: both[1] }) + "\n" + call("calculator", { expression: both[2] })
  }
  const one = /What is ([\d+*-]+)\?/.exec(question)
  return one !== null ? call("calculator", { expression: one[1] }) : "I do not know."
}

/** The calculator policy as a scripted token sampler (deterministic logprobs, policy version `version`). */
export const scriptedSampler = (version = 3, policy: (prompt: string) => string = calculatorPolicy) =>
  Sampler.makeScripted((request) => turn(policy(tokenizer.decode(request.promptTokenIds))), { policyVersion: version })

/** Evaluates `+ - *` expressions of integers (enough for the tests' questions). */
export const evaluate = (expression: string): string => {
  if (!/^[\d+*\- ]+$/.test(expression)) return "Error: bad expression"
  // eslint-disable-next-line no-new-func
  return String(Function(`"use strict"; return (${expression})`)())
}

export const calculatorTool = {
  type: "function" as const,
  function: {
    name: "calculator",
    description: "Evaluate an arithmetic expression",
    parameters: {
      type: "object",
      properties: { expression: { type: "string" } },
      required: ["expression"],
      additionalProperties: false
    }
  }
}

/** The calculator agent on chat completions (the `openai` SDK): the reference record the other formats must match. */
export const chatLoop = async (openai: OpenAI, question: string) => {
  const messages: Array<OpenAI.Chat.Completions.ChatCompletionMessageParam> = [
    { role: "system", content: "Use the calculator tool." },
    { role: "user", content: question }
  ]
  for (let step = 0; step < 4; step++) {
    const message = (await openai.chat.completions.create({ model: "any", messages, tools: [calculatorTool] }))
      .choices[0]!.message
    messages.push(message)
    if ((message.tool_calls ?? []).length === 0) return message.content
    for (const c of message.tool_calls!) {
      if (c.type !== "function") continue
      const { expression } = JSON.parse(c.function.arguments) as { expression: string }
      messages.push({ role: "tool", tool_call_id: c.id, content: evaluate(expression) })
    }
  }
  return null
}

/** What a trajectory records, segment by segment: its ids, loss mask and sources. */
export const record = (t: Trajectory.Trajectory) =>
  t.segments.map((s) => ({
    ids: [...Trajectory.tokenIds(s)],
    mask: [...Trajectory.lossMask(s)],
    sources: Trajectory.sources(s)
  }))
