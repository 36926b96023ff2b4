/**
 * Static shape and dtype inference over an ONNX graph built with `onnx/Graph.ts`, for concrete input dimensions.
 *
 * The autodiff emits gradient nodes with static shapes (reductions over broadcast axes, reshapes back to an input's
 * shape), so it needs every value's dims. Symbolic input dims (`"batch"`, `"seq"`) are bound to numbers, and small
 * integer tensors (shapes, axes, indices computed in-graph with Shape/Gather/Concat/Range…) are constant-folded so
 * that Reshape, Slice, Expand and friends get exact output shapes. The inference is incremental: the autodiff calls
 * {@link Shapes.visit} on every node it emits.
 *
 * @since 0.1.0
 */
import type * as Graph from "../onnx/Graph.ts"

// ===== Models =====

/**
 * What is known about one value: dtype, dims and, for small integer/bool tensors, the folded contents.
 *
 * @category models
 * @since 0.1.0
 */
export interface Info {
  readonly dtype: Graph.DType
  readonly dims: ReadonlyArray<number>
  readonly value?: ReadonlyArray<number> | undefined
}

/**
 * An incremental shape table.
 *
 * @category models
 * @since 0.1.0
 */
export interface Shapes {
  readonly get: (name: string) => Info
  readonly has: (name: string) => boolean
  readonly set: (name: string, info: Info) => void
  /** Infers and records the outputs of one node. */
  readonly visit: (node: Graph.Node) => void
}

/**
 * Raised (as a defect in pure code, mapped to a typed error by `Autodiff`) when a value's shape cannot be inferred.
 *
 * @category errors
 * @since 0.1.0
 */
export class ShapeInferenceError extends Error {
  constructor(message: string) {
    super(message)
    this.name = "ShapeInferenceError"
  }
}

const codeToDType: Readonly<Record<number, Graph.DType>> = {
  1: "float32",
  6: "int32",
  7: "int64",
  9: "bool",
  11: "float64"
}

const MAX_FOLD = 4096

const size = (dims: ReadonlyArray<number>) => dims.reduce((a, b) => a * b, 1)

const isInt = (d: Graph.DType) => d === "int64" || d === "int32" || d === "bool"

// ===== Constructors =====

/**
 * Builds the table for `graph`, binding symbolic input dims through `dims` (e.g. `{ batch: 8, seq: 64 }`), and
 * visits every existing node.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (graph: Graph.Graph, dims: Readonly<Record<string, number>>): Shapes => {
  const table = new Map<string, Info>()
  const get = (name: string): Info => {
    const info = table.get(name)
    if (info === undefined) throw new ShapeInferenceError(`no shape known for value "${name}"`)
    return info
  }
  for (const input of graph.inputs) {
    const concrete = input.shape.map((d) => {
      if (typeof d === "number") return d
      const bound = dims[d]
      if (bound === undefined) throw new ShapeInferenceError(`input ${input.name}: symbolic dim "${d}" is not bound`)
      return bound
    })
    table.set(input.name, { dtype: input.dtype, dims: concrete })
  }
  for (const [name, t] of graph.initializers) table.set(name, tensorInfo(t))
  const shapes: Shapes = {
    get,
    has: (name) => table.has(name),
    set: (name, info) => void table.set(name, info),
    visit: (node) => {
      const outs = infer(node, (name) => (name === "" ? undefined : get(name)))
      node.outputs.forEach((o, i) => {
        const info = outs[i]
        if (o !== "" && info !== undefined) table.set(o, info)
      })
    }
  }
  for (const node of graph.nodes) shapes.visit(node)
  return shapes
}

/**
 * The info of a constant tensor (folded when small and integral).
 *
 * @category constructors
 * @since 0.1.0
 */
export const tensorInfo = (t: Graph.TensorData): Info => ({
  dtype: t.dtype,
  dims: t.dims,
  value: isInt(t.dtype) && t.data.length <= MAX_FOLD
    ? Array.from(t.data as ArrayLike<number | bigint>, Number)
    : undefined
})

// ===== Inference rules =====

const attrInt = (node: Graph.Node, name: string, fallback: number): number => {
  const a = node.attributes[name]
  return a !== undefined && a.kind === "int" ? a.value : fallback
}

const attrInts = (node: Graph.Node, name: string): ReadonlyArray<number> | undefined => {
  const a = node.attributes[name]
  return a !== undefined && a.kind === "ints" ? a.value : undefined
}

/**
 * Numpy broadcasting of two shapes.
 *
 * @category combinators
 * @since 0.1.0
 */
export const broadcast = (a: ReadonlyArray<number>, b: ReadonlyArray<number>): Array<number> => {
  const rank = Math.max(a.length, b.length)
  const out: Array<number> = []
  for (let i = 0; i < rank; i++) {
    const x = a[i - (rank - a.length)] ?? 1
    const y = b[i - (rank - b.length)] ?? 1
    if (x !== y && x !== 1 && y !== 1) throw new ShapeInferenceError(`cannot broadcast [${a}] with [${b}]`)
    out.push(x === 1 ? y : x)
  }
  return out
}

const normAxis = (axis: number, rank: number) => (axis < 0 ? axis + rank : axis)

const need = (info: Info | undefined, what: string): Info => {
  if (info === undefined) throw new ShapeInferenceError(`missing ${what}`)
  return info
}

const valueOf = (info: Info | undefined, what: string): ReadonlyArray<number> => {
  const v = need(info, what).value
  if (v === undefined) throw new ShapeInferenceError(`${what} must be a constant (or computable from shapes)`)
  return v
}

/** Elementwise folding of integer binary ops with broadcasting. */
const foldBinary = (op: string, a: Info, b: Info, dims: ReadonlyArray<number>): Array<number> | undefined => {
  if (a.value === undefined || b.value === undefined || size(dims) > MAX_FOLD) return undefined
  const f: ((x: number, y: number) => number) | undefined = {
    Add: (x: number, y: number) => x + y,
    Sub: (x: number, y: number) => x - y,
    Mul: (x: number, y: number) => x * y,
    Div: (x: number, y: number) => Math.trunc(x / y),
    Equal: (x: number, y: number) => Number(x === y),
    Less: (x: number, y: number) => Number(x < y),
    LessOrEqual: (x: number, y: number) => Number(x <= y),
    Greater: (x: number, y: number) => Number(x > y),
    And: (x: number, y: number) => Number(x !== 0 && y !== 0),
    Max: Math.max,
    Min: Math.min
  }[op]
  if (f === undefined) return undefined
  const idx = broadcastIndex(dims)
  return Array.from({ length: size(dims) }, (_, i) => f(a.value![idx(i, a.dims)]!, b.value![idx(i, b.dims)]!))
}

/** Maps a flat index of the broadcast output to the flat index in an operand of shape `src`. */
const broadcastIndex = (dims: ReadonlyArray<number>) => (flat: number, src: ReadonlyArray<number>): number => {
  let rem = flat
  let index = 0
  let stride = 1
  for (let i = dims.length - 1; i >= 0; i--) {
    const coord = rem % dims[i]!
    rem = Math.floor(rem / dims[i]!)
    const j = i - (dims.length - src.length)
    if (j >= 0) {
      if (src[j] !== 1) index += coord * stride
      stride *= src[j]!
    }
  }
  return index
}

const sliceRange = (dim: number, start: number, end: number): [number, number] => {
  const s = start < 0 ? Math.max(0, start + dim) : Math.min(start, dim)
  const e = end < 0 ? Math.max(0, end + dim) : Math.min(end, dim)
  return [s, Math.max(s, e)]
}

/**
 * Normalised Slice parameters: per axis `[start, end)` (steps must be 1).
 *
 * @category combinators
 * @since 0.1.0
 */
export const sliceBounds = (
  dims: ReadonlyArray<number>,
  starts: ReadonlyArray<number>,
  ends: ReadonlyArray<number>,
  axes: ReadonlyArray<number> | undefined,
  steps: ReadonlyArray<number> | undefined
): Array<[number, number]> => {
  const bounds = dims.map((d): [number, number] => [0, d])
  starts.forEach((start, i) => {
    if (steps !== undefined && steps[i] !== 1) throw new ShapeInferenceError("Slice with steps other than 1")
    const axis = normAxis(axes?.[i] ?? i, dims.length)
    bounds[axis] = sliceRange(dims[axis]!, start, ends[i]!)
  })
  return bounds
}

const unary = new Set([
  "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Sigmoid", "Tanh", "Relu", "Abs", "Identity", "Softmax", "LogSoftmax",
  "Erf", "Not", "Floor", "Ceil", "Sign", "Clip"
])
const binary = new Set([
  "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
  "And", "Or"
])
const comparisons = new Set(["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Not"])

type Lookup = (name: string) => Info | undefined

const infer = (node: Graph.Node, at: Lookup): ReadonlyArray<Info | undefined> => {
  const x = () => need(at(node.inputs[0]!), `input 0 of ${node.op}`)
  const op = node.op
  if (unary.has(op)) {
    const a = x()
    const value = op === "Identity" ? a.value : op === "Not" && a.value ? a.value.map((v) => Number(!v)) : undefined
    return [{ dtype: comparisons.has(op) ? "bool" : a.dtype, dims: a.dims, value }]
  }
  if (binary.has(op)) {
    const a = x()
    const b = need(at(node.inputs[1]!), `input 1 of ${op}`)
    const dims = broadcast(a.dims, b.dims)
    return [{ dtype: comparisons.has(op) ? "bool" : a.dtype, dims, value: foldBinary(op, a, b, dims) }]
  }
  switch (op) {
    case "Sum": {
      const infos = node.inputs.map((n) => need(at(n), "Sum input"))
      return [{ dtype: infos[0]!.dtype, dims: infos.map((i) => i.dims).reduce(broadcast) }]
    }
    case "Where": {
      const [c, a, b] = node.inputs.map((n) => need(at(n), "Where input"))
      const dims = broadcast(broadcast(c!.dims, a!.dims), b!.dims)
      const idx = broadcastIndex(dims)
      const pick = (i: number) =>
        c!.value![idx(i, c!.dims)] ? a!.value![idx(i, a!.dims)]! : b!.value![idx(i, b!.dims)]!
      const value = c!.value && a!.value && b!.value && size(dims) <= MAX_FOLD
        ? Array.from({ length: size(dims) }, (_, i) => pick(i))
        : undefined
      return [{ dtype: a!.dtype, dims, value }]
    }
    case "Cast": {
      const a = x()
      const to = codeToDType[attrInt(node, "to", 1)]
      if (to === undefined) throw new ShapeInferenceError(`Cast to unsupported type ${attrInt(node, "to", 1)}`)
      const value = isInt(to) ? a.value?.map((v) => (to === "bool" ? Number(v !== 0) : Math.trunc(v))) : undefined
      return [{ dtype: to, dims: a.dims, value }]
    }
    case "MatMul": {
      const a = x()
      const b = need(at(node.inputs[1]!), "MatMul input 1")
      if (a.dims.length < 2 || b.dims.length < 2) {
        throw new ShapeInferenceError("MatMul on a 1-D operand is not supported")
      }
      if (a.dims.at(-1) !== b.dims.at(-2)) throw new ShapeInferenceError(`MatMul [${a.dims}] × [${b.dims}]`)
      const batch = broadcast(a.dims.slice(0, -2), b.dims.slice(0, -2))
      return [{ dtype: a.dtype, dims: [...batch, a.dims.at(-2)!, b.dims.at(-1)!] }]
    }
    case "FusedMatMul": {
      // com.microsoft: MatMul of op(A) and op(B), op = swap of the last two axes where transA/transB is set.
      const swap = (d: ReadonlyArray<number>, t: boolean) => (t ? [...d.slice(0, -2), d.at(-1)!, d.at(-2)!] : d)
      const a = swap(x().dims, attrInt(node, "transA", 0) === 1)
      const b = swap(need(at(node.inputs[1]!), "FusedMatMul input 1").dims, attrInt(node, "transB", 0) === 1)
      if (a.at(-1) !== b.at(-2)) throw new ShapeInferenceError(`FusedMatMul [${a}] × [${b}]`)
      const batch = broadcast(a.slice(0, -2), b.slice(0, -2))
      return [{ dtype: x().dtype, dims: [...batch, a.at(-2)!, b.at(-1)!] }]
    }
    case "Gemm": {
      const a = x()
      const b = need(at(node.inputs[1]!), "Gemm input 1")
      const m = attrInt(node, "transA", 0) === 1 ? a.dims[1]! : a.dims[0]!
      const n = attrInt(node, "transB", 0) === 1 ? b.dims[0]! : b.dims[1]!
      return [{ dtype: a.dtype, dims: [m, n] }]
    }
    case "Transpose": {
      const a = x()
      const perm = attrInts(node, "perm") ?? a.dims.map((_, i) => a.dims.length - 1 - i)
      return [{ dtype: a.dtype, dims: perm.map((p) => a.dims[p]!) }]
    }
    case "Reshape": {
      const a = x()
      const target = valueOf(at(node.inputs[1]!), "Reshape shape")
      const dims = target.map((d, i) => (d === 0 ? a.dims[i]! : d))
      const known = dims.filter((d) => d !== -1).reduce((p, d) => p * d, 1)
      const out = dims.map((d) => (d === -1 ? size(a.dims) / known : d))
      if (size(out) !== size(a.dims)) throw new ShapeInferenceError(`Reshape [${a.dims}] to [${target}]`)
      return [{ dtype: a.dtype, dims: out, value: a.value }]
    }
    case "Flatten": {
      const a = x()
      const axis = normAxis(attrInt(node, "axis", 1), a.dims.length)
      return [{ dtype: a.dtype, dims: [size(a.dims.slice(0, axis)), size(a.dims.slice(axis))], value: a.value }]
    }
    case "Unsqueeze": {
      const a = x()
      const axes = valueOf(at(node.inputs[1]!), "Unsqueeze axes")
      const rank = a.dims.length + axes.length
      const norm = new Set(axes.map((ax) => normAxis(ax, rank)))
      const dims: Array<number> = []
      let j = 0
      for (let i = 0; i < rank; i++) dims.push(norm.has(i) ? 1 : a.dims[j++]!)
      return [{ dtype: a.dtype, dims, value: a.value }]
    }
    case "Squeeze": {
      const a = x()
      const axesInfo = node.inputs[1] ? at(node.inputs[1]) : undefined
      const axes = axesInfo ? valueOf(axesInfo, "Squeeze axes").map((ax) => normAxis(ax, a.dims.length)) : undefined
      const dims = a.dims.filter((d, i) => (axes ? !axes.includes(i) : d !== 1))
      return [{ dtype: a.dtype, dims, value: a.value }]
    }
    case "Concat": {
      const infos = node.inputs.map((n) => need(at(n), "Concat input"))
      const axis = normAxis(attrInt(node, "axis", 0), infos[0]!.dims.length)
      const dims = [...infos[0]!.dims]
      dims[axis] = infos.reduce((s, i) => s + i.dims[axis]!, 0)
      const value = axis === 0 && infos[0]!.dims.length === 1 && infos.every((i) => i.value !== undefined)
        ? infos.flatMap((i) => i.value!)
        : undefined
      return [{ dtype: infos[0]!.dtype, dims, value }]
    }
    case "Split": {
      const a = x()
      const axis = normAxis(attrInt(node, "axis", 0), a.dims.length)
      const parts = node.inputs[1] ? valueOf(at(node.inputs[1]), "Split sizes") : undefined
      const n = node.outputs.length
      return node.outputs.map((_, i) => {
        const dims = [...a.dims]
        dims[axis] = parts ? parts[i]! : a.dims[axis]! / n
        return { dtype: a.dtype, dims }
      })
    }
    case "Slice": {
      const a = x()
      const starts = valueOf(at(node.inputs[1]!), "Slice starts")
      const ends = valueOf(at(node.inputs[2]!), "Slice ends")
      const axes = node.inputs[3] ? valueOf(at(node.inputs[3]), "Slice axes") : undefined
      const steps = node.inputs[4] ? valueOf(at(node.inputs[4]), "Slice steps") : undefined
      const bounds = sliceBounds(a.dims, starts, ends, axes, steps)
      const dims = bounds.map(([s, e]) => e - s)
      const value = a.value && a.dims.length === 1 ? a.value.slice(bounds[0]![0], bounds[0]![1]) : undefined
      return [{ dtype: a.dtype, dims, value }]
    }
    case "Gather": {
      const a = x()
      const indices = need(at(node.inputs[1]!), "Gather indices")
      const axis = normAxis(attrInt(node, "axis", 0), a.dims.length)
      const dims = [...a.dims.slice(0, axis), ...indices.dims, ...a.dims.slice(axis + 1)]
      const value = a.value && indices.value && a.dims.length === 1
        ? indices.value.map((i) => a.value![i < 0 ? i + a.dims[0]! : i]!)
        : undefined
      return [{ dtype: a.dtype, dims, value }]
    }
    case "GatherElements":
      return [{ dtype: x().dtype, dims: need(at(node.inputs[1]!), "GatherElements indices").dims }]
    case "ScatterND":
    case "ScatterElements":
      return [{ dtype: x().dtype, dims: x().dims }]
    case "ReduceSum":
    case "ReduceMean":
    case "ReduceMax": {
      const a = x()
      const axes = reduceAxes(node, at, a.dims.length)
      const keep = attrInt(node, "keepdims", 1) === 1
      const dims = keep
        ? a.dims.map((d, i) => (axes.includes(i) ? 1 : d))
        : a.dims.filter((_, i) => !axes.includes(i))
      return [{ dtype: a.dtype, dims }]
    }
    case "Shape": {
      const a = x()
      const start = attrInt(node, "start", 0)
      const end = attrInt(node, "end", a.dims.length)
      const [s, e] = sliceRange(a.dims.length, start, end)
      return [{ dtype: "int64", dims: [e - s], value: a.dims.slice(s, e) }]
    }
    case "Size":
      return [{ dtype: "int64", dims: [], value: [size(x().dims)] }]
    case "ConstantOfShape": {
      const dims = valueOf(x(), "ConstantOfShape shape")
      const a = node.attributes["value"]
      const t = a !== undefined && a.kind === "tensor" ? a.value : undefined
      const dtype = t?.dtype ?? "float32"
      const fill = t ? Number(t.data[0]!) : 0
      const value = isInt(dtype) && size(dims) <= MAX_FOLD ? new Array<number>(size(dims)).fill(fill) : undefined
      return [{ dtype, dims, value }]
    }
    case "Constant": {
      const a = node.attributes["value"]
      if (a === undefined || a.kind !== "tensor") throw new ShapeInferenceError("Constant without a tensor value")
      return [tensorInfo(a.value)]
    }
    case "Range": {
      const [start, limit, delta] = [0, 1, 2].map((i) => valueOf(at(node.inputs[i]!), `Range input ${i}`)[0]!)
      const n = Math.max(Math.ceil((limit! - start!) / delta!), 0)
      const dtype = need(at(node.inputs[0]!), "Range start").dtype
      const value = n <= MAX_FOLD ? Array.from({ length: n }, (_, i) => start! + i * delta!) : undefined
      return [{ dtype, dims: [n], value }]
    }
    case "Expand": {
      const a = x()
      const target = valueOf(at(node.inputs[1]!), "Expand shape")
      return [{ dtype: a.dtype, dims: broadcast(a.dims, target) }]
    }
    case "Tile": {
      const a = x()
      const reps = valueOf(at(node.inputs[1]!), "Tile repeats")
      return [{ dtype: a.dtype, dims: a.dims.map((d, i) => d * reps[i]!) }]
    }
    case "Pad": {
      const a = x()
      const pads = valueOf(at(node.inputs[1]!), "Pad pads")
      const r = a.dims.length
      return [{ dtype: a.dtype, dims: a.dims.map((d, i) => d + pads[i]! + pads[i + r]!) }]
    }
    case "Trilu":
      return [{ dtype: x().dtype, dims: x().dims }]
    case "CumSum":
      return [{ dtype: x().dtype, dims: x().dims }]
    default:
      throw new ShapeInferenceError(`no shape rule for op ${op}`)
  }
}

/**
 * The normalised reduction axes of a Reduce* node (opset 17: ReduceSum takes axes as an input, the others as an
 * attribute; no axes = all, unless `noop_with_empty_axes`).
 *
 * @category combinators
 * @since 0.1.0
 */
export const reduceAxes = (node: Graph.Node, at: Lookup, rank: number): Array<number> => {
  const fromInput = node.inputs[1] ? valueOf(at(node.inputs[1]), `${node.op} axes`) : undefined
  const axes = fromInput ?? attrInts(node, "axes")
  if (axes === undefined || axes.length === 0) {
    return attrInt(node, "noop_with_empty_axes", 0) === 1 ? [] : Array.from({ length: rank }, (_, i) => i)
  }
  return axes.map((a) => normAxis(a, rank))
}
