/**
 * The timed decoding rounds two engine benches share (`engine-weights-bench.ts`, `lora-engine-bench.ts`): two
 * engines of one model, the same greedy prompts, rounds alternating which engine goes first (no side effects: scripts
 * import it).
 */
import { Effect } from "effect"
import type * as PolicyEngine from "../actors/PolicyEngine.ts"

type Engine = PolicyEngine.PolicyEngine["Service"]

/** One round's figures for one engine: new tokens/s at batch 1 (one greedy sequence) and 8 (eight at once). */
export interface Round {
  readonly round: number
  readonly mode: string
  readonly batch1: number
  readonly batch8: number
}

const seconds = (t0: number) => (performance.now() - t0) / 1000

/** A 16-token prompt of ids below `vocabSize`, different for each `i`. */
const prompt = (i: number, vocabSize: number) =>
  Array.from({ length: 16 }, (_, k) => (1000 + 37 * i + 11 * k) % vocabSize)

/**
 * Whether engines `a` and `b` (named in `engines`) give the same greedy tokens, then `rounds` timed rounds of each,
 * alternating which goes first; each round's line is printed as it ends. The first generation also takes each
 * session's slow first step out of the timed rounds.
 */
export const alternate = Effect.fnUntraced(function*(
  engines: Readonly<Record<string, Engine>>,
  [a, b]: readonly [string, string],
  options: { readonly rounds: number; readonly newTokens: number; readonly vocabSize: number }
) {
  const { rounds, newTokens, vocabSize } = options
  const generate = (engine: Engine, i: number) =>
    engine.generate({
      promptTokenIds: prompt(i, vocabSize),
      sampling: { temperature: 0, maxTokens: newTokens, stopTokenIds: [] }
    })
  const same = (yield* generate(engines[a]!, 99)).tokenIds.join() === (yield* generate(engines[b]!, 99)).tokenIds.join()
  const results: Array<Round> = []
  for (let round = 0; round < rounds; round++) {
    for (const mode of round % 2 === 0 ? [a, b] : [b, a]) {
      const engine = engines[mode]!
      const t0 = performance.now()
      yield* generate(engine, round)
      const batch1 = newTokens / seconds(t0)
      const t1 = performance.now()
      yield* Effect.all(Array.from({ length: 8 }, (_, i) => generate(engine, 10 * round + i)), {
        concurrency: "unbounded"
      })
      const line = { round, mode, batch1: +batch1.toFixed(2), batch8: +(8 * newTokens / seconds(t1)).toFixed(2) }
      console.log(JSON.stringify(line))
      results.push(line)
    }
  }
  return { same, results }
})
