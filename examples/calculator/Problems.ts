/**
 * The calculator problems: arithmetic word problems that a tiny policy solves by calling a `calculator` tool.
 *
 * Everything here is pure and seeded: the same seed gives the same train / held-out splits (with disjoint
 * expressions) and the same gold demonstrations for the SFT warm-up. Two kinds of question ({@link Kind}):
 * `mixed` has 2–3 operands in 1–99 joined by `+`, `-` or `*`, phrased with one of three templates; `sums` adds six
 * two-digit numbers, always in one shape ("What is 21+65+61+95+21+12?"), which a tiny policy learns to copy into a call
 * in a few hundred warm-up steps (`mixed` takes about a thousand). A row is AgentFly's format: a `question` plus extra
 * fields (`answer`, `expression`) that flow to the reward.
 *
 * @since 0.1.0
 */
import * as Sampling from "../../src/Sampling.ts"

/**
 * The one-line system prompt of the demo (kept short: every token of it is paid for in every sequence).
 *
 * @category constants
 * @since 0.1.0
 */
export const systemPrompt = "Use the calculator tool."

/**
 * @category models
 * @since 0.1.0
 */
export interface Row {
  readonly question: string
  /** The exact integer result, as a string (what `mathEqual` compares the final answer with). */
  readonly answer: string
  readonly expression: string
}

/**
 * A demonstration conversation in the OpenAI message shape, as `src/Dataset.ts` reads it.
 *
 * @category models
 * @since 0.1.0
 */
export interface Demonstration {
  readonly messages: ReadonlyArray<Record<string, unknown>>
}

/**
 * The seeded generator of the task (`Sampling.mulberry32`, the one the trainer uses).
 *
 * @category constructors
 * @since 0.1.0
 */
export const rng = Sampling.mulberry32

/**
 * The kinds of question: `mixed` (2–3 operands, `+ - *`, three phrasings) or `sums` (six two-digit numbers added,
 * one phrasing).
 *
 * @category models
 * @since 0.1.0
 */
export type Kind = "mixed" | "sums"

/**
 * @category constants
 * @since 0.1.0
 */
export const kinds: ReadonlyArray<Kind> = ["mixed", "sums"]

const templates = ["What is {}?", "Calculate {}.", "Compute {}, please."] as const
const operators = ["+", "-", "*"] as const

/**
 * Evaluates an expression of non-negative integers joined by `+`, `-`, `*` with the usual precedence. Returns
 * undefined for anything else (the grammar is deliberately tiny: this is the task's ground truth, not the tool).
 *
 * @category getters
 * @since 0.1.0
 */
export const evaluate = (expression: string): number | undefined => {
  if (!/^\d{1,6}([+\-*]\d{1,6}){0,5}$/.test(expression)) return undefined
  const tokens = expression.match(/\d+|[+\-*]/g)!
  let total = 0
  let sign = 1
  let product = Number(tokens[0])
  for (let i = 1; i < tokens.length; i += 2) {
    const op = tokens[i]!
    const n = Number(tokens[i + 1])
    if (op === "*") {
      product *= n
    } else {
      total += sign * product
      sign = op === "+" ? 1 : -1
      product = n
    }
  }
  return total + sign * product
}

/**
 * Draws one question of `kind` (default `mixed`) from the generator.
 *
 * @category constructors
 * @since 0.1.0
 */
export const question = (next: () => number, kind: Kind = "mixed"): Row => {
  if (kind === "sums") {
    const expression = Array.from({ length: 6 }, () => 10 + Math.floor(next() * 90)).join("+")
    return { question: `What is ${expression}?`, answer: String(evaluate(expression)!), expression }
  }
  const operands = next() < 0.5 ? 2 : 3
  let expression = String(1 + Math.floor(next() * 99))
  for (let i = 1; i < operands; i++) {
    expression += operators[Math.floor(next() * 3)]! + String(1 + Math.floor(next() * 99))
  }
  const template = templates[Math.floor(next() * templates.length)]!
  return { question: template.replace("{}", expression), answer: String(evaluate(expression)!), expression }
}

/**
 * Train, held-out, validation and demonstration splits with disjoint expressions. They are drawn in that order
 * (held-out first), so that no split for a seed depends on the sizes of the ones after it. RL rolls out on the train
 * questions, the SFT warm-up imitates the demonstration questions: RL then learns on questions the policy was never
 * shown the answer to, as it will be evaluated.
 *
 * @category constructors
 * @since 0.1.0
 */
export const splits = (options: {
  readonly seed: number
  readonly train: number
  readonly heldOut: number
  readonly validation?: number
  readonly demos?: number
  readonly kind?: Kind
}): {
  readonly train: ReadonlyArray<Row>
  readonly heldOut: ReadonlyArray<Row>
  readonly validation: ReadonlyArray<Row>
  readonly demos: ReadonlyArray<Row>
} => {
  const next = rng(options.seed)
  const seen = new Set<string>()
  const draw = (n: number): Array<Row> => {
    const out: Array<Row> = []
    while (out.length < n) {
      const row = question(next, options.kind)
      if (seen.has(row.expression)) continue
      seen.add(row.expression)
      out.push(row)
    }
    return out
  }
  const heldOut = draw(options.heldOut)
  const train = draw(options.train)
  const validation = draw(options.validation ?? 0)
  return { heldOut, train, validation, demos: draw(options.demos ?? 0) }
}

/**
 * The gold conversation for a row: system, user question, an assistant tool call, the tool's result, and the
 * final answer "The answer is R.".
 *
 * @category constructors
 * @since 0.1.0
 */
export const demonstration = (row: Row, index: number): Demonstration => {
  const id = `call_${index}`
  return {
    messages: [
      { role: "system", content: systemPrompt },
      { role: "user", content: row.question },
      {
        role: "assistant",
        content: "",
        tool_calls: [{
          id,
          type: "function",
          function: { name: "calculator", arguments: { expression: row.expression } }
        }]
      },
      { role: "tool", tool_call_id: id, name: "calculator", content: row.answer },
      { role: "assistant", content: `The answer is ${row.answer}.` }
    ]
  }
}
