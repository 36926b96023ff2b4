import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as fc from "fast-check"
import * as ToolActor from "../../../actors/ToolActor.ts"
import * as Calculator from "../../../environments/calculator/Calculator.ts"

const calc = (expression: string): string => {
  const out = Calculator.evaluate(expression)
  return out instanceof Calculator.CalculatorError ? `error: ${out.message}` : Calculator.format(out)
}

describe("Calculator", () => {
  it("evaluates integer arithmetic exactly and prints plain integers", () => {
    assert.strictEqual(calc("99*46*89"), "405306")
    assert.strictEqual(calc("12-45*203"), "-9123")
    assert.strictEqual(calc("(12 - 45) * 203 + 14"), "-6685")
    assert.strictEqual(calc("-9055"), "-9055")
    assert.strictEqual(calc("99*99*81+4"), "793885")
    assert.strictEqual(calc("2^10"), "1024")
    assert.strictEqual(calc("2^3^2"), "512")
    assert.strictEqual(calc("7 % 3"), "1")
    assert.strictEqual(calc("5!"), "120")
    assert.strictEqual(calc("2(3+4)"), "14")
    assert.strictEqual(calc("12345678901234567890 * 10"), "123456789012345678900")
    assert.strictEqual(calc("2 ** 5"), "32")
    assert.strictEqual(calc("6 × 7 ÷ 2 − 1"), "20")
  })

  it("keeps rationals exact: fractions and terminating decimals", () => {
    assert.strictEqual(calc("1/3"), "1/3")
    assert.strictEqual(calc("1/3 + 2/3"), "1")
    assert.strictEqual(calc("0.1 + 0.2"), "0.3")
    assert.strictEqual(calc("-7/4"), "-1.75")
    assert.strictEqual(calc("2^-2"), "0.25")
    assert.strictEqual(calc("-2/6"), "-1/3")
    assert.strictEqual(calc("1e-5 * 3"), "0.00003")
    assert.strictEqual(calc("sqrt(16/9)"), "4/3")
  })

  it("falls back to floats for irrational results", () => {
    assert.strictEqual(calc("sqrt(2)"), "1.41421356237")
    assert.strictEqual(calc("2^0.5"), "1.41421356237")
    assert.strictEqual(calc("round(pi, 4)"), "3.1416")
    assert.strictEqual(calc("sin(0)"), "0")
    assert.strictEqual(calc("log(8, 2)"), "3")
    assert.strictEqual(calc("max(3, 1/2, -4)"), "3")
    assert.strictEqual(calc("abs(-5/2)"), "2.5")
  })

  it("refuses anything that is not arithmetic, with a clear message", () => {
    assert.strictEqual(calc("x = 3"), `error: "x = 3" is not arithmetic`)
    assert.strictEqual(calc("f(x) = x^2"), `error: "f(x) = x ^ 2" is not arithmetic`)
    assert.strictEqual(calc("import({}, {})"), `error: unknown function "import"`)
    assert.strictEqual(calc("evaluate(\"1+1\")"), `error: unknown function "evaluate"`)
    assert.strictEqual(calc("createUnit(\"foo\")"), `error: unknown function "createUnit"`)
    assert.strictEqual(calc("3 km"), `error: unknown name "km"`)
    assert.strictEqual(calc("[1, 2]"), `error: "[1, 2]" is not arithmetic`)
    assert.strictEqual(calc("1 == 1"), `error: the operator "==" is not allowed`)
    assert.strictEqual(calc("'text'"), "error: only numbers are allowed as literals")
    assert.strictEqual(calc("cos.constructor"), `error: "cos.constructor" is not arithmetic`)
    assert.match(calc("1 +"), /^error: invalid expression: Unexpected end of expression/)
    assert.match(calc("1,000"), /^error: invalid expression: /)
    assert.strictEqual(calc(""), "error: the expression is empty")
    assert.strictEqual(calc("sqrt(1, 2)"), "error: sqrt takes 1 argument(s)")
  })

  it("bounds input length, number sizes and work", () => {
    assert.strictEqual(calc("1+".repeat(150) + "1"), "error: the expression is longer than 200 characters")
    assert.strictEqual(calc("1/0"), "error: division by zero")
    assert.strictEqual(calc("0^-1"), "error: division by zero")
    assert.strictEqual(calc("5 % 0"), "error: modulo by zero")
    assert.strictEqual(calc("9^9^9"), "error: the result is too large")
    assert.strictEqual(calc("1e99999999"), "error: a number is too large")
    assert.strictEqual(calc("1000!"), "error: factorial needs an integer from 0 to 450")
    assert.strictEqual(calc("(-8)^(1/3)"), "error: the result is not a real number")
    assert.strictEqual(calc("sqrt(-1)"), "error: the result is not a real number")
    assert.strictEqual(calc("2^1000").length, 302)
  })

  it("agrees with BigInt arithmetic on random integer expressions (property)", () => {
    const ops = ["+", "-", "*"] as const
    fc.assert(fc.property(
      fc.array(fc.integer({ min: 1, max: 99 }), { minLength: 2, maxLength: 4 }),
      fc.array(fc.constantFrom(...ops), { minLength: 3, maxLength: 3 }),
      (xs, os) => {
        const expression = xs.map((x, i) => (i === 0 ? `${x}` : `${os[i - 1]}${x}`)).join("")
        // reference: BigInt with the usual precedence (* before + and -)
        const terms: Array<bigint> = [BigInt(xs[0]!)]
        const signs: Array<1n | -1n> = [1n]
        for (let i = 1; i < xs.length; i++) {
          const op = os[i - 1]!
          if (op === "*") terms[terms.length - 1] = terms.at(-1)! * BigInt(xs[i]!)
          else (terms.push(BigInt(xs[i]!)), signs.push(op === "+" ? 1n : -1n))
        }
        const expected = terms.reduce((acc, t, i) => acc + signs[i]! * t, 0n)
        assert.strictEqual(calc(expression), expected.toString())
      }
    ))
  })

  it.effect("the tool: results and errors as observations", () =>
    Effect.gen(function*() {
      const actor = yield* ToolActor.make([Calculator.calculator])
      const turn = yield* actor.executeTurn([
        { id: "1", type: "function", function: { name: "calculator", arguments: { expression: "99*46*89" } } },
        { id: "2", type: "function", function: { name: "calculator", arguments: { expression: "1/0" } } },
        { id: "3", type: "function", function: { name: "calculator", arguments: { expr: "1" } } }
      ])
      assert.strictEqual(turn.messages[0]!.content, "405306")
      assert.strictEqual(turn.messages[1]!.content, "Error: division by zero")
      assert.strictEqual(turn.results[1]!.error?.reason._tag, "HandlerFailure")
      assert.strictEqual(turn.results[2]!.error?.reason._tag, "DecodeError")
      assert.deepStrictEqual(actor.functionSchemas[0]!.function.parameters.required, ["expression"])
    }))
})
