/**
 * Decoding tokens/s of one model folder, our engine beside llama.cpp on the same weights, one process per call (its
 * peak RSS its own): `node --import tsx bench/realShapes/decode.ts FOLDER THREADS ours|llama|floor [GGUF]` prints
 * one JSON line. Batch 1: one greedy sequence, a 16-token prompt, 64 new tokens; batch 8: eight such sequences at once.
 * Tokens/s count new tokens over the wall time including the prompts' prefill (the same for both engines). `ours`
 * also times loading the folder and building the engine (made, and its first token out).
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { getLlama, LlamaLogLevel, type Token } from "node-llama-cpp"
import * as ort from "onnxruntime-node"
import * as EngineModel from "../../actors/internal/engineModel.ts"
import * as PolicyEngine from "../../actors/PolicyEngine.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Graph from "../../src/onnx/Graph.ts"
import * as Sampling from "../../src/Sampling.ts"

const [folder, threadsArg, engine, gguf] = process.argv.slice(2)
const threads = Number(threadsArg)
const newTokens = 64
const prompt = (i: number) => Array.from({ length: 16 }, (_, k) => 1000 + 37 * i + 11 * k)
const peakGiB = () => process.resourceUsage().maxRSS * 1024 / 1024 ** 3
const seconds = (t0: number) => (performance.now() - t0) / 1000

const ours = Effect.gen(function*() {
  const t0 = performance.now()
  const model = yield* ModelFolder.load(folder!)
  const loadS = seconds(t0)
  const t1 = performance.now()
  const policy = yield* PolicyEngine.make({
    config: model.config,
    weights: model.weights,
    maxBatchSize: 8,
    intraOpNumThreads: threads
  })
  const generate = (i: number, maxTokens = newTokens) =>
    policy.generate({ promptTokenIds: prompt(i), sampling: { temperature: 0, maxTokens, stopTokenIds: [] } })
  // Built = made and its first token out (the first step of a new session is slow everywhere). One token, not 64:
  // 64 tokens of decoding (≈ 6 s at 0.5 B on a 2-core AMD machine) are not loading.
  yield* generate(99, 1)
  const engineS = seconds(t1)
  yield* generate(98) // a whole warm-up generation before the timed ones, as before
  const t2 = performance.now()
  yield* generate(0)
  const batch1 = newTokens / seconds(t2)
  const t3 = performance.now()
  yield* Effect.all(Array.from({ length: 8 }, (_, i) => generate(i)), { concurrency: "unbounded" })
  const batch8 = 8 * newTokens / seconds(t3)
  return { engine: "ours", loadS, engineS, batch1, batch8, peakGiB: peakGiB() }
}).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

const llama = async () => {
  const engine = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: threads })
  const model = await engine.loadModel({ modelPath: gguf!, gpuLayers: 0 })
  const context = await model.createContext({ contextSize: 8 * 256, sequences: 8, threads, batchSize: 512 })
  const run = async (i: number) => {
    const sequence = context.getSequence()
    let n = 0
    for await (const _ of sequence.evaluate(prompt(i) as Array<Token>, { temperature: 0 })) {
      if (++n >= newTokens) break
    }
    sequence.dispose()
  }
  await run(99)
  const t2 = performance.now()
  await run(0)
  const batch1 = newTokens / seconds(t2)
  const t3 = performance.now()
  await Promise.all(Array.from({ length: 8 }, (_, i) => run(i)))
  const batch8 = 8 * newTokens / seconds(t3)
  await context.dispose()
  await model.dispose()
  return { engine: "llama.cpp", batch1, batch8, peakGiB: peakGiB() }
}

/**
 * The MatMul floor of a batch-1 token at the folder's shapes: only the step's weight products (q, k, v, o, gate, up,
 * down per layer, then the head), pre-packed initializers of random values (the values do not matter), chained so
 * that each reads the last one's output, timed like `ours` (64 tokens). What any engine on onnxruntime's kernels
 * pays at least; nothing else of a decode step (attention, norms, sampling) is in it.
 */
const floor = async () => {
  const c = await Effect.runPromise(ModelFolder.readConfig(folder!).pipe(Effect.provide(NodeServices.layer)))
  const D = c.hiddenSize, hd = ModelConfig.headDim(c), q = c.numAttentionHeads * hd, kv = c.numKeyValueHeads * hd
  const g = Graph.make("decode_floor")
  // External initializers (the engine's way: no 2 GB protobuf limit), pre-packed by onnxruntime.
  const specs: Array<{ name: string; shape: Array<number>; init: "normal" }> = []
  const files: Array<EngineModel.ExternalData> = []
  const weight = (k: number, m: number) => {
    const data = new Float32Array(k * m)
    // Different values in every weight: identical pages could be shared (KSM) and read from cache.
    const r = Sampling.rng(specs.length + 1)
    for (let i = 0; i < data.length; i++) data[i] = (r.next() - 0.5) * Math.sqrt(12 / k)
    const name = `w${specs.length}`
    specs.push({ name, shape: [k, m], init: "normal" })
    files.push({ path: name, data: new Uint8Array(data.buffer) })
    return g.input(name, "float32", [k, m])
  }
  const product = (x: string, k: number, m: number) => g.op("MatMul", [x, weight(k, m)])
  // Keep activations of unit scale, so that no denormals slow the products.
  const unit = (x: string) => g.op("Div", [x, g.op("ReduceMax", [g.op("Abs", [x])], { keepdims: Graph.int(1) })])
  let x = g.input("x", "float32", [1, D])
  for (let l = 0; l < c.numHiddenLayers; l++) {
    const attention = [product(x, D, q), product(x, D, kv), product(x, D, kv)]
    const mixed = g.op("Concat", attention, { axis: Graph.int(1) })
    const o = product(unit(g.op("Slice", [mixed, int64(g, 0), int64(g, q), int64(g, 1)])), q, D)
    const h = g.op("Mul", [product(o, D, c.intermediateSize), product(o, D, c.intermediateSize)])
    x = unit(product(unit(h), c.intermediateSize, D))
  }
  g.output(product(x, D, c.vocabSize), "float32", [1, c.vocabSize])
  const session = await ort.InferenceSession.create(EngineModel.withWeights(g, specs, "initializers"), {
    externalData: files,
    executionProviders: ["cpu"],
    graphOptimizationLevel: "all",
    intraOpNumThreads: threads,
    interOpNumThreads: 1
  })
  const feeds = { x: new ort.Tensor("float32", new Float32Array(D).fill(0.5), [1, D]) }
  await session.run(feeds)
  const t2 = performance.now()
  for (let i = 0; i < newTokens; i++) await session.run(feeds)
  return { engine: "floor", batch1: newTokens / seconds(t2), peakGiB: peakGiB() }
}

const int64 = (g: Graph.Graph, value: number) => g.constant(Graph.int64([1], [value]))

const result = engine === "ours" ? await Effect.runPromise(ours) : engine === "floor" ? await floor() : await llama()
console.log(JSON.stringify(result))
