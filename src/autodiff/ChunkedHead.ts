/**
 * The output head and the loss head in tiles, so that the logits `[tokens, vocab]` of a whole micro-batch never
 * exist: at Qwen2.5's 151,936-token vocabulary, 2,048 tokens of logits are 1.2 GB, and the plain head keeps four
 * such tensors (logits, LogSoftmax, its exponent, their product) from the forward to the backward pass, plus their
 * gradients.
 *
 * Tiles are blocks of up to {@link block} tokens times slices of the vocabulary, one tile's logits about as large as
 * `chunk` tokens of the whole vocabulary (64 MiB by default). Slicing the vocabulary rather than the tokens keeps every
 * product as wide as the block: with 110-token chunks of the whole vocabulary the products ran at a fraction of
 * onnxruntime's MatMul speed, and each chunk's `∂W` accumulated into the whole `[vocab, D]` gradient (read and
 * written once a chunk). Here each vocabulary slice writes its own rows of `∂W`.
 *
 * Forward, tile by tile: `z = h_b W_jᵀ` (`Gemm`, no transposed copy of `W`), and per token the slice's maximum `m`,
 * `s = Σ exp(z − m)` and `d = Σ exp(z − m)·z`; across slices (log-sum-exp) `lse = M + log Σ e^(m−M) s` and the
 * entropy `H = lse − Σ e^(m−M) d / Σ e^(m−M) s`. The target's logit is `h · W[target]` (a `Gather` of `W`'s rows), its
 * logprob that minus `lse`. Only `[tokens]` vectors leave a tile. The loss after them is `LossHead.lossOf`, per token.
 *
 * Backward (a rule of its own for the whole head, {@link rule}): each tile's logits are recomputed, `log p = z − lse`,
 *
 *   ∂z = a·onehot(target) − p ⊙ (a + b·(log p + H))
 *
 * (a = ∂loss/∂logprob, b = ∂loss/∂entropy; the one-hot part lands in the slice that holds the target), then
 * `∂h_b += ∂z W_j` and `∂W_j += ∂zᵀ h_b`. Two things keep
 * onnxruntime from holding every tile at once. Its common-subexpression elimination would merge the recomputed
 * logits with the forward's (and so keep the forward's alive until the backward): the recompute reads a different
 * value, `h_b` concatenated with an empty slice of something only the backward has, and slices `W` with one more
 * input (explicit axes). That empty slice is taken from the previous tile's `∂W_j` and `∂h`, so the next tile's
 * recompute waits for the previous tile's gradients to be consumed: the executor orders nodes depth first, and
 * without this data edge it could compute every tile's `∂z` before any product folds one in. The forward's tiles
 * are chained the same way, through the previous tile's sums.
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
  /** The weight's vocabulary slices as graph inputs of their own, empty when they are `Slice`s ({@link emit}). */
  readonly views: ReadonlyArray<View>
}

/**
 * Rows `[start, end)` of the weight `of` (`[vocab, D]`), fed as the graph input `name`: a view of the weight's array
 * (onnxruntime-node wraps an input's memory as it is, at any offset), where a `Slice` node copies the rows.
 *
 * @category models
 * @since 0.1.0
 */
export interface View {
  readonly name: string
  readonly of: string
  readonly start: number
  readonly end: number
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

/**
 * Tokens per block: a tile's products are `[block, D] × [D, slice]`, wide enough for onnxruntime's MatMul to run
 * near its peak; a micro-batch of more tokens is cut into blocks of equal size.
 *
 * @category constructors
 * @since 0.1.0
 */
export const block = 1024

const rangesOf = (n: number, size: number): Array<readonly [number, number]> => {
  const out: Array<readonly [number, number]> = []
  for (let s = 0; s < n; s += size) out.push([s, Math.min(n, s + size)])
  return out
}

/**
 * The tiles of `n` tokens over `vocab`: blocks of at most `maxBlock` tokens (of equal size), and slices of the
 * vocabulary whose logits hold about `chunk` tokens of the whole vocabulary at the widest block.
 *
 * @category constructors
 * @since 0.1.0
 */
export const tiles = (n: number, vocab: number, chunk: number, maxBlock: number = block): {
  readonly blocks: ReadonlyArray<readonly [number, number]>
  readonly slices: ReadonlyArray<readonly [number, number]>
} => {
  const size = Math.ceil(n / Math.ceil(n / maxBlock))
  const width = Math.max(1, Math.min(vocab, Math.floor((chunk * vocab) / size)))
  return { blocks: rangesOf(n, size), slices: rangesOf(vocab, width) }
}

/**
 * Emits the head on `hidden [batch, length, D]` (the final norm's output) and the output projection
 * `weight [vocab, D]`, in tiles holding about `chunk` tokens of logits each ({@link tiles}). With `viewed` (a trained
 * weight, which the trainer holds as one array), each vocabulary slice of `weight` is a graph input of its own
 * ({@link View}), fed as a view of the weight's rows: `Slice` nodes copied 545 MB of W twice a step at Qwen2.5's
 * 151,936 × 896 (≈ 0.4 s of 13 s profiled). A frozen weight (a LoRA run's head; the workers map it from a file) keeps
 * the slices.
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
  chunk: number,
  maxBlock: number = block,
  viewed = false
): ChunkedHead => {
  const dtype = e.dtype(hidden)
  const D = e.dims(hidden).at(-1)!
  const vocab = e.dims(weight)[0]!
  const n = batch * length
  const data = LossHead.declareInputs(e, config, batch, length, dtype)
  const flat = e.op("Reshape", [hidden, e.ints([n, D])])
  const targets = data.get("targets")!
  const temperature = config.temperature ?? 1
  const tempered = (z: string) => (temperature === 1 ? z : e.op("Div", [z, e.scalar(temperature, dtype)]))
  const { blocks, slices } = tiles(n, vocab, chunk, maxBlock)
  const views = !viewed ? [] : slices.map(([start, end]): View => {
    const name = `${weight}.rows.${start}`
    e.graph.input(name, dtype, [end - start, D])
    e.shapes.set(name, { dtype, dims: [end - start, D] })
    return { name, of: weight, start, end }
  })
  const rowsOf = (j: number) =>
    views[j]?.name ?? e.op("Slice", [weight, e.ints([slices[j]![0]]), e.ints([slices[j]![1]])])
  const sum = (x: string) => e.op("ReduceSum", [x, e.ints([1])], { keepdims: Graph.int(1) })
  let after: ReadonlyArray<string> = []
  // Per block: each slice's max, Σ exp(z − max) and Σ exp(z − max)·z as columns, then combined across slices.
  const perBlock = blocks.map(([s, t]) => {
    const columns = slices.map((_, j) => {
      const sliced = e.op("Slice", [flat, e.ints([s]), e.ints([t])])
      const h = after.length === 0 ? sliced : e.op("Concat", [sliced, ...after], { axis: Graph.int(0) })
      const z = tempered(e.op("Gemm", [h, rowsOf(j)], { transB: Graph.int(1) }))
      const m = e.op("ReduceMax", [z], { axes: Graph.ints([1]), keepdims: Graph.int(1) })
      const ez = e.op("Exp", [e.op("Sub", [z, m])])
      const three = [m, sum(ez), sum(e.op("Mul", [ez, z]))]
      after = [emptyOf(e, three[2]!, D)]
      return three
    })
    const stack = (j: number) =>
      columns.length === 1 ? columns[0]![j]! : e.op("Concat", columns.map((c) => c[j]!), { axis: Graph.int(1) })
    const ms = stack(0)
    const top = e.op("ReduceMax", [ms], { axes: Graph.ints([1]), keepdims: Graph.int(1) })
    const w = e.op("Exp", [e.op("Sub", [ms, top])])
    const total = sum(e.op("Mul", [w, stack(1)]))
    const lse = e.op("Add", [top, e.op("Log", [total])])
    const mean = e.op("Div", [sum(e.op("Mul", [w, stack(2)])), total])
    return { lse, entropy: e.op("Sub", [lse, mean]) }
  })
  const rows = (xs: ReadonlyArray<string>) => (xs.length === 1 ? xs[0]! : e.op("Concat", xs, { axis: Graph.int(0) }))
  const lse = e.op("Reshape", [rows(perBlock.map((b) => b.lse)), e.ints([n])])
  const entropy = e.op("Reshape", [rows(perBlock.map((b) => b.entropy)), e.ints([n])])
  const picked = sum(e.op("Mul", [flat, e.op("Gather", [weight, targets], { axis: Graph.int(0) })]))
  const logprob = e.op("Sub", [e.op("Reshape", [tempered(picked), e.ints([n])]), lse])
  const head = LossHead.lossOf(e, config, batch, length, data, logprob, entropy)
  const node: Graph.Node = { op, inputs: [hidden, weight], outputs: [logprob, entropy], attributes: {} }
  const saved = { flat, weight, targets, lse, entropy, blocks, slices, temperature, views }
  return { ...head, node, rule: rule(saved), views }
}

interface Saved {
  readonly flat: string
  readonly weight: string
  /** `[n]` int64. */
  readonly targets: string
  readonly lse: string
  readonly entropy: string
  readonly blocks: ReadonlyArray<readonly [number, number]>
  readonly slices: ReadonlyArray<readonly [number, number]>
  readonly temperature: number
  readonly views: ReadonlyArray<View>
}

/** An empty `[0, D]` tensor from `x` (any rank): a data edge that adds nothing. */
const emptyOf = (e: Backward.Emitter, x: string, D: number) =>
  e.op("Reshape", [e.op("Slice", [x, e.ints([0]), e.ints([0])]), e.ints([0, D])])

/**
 * The head's backward: recomputes each tile's logits and returns `[∂hidden, ∂weight]`.
 *
 * @category constructors
 * @since 0.1.0
 */
const rule = (saved: Saved): Backward.Rule => (e, node, grads, needs) => {
  const { flat, weight, targets, lse, entropy, blocks, slices, temperature, views } = saved
  const [ga, gb] = grads
  const dtype = e.dtype(flat)
  const D = e.dims(flat)[1]!
  const slice = (x: string, s: number, t: number) => e.op("Slice", [x, e.ints([s]), e.ints([t])])
  const column = (x: string, s: number, t: number) => e.op("Unsqueeze", [slice(x, s, t), e.ints([1])])
  const untempered = (x: string) => (temperature === 1 ? x : e.op("Div", [x, e.scalar(temperature, dtype)]))
  // Views: the forward's inputs again. Slices: with explicit axes, not the forward's slices of W, which onnxruntime
  // would otherwise keep alive to share them.
  const rowsOfW = slices.map(([v0, v1], j) => () =>
    views[j]?.name ?? e.op("Slice", [weight, e.ints([v0]), e.ints([v1]), e.ints([0])])
  )
  const dW: Array<string | undefined> = slices.map(() => undefined)
  const dh: Array<string> = []
  let after = [emptyOf(e, (ga ?? gb)!, D)]
  for (const [s, t] of blocks) {
    // −a and −b per token: ∂z = p ⊙ (−a − b·(log p + H)) needs no negation of a whole tile (the same bits).
    const negA = ga === undefined ? undefined : e.op("Neg", [column(ga, s, t)])
    const negB = gb === undefined ? undefined : e.op("Neg", [column(gb, s, t)])
    const lseB = column(lse, s, t)
    const hB = slice(flat, s, t)
    const targetsB = slice(targets, s, t)
    const aOverB = ga === undefined ? undefined : untempered(slice(ga, s, t))
    // The one-hot part, a/T at the target when it falls in slice j (a zero added at column 0 when it does not).
    const oneHot = (dz: string, j: number) => {
      if (aOverB === undefined) return dz
      const [v0, v1] = slices[j]!
      const rel = e.op("Sub", [targetsB, e.ints([v0])])
      const inside = e.op("And", [e.op("GreaterOrEqual", [rel, e.ints([0])]), e.op("Less", [rel, e.ints([v1 - v0])])])
      const at = (x: string, otherwise: string) =>
        e.op("Unsqueeze", [e.op("Where", [inside, x, otherwise]), e.ints([1])])
      return e.op("ScatterElements", [dz, at(rel, e.ints([0])), at(aOverB, e.scalar(0, dtype))], {
        axis: Graph.int(1),
        reduction: Graph.string("add")
      })
    }
    let dhB: string | undefined
    slices.forEach((_, j) => {
      const h = e.op("Concat", [hB, ...after], { axis: Graph.int(0) })
      const w = rowsOfW[j]!()
      const lsm = e.op("Sub", [untempered(e.op("Gemm", [h, w], { transB: Graph.int(1) })), lseB])
      const p = e.op("Exp", [lsm])
      const entropyTerm = negB === undefined
        ? undefined
        : e.op("Mul", [negB, e.op("Add", [lsm, column(entropy, s, t)])])
      const coefficient = negA === undefined
        ? entropyTerm!
        : entropyTerm === undefined
        ? negA
        : e.op("Add", [negA, entropyTerm])
      const dz = oneHot(untempered(e.op("Mul", [p, coefficient])), j)
      after = []
      if (needs[0]) {
        const part = e.op("MatMul", [dz, w])
        dhB = dhB === undefined ? part : e.op("Add", [dhB, part])
        after.push(emptyOf(e, dhB, D))
      }
      if (needs[1]) {
        const prev = dW[j]
        dW[j] = e.op("Gemm", prev === undefined ? [dz, h] : [dz, h, prev], {
          transA: Graph.int(1),
          ...(prev === undefined ? {} : { beta: Graph.float(1) })
        })
        after.push(emptyOf(e, dW[j]!, D))
      }
    })
    if (dhB !== undefined) dh.push(dhB)
  }
  const hidden = node.inputs[0]!
  const dHidden = !needs[0]
    ? undefined
    : e.op("Reshape", [dh.length === 1 ? dh[0]! : e.op("Concat", dh, { axis: Graph.int(0) }), e.ints(e.dims(hidden))])
  const dWeight = !needs[1] ? undefined : dW.length === 1 ? dW[0]! : e.op("Concat", dW as Array<string>, {
    axis: Graph.int(0)
  })
  return [dHidden, dWeight]
}
