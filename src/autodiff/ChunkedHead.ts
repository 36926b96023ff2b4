/**
 * The output head and the loss head in chunks of tokens, so that the logits `[tokens, vocab]` of a whole
 * micro-batch never exist: at Qwen2.5's 151,936-token vocabulary, 2,048 tokens of logits are 1.2 GB, and the plain
 * head keeps four such tensors (logits, LogSoftmax, its exponent, their product) from the forward to the backward
 * pass, plus their gradients.
 *
 * Forward, chunk by chunk: `z = h_k Wᵀ` (`Gemm`, no transposed copy of `W`), LogSoftmax, the target's logprob and
 * the entropy; only those two `[n_k]` vectors leave the chunk. The loss after them is `LossHead.lossOf`, per token.
 *
 * Backward (a rule of its own for the whole head, {@link rule}): each chunk's logits are recomputed from its
 * hidden states and
 *
 *   ∂z = a·onehot(target) − p ⊙ (a + b·(log p + H))
 *
 * (a = ∂loss/∂logprob, b = ∂loss/∂entropy, H the entropy), then `∂h_k = ∂z W` and `∂W += ∂zᵀ h_k` (a `Gemm`
 * accumulating into its `C` input, in place). Two things keep
 * onnxruntime from holding every chunk at once. Its common-subexpression elimination would merge the recomputed
 * logits with the forward's (and so keep the forward's alive until the backward): the recompute reads a different
 * value, `h_k` concatenated with an empty slice of something only the backward has. That empty slice is taken from
 * the previous chunk's `∂W` and `∂h`, so chunk k+1's recompute waits for chunk k's gradients to be consumed: the
 * executor orders nodes depth first, and without this data edge it could compute every chunk's `∂z` before any
 * `Gemm` folds one in.
 *
 * @since 0.1.0
 */
import * as Graph from "../onnx/Graph.ts"
import type * as Loss from "../Loss.ts"
import type * as Backward from "./Backward.ts"
import * as LossHead from "./LossHead.ts"

/**
 * The chunked head: the head's names, the pseudo-node standing for the whole head (inputs `[hidden, weight]`,
 * outputs `[logprob, entropy]`) that the gradient walk differentiates with {@link rule}.
 *
 * @category models
 * @since 0.1.0
 */
export interface ChunkedHead extends LossHead.Head {
  readonly node: Graph.Node
  readonly rule: Backward.Rule
}

/** The pseudo-node's op, and the key of its rule. */
export const op = "agentfly.ChunkedLmHead"

/**
 * Default tokens per chunk: the chunk's logits about 64 MiB.
 *
 * @category constructors
 * @since 0.1.0
 */
export const defaultChunk = (vocab: number): number => Math.max(1, Math.floor(2 ** 26 / (4 * vocab)))

const chunksOf = (n: number, chunk: number): Array<readonly [number, number]> => {
  const out: Array<readonly [number, number]> = []
  for (let s = 0; s < n; s += chunk) out.push([s, Math.min(n, s + chunk)])
  return out
}

/**
 * Emits the head on `hidden [batch, length, D]` (the final norm's output) and the output projection
 * `weight [vocab, D]`, with `chunk` tokens per chunk.
 *
 * @category constructors
 * @since 0.1.0
 */
export const emit = (
  e: Backward.Emitter,
  hidden: string,
  weight: string,
  config: Loss.Config,
  batch: number,
  length: number,
  chunk: number
): ChunkedHead => {
  const dtype = e.dtype(hidden)
  const D = e.dims(hidden).at(-1)!
  const n = batch * length
  const data = LossHead.declareInputs(e, config, batch, length, dtype)
  const flat = e.op("Reshape", [hidden, e.ints([n, D])])
  const targets = e.op("Unsqueeze", [data.get("targets")!, e.ints([1])])
  const temperature = config.temperature ?? 1
  const ranges = chunksOf(n, chunk)
  // Logprob and entropy side by side per chunk, so that a chunk is finished before the next one starts.
  const pairs = ranges.map(([s, t]) => {
    const h = e.op("Slice", [flat, e.ints([s]), e.ints([t])])
    const z = e.op("Gemm", [h, weight], { transB: Graph.int(1) })
    const logits = temperature === 1 ? z : e.op("Div", [z, e.scalar(temperature, dtype)])
    const terms = LossHead.tokenTerms(e, logits, e.op("Slice", [targets, e.ints([s]), e.ints([t])]))
    const column = (v: string) => e.op("Unsqueeze", [v, e.ints([1])])
    return e.op("Concat", [column(terms.logprob), column(terms.entropy)], { axis: Graph.int(1) })
  })
  const both = pairs.length === 1 ? pairs[0]! : e.op("Concat", pairs, { axis: Graph.int(0) })
  const column = (j: number) =>
    e.op("Reshape", [e.op("Slice", [both, e.ints([j]), e.ints([j + 1]), e.ints([1])]), e.ints([n])])
  const logprob = column(0)
  const entropy = column(1)
  const head = LossHead.lossOf(e, config, batch, length, data, logprob, entropy)
  const node: Graph.Node = { op, inputs: [hidden, weight], outputs: [logprob, entropy], attributes: {} }
  return { ...head, node, rule: rule({ flat, weight, targets, entropy, ranges, temperature }) }
}

interface Saved {
  readonly flat: string
  readonly weight: string
  readonly targets: string
  readonly entropy: string
  readonly ranges: ReadonlyArray<readonly [number, number]>
  readonly temperature: number
}

/** An empty `[0, D]` slice of `x [*, D]` (or of `x [N]`, reshaped): a data edge that adds nothing. */
const emptyOf = (e: Backward.Emitter, x: string, D: number) =>
  e.dims(x).length === 2
    ? e.op("Slice", [x, e.ints([0]), e.ints([0])])
    : e.op("Reshape", [e.op("Slice", [x, e.ints([0]), e.ints([0])]), e.ints([0, D])])

/**
 * The head's backward: recomputes each chunk's logits and returns `[∂hidden, ∂weight]`.
 *
 * @category constructors
 * @since 0.1.0
 */
const rule = (saved: Saved): Backward.Rule => (e, node, grads, needs) => {
  const { flat, weight, targets, entropy, ranges, temperature } = saved
  const [ga, gb] = grads
  const dtype = e.dtype(flat)
  const D = e.dims(flat)[1]!
  const slice = (x: string, s: number, t: number) => e.op("Slice", [x, e.ints([s]), e.ints([t])])
  const column = (x: string, s: number, t: number) => e.op("Unsqueeze", [slice(x, s, t), e.ints([1])])
  let dW: string | undefined
  const dh: Array<string> = []
  let after = [emptyOf(e, (ga ?? gb)!, D)]
  for (const [s, t] of ranges) {
    const h = e.op("Concat", [slice(flat, s, t), ...after], { axis: Graph.int(0) })
    const z = e.op("Gemm", [h, weight], { transB: Graph.int(1) })
    const logits = temperature === 1 ? z : e.op("Div", [z, e.scalar(temperature, dtype)])
    const lsm = e.op("LogSoftmax", [logits], { axis: Graph.int(-1) })
    const p = e.op("Exp", [lsm])
    const a = ga === undefined ? undefined : column(ga, s, t)
    const b = gb === undefined ? undefined : column(gb, s, t)
    const entropyTerm = b === undefined
      ? undefined
      : e.op("Mul", [b, e.op("Add", [lsm, column(entropy, s, t)])])
    const coefficient = a === undefined ? entropyTerm! : entropyTerm === undefined ? a : e.op("Add", [a, entropyTerm])
    let dz = e.op("Neg", [e.op("Mul", [p, coefficient])])
    if (a !== undefined) {
      dz = e.op("ScatterElements", [dz, slice(targets, s, t), a], {
        axis: Graph.int(1),
        reduction: Graph.string("add")
      })
    }
    if (temperature !== 1) dz = e.op("Div", [dz, e.scalar(temperature, dtype)])
    after = []
    if (needs[0]) {
      const dhk = e.op("MatMul", [dz, weight])
      dh.push(dhk)
      after.push(emptyOf(e, dhk, D))
    }
    if (needs[1]) {
      dW = e.op("Gemm", dW === undefined ? [dz, h] : [dz, h, dW], {
        transA: Graph.int(1),
        ...(dW === undefined ? {} : { beta: Graph.float(1) })
      })
      after.push(emptyOf(e, dW, D))
    }
  }
  const hidden = node.inputs[0]!
  const dHidden = !needs[0]
    ? undefined
    : e.op("Reshape", [dh.length === 1 ? dh[0]! : e.op("Concat", dh, { axis: Graph.int(0) }), e.ints(e.dims(hidden))])
  return [dHidden, dW]
}
