/**
 * Pure sampling maths over one row of logits (`Float32Array` of vocabulary size): temperature, top-k, top-p
 * (nucleus), greedy, and the logprob of the sampled token; plus the small seeded RNG every request owns.
 *
 * **Logprob convention.** The logprob returned with a sampled token is the log-softmax of `logits / temperature`
 * over the whole vocabulary, evaluated at that token: the distribution the learner recomputes at the same
 * temperature. It is taken before top-k / top-p truncation (truncation only restricts which tokens can be drawn).
 * Greedy decoding (`temperature <= 0`) returns the plain log-softmax of the logits.
 *
 * **Determinism.** A request's RNG is seeded from its own seed and each sampled token consumes exactly one draw,
 * so a request's tokens do not depend on what else is in the batch.
 *
 * @since 0.1.0
 */

// ===== Seeded RNG =====

/**
 * A seeded pseudo-random stream (sfc32, seeded through splitmix32). Mutable: each call advances it.
 *
 * @category models
 * @since 0.1.0
 */
export interface Rng {
  /** A uniform float in [0, 1) with 32 bits of randomness. */
  readonly next: () => number
}

const splitmix32 = (seed: number): () => number => {
  let s = seed >>> 0
  return () => {
    s = (s + 0x9e3779b9) >>> 0
    let z = s
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b)
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35)
    return (z ^ (z >>> 16)) >>> 0
  }
}

/**
 * A new RNG stream from a seed (any integer; only its low 32 bits and, for larger values, its high bits mixed in).
 *
 * @category constructors
 * @since 0.1.0
 */
export const rng = (seed: number): Rng => {
  const mix = splitmix32((seed >>> 0) ^ Math.floor(seed / 0x100000000))
  let a = mix(), b = mix(), c = mix(), d = mix()
  return {
    next: () => {
      const t = (((a + b) >>> 0) + d) >>> 0
      d = (d + 1) >>> 0
      a = b ^ (b >>> 9)
      b = (c + (c << 3)) >>> 0
      c = (c << 21) | (c >>> 11)
      c = (c + t) >>> 0
      return t / 0x100000000
    }
  }
}

/**
 * A standard normal draw (Box–Muller; consumes two uniforms).
 *
 * @category constructors
 * @since 0.1.0
 */
export const normal = (r: Rng): number => {
  const u = 1 - r.next()
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * r.next())
}

// ===== Sampling =====

/**
 * @category models
 * @since 0.1.0
 */
export interface Params {
  /** `<= 0` means greedy. */
  readonly temperature: number
  /** Keep only the `topK` most likely tokens (`<= 0` or absent: all). */
  readonly topK?: number | undefined
  /** Keep the smallest set of most likely tokens whose probability reaches `topP` (absent or `>= 1`: all). */
  readonly topP?: number | undefined
}

/**
 * @category models
 * @since 0.1.0
 */
export interface Sample {
  readonly tokenId: number
  /** log-softmax of logits / temperature at `tokenId` (see the module notes). */
  readonly logprob: number
}

/**
 * Index of the largest value (the first one on ties).
 *
 * @category math
 * @since 0.1.0
 */
export const argmax = (row: ArrayLike<number>): number => {
  let best = 0
  for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i
  return best
}

/**
 * log Σ exp(row[i] / temperature), computed stably in float64.
 *
 * @category math
 * @since 0.1.0
 */
export const logSumExp = (row: ArrayLike<number>, temperature = 1): number => {
  let max = -Infinity
  for (let i = 0; i < row.length; i++) max = Math.max(max, row[i]! / temperature)
  let sum = 0
  for (let i = 0; i < row.length; i++) sum += Math.exp(row[i]! / temperature - max)
  return max + Math.log(sum)
}

/**
 * The full log-softmax of `row / temperature` (temperature 1 when absent) in float64.
 *
 * @category math
 * @since 0.1.0
 */
export const logSoftmax = (row: ArrayLike<number>, temperature = 1): Float64Array => {
  const lse = logSumExp(row, temperature)
  return Float64Array.from({ length: row.length }, (_, i) => row[i]! / temperature - lse)
}

/**
 * Samples one token from a row of logits. Greedy when `temperature <= 0`; otherwise draws exactly one uniform
 * from `r`. `rowLse`, where the engine computed it, is {@link logSumExp} of `row` (temperature 1): used in its
 * place at temperatures 0 and 1.
 *
 * @category math
 * @since 0.1.0
 */
export const sample = (row: ArrayLike<number>, params: Params, r: Rng, rowLse?: number): Sample => {
  if (!(params.temperature > 0)) {
    const tokenId = argmax(row)
    return { tokenId, logprob: row[tokenId]! - (rowLse ?? logSumExp(row)) }
  }
  const t = params.temperature
  const lse = t === 1 && rowLse !== undefined ? rowLse : logSumExp(row, t)
  const u = r.next()
  const topK = params.topK !== undefined && params.topK > 0 && params.topK < row.length ? params.topK : row.length
  const topP = params.topP !== undefined && params.topP < 1 ? Math.max(params.topP, 0) : 1
  let tokenId: number
  if (topK === row.length && topP === 1) {
    // Inverse-CDF over the whole vocabulary in index order: no sort needed.
    let target = u, last = 0
    tokenId = -1
    for (let i = 0; i < row.length; i++) {
      const p = Math.exp(row[i]! / t - lse)
      if (p > 0) last = i
      target -= p
      if (target < 0) {
        tokenId = i
        break
      }
    }
    if (tokenId < 0) tokenId = last // rounding left a sliver of mass past the end
  } else {
    tokenId = sampleTruncated(row, t, lse, topK, topP, u)
  }
  return { tokenId, logprob: row[tokenId]! / t - lse }
}

const sampleTruncated = (
  row: ArrayLike<number>,
  t: number,
  lse: number,
  topK: number,
  topP: number,
  u: number
): number => {
  // Stable sort: ties keep index order, so results do not depend on the engine's sort details.
  const order = Array.from({ length: row.length }, (_, i) => i).sort((a, b) => row[b]! - row[a]! || a - b)
  const probs = new Float64Array(topK)
  let kept = 0, mass = 0
  for (; kept < topK; kept++) {
    if (kept > 0 && mass >= topP) break
    probs[kept] = Math.exp(row[order[kept]!]! / t - lse)
    mass += probs[kept]!
  }
  let target = u * mass
  for (let i = 0; i < kept; i++) {
    target -= probs[i]!
    if (target < 0) return order[i]!
  }
  return order[kept - 1]!
}

/**
 * mulberry32: a small seeded stream of doubles in [0, 1), 32-bit integer arithmetic only (reproducible on every
 * platform). The trainer and the demo's data generator draw from it.
 *
 * @category constructors
 * @since 0.1.0
 */
export const mulberry32 = (seed: number): () => number => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}
