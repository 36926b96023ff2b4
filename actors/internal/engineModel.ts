/**
 * The decode engine's ONNX model, built from the config alone: the weights never go into the model's bytes, so
 * onnxruntime's 2 GB limit on a model's protobuf never applies and a policy version costs no serialization.
 *
 * - `"initializers"` (the engine's default): every weight is an initializer whose data is *external*, in an
 *   in-memory "file" named after the weight (`sessionOptions.externalData`, which onnxruntime-node 1.30 reads from
 *   the given `Float32Array`'s memory). onnxruntime copies the data once while it creates the session and the
 *   MatMul kernels pre-pack it, so decoding is as fast as with the weights baked into the protobuf; the caller's
 *   arrays are not referenced after `InferenceSession.create` returns.
 * - `"inputs"`: every weight is a graph input fed on every run (onnxruntime-node wraps input tensors without
 *   copying them: the caller's arrays are the only copy, and a session holds no weights, so one serves every
 *   version: {@link sessionWeightsKey}). A weight input is not pre-packed, so every product with one is a
 *   com.microsoft `FusedMatMul(x, W, transB = 1)` over the flattened rows (`Qwen2.inferenceGraph`'s `fused`, the LoRA
 *   engine's products without an adapter): no `Transpose` of a weight runs per step. This is how a full fine-tuning
 *   run of a large model samples (`engine.weights`, `localVersions.ts`): from the published version's arrays, with no
 *   onnxruntime copy and no pre-packed copy per session. Before issue 41's point 6 this mode ran `MatMul(x,
 *   Transpose(W))` and transposed every weight on every step.
 *
 * With initializers, a large model's products (`Qwen2.isLarge`) are `FusedMatMul(x, W, transB = 1)` over the
 * flattened rows, as with inputs: onnxruntime pre-packs the `[out, in]` weight directly. `MatMul(x, Transpose(W))`
 * (the presets' graph, unchanged) first folds a transposed copy of every weight, then packs that: at Qwen2.5-0.5B
 * shapes the rewrite creates the session ≈ 7 s sooner on a 2-core machine (of ≈ 26) at ≈ 1.6 GiB less peak RSS, and
 * decodes as fast at batch 1, 8 and 32 (the `medium` preset within a few per cent; BENCHMARKS.md, "engine
 * weights": an earlier, unflattened rewrite ran one product per row and was 16–19 % slower at batch 32).
 *
 * A LoRA engine (`lora`) decodes with its adapter unmerged (`Qwen2.inferenceGraph` with `lora`): every weight is an
 * input, the base's arrays fed as they are (the ones the learner reads: no copy per version, none in onnxruntime)
 * and the version's adapter beside them, and every product with a weight is a `FusedMatMul` with `transB = 1`, so no
 * `Transpose` of a weight runs per step. Such a session holds no weights: the engines of a thread share one for
 * every version ({@link sessionWeightsKey}).
 */
import { Effect } from "effect"
import * as ort from "onnxruntime-node"
import * as Lora from "../../src/Lora.ts"
import type * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Graph from "../../src/onnx/Graph.ts"
import * as Pb from "../../src/onnx/internal/protobuf.ts"

/** One in-memory external data "file" for `sessionOptions.externalData`. */
export interface ExternalData {
  readonly path: string
  readonly data: Uint8Array
}

/** A float32 initializer whose data is the whole in-memory external file named `name`. */
const externalTensor = (name: string, dims: ReadonlyArray<number>): Pb.Message => {
  const m = Pb.message()
  if (dims.length > 0) Pb.packedInts(m, 1, dims)
  Pb.int(m, 2, Graph.dataTypeCode.float32)
  Pb.string(m, 8, name)
  const bytes = dims.reduce((a, b) => a * b, 1) * 4
  for (const [key, value] of [["location", name], ["offset", "0"], ["length", String(bytes)]]) {
    const entry = Pb.message()
    Pb.string(entry, 1, key)
    Pb.string(entry, 2, value)
    Pb.nested(m, 13, entry)
  }
  Pb.int(m, 14, 1) // data_location = EXTERNAL
  return m
}

/**
 * The decode model's bytes for `c`, without any weight data (see the module header): tens of MB at most (the RoPE
 * tables), whatever the model's size.
 */
export const modelBytes = (
  c: ModelConfig.ModelConfig,
  weightsAs: "initializers" | "inputs",
  lora?: Lora.Config
): Uint8Array => {
  // Built once per config: the RoPE tables alone take ≈ 0.7 s at 32,768 positions, and a run builds an engine per
  // rollout batch.
  const key = JSON.stringify(lora === undefined ? [c, weightsAs] : [c, weightsAs, lora])
  const cached = built.get(key)
  if (cached !== undefined) return cached
  // A LoRA model takes every weight as an input (module notes).
  const bytes = lora === undefined
    ? build(c, weightsAs)
    : Graph.toModelBytes(Qwen2.inferenceGraph(c, "inputs", lora, false, Qwen2.isLarge(c)))
  built.set(key, bytes)
  if (built.size > 4) built.delete(built.keys().next().value!)
  return bytes
}

/** The models built last on this thread, by config (up to tens of MB each). */
const built = new Map<string, Uint8Array>()

// Large models (`Qwen2.isLarge`: real checkpoints, the `medium` preset) decode with onnxruntime's fused kernels and
// the graph's `logsumexp` (`Qwen2.ForwardOptions.fusedKernels`: ≈ 4.5 ms less of a 0.5 B batch-1 token of ≈ 82), and
// their weight initializers are multiplied as `FusedMatMul(x, W, transB = 1)` (module notes); the `tiny` and `small`
// presets keep the graph their figures were measured on (the README's first command repeats them).
const build = (c: ModelConfig.ModelConfig, weightsAs: "initializers" | "inputs", large = Qwen2.isLarge(c)) =>
  weightsAs === "inputs"
    ? Graph.toModelBytes(Qwen2.inferenceGraph(c, "inputs", undefined, true, large))
    : withWeights(Qwen2.inferenceGraph(c, "inputs", undefined, large, large), Qwen2.parameters(c), weightsAs)

/**
 * The bytes of graph `g` whose weight inputs `specs` stay inputs or become external initializers (module notes):
 * the text decode model's, and the vision prefill model's (`engineVision.ts`).
 */
export const withWeights = (
  g: Graph.Graph,
  specs: ReadonlyArray<Qwen2.ParameterSpec>,
  weightsAs: "initializers" | "inputs"
): Uint8Array => {
  const names = new Set(specs.map((s) => s.name))
  if (weightsAs === "inputs") return Graph.toModelBytes(g)
  const graph = Graph.toModelBytes({ ...g, inputs: g.inputs.filter((i) => !names.has(i.name)) })
  // A second `graph` field of the ModelProto: protobuf merges it into the first, appending its initializers.
  const initializers = Pb.message()
  for (const spec of specs) Pb.nested(initializers, 5, externalTensor(spec.name, spec.shape))
  const model = Pb.message()
  Pb.nested(model, 7, initializers)
  const tail = Pb.finish(model)
  const bytes = new Uint8Array(graph.length + tail.length)
  bytes.set(graph)
  bytes.set(tail, graph.length)
  return bytes
}

/** The in-memory external files of `modelBytes(c, "initializers")`: views of `weights`' arrays, not copies. */
export const externalData = (c: ModelConfig.ModelConfig, weights: Qwen2.Weights): Array<ExternalData> =>
  Qwen2.parameters(c).map((spec) => {
    const w = weights.get(spec.name)!
    return { path: spec.name, data: new Uint8Array(w.buffer, w.byteOffset, w.byteLength) }
  })

/** The weights a model of `c` takes: the base's, then with `lora` the adapter's (PEFT's names). */
export const weightSpecs = (
  c: ModelConfig.ModelConfig,
  lora?: Lora.Config
): ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }> =>
  lora === undefined ? Qwen2.parameters(c) : [...Qwen2.parameters(c), ...Lora.parameters(c, lora)]

/**
 * The feeds of weights taken as inputs: tensors over `weights`' own arrays (onnxruntime-node wraps them, no copy),
 * so two versions that share the base's arrays feed the same memory.
 */
export const weightFeeds = (
  c: ModelConfig.ModelConfig,
  weights: Qwen2.Weights,
  lora?: Lora.Config
): Record<string, ort.Tensor> =>
  Object.fromEntries(weightSpecs(c, lora).map((spec) => [
    spec.name,
    new ort.Tensor("float32", weights.get(spec.name)!, spec.shape)
  ]))

/**
 * What a session is shared by: the weights' map for initializers (the session holds a copy of them), one key for
 * every map with weights as inputs (the session holds none: every version's engines share it).
 */
export const sessionWeightsKey = (weightsAs: "initializers" | "inputs", weights: Qwen2.Weights): object =>
  weightsAs === "inputs" ? weightless : weights

const weightless = {}

/** Floats of every weight of `c`. */
export const parameterCount = (c: ModelConfig.ModelConfig): number =>
  Qwen2.parameters(c).reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0)

// ===== Shared sessions =====

interface Loaded {
  readonly session: Promise<ort.InferenceSession>
  users: number
}

/** Sessions loaded on this thread, by the weights' map (or {@link sessionWeightsKey}), then version and options. */
const loaded = new WeakMap<object, Map<string, Loaded>>()

/**
 * A session over `weights` as `version`, shared by every engine of this thread that loads the same map as the same
 * version with the same `key` (model and options): a policy version sampled by several engines (one per rollout
 * batch, the ambient sampler) costs one load and one copy of its weights. `unload` releases the session with its
 * last user. A version names one set of weights, so a map written in place must be loaded as a new version.
 */
export const acquireSession = <E>(
  weights: object,
  version: number,
  key: string,
  create: () => Promise<ort.InferenceSession>,
  onError: (cause: unknown) => E
): Effect.Effect<{ readonly session: ort.InferenceSession; readonly unload: Effect.Effect<void> }, E> =>
  Effect.suspend(() => {
    let byKey = loaded.get(weights)
    if (byKey === undefined) loaded.set(weights, byKey = new Map())
    const id = `${version}\u0000${key}`
    const entry = byKey.get(id) ?? { session: create(), users: 0 }
    byKey.set(id, entry)
    entry.users++
    const unload = Effect.suspend(() => {
      if (--entry.users > 0) return Effect.void
      if (byKey.get(id) === entry) byKey.delete(id)
      return Effect.promise(() => entry.session.then((s) => s.release(), () => undefined)).pipe(Effect.ignore)
    })
    return Effect.tryPromise({ try: () => entry.session, catch: onError }).pipe(
      Effect.tapError(() => unload),
      Effect.map((session) => ({ session, unload }))
    )
  })
