import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Qa from "../../../environments/rewards/Qa.ts"
import { answered } from "../../utils/trajectories.ts"

const run = (reward: typeof Qa.f1, response: string, answer: unknown) =>
  Effect.map(
    reward.evaluate({ trajectory: answered(response, { answer }) }),
    (o) => (o._tag === "Scored" ? o : undefined)
  )

describe("QA rewards", () => {
  it("normalises like SQuAD", () => {
    assert.strictEqual(Qa.normalizeAnswer("The  Eiffel-Tower!"), "eiffel tower")
    assert.strictEqual(Qa.normalizeAnswer("An apple, a day"), "apple day")
    assert.strictEqual(Qa.normalizeAnswer("¿Qué?"), "qué")
  })

  it("token F1 against a reference loop", () => {
    assert.deepStrictEqual(Qa.tokenF1("the cat sat", "a cat sat down"), { f1: 0.8, precision: 1, recall: 2 / 3 })
    assert.deepStrictEqual(Qa.tokenF1("cat cat cat", "cat"), { f1: 0.5, precision: 1 / 3, recall: 1 })
    assert.deepStrictEqual(Qa.tokenF1("", ""), { f1: 1, precision: 1, recall: 1 })
    assert.deepStrictEqual(Qa.tokenF1("the", "dog"), { f1: 0, precision: 0, recall: 0 })
  })

  it.effect("exactMatch: any reference, normalised; <answer> tags preferred", () =>
    Effect.gen(function*() {
      assert.strictEqual((yield* run(Qa.exactMatch, "The Eiffel Tower.", "eiffel tower"))?.reward, 1)
      assert.strictEqual((yield* run(Qa.exactMatch, "Paris", ["Lyon", "paris"]))?.reward, 1)
      const tagged = "I think <answer>x</answer> <answer>Paris</answer>"
      assert.strictEqual((yield* run(Qa.exactMatch, tagged, "Paris"))?.reward, 1)
      assert.strictEqual((yield* run(Qa.exactMatch, "Paris, France", "Paris"))?.reward, 0)
      assert.strictEqual((yield* run(Qa.exactMatch, "", "Paris"))?.reward, 0)
    }))

  it.effect("f1: best over references with em/precision/recall metrics", () =>
    Effect.gen(function*() {
      const o = yield* run(Qa.f1, "Paris, France", ["Lyon", "Paris"])
      assert.closeTo(o!.reward, 2 / 3, 1e-12)
      assert.strictEqual(o!.metrics["reward/f1/em"], 0)
      assert.strictEqual(o!.metrics["reward/f1/precision"], 0.5)
      assert.strictEqual(o!.metrics["reward/f1/recall"], 1)
      assert.strictEqual((yield* run(Qa.f1, "x".repeat(100_000), "x"))?.reward, 0)
    }))

  it.effect("rows without references are InvalidRow errors", () =>
    Effect.gen(function*() {
      for (const answer of [undefined, [], 42]) {
        const trajectory = answered("x", answer === undefined ? {} : { answer })
        const e = yield* Effect.flip(Qa.f1.evaluate({ trajectory }))
        assert.strictEqual(e.reason._tag, "InvalidRow")
      }
    }))
})
