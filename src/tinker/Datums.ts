/**
 * Tinker's forward/backward batches (`Datum`s and a loss function) and our learner's micro-batches, both ways, as
 * pure functions.
 *
 * **Rows.** One datum is one row: `model_input`'s token ids are the row's inputs and `loss_fn_inputs.target_tokens`
 * its targets, position by position (Tinker's datums are already shifted, as `Packing.MicroBatch` rows are). Rows are
 * right-padded to the longest datum, rounded up to `lengthMultiple` (16, as `Packing` rounds), so that a batch the
 * client cut from one of our micro-batches comes back with its shape.
 *
 * **Losses.** Every Tinker loss is a plain sum over tokens of `weights[t] · ℓ_t` (SkyRL's `safe_loss_mask`;
 * `weights` defaults to 1), which is exactly our graph's aggregation `Σ loss_weights[t] · ℓ_t` with
 * `loss_weights = weights` and the loss mask `weights ≠ 0`; `logprobs` are the sampling logprobs (the ratio's
 * denominator), `advantages` the per-token advantages:
 *
 * | Tinker | ours (`Loss.Config`) | exact? |
 * | --- | --- | --- |
 * | `cross_entropy`: `−w·log π` | `nll` | yes |
 * | `importance_sampling`: `−w·r·A` | `ppo`, clip range [0, 1 + 10⁹] (never reached) | yes (\*) |
 * | `ppo`: `−w·min(r·A, clip(r, lo, hi)·A)` | `ppo`, `clipLow = 1 − lo`, `clipHigh = hi − 1` | yes (\*) |
 * | `cispo`: `−w·sg(clip(r, lo, hi))·A·log π` | `cispo`, same range | the gradient; the loss's value differs |
 * | `dro` | none | refused |
 *
 * (\*) Our ratio clamps `log r` to ±20 first: ratios beyond e^±20 differ.
 *
 * `lo`, `hi` come from `loss_fn_config` (`clip_low_threshold`, `clip_high_threshold`; SkyRL's defaults 0.8 and 1.2).
 * Per-datum thresholds (the SDK lists them as `loss_fn_inputs` keys) are refused: our clip range is one per graph.
 *
 * **What our micro-batches carry that a datum cannot**: shared prompts (`prefix`), explicit `positionIds`, the KL
 * reference's logprobs and a separate proximal ("old") policy; {@link fromMicroBatch} refuses the first two, and sends
 * the old logprobs (when present) as the datum's `logprobs`, the ratio's denominator.
 *
 * @since 0.1.0
 */
import type * as Loss from "../Loss.ts"
import type * as Packing from "../Packing.ts"
import type * as Types from "./Types.ts"

// ===== Models =====

/** A batch or configuration the mapping cannot take, and why (a user error: the request is at fault). */
export interface Refusal {
  readonly refused: string
}

const refusal = (refused: string): Refusal => ({ refused })

/**
 * Whether `u` is a refusal.
 *
 * @category guards
 * @since 0.1.0
 */
export const isRefusal = (u: unknown): u is Refusal =>
  typeof u === "object" && u !== null && typeof (u as Refusal).refused === "string"

/**
 * The Tinker losses our learner computes.
 *
 * @category models
 * @since 0.1.0
 */
export type Supported = Exclude<Types.LossFnType, "dro">

/**
 * Options of {@link toMicroBatch}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Padded lengths are rounded up to a multiple of this (default 16, `Packing`'s). */
  readonly lengthMultiple?: number
  /** Token ids must lie in `[0, vocabSize)` (default: not checked here; the trainer checks). */
  readonly vocabSize?: number
}

/** SkyRL's defaults (`skyrl/backends/jax.py`); the SDK sets none. */
export const defaultClip = { low: 0.8, high: 1.2 } as const

/** A clip bound never reached: ratios are at most e^20 ≈ 4.9·10⁸. */
const unclipped = 1e9

const base: Loss.Config = {
  policyLoss: "nll",
  // The weights are given per token, so the aggregation mode names nothing the graph reads.
  aggregation: "token-mean",
  clipLow: 0.2,
  clipHigh: 0.2,
  klCoef: 0,
  klEstimator: "k3",
  entropyCoef: 0
}

// ===== Losses =====

/**
 * Our loss configuration for Tinker's loss `lossFn` with its `loss_fn_config`; refuses `dro`, unknown config keys
 * and thresholds outside `0 ≤ lo ≤ 1 ≤ hi`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const lossConfig = (
  lossFn: Types.LossFnType,
  config?: Readonly<Record<string, number>> | undefined
): Loss.Config | Refusal => {
  if (lossFn === "dro") {
    return refusal("loss_fn dro has no counterpart in this learner (cross_entropy, importance_sampling, ppo, cispo do)")
  }
  const keys = Object.keys(config ?? {})
  const allowed = lossFn === "ppo" || lossFn === "cispo" ? ["clip_low_threshold", "clip_high_threshold"] : []
  const stranger = keys.find((k) => !allowed.includes(k))
  if (stranger !== undefined) return refusal(`loss_fn_config.${stranger} is not a setting of ${lossFn}`)
  if (lossFn === "cross_entropy") return base
  if (lossFn === "importance_sampling") return { ...base, policyLoss: "ppo", clipLow: 1, clipHigh: unclipped }
  const lo = config?.["clip_low_threshold"] ?? defaultClip.low
  const hi = config?.["clip_high_threshold"] ?? defaultClip.high
  if (!(lo >= 0 && lo <= 1 && hi >= 1 && Number.isFinite(hi))) {
    return refusal(`clip thresholds need 0 ≤ clip_low_threshold ≤ 1 ≤ clip_high_threshold, got ${lo}, ${hi}`)
  }
  return { ...base, policyLoss: lossFn, clipLow: 1 - lo, clipHigh: hi - 1 }
}

// ===== Datums → micro-batch =====

/** The token ids of `input`; only text chunks are supported. */
export const tokensOf = (input: Types.ModelInput): ReadonlyArray<number> | Refusal => {
  const ids: Array<number> = []
  for (const chunk of input.chunks) {
    if (chunk.type !== "encoded_text") return refusal(`model_input chunks of type ${chunk.type} are not supported`)
    ids.push(...chunk.tokens)
  }
  return ids
}

/** A dense one-dimensional tensor's values, `length` of them. */
const dense = (name: string, t: Types.TensorData, length: number): ReadonlyArray<number> | Refusal => {
  if (t.sparse_crow_indices !== undefined || t.sparse_col_indices !== undefined) {
    return refusal(`loss_fn_inputs.${name}: sparse tensors are not supported`)
  }
  if (t.shape !== undefined && !(t.shape.length === 1 && t.shape[0] === t.data.length)) {
    return refusal(`loss_fn_inputs.${name}: shape [${t.shape.join(", ")}] is not one dimension of ${t.data.length}`)
  }
  if (t.data.length !== length) {
    return refusal(`loss_fn_inputs.${name} has ${t.data.length} values for ${length} tokens of model_input`)
  }
  if (t.data.some((x) => !Number.isFinite(x))) return refusal(`loss_fn_inputs.${name} holds a non-finite value`)
  return t.data
}

/** The inputs each loss reads (besides `weights`, optional for all). */
const required = (lossFn: Supported): ReadonlyArray<string> =>
  lossFn === "cross_entropy" ? ["target_tokens"] : ["target_tokens", "logprobs", "advantages"]

interface Row {
  readonly inputs: ReadonlyArray<number>
  readonly columns: Readonly<Record<string, ReadonlyArray<number>>>
}

const rowOf = (datum: Types.Datum, index: number, lossFn: Supported, vocabSize?: number): Row | Refusal => {
  const inputs = tokensOf(datum.model_input)
  if (isRefusal(inputs)) return refusal(`data[${index}]: ${inputs.refused}`)
  const names = required(lossFn)
  const stranger = Object.keys(datum.loss_fn_inputs).find((k) => !names.includes(k) && k !== "weights")
  if (stranger !== undefined) {
    return refusal(`data[${index}]: loss_fn_inputs.${stranger} is not an input of ${lossFn} here`)
  }
  const columns: Record<string, ReadonlyArray<number>> = {}
  for (const name of [...names, "weights"]) {
    const t = datum.loss_fn_inputs[name]
    if (t === undefined) {
      if (name === "weights") continue
      return refusal(`data[${index}]: ${lossFn} needs loss_fn_inputs.${name}`)
    }
    const values = dense(name, t, inputs.length)
    if (isRefusal(values)) return refusal(`data[${index}]: ${values.refused}`)
    columns[name] = values
  }
  const limit = vocabSize ?? Number.MAX_SAFE_INTEGER
  for (const ids of [inputs, columns["target_tokens"]!]) {
    for (const id of ids) {
      if (!(Number.isInteger(id) && id >= 0 && id < limit)) {
        return refusal(`data[${index}]: token id ${id} is not in the vocabulary`)
      }
    }
  }
  return { inputs, columns }
}

/**
 * One micro-batch of `data` for loss `lossFn`: one row per datum, in order (`sequenceIndex` is the datum's index, -1
 * for an empty datum, a padding row).
 *
 * @category constructors
 * @since 0.1.0
 */
export const toMicroBatch = (
  data: ReadonlyArray<Types.Datum>,
  lossFn: Supported,
  options: Options = {}
): Packing.MicroBatch | Refusal => {
  if (data.length === 0) return refusal("forward_backward_input.data is empty")
  const rows: Array<Row> = []
  for (const [i, datum] of data.entries()) {
    const row = rowOf(datum, i, lossFn, options.vocabSize)
    if (isRefusal(row)) return row
    rows.push(row)
  }
  const multiple = options.lengthMultiple ?? 16
  const longest = Math.max(1, ...rows.map((r) => r.inputs.length))
  const length = Math.ceil(longest / multiple) * multiple
  const cells = rows.length * length
  const mb = {
    batch: rows.length,
    length,
    inputIds: new Int32Array(cells),
    attentionMask: new Uint8Array(cells),
    targets: new Int32Array(cells),
    mask: new Uint8Array(cells),
    weights: new Float32Array(cells),
    advantages: new Float32Array(cells),
    samplerLogprobs: new Float32Array(cells),
    refLogprobs: new Float32Array(cells),
    sequenceIndex: new Int32Array(rows.length),
    lossTokens: 0
  }
  let lossTokens = 0
  rows.forEach((row, r) => {
    const { inputs, columns } = row
    const { target_tokens: targets, weights, advantages, logprobs } = columns
    const at = r * length
    mb.sequenceIndex[r] = inputs.length === 0 ? -1 : r
    mb.inputIds.set(inputs, at)
    mb.attentionMask.fill(1, at, at + inputs.length)
    mb.targets.set(targets!, at)
    if (advantages !== undefined) mb.advantages.set(advantages, at)
    if (logprobs !== undefined) mb.samplerLogprobs.set(logprobs, at)
    for (let t = 0; t < inputs.length; t++) {
      const w = weights?.[t] ?? 1
      mb.weights[at + t] = w
      mb.mask[at + t] = w === 0 ? 0 : 1
      lossTokens += w === 0 ? 0 : 1
    }
  })
  return { ...mb, lossTokens }
}

// ===== Micro-batch → datums =====

const tensor = (dtype: Types.TensorDtype, data: ArrayLike<number>): Types.TensorData => ({
  data: Array.from(data),
  dtype,
  shape: [data.length]
})

/** The real tokens of row `r` (its attention mask's ones, which lead the row). */
const realLength = (mb: Packing.MicroBatch, r: number): number => {
  let n = 0
  while (n < mb.length && mb.attentionMask[r * mb.length + n] === 1) n++
  return n
}

/**
 * The datums of micro-batch `mb` for loss `lossFn`, one per row (a padding row gives an empty datum): what a client
 * sends so that the server's {@link toMicroBatch} rebuilds `mb` (up to `sequenceIndex`, `refLogprobs`, and the old
 * logprobs, which arrive as the sampling logprobs). Refuses shared prompts, explicit positions, and a loss mask that
 * differs from `weights ≠ 0`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromMicroBatch = (mb: Packing.MicroBatch, lossFn: Supported): Array<Types.Datum> | Refusal => {
  if (mb.prefix !== undefined) return refusal("a micro-batch with shared prompts (sharePrefix) has no datum form")
  if (mb.positionIds !== undefined) return refusal("a micro-batch with explicit positions has no datum form")
  const data: Array<Types.Datum> = []
  for (let r = 0; r < mb.batch; r++) {
    const n = realLength(mb, r)
    const from = r * mb.length, to = from + n
    for (let at = from; at < to; at++) {
      if ((mb.mask[at] === 1) !== (mb.weights[at] !== 0)) {
        return refusal(`row ${r}, position ${at - from}: the loss mask and the weights disagree`)
      }
    }
    const slice = <A extends Int32Array | Float32Array>(a: A) => a.subarray(from, to)
    const inputs: Types.LossFnInputs = lossFn === "cross_entropy" ?
      { target_tokens: tensor("int64", slice(mb.targets)), weights: tensor("float32", slice(mb.weights)) } :
      {
        target_tokens: tensor("int64", slice(mb.targets)),
        weights: tensor("float32", slice(mb.weights)),
        logprobs: tensor("float32", slice(mb.oldLogprobs ?? mb.samplerLogprobs)),
        advantages: tensor("float32", slice(mb.advantages))
      }
    data.push({
      model_input: { chunks: [{ tokens: Array.from(slice(mb.inputIds)), type: "encoded_text" }] },
      loss_fn_inputs: inputs
    })
  }
  return data
}

// ===== Outputs =====

/**
 * Each datum's `loss_fn_outputs`: the target tokens' logprobs under the weights the pass ran with, from the pass's
 * `[batch × length]` token logprobs.
 *
 * @category constructors
 * @since 0.1.0
 */
export const outputs = (
  data: ReadonlyArray<Types.Datum>,
  length: number,
  tokenLogprobs: Float32Array
): Array<Types.LossFnOutput> =>
  data.map((datum, r) => {
    const n = datum.loss_fn_inputs["target_tokens"]?.data.length ?? 0
    return { logprobs: tensor("float32", tokenLogprobs.subarray(r * length, r * length + n)) }
  })
