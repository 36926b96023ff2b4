/**
 * Writes the calculator demo's data files: `train.jsonl` (RL prompts), `heldout.jsonl`, `validation.jsonl` (for the
 * warm-up's stopping check) and `demos.jsonl` (gold conversations for the SFT warm-up), each on questions of its own
 * (`Problems.splits`). Seeded: the same options always write the same bytes.
 *
 *   npx tsx examples/calculator/generate.ts [OUT_DIR] [SEED] [NOISE] [--kind mixed|sums]
 *
 * `noise` corrupts the final answer of that fraction of demonstrations (one digit changed). A warm-up on noisy
 * demonstrations leaves a policy that formats well but answers wrongly part of the time: room for the reward to
 * show what RL adds.
 *
 * @since 0.1.0
 */
import * as Dataset from "../../src/Dataset.ts"
import { main } from "../generator.ts"
import { Effect } from "effect"
import * as Problems from "./Problems.ts"

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
  /** The kind of question (`Problems.Kind`): `mixed` (the default) or `sums` (the README's demo). */
  readonly kind?: string
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
  kind: "mixed"
}

/** Changes one digit of an integer's text, never producing the same text (and never a leading zero). */
const corrupt = (answer: string, next: () => number): string => {
  const digits = [...answer].flatMap((c, i) => (/\d/.test(c) ? [i] : []))
  const at = digits[Math.floor(next() * digits.length)]!
  const current = Number(answer[at])
  const lowest = at === digits[0] && digits.length > 1 ? 1 : 0
  const choices = Array.from({ length: 10 - lowest }, (_, k) => k + lowest).filter((d) => d !== current)
  return answer.slice(0, at) + String(choices[Math.floor(next() * choices.length)]) + answer.slice(at + 1)
}

/**
 * The demonstrations for a set of rows; `noise` of them (in expectation) get a corrupted final answer while the
 * tool call and the tool result stay correct.
 *
 * @category constructors
 * @since 0.1.0
 */
export const demonstrations = (
  rows: ReadonlyArray<Problems.Row>,
  options: { readonly seed: number; readonly noise: number }
): ReadonlyArray<Problems.Demonstration> => {
  const next = Problems.rng(options.seed ^ 0x5bd1e995)
  return rows.map((row, i) => {
    const gold = Problems.demonstration(row, i)
    if (next() >= options.noise) return gold
    const messages = [...gold.messages]
    messages[messages.length - 1] = { role: "assistant", content: `The answer is ${corrupt(row.answer, next)}.` }
    return { messages }
  })
}

/**
 * Generates and writes the three files under `options.dir` (created if missing).
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("calculator.generate.write")(function*(options: Options) {
  const kind = Problems.kinds.find((k) => k === (options.kind ?? "mixed"))
  if (kind === undefined) {
    return yield* Effect.fail(new Error(`unknown kind ${options.kind} (known: ${Problems.kinds.join(", ")})`))
  }
  const { heldOut, train, validation, demos: demoRows } = Problems.splits({ ...options, kind })
  const demos = demonstrations(demoRows, options)
  return yield* Dataset.writeSplits(options.dir, { train, heldOut, validation, demos })
})

main(import.meta.url, { ...defaults, dir: "data" }, write)
