/**
 * The gateway's request and response bodies: a chat or completions request checked into what the gateway reads
 * (defaults, `max_completion_tokens` over `max_tokens`, `top_k: -1` off, stop strings refused), the canonical key of
 * a message (what matches a conversation sent back to what was sampled), and a turn written as a response and as
 * the events of a stream.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Bodies from "../../../actors/gateway/Bodies.ts"
import type * as Message from "../../../src/Message.ts"

const hi = [{ role: "user", content: "Hi" }]

const turn = (over: Partial<Bodies.Turn> = {}): Bodies.Turn => ({
  content: "Hello",
  toolCalls: [],
  finishReason: "stop",
  tokenIds: [5, 6, 7],
  logprobs: [-0.5, -0.25, -1],
  policyVersion: 4,
  promptTokens: 10,
  ...over
})

const calc = (id: string, args: unknown): Message.ToolCall => ({
  id,
  type: "function",
  function: { name: "calc", arguments: args }
})

/** A tool call of `calc` as OpenAI streams it. */
const wireCall = (index: number, id: string, args: string) => ({
  index,
  id,
  type: "function",
  function: { name: "calc", arguments: args }
})

/** The JSON of each `data:` event but `[DONE]`. */
const dataOf = (events: ReadonlyArray<string>) =>
  events.filter((e) => e !== "data: [DONE]\n\n").map((e) => JSON.parse(e.slice("data: ".length)))

describe("gateway Bodies", () => {
  describe("decodeChat", () => {
    it.effect("reads the sampling fields, max_completion_tokens over max_tokens, top_k -1 as off; defaults", () =>
      Effect.gen(function*() {
        const body = yield* Bodies.decodeChat({
          messages: [{ role: "developer", content: "Be brief." }, ...hi],
          max_tokens: 9,
          max_completion_tokens: 7,
          temperature: 0.5,
          top_p: 0.9,
          top_k: -1,
          seed: 3,
          stop_token_ids: [2],
          stream: true,
          stream_options: { include_usage: true },
          logprobs: true,
          tool_choice: "auto"
        })
        assert.deepStrictEqual(body, {
          maxTokens: 7,
          temperature: 0.5,
          topP: 0.9,
          topK: undefined,
          seed: 3,
          stopTokenIds: [2],
          stream: true,
          includeUsage: true,
          messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }],
          tools: [],
          logprobs: true
        })
        const plain = yield* Bodies.decodeChat({ messages: hi })
        assert.deepStrictEqual(
          [plain.maxTokens, plain.temperature, plain.stream, plain.includeUsage, plain.logprobs, plain.stopTokenIds],
          [undefined, undefined, false, false, false, []]
        )
      }))

    it.effect("refusals name the field: stop strings, no messages, a bad message, an unknown field, a bad stream", () =>
      Effect.gen(function*() {
        const refused = (body: unknown) => Effect.map(Effect.flip(Bodies.decodeChat(body)), (e) => [e.status, e.param])
        assert.deepStrictEqual(yield* refused({ messages: hi, stop: ["\n"] }), [400, "stop"])
        // An empty list of stops is no stop: accepted.
        const noStops = yield* Bodies.decodeChat({ messages: hi, stop: [] })
        assert.deepStrictEqual(noStops.messages, [{ role: "user", content: "Hi" }])
        assert.deepStrictEqual(yield* refused({ messages: [] }), [400, "messages"])
        assert.deepStrictEqual(yield* refused({ messages: [...hi, { role: "wizard" }] }), [400, "messages[1].role"])
        assert.deepStrictEqual(yield* refused({ messages: hi, foo: 1 }), [400, "foo"])
        assert.deepStrictEqual(yield* refused({ messages: hi, stream: "yes" }), [400, "stream"])
        assert.deepStrictEqual(yield* refused({ messages: hi, stop_token_ids: [-1] }), [400, "stop_token_ids"])
        assert.deepStrictEqual(yield* refused([hi]), [400, undefined])
      }))
  })

  it.effect("decodeCompletion: a text or token-id prompt; a list of prompts is refused (one prompt)", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual((yield* Bodies.decodeCompletion({ prompt: "2+2=" })).prompt, "2+2=")
      const ids = yield* Bodies.decodeCompletion({ prompt: [1, 2, 3], logprobs: 0 })
      assert.deepStrictEqual([ids.prompt, ids.logprobs], [[1, 2, 3], true])
      const e = yield* Effect.flip(Bodies.decodeCompletion({ prompt: ["a", "b"] }))
      assert.deepStrictEqual([e.status, e.param], [400, "prompt"])
    }))

  describe("messageKey", () => {
    it("the same turn however an SDK wrote it: arguments' key order, text or JSON arguments, trimmed text", () => {
      const a = Bodies.messageKey({ role: "assistant", content: " ", tool_calls: [calc("c", { x: 1, y: 2 })] })
      const b = Bodies.messageKey({ role: "assistant", content: "", tool_calls: [calc("c", "{\"y\":2,\"x\":1}")] })
      assert.strictEqual(a, b)
      assert.notStrictEqual(a, Bodies.messageKey({ role: "assistant", content: "", tool_calls: [calc("c", { x: 2 })] }))
      assert.notStrictEqual(a, Bodies.messageKey({ role: "assistant", content: "", tool_calls: [calc("d", { x: 1 })] }))
    })

    it("a tool message by its call id and text, not its name; roles are told apart", () => {
      const key = (m: Message.Message) => Bodies.messageKey(m)
      assert.strictEqual(
        key({ role: "tool", content: "2", tool_call_id: "c", name: "calc" }),
        key({ role: "tool", content: "2", tool_call_id: "c" })
      )
      assert.notStrictEqual(
        key({ role: "tool", content: "2", tool_call_id: "c" }),
        key({ role: "tool", content: "2", tool_call_id: "d" })
      )
      assert.notStrictEqual(key({ role: "user", content: "x" }), key({ role: "system", content: "x" }))
      assert.isTrue(key({ role: "assistant", content: "x" }).startsWith("a\u0000"))
    })

    it("toolsKey ignores key order within a tool", () => {
      const tool = (fn: Record<string, unknown>) => ({ type: "function" as const, function: fn as { name: string } })
      assert.strictEqual(
        Bodies.toolsKey([tool({ name: "calc", description: "d" })]),
        Bodies.toolsKey([tool({ description: "d", name: "calc" })])
      )
    })
  })

  describe("responses", () => {
    it("a chat completion: the message, token ids, usage and policy version; null content beside tool calls", () => {
      const body = Bodies.chatCompletion("chatcmpl-1", 100, "m", turn(), false)
      assert.deepStrictEqual(body.choices[0]!.message, { role: "assistant", content: "Hello" })
      assert.deepStrictEqual(body.usage, { prompt_tokens: 10, completion_tokens: 3, total_tokens: 13 })
      assert.deepStrictEqual([body.choices[0]!.token_ids, body.policy_version, body.choices[0]!.logprobs], [
        [5, 6, 7],
        4,
        null
      ])
      const called = Bodies.chatCompletion("chatcmpl-2", 100, "m", turn({
        content: "",
        toolCalls: [calc("call_0", { x: 1 })],
        finishReason: "tool_calls"
      }), true)
      const choice = called.choices[0]!
      assert.deepStrictEqual(choice.message, {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "call_0", type: "function", function: { name: "calc", arguments: "{\"x\":1}" } }]
      })
      assert.strictEqual(choice.finish_reason, "tool_calls")
      assert.deepStrictEqual(choice.logprobs?.content.map((c) => [c.token, c.logprob]), [
        ["token_id:5", -0.5],
        ["token_id:6", -0.25],
        ["token_id:7", -1]
      ])
    })

    it("a streamed chat: the role, the text, one delta per tool call, the finish, the usage when asked, [DONE]", () => {
      const events = Bodies.chatChunks("chatcmpl-3", 100, "m", turn({
        content: "Let me see.",
        toolCalls: [calc("call_0", { x: 1 }), calc("call_1", { x: 2 })],
        finishReason: "tool_calls"
      }), { includeUsage: true, logprobs: false })
      assert.strictEqual(events.at(-1), "data: [DONE]\n\n")
      const data = dataOf(events)
      assert.deepStrictEqual(data.map((d) => d.choices[0]?.delta), [
        { role: "assistant", content: "" },
        { content: "Let me see." },
        { tool_calls: [wireCall(0, "call_0", "{\"x\":1}")] },
        { tool_calls: [wireCall(1, "call_1", "{\"x\":2}")] },
        {},
        undefined
      ])
      assert.deepStrictEqual([data[4].choices[0].finish_reason, data[4].policy_version], ["tool_calls", 4])
      assert.deepStrictEqual(data[5].usage, { prompt_tokens: 10, completion_tokens: 3, total_tokens: 13 })
      const quiet = Bodies.chatChunks("chatcmpl-4", 100, "m", turn(), { includeUsage: false, logprobs: false })
      assert.strictEqual(dataOf(quiet).length, 3)
    })

    it("a text completion and its stream: the text, ids, finish `length` or else `stop`", () => {
      const body = Bodies.textCompletion("cmpl-1", 100, "m", turn({ finishReason: "length" }), "Hel", [1, 2], true)
      const choice = body.choices[0]!
      assert.deepStrictEqual([choice.text, choice.finish_reason, choice.prompt_token_ids], ["Hel", "length", [1, 2]])
      assert.deepStrictEqual(choice.logprobs?.tokens, ["token_id:5", "token_id:6", "token_id:7"])
      const events = dataOf(Bodies.completionChunks("cmpl-2", 100, "m", turn(), "Hello"))
      assert.deepStrictEqual(events.map((e) => [e.choices[0].text, e.choices[0].finish_reason]), [
        ["Hello", null],
        ["", "stop"]
      ])
      assert.strictEqual(events[1].policy_version, 4)
    })
  })
})
