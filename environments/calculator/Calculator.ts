/**
 * The `calculator` tool: safe arithmetic.
 *
 * Parsing is mathjs's (a well-kept expression parser); evaluation is ours: we walk the parsed tree and allow
 * only numbers, `+ - * / ^ %` (and `mod`), unary minus/plus, factorial, parentheses, the constants `pi` and
 * `e`, and a short list of functions ({@link functions}). Nothing is ever compiled or `evaluate`d by mathjs, so
 * assignments, function definitions, `import`, units, matrices, strings and every other node type are refused
 * with a clear message, as mathjs's security notes recommend.
 *
 * Arithmetic is exact on rationals (so `99*46*89` prints `405306`, `1/3` prints `1/3` and `0.1+0.2` prints
 * `0.3`); irrational operations (`sqrt(2)`, `2^0.5`, `sin`) fall back to 64-bit floats printed with 12
 * significant digits. Input length, number sizes and result sizes are bounded, so no expression can hang or
 * exhaust memory.
 *
 * @since 0.1.0
 */
import { Effect, Result, Schema } from "effect"
import type { Fraction, MathNode } from "mathjs"
import { createRequire } from "node:module"
import { Tool } from "../../src/index.ts"

// ===== Models =====

/**
 * A value: an exact rational, or a float once an irrational operation happened.
 *
 * @category models
 * @since 0.1.0
 */
export type Value =
  | { readonly _tag: "Exact"; readonly value: Fraction }
  | { readonly _tag: "Float"; readonly value: number }

/**
 * A refused or failed expression; `message` is what the model reads.
 *
 * @category errors
 * @since 0.1.0
 */
export class CalculatorError extends Schema.TaggedError<CalculatorError>()("CalculatorError", {
  expression: Schema.String,
  message: Schema.String
}) {}

/**
 * Limits of one evaluation.
 *
 * @category models
 * @since 0.1.0
 */
export interface Limits {
  /** Longest accepted expression, in characters (default 200). */
  readonly maxLength: number
  /** Largest decimal exponent of a literal or exact result (default 1000 digits). */
  readonly maxDigits: number
}

const defaultLimits: Limits = { maxLength: 200, maxDigits: 1000 }

// ===== Evaluation =====

// One mathjs instance, used only to parse. BigNumber literals keep decimals exact until we convert them.
// mathjs's single-file bundle (an export of the same package, same version): the package entry loads ≈ 1,000
// modules, ≈ 60–90 MB of RSS that a training process kept for its whole life; the bundle compiles
// lazily (≈ 15 MB).
const { all, create } = createRequire(import.meta.url)("mathjs/lib/browser/math.js") as typeof import("mathjs")
const math = create(all)
// Set after creation: the bundle's `create` ignores a config argument (literals would parse as plain numbers).
math.config({ number: "BigNumber", precision: 64 })

const exact = (value: Fraction): Value => ({ _tag: "Exact", value })
const float = (value: number): Value => ({ _tag: "Float", value })
const toNumber = (v: Value): number => (v._tag === "Exact" ? v.value.valueOf() : v.value)
const isInteger = (v: Value): boolean => (v._tag === "Exact" ? v.value.d === 1n : Number.isInteger(v.value))

/** Thrown inside the walk and turned into a `CalculatorError` at the boundary (never escapes this module). */
class Refused {
  readonly message: string
  constructor(message: string) {
    this.message = message
  }
}

const digits = (n: bigint): number => (n < 0n ? -n : n).toString().length

const checkSize = (v: Value, limits: Limits): Value => {
  if (v._tag === "Float") {
    if (Number.isNaN(v.value)) throw new Refused("the result is not a real number")
    if (!Number.isFinite(v.value)) throw new Refused("the result is too large")
    return v
  }
  if (digits(v.value.n) > limits.maxDigits || digits(v.value.d) > limits.maxDigits) {
    throw new Refused("the result is too large")
  }
  return v
}

const bigSqrt = (n: bigint): bigint => {
  if (n < 2n) return n
  let x = BigInt(Math.floor(Math.sqrt(Number(n))))
  while (x * x > n) x--
  while ((x + 1n) * (x + 1n) <= n) x++
  return x
}

/**
 * An allowed function: its arity range and how it applies.
 *
 * @category models
 * @since 0.1.0
 */
export interface Fn {
  readonly arity: readonly [number, number]
  readonly apply: (args: ReadonlyArray<Value>) => Value
}

const unary = (f: (x: number) => number) => (args: ReadonlyArray<Value>) => float(f(toNumber(args[0]!)))

/**
 * The allowed functions and their arities.
 *
 * @category models
 * @since 0.1.0
 */
export const functions: Readonly<Record<string, Fn>> = {
  sqrt: {
    arity: [1, 1],
    apply: ([x]) => {
      if (x!._tag === "Exact" && x!.value.s >= 0n) {
        const rn = bigSqrt(x!.value.n)
        const rd = bigSqrt(x!.value.d)
        if (rn * rn === x!.value.n && rd * rd === x!.value.d) return exact(math.fraction(rn, rd))
      }
      return float(Math.sqrt(toNumber(x!)))
    }
  },
  abs: { arity: [1, 1], apply: ([x]) => (x!._tag === "Exact" ? exact(x!.value.abs()) : float(Math.abs(x!.value))) },
  round: {
    arity: [1, 2],
    apply: ([x, places]) => {
      const p = places === undefined ? 0 : toNumber(places)
      if (!Number.isInteger(p) || p < 0 || p > 15) throw new Refused("round(x, n) needs an integer n from 0 to 15")
      return x!._tag === "Exact" ? exact(x!.value.round(p)) : float(Number(x!.value.toFixed(p)))
    }
  },
  floor: {
    arity: [1, 1],
    apply: ([x]) => (x!._tag === "Exact" ? exact(x!.value.floor()) : float(Math.floor(x!.value)))
  },
  ceil: { arity: [1, 1], apply: ([x]) => (x!._tag === "Exact" ? exact(x!.value.ceil()) : float(Math.ceil(x!.value))) },
  exp: { arity: [1, 1], apply: unary(Math.exp) },
  log: {
    arity: [1, 2],
    apply: ([x, base]) => float(Math.log(toNumber(x!)) / (base === undefined ? 1 : Math.log(toNumber(base))))
  },
  ln: { arity: [1, 1], apply: unary(Math.log) },
  log10: { arity: [1, 1], apply: unary(Math.log10) },
  log2: { arity: [1, 1], apply: unary(Math.log2) },
  sin: { arity: [1, 1], apply: unary(Math.sin) },
  cos: { arity: [1, 1], apply: unary(Math.cos) },
  tan: { arity: [1, 1], apply: unary(Math.tan) },
  min: { arity: [1, 64], apply: (args) => args.reduce((a, b) => (compare(a, b) <= 0 ? a : b)) },
  max: { arity: [1, 64], apply: (args) => args.reduce((a, b) => (compare(a, b) >= 0 ? a : b)) }
}

const compare = (a: Value, b: Value): number =>
  a._tag === "Exact" && b._tag === "Exact" ? a.value.compare(b.value) : toNumber(a) - toNumber(b)

const constants: Readonly<Record<string, number>> = { pi: Math.PI, e: Math.E }

const arith = (
  a: Value,
  b: Value,
  exactOp: (x: Fraction, y: Fraction) => Fraction,
  floatOp: (x: number, y: number) => number
): Value =>
  a._tag === "Exact" && b._tag === "Exact"
    ? exact(exactOp(a.value, b.value))
    : float(floatOp(toNumber(a), toNumber(b)))

const divide = (a: Value, b: Value): Value => {
  if (toNumber(b) === 0 && (b._tag === "Exact" || a._tag === "Exact")) throw new Refused("division by zero")
  return arith(a, b, (x, y) => x.div(y), (x, y) => x / y)
}

const power = (a: Value, b: Value, limits: Limits): Value => {
  if (a._tag === "Exact" && b._tag === "Exact" && b.value.d === 1n) {
    const e = b.value.s * b.value.n
    if (a.value.n === 0n && e < 0n) throw new Refused("division by zero")
    // Exact powers only while the result stays within the digit limit; beyond it the float path decides.
    const size = Math.max(digits(a.value.n), digits(a.value.d)) * Math.abs(Number(e))
    if (size <= limits.maxDigits + 1 || (a.value.n <= 1n && a.value.d === 1n)) {
      return exact(a.value.pow(math.fraction(e, 1n)))
    }
  }
  return float(Math.pow(toNumber(a), toNumber(b)))
}

const factorial = (v: Value): Value => {
  if (!isInteger(v) || toNumber(v) < 0 || toNumber(v) > 450) {
    throw new Refused("factorial needs an integer from 0 to 450")
  }
  let out = 1n
  for (let i = 2n; i <= BigInt(toNumber(v)); i++) out *= i
  return exact(math.fraction(out, 1n))
}

const literal = (value: unknown, limits: Limits): Value => {
  // mathjs parses literals as Decimal (BigNumber) because of the instance's config.
  const decimal = value as { readonly e: number; readonly toFixed: () => string; readonly isBigNumber?: boolean }
  if (decimal === null || typeof decimal !== "object" || decimal.isBigNumber !== true) {
    throw new Refused("only numbers are allowed as literals")
  }
  if (Math.abs(decimal.e) > limits.maxDigits) throw new Refused("a number is too large")
  const text = decimal.toFixed()
  const negative = text.startsWith("-")
  const [whole, fraction = ""] = (negative ? text.slice(1) : text).split(".")
  const n = BigInt(whole! + fraction)
  return exact(math.fraction(negative ? -n : n, 10n ** BigInt(fraction.length)))
}

const walk = (node: MathNode, limits: Limits): Value => {
  const any = node as MathNode & {
    readonly op?: string
    readonly fn?: string | { readonly name?: string }
    readonly args?: ReadonlyArray<MathNode>
    readonly content?: MathNode
    readonly value?: unknown
    readonly name?: string
  }
  switch (node.type) {
    case "ConstantNode":
      return literal(any.value, limits)
    case "ParenthesisNode":
      return walk(any.content!, limits)
    case "SymbolNode": {
      const c = constants[any.name!]
      if (c === undefined) throw new Refused(`unknown name "${any.name}"`)
      return float(c)
    }
    case "OperatorNode": {
      const args = any.args!.map((a) => walk(a, limits))
      const [a, b] = args
      let out: Value
      switch (`${any.fn as string}/${args.length}`) {
        case "add/2":
          out = arith(a!, b!, (x, y) => x.add(y), (x, y) => x + y)
          break
        case "subtract/2":
          out = arith(a!, b!, (x, y) => x.sub(y), (x, y) => x - y)
          break
        case "multiply/2":
          out = arith(a!, b!, (x, y) => x.mul(y), (x, y) => x * y)
          break
        case "divide/2":
          out = divide(a!, b!)
          break
        case "mod/2":
          if (toNumber(b!) === 0) throw new Refused("modulo by zero")
          out = arith(a!, b!, (x, y) => x.mod(y), (x, y) => x % y)
          break
        case "pow/2":
          out = power(a!, b!, limits)
          break
        case "unaryMinus/1":
          out = a!._tag === "Exact" ? exact(a!.value.neg()) : float(-a!.value)
          break
        case "unaryPlus/1":
          out = a!
          break
        case "factorial/1":
          out = factorial(a!)
          break
        default:
          throw new Refused(`the operator "${any.op}" is not allowed`)
      }
      return checkSize(out, limits)
    }
    case "FunctionNode": {
      const name = typeof any.fn === "string" ? any.fn : any.fn?.name
      const f = name === undefined ? undefined : functions[name]
      if (f === undefined) throw new Refused(`unknown function "${name ?? node.toString()}"`)
      const args = any.args!.map((a) => walk(a, limits))
      if (args.length < f.arity[0] || args.length > f.arity[1]) {
        const [lo, hi] = f.arity
        throw new Refused(`${name} takes ${lo === hi ? lo : `${lo} to ${hi}`} argument(s)`)
      }
      return checkSize(f.apply(args), limits)
    }
    default:
      throw new Refused(`"${node.toString()}" is not arithmetic`)
  }
}

const normalise = (expression: string): string =>
  expression.replace(/\*\*/g, "^").replace(/[×·]/g, "*").replace(/÷/g, "/").replace(/[−–]/g, "-")

/**
 * Evaluates an arithmetic expression, or explains why not.
 *
 * @category constructors
 * @since 0.1.0
 */
export const evaluate = (expression: string, limits: Limits = defaultLimits): Value | CalculatorError => {
  const refuse = (message: string) => new CalculatorError({ expression, message })
  if (expression.length > limits.maxLength) {
    return refuse(`the expression is longer than ${limits.maxLength} characters`)
  }
  if (expression.trim() === "") return refuse("the expression is empty")
  const parsed = Result.try({
    try: () => math.parse(normalise(expression)),
    catch: (e) => refuse(`invalid expression: ${(e as Error).message}`)
  })
  if (Result.isFailure(parsed)) return parsed.failure
  const value = Result.try({
    try: () => walk(parsed.success, limits),
    // `Refused` comes from the walk; fraction.js reports its own arithmetic errors (e.g. "Division by Zero").
    catch: (e) => refuse(e instanceof Refused ? e.message : String((e as Error).message).toLowerCase())
  })
  return Result.isFailure(value) ? value.failure : value.success
}

/**
 * Prints a value: integers plainly (`-9055`), terminating decimals as decimals (`0.3`), other rationals as
 * `n/d`, floats with 12 significant digits.
 *
 * @category getters
 * @since 0.1.0
 */
export const format = (v: Value): string => {
  if (v._tag === "Float") {
    if (Number.isInteger(v.value) && Math.abs(v.value) < 1e15) return v.value.toFixed(0)
    return String(Number(v.value.toPrecision(12)))
  }
  const { s, n, d } = v.value
  const sign = s < 0n && n !== 0n ? "-" : ""
  if (d === 1n) return sign + n.toString()
  let rest = d
  let twos = 0
  let fives = 0
  while (rest % 2n === 0n) (rest /= 2n, twos++)
  while (rest % 5n === 0n) (rest /= 5n, fives++)
  if (rest === 1n) {
    const places = Math.max(twos, fives)
    const scaled = (n * 10n ** BigInt(places)) / d
    const text = scaled.toString().padStart(places + 1, "0")
    return `${sign}${text.slice(0, -places)}.${text.slice(-places)}`
  }
  return `${sign}${n}/${d}`
}

// ===== The tool =====

/**
 * The `calculator` tool: `{ expression }` → the value as text (see {@link format}); a bad expression is a
 * `CalculatorError` the model reads.
 *
 * @category constructors
 * @since 0.1.0
 */
export const calculator = Tool.make("calculator", {
  description: "Evaluate an arithmetic expression with + - * / ^ % ! and parentheses, e.g. (12 - 45) * 203. " +
    "Functions: sqrt, abs, round, floor, ceil, exp, log, ln, log10, log2, sin, cos, tan, min, max; constants pi, e.",
  parameters: Schema.Struct({
    expression: Schema.String.annotate({ description: "The expression to evaluate, e.g. 99*46*89" })
  }),
  success: Schema.String,
  failure: CalculatorError,
  handler: ({ expression }) =>
    Effect.suspend(() => {
      const out = evaluate(expression)
      return out instanceof CalculatorError ? Effect.fail(out) : Effect.succeed(format(out))
    })
})
