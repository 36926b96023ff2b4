/**
 * Backward emitters: for each ONNX op, the nodes that compute the gradients of its inputs from the gradients of its
 * outputs. Emitters append to the same graph through an {@link Emitter}, which also tracks static shapes.
 *
 * Differentiable ops: Add, Sub, Mul, Div, Pow (base), Neg, Exp, Log, Sqrt, Reciprocal, Sigmoid, Tanh, Relu, Abs,
 * Erf, Identity, Cast (float → float), Sum, Max, Min, Clip, Where, MatMul (batched with broadcasting; matrix
 * products of the backward use Gemm with its transpose flags, and in float32 onnxruntime's com.microsoft
 * FusedMatMul for batched transposed operands, so float32 training graphs need onnxruntime), Gemm (α, β, transA,
 * transB, broadcast C), Softmax, LogSoftmax, Transpose, Reshape, Flatten, Squeeze, Unsqueeze, Expand, Concat,
 * Split, Slice (step 1), Gather (axis 0, the embedding), GatherElements, ReduceSum, ReduceMean, ReduceMax. SiLU
 * (`Mul(x, Sigmoid(x))`) is differentiated as one function. Rules emit nodes only for the inputs that need a
 * gradient: onnxruntime runs every node it is given, used or not. A forward graph using any other float op (e.g.
 * LayerNormalization) fails with `AutodiffError` reason `NoBackwardRule`.
 * Ops that only touch integers, booleans or shapes (Shape, Range, Equal, Less, And, Cast to int, …) carry no
 * gradient; the autodiff never asks them for one.
 *
 * @since 0.1.0
 */
import * as Graph from "../onnx/Graph.ts"
import * as Shapes from "./Shapes.ts"

// ===== Models =====

/**
 * What an emitter can do: append nodes (shape-tracked) and make constants.
 *
 * @category models
 * @since 0.1.0
 */
export interface Emitter {
  readonly graph: Graph.Graph
  readonly shapes: Shapes.Shapes
  /**
   * A model of at least 50 M parameters (`Autodiff.isLargeModel`): rules may emit products that run faster but
   * round differently at some shapes (weight gradients as a transpose and a plain MatMul). Off for the embedded
   * presets, whose arithmetic must not change.
   */
  readonly large: boolean
  /** Appends a node (of the default ONNX domain unless `domain` is given) and returns its output. */
  readonly op: (
    op: string,
    inputs: ReadonlyArray<string>,
    attributes?: Record<string, Graph.Attribute>,
    domain?: string
  ) => string
  readonly opN: (
    op: string,
    inputs: ReadonlyArray<string>,
    outputs: number,
    attributes?: Record<string, Graph.Attribute>
  ) => ReadonlyArray<string>
  readonly dims: (name: string) => ReadonlyArray<number>
  readonly dtype: (name: string) => Graph.DType
  /** A scalar constant of a float dtype (cached). */
  readonly scalar: (value: number, dtype: Graph.DType) => string
  /** A 1-D int64 constant (cached). */
  readonly ints: (values: ReadonlyArray<number>) => string
  /** Zeros of the given dims and dtype. */
  readonly zeros: (dims: ReadonlyArray<number>, dtype: Graph.DType) => string
  /** Sums a broadcast gradient back to `dims` (ReduceSum over broadcast axes, then Reshape). */
  readonly reduceTo: (grad: string, dims: ReadonlyArray<number>) => string
}

/**
 * A backward rule: given the node, the gradient of each output (undefined where none flows) and which inputs need
 * a gradient, returns one gradient (or undefined) per input.
 *
 * @category models
 * @since 0.1.0
 */
export type Rule = (
  e: Emitter,
  node: Graph.Node,
  grads: ReadonlyArray<string | undefined>,
  needs: ReadonlyArray<boolean>
) => ReadonlyArray<string | undefined>

// ===== Emitter =====

const sameDims = (a: ReadonlyArray<number>, b: ReadonlyArray<number>) =>
  a.length === b.length && a.every((d, i) => d === b[i])

const typedScalar = (value: number, dtype: Graph.DType): Graph.TensorData =>
  dtype === "float64"
    ? { dtype, dims: [], data: Float64Array.of(value) }
    : dtype === "int64"
    ? { dtype, dims: [], data: BigInt64Array.of(BigInt(value)) }
    : { dtype: "float32", dims: [], data: Float32Array.of(value) }

/**
 * An emitter appending to `graph`, with `shapes` kept in sync.
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeEmitter = (graph: Graph.Graph, shapes: Shapes.Shapes, large = false): Emitter => {
  const cache = new Map<string, string>()
  const cached = (key: string, make: () => string) => {
    const hit = cache.get(key)
    if (hit !== undefined) return hit
    const name = make()
    cache.set(key, name)
    return name
  }
  const visitLast = () => shapes.visit(graph.nodes[graph.nodes.length - 1]!)
  const op: Emitter["op"] = (type, inputs, attributes, domain) => {
    const out = domain === undefined
      ? graph.op(type, inputs, attributes)
      : graph.node(type, inputs, [graph.fresh(type)], attributes ?? {}, domain)[0]!
    visitLast()
    return out
  }
  const opN: Emitter["opN"] = (type, inputs, n, attributes) => {
    const outs = graph.opN(type, inputs, n, attributes)
    visitLast()
    return outs
  }
  const constant = (t: Graph.TensorData) => {
    const name = graph.constant(t)
    shapes.set(name, Shapes.tensorInfo(t))
    return name
  }
  const ints = (values: ReadonlyArray<number>) =>
    cached(`i:${values.join(",")}`, () => constant(Graph.int64([values.length], values)))
  const scalar = (value: number, dtype: Graph.DType) =>
    cached(`s:${dtype}:${value}`, () => constant(typedScalar(value, dtype)))
  const dims = (name: string) => shapes.get(name).dims
  const dtype = (name: string) => shapes.get(name).dtype
  const zeros = (target: ReadonlyArray<number>, type: Graph.DType) =>
    op("ConstantOfShape", [ints(target)], { value: Graph.tensor({ ...typedScalar(0, type), dims: [1] }) })
  const reduceTo = (grad: string, target: ReadonlyArray<number>) => {
    const from = dims(grad)
    if (sameDims(from, target)) return grad
    const pad = from.length - target.length
    const axes: Array<number> = []
    for (let i = 0; i < from.length; i++) {
      const t = i < pad ? 1 : target[i - pad]!
      if (t === 1 && from[i] !== 1) axes.push(i)
    }
    const summed = axes.length > 0 ? op("ReduceSum", [grad, ints(axes)], { keepdims: Graph.int(1) }) : grad
    return sameDims(dims(summed), target) ? summed : op("Reshape", [summed, ints(target)])
  }
  return { graph, shapes, large, op, opN, dims, dtype, scalar, ints, zeros, reduceTo }
}

// ===== Rules =====

const swapLast = (e: Emitter, x: string) => {
  const r = e.dims(x).length
  const perm = Array.from({ length: r }, (_, i) => i)
  perm[r - 1] = r - 2
  perm[r - 2] = r - 1
  return e.op("Transpose", [x], { perm: Graph.ints(perm) })
}

const reshapeTo = (e: Emitter, g: string, target: ReadonlyArray<number>) =>
  sameDims(e.dims(g), target) ? g : e.op("Reshape", [g, e.ints(target)])

const inDims = (e: Emitter, node: Graph.Node, i: number) => e.dims(node.inputs[i]!)

/** The producer of a value among the nodes emitted so far (undefined for inputs and initializers). */
const producer = (e: Emitter, value: string): Graph.Node | undefined =>
  e.graph.nodes.find((n) => n.outputs.includes(value))

/** Whether `x` is the output of a Transpose that swaps its last two axes (and only those). */
const isSwapLast = (e: Emitter, x: string): boolean => {
  const p = producer(e, x)
  const perm = p?.op === "Transpose" && p.attributes["perm"]?.kind === "ints" ? p.attributes["perm"].value : undefined
  const r = perm?.length ?? 0
  return perm !== undefined && r >= 2 && perm.every((d, i) => d === (i === r - 2 ? r - 1 : i === r - 1 ? r - 2 : i))
}

/**
 * `op(A)·op(B)` for batched operands without materialising a transpose: onnxruntime's com.microsoft FusedMatMul
 * (float only), or Transpose + MatMul for other dtypes. A Transpose moving a `[…, T, hd]` tensor's last axis is a
 * strided copy that cost as much as the product itself on the attention's shapes.
 */
const batchedProduct = (e: Emitter, a: string, b: string, transA: boolean, transB: boolean): string =>
  e.dtype(a) === "float32"
    ? e.op("FusedMatMul", [a, b], { transA: Graph.int(transA ? 1 : 0), transB: Graph.int(transB ? 1 : 0) }, msDomain)
    : e.op("MatMul", [transA ? swapLast(e, a) : a, transB ? swapLast(e, b) : b])

const msDomain = "com.microsoft"

/**
 * The input width from which a large model's weight gradient is a plain MatMul on a transpose of `dY`
 * ({@link transposedRows}): its `2·K` products per transposed element are then worth the copy.
 */
const plainProductWidth = 256

/**
 * `x [..., N]` as the `[N, n]` matrix of its rows' transpose. Large models' weight gradients are
 * `∂W = dYᵀ·A` on it: `Gemm` with `transA` (what the default emits, and what onnxruntime makes of a `Transpose`
 * `[1, 0]` feeding a MatMul) ran at 0.78× of MatMul's rate on the 0.5 B shapes (BENCHMARKS.md, "the learner's step
 * against the MatMul roofline"), so the Transpose moves the last axis first before the Reshape, which onnxruntime
 * does not fold back. The same bits at most shapes (`scripts/weight-gradient-check.ts`) but not all (the small
 * preset's 64-wide k/v: `scripts/preset-gradient-digest.ts`), hence large models only.
 */
const transposedRows = (e: Emitter, x: string): string => {
  const xd = e.dims(x)
  const N = xd.at(-1)!
  const perm = [xd.length - 1, ...xd.slice(0, -1).map((_, i) => i)]
  return reshapeTo(e, e.op("Transpose", [x], { perm: Graph.ints(perm) }), [N, xd.reduce((p, d) => p * d, 1) / N])
}

const matMul: Rule = (e, node, [g], needs) => {
  const [a, b] = node.inputs as [string, string]
  const ad = e.dims(a)
  const bd = e.dims(b)
  let ga: string | undefined
  let gb: string | undefined
  if (needs[0]) {
    // dA = dY · Bᵀ; Gemm transposes for free when both are matrices. B = Wᵀ (a linear layer's weight): dY · W,
    // which onnxruntime ran anyway (it cancels the two transposes), now without keeping B, a transposed copy of
    // every weight, alive from the forward to the backward (4 bytes a layer parameter at the peak).
    const w = bd.length === 2 && ad.length > 2 && isSwapLast(e, b) ? producer(e, b)!.inputs[0]! : undefined
    ga = ad.length === 2 && bd.length === 2
      ? e.op("Gemm", [g!, b], { transB: Graph.int(1) })
      : w !== undefined
      ? e.reduceTo(e.op("MatMul", [g!, w]), ad)
      : bd.length === 2
      ? e.reduceTo(e.op("MatMul", [g!, swapLast(e, b)]), ad)
      : e.reduceTo(batchedProduct(e, g!, b, false, true), ad)
  }
  if (needs[1]) {
    if (bd.length === 2) {
      // dB = Aᵀ · dY summed over every batch position: flatten to one matrix product.
      const K = ad.at(-1)!
      const N = bd.at(-1)!
      const a2 = reshapeTo(e, a, [ad.reduce((p, d) => p * d, 1) / K, K])
      // Large models: (dYᵀ·A)ᵀ, the outer transpose cancelling against the Transpose rule's of B = Wᵀ (below). Only
      // where the product outweighs the transpose of dY: not for a LoRA adapter's B, whose input is rank-wide.
      gb = e.large && K >= plainProductWidth
        ? swapLast(e, e.op("MatMul", [transposedRows(e, g!), a2]))
        : e.op("Gemm", [a2, reshapeTo(e, g!, [e.dims(g!).reduce((p, d) => p * d, 1) / N, N])], {
          transA: Graph.int(1)
        })
    } else if (isSwapLast(e, b)) {
      // B = Xᵀ (keys in attention): dB = (dYᵀ·A)ᵀ, whose transpose cancels against the Transpose rule's inverse.
      gb = e.reduceTo(swapLast(e, batchedProduct(e, g!, a, true, false)), bd)
    } else {
      gb = e.reduceTo(batchedProduct(e, a, g!, true, false), bd)
    }
  }
  return [ga, gb]
}

const attrOr = (node: Graph.Node, name: string, fallback: number): number => {
  const a = node.attributes[name]
  return a !== undefined && (a.kind === "int" || a.kind === "float") ? a.value : fallback
}

/** Y = α·op(A)·op(B) + β·C, with op = transpose when the flag is set. */
const gemm: Rule = (e, node, [g], needs) => {
  const [a, b, c] = node.inputs as [string, string, string | undefined]
  const alpha = attrOr(node, "alpha", 1)
  const beta = attrOr(node, "beta", 1)
  const transA = attrOr(node, "transA", 0) === 1
  const transB = attrOr(node, "transB", 0) === 1
  const flags = (ta: boolean, tb: boolean) => ({
    alpha: Graph.float(alpha),
    transA: Graph.int(ta ? 1 : 0),
    transB: Graph.int(tb ? 1 : 0)
  })
  // d op(A) = α·G·op(B)ᵀ and d op(B) = α·op(A)ᵀ·G, transposed back where the flag was set.
  const ga = !needs[0] ? undefined : transA
    ? e.op("Gemm", [b, g!], flags(transB, true))
    : e.op("Gemm", [g!, b], flags(false, !transB))
  const gb = !needs[1] ? undefined : transB
    ? e.op("Gemm", [g!, a], flags(true, transA))
    : e.op("Gemm", [a, g!], flags(!transA, false))
  const gc = needs[2] && c !== undefined && c !== ""
    ? e.reduceTo(beta === 1 ? g! : e.op("Mul", [g!, e.scalar(beta, e.dtype(g!))]), e.dims(c))
    : undefined
  return [ga, gb, gc]
}

const elementwise = (f: (e: Emitter, node: Graph.Node, g: string) => string): Rule => (e, node, [g]) => [
  f(e, node, g!)
]

const out0 = (node: Graph.Node) => node.outputs[0]!
const in0 = (node: Graph.Node) => node.inputs[0]!

const softmax: Rule = (e, node, [g]) => {
  const y = out0(node)
  const axis = node.attributes["axis"]?.kind === "int" ? node.attributes["axis"].value : -1
  const s = e.op("ReduceSum", [e.op("Mul", [g!, y]), e.ints([axis])], { keepdims: Graph.int(1) })
  return [e.op("Mul", [y, e.op("Sub", [g!, s])])]
}

const logSoftmax: Rule = (e, node, [g]) => {
  const y = out0(node)
  const axis = node.attributes["axis"]?.kind === "int" ? node.attributes["axis"].value : -1
  const s = e.op("ReduceSum", [g!, e.ints([axis])], { keepdims: Graph.int(1) })
  return [e.op("Sub", [g!, e.op("Mul", [e.op("Exp", [y]), s])])]
}

const reduce = (kind: "sum" | "mean" | "max"): Rule => (e, node, [g]) => {
  const x = in0(node)
  const xd = e.dims(x)
  const axes = Shapes.reduceAxes(node, (n) => e.shapes.get(n), xd.length)
  const keptDims = xd.map((d, i) => (axes.includes(i) ? 1 : d))
  const kept = reshapeTo(e, g!, keptDims)
  if (kind === "mean") {
    // Scaled before the Expand: one product on the reduced shape instead of the full one.
    const count = axes.reduce((p, a) => p * xd[a]!, 1)
    return [e.op("Expand", [e.op("Mul", [kept, e.scalar(1 / count, e.dtype(x))]), e.ints(xd)])]
  }
  const expanded = e.op("Expand", [kept, e.ints(xd)])
  if (kind === "sum") return [expanded]
  const max = e.op("Expand", [reshapeTo(e, out0(node), keptDims), e.ints(xd)])
  return [e.op("Where", [e.op("Equal", [x, max]), expanded, e.scalar(0, e.dtype(x))])]
}

const gather: Rule = (e, node, [g], needs) =>
  needs[0] ? [gatherInto(e, node, g!, e.zeros(e.dims(node.inputs[0]!), e.dtype(node.inputs[0]!))), undefined] : [
    undefined,
    undefined
  ]

/**
 * The gradient of a Gather (axis 0, the embedding) added into `base`, a gradient of the whole table that other
 * consumers already gave (a tied output head's): one ScatterND onto it instead of a scatter into zeros and a Sum,
 * which would hold two more tables of the embedding's size.
 *
 * @category combinators
 * @since 0.1.0
 */
export const gatherInto = (e: Emitter, node: Graph.Node, g: string, base: string): string => {
  const [data, indices] = node.inputs as [string, string]
  const axis = node.attributes["axis"]?.kind === "int" ? node.attributes["axis"].value : 0
  if (axis !== 0) throw new Shapes.ShapeInferenceError("Gather backward supports axis 0 only")
  const dd = e.dims(data)
  const n = e.dims(indices).reduce((p, d) => p * d, 1)
  const idx = reshapeTo(e, indices, [n, 1])
  const rows = reshapeTo(e, g, [n, ...dd.slice(1)])
  // Repeated ids (the same token twice) accumulate: ScatterND with reduction "add".
  return e.op("ScatterND", [base, idx, rows], { reduction: Graph.string("add") })
}

const gatherElements: Rule = (e, node, [g], needs) => {
  if (!needs[0]) return [undefined, undefined]
  const [data, indices] = node.inputs as [string, string]
  return [
    e.op("ScatterElements", [e.zeros(e.dims(data), e.dtype(data)), indices, g!], {
      axis: node.attributes["axis"] ?? Graph.int(0),
      reduction: Graph.string("add")
    }),
    undefined
  ]
}

const slice: Rule = (e, node, [g]) => {
  const x = in0(node)
  const xd = e.dims(x)
  const v = (i: number) => (node.inputs[i] ? e.shapes.get(node.inputs[i]!).value : undefined)
  const bounds = Shapes.sliceBounds(xd, v(1)!, v(2)!, v(3), v(4))
  const pads = [...bounds.map(([s]) => s), ...bounds.map(([, end], i) => xd[i]! - end)]
  return [e.op("Pad", [g!, e.ints(pads)])]
}

const concat: Rule = (e, node, [g], needs) => {
  const rank = e.dims(node.inputs[0]!).length
  const raw = node.attributes["axis"]?.kind === "int" ? node.attributes["axis"].value : 0
  const axis = raw < 0 ? raw + rank : raw
  const sizes = node.inputs.map((n) => e.dims(n)[axis]!)
  const parts = e.opN("Split", [g!, e.ints(sizes)], sizes.length, { axis: Graph.int(axis) })
  return parts.map((p, i) => (needs[i] ? p : undefined))
}

const split: Rule = (e, node, grads) => {
  const x = in0(node)
  const rank = e.dims(x).length
  const raw = node.attributes["axis"]?.kind === "int" ? node.attributes["axis"].value : 0
  const axis = raw < 0 ? raw + rank : raw
  const parts = node.outputs.map((o, i) => grads[i] ?? e.zeros(e.dims(o), e.dtype(x)))
  return [e.op("Concat", parts, { axis: Graph.int(axis) })]
}

const where: Rule = (e, node, [g], needs) => {
  const [c, a, b] = node.inputs as [string, string, string]
  const zero = e.scalar(0, e.dtype(a))
  return [
    undefined,
    needs[1] ? e.reduceTo(e.op("Where", [c, g!, zero]), e.dims(a)) : undefined,
    needs[2] ? e.reduceTo(e.op("Where", [c, zero, g!]), e.dims(b)) : undefined
  ]
}

const minMax = (pick: "Max" | "Min"): Rule => (e, node, [g], needs) => {
  const [a, b] = node.inputs as [string, string]
  if (node.inputs.length !== 2) throw new Shapes.ShapeInferenceError(`${pick} backward supports two inputs`)
  const takeA = e.op(pick === "Max" ? "GreaterOrEqual" : "LessOrEqual", [a, b])
  const zero = e.scalar(0, e.dtype(a))
  return [
    needs[0] ? e.reduceTo(e.op("Where", [takeA, g!, zero]), e.dims(a)) : undefined,
    needs[1] ? e.reduceTo(e.op("Where", [takeA, zero, g!]), e.dims(b)) : undefined
  ]
}

const clip: Rule = (e, node, [g]) => {
  const x = in0(node)
  let inside: string | undefined
  if (node.inputs[1]) inside = e.op("GreaterOrEqual", [x, node.inputs[1]])
  if (node.inputs[2]) {
    const below = e.op("LessOrEqual", [x, node.inputs[2]])
    inside = inside === undefined ? below : e.op("And", [inside, below])
  }
  return [inside === undefined ? g : e.op("Where", [inside, g!, e.scalar(0, e.dtype(x))])]
}

type PartialGradient = (e: Emitter, a: string, b: string, g: string, y: string) => string

/**
 * A binary elementwise rule from the partial gradient of each input. Only the partials of the inputs that need a
 * gradient are emitted: onnxruntime does not remove unused nodes, so an unneeded partial (e.g. of a constant
 * factor) would run on every step.
 */
const binaryRule = (da: PartialGradient, db: PartialGradient | undefined): Rule => (e, node, [g], needs) => {
  const [a, b] = node.inputs as [string, string]
  const y = out0(node)
  return [
    needs[0] ? e.reduceTo(da(e, a, b, g!, y), e.dims(a)) : undefined,
    needs[1] && db !== undefined ? e.reduceTo(db(e, a, b, g!, y), e.dims(b)) : undefined
  ]
}

const plainMul = binaryRule((e, _a, b, g) => e.op("Mul", [g, b]), (e, a, _b, g) => e.op("Mul", [g, a]))

/**
 * `Mul`, with SiLU `y = a · σ(a)` (a Mul of a value and its own Sigmoid) differentiated as one function:
 * `dy/da = σ + y·(1 − σ)`, one factor computed from forward values and one product with the incoming gradient,
 * instead of two products, the Sigmoid rule's three ops and a sum on the MLP's widest activations.
 */
const mul: Rule = (e, node, grads, needs) => {
  const [a, b] = node.inputs as [string, string]
  const silu = [[a, b], [b, a]].find(([x, s]) => {
    const p = producer(e, s!)
    return p !== undefined && p.op === "Sigmoid" && p.inputs[0] === x && x !== s
  })
  if (silu === undefined) return plainMul(e, node, grads, needs)
  const [x, s] = silu as [string, string]
  if (!needs[node.inputs.indexOf(x)]) return [undefined, undefined]
  const y = out0(node)
  const slope = e.op("Add", [s, e.op("Mul", [y, e.op("Sub", [e.scalar(1, e.dtype(s)), s])])])
  const gx = e.op("Mul", [grads[0]!, slope])
  // No gradient flows into σ through this node: its share is inside `slope`.
  return node.inputs.map((i) => (i === x ? gx : undefined))
}

/**
 * The registry of backward rules by op type.
 *
 * @category constructors
 * @since 0.1.0
 */
export const rules: Readonly<Record<string, Rule>> = {
  Add: binaryRule((_e, _a, _b, g) => g, (_e, _a, _b, g) => g),
  Sub: binaryRule((_e, _a, _b, g) => g, (e, _a, _b, g) => e.op("Neg", [g])),
  Mul: mul,
  Div: binaryRule(
    (e, _a, b, g) => e.op("Div", [g, b]),
    (e, _a, b, g, y) => e.op("Neg", [e.op("Div", [e.op("Mul", [g, y]), b])])
  ),
  Pow: binaryRule((e, a, b, g) => {
    const bm1 = e.op("Sub", [b, e.scalar(1, e.dtype(b))])
    return e.op("Mul", [g, e.op("Mul", [b, e.op("Pow", [a, bm1])])])
  }, undefined),
  Sum: (e, node, [g], needs) => node.inputs.map((x, i) => (needs[i] ? e.reduceTo(g!, e.dims(x)) : undefined)),
  Max: minMax("Max"),
  Min: minMax("Min"),
  Neg: elementwise((e, _n, g) => e.op("Neg", [g])),
  Identity: elementwise((_e, _n, g) => g),
  Exp: elementwise((e, n, g) => e.op("Mul", [g, out0(n)])),
  Log: elementwise((e, n, g) => e.op("Div", [g, in0(n)])),
  Sqrt: elementwise((e, n, g) => e.op("Div", [e.op("Mul", [g, e.scalar(0.5, e.dtype(g))]), out0(n)])),
  Reciprocal: elementwise((e, n, g) => e.op("Neg", [e.op("Mul", [g, e.op("Mul", [out0(n), out0(n)])])])),
  Sigmoid: elementwise((e, n, g) => {
    const y = out0(n)
    return e.op("Mul", [g, e.op("Mul", [y, e.op("Sub", [e.scalar(1, e.dtype(y)), y])])])
  }),
  Tanh: elementwise((e, n, g) => {
    const y = out0(n)
    return e.op("Mul", [g, e.op("Sub", [e.scalar(1, e.dtype(y)), e.op("Mul", [y, y])])])
  }),
  Relu: elementwise((e, n, g) =>
    e.op("Where", [e.op("Greater", [in0(n), e.scalar(0, e.dtype(g))]), g, e.scalar(0, e.dtype(g))])
  ),
  Abs: elementwise((e, n, g) => e.op("Mul", [g, e.op("Sign", [in0(n)])])),
  Erf: elementwise((e, n, g) => {
    const x = in0(n)
    const t = e.dtype(x)
    const bump = e.op("Exp", [e.op("Neg", [e.op("Mul", [x, x])])])
    return e.op("Mul", [g, e.op("Mul", [bump, e.scalar(2 / Math.sqrt(Math.PI), t)])])
  }),
  Cast: elementwise((e, n, g) => {
    const from = e.dtype(in0(n))
    return from === e.dtype(g) ? g : e.op("Cast", [g], { to: Graph.int(Graph.dataTypeCode[from]) })
  }),
  Clip: clip,
  Where: where,
  MatMul: matMul,
  Gemm: gemm,
  Softmax: softmax,
  LogSoftmax: logSoftmax,
  Transpose: (e, node, [g]) => {
    const rank = e.dims(in0(node)).length
    const perm = node.attributes["perm"]?.kind === "ints"
      ? node.attributes["perm"].value
      : Array.from({ length: rank }, (_, i) => rank - 1 - i)
    const inverse = perm.map((_, i) => perm.indexOf(i))
    // Large models: a gradient that is a transpose by `perm` (a weight gradient's `(dYᵀ·A)ᵀ`) is not transposed
    // back; its transpose is removed, so that the product writes the weight's gradient itself.
    const p = e.large ? producer(e, g!) : undefined
    const pPerm = p?.op === "Transpose" && p.attributes["perm"]?.kind === "ints" ? p.attributes["perm"].value : []
    if (p !== undefined && pPerm.join() === perm.join() && e.graph.removeUnread(g!)) return [p.inputs[0]!]
    return [e.op("Transpose", [g!], { perm: Graph.ints(inverse) })]
  },
  Reshape: (e, node, [g]) => [reshapeTo(e, g!, inDims(e, node, 0)), undefined],
  Flatten: (e, node, [g]) => [reshapeTo(e, g!, inDims(e, node, 0))],
  Squeeze: (e, node, [g]) => [reshapeTo(e, g!, inDims(e, node, 0)), undefined],
  Unsqueeze: (e, node, [g]) => [reshapeTo(e, g!, inDims(e, node, 0)), undefined],
  Expand: (e, node, [g]) => [e.reduceTo(g!, inDims(e, node, 0)), undefined],
  Concat: concat,
  Split: split,
  Slice: slice,
  Gather: gather,
  GatherElements: gatherElements,
  ReduceSum: reduce("sum"),
  ReduceMean: reduce("mean"),
  ReduceMax: reduce("max")
}
