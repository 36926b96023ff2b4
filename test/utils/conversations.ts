/**
 * Test conversations: a 4-turn tool-using conversation with parallel calls, and a generator of random
 * conversations (fast-check) with the same structure: user queries, assistant turns with text, optional reasoning
 * and zero or more tool calls, then one tool result per call.
 */
import fc from "fast-check"
import type * as ChatTemplate from "../../src/ChatTemplate.ts"
import type * as Message from "../../src/Message.ts"

export const tools: ReadonlyArray<ChatTemplate.ToolSpec> = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather of a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
    }
  },
  {
    type: "function",
    function: {
      name: "calculator",
      description: "Evaluate an arithmetic expression",
      parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] }
    }
  }
]

const call = (id: string, name: string, args: Record<string, unknown>): Message.ToolCall => ({
  id,
  type: "function",
  function: { name, arguments: args }
})

/** Four assistant turns; turn 1 makes two parallel calls, turn 3 two more, turn 4 answers after a follow-up. */
export const fourTurns: ReadonlyArray<Message.Message> = [
  { role: "system", content: "You are a careful assistant. Use tools when they help." },
  { role: "user", content: "What is the weather in Paris and Rome, and what is 21 + 25?" },
  {
    role: "assistant",
    content: "I will look up both cities.",
    tool_calls: [call("c1", "get_weather", { city: "Paris" }), call("c2", "get_weather", { city: "Rome" })]
  },
  { role: "tool", tool_call_id: "c1", name: "get_weather", content: "{\"city\": \"Paris\", \"temp_c\": 21}" },
  { role: "tool", tool_call_id: "c2", name: "get_weather", content: "{\"city\": \"Rome\", \"temp_c\": 25}" },
  {
    role: "assistant",
    content: "",
    tool_calls: [call("c3", "calculator", { expression: "21 + 25" })]
  },
  { role: "tool", tool_call_id: "c3", name: "calculator", content: "46" },
  { role: "assistant", content: "Paris is 21 °C, Rome 25 °C; together 46." },
  { role: "user", content: "Thanks! And 46 * 2? Also check Oslo." },
  {
    role: "assistant",
    content: "Two calls at once:",
    tool_calls: [call("c4", "calculator", { expression: "46 * 2" }), call("c5", "get_weather", { city: "Oslo" })]
  },
  { role: "tool", tool_call_id: "c4", name: "calculator", content: "92" },
  { role: "tool", tool_call_id: "c5", name: "get_weather", content: "{\"city\": \"Oslo\", \"temp_c\": -3}" },
  { role: "assistant", content: "46 * 2 = 92, and Oslo is at -3 °C. 你好 🙂" }
]

/** Assistant texts start with a non-space character (a sampler emits what follows the header). */
const words = fc.constantFrom(
  ..."weather sum ok Paris 42 é 你好 🙂 x=1; <b>".split(" "),
  "{\"a\": [1, 2]}"
)
const sentence = fc.array(words, { minLength: 1, maxLength: 6 }).map((ws) => ws.join(" "))
const toolText = fc.oneof(sentence, fc.string({ unit: "binary", maxLength: 30 }).map((s) => `r:${s}`))

const assistantTurn = fc.record({
  content: fc.oneof(fc.constant(""), sentence),
  reasoning: fc.option(sentence, { nil: undefined }),
  calls: fc.array(
    fc.record({ name: fc.constantFrom("get_weather", "calculator"), arg: sentence, result: toolText }),
    { maxLength: 3 }
  )
})

/**
 * Random conversations: a system prompt (maybe), then 1–3 episodes of [user query, 1–3 assistant turns]. Every
 * assistant turn but the last of an episode calls at least one tool. With `withReasoning`, assistant turns may
 * carry `reasoning_content` (rendered by Qwen3 as a `<think>` block).
 */
export const conversation = (withReasoning: boolean): fc.Arbitrary<Array<Message.Message>> =>
  fc.record({
    system: fc.option(sentence, { nil: undefined }),
    episodes: fc.array(
      fc.record({ query: sentence, turns: fc.array(assistantTurn, { minLength: 1, maxLength: 3 }) }),
      { minLength: 1, maxLength: 3 }
    )
  }).map(({ episodes, system }) => {
    const messages: Array<Message.Message> = system === undefined ? [] : [{ role: "system", content: system }]
    let id = 0
    for (const episode of episodes) {
      messages.push({ role: "user", content: episode.query })
      episode.turns.forEach((turn, t) => {
        const last = t === episode.turns.length - 1
        const calls = last ? [] : turn.calls.length > 0 ? turn.calls : [{ name: "calculator", arg: "1", result: "1" }]
        const toolCalls = calls.map((c) => call(`c${id++}`, c.name, { input: c.arg }))
        messages.push({
          role: "assistant",
          content: turn.content === "" && calls.length === 0 ? "done" : turn.content,
          ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
          ...(withReasoning && turn.reasoning !== undefined ? { reasoning_content: turn.reasoning } : {})
        })
        toolCalls.forEach((tc, i) => messages.push({ role: "tool", tool_call_id: tc.id, content: calls[i]!.result }))
      })
    }
    return messages
  })
