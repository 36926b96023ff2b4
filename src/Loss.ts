/**
 * RL and SFT losses as pure reference functions over typed arrays.
 *
 * The learner does not run these: `autodiff/LossHead.ts` emits the same maths into the ONNX training graph. They
 * exist so that every formula is readable in one place and the emitted graph is tested against them.
 *
 * Per token (`t` ranges over positions whose target the policy sampled):
 * - `nll`: `−log π(y_t)` (SFT / behaviour cloning).
 * - `ppo`: verl's clipped surrogate with dual clip (arXiv:1707.06347, arXiv:1912.09729):
 *   `r = exp(clamp(log π − log π_old, ±20))`, `ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high))`, and for `A < 0`
 *   `ℓ = min(ℓ, −A·c)`. GRPO, Dr.GRPO, RLOO and REINFORCE++ are this loss with their advantages and aggregation.
 * - `gspo`: GSPO's sequence-level ratio (arXiv:2507.18071): `s_i = exp(clamp(mean_t(log π − log π_old), ±20))` over
 *   the sequence's loss tokens, and per token `ℓ = max(−A·s_i, −A·clip(s_i, 1−ε_low, 1+ε_high))`; with
 *   `seq-mean-token-mean` and one advantage per sequence this is GSPO's objective, and its gradient
 *   `−A·s_i·mean_t ∇log π` is GSPO's (a sequence is one row of a micro-batch: a segment of a trajectory).
 * - `cispo`: MiniMax-M1's clipped IS-weight policy optimisation (arXiv:2506.13585): the gradient of every token is
 *   `−A·sg(clip(r, 1−ε_low, 1+ε_high))·∇log π`, so a clipped token still learns (PPO's clip zeroes it). Written as a
 *   loss with that gradient and no stop-gradient: `−A·r` inside the range, and past a bound `c` its tangent
 *   `−A·c·(1 + log r − log c)` (continuous, so central differences check it). `clipLow ≥ 1`: no lower bound (`e^−20`).
 * - truncated importance weights for train/inference mismatch (TIS): `w = min(exp(log π_old − log π_sampler), cap)`
 *   multiplies the policy-gradient term; it is a constant (no gradient).
 * - KL to a frozen reference: `k1 = log π − log π_ref`; `k3 = exp(d) − d − 1` with `d = log π_ref − log π`, clamped
 *   to ±10 (verl's `low_var_kl`); or KL folded into the reward with {@link penalizeRewards}.
 * - entropy bonus: `−β·H(π(·|x_t))`.
 * - `value`: a critic's clipped value loss (verl's `compute_value_loss`) on a value head `v` (logits of one output):
 *   `ℓ = ½·max((v − R)², (v_old + clip(v − v_old, ±ε) − R)²)` with the returns `R` in the advantages' place and
 *   the old values `v_old` in the old logprobs' place (ε = `clipLow`); its "logprobs" are the values.
 *
 * Aggregation (verl's names) is always a weighted sum `Σ w_t·ℓ_t` whose weights {@link aggregationWeights} computes
 * from the loss mask and the **whole mini-batch's** token and sequence counts, so that summing the gradients of
 * micro-batches gives exactly the gradient of the mini-batch loss.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"

// ===== Models =====

/**
 * verl's loss aggregation modes.
 * - `token-mean`: mean over all loss tokens of the mini-batch.
 * - `seq-mean-token-sum`: per-sequence sum, mean over sequences.
 * - `seq-mean-token-mean`: per-sequence mean, mean over sequences.
 * - `seq-mean-token-sum-norm`: total sum divided by a constant length (Dr.GRPO's `MAX_TOKENS`).
 *
 * @category models
 * @since 0.1.0
 */
export const AggregationMode = Schema.Literals([
  "token-mean",
  "seq-mean-token-sum",
  "seq-mean-token-mean",
  "seq-mean-token-sum-norm"
])
export type AggregationMode = typeof AggregationMode.Type

/**
 * KL estimators (Schulman, "Approximating KL divergence").
 *
 * @category models
 * @since 0.1.0
 */
export const KlEstimator = Schema.Literals(["k1", "k3"])
export type KlEstimator = typeof KlEstimator.Type

/**
 * The loss configuration shared by the reference functions and the emitted graph.
 *
 * @category models
 * @since 0.1.0
 */
export const Config = Schema.Struct({
  /**
   * `nll` for SFT, `ppo` for every policy-gradient method (vanilla PG is PPO with one update per batch), `gspo` and
   * `cispo` for their ratios (see the module notes), `value` for a critic (a value head, see the module notes).
   */
  policyLoss: Schema.Literals(["nll", "ppo", "gspo", "cispo", "value"]),
  aggregation: AggregationMode,
  /** ε_low of the clip range (`ppo`). */
  clipLow: Schema.Number,
  /** ε_high of the clip range (`ppo`; DAPO's clip-higher uses 0.28). */
  clipHigh: Schema.Number,
  /** Dual-clip bound `c > 1` for negative advantages (`ppo` only); absent = off. */
  dualClip: Schema.optionalKey(Schema.Number),
  /** Cap of the truncated importance weights old/sampler; absent = off. */
  tisCap: Schema.optionalKey(Schema.Number),
  /** Coefficient of the KL-to-reference loss term; 0 = off. */
  klCoef: Schema.Number,
  klEstimator: KlEstimator,
  /** Coefficient of the entropy bonus; 0 = off. */
  entropyCoef: Schema.Number,
  /** The constant length of `seq-mean-token-sum-norm`; defaults to the padded row length. */
  normLength: Schema.optionalKey(Schema.Number),
  /**
   * The sampling temperature of the rollouts: logprobs (and so the ratio, entropy and KL) are those of
   * `softmax(logits / temperature)`, the distribution the sampler drew from and reported. Absent = 1.
   */
  temperature: Schema.optionalKey(Schema.Number)
})
export type Config = typeof Config.Type

/**
 * SFT: masked token NLL, token-mean.
 *
 * @category constructors
 * @since 0.1.0
 */
export const sft: Config = {
  policyLoss: "nll",
  aggregation: "token-mean",
  clipLow: 0.2,
  clipHigh: 0.2,
  klCoef: 0,
  klEstimator: "k3",
  entropyCoef: 0
}

/**
 * GRPO (DeepSeekMath): clipped surrogate, per-sequence token mean.
 *
 * @category constructors
 * @since 0.1.0
 */
export const grpo: Config = { ...sft, policyLoss: "ppo", aggregation: "seq-mean-token-mean" }

/**
 * Dr.GRPO (arXiv:2503.20783): no length normalisation per sequence (`seq-mean-token-sum-norm`), used with the
 * `grpo-no-std` advantage.
 *
 * @category constructors
 * @since 0.1.0
 */
export const drGrpo: Config = { ...sft, policyLoss: "ppo", aggregation: "seq-mean-token-sum-norm" }

/**
 * PPO as in verl's defaults: token-mean, dual clip 3.
 *
 * @category constructors
 * @since 0.1.0
 */
export const ppo: Config = { ...sft, policyLoss: "ppo", aggregation: "token-mean", dualClip: 3 }

/**
 * GSPO (arXiv:2507.18071): the sequence-level ratio, sequence mean of token means, the paper's clip range
 * (3e-4, 4e-4: a sequence ratio is a geometric mean, so much closer to 1 than a token's).
 *
 * @category constructors
 * @since 0.1.0
 */
export const gspo: Config = {
  ...sft,
  policyLoss: "gspo",
  aggregation: "seq-mean-token-mean",
  clipLow: 3e-4,
  clipHigh: 4e-4
}

/**
 * CISPO (MiniMax-M1, arXiv:2506.13585): clipped IS weights, token-mean, no lower bound, upper bound 1 + 0.28.
 *
 * @category constructors
 * @since 0.1.0
 */
export const cispo: Config = { ...sft, policyLoss: "cispo", aggregation: "token-mean", clipLow: 1, clipHigh: 0.28 }

/**
 * DAPO's loss (arXiv:2503.14476): PPO's surrogate with clip-higher (ε_low 0.2, ε_high 0.28) and token-mean. Its
 * over-long shaping is a reward term ({@link overlongPenalty}), its dynamic sampling a rollout option.
 *
 * @category constructors
 * @since 0.1.0
 */
export const dapo: Config = { ...sft, policyLoss: "ppo", aggregation: "token-mean", clipHigh: 0.28 }

/**
 * Whether a loss is a policy-gradient loss (reads advantages and old logprobs).
 *
 * @category guards
 * @since 0.1.0
 */
export const isPolicyGradient = (config: Pick<Config, "policyLoss">): boolean =>
  config.policyLoss === "ppo" || config.policyLoss === "gspo" || config.policyLoss === "cispo"

/**
 * A critic's loss as in verl's defaults: the clipped value loss, token-mean, `cliprange_value` 0.5.
 *
 * @category constructors
 * @since 0.1.0
 */
export const value: Config = { ...sft, policyLoss: "value", aggregation: "token-mean", clipLow: 0.5, clipHigh: 0.5 }

// ===== Per-token maths =====

/**
 * Log-softmax of one row of logits, in float64.
 *
 * @category combinators
 * @since 0.1.0
 */
export const logSoftmax = (
  logits: ArrayLike<number>,
  offset: number,
  vocab: number,
  temperature = 1
): Float64Array => {
  let max = -Infinity
  for (let v = 0; v < vocab; v++) max = Math.max(max, logits[offset + v]! / temperature)
  let sum = 0
  for (let v = 0; v < vocab; v++) sum += Math.exp(logits[offset + v]! / temperature - max)
  const logZ = max + Math.log(sum)
  const out = new Float64Array(vocab)
  for (let v = 0; v < vocab; v++) out[v] = logits[offset + v]! / temperature - logZ
  return out
}

/**
 * Entropy `−Σ p log p` of a row given its log-softmax.
 *
 * @category combinators
 * @since 0.1.0
 */
export const entropy = (logProbs: Float64Array): number => {
  let h = 0
  for (let v = 0; v < logProbs.length; v++) h -= Math.exp(logProbs[v]!) * logProbs[v]!
  return h
}

/**
 * The PPO clipped surrogate of one token, with the clip indicators verl logs.
 *
 * @category combinators
 * @since 0.1.0
 */
export const ppoToken = (
  logprob: number,
  oldLogprob: number,
  advantage: number,
  config: Pick<Config, "clipLow" | "clipHigh" | "dualClip">
): { readonly loss: number; readonly clipped: boolean; readonly clippedLower: boolean } => {
  const ratio = Math.exp(Math.min(Math.max(logprob - oldLogprob, -20), 20))
  const loss1 = -advantage * ratio
  const loss2 = -advantage * Math.min(Math.max(ratio, 1 - config.clipLow), 1 + config.clipHigh)
  const clippedLoss = Math.max(loss1, loss2)
  if (config.dualClip === undefined || advantage >= 0) {
    return { loss: clippedLoss, clipped: loss2 > loss1, clippedLower: false }
  }
  const loss3 = -advantage * config.dualClip
  return { loss: Math.min(loss3, clippedLoss), clipped: loss2 > loss1, clippedLower: clippedLoss > loss3 }
}

/**
 * CISPO's loss of one token: `−A·r` inside `[1−ε_low, 1+ε_high]`, its tangent past a bound `c`
 * (`−A·c·(1 + log r − log c)`), so that the gradient is `−A·clip(r)·∇log π` everywhere; `clipped` when `r` is out of
 * the range (the token still has a gradient). `clipLow ≥ 1`: no lower bound.
 *
 * @category combinators
 * @since 0.1.0
 */
export const cispoToken = (
  logprob: number,
  oldLogprob: number,
  advantage: number,
  config: Pick<Config, "clipLow" | "clipHigh">
): { readonly loss: number; readonly clipped: boolean } => {
  const logRatio = logprob - oldLogprob
  const { lower, upper } = cispoBounds(config)
  const bound = logRatio > upper ? upper : logRatio < lower ? lower : undefined
  if (bound === undefined) return { loss: -advantage * Math.exp(logRatio), clipped: false }
  return { loss: -advantage * Math.exp(bound) * (1 + logRatio - bound), clipped: true }
}

/**
 * CISPO's range as log-ratios: `[log(1−ε_low), log(1+ε_high)]` within ±20 (as PPO clamps its log-ratio), so that
 * `clipLow ≥ 1` (no lower bound) is a bound of `e^−20`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const cispoBounds = (
  config: Pick<Config, "clipLow" | "clipHigh">
): { readonly lower: number; readonly upper: number } => ({
  lower: config.clipLow >= 1 ? -20 : Math.max(-20, Math.log(1 - config.clipLow)),
  upper: Math.min(20, Math.log(1 + config.clipHigh))
})

/**
 * GSPO's sequence ratios: per row of a `[batch × length]` batch, `exp(clamp(mean(log π − log π_old), ±20))` over
 * the row's loss tokens (1 for a row without any).
 *
 * @category combinators
 * @since 0.1.0
 */
export const sequenceRatios = (
  logprobs: ArrayLike<number>,
  oldLogprobs: ArrayLike<number>,
  mask: Uint8Array,
  batch: number,
  length: number
): Float64Array => {
  const out = new Float64Array(batch)
  for (let b = 0; b < batch; b++) {
    let sum = 0
    let n = 0
    for (let t = 0; t < length; t++) {
      const i = b * length + t
      if (mask[i] === 0) continue
      sum += logprobs[i]! - oldLogprobs[i]!
      n++
    }
    out[b] = Math.exp(Math.min(Math.max(sum / Math.max(1, n), -20), 20))
  }
  return out
}

/**
 * GSPO's loss of one token given its sequence's ratio `s`: `max(−A·s, −A·clip(s, 1−ε_low, 1+ε_high))`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const gspoToken = (
  sequenceRatio: number,
  advantage: number,
  config: Pick<Config, "clipLow" | "clipHigh">
): { readonly loss: number; readonly clipped: boolean } => {
  const loss1 = -advantage * sequenceRatio
  const loss2 = -advantage * Math.min(Math.max(sequenceRatio, 1 - config.clipLow), 1 + config.clipHigh)
  return { loss: Math.max(loss1, loss2), clipped: loss2 > loss1 }
}

/**
 * DAPO's soft over-long punishment (arXiv:2503.14476, eq. 13) of a response of `length` tokens: 0 up to
 * `maxTokens − bufferTokens`, then falling linearly to `−1` at `maxTokens`, and `−1` past it; times `factor`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const overlongPenalty = (
  length: number,
  options: { readonly maxTokens: number; readonly bufferTokens: number; readonly factor?: number | undefined }
): number => {
  const { maxTokens, bufferTokens } = options
  const factor = options.factor ?? 1
  if (length <= maxTokens - bufferTokens) return 0
  if (length > maxTokens) return -factor
  return (factor * (maxTokens - bufferTokens - length)) / Math.max(1, bufferTokens)
}

/**
 * The clipped value loss of one token (verl's `compute_value_loss`), with whether the clipped term was the larger
 * and the unclipped squared error.
 *
 * @category combinators
 * @since 0.1.0
 */
export const valueToken = (
  value: number,
  oldValue: number,
  target: number,
  clip: number
): { readonly loss: number; readonly clipped: boolean; readonly squaredError: number } => {
  const e1 = (value - target) ** 2
  const e2 = (oldValue + Math.min(Math.max(value - oldValue, -clip), clip) - target) ** 2
  return { loss: 0.5 * Math.max(e1, e2), clipped: e2 > e1, squaredError: e1 }
}

/**
 * KL of one token to the reference policy.
 *
 * @category combinators
 * @since 0.1.0
 */
export const klToken = (logprob: number, refLogprob: number, estimator: KlEstimator): number => {
  if (estimator === "k1") return logprob - refLogprob
  const d = refLogprob - logprob
  return Math.min(Math.max(Math.exp(d) - d - 1, -10), 10)
}

/**
 * Truncated importance weight correcting train/inference mismatch: `min(exp(old − sampler), cap)`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const truncatedImportanceWeight = (oldLogprob: number, samplerLogprob: number, cap: number): number =>
  Math.min(Math.exp(oldLogprob - samplerLogprob), cap)

/**
 * KL in the reward (verl's `compute_rewards`): `r_t − β·(log π_old − log π_ref)` on response tokens.
 *
 * @category combinators
 * @since 0.1.0
 */
export const penalizeRewards = (
  tokenRewards: Float64Array | Float32Array,
  logprobs: Float64Array | Float32Array,
  refLogprobs: Float64Array | Float32Array,
  mask: Uint8Array,
  coef: number
): Float64Array => {
  const out = new Float64Array(tokenRewards.length)
  for (let i = 0; i < out.length; i++) {
    out[i] = tokenRewards[i]! - (mask[i] !== 0 ? coef * (logprobs[i]! - refLogprobs[i]!) : 0)
  }
  return out
}

// ===== Aggregation =====

/**
 * Mini-batch totals the aggregation weights divide by.
 *
 * @category models
 * @since 0.1.0
 */
export interface Totals {
  /** Loss tokens in the mini-batch. */
  readonly tokens: number
  /** Sequences with at least one loss token in the mini-batch. */
  readonly sequences: number
}

/**
 * Counts loss tokens and non-empty sequences of a `[batch × length]` mask.
 *
 * @category combinators
 * @since 0.1.0
 */
export const totals = (mask: Uint8Array, batch: number, length: number): Totals => {
  let tokens = 0
  let sequences = 0
  for (let b = 0; b < batch; b++) {
    let n = 0
    for (let t = 0; t < length; t++) n += mask[b * length + t] !== 0 ? 1 : 0
    tokens += n
    sequences += n > 0 ? 1 : 0
  }
  return { tokens, sequences }
}

/**
 * Per-token weights `w` such that the aggregated loss is `Σ w_t·ℓ_t`. `totals` are those of the whole mini-batch
 * (pass the micro-batch's own for a single batch). Zero off the mask.
 *
 * @category combinators
 * @since 0.1.0
 */
export const aggregationWeights = (
  mode: AggregationMode,
  mask: Uint8Array,
  batch: number,
  length: number,
  all: Totals,
  normLength: number = length
): Float32Array => {
  const w = new Float32Array(batch * length)
  for (let b = 0; b < batch; b++) {
    let n = 0
    for (let t = 0; t < length; t++) n += mask[b * length + t] !== 0 ? 1 : 0
    if (n === 0) continue
    const perToken = mode === "token-mean"
      ? 1 / all.tokens
      : mode === "seq-mean-token-sum"
      ? 1 / all.sequences
      : mode === "seq-mean-token-mean"
      ? 1 / (n * all.sequences)
      : 1 / normLength
    for (let t = 0; t < length; t++) if (mask[b * length + t] !== 0) w[b * length + t] = perToken
  }
  return w
}

/**
 * verl's `agg_loss` written as the plain formula (the reference {@link aggregationWeights} is tested against).
 * Sequences without loss tokens are left out of sequence means (verl would divide by zero).
 *
 * @category combinators
 * @since 0.1.0
 */
export const aggregate = (
  lossMat: ArrayLike<number>,
  mask: Uint8Array,
  batch: number,
  length: number,
  mode: AggregationMode,
  normLength: number = length
): number => {
  const seqSums: Array<number> = []
  const seqCounts: Array<number> = []
  for (let b = 0; b < batch; b++) {
    let s = 0
    let n = 0
    for (let t = 0; t < length; t++) {
      if (mask[b * length + t] !== 0) {
        s += lossMat[b * length + t]!
        n++
      }
    }
    if (n > 0) {
      seqSums.push(s)
      seqCounts.push(n)
    }
  }
  const sum = (xs: ReadonlyArray<number>) => xs.reduce((a, x) => a + x, 0)
  if (seqSums.length === 0) return 0
  switch (mode) {
    case "token-mean":
      return sum(seqSums) / sum(seqCounts)
    case "seq-mean-token-sum":
      return sum(seqSums) / seqSums.length
    case "seq-mean-token-mean":
      return sum(seqSums.map((s, i) => s / seqCounts[i]!)) / seqSums.length
    case "seq-mean-token-sum-norm":
      return sum(seqSums) / normLength
  }
}

// ===== The whole loss =====

/**
 * Token-aligned inputs of one (micro-)batch, `[batch × length]` row-major; position `t` holds the target token
 * `y_t` predicted from the prefix up to `t`.
 *
 * @category models
 * @since 0.1.0
 */
export interface TokenBatch {
  readonly batch: number
  readonly length: number
  readonly targets: Int32Array
  /** 1 where the loss applies (the target was sampled by the policy). */
  readonly mask: Uint8Array
  /** Aggregation weights, from {@link aggregationWeights}. */
  readonly weights: Float32Array
  readonly advantages?: Float32Array | undefined
  readonly oldLogprobs?: Float32Array | undefined
  readonly samplerLogprobs?: Float32Array | undefined
  readonly refLogprobs?: Float32Array | undefined
}

/**
 * Sums over the loss tokens of a batch; divide by `tokens` for means (sums accumulate across micro-batches).
 *
 * @category models
 * @since 0.1.0
 */
export interface StatSums {
  readonly tokens: number
  readonly clipped: number
  readonly clippedLower: number
  /** Σ (log π_old − log π): verl's `ppo_kl`; for the `value` loss, Σ (v − R)². */
  readonly approxKl: number
  readonly entropy: number
  /** Σ KL-to-reference (the configured estimator). */
  readonly kl: number
}

/**
 * The whole loss from logits, in float64: the reference the emitted graph must match.
 *
 * @category constructors
 * @since 0.1.0
 */
export const reference = (
  config: Config,
  batch: TokenBatch,
  logits: ArrayLike<number>,
  vocab: number
): { readonly loss: number; readonly tokenLogprobs: Float64Array; readonly stats: StatSums } => {
  const n = batch.batch * batch.length
  const tokenLogprobs = new Float64Array(n)
  let loss = 0
  const stats = { tokens: 0, clipped: 0, clippedLower: 0, approxKl: 0, entropy: 0, kl: 0 }
  // GSPO's ratio of a token reads its whole sequence's logprobs: a first pass computes them.
  const seqRatios = config.policyLoss === "gspo"
    ? sequenceRatios(
      Float64Array.from(
        { length: n },
        (_, i) => logSoftmax(logits, i * vocab, vocab, config.temperature ?? 1)[batch.targets[i]!]!
      ),
      batch.oldLogprobs!,
      batch.mask,
      batch.batch,
      batch.length
    )
    : undefined
  for (let i = 0; i < n; i++) {
    if (config.policyLoss === "value") {
      const v = logits[i * vocab]!
      tokenLogprobs[i] = v
      if (batch.mask[i] === 0) continue
      const token = valueToken(v, batch.oldLogprobs![i]!, batch.advantages![i]!, config.clipLow)
      loss += batch.weights[i]! * token.loss
      stats.tokens++
      stats.clipped += token.clipped ? 1 : 0
      stats.approxKl += token.squaredError
      continue
    }
    const lsm = logSoftmax(logits, i * vocab, vocab, config.temperature ?? 1)
    const logprob = lsm[batch.targets[i]!]!
    tokenLogprobs[i] = logprob
    if (batch.mask[i] === 0) continue
    const h = entropy(lsm)
    let tokenLoss: number
    if (config.policyLoss === "nll") {
      tokenLoss = -logprob
    } else {
      const old = batch.oldLogprobs![i]!
      const advantage = batch.advantages![i]!
      const token = config.policyLoss === "gspo"
        ? { ...gspoToken(seqRatios![Math.floor(i / batch.length)]!, advantage, config), clippedLower: false }
        : config.policyLoss === "cispo"
        ? { ...cispoToken(logprob, old, advantage, config), clippedLower: false }
        : ppoToken(logprob, old, advantage, config)
      const tis = config.tisCap === undefined
        ? 1
        : truncatedImportanceWeight(old, batch.samplerLogprobs![i]!, config.tisCap)
      tokenLoss = token.loss * tis
      stats.clipped += token.clipped ? 1 : 0
      stats.clippedLower += token.clippedLower ? 1 : 0
      stats.approxKl += old - Math.min(Math.max(logprob, old - 20), old + 20)
    }
    if (config.klCoef !== 0) {
      const kl = klToken(logprob, batch.refLogprobs![i]!, config.klEstimator)
      tokenLoss += config.klCoef * kl
      stats.kl += kl
    }
    tokenLoss -= config.entropyCoef * h
    loss += batch.weights[i]! * tokenLoss
    stats.tokens++
    stats.entropy += h
  }
  return { loss, tokenLogprobs, stats }
}
