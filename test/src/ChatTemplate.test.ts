import * as NodeServices from "@effect/platform-node/NodeServices"
import { Template } from "@huggingface/jinja"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import fc from "fast-check"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import type * as Message from "../../src/Message.ts"
import { conversation, fourTurns, tools } from "../utils/conversations.ts"
import { hasOfficialQwen25, officialQwen25, Qwen } from "../utils/qwen.ts"

const prefixes = (messages: ReadonlyArray<Message.Message>) =>
  messages.map((_, i) => messages.slice(0, i + 1)).filter((m) => m.length > 0)

layer(Qwen.layer)("ChatTemplate vs the official Qwen templates", (it) => {
  // The one test that reads a file outside the repository: skipped, under this name, only outside CI without it.
  ;(hasOfficialQwen25 ? it.effect : it.effect.skip)(
    "built-in qwen2.5 renders exactly like the official Qwen2.5-Instruct template " +
      "(needs ../shared/fixtures/qwen2.5-chat-template.jinja)",
    () =>
    Effect.gen(function*() {
      const qwen25 = yield* officialQwen25
      const ours = ChatTemplate.builtinTemplate("qwen2.5")
      for (const messages of [...prefixes(fourTurns), ...prefixes(fourTurns.slice(1))]) {
        for (const t of [tools, []]) {
          for (const addGenerationPrompt of [true, false]) {
            const options = { tools: t, addGenerationPrompt }
            assert.strictEqual(yield* ours.render(messages, options), yield* qwen25.render(messages, options))
          }
        }
      }
      const text = yield* ours.render(fourTurns, { tools })
      assert.include(text, "<|im_start|>system\nYou are a careful assistant. Use tools when they help.\n\n# Tools")
      assert.include(text, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n")
      assert.include(text, "<|im_start|>user\n<tool_response>\n46\n</tool_response><|im_end|>\n")
      const noSystem = yield* ours.render([{ role: "user", content: "hi" }], { addGenerationPrompt: true })
      assert.strictEqual(
        noSystem,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n" +
          "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
      )
    }))

  it.effect("built-in qwen3 renders exactly like Qwen3's own template, also on random conversations", () =>
    Effect.gen(function*() {
      const { qwen3 } = yield* Qwen
      const ours = ChatTemplate.builtinTemplate("qwen3")
      for (const messages of prefixes(fourTurns)) {
        for (const variables of [{}, { enable_thinking: false }]) {
          const options = { tools, addGenerationPrompt: true, variables }
          assert.strictEqual(yield* ours.render(messages, options), yield* qwen3.render(messages, options))
        }
      }
      const samples = fc.sample(conversation(true), { numRuns: 60, seed: 3 })
      for (const messages of samples) {
        assert.strictEqual(yield* ours.render(messages, { tools }), yield* qwen3.render(messages, { tools }))
      }
      assert.strictEqual(qwen3.endOfTurn, "<|im_end|>")
      assert.strictEqual(qwen3.toolCallFormat, "hermes")
    }))

  it.effect("qwen3 drops <think> blocks of turns before the last user query", () =>
    Effect.gen(function*() {
      const ours = ChatTemplate.builtinTemplate("qwen3")
      const think: ReadonlyArray<Message.Message> = [
        { role: "user", content: "a" },
        { role: "assistant", content: "<think>\nplan\n</think>\n\nanswer" }
      ]
      assert.include(yield* ours.render(think), "<think>\nplan\n</think>\n\nanswer")
      const later = yield* ours.render([...think, { role: "user", content: "b" }])
      assert.notInclude(later, "plan")
      assert.include(later, "<|im_start|>assistant\nanswer<|im_end|>")
    }))
})

describe("ChatTemplate built-ins", () => {
  it.effect("chatml: no default system prompt, Hermes tool calls, merged tool responses", () =>
    Effect.gen(function*() {
      const chatml = ChatTemplate.builtinTemplate("chatml")
      assert.strictEqual(
        yield* chatml.render([{ role: "user", content: "2+2?" }], { addGenerationPrompt: true }),
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
      )
      const text = yield* chatml.render(fourTurns.slice(1, 5), { tools })
      assert.include(text, "<|im_start|>system\n# Tools\n<tools>\n{\"type\": \"function\"")
      assert.include(text, "</tool_response>\n<tool_response>")
      assert.strictEqual(chatml.toolCallFormat, "hermes")
    }))

  it.effect("llama3: header turns, JSON calls joined by '; ', ipython results, eot_id end of turn", () =>
    Effect.gen(function*() {
      const llama = ChatTemplate.builtinTemplate("llama3")
      const text = yield* llama.render(fourTurns.slice(0, 5), { tools, addGenerationPrompt: true })
      const header = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython"
      assert.isTrue(text.startsWith(header))
      assert.include(
        text,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; " +
          "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}<|eot_id|>"
      )
      const result = "<|start_header_id|>ipython<|end_header_id|>\n\n{\"city\": \"Rome\", \"temp_c\": 25}<|eot_id|>"
      assert.include(text, result)
      assert.isTrue(text.endsWith("<|start_header_id|>assistant<|end_header_id|>\n\n"))
      assert.strictEqual(llama.endOfTurn, "<|eot_id|>")
      assert.strictEqual(llama.toolCallFormat, "llama3")
    }))

  it.effect("content parts are flattened to text; image parts are dropped", () =>
    Effect.gen(function*() {
      const chatml = ChatTemplate.builtinTemplate("chatml")
      const text = yield* chatml.render([{
        role: "user",
        content: [{ type: "text", text: "look " }, { type: "image_url", image_url: { url: "data:," } }, {
          type: "text",
          text: "here"
        }]
      }])
      assert.strictEqual(text, "<|im_start|>user\nlook here<|im_end|>\n")
    }))
})

describe("ChatTemplate native renderers", () => {
  // Values as tool arguments and tool specs carry them: nested objects and arrays, floats, unicode, null, undefined.
  const json: fc.Arbitrary<unknown> = fc.letrec<{ value: unknown }>((tie) => ({
    value: fc.oneof(
      { depthSize: "small" },
      fc.string({ unit: "grapheme" }),
      fc.integer(),
      fc.double(),
      fc.boolean(),
      fc.constant(null),
      fc.constant(undefined),
      fc.array(tie("value"), { maxLength: 3 }),
      fc.dictionary(fc.string(), tie("value"), { maxKeys: 3 })
    )
  })).value
  // Parts too: templates see them flattened to text (and tail renders read text contents as they are).
  const part = fc.oneof(
    fc.record({ type: fc.constant("text" as const), text: fc.string() }),
    fc.record({ type: fc.constant("image_url" as const), image_url: fc.record({ url: fc.string() }) })
  )
  const content = fc.oneof(
    fc.constantFrom("", "ok", "<tool_response>x</tool_response>"),
    fc.string({ unit: "grapheme" }),
    fc.array(part, { maxLength: 3 })
  )
  const call = fc.record({
    id: fc.string(),
    type: fc.constant("function" as const),
    function: fc.record({ name: fc.string(), arguments: json })
  })
  const message: fc.Arbitrary<Message.Message> = fc.oneof(
    fc.record({ role: fc.constantFrom("system" as const, "user" as const), content }),
    fc.record({ role: fc.constant("assistant" as const), content }, { requiredKeys: ["role", "content"] }),
    fc.record({ role: fc.constant("assistant" as const), content, tool_calls: fc.array(call, { maxLength: 3 }) }),
    fc.record({ role: fc.constant("tool" as const), content, tool_call_id: fc.string() })
  )
  const spec = fc.record({
    type: fc.constant("function" as const),
    function: fc.record({ name: fc.string(), description: fc.string(), parameters: json }, { requiredKeys: ["name"] })
  })

  for (const name of ["qwen2.5", "chatml"] as const) {
    it(`${name} renders natively exactly what its Jinja source renders`, () => {
      const ours = ChatTemplate.builtinTemplate(name)
      const jinja = new Template(ChatTemplate.templates[name])
      fc.assert(
        fc.property(
          fc.array(message, { maxLength: 8 }),
          fc.array(spec, { maxLength: 2 }),
          fc.boolean(),
          (messages, tools, addGenerationPrompt) => {
            const expected = jinja.render({
              ...ours.variables,
              messages: messages.map(ChatTemplate.toTemplateMessage),
              tools: tools.length > 0 ? tools : null,
              add_generation_prompt: addGenerationPrompt
            })
            assert.strictEqual(Effect.runSync(ours.render(messages, { tools, addGenerationPrompt })), expected)
          }
        ),
        { numRuns: 2000, seed: 16 }
      )
    })

    it(`${name}: the Jinja render of a conversation is its prefix's render followed by the tail`, () => {
      const ours = ChatTemplate.builtinTemplate(name)
      const jinja = new Template(ChatTemplate.templates[name])
      const render = (messages: ReadonlyArray<Message.Message>, tools: ReadonlyArray<unknown>, generation: boolean) =>
        jinja.render({
          ...ours.variables,
          messages: messages.map(ChatTemplate.toTemplateMessage),
          tools: tools.length > 0 ? tools : null,
          add_generation_prompt: generation
        })
      let tails = 0
      fc.assert(
        fc.property(
          fc.array(message, { minLength: 1, maxLength: 8 }),
          fc.array(spec, { maxLength: 2 }),
          fc.boolean(),
          (messages, tools, addGenerationPrompt) => {
            const whole = render(messages, tools, addGenerationPrompt)
            for (let from = 0; from <= messages.length + 1; from++) {
              const tail = ours.renderTail!(messages, from, addGenerationPrompt)
              const toolAfterTool = from < messages.length && from > 0 && messages[from]!.role === "tool" &&
                messages[from - 1]!.role === "tool"
              if (from === 0 || from > messages.length || toolAfterTool) {
                assert.isUndefined(tail)
                continue
              }
              if (tail === undefined) continue // a value the native renderer leaves to Jinja
              tails++
              assert.strictEqual(render(messages.slice(0, from), tools, false) + tail, whole)
            }
          }
        ),
        { numRuns: 1000, seed: 19 }
      )
      assert.isAbove(tails, 2000)
    })
  }

  it("a Jinja-only template has no tail renderer", () => {
    assert.isUndefined(ChatTemplate.builtinTemplate("qwen3").renderTail)
    assert.isUndefined(ChatTemplate.builtinTemplate("llama3").renderTail)
  })
})

describe("ChatTemplate errors", () => {
  const run = <A, E>(effect: Effect.Effect<A, E, any>) => Effect.provide(effect, NodeServices.layer)

  it.effect("bad syntax, a raising template, a folder without template and malformed conversations", () =>
    Effect.gen(function*() {
      assert.strictEqual((yield* Effect.flip(ChatTemplate.make({ source: "{% if %}" }))).reason._tag, "InvalidSyntax")
      const raising = yield* ChatTemplate.make({ source: "{{ raise_exception('no system allowed') }}" })
      const raised = yield* Effect.flip(raising.render([]))
      assert.strictEqual(raised.reason._tag, "RenderFailed")
      assert.include(raised.message, "no system allowed")
      // What the template raised is the cause, caught by the reason's tag.
      const cause = yield* raising.render([]).pipe(
        Effect.as(undefined),
        Effect.catchReason("TemplateError", "RenderFailed", (reason) => Effect.succeed(reason.cause))
      )
      assert.include((cause as Error).message, "no system allowed")
      const dir = mkdtempSync(join(tmpdir(), "agentfly-tpl-"))
      writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ eos_token: "<|im_end|>" }))
      assert.strictEqual((yield* Effect.flip(run(ChatTemplate.load(dir)))).reason._tag, "NotFound")
      for (const bad of [42, { messages: [{ role: "robot", content: "x" }] }, [{ role: "user" }], { messages: "x" }]) {
        assert.strictEqual((yield* Effect.flip(ChatTemplate.decodeConversation(bad))).reason._tag, "InvalidMessages")
      }
    }))

  it.effect("decodeConversation accepts OpenAI's null content and calls without ids", () =>
    Effect.gen(function*() {
      const { messages, tools: decodedTools } = yield* ChatTemplate.decodeConversation({
        messages: [
          { role: "user", content: "hi" },
          { role: "assistant", content: null, tool_calls: [{ function: { name: "f", arguments: { a: 1 } } }] }
        ],
        tools
      })
      assert.strictEqual(decodedTools.length, 2)
      const assistant = messages[1]!
      assert.strictEqual(assistant.role === "assistant" && assistant.tool_calls?.[0]?.id, "call_1_0")
      assert.strictEqual(assistant.content, "")
    }))

  it.effect("load reads chat_template (string or named list) and bos/eos from a model folder", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "agentfly-tpl-"))
      writeFileSync(
        join(dir, "tokenizer_config.json"),
        JSON.stringify({
          eos_token: { content: "<|im_end|>" },
          chat_template: [
            { name: "tool_use", template: "x" },
            { name: "default", template: ChatTemplate.templates.chatml }
          ]
        })
      )
      const template = yield* run(ChatTemplate.load(dir))
      assert.strictEqual(template.source, ChatTemplate.templates.chatml)
      assert.strictEqual(template.endOfTurn, "<|im_end|>")
      assert.deepStrictEqual(template.stopTokens, ["<|im_end|>"])
      // A chat_template.jinja file wins over tokenizer_config.json, as in transformers.
      writeFileSync(join(dir, "chat_template.jinja"), ChatTemplate.templates.llama3)
      const llama = yield* run(ChatTemplate.load(dir))
      assert.strictEqual(llama.endOfTurn, "<|eot_id|>")
      assert.strictEqual(llama.toolCallFormat, "llama3")
      assert.deepStrictEqual(llama.stopTokens, ["<|eot_id|>", "<|im_end|>"])
    }))
})
