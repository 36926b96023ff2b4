/**
 * An ONNX graph as inspectable data, plus a builder and a serializer to ModelProto bytes.
 *
 * The policy engine (inference) and the learner (reverse-mode autodiff) share this representation: the model's
 * forward pass is emitted once through a {@link Graph}; the learner appends loss nodes and walks `graph.nodes`
 * backwards, emitting gradient nodes into the same graph. {@link toModelBytes} encodes the result as an ONNX
 * `ModelProto` that `ort.InferenceSession.create(bytes)` loads directly (no `onnx-proto` dependency: the
 * protobuf writer in `internal/protobuf.ts` covers the few messages ONNX needs).
 *
 * @since 0.1.0
 */
import * as Pb from "./internal/protobuf.ts"

// ===== Models =====

/**
 * Element types supported by the builder.
 *
 * @category models
 * @since 0.1.0
 */
export type DType = "float32" | "float64" | "int64" | "int32" | "bool"

/**
 * A dimension: a number, or a string naming a symbolic dimension ("batch", "seq").
 *
 * @category models
 * @since 0.1.0
 */
export type Dim = number | string

/**
 * @category models
 * @since 0.1.0
 */
export interface ValueInfo {
  readonly name: string
  readonly dtype: DType
  readonly shape: ReadonlyArray<Dim>
}

/**
 * A constant tensor. `data` is row-major; `bool` tensors use one byte per element.
 *
 * @category models
 * @since 0.1.0
 */
export interface TensorData {
  readonly dtype: DType
  readonly dims: ReadonlyArray<number>
  readonly data: Float32Array | Float64Array | BigInt64Array | Int32Array | Uint8Array
}

/**
 * A node attribute.
 *
 * @category models
 * @since 0.1.0
 */
export type Attribute =
  | { readonly kind: "int"; readonly value: number }
  | { readonly kind: "float"; readonly value: number }
  | { readonly kind: "ints"; readonly value: ReadonlyArray<number> }
  | { readonly kind: "floats"; readonly value: ReadonlyArray<number> }
  | { readonly kind: "string"; readonly value: string }
  | { readonly kind: "tensor"; readonly value: TensorData }

/**
 * One operator application. An empty input name means "optional input omitted", as in ONNX.
 *
 * @category models
 * @since 0.1.0
 */
export interface Node {
  readonly op: string
  readonly inputs: ReadonlyArray<string>
  readonly outputs: ReadonlyArray<string>
  readonly attributes: Readonly<Record<string, Attribute>>
  readonly domain?: string
}

/**
 * A mutable graph builder whose state (`nodes`, `inputs`, `outputs`, `initializers`) is readable at any time.
 *
 * @category models
 * @since 0.1.0
 */
export interface Graph {
  readonly name: string
  readonly nodes: ReadonlyArray<Node>
  readonly inputs: ReadonlyArray<ValueInfo>
  readonly outputs: ReadonlyArray<ValueInfo>
  readonly initializers: ReadonlyMap<string, TensorData>
  /** Declares a graph input and returns its name. */
  input(name: string, dtype: DType, shape: ReadonlyArray<Dim>): string
  /** Adds a named constant tensor (an ONNX initializer) and returns its name. */
  initializer(name: string, tensor: TensorData): string
  /** Adds a constant under a fresh name. */
  constant(tensor: TensorData): string
  /** Appends a node with one output under a fresh name and returns that name. */
  op(op: string, inputs: ReadonlyArray<string>, attributes?: Record<string, Attribute>): string
  /** Appends a node with `outputs` outputs under fresh names. */
  opN(
    op: string,
    inputs: ReadonlyArray<string>,
    outputs: number,
    attributes?: Record<string, Attribute>
  ): ReadonlyArray<string>
  /**
   * Appends a node whose outputs have the given names (e.g. `"logits"`, `"present.0.key"`) and returns them.
   * An addition to the shared contract, for graphs whose output names are part of an interface.
   */
  node(
    op: string,
    inputs: ReadonlyArray<string>,
    outputs: ReadonlyArray<string>,
    attributes?: Record<string, Attribute>,
    domain?: string
  ): ReadonlyArray<string>
  /** Declares an existing value as a graph output. */
  output(name: string, dtype: DType, shape: ReadonlyArray<Dim>): void
  /** A value name not used so far in this graph. */
  fresh(prefix: string): string
  /**
   * Removes the node that produces `value` when no node reads it and it is not an output (a transpose the autodiff
   * cancels); returns whether it did.
   */
  removeUnread(value: string): boolean
}

// ===== Constructors =====

/**
 * An empty graph.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (name: string): Graph => {
  const nodes: Array<Node> = []
  const inputs: Array<ValueInfo> = []
  const outputs: Array<ValueInfo> = []
  const initializers = new Map<string, TensorData>()
  const used = new Set<string>()
  let counter = 0
  const claim = (n: string): string => {
    if (used.has(n) && !initializers.has(n)) throw new Error(`Graph ${name}: value name "${n}" is already defined`)
    used.add(n)
    return n
  }
  const fresh = (prefix: string): string => {
    let n = `${prefix}_${counter++}`
    while (used.has(n)) n = `${prefix}_${counter++}`
    used.add(n)
    return n
  }
  const node = (
    op: string,
    ins: ReadonlyArray<string>,
    outs: ReadonlyArray<string>,
    attributes: Record<string, Attribute> = {},
    domain?: string
  ): ReadonlyArray<string> => {
    for (const o of outs) if (!used.has(o)) used.add(o)
    nodes.push(domain === undefined ? { op, inputs: ins, outputs: outs, attributes } : {
      op,
      inputs: ins,
      outputs: outs,
      attributes,
      domain
    })
    return outs
  }
  const initializer = (n: string, tensor: TensorData): string => {
    checkTensor(n, tensor)
    if (initializers.has(n)) throw new Error(`Graph ${name}: initializer "${n}" is already defined`)
    claim(n)
    initializers.set(n, tensor)
    return n
  }
  return {
    name,
    nodes,
    inputs,
    outputs,
    initializers,
    fresh,
    node,
    input: (n, dtype, shape) => {
      claim(n)
      inputs.push({ name: n, dtype, shape: [...shape] })
      return n
    },
    initializer,
    constant: (tensor) => {
      checkTensor("constant", tensor)
      const n = fresh("const")
      initializers.set(n, tensor)
      return n
    },
    op: (op, ins, attributes) => node(op, ins, [fresh(op)], attributes)[0]!,
    opN: (op, ins, count, attributes) =>
      node(op, ins, Array.from({ length: count }, () => fresh(op)), attributes),
    output: (n, dtype, shape) => {
      outputs.push({ name: n, dtype, shape: [...shape] })
    },
    removeUnread: (value) => {
      const at = nodes.findIndex((n) => n.outputs.includes(value))
      const read = nodes.some((n) => n.inputs.includes(value)) || outputs.some((o) => o.name === value)
      if (at === -1 || read || nodes[at]!.outputs.length !== 1) return false
      nodes.splice(at, 1)
      return true
    }
  }
}

const elementCount = (dims: ReadonlyArray<number>): number => dims.reduce((a, b) => a * b, 1)

const checkTensor = (name: string, t: TensorData): void => {
  const n = elementCount(t.dims)
  if (t.data.length !== n) {
    throw new Error(`tensor ${name}: dims [${t.dims.join(", ")}] need ${n} elements, data has ${t.data.length}`)
  }
}

// ===== Attribute and tensor constructors =====

/** @category constructors @since 0.1.0 */
export const int = (value: number): Attribute => ({ kind: "int", value })
/** @category constructors @since 0.1.0 */
export const float = (value: number): Attribute => ({ kind: "float", value })
/** @category constructors @since 0.1.0 */
export const ints = (value: ReadonlyArray<number>): Attribute => ({ kind: "ints", value })
/** @category constructors @since 0.1.0 */
export const floats = (value: ReadonlyArray<number>): Attribute => ({ kind: "floats", value })
/** @category constructors @since 0.1.0 */
export const string = (value: string): Attribute => ({ kind: "string", value })
/** @category constructors @since 0.1.0 */
export const tensor = (value: TensorData): Attribute => ({ kind: "tensor", value })

/**
 * A float32 tensor; a scalar when `dims` is empty.
 *
 * @category constructors
 * @since 0.1.0
 */
export const float32 = (dims: ReadonlyArray<number>, values: ArrayLike<number>): TensorData => ({
  dtype: "float32",
  dims,
  data: Float32Array.from(values)
})

/**
 * An int64 tensor from plain numbers; a scalar when `dims` is empty.
 *
 * @category constructors
 * @since 0.1.0
 */
export const int64 = (dims: ReadonlyArray<number>, values: ReadonlyArray<number>): TensorData => ({
  dtype: "int64",
  dims,
  data: BigInt64Array.from(values, (v) => BigInt(v))
})

/**
 * ONNX `TensorProto.DataType` codes of the supported element types.
 *
 * @category models
 * @since 0.1.0
 */
export const dataTypeCode: Readonly<Record<DType, number>> = {
  float32: 1,
  int32: 6,
  int64: 7,
  bool: 9,
  float64: 11
}

// ===== Serialization =====

const tensorProto = (name: string, t: TensorData): Pb.Message => {
  const m = Pb.message()
  if (t.dims.length > 0) Pb.packedInts(m, 1, t.dims)
  Pb.int(m, 2, dataTypeCode[t.dtype])
  Pb.string(m, 8, name)
  // raw_data is little-endian; typed arrays on every supported platform (x64, arm64) are too.
  Pb.bytes(m, 9, new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength))
  return m
}

/**
 * Where an initializer's data lies in an external file (ONNX's external data): `location` relative to the folder
 * onnxruntime resolves it against, `offset` and `length` in bytes.
 *
 * @category models
 * @since 0.1.0
 */
export interface ExternalData {
  readonly location: string
  readonly offset: number
  readonly length: number
}

// TensorProto fields 13 (external_data: key/value entries) and 14 (data_location: 1 = EXTERNAL).
const externalTensorProto = (v: ValueInfo, data: ExternalData): Pb.Message => {
  const dims = v.shape.map((d) => {
    if (typeof d !== "number") throw new Error(`input ${v.name}: an initializer needs fixed dims, got "${d}"`)
    return d
  })
  const m = Pb.message()
  if (dims.length > 0) Pb.packedInts(m, 1, dims)
  Pb.int(m, 2, dataTypeCode[v.dtype])
  Pb.string(m, 8, v.name)
  for (const [key, value] of [["location", data.location], ["offset", data.offset], ["length", data.length]]) {
    const entry = Pb.message()
    Pb.string(entry, 1, String(key))
    Pb.string(entry, 2, String(value))
    Pb.nested(m, 13, entry)
  }
  Pb.int(m, 14, 1)
  return m
}

const attributeProto = (name: string, a: Attribute): Pb.Message => {
  const m = Pb.message()
  Pb.string(m, 1, name)
  switch (a.kind) {
    case "float":
      Pb.float(m, 2, a.value)
      Pb.int(m, 20, 1)
      break
    case "int":
      Pb.int(m, 3, BigInt(a.value))
      Pb.int(m, 20, 2)
      break
    case "string":
      Pb.string(m, 4, a.value)
      Pb.int(m, 20, 3)
      break
    case "tensor":
      Pb.nested(m, 5, tensorProto("", a.value))
      Pb.int(m, 20, 4)
      break
    case "floats":
      Pb.packedFloats(m, 7, a.value)
      Pb.int(m, 20, 6)
      break
    case "ints":
      Pb.packedInts(m, 8, a.value.map((v) => BigInt(v)))
      Pb.int(m, 20, 7)
      break
  }
  return m
}

const valueInfoProto = (v: ValueInfo): Pb.Message => {
  const shape = Pb.message()
  for (const d of v.shape) {
    const dim = Pb.message()
    if (typeof d === "number") Pb.int(dim, 1, d)
    else Pb.string(dim, 2, d)
    Pb.nested(shape, 1, dim)
  }
  const tensorType = Pb.message()
  Pb.int(tensorType, 1, dataTypeCode[v.dtype])
  Pb.nested(tensorType, 2, shape)
  const type = Pb.message()
  Pb.nested(type, 1, tensorType)
  const m = Pb.message()
  Pb.string(m, 1, v.name)
  Pb.nested(m, 2, type)
  return m
}

const nodeProto = (n: Node, index: number): Pb.Message => {
  const m = Pb.message()
  for (const i of n.inputs) Pb.string(m, 1, i)
  for (const o of n.outputs) Pb.string(m, 2, o)
  Pb.string(m, 3, `${n.op}_n${index}`)
  Pb.string(m, 4, n.op)
  for (const [k, a] of Object.entries(n.attributes)) Pb.nested(m, 5, attributeProto(k, a))
  if (n.domain !== undefined && n.domain !== "") Pb.string(m, 7, n.domain)
  return m
}

/**
 * Encodes the graph as an ONNX `ModelProto` (default opset 17, IR version 8) loadable by
 * `ort.InferenceSession.create(bytes)`. Nodes must already be in topological order, which the builder
 * guarantees when every input was produced before it was used.
 *
 * `external` turns the graph inputs it names (fixed shapes) into initializers whose data lies in a file (a LoRA
 * run's frozen base for the learner's worker threads: onnxruntime maps such a file instead of copying it).
 *
 * @category encoding
 * @since 0.1.0
 */
export const toModelBytes = (
  graph: Graph,
  options: {
    readonly opset?: number
    readonly irVersion?: number
    readonly external?: ReadonlyMap<string, ExternalData>
  } = {}
): Uint8Array => {
  const g = Pb.message()
  const external = options.external ?? new Map<string, ExternalData>()
  graph.nodes.forEach((n, i) => Pb.nested(g, 1, nodeProto(n, i)))
  Pb.string(g, 2, graph.name)
  for (const [name, t] of graph.initializers) Pb.nested(g, 5, tensorProto(name, t))
  for (const v of graph.inputs) {
    const data = external.get(v.name)
    if (data === undefined) Pb.nested(g, 11, valueInfoProto(v))
    else Pb.nested(g, 5, externalTensorProto(v, data))
  }
  for (const v of graph.outputs) Pb.nested(g, 12, valueInfoProto(v))
  const model = Pb.message()
  Pb.int(model, 1, options.irVersion ?? 8)
  Pb.string(model, 2, "agentfly")
  const domains = new Set(graph.nodes.flatMap((n) => (n.domain ? [n.domain] : [])))
  const opset = Pb.message()
  Pb.string(opset, 1, "")
  Pb.int(opset, 2, options.opset ?? 17)
  Pb.nested(model, 8, opset)
  for (const d of domains) {
    const o = Pb.message()
    Pb.string(o, 1, d)
    Pb.int(o, 2, 1)
    Pb.nested(model, 8, o)
  }
  Pb.nested(model, 7, g)
  return Pb.finish(model)
}

/**
 * Structural problems that would make ONNX Runtime reject the graph, as readable sentences: a node input that is
 * neither a graph input, an initializer nor an earlier node's output; a value produced twice; a declared output
 * that nothing produces. Empty when the graph is well formed.
 *
 * @category validation
 * @since 0.1.0
 */
export const problems = (graph: Graph): ReadonlyArray<string> => {
  const out: Array<string> = []
  const defined = new Set<string>([...graph.inputs.map((i) => i.name), ...graph.initializers.keys()])
  graph.nodes.forEach((n, i) => {
    for (const input of n.inputs) {
      if (input !== "" && !defined.has(input)) out.push(`node ${i} (${n.op}) reads undefined value "${input}"`)
    }
    for (const o of n.outputs) {
      if (defined.has(o)) out.push(`node ${i} (${n.op}) redefines value "${o}"`)
      defined.add(o)
    }
  })
  for (const o of graph.outputs) if (!defined.has(o.name)) out.push(`output "${o.name}" is never produced`)
  return out
}
