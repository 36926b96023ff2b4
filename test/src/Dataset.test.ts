import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Result, Schema } from "effect"
import * as fc from "fast-check"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Dataset from "../../src/Dataset.ts"

const failure = <A, R>(effect: Effect.Effect<A, Dataset.DatasetError, R>) =>
  Effect.map(Effect.result(effect), (r) => {
    assert.isTrue(Result.isFailure(r), "expected a failure")
    return (r as Result.Failure<A, Dataset.DatasetError>).failure
  })

describe("Dataset", () => {
  it.effect("reads JSONL rows, keeping extra fields for rewards and real line numbers", () =>
    Effect.gen(function*() {
      const text = `{"question":"What is 1+2?","answer":"3"}\n\n{"messages":[{"role":"user","content":"hi"}],"id":7}\n`
      const ds = yield* Dataset.parse("t.jsonl", text)
      assert.strictEqual(ds.rows.length, 2)
      assert.deepStrictEqual(ds.rows[0], { index: 0, line: 1, question: "What is 1+2?", fields: { answer: "3" } })
      assert.strictEqual(ds.rows[1]!.line, 3)
      assert.deepStrictEqual(ds.rows[1]!.fields, { id: 7 })
      assert.deepStrictEqual(Dataset.promptMessages(ds.rows[0]!, "Be brief."), [
        { role: "system", content: "Be brief." },
        { role: "user", content: "What is 1+2?" }
      ])
      assert.deepStrictEqual(Dataset.promptMessages(ds.rows[1]!, "ignored"), [{ role: "user", content: "hi" }])
    }))

  it.effect("reads a JSON array and reports the line where the bad element starts", () =>
    Effect.gen(function*() {
      const text = `[\n  {"question": "a, [b]", "answer": "1"},\n  {"question": "c"},\n  {\n    "answer": "2"\n  }\n]\n`
      const error = yield* failure(Dataset.parse("t.json", text))
      assert.strictEqual(error.reason._tag, "InvalidRow")
      assert.strictEqual(error.reason._tag === "InvalidRow" && error.reason.line, 4)
      assert.include(error.message, "t.json:4: a row needs a `question` or `messages`")
      const skipped = yield* Dataset.parse("t.json", text, { onInvalid: "skip" })
      assert.deepStrictEqual(skipped.rows.map((r) => [r.line, r.question]), [[2, "a, [b]"], [3, "c"]])
      assert.deepStrictEqual(skipped.skipped.map((s) => s.line), [4])
    }))

  it.effect("stops at the first bad JSONL row by default; skip mode reports each with its line", () =>
    Effect.gen(function*() {
      const text = [
        `{"question":"ok"}`,
        `{"question": 5}`,
        `not json`,
        `[1,2]`,
        `{"question":"   "}`,
        `{"messages":[{"role":"wizard","content":"x"}]}`,
        `{"question":"fine"}`
      ].join("\n")
      const error = yield* failure(Dataset.parse("d.jsonl", text))
      assert.strictEqual(error.reason._tag === "InvalidRow" && error.reason.line, 2)
      assert.include(error.message, "question")
      const ds = yield* Dataset.parse("d.jsonl", text, { onInvalid: "skip" })
      assert.deepStrictEqual(ds.rows.map((r) => r.line), [1, 7])
      assert.deepStrictEqual(ds.skipped.map((s) => s.line), [2, 3, 4, 5, 6])
      assert.include(ds.skipped[1]!.message, "not valid JSON")
      assert.include(ds.skipped[2]!.message, "an array")
      assert.include(ds.skipped[3]!.message, "empty")
      assert.include(ds.skipped[4]!.message, "messages")
    }))

  it.effect("demonstrations need messages with an assistant turn", () =>
    Effect.gen(function*() {
      const text = `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}\n` +
        `{"question":"q"}\n{"messages":[{"role":"user","content":"q"}]}\n`
      const ds = yield* Dataset.parse("demos.jsonl", text, { kind: "conversation", onInvalid: "skip" })
      assert.strictEqual(ds.rows.length, 1)
      assert.deepStrictEqual(ds.skipped.map((s) => s.line), [2, 3])
    }))

  it.effect(
    "tool-call arguments written as a JSON string (OpenAI's form) become the object; other strings are refused",
    () =>
      Effect.gen(function*() {
        const call = (args: unknown) =>
          JSON.stringify({
            messages: [{ role: "user", content: "q" }, {
              role: "assistant",
              content: "",
              tool_calls: [{ id: "c", type: "function", function: { name: "add", arguments: args } }]
            }]
          })
        const text = [call("{\"a\": 1, \"b\": 2}"), call({ a: 1 }), call("1 + 2"), call("[1, 2]")].join("\n") + "\n"
        const ds = yield* Dataset.parse("demos.jsonl", text, { kind: "conversation", onInvalid: "skip" })
        const args = ds.rows.map((r) =>
          (r.messages![1] as unknown as { tool_calls: Array<{ function: { arguments: unknown } }> })
            .tool_calls[0]!.function.arguments
        )
        assert.deepStrictEqual(args, [{ a: 1, b: 2 }, { a: 1 }])
        assert.deepStrictEqual(ds.skipped.map((s) => s.line), [3, 4])
        assert.include(
          ds.skipped[0]!.message,
          `the arguments of tool call "add" are a string that is not a JSON object`
        )
      })
  )

  it.effect("a truncated array, an empty file and a missing file are typed errors", () =>
    Effect.gen(function*() {
      assert.strictEqual((yield* failure(Dataset.parse("x.json", `[{"question":"a"},`))).reason._tag, "Malformed")
      assert.strictEqual((yield* failure(Dataset.parse("x.jsonl", "\n\n"))).reason._tag, "Empty")
      const missing = yield* failure(Dataset.load("/nonexistent/rows.jsonl"))
      assert.strictEqual(missing.reason._tag, "Unreadable")
      assert.strictEqual(missing.message, "/nonexistent/rows.jsonl: no such file")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a reason is caught by its tag with its facts, and an unreadable file keeps its path and cause", () =>
    Effect.gen(function*() {
      const line = yield* Dataset.parse("d.jsonl", `{"question":"a"}\n[1]`).pipe(
        Effect.as(0),
        Effect.catchReason("DatasetError", "InvalidRow", (reason) => Effect.succeed(reason.line))
      )
      assert.strictEqual(line, 2)
      const missing = yield* failure(Dataset.load("/nonexistent/rows.jsonl"))
      assert.strictEqual(missing.reason._tag, "Unreadable")
      if (missing.reason._tag !== "Unreadable") return
      assert.strictEqual(missing.reason.path, "/nonexistent/rows.jsonl")
      assert.instanceOf(missing.reason.cause, Error)
      // Written to a log or sent over the wire as JSON and read back: the same reason, facts and message.
      const codec = Schema.toCodecJson(Dataset.DatasetError)
      const back = Schema.decodeUnknownSync(codec)(JSON.parse(JSON.stringify(Schema.encodeSync(codec)(missing))))
      assert.instanceOf(back.reason, Dataset.Unreadable)
      assert.strictEqual(back.message, "/nonexistent/rows.jsonl: no such file")
      assert.strictEqual((back.reason as Dataset.Unreadable).path, "/nonexistent/rows.jsonl")
      assert.include(String((back.reason.cause as Error).message), "rows.jsonl")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a row whose fields the task's Schema refuses is named by line and field, with the value given", () =>
    Effect.gen(function*() {
      const text = `{"question": "q", "key": "red"}\n{"question": "q"}\n{"question": "q", "key": "purple"}\n`
      const fields = Schema.Struct({ key: Schema.Literals(["red", "blue"]) })
      const missing = yield* failure(Effect.flatMap(Dataset.parse("t.jsonl", text), (ds) => Dataset.refine(ds, fields)))
      assert.strictEqual(missing.message, "t.jsonl:2: key: missing")
      const skipped = yield* Effect.flatMap(
        Dataset.parse("t.jsonl", text),
        (ds) => Dataset.refine(ds, fields, { onInvalid: "skip" })
      )
      assert.deepStrictEqual(skipped.skipped.map((s) => s.message), [
        "key: missing",
        `key: Expected "red" | "blue", got "purple"`
      ])
    }))

  it.effect("loads a file from disk", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "dataset-"))
      writeFileSync(join(dir, "rows.json"), JSON.stringify([{ question: "q1" }, { question: "q2", answer: 2 }]))
      const ds = yield* Dataset.load(join(dir, "rows.json"))
      assert.deepStrictEqual(ds.rows.map((r) => r.fields), [{}, { answer: 2 }])
    }).pipe(Effect.provide(NodeServices.layer)))

  it("splitJsonArray recovers every element of any JSON array of objects, with its line", () => {
    fc.assert(fc.property(
      fc.array(fc.dictionary(fc.string({ maxLength: 5 }), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 3 })),
      fc.boolean(),
      (values, pretty) => {
        const text = JSON.stringify(values, null, pretty ? 2 : undefined)
        const pieces = Dataset.splitJsonArray(text)!
        assert.deepStrictEqual(pieces.map((p) => JSON.parse(p.text)), JSON.parse(text))
        const lines = text.split("\n")
        for (const p of pieces) assert.include(lines[p.line - 1], p.text.split("\n")[0])
      }
    ), { numRuns: 200 })
  })
})
