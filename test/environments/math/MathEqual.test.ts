import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as MathEqual from "../../../environments/math/MathEqual.ts"
import { answered } from "../../utils/trajectories.ts"

const score = (response: string, answer: string | number) =>
  Effect.map(MathEqual.mathEqual.evaluate({ trajectory: answered(response, { answer }) }), (o) =>
    o._tag === "Scored" ? o.reward : NaN)

describe("mathEqual", () => {
  it("extracts the last boxed answer with balanced braces, else the stated answer, else the last number", () => {
    assert.strictEqual(MathEqual.lastBoxed("so \\boxed{1} then \\boxed{\\frac{1}{2}} done"), "\\frac{1}{2}")
    assert.strictEqual(MathEqual.lastBoxed("\\boxed{x^{2}+1}"), "x^{2}+1")
    assert.isUndefined(MathEqual.lastBoxed("\\boxed{unclosed"))
    assert.strictEqual(MathEqual.extractAnswer("The answer is -9055."), "-9055.")
    assert.strictEqual(MathEqual.extractAnswer("We get 3 apples and 4 pears, 7 in all"), "7")
    assert.isUndefined(MathEqual.extractAnswer("no idea"))
  })

  it("normalises LaTeX", () => {
    assert.strictEqual(MathEqual.normalize("\\dfrac{3}{4}"), "(3)/(4)")
    assert.strictEqual(MathEqual.normalize("\\frac12"), "(1)/(2)")
    assert.strictEqual(MathEqual.normalize("$1,234,567$"), "1234567")
    assert.strictEqual(MathEqual.normalize("x = \\left( 2 \\right)"), "(2)")
    assert.strictEqual(MathEqual.normalize("90^\\circ"), "90")
    assert.strictEqual(MathEqual.normalize("50\\%"), "50")
    assert.strictEqual(MathEqual.normalize("\\text{12 } \\sqrt{4}"), "12sqrt(4)")
  })

  it.effect("numbers, fractions, boxed answers and LaTeX compare by value", () =>
    Effect.gen(function*() {
      assert.strictEqual(yield* score("\\boxed{42}", "42"), 1)
      assert.strictEqual(yield* score("The answer is -9055.", -9055), 1)
      assert.strictEqual(yield* score("The answer is 799425.", "799425"), 1)
      assert.strictEqual(yield* score("\\boxed{\\frac{1}{2}}", "0.5"), 1)
      assert.strictEqual(yield* score("\\boxed{\\dfrac{2}{4}}", "1/2"), 1)
      assert.strictEqual(yield* score("\\boxed{1,000}", "1000"), 1)
      assert.strictEqual(yield* score("so $x = 3$ and \\boxed{3.0}", "3"), 1)
      assert.strictEqual(yield* score("\\boxed{\\sqrt{2}}", "1.41421356"), 1)
      assert.strictEqual(yield* score("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"), 1)
      assert.strictEqual(yield* score("\\boxed{\\text{(B)}}", "(b)"), 1)
    }))

  it.effect("wrong, missing and adversarial answers score 0 without failing", () =>
    Effect.gen(function*() {
      assert.strictEqual(yield* score("\\boxed{41}", "42"), 0)
      assert.strictEqual(yield* score("\\boxed{1/3}", "0.333"), 0)
      assert.strictEqual(yield* score("I don't know", "42"), 0)
      assert.strictEqual(yield* score("", "42"), 0)
      assert.strictEqual(yield* score("\\boxed{9^9^9^9}", "1"), 0)
      assert.strictEqual(yield* score("\\boxed{import(\"fs\")}", "1"), 0)
      assert.strictEqual(yield* score("\\boxed{" + "(".repeat(5000) + "}", "1"), 0)
      assert.strictEqual(yield* score("\\boxed{42} \\boxed{43}", "42"), 0) // the last box counts
      const metrics = yield* MathEqual.mathEqual.evaluate({ trajectory: answered("nothing", { answer: "1" }) })
      assert.strictEqual(metrics.metrics["reward/mathEqual/extracted"], 0)
    }))

  it.effect("a row without an answer is an InvalidRow error naming the field", () =>
    Effect.gen(function*() {
      const trajectory = answered("\\boxed{1}", { solution: 1 })
      const e = yield* Effect.flip(MathEqual.mathEqual.evaluate({ trajectory }))
      assert.strictEqual(e.reason._tag, "InvalidRow")
      assert.include(e.message, `["answer"]`)
    }))
})
