import { assert, describe, it } from "@effect/vitest"
import { Effect, Stream } from "effect"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as Rollout from "../../../actors/Rollout.ts"
import * as ToolActor from "../../../actors/ToolActor.ts"
import * as Calculator from "../../../environments/calculator/Calculator.ts"
import * as ToolCallFormat from "../../../environments/rewards/ToolCallFormat.ts"
import { ByteTokenizer, ChatTemplate, Sampler, Tokenizer } from "../../../src/index.ts"
import type { Message } from "../../../src/index.ts"
import { trajectoryOf } from "../../utils/trajectories.ts"

const call = (id: string, name: string, args: unknown) => ({
  id,
  type: "function" as const,
  function: { name, arguments: args }
})

/** Runs each assistant turn's calls through the real tool actor and builds the conversation. */
type Turn = { readonly content: string; readonly calls: ReadonlyArray<ReturnType<typeof call>> }
const converse = (turns: ReadonlyArray<Turn>) =>
  Effect.gen(function*() {
    const actor = yield* ToolActor.make([Calculator.calculator])
    const messages: Array<Message.Message> = [{ role: "user", content: "What is 6*7?" }]
    for (const turn of turns) {
      messages.push(turn.calls.length > 0
        ? { role: "assistant", content: turn.content, tool_calls: turn.calls }
        : { role: "assistant", content: turn.content })
      if (turn.calls.length > 0) messages.push(...(yield* actor.executeTurn(turn.calls)).messages)
    }
    return trajectoryOf(messages)
  })

const score = (trajectory: ReturnType<typeof trajectoryOf>) => ToolCallFormat.toolCallFormat.evaluate({ trajectory })

describe("toolCallFormat", () => {
  it.effect("share of tool turns whose calls parsed and validated", () =>
    Effect.gen(function*() {
      const t = yield* converse([
        { content: "", calls: [call("a", "calculator", { expression: "6*7" })] },
        { content: "", calls: [call("b", "calculator", { expr: "6*7" })] }, // invalid arguments
        { content: "", calls: [call("c", "calc", { expression: "6*7" })] }, // unknown tool
        { content: "", calls: [call("d", "calculator", { expression: "1/0" })] }, // run-time error: well formed
        { content: "The answer is 42.", calls: [] } // no tool call: not a tool turn
      ])
      const o = yield* score(t)
      assert.strictEqual(o._tag === "Scored" && o.reward, 0.5)
      assert.deepStrictEqual(o.metrics, {
        "reward/toolCallFormat/turns": 5,
        "reward/toolCallFormat/tool_turns": 4,
        "reward/toolCallFormat/well_formed": 2,
        "reward/toolCallFormat/format_errors": 2,
        "reward/toolCallFormat/reward": 0.5
      })
    }))

  it.effect("a turn whose call the parser could not extract counts as malformed", () =>
    Effect.gen(function*() {
      const t = yield* converse([
        { content: `<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"</tool_call>`, calls: [] },
        { content: "", calls: [call("a", "calculator", { expression: "6*7" })] }
      ])
      const o = yield* score(t)
      assert.strictEqual(o._tag === "Scored" && o.reward, 0.5)
    }))

  it.effect("parser feedback (an error observation answering none of the turn's calls) marks the turn", () =>
    Effect.gen(function*() {
      const good = yield* converse([{ content: "", calls: [call("a", "calculator", { expression: "6*7" })] }])
      const parseError = (id: string, detail: string): Message.Message => ({
        role: "tool",
        content: `could not parse the tool call: ${detail}`,
        tool_call_id: id,
        is_error: true
      })
      const trajectory = trajectoryOf([
        ...good.messages,
        { role: "assistant", content: "" }, // the parser stripped a broken block and found no call
        parseError("parse_error_2", "invalid JSON"),
        { role: "assistant", content: "", tool_calls: [call("b", "calculator", { expression: "1" })] },
        { role: "tool", content: "1", tool_call_id: "b" },
        parseError("parse_error_3", "unclosed tag")
      ])
      const o = yield* score(trajectory)
      assert.strictEqual(o._tag === "Scored" && o.reward, 1 / 3)
      assert.strictEqual(o.metrics["reward/toolCallFormat/format_errors"], 2)
    }))

  it.effect("one bad call spoils its turn; no tool turn at all scores 0", () =>
    Effect.gen(function*() {
      const t = yield* converse([
        { content: "", calls: [call("a", "calculator", { expression: "1+1" }), call("b", "calculator", {})] }
      ])
      assert.strictEqual(((yield* score(t)) as { reward: number }).reward, 0)
      const none = yield* converse([{ content: "42", calls: [] }])
      const o = yield* score(none)
      assert.strictEqual(o._tag === "Scored" && o.reward, 0)
      assert.strictEqual(o.metrics["reward/toolCallFormat/tool_turns"], 0)
    }))

  it.effect("a last turn cut by max tokens inside a tool call (a ParseFailed ending) is a malformed turn", () =>
    Effect.gen(function*() {
      // The real chain (Qwen2.5 template, hermes parser): a good call, then a turn that runs out inside its call.
      const tokenizer = yield* Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig(""))
      const format = ChainFormat.fromTemplate({ tokenizer, template: ChatTemplate.builtinTemplate("qwen2.5") })
      const actor = yield* ToolActor.make([Calculator.calculator])
      const sampler = Sampler.layerScripted((request) =>
        tokenizer.encode(
          tokenizer.decode(request.promptTokenIds).includes("<tool_response>")
            ? `<tool_call>\n{"name": "calculator", "argu`
            : `<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>`
        )
      )
      const events = yield* Stream.runCollect(Rollout.run({
        numChains: 1,
        maxTurns: 3,
        sampling: { temperature: 1, maxTokens: 200 },
        format,
        tools: ToolActor.toPort(actor),
        reward: () => Effect.succeed({ reward: 0, status: "scored", metrics: {} }),
        runId: "r",
        messages: [{ role: "user", content: "What is 6*7?" }]
      })).pipe(Effect.provide(sampler))
      const cut = events.flatMap((e) => (e._tag === "Trajectory" ? [e.trajectory] : []))[0]!
      assert.strictEqual(cut.errorReason, "ParseFailed")
      const o = yield* score(cut)
      // It scored 1.0: the cut turn's unreadable block is not in the message view, and nothing answered it.
      assert.strictEqual(o._tag === "Scored" && o.reward, 0.5)
      assert.strictEqual(o.metrics["reward/toolCallFormat/tool_turns"], 2)
      assert.strictEqual(o.metrics["reward/toolCallFormat/format_errors"], 1)
    }))
})
