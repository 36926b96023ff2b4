/**
 * Rollouts through the real Qwen tokenizer and the Qwen2.5 chat template, with the hermes tool-call parser and the
 * real ToolActor: the scripted sampler answers with token ids exactly as a Qwen model would write them.
 */
import { assert, layer } from "@effect/vitest"
import { Effect, Schedule, Schema, Stream } from "effect"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as Rollout from "../../actors/Rollout.ts"
import * as ToolActor from "../../actors/ToolActor.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Sampler from "../../src/Sampler.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import { Qwen } from "../utils/qwen.ts"
import { Add, Answer } from "../utils/arithmeticTools.ts"


const call = (name: string, args: string) => `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`

layer(Qwen.layer)("ChainFormat.fromTemplate with the real Qwen tokenizer", (it) => {
  const setup = Effect.gen(function*() {
    const { tokenizer } = yield* Qwen
    const format = ChainFormat.fromTemplate({ tokenizer, template: ChatTemplate.builtinTemplate("qwen2.5") })
    const imEnd = tokenizer.tokenToId("<|im_end|>")!
    const turnIds = (text: string) => [...tokenizer.encode(text), imEnd]
    /** Plays `turns` in order, reading the turn index off the prompt (one assistant header per turn so far). */
    const sampler = (turns: ReadonlyArray<string>) =>
      Sampler.layerScripted((request) => {
        const prompt = tokenizer.decode(request.promptTokenIds)
        const index = prompt.split("<|im_start|>assistant").length - 2
        return turnIds(turns[index] ?? "I am done.")
      }, { policyVersion: 4 })
    const tools = ToolActor.toPort(yield* ToolActor.make([Add, Answer]))
    return { tokenizer, format, imEnd, turnIds, sampler, tools }
  })

  it.effect("multi-turn tool use: sampled ids verbatim, observations tokenized, parallel calls parsed", () =>
    Effect.gen(function*() {
      const { format, imEnd, sampler, tokenizer, tools, turnIds } = yield* setup
      const turns = [
        `I will add.\n${call("add", `{"a": 1, "b": 2}`)}\n${call("add", `{"a": 3, "b": 4}`)}`,
        call("answer", `{"value": 10}`)
      ]
      const events = yield* Stream.runCollect(Rollout.run({
        messages: [{ role: "user", content: "What is 1+2 plus 3+4?" }],
        numChains: 2,
        maxTurns: 4,
        sampling: { temperature: 1, maxTokens: 256 },
        format,
        tools,
        runId: "q"
      })).pipe(Effect.provide(sampler(turns)))
      const group = events.find((e) => e._tag === "Group")
      assert.isTrue(group?._tag === "Group")
      const [t] = group!._tag === "Group" ? group!.group.trajectories : []
      assert.strictEqual(t!.termination, "answer")
      assert.isTrue(Schema.is(Trajectory.Trajectory)(t))
      const assistant = t!.messages[1]!
      assert.strictEqual(assistant.role, "assistant")
      assert.deepStrictEqual(
        assistant.role === "assistant" ? assistant.tool_calls?.map((c) => [c.id, c.function.arguments]) : [],
        [["call_0_0", { a: 1, b: 2 }], ["call_0_1", { a: 3, b: 4 }]]
      )
      assert.deepStrictEqual(t!.messages.filter((m) => m.role === "tool").map((m) => m.content), ["3", "7", "10"])
      const [segment] = t!.segments
      const policy = segment!.spans.filter((s) => s.source === "policy")
      assert.deepStrictEqual(policy.map((s) => s.tokenIds), turns.map(turnIds))
      assert.isTrue(policy.every((s) => s.policyVersion === 4 && s.logprobs!.length === s.tokenIds.length))
      assert.isTrue(policy.every((s) => s.tokenIds.at(-1) === imEnd), "the sampled end-of-turn token is trained on")
      const text = tokenizer.decode(Array.from(Trajectory.tokenIds(segment!)))
      assert.include(text, "<tool_response>\n3\n</tool_response>\n<tool_response>\n7\n</tool_response>")
      assert.include(text, `${turns[1]}<|im_end|>`)
      // The terminal tool's observation is the final response; the trajectory ends with it.
      assert.isTrue(text.endsWith("<tool_response>\n10\n</tool_response><|im_end|>\n<|im_start|>assistant\n"))
      assert.strictEqual(Trajectory.finalResponse(t!), "10")
      const tool = segment!.spans.filter((s) => s.source === "tool").map((s) => tokenizer.decode(s.tokenIds))
      assert.isTrue(tool.some((s) => s.includes("3")))
      const mask = Trajectory.lossMask(segment!)
      assert.strictEqual(mask.reduce((a, b) => a + b, 0), turns.map(turnIds).flat().length)
    }))

  it.effect("a malformed tool call is fed back to the model; an unknown tool is an error observation", () =>
    Effect.gen(function*() {
      const { format, sampler, tools } = yield* setup
      const turns = [
        `<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>`,
        call("subtract", `{"a": 1}`),
        call("answer", `{"value": 3}`)
      ]
      const [event] = yield* Stream.runCollect(Rollout.run({
        messages: [{ role: "user", content: "1+2?" }],
        numChains: 1,
        maxTurns: 5,
        sampling: { temperature: 1, maxTokens: 256 },
        format,
        tools,
        retry: Schedule.recurs(0)
      })).pipe(Effect.provide(sampler(turns)))
      const t = event!._tag === "Trajectory" ? event!.trajectory : undefined
      assert.strictEqual(t!.termination, "answer")
      const observations = t!.messages.filter((m) => m.role === "tool")
      assert.strictEqual(observations.length, 3)
      assert.isTrue(observations.slice(0, 2).every((m) => m.role === "tool" && m.is_error === true))
      assert.include(String(observations[0]!.content), "JSON")
      assert.include(String(observations[1]!.content), "subtract")
    }))

  it.effect("the context budget caps max tokens of a Qwen turn", () =>
    Effect.gen(function*() {
      const { format, sampler, tools } = yield* setup
      const [event] = yield* Stream.runCollect(Rollout.run({
        messages: [{ role: "user", content: "Write a long story." }],
        numChains: 1,
        maxTurns: 5,
        maxContextTokens: 400,
        sampling: { temperature: 1, maxTokens: 1000 },
        format,
        tools
      })).pipe(Effect.provide(sampler(["once upon a time ".repeat(200)])))
      const t = event!._tag === "Trajectory" ? event!.trajectory : undefined
      assert.strictEqual(t!.termination, "context_length")
      // The prompt (with the tool list) is 310 tokens: the turn got the remaining 90 and was cut there.
      assert.strictEqual(Trajectory.segmentLength(t!.segments[0]!), 400)
      const policy = t!.segments[0]!.spans.filter((s) => s.source === "policy")
      assert.deepStrictEqual(policy.map((s) => s.tokenIds.length), [90])
    }))
})

layer(Qwen.layer)("Rollout.runChat (black-box chat API)", (it) => {
  it.effect("renders the API's replies into the trajectory and marks it not trainable", () =>
    Effect.gen(function*() {
      const { tokenizer } = yield* Qwen
      const format = ChainFormat.fromTemplate({ tokenizer, template: ChatTemplate.builtinTemplate("qwen2.5") })
      const tools = ToolActor.toPort(yield* ToolActor.make([Add, Answer]))
      const seen: Array<Sampler.ChatRequest> = []
      const chat = Sampler.ChatSampler.of({
        complete: (request) =>
          Effect.sync(() => {
            seen.push(request)
            const answered = request.messages.some((m) => m.role === "tool")
            return {
              content: answered ? "" : "Adding.",
              toolCalls: [{
                id: `c${seen.length}`,
                type: "function" as const,
                function: answered
                  ? { name: "answer", arguments: { value: 3 } }
                  : { name: "add", arguments: { a: 1, b: 2 } }
              }],
              finishReason: "stop" as const
            }
          })
      })
      const [event] = yield* Stream.runCollect(Rollout.runChat({
        messages: [{ role: "user", content: "1+2?" }],
        numChains: 1,
        maxTurns: 4,
        sampling: { temperature: 0, maxTokens: 64 },
        format,
        tools
      })).pipe(Effect.provideService(Sampler.ChatSampler, chat))
      const t = event!._tag === "Trajectory" ? event!.trajectory : undefined
      assert.strictEqual(t!.termination, "answer")
      assert.isFalse(t!.trainable)
      assert.deepStrictEqual(t!.messages.filter((m) => m.role === "tool").map((m) => m.content), ["3", "3"])
      assert.strictEqual(seen.length, 2)
      assert.strictEqual(seen[0]!.tools!.length, 2, "the tool schemas go to the API")
      const policy = t!.segments[0]!.spans.filter((s) => s.source === "policy")
      assert.strictEqual(policy.length, 2)
      assert.isTrue(policy.every((s) => s.logprobs === undefined))
      assert.include(tokenizer.decode(policy[0]!.tokenIds), "<tool_call>")
    }))
})
