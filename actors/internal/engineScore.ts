/**
 * Prompt scoring on the policy engine's own session (`PolicyEngine.score`, what `agentfly serve` answers vLLM's
 * `prompt_logprobs` with): each token's log-probability given the tokens before it, under the weights the engine
 * samples with now. The decode graph returns the last position's logits only, so the tokens are fed one run at a
 * time (teacher forcing) into a private cache of the sequence's length, exactly as a decode step feeds a sampled
 * token: a scored token's logprob is the one the engine would give it had it sampled it at temperature 1.
 *
 * The runs interleave with the decode loop's (onnxruntime-node runs a session synchronously on this thread) but
 * never touch its batch or cache. The generation scored with is pinned until the scoring ends, so that a weight
 * update meanwhile does not release its session under it.
 */
import { Effect } from "effect"
import * as ort from "onnxruntime-node"
import * as Sampling from "../../src/Sampling.ts"
import type { SamplerError } from "../../src/Sampler.ts"
import { int64, newOf, run } from "./engineSteps.ts"
import type { Generation, Setup } from "./engineSteps.ts"

/**
 * One position's score: the token's logprob, its rank in the vocabulary (1 = likeliest) and the `top` likeliest
 * tokens with theirs.
 */
export interface PositionScore {
  readonly logprob: number
  readonly rank: number
  readonly top: ReadonlyArray<{ readonly id: number; readonly logprob: number }>
}

const pins = new WeakMap<Generation, number>()

/** Whether a scoring still uses `g` (the decode loop does not release it then). */
export const pinned = (g: Generation): boolean => (pins.get(g) ?? 0) > 0

/** A position's score from its logits row. */
const scoreRow = (row: Float32Array, id: number, top: number): PositionScore => {
  const lse = Sampling.logSumExp(row)
  const logit = row[id]!
  let rank = 1
  for (let v = 0; v < row.length; v++) if (row[v]! > logit) rank++
  const best: Array<number> = []
  for (let k = 0; k < top; k++) {
    let arg = -1
    for (let v = 0; v < row.length; v++) {
      if ((arg < 0 || row[v]! > row[arg]!) && !best.includes(v)) arg = v
    }
    if (arg >= 0) best.push(arg)
  }
  return { logprob: logit - lse, rank, top: best.map((v) => ({ id: v, logprob: row[v]! - lse })) }
}

/**
 * Scores `ids` with generation `g`: `[0]` is null (nothing before it), `[t]` the score of `ids[t]` after
 * `ids[0..t)`. `onRelease` runs when the scoring ends, so that the caller can release a generation retired meanwhile.
 */
export const score = (
  setup: Setup,
  g: Generation,
  ids: ReadonlyArray<number>,
  top: number,
  onRelease: (g: Generation) => Effect.Effect<void>
): Effect.Effect<ReadonlyArray<PositionScore | null>, SamplerError> =>
  Effect.acquireUseRelease(
    Effect.sync(() => void pins.set(g, (pins.get(g) ?? 0) + 1)),
    () =>
      Effect.gen(function*() {
        const { kvHeads: KV, headDim: hd, vocabSize: V, pastNames } = setup
        const n = ids.length, T = Math.max(1, n - 1)
        const past = pastNames.map(() => new Float32Array(KV * T * hd))
        const mask = new BigInt64Array(T + 1)
        const dims = [1, KV, T, hd]
        const out: Array<PositionScore | null> = [null]
        for (let t = 0; t + 1 < n; t++) {
          // The cached tokens (slots 0..t-1), free slots, then the new token: as a decode step's mask.
          mask[T] = 1n
          const result = yield* run(g, {
            ...Object.fromEntries(pastNames.map((name, k) => [name, new ort.Tensor("float32", past[k]!, dims)])),
            input_ids: int64([ids[t]!], [1, 1]),
            attention_mask: new ort.Tensor("int64", mask, [1, T + 1]),
            position_ids: int64([t], [1, 1])
          })
          newOf(setup, result).forEach((kv, k) => {
            for (let h = 0; h < KV; h++) past[k]!.set(kv.subarray(h * hd, (h + 1) * hd), (h * T + t) * hd)
          })
          mask[t] = 1n
          const logits = result["logits"]!.data as Float32Array
          out.push(scoreRow(logits.subarray(0, V), ids[t + 1]!, top))
        }
        return out
      }),
    () =>
      Effect.suspend(() => {
        const left = (pins.get(g) ?? 1) - 1
        pins.set(g, left)
        return left === 0 ? onRelease(g) : Effect.void
      })
  )
