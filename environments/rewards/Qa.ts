/**
 * Question-answering rewards: `exactMatch` and `f1` (token F1), with SQuAD's answer normalisation (lower case,
 * no punctuation, no articles `a`/`an`/`the`, single spaces).
 *
 * The prediction is the content of the last `<answer>…</answer>` in the final response when there is one,
 * else the whole final response (after an `answer` tool call, the final response is the answer itself). The row's
 * `answer` is one reference or a list of accepted references; the best match counts.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import { Reward } from "../../src/index.ts"

/**
 * SQuAD normalisation.
 *
 * @category getters
 * @since 0.1.0
 */
export const normalizeAnswer = (text: string): string =>
  text
    .toLowerCase()
    .replace(/[\p{P}\p{S}]/gu, " ")
    .replace(/\b(a|an|the)\b/g, " ")
    .split(/\s+/)
    .filter((t) => t.length > 0)
    .join(" ")

/**
 * The prediction a response gives: the last `<answer>` block, else the whole text.
 *
 * @category getters
 * @since 0.1.0
 */
export const prediction = (response: string): string =>
  [...response.matchAll(/<answer>([\s\S]*?)<\/answer>/g)].at(-1)?.[1] ?? response

/**
 * Token-level F1, precision and recall of a prediction against one reference.
 *
 * @category getters
 * @since 0.1.0
 */
export const tokenF1 = (predicted: string, reference: string) => {
  const p = normalizeAnswer(predicted).split(" ").filter((t) => t !== "")
  const r = normalizeAnswer(reference).split(" ").filter((t) => t !== "")
  if (p.length === 0 || r.length === 0) {
    const same = p.length === r.length ? 1 : 0
    return { f1: same, precision: same, recall: same }
  }
  const counts = new Map<string, number>()
  for (const t of r) counts.set(t, (counts.get(t) ?? 0) + 1)
  let common = 0
  for (const t of p) {
    const n = counts.get(t) ?? 0
    if (n > 0) {
      common++
      counts.set(t, n - 1)
    }
  }
  if (common === 0) return { f1: 0, precision: 0, recall: 0 }
  const precision = common / p.length
  const recall = common / r.length
  return { f1: (2 * precision * recall) / (precision + recall), precision, recall }
}

const References = Schema.Struct({
  answer: Schema.Union([Schema.String, Schema.NonEmptyArray(Schema.String)])
})
const referencesOf = (row: typeof References.Type): ReadonlyArray<string> =>
  typeof row.answer === "string" ? [row.answer] : row.answer

/**
 * 1 when the normalised prediction equals a normalised reference, else 0.
 *
 * @category constructors
 * @since 0.1.0
 */
export const exactMatch = Reward.make("exactMatch", {
  row: References,
  score: ({ response, row }) =>
    Effect.sync(() => {
      const p = normalizeAnswer(prediction(response))
      const em = referencesOf(row).some((r) => normalizeAnswer(r) === p) ? 1 : 0
      return { reward: em, metrics: { em } }
    })
})

/**
 * The best token F1 over the references; metrics `f1`, `em`, `precision`, `recall` (of the best reference).
 *
 * @category constructors
 * @since 0.1.0
 */
export const f1 = Reward.make("f1", {
  row: References,
  score: ({ response, row }) =>
    Effect.sync(() => {
      const predicted = prediction(response)
      const best = referencesOf(row)
        .map((r) => tokenF1(predicted, r))
        .reduce((a, b) => (b.f1 > a.f1 ? b : a))
      const em = referencesOf(row).some((r) => normalizeAnswer(r) === normalizeAnswer(predicted)) ? 1 : 0
      return { reward: best.f1, metrics: { f1: best.f1, em, precision: best.precision, recall: best.recall } }
    })
})
