import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as ToolActor from "../../../actors/ToolActor.ts"
import * as Answer from "../../../environments/answer/Answer.ts"
import * as Calculator from "../../../environments/calculator/Calculator.ts"

const call = (id: string, name: string, args: unknown) => ({
  id,
  type: "function" as const,
  function: { name, arguments: args }
})

describe("answer", () => {
  it.effect("ends the chain with the final answer; numbers are accepted", () =>
    Effect.gen(function*() {
      const actor = yield* ToolActor.make([Calculator.calculator, Answer.answer])
      const first = yield* actor.executeTurn([call("1", "calculator", { expression: "6*7" })])
      assert.isFalse(first.terminal)
      const done = yield* actor.executeTurn([call("2", "answer", { answer: " 42 " })])
      assert.isTrue(done.terminal)
      assert.strictEqual(done.answer, "42")
      assert.strictEqual(done.messages[0]!.content, "42")
      const numeric = yield* actor.executeTurn([call("3", "answer", { answer: -9055 })])
      assert.strictEqual(numeric.answer, "-9055")
    }))

  it.effect("a malformed answer call does not end the chain", () =>
    Effect.gen(function*() {
      const actor = yield* ToolActor.make([Answer.answer])
      for (const args of [{}, { answer: null }, { answer: ["a"] }, "not json", { answer: "x", extra: 1 }]) {
        const turn = yield* actor.executeTurn([call("x", "answer", args)])
        assert.isFalse(turn.terminal)
        assert.strictEqual(turn.formatErrors, 1)
      }
    }))

  it("variants under other names", () => {
    const qa = Answer.make("answer_qa", "Answer the question.")
    assert.strictEqual(qa.name, "answer_qa")
    assert.isTrue(qa.terminal)
  })
})
