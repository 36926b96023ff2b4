/**
 * A digest of the embedded presets' training arithmetic, to show that a change to the autodiff or the model graph
 * leaves it alone: for each preset, the sha256 of its loss, token logprobs and every gradient of one SFT step on a
 * synthetic micro-batch (random weights from a fixed seed, 2 intra-op threads), and of the training graph's bytes.
 *
 *   node --import tsx scripts/preset-gradient-digest.ts [--batch 4] [--length 96]
 *
 * Run before and after a change: equal `values` digests mean bit-identical losses and gradients.
 */
import { Effect } from "effect"
import { createHash } from "node:crypto"
import * as ort from "onnxruntime-node"
import * as Autodiff from "../src/autodiff/Autodiff.ts"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as Loss from "../src/Loss.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Graph from "../src/onnx/Graph.ts"
import { microBatch, weightsOf } from "./shapes.ts"

const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i === -1 ? fallback : Number(args[i + 1])
}
const batch = flag("batch", 4), length = flag("length", 96)
for (const preset of ["tiny", "small"] as const) {
  const config = { ...ModelConfig.presets[preset], vocabSize: 288 }
  const weights = weightsOf(config)
  const mb = microBatch(config, batch, length)
  const graph = Effect.runSync(Autodiff.trainingGraph(Qwen2.trainingGraph(config), {
    batch,
    length,
    loss: Loss.sft,
    dims: {},
    withGradients: true
  }))
  const bytes = Graph.toModelBytes(graph.graph)
  const session = await ort.InferenceSession.create(bytes, {
    intraOpNumThreads: 2,
    interOpNumThreads: 1,
    executionMode: "sequential",
    graphOptimizationLevel: "all",
    extra: { session: { intra_op: { allow_spinning: "0" } } }
  })
  const lossData: Record<string, () => ort.Tensor> = {
    targets: () => new ort.Tensor("int64", BigInt64Array.from(mb.targets, BigInt), [batch, length]),
    loss_weights: () => new ort.Tensor("float32", mb.weights, [batch, length]),
    loss_mask: () => new ort.Tensor("float32", Float32Array.from(mb.mask), [batch, length])
  }
  const feeds: Record<string, ort.Tensor> = { ...OnnxTrainer.qwen2(config).inputs(mb) }
  for (const name of graph.lossInputs) feeds[name] = lossData[name]!()
  for (const { name, dims } of graph.weights) feeds[name] = new ort.Tensor("float32", weights.get(name)!, [...dims])
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
    loss: (out["loss"]!.data as Float32Array)[0],
    values: values.digest("hex").slice(0, 16),
    graph: createHash("sha256").update(bytes).digest("hex").slice(0, 16)
  }))
}
