/**
 * The onnxruntime MatMul roofline of a learner step's shapes: `node --import tsx bench/realShapes/roofline.ts
 * LAYERS ROWS LENGTH THREADS` prints one JSON line with the seconds of the forward pass's products alone (every
 * projection, the output head, attention's two products per row and head), as plain MatMuls on random inputs, and
 * the roofline tokens/s of a learner step: its backward runs two products of the same size per forward product, so a
 * step is at least 3 × those seconds. Qwen2.5-0.5B's shapes, cut to LAYERS.
 */
import { Schema } from "effect"
import * as ort from "onnxruntime-node"
import * as Graph from "../../src/onnx/Graph.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import { qwen25_05bInstruct } from "../../test/src/model/fixtures/publishedConfigs.ts"

const [layers, rows, length, threads] = process.argv.slice(2).map(Number) as [number, number, number, number]
const c = Schema.decodeUnknownSync(ModelConfig.ModelConfig)({ ...qwen25_05bInstruct, num_hidden_layers: layers })
const D = c.hiddenSize, hd = D / c.numAttentionHeads, H = c.numAttentionHeads, F = c.intermediateSize
const T = rows * length
const g = Graph.make("roofline")
const feeds: Record<string, ort.Tensor> = {}
const random = (n: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(i) * 0.02)
const input = (name: string, dims: Array<number>) => {
  feeds[name] = new ort.Tensor("float32", random(dims.reduce((a, b) => a * b, 1)), dims)
  return g.input(name, "float32", dims)
}
const sums: Array<string> = []
const product = (a: string, b: string) => {
  sums.push(g.op("ReduceSum", [g.op("MatMul", [a, b])], { keepdims: Graph.int(0) }))
}
// The same input reused by every layer's products costs the same FLOPs: one activation of each width.
const x = input("x", [T, D]), mid = input("mid", [T, F])
const q = input("q", [rows, H, length, hd]), kT = input("kT", [rows, H, hd, length])
const probs = input("probs", [rows, H, length, length]), v = input("v", [rows, H, length, hd])
const kv = (c.numKeyValueHeads * hd)
for (let i = 0; i < layers; i++) {
  for (const [name, out] of [["q", D], ["k", kv], ["v", kv], ["o", D], ["gate", F], ["up", F]] as const) {
    product(x, input(`w${i}${name}`, [D, out]))
  }
  product(mid, input(`w${i}down`, [F, D]))
  product(q, kT)
  product(probs, v)
}
product(x, input("head", [D, c.vocabSize]))
g.output(g.op("Sum", sums), "float32", [])
const session = await ort.InferenceSession.create(Graph.toModelBytes(g), {
  intraOpNumThreads: threads,
  graphOptimizationLevel: "all"
})
await session.run(feeds) // the first run allocates
const times: Array<number> = []
const cpu: Array<number> = []
for (let i = 0; i < 3; i++) {
  const t0 = performance.now()
  const c0 = process.cpuUsage()
  await session.run(feeds)
  times.push((performance.now() - t0) / 1000)
  const c1 = process.cpuUsage(c0)
  cpu.push((c1.user + c1.system) / 1e6)
}
const forwardS = Math.min(...times)
// CPU seconds beside the wall clock: on a machine shared with other jobs the wall clock of both sides of the ratio
// depends on how the scheduler interleaves them, the CPU seconds much less.
const forwardCpuS = Math.min(...cpu)
console.log(JSON.stringify({
  layers,
  rows,
  length,
  threads,
  tokens: T,
  forwardS,
  forwardCpuS,
  rooflineTokensPerS: T / (3 * forwardS)
}))
