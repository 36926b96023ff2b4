/**
 * A digest of the embedded presets' training arithmetic, to show that a change to the autodiff or the model graph
 * leaves it alone: for each preset, the sha256 of its loss, token logprobs and every gradient of one SFT step on a
 * synthetic micro-batch (random weights from a fixed seed), and of the training graph's bytes.
 *
 *   node --import tsx scripts/preset-gradient-digest.ts [--batch 4] [--length 96] [--threads 1] [--each] [--qwen 1]
 *
 * Run before and after a change: equal `graph` digests mean the same computation; equal `values` digests mean
 * bit-identical losses and gradients. One intra-op thread by default: with 2, the same graph and feeds gave two
 * different `values` digests at 16 × 192 tokens across runs (2026-12-07), so only 1 thread compares runs reliably.
 */
import { Effect } from "effect"
import { createHash } from "node:crypto"
import * as ort from "onnxruntime-node"
import * as Autodiff from "../src/autodiff/Autodiff.ts"
import * as Loss from "../src/Loss.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Graph from "../src/onnx/Graph.ts"
import { microBatch, qwen25Width, sftFeeds, weightsOf } from "./shapes.ts"

const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i === -1 ? fallback : Number(args[i + 1])
}
const batch = flag("batch", 4), length = flag("length", 96), threads = flag("threads", 1)
// `--qwen LAYERS`: Qwen2.5-0.5B's width instead, with the presets' products and layout (`largeModel: false`).
const qwen = flag("qwen", 0)
const models = qwen > 0
  ? [["qwen2.5-0.5b-width", qwen25Width(qwen)] as const]
  : (["tiny", "small"] as const).map((p) => [p, { ...ModelConfig.presets[p], vocabSize: 288 }] as const)
for (const [preset, config] of models) {
  const weights = weightsOf(config)
  const mb = microBatch(config, batch, length)
  // Qwen's width: the default attention layout, so that the run compares with code before `groupedQueries`.
  const forward = qwen === 0 ? Qwen2.trainingGraph(config) : (() => {
    const g = Graph.make("qwen2_train")
    return { graph: g, ...Qwen2.forward(g, config, { kvCache: false, weights: "inputs", groupedQueries: false }) }
  })()
  const graph = Effect.runSync(Autodiff.trainingGraph(forward, {
    batch,
    length,
    loss: Loss.sft,
    dims: {},
    withGradients: true,
    largeModel: false
  }))
  const bytes = Graph.toModelBytes(graph.graph)
  const session = await ort.InferenceSession.create(bytes, {
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: "sequential",
    graphOptimizationLevel: "all",
    extra: { session: { intra_op: { allow_spinning: "0" } } }
  })
  const feeds = sftFeeds(config, graph, mb, weights, batch, length)
  const names = ["loss", "token_logprobs", ...graph.weights.map(({ name }) => graph.gradients.get(name)!)]
  const out = await session.run(feeds, names)
  await session.release()
  const values = createHash("sha256")
  const each: Record<string, string> = {}
  for (const name of names) {
    const data = out[name]!.data as Float32Array
    values.update(Buffer.from(data.buffer, data.byteOffset, data.byteLength))
    each[name] = createHash("sha256").update(Buffer.from(data.buffer, data.byteOffset, data.byteLength)).digest("hex")
  }
  if (args.includes("--each")) console.error(JSON.stringify(each))
  console.log(JSON.stringify({
    preset,
    batch,
    length,
    threads,
    loss: (out["loss"]!.data as Float32Array)[0],
    values: values.digest("hex").slice(0, 16),
    graph: createHash("sha256").update(bytes).digest("hex").slice(0, 16)
  }))
}
