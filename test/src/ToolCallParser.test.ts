import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import fc from "fast-check"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import type * as Message from "../../src/Message.ts"
import * as ToolCallParser from "../../src/ToolCallParser.ts"

const formats = ["hermes", "llama3", "react", "code"] as const

describe("ToolCallParser.hermes", () => {
  it("reads several calls per turn and keeps the text outside them", () => {
    const text = "Checking both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n" +
      "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"
    const result = ToolCallParser.hermes(text, { idPrefix: "t3_" })
    assert.strictEqual(result.content, "Checking both.")
    assert.deepStrictEqual(result.errors, [])
    assert.deepStrictEqual(result.toolCalls, [
      { id: "t3_0", type: "function", function: { name: "get_weather", arguments: { city: "Paris" } } },
      { id: "t3_1", type: "function", function: { name: "get_weather", arguments: { city: "Rome" } } }
    ])
  })

  it("invalid JSON, an unknown shape and an unclosed tag are typed errors; good calls survive", () => {
    const text = "<tool_call>{\"name\": \"a\", \"arguments\": {x: 1}}</tool_call>" +
      "<tool_call>{\"arguments\": {}}</tool_call>" +
      "<tool_call>{\"name\": \"ok\", \"arguments\": \"{\\\"k\\\": 2}\"}</tool_call>" +
      "<tool_call>{\"name\": \"b\", \"parameters\": [1]}</tool_call>" +
      "tail</tool_call><tool_call>{\"name\": \"cut\", \"argu"
    const result = ToolCallParser.hermes(text)
    assert.deepStrictEqual(
      result.errors.map((e) => e.reason._tag),
      ["InvalidJson", "UnknownShape", "UnknownShape", "UnknownShape", "UnclosedTag"]
    )
    assert.deepStrictEqual(result.toolCalls.map((c) => [c.function.name, c.function.arguments]), [["ok", { k: 2 }]])
    assert.strictEqual(result.content, "tail")
    assert.isTrue(result.errors.every((e) => e._tag === "ToolCallParseError" && e.message.length > 0))
    assert.include(result.errors[4]!.raw, "\"cut\"")
  })

  it("repair is opt-in: near-JSON becomes a call when asked", () => {
    const text = "<tool_call>{'name': 'f', 'arguments': {'a': True, 'b': [1, 2,],}}</tool_call>"
    assert.strictEqual(ToolCallParser.hermes(text).errors[0]?.reason._tag, "InvalidJson")
    const repaired = ToolCallParser.hermes(text, { repair: true })
    assert.deepStrictEqual(repaired.toolCalls[0]?.function, { name: "f", arguments: { a: true, b: [1, 2] } })
  })

  it("a nested open tag closes nothing: the first block is unclosed, the second parses", () => {
    const result = ToolCallParser.hermes("<tool_call>{\"name\"<tool_call>{\"name\": \"g\"}</tool_call>")
    assert.deepStrictEqual(result.errors.map((e) => e.reason._tag), ["UnclosedTag"])
    assert.deepStrictEqual(result.toolCalls[0]?.function, { name: "g", arguments: {} })
  })
})

describe("ToolCallParser.llama3", () => {
  it("reads one or several JSON calls, with or without <|python_tag|>", () => {
    const one = ToolCallParser.llama3("{\"name\": \"calc\", \"parameters\": {\"e\": \"1+1\"}}")
    assert.deepStrictEqual(one.toolCalls[0]?.function, { name: "calc", arguments: { e: "1+1" } })
    const two = ToolCallParser.llama3(
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}"
    )
    assert.deepStrictEqual(two.toolCalls.map((c) => c.function.name), ["a", "b"])
    assert.deepStrictEqual(ToolCallParser.llama3("[{\"name\": \"a\"}, {\"name\": \"b\"}]").toolCalls.length, 2)
    const plain = ToolCallParser.llama3("The answer is 4.")
    assert.deepStrictEqual(plain, { content: "The answer is 4.", toolCalls: [], errors: [] })
  })

  it("truncated JSON and trailing prose are typed errors", () => {
    const truncated = ToolCallParser.llama3("{\"name\": \"a\", \"parameters\": {\"x\": ")
    assert.strictEqual(truncated.errors[0]?.reason._tag, "UnclosedTag")
    assert.strictEqual(ToolCallParser.llama3("{\"name\": \"a\"} and then").errors[0]?.reason._tag, "UnknownShape")
    assert.strictEqual(ToolCallParser.llama3("<|python_tag|>print(1)").errors[0]?.reason._tag, "UnknownShape")
  })
})

describe("ToolCallParser.react", () => {
  it("reads Thought / Action / Action Input and repairs near-JSON input", () => {
    const text = "Thought: I need the weather.\nAction: get_weather\nAction Input: {'city': 'Paris',}\n" +
      "Observation: ignored"
    const result = ToolCallParser.react(text)
    assert.strictEqual(result.content, "Thought: I need the weather.")
    assert.deepStrictEqual(result.toolCalls[0]?.function, { name: "get_weather", arguments: { city: "Paris" } })
    const multiline = ToolCallParser.react("Action: `calc`\nInput: {\n  expression: \"2 * (3 + 4)\"\n")
    assert.deepStrictEqual(multiline.toolCalls[0]?.function, { name: "calc", arguments: { expression: "2 * (3 + 4)" } })
  })

  it("a final answer is content; a missing input, an empty name and non-object input are errors", () => {
    assert.deepStrictEqual(ToolCallParser.react("Thought: done\nFinal Answer: 4").toolCalls, [])
    assert.strictEqual(ToolCallParser.react("Action: calc\n").errors[0]?.reason._tag, "UnknownShape")
    assert.strictEqual(ToolCallParser.react("Action:\nAction Input: {}").errors[0]?.reason._tag, "UnknownShape")
    const prose = ToolCallParser.react("Action: calc\nAction Input: Paris please")
    assert.strictEqual(prose.errors[0]?.reason._tag, "InvalidJson")
    assert.strictEqual(ToolCallParser.react("Action: calc\nAction Input: [1]").errors[0]?.reason._tag, "UnknownShape")
  })
})

describe("ToolCallParser.codeBlock", () => {
  it("exactly one block is a call; none is content; two are ambiguous; unclosed is an error", () => {
    const one = ToolCallParser.codeBlock("Let me run it.\n```python\nprint(1 + 1)\n```\nDone.")
    const expected = { name: "code_interpreter", arguments: { code: "print(1 + 1)" } }
    assert.deepStrictEqual(one.toolCalls[0]?.function, expected)
    assert.strictEqual(one.content, "Let me run it.\nDone.")
    assert.deepStrictEqual(ToolCallParser.codeBlock("no code").toolCalls, [])
    const two = ToolCallParser.codeBlock("```\na\n```\n```\nb\n```")
    assert.strictEqual(two.errors[0]?.reason._tag, "AmbiguousBlocks")
    assert.strictEqual(ToolCallParser.codeBlock("```python\nprint(").errors[0]?.reason._tag, "UnclosedTag")
    const bash = ToolCallParser.codeBlock("```bash\nls\n```\n```python\nx\n```", {
      languages: ["python"],
      toolName: "run",
      argumentName: "src"
    })
    assert.deepStrictEqual(bash.toolCalls[0]?.function, { name: "run", arguments: { src: "x" } })
  })
})

// ===== Properties =====

const adversarial = fc.oneof(
  fc.string({ unit: "binary", maxLength: 300 }),
  fc.array(
    fc.oneof(
      fc.constantFrom(
        "<tool_call>", "</tool_call>", "{", "}", "[", "]", "\"", "'", ":", ",", "\\", "\n", "```", "```python\n",
        "Action:", "Action Input:", "Observation:", "<|python_tag|>", "name", "\"name\"", "arguments", "parameters",
        "True", "null", "-1e99", "__proto__", "你好", "🙂", "\u0000", "\uFFFF"
      ),
      fc.string({ maxLength: 8 })
    ),
    { maxLength: 60 }
  ).map((parts) => parts.join("")),
  fc.json().map((j) => `<tool_call>${j}</tool_call>`),
  fc.json().map((j) => `<tool_call>${j.slice(0, Math.floor(j.length / 2))}`),
  fc.integer({ min: 1, max: 3000 }).map((d) => `<tool_call>${"[".repeat(d)}${"]".repeat(d)}</tool_call>`),
  fc.integer({ min: 1, max: 3000 }).map((d) => `Action: f\nAction Input: ${"{\"a\":".repeat(d)}`)
)

describe("ToolCallParser properties", () => {
  it("never throws on random and adversarial text, and is stable (same input, same output)", () => {
    fc.assert(
      fc.property(adversarial, fc.boolean(), (text, repair) => {
        for (const format of formats) {
          const a = ToolCallParser.parse(format, text, { repair })
          const b = ToolCallParser.parse(format, text, { repair })
          assert.deepStrictEqual(a, b)
          for (const call of a.toolCalls) {
            assert.isTrue(call.function.name.length > 0)
            assert.isTrue(typeof call.function.arguments === "object" && call.function.arguments !== null)
          }
          for (const e of a.errors) assert.isAtMost(e.raw.length, 200)
        }
      }),
      { numRuns: 150, seed: 11 }
    )
  })

  it("survives huge and deeply nested input", () => {
    const deep = `<tool_call>${"[".repeat(200_000)}</tool_call>`
    for (const format of formats) {
      for (const repair of [false, true]) {
        assert.isAtLeast(ToolCallParser.parse(format, deep, { repair }).errors.length + 1, 1)
        ToolCallParser.parse(format, `Action: f\nAction Input: ${"{\"a\":".repeat(100_000)}`, { repair })
        ToolCallParser.parse(format, "x".repeat(2_000_000), { repair })
      }
    }
  })

  const argValue = fc.oneof(fc.string({ unit: "binary", maxLength: 20 }), fc.integer(), fc.boolean(), fc.constant(null))
  const calls = fc.array(
    fc.record({
      name: fc.stringMatching(/^[a-z_][a-z0-9_]{0,15}$/),
      arguments: fc.dictionary(fc.stringMatching(/^[a-z]{1,8}$/), argValue, { maxKeys: 4 })
    }),
    { minLength: 1, maxLength: 4 }
  )

  it.effect("round trip: calls rendered by the qwen2.5 / llama3 templates parse back to the same calls", () =>
    Effect.gen(function*() {
      for (const [templateName, format] of [["qwen2.5", "hermes"], ["llama3", "llama3"]] as const) {
        const template = ChatTemplate.builtinTemplate(templateName)
        const samples = fc.sample(calls, { numRuns: 100, seed: 5 })
        for (const sample of samples) {
          const toolCalls: Array<Message.ToolCall> = sample.map((c, i) => ({
            id: `call_${i}`,
            type: "function",
            function: c
          }))
          const before = yield* template.render([{ role: "user", content: "q" }], { addGenerationPrompt: true })
          const after = yield* template.render([{ role: "user", content: "q" }, {
            role: "assistant",
            content: "",
            tool_calls: toolCalls
          }])
          const turn = after.slice(before.length).split(template.endOfTurn)[0]!
          const result = ToolCallParser.parse(format, turn)
          assert.deepStrictEqual(result.errors, [])
          assert.deepStrictEqual(result.toolCalls, toolCalls)
        }
      }
    }))
})
