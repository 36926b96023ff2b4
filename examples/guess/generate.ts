/**
 * Writes the guess-the-number data: `train.jsonl` (RL rows), `heldout.jsonl`, `validation.jsonl` (the warm-up's
 * stopping check) and `demos.jsonl` (conversations of the oracle, a binary search, for the SFT warm-up). A row is a
 * `question` and the game's `secret` (1…15), which only the environment reads. Seeded: the same options always
 * write the same bytes.
 *
 *   npx tsx examples/guess/generate.ts [OUT_DIR] [SEED] [NOISE]
 *
 * `noise` is the chance that a demonstration's guess is drawn at random from the numbers still possible instead of
 * the middle one: such games take more guesses and some run out, so the warm-up leaves room for RL to find the
 * search that always wins.
 *
 * @since 0.1.0
 */
import * as Dataset from "../../src/Dataset.ts"
import { main } from "../generator.ts"
import { Effect } from "effect"
import * as Sampling from "../../src/Sampling.ts"
import { maxGuesses, task } from "./task.ts"

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
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Options, "dir"> = {
  seed: 2026,
  train: 2000,
  heldOut: 300,
  validation: 100,
  demos: 2000,
  noise: 0.5
}

/**
 * The question every row asks (the secret differs).
 *
 * @category constants
 * @since 0.1.0
 */
export const question = "Guess my number."

/**
 * The guesses of a game against `secret`: the middle of the numbers still possible, or with probability `noise` a
 * random one of them; at most `maxGuesses`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const play = (secret: number, next: () => number, noise = 0): Array<number> => {
  let lo = 1
  let hi = 15
  const guesses: Array<number> = []
  while (guesses.length < maxGuesses) {
    const n = next() < noise ? lo + Math.floor(next() * (hi - lo + 1)) : Math.floor((lo + hi) / 2)
    guesses.push(n)
    if (n === secret) break
    if (n < secret) lo = n + 1
    else hi = n - 1
  }
  return guesses
}

/**
 * A game's conversation in the OpenAI message shape: a tool call per guess, the tool's (empty) result, and the
 * game's answer as a user message, as the rollout renders them.
 *
 * @category constructors
 * @since 0.1.0
 */
export const demonstration = (secret: number, guesses: ReadonlyArray<number>, systemPrompt: string) => {
  const messages: Array<Record<string, unknown>> = [
    { role: "system", content: systemPrompt },
    { role: "user", content: question }
  ]
  guesses.forEach((n, i) => {
    const id = `call_${i}_0`
    messages.push(
      {
        role: "assistant",
        content: "",
        tool_calls: [{ id, type: "function", function: { name: "guess", arguments: { n } } }]
      },
      { role: "tool", tool_call_id: id, name: "guess", content: "" }
    )
    if (n === secret) return
    const answer = i + 1 >= maxGuesses ? "No guesses left." : n < secret ? "Higher." : "Lower."
    messages.push({ role: "user", content: answer })
  })
  return { messages }
}


/**
 * Generates and writes the four files under `options.dir` (created if missing).
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("guess.generate.write")(function*(options: Options, systemPrompt: string) {
  const next = Sampling.mulberry32(options.seed)
  const rows = (n: number) => Array.from({ length: n }, () => ({ question, secret: 1 + Math.floor(next() * 15) }))
  const heldOut = rows(options.heldOut)
  const train = rows(options.train)
  const validation = rows(options.validation)
  const demos = rows(options.demos).map(({ secret }) =>
    demonstration(secret, play(secret, next, options.noise), systemPrompt)
  )
  return yield* Dataset.writeSplits(options.dir, { train, heldOut, validation, demos })
})

main(import.meta.url, { ...defaults, dir: "data" }, (options) => write(options, task.defaults.systemPrompt!))
