/**
 * Writes the python task's data files: `train.jsonl` (RL prompts), `heldout.jsonl`, `validation.jsonl` (for the
 * warm-up's stopping check) and `demos.jsonl` (gold conversations for the SFT warm-up), each on lists of its own.
 * Seeded: the same options always write the same bytes.
 *
 *   npx tsx examples/python/generate.ts [OUT_DIR] [SEED] [NOISE]
 *
 * **The task: the sum of a list of 8 two-digit numbers**, "What is the sum of [12,45,67,89,23,54,76,98]?", answered
 * by running `print(sum([12,45,67,89,23,54,76,98]))` in the sandbox and reading its output back ("The answer is
 * 464."). Why this one (and not counting a letter in a long random word):
 * - *Running code is the way to the answer.* A 2-layer byte-level policy cannot add eight numbers in its head, and
 *   the answer (80–792, almost always three digits) cannot be guessed: without the tool accuracy is ≈ 0, so every
 *   point of held-out accuracy is a program that ran. A letter count is 0–3 most of the time, and answering "1" is
 *   right about a third of the time.
 * - *The reward is strict.* One digit copied wrong changes the sum; a letter count survives most copying slips.
 * - *The program is a copy.* The list is written in Python syntax in the question, so the program is a fixed
 *   wrapper around a verbatim copy of it: the skill the calculator policy already learns for expressions, on the
 *   same alphabet (digits and punctuation). One phrasing and fixed-width numbers put the list, the program's copy
 *   of it and the tool's result at fixed offsets from one another, which a policy with learned positions picks up
 *   quickly.
 * - *Short.* A whole demonstration is ≈ 230 tokens of the byte-level tokenizer (the system prompt, the question,
 *   the call, the result, the answer), inside the calculator's 256-token context budget.
 *
 * `noise` corrupts the final answer of that fraction of demonstrations (one digit changed; the program and its
 * output stay correct), as the calculator's generator does: a warm-up on noisy demonstrations leaves a policy that
 * calls the tool well but reads its result back with slips, which the reward then removes. With gold
 * demonstrations there is little left for RL: the warm-up alone copies lists perfectly under greedy decoding
 * (validation accuracy 1.00 after 300 steps), which is the point of the fixed offsets above.
 *
 * @since 0.1.0
 */
import * as Dataset from "../../src/Dataset.ts"
import { main } from "../generator.ts"
import { Effect } from "effect"
import * as Sampling from "../../src/Sampling.ts"

// ===== Models =====

/**
 * The one-line system prompt (every token of it is paid for in every sequence).
 *
 * @category constants
 * @since 0.1.0
 */
export const systemPrompt = "Use the python tool."

/**
 * A row: AgentFly's format, a `question` plus fields that flow to the reward.
 *
 * @category models
 * @since 0.1.0
 */
export interface Row {
  readonly question: string
  /** The sum, as a string (what `mathEqual` compares the final answer with). */
  readonly answer: string
  /** The gold program: what a demonstration calls the `python` tool with. */
  readonly code: string
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
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly dir: string
  readonly seed: number
  readonly train: number
  readonly heldOut: number
  readonly validation: number
  readonly demos: number
  readonly noise: number
  /** Numbers per list (two-digit each). */
  readonly count: number
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Options, "dir"> = {
  seed: 12345,
  train: 5000,
  heldOut: 500,
  validation: 200,
  demos: 5000,
  noise: 0,
  count: 8
}

// ===== Constructors =====

/**
 * Draws one question: `count` numbers in 10–99.
 *
 * @category constructors
 * @since 0.1.0
 */
export const question = (next: () => number, count: number): Row => {
  const numbers = Array.from({ length: count }, () => 10 + Math.floor(next() * 90))
  const list = `[${numbers.join(",")}]`
  return {
    question: `What is the sum of ${list}?`,
    answer: String(numbers.reduce((a, b) => a + b, 0)),
    code: `print(sum(${list}))`
  }
}

/**
 * Held-out, train, validation and demonstration rows with disjoint lists, drawn in that order (held-out first), so
 * that no split for a seed depends on the sizes of the ones after it.
 *
 * @category constructors
 * @since 0.1.0
 */
export const splits = (options: Omit<Options, "dir" | "noise">) => {
  const next = Sampling.mulberry32(options.seed)
  const seen = new Set<string>()
  const draw = (n: number): Array<Row> => {
    const out: Array<Row> = []
    while (out.length < n) {
      const row = question(next, options.count)
      if (seen.has(row.code)) continue
      seen.add(row.code)
      out.push(row)
    }
    return out
  }
  const heldOut = draw(options.heldOut)
  const train = draw(options.train)
  const validation = draw(options.validation)
  return { heldOut, train, validation, demos: draw(options.demos) }
}

/**
 * The gold conversation for a row: system, user question, an assistant `python` call with the program, the tool's
 * output, and "The answer is N.". `final` replaces the final answer (a corrupted one).
 *
 * @category constructors
 * @since 0.1.0
 */
export const demonstration = (row: Row, index: number, final: string = row.answer): Demonstration => {
  const id = `call_${index}`
  return {
    messages: [
      { role: "system", content: systemPrompt },
      { role: "user", content: row.question },
      {
        role: "assistant",
        content: "",
        tool_calls: [{ id, type: "function", function: { name: "python", arguments: { code: row.code } } }]
      },
      { role: "tool", tool_call_id: id, name: "python", content: row.answer },
      { role: "assistant", content: `The answer is ${final}.` }
    ]
  }
}

/** Changes one digit of an integer's text, never producing the same text (and never a leading zero). */
const corrupt = (answer: string, next: () => number): string => {
  const at = Math.floor(next() * answer.length)
  const current = Number(answer[at])
  const lowest = at === 0 && answer.length > 1 ? 1 : 0
  const choices = Array.from({ length: 10 - lowest }, (_, k) => k + lowest).filter((d) => d !== current)
  return answer.slice(0, at) + String(choices[Math.floor(next() * choices.length)]) + answer.slice(at + 1)
}

/**
 * The demonstrations for a set of rows; `noise` of them (in expectation) get a corrupted final answer while the
 * program and its output stay correct.
 *
 * @category constructors
 * @since 0.1.0
 */
export const demonstrations = (
  rows: ReadonlyArray<Row>,
  options: { readonly seed: number; readonly noise: number }
): ReadonlyArray<Demonstration> => {
  const next = Sampling.mulberry32(options.seed ^ 0x5bd1e995)
  return rows.map((row, i) => demonstration(row, i, next() < options.noise ? corrupt(row.answer, next) : row.answer))
}

/**
 * Generates and writes the four files under `options.dir` (created if missing).
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("python.generate.write")(function*(options: Options) {
  const { heldOut, train, validation, demos: demoRows } = splits(options)
  const demos = demonstrations(demoRows, options)
  return yield* Dataset.writeSplits(options.dir, { train, heldOut, validation, demos })
})

main(import.meta.url, { ...defaults, dir: "data" }, write)
