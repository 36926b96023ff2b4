/**
 * Reverse-mode automatic differentiation over ONNX graphs, and the learner's training graph.
 *
 * The model's forward pass is built once with `onnx/Graph.ts`; {@link trainingGraph} copies it, appends the loss
 * head, then walks the forward nodes backwards and appends, for every node on a path from a weight to the loss, the
 * nodes of its backward rule (`Backward.rules`). Gradients reaching a value from several consumers are summed. The
 * result is one graph whose inputs are the weights and the batch data and whose outputs are the loss, the per-token
 * logprobs, the statistics and one gradient per weight: nothing is re-serialised per step.
 *
 * Shapes are static: the graph is built for one `(batch, length)`; the trainer caches one per shape bucket.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import type * as Loss from "../Loss.ts"
import * as Graph from "../onnx/Graph.ts"
import * as Backward from "./Backward.ts"
import * as ChunkedHead from "./ChunkedHead.ts"
import * as LossHead from "./LossHead.ts"
import * as Shapes from "./Shapes.ts"

// ===== Errors =====

/**
 * An op on the path from the weights to the loss has no backward rule.
 *
 * @category errors
 * @since 0.1.0
 */
export class NoBackwardRule extends Schema.TaggedError<NoBackwardRule>()("NoBackwardRule", {
  message: Schema.String,
  /** The op. */
  op: Schema.String
}) {}

/**
 * A shape could not be inferred (`cause`: what the shape rules threw).
 *
 * @category errors
 * @since 0.1.0
 */
export class ShapeInference extends Schema.TaggedError<ShapeInference>()("ShapeInference", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * A weight is not a value of the graph.
 *
 * @category errors
 * @since 0.1.0
 */
export class UnknownValue extends Schema.TaggedError<UnknownValue>()("UnknownValue", {
  message: Schema.String,
  /** The name asked for. */
  value: Schema.String
}) {}

/**
 * A weight is not a float tensor, or the loss does not depend on any weight.
 *
 * @category errors
 * @since 0.1.0
 */
export class NotDifferentiable extends Schema.TaggedError<NotDifferentiable>()("NotDifferentiable", {
  message: Schema.String
}) {}

/**
 * Why a graph could not be differentiated.
 *
 * @category errors
 * @since 0.1.0
 */
export const AutodiffErrorReason = Schema.Union([NoBackwardRule, ShapeInference, UnknownValue, NotDifferentiable])
export type AutodiffErrorReason = typeof AutodiffErrorReason.Type

/**
 * A graph could not be differentiated. `message` is the reason's. Handle reasons with
 * `Effect.catchReason("AutodiffError", "NoBackwardRule", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class AutodiffError extends Schema.TaggedError<AutodiffError>()("AutodiffError", {
  reason: AutodiffErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `autodiffError`; a reason left out is a compile error. */
const reasons = { NoBackwardRule, ShapeInference, UnknownValue, NotDifferentiable } satisfies Record<
  AutodiffErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message.
 *
 * @category errors
 * @since 0.1.0
 */
export type AutodiffErrorFacts<Tag extends AutodiffErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `AutodiffError` of the reason tagged `tag`: `autodiffError("UnknownValue", text, { value })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const autodiffError = <Tag extends AutodiffErrorReason["_tag"]>(
  tag: Tag,
  message: string,
  facts?: AutodiffErrorFacts<Tag>
): AutodiffError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => AutodiffErrorReason
  return new AutodiffError({ reason: new Reason({ ...facts, message }) })
}

/** Thrown inside the graph walk, caught once by `run`. */
class Failure extends Error {
  readonly error: AutodiffError
  constructor(error: AutodiffError) {
    super(error.message)
    this.error = error
  }
}

const isFloat = (d: Graph.DType) => d === "float32" || d === "float64"

// ===== Gradients =====

/**
 * Appends to `e.graph` the gradient of the scalar `loss` with respect to each of `wrt`, returning the value name of
 * each gradient. Only nodes in `forwardNodes` (the graph before the call) are differentiated. Throws `Failure` (use
 * {@link trainingGraph} or {@link gradientsEffect} for a typed error).
 */
const gradientsUnsafe = (
  e: Backward.Emitter,
  forwardNodes: ReadonlyArray<Graph.Node>,
  loss: string,
  wrt: ReadonlyArray<string>,
  extraRules: Readonly<Record<string, Backward.Rule>> = {},
  segments: ReadonlyArray<readonly [number, number]> = [],
  created: Set<string> = new Set()
): Map<string, string> => {
  for (const w of wrt) {
    if (!e.shapes.has(w)) {
      throw new Failure(autodiffError("UnknownValue", `no value named "${w}" in the graph`, { value: w }))
    }
    if (!isFloat(e.dtype(w))) {
      throw new Failure(autodiffError("NotDifferentiable", `"${w}" is ${e.dtype(w)}, not a float tensor`))
    }
  }
  // Forward: which values depend on a weight through float ops.
  const active = new Set(wrt)
  for (const node of forwardNodes) {
    if (node.inputs.some((i) => active.has(i))) {
      for (const o of node.outputs) if (o !== "" && isFloat(e.dtype(o))) active.add(o)
    }
  }
  if (!active.has(loss)) {
    throw new Failure(autodiffError("NotDifferentiable", `the loss "${loss}" does not depend on any weight`))
  }
  const pending = new Map<string, Array<string>>([[loss, [e.scalar(1, e.dtype(loss))]]])
  // Gradient parts that a Gather's own rule produced (a scatter into zeros).
  const gatherParts = new Set<string>()
  const weights = new Set(wrt)
  const collect = (name: string): string | undefined => {
    const parts = pending.get(name)
    if (parts === undefined) return undefined
    if (parts.length === 1) return parts[0]
    const total = e.op("Sum", parts)
    pending.set(name, [total])
    return total
  }
  // Recomputed segments: forward value → its recomputed copy, for the nodes of the segment being differentiated.
  let recomputed: ReadonlyMap<string, string> = new Map()
  let segment = -1
  for (let k = forwardNodes.length - 1; k >= 0; k--) {
    const original = forwardNodes[k]!
    const grads = original.outputs.map((o) => (o === "" ? undefined : collect(o)))
    const s = segments.findIndex(([a, b]) => k >= a && k < b)
    const dep = grads.find((g) => g !== undefined)
    if (s !== segment && dep !== undefined) {
      segment = s
      recomputed = s === -1 ? new Map() : recompute(e, forwardNodes, segments[s]!, dep, created)
    }
    const mapped = (name: string) => recomputed.get(name) ?? name
    const node = recomputed.size === 0
      ? original
      : { ...original, inputs: original.inputs.map(mapped), outputs: original.outputs.map(mapped) }
    if (grads.every((g) => g === undefined)) continue
    const needs = original.inputs.map((i) => i !== "" && active.has(i))
    if (!needs.some(Boolean)) continue
    const rule = extraRules[node.op] ?? Backward.rules[node.op]
    if (rule === undefined) {
      const message = `op ${node.op} (output "${node.outputs[0]}") has no backward rule`
      throw new Failure(autodiffError("NoBackwardRule", message, { op: node.op }))
    }
    // A scalar seed may meet a non-scalar output (the loss is scalar, so this only happens at the seed).
    const shaped = grads.map((g, i) =>
      g === undefined ? undefined : e.dims(g).length === e.dims(node.outputs[i]!).length ? g : e.op("Expand", [
        g,
        e.ints(e.dims(node.outputs[i]!))
      ])
    )
    // A weight table that already has a gradient from a product (a tied head's embedding): scatter-add onto it.
    // Only then: a Gather of an activation (a shared prompt's keys) and a second Gather of a table (a shared prompt's
    // embedding) are summed as before, so that models without a tied head compute the same bits as they did.
    const parts = node.op === "Gather" && needs[0] && weights.has(original.inputs[0]!)
      ? pending.get(original.inputs[0]!)
      : undefined
    if (parts !== undefined && parts.some((part) => !gatherParts.has(part))) {
      pending.set(original.inputs[0]!, [Backward.gatherInto(e, node, shaped[0]!, collect(original.inputs[0]!)!)])
      continue
    }
    const inputGrads = rule(e, node, shaped, needs)
    if (node.op === "Gather" && inputGrads[0] !== undefined) gatherParts.add(inputGrads[0])
    original.inputs.forEach((input, i) => {
      const g = inputGrads[i]
      if (!needs[i] || g === undefined) return
      const list = pending.get(input)
      if (list === undefined) pending.set(input, [g])
      else list.push(g)
    })
  }
  const out = new Map<string, string>()
  for (const w of wrt) out.set(w, collect(w) ?? e.zeros(e.dims(w), e.dtype(w)))
  return out
}

/**
 * Re-emits the forward nodes `[a, b)` for the backward (activation recompute), returning each output's copy. Their
 * float inputs from outside the segment are read as `x + ΣØ` (a sum over an empty slice of `dep`, a gradient
 * reaching the segment): exactly `x`, but a value onnxruntime's common-subexpression elimination cannot merge with
 * the forward's, and one that exists only once the backward has reached the segment, so that the copies are made
 * then and not kept from the forward.
 */
const recompute = (
  e: Backward.Emitter,
  nodes: ReadonlyArray<Graph.Node>,
  [a, b]: readonly [number, number],
  dep: string,
  created: Set<string>
): ReadonlyMap<string, string> => {
  const map = new Map<string, string>()
  const flat = e.op("Reshape", [dep, e.ints([-1])])
  const zero = e.op("ReduceSum", [e.op("Slice", [flat, e.ints([0]), e.ints([0])]), e.ints([0])], {
    keepdims: Graph.int(0)
  })
  const zeros = new Map<Graph.DType, string>([[e.dtype(dep), zero]])
  const input = (name: string) => {
    const hit = map.get(name)
    if (hit !== undefined || name === "" || !e.shapes.has(name)) return hit ?? name
    const dtype = e.dtype(name)
    if (!isFloat(dtype) || e.graph.initializers.has(name) || e.shapes.get(name).value !== undefined) return name
    let z = zeros.get(dtype)
    if (z === undefined) zeros.set(dtype, z = e.op("Cast", [zero], { to: Graph.int(Graph.dataTypeCode[dtype]) }))
    const fresh = e.op("Add", [name, z])
    map.set(name, fresh)
    return fresh
  }
  for (let k = a; k < b; k++) {
    const node = nodes[k]!
    const inputs = node.inputs.map(input)
    const outputs = node.outputs.map((o) => (o === "" ? "" : e.graph.fresh(`${o}_re`)))
    for (const o of outputs) created.add(o)
    e.graph.node(node.op, inputs, outputs, node.attributes, node.domain)
    e.shapes.visit(e.graph.nodes[e.graph.nodes.length - 1]!)
    node.outputs.forEach((o, i) => o !== "" && map.set(o, outputs[i]!))
  }
  return map
}

/**
 * The node ranges `[a, b)` of each decoder layer: from the first node that reads a weight of layer `i`
 * (`….layers.{i}.…`) to the first that reads one of layer `i + 1` (the last layer: to the last node reading one of
 * its weights, inclusive).
 */
const layerSegments = (nodes: ReadonlyArray<Graph.Node>): Array<readonly [number, number]> => {
  const first = new Map<number, number>()
  const last = new Map<number, number>()
  nodes.forEach((node, k) => {
    for (const i of node.inputs) {
      const m = /(?:^|\.)layers\.(\d+)\./.exec(i)
      if (m === null) continue
      const layer = Number(m[1])
      if (!first.has(layer)) first.set(layer, k)
      last.set(layer, k)
    }
  })
  const layers = [...first.keys()].sort((x, y) => x - y)
  return layers.map((layer, j) => {
    const next = layers[j + 1]
    return [first.get(layer)!, next === undefined ? last.get(layer)! + 1 : first.get(next)!] as const
  })
}

/**
 * With recompute, a copy of `graph` without the nodes nothing reads: a recomputed value the backward rules did not
 * need (a layer's last residual sum), or a forward value only the backward read before, would otherwise dangle, and
 * onnxruntime runs a dangling node last, keeping its inputs (activations of every layer) alive to the end.
 */
const withoutDeadNodes = (graph: Graph.Graph, outputs: ReadonlyArray<string>) => {
  const read = new Set(outputs)
  const dead = new Set<Graph.Node>()
  for (let k = graph.nodes.length - 1; k >= 0; k--) {
    const node = graph.nodes[k]!
    if (node.outputs.every((o) => o === "" || !read.has(o))) dead.add(node)
    else for (const i of node.inputs) read.add(i)
  }
  return copyGraph(graph, "float32", dead, graph.name)
}

const run = <A>(f: () => A): Effect.Effect<A, AutodiffError> =>
  Effect.try({
    try: f,
    catch: (u) =>
      u instanceof Failure
        ? u.error
        : autodiffError("ShapeInference", u instanceof Error ? u.message : String(u), { cause: u })
  })

/**
 * Differentiates the scalar `loss` of `graph` with respect to `wrt` in place, binding symbolic dims with `dims`;
 * declares one output `grad.<name>` per weight and returns those names.
 *
 * @category constructors
 * @since 0.1.0
 */
export const gradients = (
  graph: Graph.Graph,
  loss: string,
  wrt: ReadonlyArray<string>,
  dims: Readonly<Record<string, number>> = {}
): Effect.Effect<ReadonlyMap<string, string>, AutodiffError> =>
  run(() => {
    const shapes = Shapes.make(graph, dims)
    const e = Backward.makeEmitter(graph, shapes)
    // In place: the caller's graph keeps its values' names, so every gradient is an `Identity` of its own.
    const { named } = declareGradients(e, gradientsUnsafe(e, [...graph.nodes], loss, wrt), false)
    for (const name of named.values()) graph.output(name, e.dtype(name), e.dims(name))
    return named
  })

const declareGradients = (e: Backward.Emitter, grads: ReadonlyMap<string, string>, renaming = true) => {
  const named = new Map<string, string>()
  // A gradient that one node computes for one weight is that node's output under the output's name, renamed
  // afterwards: onnxruntime then writes it into the caller's buffer as it is computed. An `Identity` at the end of
  // the graph (what every gradient had) kept each gradient in a buffer of onnxruntime's until the end of the run:
  // 4 bytes a parameter more at the end of the backward pass.
  const produced = new Set(e.graph.nodes.flatMap((n) => n.outputs))
  const counts = new Map<string, number>()
  for (const g of grads.values()) counts.set(g, (counts.get(g) ?? 0) + 1)
  const rename = new Map<string, string>()
  for (const [w, g] of grads) {
    const name = `grad.${w}`
    if (renaming && produced.has(g) && counts.get(g) === 1) rename.set(g, name)
    else e.graph.node("Identity", [g], [name])
    e.shapes.set(name, e.shapes.get(w))
    named.set(w, name)
  }
  return { named, rename }
}

// ===== Training graph =====

/**
 * A forward pass to differentiate: its graph, the logits value `[batch, length, vocab]` and the weight inputs.
 *
 * @category models
 * @since 0.1.0
 */
export interface Forward {
  readonly graph: Graph.Graph
  readonly logits: string
  readonly weightInputs: ReadonlyArray<string>
}

/**
 * Options of {@link trainingGraph}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly batch: number
  readonly length: number
  readonly loss: Loss.Config
  /** Bindings of symbolic dims other than `batch`/`seq` (both are bound to `batch`/`length`). */
  readonly dims?: Readonly<Record<string, number>>
  /** `float64` rewrites every float32 tensor to double, for gradient checks. Default `float32`. */
  readonly dtype?: "float32" | "float64"
  /** `false` builds the forward pass and loss head only (logprobs and stats without gradients). Default `true`. */
  readonly withGradients?: boolean
  /**
   * The output head's tile size, in tokens of the whole vocabulary (`ChunkedHead`: blocks of tokens times slices of
   * the vocabulary): the logits of a whole micro-batch are never held, and the backward recomputes each tile's.
   * Default: `ChunkedHead.defaultChunk(vocab)` (about 64 MiB of logits), and the plain head when the micro-batch fits
   * in one tile. `0` forces the plain head. Applies when the forward's logits are `MatMul(hidden, Transpose(weight))`
   * of a graph input (trained or frozen); otherwise the plain head is used.
   */
  readonly headChunk?: number
  /** Tokens per block of the tiled head (default `ChunkedHead.block`; smaller in tests, to get several blocks). */
  readonly headBlock?: number
  /**
   * Activation recompute: the backward pass of each decoder layer (the nodes reading `….layers.{i}.…` weights)
   * re-emits the layer's forward from the values that enter it, so that only those are kept from the forward pass
   * instead of every activation inside the layer. Default false.
   */
  readonly recompute?: boolean
  /**
   * Whether the model counts as large (`Backward.Emitter.large`: faster products that round differently at some
   * shapes). Default {@link isLargeModel} of the forward graph; the embedded presets are below it.
   */
  readonly largeModel?: boolean
}

/**
 * Whether a forward graph's model has at least 50 M parameters (counting every float input of static shape: its
 * weights, trained and frozen), the threshold of `Backward.Emitter.large`: real checkpoints and the `medium` preset,
 * not the `tiny` and `small` presets whose figures the README repeats (the decode engine's fused kernels use the
 * same threshold).
 *
 * @category guards
 * @since 0.1.0
 */
export const isLargeModel = (forward: Forward): boolean =>
  forward.graph.inputs.reduce(
    (n, i) =>
      i.dtype !== "float32" || i.shape.some((d) => typeof d !== "number")
        ? n
        : n + i.shape.reduce<number>((p, d) => p * (d as number), 1),
    0
  ) >= 50e6

/**
 * The training graph and the names a trainer feeds and reads.
 *
 * @category models
 * @since 0.1.0
 */
export interface TrainingGraph {
  readonly graph: Graph.Graph
  readonly batch: number
  readonly length: number
  /** Weight input names with dims. */
  readonly weights: ReadonlyArray<{ readonly name: string; readonly dims: ReadonlyArray<number> }>
  /** Non-weight inputs of the forward pass (e.g. `input_ids`, `attention_mask`, `position_ids`). */
  readonly modelInputs: ReadonlyArray<string>
  /** Inputs of the loss head (`targets`, `loss_weights`, …). */
  readonly lossInputs: ReadonlyArray<string>
  /** weight name → gradient output name. */
  readonly gradients: ReadonlyMap<string, string>
  readonly outputs: { readonly loss: string; readonly tokenLogprobs: string; readonly stats: string }
  /**
   * Inputs that are rows of a weight input (the tiled head's vocabulary slices of a trained head, `ChunkedHead.View`):
   * fed as views of the weight's array ({@link viewFeeds}), no copy.
   */
  readonly views: ReadonlyArray<ChunkedHead.View>
}

/**
 * The inputs of `views` from the weights' own: each a view of rows of `weightOf(view.of)` (`[rows, columns]`,
 * `columns` from the weight's dims), made with `feed`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const viewFeeds = <T>(
  views: ReadonlyArray<ChunkedHead.View>,
  weightOf: (name: string) => { readonly data: Float32Array | Float64Array; readonly dims: ReadonlyArray<number> },
  feed: (data: Float32Array | Float64Array, dims: ReadonlyArray<number>) => T
): Record<string, T> => {
  const out: Record<string, T> = {}
  for (const v of views) {
    const w = weightOf(v.of)
    const columns = w.dims[1]!
    out[v.name] = feed(w.data.subarray(v.start * columns, v.end * columns), [v.end - v.start, columns])
  }
  return out
}

/**
 * Copies a graph without its outputs, optionally rewriting float32 to float64.
 */
const copyGraph = (
  source: Graph.Graph,
  dtype: "float32" | "float64",
  skip: ReadonlySet<Graph.Node> = new Set(),
  name = `${source.name}_train`,
  rename: ReadonlyMap<string, string> = new Map()
): Graph.Graph => {
  const renamed = (v: string) => rename.get(v) ?? v
  const g = Graph.make(name)
  const wide = dtype === "float64"
  const t = (d: Graph.DType): Graph.DType => (wide && d === "float32" ? "float64" : d)
  const tensor = (x: Graph.TensorData): Graph.TensorData =>
    wide && x.dtype === "float32"
      ? { dtype: "float64", dims: x.dims, data: Float64Array.from(x.data as Float32Array) }
      : x
  for (const i of source.inputs) g.input(i.name, t(i.dtype), i.shape)
  for (const [name, x] of source.initializers) g.initializer(name, tensor(x))
  for (const n of source.nodes) {
    if (skip.has(n)) continue
    const attributes: Record<string, Graph.Attribute> = {}
    for (const [k, a] of Object.entries(n.attributes)) {
      attributes[k] = !wide
        ? a
        : a.kind === "tensor"
        ? Graph.tensor(tensor(a.value))
        : n.op === "Cast" && k === "to" && a.kind === "int" && a.value === Graph.dataTypeCode.float32
        ? Graph.int(Graph.dataTypeCode.float64)
        : a
    }
    g.node(n.op, n.inputs.map(renamed), n.outputs.map(renamed), attributes, n.domain)
  }
  return g
}

/**
 * Builds the training graph: forward pass, loss head (`LossHead`), and one gradient per weight.
 *
 * Outputs: `loss` (scalar), `token_logprobs [batch, length]`, `stats [6]` and `grad.<weight>` for every weight.
 *
 * @category constructors
 * @since 0.1.0
 */
export const trainingGraph = (forward: Forward, options: Options): Effect.Effect<TrainingGraph, AutodiffError> =>
  run(() => {
    const dtype = options.dtype ?? "float32"
    const output = outputProjection(forward, options)
    const graph = copyGraph(forward.graph, dtype, new Set(output?.nodes ?? []))
    const shapes = Shapes.make(graph, { ...options.dims, batch: options.batch, seq: options.length })
    const forwardNodes = [...graph.nodes]
    const e = Backward.makeEmitter(graph, shapes, options.largeModel ?? isLargeModel(forward))
    const chunked = output === undefined
      ? undefined
      : ChunkedHead.emit(e, output.hidden, output.weight, options.loss, options.batch, options.length, output.chunk,
        options.headBlock, forward.weightInputs.includes(output.weight))
    const head = chunked ?? LossHead.emit(e, forward.logits, options.loss, options.batch, options.length)
    const lossNodes = graph.nodes.slice(forwardNodes.length)
    const walked = chunked === undefined
      ? [...forwardNodes, ...lossNodes]
      : [...forwardNodes, chunked.node, ...lossNodes.filter((n) => !n.outputs.some((o) => chunkedOutputs(chunked, o)))]
    const rules = chunked === undefined ? {} : { [ChunkedHead.op]: chunked.rule }
    const created = new Set<string>()
    const segments = options.recompute === true ? layerSegments(walked) : []
    const { named, rename } = options.withGradients === false
      ? { named: new Map<string, string>(), rename: new Map<string, string>() }
      : declareGradients(e, gradientsUnsafe(e, walked, head.loss, forward.weightInputs, rules, segments, created))
    const out = { loss: "loss", tokenLogprobs: "token_logprobs", stats: "stats" }
    graph.node("Identity", [head.loss], [out.loss])
    graph.node("Identity", [head.tokenLogprobs], [out.tokenLogprobs])
    graph.node("Identity", [head.stats], [out.stats])
    const renamed = rename.size === 0 ? graph : copyGraph(graph, "float32", new Set(), graph.name, rename)
    const final = created.size === 0 ? renamed : withoutDeadNodes(renamed, [...Object.values(out), ...named.values()])
    for (const name of named.values()) final.output(name, e.dtype(name), e.dims(name))
    final.output(out.loss, dtype, [])
    final.output(out.tokenLogprobs, dtype, [options.batch, options.length])
    final.output(out.stats, dtype, [6])
    const weightSet = new Set(forward.weightInputs)
    return {
      graph: final,
      batch: options.batch,
      length: options.length,
      weights: forward.weightInputs.map((name) => ({ name, dims: shapes.get(name).dims })),
      modelInputs: forward.graph.inputs.map((i) => i.name).filter((n) => !weightSet.has(n)),
      lossInputs: head.inputs,
      gradients: named,
      outputs: out,
      views: chunked?.views ?? []
    }
  })

/** The pseudo-node's outputs stand for the chunks' nodes, which the walk must not differentiate again. */
const chunkedOutputs = (head: ChunkedHead.ChunkedHead, value: string) => head.node.outputs.includes(value)

/**
 * The forward's output projection when the head can be chunked: `logits = MatMul(hidden, Transpose(weight))` with
 * `weight` a weight input and the Transpose used only there, and more tokens than one chunk holds.
 */
const outputProjection = (forward: Forward, options: Options) => {
  if (options.loss.policyLoss === "value" || options.headChunk === 0) return undefined
  const nodes = forward.graph.nodes
  const matmul = nodes.find((n) => n.outputs.includes(forward.logits))
  if (matmul?.op !== "MatMul") return undefined
  const transpose = nodes.find((n) => n.outputs.includes(matmul.inputs[1]!))
  const perm = transpose?.attributes["perm"]
  const weight = transpose?.inputs[0]
  if (
    transpose?.op !== "Transpose" || perm?.kind !== "ints" || perm.value.join() !== "1,0" ||
    // A graph input: a trained weight, or a frozen one (a LoRA run's head: its rule then computes no ∂W).
    weight === undefined || !forward.graph.inputs.some((i) => i.name === weight) ||
    nodes.some((n) => n !== matmul && n.inputs.includes(transpose.outputs[0]!))
  ) return undefined
  const vocab = forward.graph.inputs.find((i) => i.name === weight)?.shape[0]
  if (typeof vocab !== "number") return undefined
  const chunk = options.headChunk ?? ChunkedHead.defaultChunk(vocab)
  if (options.headChunk === undefined && options.batch * options.length <= chunk) return undefined
  return { nodes: [matmul, transpose], hidden: matmul.inputs[0]!, weight, chunk }
}
