/**
 * The recorder's bookkeeping, without HTTP: which thread a chat request belongs to (a continuation, a rewrite that
 * starts a new segment, a new thread, a thread of its own beside a busy one), tool-call ids unique in the episode
 * and mapped back to the transcript's, a refused request kept or undone (`keepRefused`), the context budget, token
 * threads of `/v1/completions`, and the figures of the trajectory they add up to.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Bodies from "../../../actors/gateway/Bodies.ts"
import * as Recorder from "../../../actors/gateway/Recorder.ts"
import * as Threads from "../../../actors/gateway/Threads.ts"
import * as Sampler from "../../../src/Sampler.ts"
import { calculatorTool, format, scriptedSampler, tokenizer, turn } from "./fixtures.ts"

const sampling = { temperature: 1, maxTokens: 256 }

const recorder = (sampler: Sampler.Sampler["Service"], extra: Partial<Recorder.Config> = {}) =>
  Recorder.make({ id: "e", groupId: "g", format, sampler, sampling, requestSampling: "cap", ...extra })

type Wire = Record<string, unknown>

const question: ReadonlyArray<Wire> = [
  { role: "system", content: "Use the calculator tool." },
  { role: "user", content: "What is 17*23?" }
]

/** A chat request as the gateway decodes it. */
const ask = (r: Recorder.Recorder, messages: ReadonlyArray<Wire>) =>
  Effect.flatMap(Bodies.decodeChat({ messages, tools: [calculatorTool] }), (body) => Recorder.chat(r, body))

/** The assistant message a client sends back for a turn. */
const answered = (t: Bodies.Turn): Wire => Bodies.assistantMessage(t)

describe("Recorder", () => {
  it.effect("a conversation sent back with the tool's result continues its thread; call ids are the episode's", () =>
    Effect.gen(function*() {
      const r = yield* recorder(yield* scriptedSampler(3))
      const first = yield* ask(r, question)
      assert.strictEqual(first.finishReason, "tool_calls")
      assert.deepStrictEqual(first.toolCalls.map((c) => c.id), ["call_0"])
      const result = { role: "tool", tool_call_id: "call_0", content: "391" }
      const second = yield* ask(r, [...question, answered(first), result])
      assert.strictEqual(second.content, "The answer is 391.")
      assert.deepStrictEqual([r.requests, r.threads.length, r.rewrites], [2, 1, 0])
      // The transcript keeps its own call id; the client's `call_0` was mapped back to it.
      const [thread] = Recorder.threads(r)
      const own = r.callIds.get("call_0")!
      const tool = thread!.messages.find((m) => m.role === "tool")
      assert.strictEqual(tool?.role === "tool" ? tool.tool_call_id : undefined, own)
      assert.strictEqual(thread!.turns, 2)
      const t = yield* Recorder.trajectory(r, { _tag: "Returned" })
      assert.deepStrictEqual(
        [t.termination, t.metrics["turns"], t.metrics["tool_calls"], t.metrics["gateway/threads"], t.segments.length],
        ["no_tool_call", 2, 1, 1, 1]
      )
      assert.strictEqual(t.metrics["tokens_generated"], first.tokenIds.length + second.tokenIds.length)
    }))

  it.effect("a history that drops a turn is a rewrite: the thread starts a new segment, the first one kept", () =>
    Effect.gen(function*() {
      const r = yield* recorder(yield* scriptedSampler(3))
      const first = yield* ask(r, question)
      yield* ask(r, [...question, answered(first), { role: "tool", tool_call_id: "call_0", content: "391" }])
      yield* ask(r, [...question, { role: "user", content: "(summarised) 17*23 is 391. Say it." }])
      assert.deepStrictEqual([r.threads.length, r.rewrites, r.requests], [1, 1, 3])
      const [thread] = Recorder.threads(r)
      assert.strictEqual(thread!.segments.length, 2)
      const t = yield* Recorder.trajectory(r, { _tag: "Returned" })
      assert.deepStrictEqual([t.metrics["gateway/segments"], t.metrics["gateway/rewrites"]], [2, 1])
    }))

  it.effect("chooseChat: another conversation is a new thread; a continuation of a busy thread is one of its own", () =>
    Effect.gen(function*() {
      const r = yield* recorder(yield* scriptedSampler(3))
      const first = yield* ask(r, question)
      const keys = (ms: ReadonlyArray<Wire>) =>
        Effect.map(Bodies.decodeChat({ messages: ms }), (b) => b.messages.map(Bodies.messageKey))
      const asked = yield* Bodies.decodeChat({ messages: question, tools: [calculatorTool] })
      const toolsKey = Bodies.toolsKey(asked.tools)
      const result = { role: "tool", tool_call_id: "call_0", content: "1" }
      const continued = yield* keys([...question, answered(first), result])
      const choice = Threads.chooseChat(r.threads, continued, toolsKey)
      assert.strictEqual(choice._tag, "Continue")
      assert.isTrue(choice._tag === "Continue" && choice.thread === r.threads[0] && choice.from === 3)
      const other = yield* keys([{ role: "user", content: "Something else" }])
      assert.deepStrictEqual(Threads.chooseChat(r.threads, other, toolsKey), { _tag: "New", parent: undefined })
      // Other tools render another prompt: never the same thread.
      assert.strictEqual(Threads.chooseChat(r.threads, continued, Bodies.toolsKey([]))._tag, "New")
      r.threads[0]!.busy = true
      assert.deepStrictEqual(Threads.chooseChat(r.threads, continued, toolsKey), { _tag: "New", parent: 0 })
    }))

  it.effect("a failed request is kept by default (counted, failure recorded); with keepRefused: false, undone", () =>
    Effect.gen(function*() {
      const failing = yield* Sampler.makeScripted(() => Sampler.samplerError("BadRequest", "no"))
      const kept = yield* recorder(failing)
      const e = yield* Effect.flip(ask(kept, question))
      assert.deepStrictEqual([e.status, e.code], [400, "sampler_rejected"])
      assert.deepStrictEqual([kept.requests, kept.threads.length, kept.failures.length], [1, 1, 1])
      const undone = yield* recorder(failing, { keepRefused: false })
      yield* Effect.flip(ask(undone, question))
      assert.deepStrictEqual([undone.requests, undone.threads.length], [0, 0])
    }))

  it.effect("keepRefused: false puts a continued thread back as it was when its request fails", () =>
    Effect.gen(function*() {
      let calls = 0
      const sampler = yield* Sampler.makeScripted((request) =>
        calls++ === 0 ?
          turn(`<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>`) :
          Sampler.samplerError("BadRequest", `refused ${request.promptTokenIds.length}`)
      )
      const r = yield* recorder(sampler, { keepRefused: false })
      const first = yield* ask(r, question)
      const keysOf = (thread: Recorder.Recorder["threads"][number] | undefined) =>
        thread?._tag === "Chat" ? [...thread.keys] : []
      const before = keysOf(r.threads[0])
      assert.lengthOf(before, 3)
      const result = { role: "tool", tool_call_id: "call_0", content: "2" }
      const e = yield* Effect.flip(ask(r, [...question, answered(first), result]))
      assert.strictEqual(e.status, 400)
      assert.deepStrictEqual(keysOf(r.threads[0]), before)
      assert.deepStrictEqual([r.requests, r.threads[0]!.turns, r.threads[0]!.busy], [1, 1, false])
    }))

  it.effect("a conversation past the context budget is refused (context_length_exceeded) and ends the episode so", () =>
    Effect.gen(function*() {
      const r = yield* recorder(yield* scriptedSampler(3), { maxContextTokens: 20 })
      const e = yield* Effect.flip(ask(r, question))
      assert.deepStrictEqual([e.status, e.code, e.param], [400, "context_length_exceeded", "messages"])
      const t = yield* Recorder.trajectory(r, { _tag: "Returned" })
      assert.strictEqual(t.termination, "context_length")
      // The refused prompt stays in the record, clipped to the budget, as a chain's would.
      assert.strictEqual(t.segments.length, 1)
    }))

  it.effect("token threads: a prompt extending the last continues it (new ids are env); none without a tokenizer", () =>
    Effect.gen(function*() {
      const sampler = yield* Sampler.makeScripted(() => [7, 8])
      const none = yield* recorder(sampler)
      const prompt = yield* Bodies.decodeCompletion({ prompt: [1, 2] })
      const e = yield* Effect.flip(Recorder.completion(none, prompt))
      assert.deepStrictEqual([e.status, e.code], [501, "unsupported"])

      const r = yield* recorder(sampler, { tokenizer })
      const first = yield* Recorder.completion(r, yield* Bodies.decodeCompletion({ prompt: [1, 2] }))
      assert.deepStrictEqual([first.turn.tokenIds, first.promptTokenIds], [[7, 8], [1, 2]])
      yield* Recorder.completion(r, yield* Bodies.decodeCompletion({ prompt: [1, 2, 7, 8, 3] }))
      assert.strictEqual(r.threads.length, 1)
      const [thread] = Recorder.threads(r)
      assert.deepStrictEqual(thread!.segments[0]!.spans.map((s) => [s.source, s.tokenIds]), [
        ["prompt", [1, 2]],
        ["policy", [7, 8]],
        ["env", [3]],
        ["policy", [7, 8]]
      ])
      const bad = yield* Effect.flip(
        Recorder.completion(r, yield* Bodies.decodeCompletion({ prompt: [tokenizer.vocabSize + 5] }))
      )
      assert.deepStrictEqual([bad.status, bad.param], [400, "prompt"])
    }))
})
