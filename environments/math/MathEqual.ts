/**
 * The `mathEqual` reward: 1 when the final answer equals the reference, else 0.
 *
 * - The predicted answer is the content of the last `\boxed{…}` (balanced braces) in the final response; without
 *   one, the value after the last "answer is" / "answer:"; failing that, the last number in the text.
 * - Both sides are normalised (LaTeX `\frac`, `\dfrac`, `\sqrt`, `\left(`, `\cdot`, `\%`, `^\circ`, `\text{…}`,
 *   `$`, thousands separators, a leading `x =`, a trailing full stop), then compared as numbers with the
 *   calculator's exact evaluator (`1/2` = `0.5` = `\frac{1}{2}`; floats within a relative 1e-6), and otherwise
 *   as normalised strings.
 *
 * Metrics: `reward/mathEqual/acc` and `reward/mathEqual/extracted` (whether an answer was found at all).
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import { Reward } from "../../src/index.ts"
import * as Calculator from "../calculator/Calculator.ts"

/**
 * The content of the last `\boxed{…}` or `\fbox{…}`, braces balanced; undefined when there is none.
 *
 * @category getters
 * @since 0.1.0
 */
export const lastBoxed = (text: string): string | undefined => {
  const starts = [...text.matchAll(/\\(?:boxed|fbox)\s*\{/g)]
  for (let k = starts.length - 1; k >= 0; k--) {
    const open = starts[k]!.index! + starts[k]![0].length
    let depth = 1
    for (let i = open; i < text.length; i++) {
      if (text[i] === "{") depth++
      else if (text[i] === "}" && --depth === 0) return text.slice(open, i).trim()
    }
  }
  return undefined
}

const number = /-?\d[\d,]*(?:\.\d+)?(?:\/\d+)?/g

/**
 * The answer a response gives (see the module header for the order of attempts).
 *
 * @category getters
 * @since 0.1.0
 */
export const extractAnswer = (response: string): string | undefined => {
  const boxed = lastBoxed(response)
  if (boxed !== undefined) return boxed
  const stated = [...response.matchAll(/answer(?:\s+is|\s*:)\s*([^\n]+)/gi)].at(-1)?.[1]
  if (stated !== undefined && stated.trim() !== "") return stated.trim()
  return [...response.matchAll(number)].at(-1)?.[0]
}

/** Replaces `\cmd{a}{b}` (braces balanced, or single-character arguments) using `f(a, b)`. */
const replaceCommand = (text: string, command: string, arity: number, f: (args: Array<string>) => string) => {
  let out = text
  for (let guard = 0; guard < 50; guard++) {
    const at = out.indexOf(command)
    if (at < 0) return out
    let i = at + command.length
    const args: Array<string> = []
    while (args.length < arity) {
      while (out[i] === " ") i++
      if (out[i] === "{") {
        let depth = 1
        const start = ++i
        while (i < out.length && depth > 0) {
          if (out[i] === "{") depth++
          else if (out[i] === "}") depth--
          i++
        }
        args.push(out.slice(start, i - 1))
      } else if (i < out.length) args.push(out[i++]!)
      else return out
    }
    out = out.slice(0, at) + f(args) + out.slice(i)
  }
  return out
}

/**
 * Normalises a math answer for comparison.
 *
 * @category getters
 * @since 0.1.0
 */
export const normalize = (answer: string): string => {
  let s = answer.trim()
  s = s.replace(/\\text\{([^}]*)\}/g, "$1").replace(/\\(?:mathrm|textbf|mathbf)\{([^}]*)\}/g, "$1")
  s = s.replace(/\\[dt]frac/g, "\\frac").replace(/\\left|\\right|\\!|\\,|\\;|\\:|\\ |\$/g, "")
  s = s.replace(/\^\s*\{?\\circ\}?|°/g, "").replace(/\\?%/g, "")
  s = replaceCommand(s, "\\frac", 2, ([a, b]) => `(${a})/(${b})`)
  s = replaceCommand(s, "\\sqrt", 1, ([a]) => `sqrt(${a})`)
  s = s.replace(/\\cdot|\\times/g, "*").replace(/\\div/g, "/").replace(/\\pi/g, "pi")
  s = s.replace(/\b(\d{1,3})((?:,\d{3})+)\b/g, (_, head: string, rest: string) => head + rest.replace(/,/g, ""))
  s = s.replace(/^[a-z]\s*=\s*/i, "").replace(/\.$/, "").replace(/\s+/g, "")
  s = s.replace(/[{}]/g, (c) => (c === "{" ? "(" : ")"))
  return s
}

const numericValue = (s: string): Calculator.Value | undefined => {
  const v = Calculator.evaluate(s)
  return v instanceof Calculator.CalculatorError ? undefined : v
}

/**
 * Whether two answers are equal after normalisation, numerically or as text.
 *
 * @category getters
 * @since 0.1.0
 */
export const isEqual = (predicted: string, reference: string): boolean => {
  const a = normalize(predicted)
  const b = normalize(reference)
  if (a === b) return true
  const x = numericValue(a)
  const y = numericValue(b)
  if (x !== undefined && y !== undefined) {
    if (x._tag === "Exact" && y._tag === "Exact") return x.value.equals(y.value)
    const p = x._tag === "Exact" ? x.value.valueOf() : x.value
    const q = y._tag === "Exact" ? y.value.valueOf() : y.value
    return Math.abs(p - q) <= 1e-6 * Math.max(1, Math.abs(q))
  }
  return a.toLowerCase() === b.toLowerCase()
}

/**
 * The `mathEqual` reward. Reads the row's `answer` (a string or a number).
 *
 * @category constructors
 * @since 0.1.0
 */
export const mathEqual = Reward.make("mathEqual", {
  row: Schema.Struct({ answer: Schema.Union([Schema.String, Schema.Finite]) }),
  score: ({ response, row }) =>
    Effect.sync(() => {
      const predicted = extractAnswer(response)
      const correct = predicted !== undefined && isEqual(predicted, String(row.answer))
      return {
        reward: correct ? 1 : 0,
        metrics: { acc: correct ? 1 : 0, extracted: predicted === undefined ? 0 : 1 }
      }
    })
})
