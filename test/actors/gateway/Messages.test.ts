/**
 * Anthropic's Messages API (`POST /v1/messages`) with `@anthropic-ai/sdk`, unchanged but for `baseURL` (its
 * `x-api-key` and `anthropic-version` headers included), against the scripted calculator policy: `system`,
 * `tool_use` / `tool_result` blocks, `stop_reason`, the streamed events; the record is the chat-completions record
 * token for token; bodies are typed by the SDK's definitions; errors are Anthropic's bodies.
 */
import Anthropic from "@anthropic-ai/sdk"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import OpenAI from "openai"
import * as Gateway from "../../../actors/Gateway.ts"
import * as Messages from "../../../actors/gateway/Messages.ts"
import * as Recorder from "../../../actors/gateway/Recorder.ts"
import type * as Sampler from "../../../src/Sampler.ts"
import { calculatorTool, chatLoop, evaluate, format, record, scriptedSampler } from "./fixtures.ts"

const sampling = { temperature: 1, maxTokens: 256 }

const setup = (sampler: Sampler.Sampler["Service"], tokens?: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const gateway = yield* Gateway.make({ tokens })
    const open = (id: string) => gateway.open({ id, groupId: "g", format, sampler, sampling, requestSampling: "cap" })
    return { gateway, open }
  })

/** The episode's Anthropic root: the SDK appends `/v1/messages`. */
const anthropic = (baseURL: string, apiKey = "unused") =>
  new Anthropic({ baseURL: baseURL.replace(/\/v1$/, ""), apiKey, maxRetries: 0 })

const calculator: Anthropic.Tool = {
  name: "calculator",
  description: calculatorTool.function.description,
  input_schema: calculatorTool.function.parameters as Anthropic.Tool.InputSchema
}

/** The Anthropic tool loop: call, run the `tool_use` blocks, answer with `tool_result` blocks. */
const messagesLoop = async (client: Anthropic, question: string, stream: boolean) => {
  const messages: Array<Anthropic.MessageParam> = [{ role: "user", content: question }]
  const stops: Array<string | null> = []
  for (let step = 0; step < 4; step++) {
    const params = { model: "any", max_tokens: 256, system: "Use the calculator tool.", messages, tools: [calculator] }
    const reply = stream
      ? await client.messages.stream(params).finalMessage()
      : await client.messages.create(params)
    stops.push(reply.stop_reason)
    messages.push({ role: "assistant", content: reply.content })
    const uses = reply.content.filter((b): b is Anthropic.ToolUseBlock => b.type === "tool_use")
    if (uses.length === 0) {
      return { answer: reply.content.map((b) => (b.type === "text" ? b.text : "")).join(""), stops, reply }
    }
    messages.push({
      role: "user",
      content: uses.map((u) => ({
        type: "tool_result" as const,
        tool_use_id: u.id,
        content: evaluate((u.input as { expression: string }).expression)
      }))
    })
  }
  return { answer: undefined, stops, reply: undefined }
}

describe("Gateway: Anthropic's Messages API", () => {
  it.live("@anthropic-ai/sdk messages.create and .stream, single and parallel tool_use: the chat record", () =>
    Effect.gen(function*() {
      const { open } = yield* setup(yield* scriptedSampler(3))
      for (const question of ["What is 17*23?", "Compute both 2+3 and 4*5."]) {
        const reference = yield* open(`chat-${question.length}`)
        const expected = yield* Effect.promise(() =>
          chatLoop(new OpenAI({ baseURL: reference.baseURL, apiKey: "x", maxRetries: 0 }), question)
        )
        const want = record(yield* Recorder.trajectory(reference.recorder, { _tag: "Returned" }))
        for (const stream of [false, true]) {
          const episode = yield* open(`${stream}-${question.length}`)
          const { answer, stops, reply } = yield* Effect.promise(() =>
            messagesLoop(anthropic(episode.baseURL), question, stream)
          )
          assert.strictEqual(answer, expected)
          assert.deepStrictEqual(stops, ["tool_use", "end_turn"])
          assert.isAbove(reply!.usage.input_tokens, 0)
          const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
          assert.deepStrictEqual(record(t), want, `stream ${stream}: the same ids, mask and sources`)
        }
      }
    }))

  it.live("the stream's events in Anthropic's order; the SDK's x-api-key is the gateway's token", () =>
    Effect.gen(function*() {
      const { open } = yield* setup(yield* scriptedSampler(3), ["secret"])
      const episode = yield* open("events")
      const types = yield* Effect.promise(async () => {
        const seen: Array<string> = []
        const stream = await anthropic(episode.baseURL, "secret").messages.create({
          model: "any",
          max_tokens: 64,
          messages: [{ role: "user", content: "What is 2+2?" }],
          tools: [calculator],
          stream: true
        })
        for await (const event of stream) {
          seen.push(event.type === "content_block_delta" ? `${event.type}:${event.delta.type}` : event.type)
        }
        return seen
      })
      assert.deepStrictEqual(types, [
        "message_start",
        "content_block_start",
        "content_block_delta:input_json_delta",
        "content_block_stop",
        "message_delta",
        "message_stop"
      ])
      const wrongKey = yield* Effect.promise(() =>
        anthropic(episode.baseURL, "wrong").messages.create({
          model: "any",
          max_tokens: 8,
          messages: [{ role: "user", content: "hi" }]
        }).then(() => 200, (e: InstanceType<typeof Anthropic.APIError>) => e.status)
      )
      assert.strictEqual(wrongKey, 401)
      // count_tokens: the prompt as the episode's template renders it, nothing recorded.
      const counted = yield* Effect.promise(() =>
        anthropic(episode.baseURL, "secret").messages.countTokens({
          model: "any",
          messages: [{ role: "user", content: "What is 2+2?" }],
          tools: [calculator]
        })
      )
      const recorded = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
      assert.strictEqual(counted.input_tokens, recorded.segments[0]!.spans[0]!.tokenIds.length)
      assert.strictEqual(episode.recorder.requests, 1)
    }))

  it.live("refusals are Anthropic error bodies: a tool_result answering no tool_use, no max_tokens, stops", () =>
    Effect.gen(function*() {
      const { gateway, open } = yield* setup(yield* scriptedSampler(3))
      const episode = yield* open("refusals")
      const post = (body: unknown) =>
        Effect.promise(() =>
          fetch(`${gateway.url}/episodes/refusals/v1/messages`, {
            method: "POST",
            headers: { "content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01" },
            body: JSON.stringify(body)
          }).then(async (r) => ({ status: r.status, body: await r.json() as Anthropic.ErrorResponse }))
        )
      const orphan = yield* post({
        model: "m",
        max_tokens: 8,
        messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "4" }] }]
      })
      assert.strictEqual(orphan.status, 400)
      assert.strictEqual(orphan.body.type, "error")
      assert.strictEqual(orphan.body.error.type, "invalid_request_error")
      assert.include(orphan.body.error.message, "unexpected `tool_use_id` found in `tool_result` blocks: toolu_1")
      const noMax = yield* post({ model: "m", messages: [{ role: "user", content: "hi" }] })
      assert.strictEqual(noMax.status, 400)
      assert.include(noMax.body.error.message, "max_tokens: Field required")
      const hi = [{ role: "user", content: "hi" }]
      const stops = yield* post({ model: "m", max_tokens: 8, stop_sequences: ["x"], messages: hi })
      assert.include(stops.body.error.message, "stop_sequences are not supported")
      const unknown = yield* post({ model: "m", max_tokens: 8, messages: [{ role: "user", content: "hi" }], foo: 1 })
      assert.include(unknown.body.error.message, "foo: Extra inputs are not permitted")
      assert.deepStrictEqual(episode.recorder.failures.map((f) => f.reason), Array(4).fill("SamplerRejected"))
      const missing = yield* Effect.promise(() =>
        fetch(`${gateway.url}/episodes/nobody/v1/messages`, {
          method: "POST",
          body: JSON.stringify({ model: "m", max_tokens: 8, messages: [{ role: "user", content: "hi" }] })
        }).then(async (r) => ({ status: r.status, body: await r.json() as Anthropic.ErrorResponse }))
      )
      assert.strictEqual(missing.status, 404)
      assert.strictEqual(missing.body.error.type, "not_found_error")
    }))

  it.live("a request as Claude Code 2.1.197 sends it: beta headers, thinking, context_management, a system turn", () =>
    Effect.gen(function*() {
      const { gateway, open } = yield* setup(yield* scriptedSampler(3))
      const episode = yield* open("claude-code")
      // The fields and headers of Claude Code's requests (captured from `claude -p` against the gateway).
      const response = yield* Effect.promise(() =>
        fetch(`${gateway.url}/episodes/claude-code/v1/messages?beta=true`, {
          method: "POST",
          headers: {
            "content-type": "application/json",
            "x-api-key": "k",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,context-management-2025-06-27,mid-conversation-system-2026-04-07",
            "x-app": "cli"
          },
          body: JSON.stringify({
            model: "claude-sonnet",
            messages: [
              { role: "user", content: [{ type: "text", text: "<context/>" }, { type: "text", text: "What is 2+3?" }] },
              { role: "system", content: "Use the calculator tool." }
            ],
            system: [{ type: "text", text: "You are Claude Code.", cache_control: { type: "ephemeral" } }],
            tools: [{ ...calculator, cache_control: { type: "ephemeral" } }],
            metadata: { user_id: "u" },
            max_tokens: 32000,
            thinking: { type: "enabled", budget_tokens: 1024 },
            context_management: { edits: [] },
            output_config: {},
            stream: true
          })
        }).then(async (r) => ({ status: r.status, text: await r.text() }))
      )
      assert.strictEqual(response.status, 200, response.text)
      assert.include(response.text, "event: message_stop")
      assert.include(response.text, "\"stop_reason\":\"tool_use\"")
      const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
      assert.strictEqual(t.metrics["turns"], 1)
      assert.deepStrictEqual(t.messages.slice(0, 3).map((m) => m.role), ["system", "user", "system"])
    }))

  it("the message is the SDK's Message type: thinking blocks dropped, a text block only beside no calls", () => {
    const turn = {
      content: "",
      toolCalls: [{ id: "call_0", type: "function" as const, function: { name: "calculator", arguments: { e: 1 } } }],
      finishReason: "tool_calls" as const,
      tokenIds: [1, 2],
      logprobs: [-1, -1],
      policyVersion: 1,
      promptTokens: 5
    }
    const body: Anthropic.Message = Messages.message("msg_1", "m", turn)
    assert.deepStrictEqual(body.content.map((b) => b.type), ["tool_use"])
    assert.strictEqual(body.stop_reason, "tool_use")
    const cut: Anthropic.Message = Messages.message("msg_2", "m", {
      ...turn,
      content: "abc",
      toolCalls: [],
      finishReason: "length"
    })
    assert.strictEqual(cut.stop_reason, "max_tokens")
    const decoded = Messages.decode({
      model: "m",
      max_tokens: 5,
      system: [{ type: "text", text: "S" }],
      messages: [
        { role: "user", content: "q" },
        {
          role: "assistant",
          content: [{ type: "thinking", thinking: "hm", signature: "x" }, { type: "text", text: "Let me." }, {
            type: "tool_use",
            id: "call_0",
            name: "calculator",
            input: { e: 1 }
          }]
        },
        {
          role: "user",
          content: [{ type: "tool_result", tool_use_id: "call_0", content: "1" }, { type: "text", text: "and?" }]
        }
      ]
    })
    assert.notInstanceOf(decoded, Error)
    assert.deepStrictEqual((decoded as { messages: unknown }).messages, [
      { role: "system", content: "S" },
      { role: "user", content: "q" },
      {
        role: "assistant",
        content: "Let me.",
        tool_calls: [{ id: "call_0", type: "function", function: { name: "calculator", arguments: { e: 1 } } }]
      },
      { role: "tool", tool_call_id: "call_0", content: "1" },
      { role: "user", content: "and?" }
    ])
  })
})
