/**
 * Advantage estimators: small pure functions over typed arrays, registered by name (verl's `core_algos.py`).
 *
 * Every estimator takes the same token-level input, laid out row-major as `[batch × length]`:
 * token rewards (an outcome reward sits on the last response token), the response mask (1 where the policy
 * sampled the token), the group of each row (a GRPO group = the samples of one prompt) and whether the row is
 * included. Rows that are not included (reward not applicable, failed, masked trajectory) get advantage 0 and are
 * **left out of their group's baseline and of batch whitening** (TRL's unscorable rows), which verl does not do.
 *
 * Formulas follow verl (`volcengine/verl`, `verl/trainer/ppo/core_algos.py`):
 * - `grpo`: `(r − mean_g) / (std_g + ε)`, `std` with Bessel's correction; a group of one has mean 0 and std 1.
 * - `grpo-no-std` (Dr.GRPO, arXiv:2503.20783): `r − mean_g`.
 * - `rloo` (arXiv:2402.14740): `r·n/(n−1) − mean_g·n/(n−1)`, i.e. `r` minus the mean of the others.
 * - `reinforce++` (arXiv:2501.03262): discounted returns over the response tokens (observation tokens between turns
 *   carry the return through undiscounted), whitened over the batch.
 * - `reinforce++-baseline`: `r − mean_g` broadcast over the response, whitened over the batch.
 * - `gae` (arXiv:1506.02438): GAE with a value head; TD errors and values skip observation tokens; whitened.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"

// ===== Models =====

/**
 * The registered estimator names.
 *
 * @category models
 * @since 0.1.0
 */
export const Estimator = Schema.Literals(["grpo", "grpo-no-std", "rloo", "reinforce++", "reinforce++-baseline", "gae"])
export type Estimator = typeof Estimator.Type

/**
 * Token-level input of every estimator. All `[batch × length]` arrays are row-major.
 *
 * @category models
 * @since 0.1.0
 */
export interface Input {
  readonly batch: number
  readonly length: number
  /** `[batch × length]`; outcome rewards on the last response token. */
  readonly tokenRewards: Float32Array | Float64Array
  /** `[batch × length]`; 1 where the policy sampled the token. */
  readonly responseMask: Uint8Array
  /** `[batch]`; the group (prompt) of each row. */
  readonly groupIndex: Int32Array
  /** `[batch]`; 0 for rows excluded from the loss and from baselines. Defaults to all ones. */
  readonly include?: Uint8Array | undefined
  /** `[batch × length]`; value-head estimates, required by `gae`. */
  readonly values?: Float32Array | Float64Array | undefined
}

/**
 * Estimator hyper-parameters.
 *
 * @category models
 * @since 0.1.0
 */
export interface Config {
  /** Discount, used by `reinforce++` and `gae`. */
  readonly gamma: number
  /** GAE λ. */
  readonly lambda: number
  /** Added to the group std in `grpo`. */
  readonly epsilon: number
}

/**
 * verl's defaults: γ = 1, λ = 1, ε = 1e-6.
 *
 * @category constructors
 * @since 0.1.0
 */
export const defaultConfig: Config = { gamma: 1, lambda: 1, epsilon: 1e-6 }

/**
 * Output of every estimator: `[batch × length]` advantages (zero off the response mask and on excluded rows) and
 * returns (the value target for `gae`; equal to the advantages for outcome estimators, as in verl).
 *
 * @category models
 * @since 0.1.0
 */
export interface Output {
  readonly advantages: Float64Array
  readonly returns: Float64Array
}

/**
 * No estimator has that name (`known` lists them).
 *
 * @category errors
 * @since 0.1.0
 */
export class UnknownEstimator extends Schema.TaggedError<UnknownEstimator>()("UnknownEstimator", {
  message: Schema.String,
  estimator: Schema.String,
  known: Schema.Array(Schema.String)
}) {}

/**
 * An array's size does not match the batch and length (or those are not sizes).
 *
 * @category errors
 * @since 0.1.0
 */
export class ShapeMismatch extends Schema.TaggedError<ShapeMismatch>()("ShapeMismatch", { message: Schema.String }) {}

/**
 * The estimator needs value estimates and none were given.
 *
 * @category errors
 * @since 0.1.0
 */
export class MissingValues extends Schema.TaggedError<MissingValues>()("MissingValues", { message: Schema.String }) {}

/**
 * An input holds NaN or an infinity.
 *
 * @category errors
 * @since 0.1.0
 */
export class NotFinite extends Schema.TaggedError<NotFinite>()("NotFinite", {
  message: Schema.String,
  /** Which input. */
  array: Schema.String,
  /** Where in it. */
  index: Schema.Int
}) {}

/**
 * Why an estimator rejected its input (a clear typed error instead of `NaN` advantages).
 *
 * @category errors
 * @since 0.1.0
 */
export const AdvantageErrorReason = Schema.Union([UnknownEstimator, ShapeMismatch, MissingValues, NotFinite])
export type AdvantageErrorReason = typeof AdvantageErrorReason.Type

/**
 * An estimator rejected its input (a clear typed error instead of `NaN` advantages). `message` is the reason's.
 * Handle reasons with `Effect.catchReason("AdvantageError", "UnknownEstimator", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class AdvantageError extends Schema.TaggedError<AdvantageError>()("AdvantageError", {
  reason: AdvantageErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `advantageError`; a reason left out is a compile error. */
const reasons = { UnknownEstimator, ShapeMismatch, MissingValues, NotFinite } satisfies Record<
  AdvantageErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message.
 *
 * @category errors
 * @since 0.1.0
 */
export type AdvantageErrorFacts<Tag extends AdvantageErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `AdvantageError` of the reason tagged `tag`: `advantageError("MissingValues", "gae needs value estimates")`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const advantageError = <Tag extends AdvantageErrorReason["_tag"]>(
  tag: Tag,
  message: string,
  facts?: AdvantageErrorFacts<Tag>
): AdvantageError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => AdvantageErrorReason
  return new AdvantageError({ reason: new Reason({ ...facts, message }) })
}

// ===== Helpers =====

const included = (input: Input, row: number): boolean => input.include === undefined || input.include[row] !== 0

/** Outcome score of each row: the sum of its token rewards. */
const rowScores = (input: Input): Float64Array => {
  const { batch, length, tokenRewards } = input
  const scores = new Float64Array(batch)
  for (let b = 0; b < batch; b++) {
    let s = 0
    for (let t = 0; t < length; t++) s += tokenRewards[b * length + t]!
    scores[b] = s
  }
  return scores
}

interface GroupStats {
  readonly count: Map<number, number>
  readonly mean: Map<number, number>
  readonly std: Map<number, number>
}

/** Per-group count, mean and unbiased std over included rows (Welford-free two-pass: groups are small). */
const groupStats = (input: Input, scores: Float64Array): GroupStats => {
  const count = new Map<number, number>()
  const sum = new Map<number, number>()
  for (let b = 0; b < input.batch; b++) {
    if (!included(input, b)) continue
    const g = input.groupIndex[b]!
    count.set(g, (count.get(g) ?? 0) + 1)
    sum.set(g, (sum.get(g) ?? 0) + scores[b]!)
  }
  const mean = new Map<number, number>()
  for (const [g, n] of count) mean.set(g, n > 1 ? sum.get(g)! / n : 0)
  const sq = new Map<number, number>()
  for (let b = 0; b < input.batch; b++) {
    if (!included(input, b)) continue
    const g = input.groupIndex[b]!
    const d = scores[b]! - mean.get(g)!
    sq.set(g, (sq.get(g) ?? 0) + d * d)
  }
  const std = new Map<number, number>()
  for (const [g, n] of count) std.set(g, n > 1 ? Math.sqrt(sq.get(g)! / (n - 1)) : 1)
  return { count, mean, std }
}

/** Broadcast one value per row over its response mask; excluded rows get 0. */
const broadcast = (input: Input, perRow: (row: number) => number): Float64Array => {
  const { batch, length, responseMask } = input
  const out = new Float64Array(batch * length)
  for (let b = 0; b < batch; b++) {
    if (!included(input, b)) continue
    const a = perRow(b)
    for (let t = 0; t < length; t++) if (responseMask[b * length + t] !== 0) out[b * length + t] = a
  }
  return out
}

/** Effective mask: the response mask with excluded rows zeroed. */
const effectiveMask = (input: Input): Uint8Array => {
  const mask = Uint8Array.from(input.responseMask)
  for (let b = 0; b < input.batch; b++) if (!included(input, b)) mask.fill(0, b * input.length, (b + 1) * input.length)
  return mask
}

/**
 * verl's `masked_whiten`: `(x − mean) / sqrt(var + 1e-8)` with mean and unbiased variance over masked entries;
 * entries off the mask become 0. In place.
 *
 * @category combinators
 * @since 0.1.0
 */
export const maskedWhiten = (values: Float64Array, mask: Uint8Array): Float64Array => {
  let n = 0
  let sum = 0
  for (let i = 0; i < values.length; i++) {
    if (mask[i] !== 0) {
      n++
      sum += values[i]!
    }
  }
  if (n === 0) return values.fill(0)
  const mean = sum / n
  let sq = 0
  for (let i = 0; i < values.length; i++) if (mask[i] !== 0) sq += (values[i]! - mean) ** 2
  // verl: masked_mean of squares, then Bessel's correction n/(n−1) (skipped when n = 1, where it is undefined).
  const variance = n > 1 ? sq / (n - 1) : sq / n
  const scale = 1 / Math.sqrt(variance + 1e-8)
  for (let i = 0; i < values.length; i++) values[i] = mask[i] !== 0 ? (values[i]! - mean) * scale : 0
  return values
}

// ===== Estimators =====

const grpo = (normalizeByStd: boolean) => (input: Input, config: Config): Output => {
  const scores = rowScores(input)
  const { mean, std } = groupStats(input, scores)
  const advantages = broadcast(input, (b) => {
    const g = input.groupIndex[b]!
    const centred = scores[b]! - mean.get(g)!
    return normalizeByStd ? centred / (std.get(g)! + config.epsilon) : centred
  })
  return { advantages, returns: advantages }
}

const rloo = (input: Input): Output => {
  const scores = rowScores(input)
  const { count, mean } = groupStats(input, scores)
  const advantages = broadcast(input, (b) => {
    const g = input.groupIndex[b]!
    const n = count.get(g)!
    return n > 1 ? (scores[b]! * n) / (n - 1) - (mean.get(g)! * n) / (n - 1) : scores[b]!
  })
  return { advantages, returns: advantages }
}

const reinforcePlusPlus = (input: Input, config: Config): Output => {
  const { batch, length, tokenRewards, responseMask } = input
  const returns = new Float64Array(batch * length)
  for (let b = 0; b < batch; b++) {
    let running = 0
    for (let t = length - 1; t >= 0; t--) {
      const i = b * length + t
      // Observation tokens (a tool's or the environment's reply between turns, a later segment's prompt) are not
      // actions: the return passes through them undiscounted, as GAE skips them, so an earlier turn still gets the
      // outcome reward. verl reset it at every masked-out token, which left every turn but the last with a return
      // of 0 (verl issue #7278, fixed in #7300); trailing padding stays 0, since each row's scan starts at 0.
      if (responseMask[i] === 0) continue
      running = tokenRewards[i]! + config.gamma * running
      returns[i] = running
    }
  }
  return { advantages: maskedWhiten(Float64Array.from(returns), effectiveMask(input)), returns }
}

const reinforcePlusPlusBaseline = (input: Input): Output => {
  const scores = rowScores(input)
  const { mean } = groupStats(input, scores)
  const centred = broadcast(input, (b) => scores[b]! - mean.get(input.groupIndex[b]!)!)
  const advantages = maskedWhiten(centred, effectiveMask(input))
  return { advantages, returns: advantages }
}

const gae = (input: Input, config: Config): Output => {
  const { batch, length, tokenRewards } = input
  const values = input.values!
  const mask = effectiveMask(input)
  const advantages = new Float64Array(batch * length)
  for (let b = 0; b < batch; b++) {
    let nextValue = 0
    let lastGaeLam = 0
    for (let t = length - 1; t >= 0; t--) {
      const i = b * length + t
      const delta = tokenRewards[i]! + config.gamma * nextValue - values[i]!
      const gaeLam = delta + config.gamma * config.lambda * lastGaeLam
      // Observation tokens carry neither a value nor a TD error: skip them (verl's multi-turn GAE).
      if (mask[i] !== 0) {
        nextValue = values[i]!
        lastGaeLam = gaeLam
      }
      advantages[i] = lastGaeLam
    }
  }
  const returns = new Float64Array(batch * length)
  for (let i = 0; i < returns.length; i++) returns[i] = advantages[i]! + values[i]!
  return { advantages: maskedWhiten(advantages, mask), returns }
}

/**
 * The registry: estimator name → pure function. Use {@link compute} for validated input.
 *
 * @category constructors
 * @since 0.1.0
 */
export const registry: { readonly [K in Estimator]: (input: Input, config: Config) => Output } = {
  "grpo": grpo(true),
  "grpo-no-std": grpo(false),
  "rloo": rloo,
  "reinforce++": reinforcePlusPlus,
  "reinforce++-baseline": reinforcePlusPlusBaseline,
  "gae": gae
}

const fail = advantageError

/**
 * Checks shapes and finiteness; returns the first problem found.
 *
 * @category combinators
 * @since 0.1.0
 */
export const validate = (estimator: string, input: Input): AdvantageError | undefined => {
  if (!Object.hasOwn(registry, estimator)) {
    const known = Object.keys(registry)
    const message = `unknown estimator "${estimator}"; known: ${known.join(", ")}`
    return fail("UnknownEstimator", message, { estimator, known })
  }
  const { batch, length } = input
  const cells = batch * length
  if (!Number.isInteger(batch) || !Number.isInteger(length) || batch < 0 || length < 0) {
    return fail("ShapeMismatch", `batch and length must be non-negative integers, got ${batch} × ${length}`)
  }
  const sizes: Array<[string, number | undefined, number]> = [
    ["tokenRewards", input.tokenRewards.length, cells],
    ["responseMask", input.responseMask.length, cells],
    ["groupIndex", input.groupIndex.length, batch],
    ["include", input.include?.length, batch],
    ["values", input.values?.length, cells]
  ]
  for (const [name, size, expected] of sizes) {
    if (size !== undefined && size !== expected) {
      const shape = `batch ${batch} × length ${length}`
      return fail("ShapeMismatch", `${name} has ${size} entries, expected ${expected} (${shape})`)
    }
  }
  if (estimator === "gae" && input.values === undefined) return fail("MissingValues", "gae needs value estimates")
  for (const [name, array] of [["tokenRewards", input.tokenRewards], ["values", input.values]] as const) {
    if (array === undefined) continue
    for (let i = 0; i < array.length; i++) {
      if (!Number.isFinite(array[i]!)) {
        return fail("NotFinite", `${name}[${i}] is ${array[i]}`, { array: name, index: i })
      }
    }
  }
  return undefined
}

/**
 * Computes advantages with the named estimator after validating the input.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import * as Advantage from "agentfly/Advantage"
 *
 * // two groups of two single-token responses
 * const out = Advantage.compute("grpo", {
 *   batch: 4, length: 1,
 *   tokenRewards: Float64Array.of(1, 0, 1, 1),
 *   responseMask: Uint8Array.of(1, 1, 1, 1),
 *   groupIndex: Int32Array.of(0, 0, 1, 1)
 * })
 * ```
 *
 * @category constructors
 * @since 0.1.0
 */
export const compute = (
  estimator: Estimator,
  input: Input,
  config: Partial<Config> = {}
): Effect.Effect<Output, AdvantageError> =>
  Effect.suspend(() => {
    const error = validate(estimator, input)
    return error !== undefined
      ? Effect.fail(error)
      : Effect.succeed(registry[estimator](input, { ...defaultConfig, ...config }))
  })
