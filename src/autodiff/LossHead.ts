/**
 * The loss head emitted into the training graph: per-token logprobs (LogSoftmax + GatherElements), entropy, the
 * NLL, PPO's clipped surrogate with dual clip, GSPO's sequence ratio or CISPO's clipped IS weights, truncated
 * importance weights, KL to the reference (k1/k3), the entropy bonus, and aggregation as a weighted sum. It is the graph form of `Loss.reference` and is tested
 * against it.
 *
 * Inputs it declares (all `[batch, length]`): `targets` (int64), `loss_weights` (aggregation weights, zero off the
 * mask), `loss_mask`, and, as the configuration needs them, `advantages`, `old_logprobs`, `sampler_logprobs`,
 * `ref_logprobs`. Outputs: the scalar loss, `token_logprobs [batch, length]` and `stats [6]` = sums over loss tokens
 * of (tokens, clipped, clipped lower, approx KL, entropy, KL to reference), see `Loss.StatSums`.
 *
 * @since 0.1.0
 */
import * as Graph from "../onnx/Graph.ts"
import * as Loss from "../Loss.ts"
import type * as Backward from "./Backward.ts"

/**
 * Names of the head's values.
 *
 * @category models
 * @since 0.1.0
 */
export interface Head {
  readonly loss: string
  readonly tokenLogprobs: string
  readonly stats: string
  /** Data inputs declared by the head, in order. */
  readonly inputs: ReadonlyArray<string>
}

/**
 * Which data inputs a configuration reads.
 *
 * @category combinators
 * @since 0.1.0
 */
export const inputNames = (config: Loss.Config): ReadonlyArray<string> =>
  config.policyLoss === "value" ? ["loss_weights", "loss_mask", "advantages", "old_logprobs"] : [
  "targets",
  "loss_weights",
  "loss_mask",
  ...(Loss.isPolicyGradient(config) ? ["advantages", "old_logprobs"] : []),
  ...(Loss.isPolicyGradient(config) && config.tisCap !== undefined ? ["sampler_logprobs"] : []),
  ...(config.klCoef !== 0 ? ["ref_logprobs"] : [])
]

/**
 * Emits the head on `logits [batch, length, vocab]`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const emit = (
  e: Backward.Emitter,
  logits: string,
  config: Loss.Config,
  batch: number,
  length: number
): Head => {
  const dtype = e.dtype(logits)
  const vocab = e.dims(logits).at(-1)!
  const n = batch * length
  const data = declareInputs(e, config, batch, length, dtype)
  const input = (name: string) => data.get(name)!
  if (config.policyLoss === "value") return valueHead(e, logits, config, batch, length, input)
  const reshaped = e.op("Reshape", [logits, e.ints([n, vocab])])
  const temperature = config.temperature ?? 1
  const flat = temperature === 1 ? reshaped : e.op("Div", [reshaped, e.scalar(temperature, dtype)])
  const { logprob, entropy } = tokenTerms(e, flat, e.op("Unsqueeze", [input("targets"), e.ints([1])]))
  return lossOf(e, config, batch, length, data, logprob, entropy)
}

/**
 * The data inputs of a configuration, declared `[batch, length]` and flattened to `[batch × length]`, by name.
 *
 * @category constructors
 * @since 0.1.0
 */
export const declareInputs = (
  e: Backward.Emitter,
  config: Loss.Config,
  batch: number,
  length: number,
  dtype: Graph.DType
): ReadonlyMap<string, string> => {
  const declare = (name: string, type: Graph.DType) => {
    e.graph.input(name, type, [batch, length])
    e.shapes.set(name, { dtype: type, dims: [batch, length] })
    return e.op("Reshape", [name, e.ints([batch * length])])
  }
  return new Map(inputNames(config).map((name) => [name, declare(name, name === "targets" ? "int64" : dtype)]))
}

/**
 * The target's logprob `[n]` and the entropy `[n]` of each row of (tempered) logits `[n, vocab]`; `targets` is
 * `[n, 1]` int64.
 *
 * @category constructors
 * @since 0.1.0
 */
export const tokenTerms = (
  e: Backward.Emitter,
  logits: string,
  targets: string
): { readonly logprob: string; readonly entropy: string; readonly lsm: string } => {
  const n = e.dims(logits)[0]!
  const lsm = e.op("LogSoftmax", [logits], { axis: Graph.int(-1) })
  const picked = e.op("GatherElements", [lsm, targets], { axis: Graph.int(1) })
  const logprob = e.op("Reshape", [picked, e.ints([n])])
  const entropy = e.op("Neg", [
    e.op("ReduceSum", [e.op("Mul", [e.op("Exp", [lsm]), lsm]), e.ints([1])], { keepdims: Graph.int(0) })
  ])
  return { logprob, entropy, lsm }
}

/**
 * The loss, token logprobs and statistics from each token's logprob `[n]` and entropy `[n]` (the head after the
 * vocabulary: everything here is per token).
 *
 * @category constructors
 * @since 0.1.0
 */
export const lossOf = (
  e: Backward.Emitter,
  config: Loss.Config,
  batch: number,
  length: number,
  data: ReadonlyMap<string, string>,
  logprob: string,
  entropy: string
): Head => {
  const input = (name: string) => data.get(name)!
  const c = (x: number) => e.scalar(x, e.dtype(logprob))
  const dtype = e.dtype(logprob)
  const mask = input("loss_mask")
  const statTerms: Array<string> = [mask]
  let tokenLoss: string
  if (config.policyLoss === "nll") {
    tokenLoss = e.op("Neg", [logprob])
    statTerms.push(c(0), c(0), c(0))
  } else {
    const advantage = input("advantages")
    const old = input("old_logprobs")
    const negApproxKl = e.op("Clip", [e.op("Sub", [logprob, old]), c(-20), c(20)])
    // The ratio each token's surrogate clips: its own (PPO) or its sequence's (GSPO: one per row).
    const ratio = config.policyLoss === "gspo"
      ? sequenceRatio(e, e.op("Sub", [logprob, old]), mask, batch, length)
      : e.op("Exp", [negApproxKl])
    const negA = e.op("Neg", [advantage])
    const toFloat = (b: string) => e.op("Cast", [b], { to: Graph.int(Graph.dataTypeCode[dtype]) })
    const loss1 = e.op("Mul", [negA, ratio])
    const loss2 = e.op("Mul", [negA, e.op("Clip", [ratio, c(1 - config.clipLow), c(1 + config.clipHigh)])])
    const cispo = config.policyLoss === "cispo" ? cispoLoss(e, config, e.op("Sub", [logprob, old]), negA) : undefined
    const clippedLoss = cispo?.loss ?? e.op("Max", [loss1, loss2])
    const clipped = cispo?.clipped ?? toFloat(e.op("Greater", [loss2, loss1]))
    let lower = c(0)
    tokenLoss = clippedLoss
    if (config.dualClip !== undefined && config.policyLoss === "ppo") {
      const loss3 = e.op("Mul", [negA, c(config.dualClip)])
      const negative = e.op("Less", [advantage, c(0)])
      tokenLoss = e.op("Where", [negative, e.op("Min", [loss3, clippedLoss]), clippedLoss])
      lower = e.op("Cast", [e.op("And", [negative, e.op("Greater", [clippedLoss, loss3])])], {
        to: Graph.int(Graph.dataTypeCode[dtype])
      })
    }
    if (config.tisCap !== undefined) {
      // A constant per token: it reads only inputs, so no gradient flows through it.
      const w = e.op("Min", [e.op("Exp", [e.op("Sub", [old, input("sampler_logprobs")])]), c(config.tisCap)])
      tokenLoss = e.op("Mul", [tokenLoss, w])
    }
    statTerms.push(clipped, lower, e.op("Neg", [negApproxKl]))
  }
  statTerms.push(entropy)
  if (config.klCoef !== 0) {
    const ref = input("ref_logprobs")
    let kl: string
    if (config.klEstimator === "k1") {
      kl = e.op("Sub", [logprob, ref])
    } else {
      const d = e.op("Sub", [ref, logprob])
      kl = e.op("Clip", [e.op("Sub", [e.op("Sub", [e.op("Exp", [d]), d]), c(1)]), c(-10), c(10)])
    }
    tokenLoss = e.op("Add", [tokenLoss, e.op("Mul", [kl, c(config.klCoef)])])
    statTerms.push(kl)
  } else {
    statTerms.push(c(0))
  }
  if (config.entropyCoef !== 0) tokenLoss = e.op("Sub", [tokenLoss, e.op("Mul", [entropy, c(config.entropyCoef)])])
  const loss = e.op("ReduceSum", [e.op("Mul", [tokenLoss, input("loss_weights")]), e.ints([0])], {
    keepdims: Graph.int(0)
  })
  // stats: one masked sum per term, concatenated into a vector of 6.
  const sums = statTerms.map((t) =>
    e.op("ReduceSum", [e.op("Mul", [t, mask]), e.ints([0])], { keepdims: Graph.int(1) })
  )
  const stats = e.op("Concat", sums.map((s) => (e.dims(s).length === 1 ? s : e.op("Reshape", [s, e.ints([1])]))), {
    axis: Graph.int(0)
  })
  const tokenLogprobs = e.op("Reshape", [logprob, e.ints([batch, length])])
  return { loss, tokenLogprobs, stats, inputs: [...data.keys()] }
}

/**
 * GSPO's sequence ratio broadcast to the tokens: `exp(clip(Σ_t m·d / max(1, Σ_t m), ±20))` per row of
 * `[batch, length]`, from each token's `d = log π − log π_old` `[n]` and the loss mask `[n]`; returns `[n]`.
 */
const sequenceRatio = (e: Backward.Emitter, d: string, mask: string, batch: number, length: number): string => {
  const c = (x: number) => e.scalar(x, e.dtype(d))
  const rows = (x: string) => e.op("Reshape", [x, e.ints([batch, length])])
  const rowSum = (x: string) => e.op("ReduceSum", [rows(x), e.ints([1])], { keepdims: Graph.int(1) })
  const mean = e.op("Div", [rowSum(e.op("Mul", [d, mask])), e.op("Max", [rowSum(mask), c(1)])])
  const ratio = e.op("Exp", [e.op("Clip", [mean, c(-20), c(20)])])
  return e.op("Reshape", [e.op("Expand", [ratio, e.ints([batch, length])]), e.ints([batch * length])])
}

/**
 * CISPO's token loss from `d = log π − log π_old` `[n]` and `−A` (see `Loss.cispoToken`): `−A·e^d` inside the
 * range, the tangent `−A·c·(1 + d − log c)` past a bound `c`; the exponent is clipped to the range so that the
 * branch `Where` leaves out has no infinite gradient to multiply by zero. `clipped`: 1 where `d` is out of range.
 */
const cispoLoss = (
  e: Backward.Emitter,
  config: Loss.Config,
  d: string,
  negA: string
): { readonly loss: string; readonly clipped: string } => {
  const dtype = e.dtype(d)
  const c = (x: number) => e.scalar(x, dtype)
  const { lower, upper } = Loss.cispoBounds(config)
  const tangent = (bound: number) => e.op("Mul", [c(Math.exp(bound)), e.op("Add", [d, c(1 - bound)])])
  const above = e.op("Greater", [d, c(upper)])
  const below = e.op("Less", [d, c(lower)])
  const inside = e.op("Exp", [e.op("Clip", [d, c(lower), c(upper)])])
  const g = e.op("Where", [below, tangent(lower), e.op("Where", [above, tangent(upper), inside])])
  const out = e.op("Or", [above, below])
  return { loss: e.op("Mul", [negA, g]), clipped: e.op("Cast", [out], { to: Graph.int(Graph.dataTypeCode[dtype]) }) }
}

/**
 * The critic's clipped value loss on `logits [batch, length, 1]` (the values): returns in `advantages`, old values
 * in `old_logprobs`. Its "token logprobs" are the values; stats = (tokens, clipped, 0, Σ (v − R)², 0, 0).
 */
const valueHead = (
  e: Backward.Emitter,
  logits: string,
  config: Loss.Config,
  batch: number,
  length: number,
  input: (name: string) => string
): Head => {
  const dtype = e.dtype(logits)
  const c = (x: number) => e.scalar(x, dtype)
  const value = e.op("Reshape", [logits, e.ints([batch * length])])
  const target = input("advantages")
  const old = input("old_logprobs")
  const square = (x: string) => e.op("Mul", [x, x])
  const e1 = square(e.op("Sub", [value, target]))
  const moved = e.op("Clip", [e.op("Sub", [value, old]), c(-config.clipLow), c(config.clipLow)])
  const e2 = square(e.op("Sub", [e.op("Add", [old, moved]), target]))
  const tokenLoss = e.op("Mul", [e.op("Max", [e1, e2]), c(0.5)])
  const clipped = e.op("Cast", [e.op("Greater", [e2, e1])], { to: Graph.int(Graph.dataTypeCode[dtype]) })
  const loss = e.op("ReduceSum", [e.op("Mul", [tokenLoss, input("loss_weights")]), e.ints([0])], {
    keepdims: Graph.int(0)
  })
  const mask = input("loss_mask")
  const sums = [mask, clipped, c(0), e1, c(0), c(0)].map((t) =>
    e.op("ReduceSum", [e.op("Mul", [t, mask]), e.ints([0])], { keepdims: Graph.int(1) })
  )
  const stats = e.op("Concat", sums, { axis: Graph.int(0) })
  const tokenLogprobs = e.op("Reshape", [value, e.ints([batch, length])])
  return { loss, tokenLogprobs, stats, inputs: inputNames(config) }
}
