/**
 * What onnxruntime-node does with an output the caller pre-allocated: it writes into the caller's buffer and still
 * returns a second, JavaScript copy of it. A learner step fetches every gradient, so its peak holds the gradients
 * twice (the accumulator and the copy): with AdamW's two float32 moments and the weights, 20 bytes a parameter plus
 * the activations is the floor of a full fine-tuning step on onnxruntime-node's API (no I/O binding, no output that
 * aliases an input). Measured (1 GiB output, 2026-12-07): RSS 1.10 → 3.10 GiB after the pre-allocated run
 * (`same buffer: false`), peak 5.10 GiB after a plain one (onnxruntime's output and its copy).
 *
 *   npx tsx scripts/ort-output-copy.ts
 */
import * as ort from "onnxruntime-node"
import * as Graph from "../src/onnx/Graph.ts"
const n = 256 * 1024 * 1024 // 1 GiB of float32
const g = Graph.make("p")
const x = g.input("x", "float32", [n])
g.output(g.op("Neg", [x]), "float32", [n])
const out = g.nodes.at(-1)!.outputs[0]!
const s = await ort.InferenceSession.create(Graph.toModelBytes(g), { enableCpuMemArena: false, enableMemPattern: false })
const GiB = 1024 ** 3
const rss = () => (process.memoryUsage.rss() / GiB).toFixed(2)
const peak = () => (process.resourceUsage().maxRSS * 1024 / GiB).toFixed(2)
const input = new Float32Array(n).fill(1)
const into = new Float32Array(n)
console.log("before", rss(), "peak", peak())
const r = await s.run({ x: new ort.Tensor("float32", input, [n]) }, { [out]: new ort.Tensor("float32", into, [n]) })
const got = r[out]!.data as Float32Array
console.log("after prealloc run", rss(), "peak", peak(), "same buffer:", got.buffer === into.buffer, "into[0]", into[0])
const r2 = await s.run({ x: new ort.Tensor("float32", input, [n]) })
console.log("after plain run", rss(), "peak", peak(), (r2[out]!.data as Float32Array)[0])
