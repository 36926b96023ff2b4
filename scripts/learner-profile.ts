/**
 * Where a full fine-tuning learner step's time goes, at Qwen2.5-0.5B's width: onnxruntime's own profile of the
 * training session (node time per op type, over the second run), and the JavaScript side of the step timed alone
 * (the gradient norm and AdamW over every parameter, as `OnnxTrainer` runs them with one worker).
 *
 *   npx tsx scripts/learner-profile.ts LAYERS [--batch 2] [--length 512] [--threads 2] [--recompute] [--top 12]
 *
 * Prints a table per op type (milliseconds, share, node count), the slowest nodes, then one JSON line. Not run in CI
 * (the session needs ≈ 15 GiB at 24 layers × 1,024 tokens). Random weights; the SFT loss on every token.
 */
import { Effect } from "effect"
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ort from "onnxruntime-node"
import * as Autodiff from "../src/autodiff/Autodiff.ts"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as Loss from "../src/Loss.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Graph from "../src/onnx/Graph.ts"
import * as Optimizer from "../src/Optimizer.ts"
import { microBatch, qwen25Width, sftFeeds, weightsOf } from "./shapes.ts"

const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i === -1 ? fallback : Number(args[i + 1])
}
const layers = Number(args[0] ?? 24)
const batch = flag("batch", 2), length = flag("length", 512), threads = flag("threads", 2), top = flag("top", 12)
const config = qwen25Width(layers)
const weights = weightsOf(config)
const mb = microBatch(config, batch, length)
const graph = Effect.runSync(Autodiff.trainingGraph(Qwen2.trainingGraph(config), {
  batch,
  length,
  loss: Loss.sft,
  dims: {},
  withGradients: true,
  recompute: args.includes("--recompute")
}))
const dir = mkdtempSync(join(tmpdir(), "learner-profile-"))
const session = await ort.InferenceSession.create(Graph.toModelBytes(graph.graph), {
  intraOpNumThreads: threads,
  interOpNumThreads: 1,
  executionMode: "sequential",
  graphOptimizationLevel: "all",
  enableCpuMemArena: false,
  enableMemPattern: false,
  enableProfiling: true,
  profileFilePrefix: join(dir, "profile"),
  extra: { session: { intra_op: { allow_spinning: "0" } } }
})
const feeds = sftFeeds(config, graph, mb, weights, batch, length)
Object.assign(feeds, OnnxTrainer.viewFeeds(graph, feeds))
const accum = new Map(graph.weights.map(({ name }) => [name, new Float32Array(weights.get(name)!.length)]))
const fetches: Record<string, ort.Tensor | null> = { loss: null, token_logprobs: null, stats: null }
for (const { name, dims } of graph.weights) {
  fetches[graph.gradients.get(name)!] = new ort.Tensor("float32", accum.get(name)!, [...dims])
}
const runS: Array<number> = []
for (let i = 0; i < 2; i++) {
  const t0 = performance.now()
  await session.run(feeds, fetches)
  runS.push((performance.now() - t0) / 1000)
}
// The JavaScript side of `optimStep` with one worker: the norm, then AdamW.
const t0 = performance.now()
const norm = Optimizer.globalNorm(accum)
const t1 = performance.now()
const state = Optimizer.makeState(weights, "float32")
const t2 = performance.now()
Optimizer.step(weights, accum, state, 1e-5, Optimizer.defaultConfig, Optimizer.clipScale(norm, 1))
const t3 = performance.now()
session.endProfiling() // onnxruntime-node writes the file and returns nothing
await session.release()
const file = join(dir, readdirSync(dir).find((f) => f.startsWith("profile"))!)

interface Event {
  readonly cat: string
  readonly name: string
  readonly ts: number
  readonly dur: number
  readonly args?: {
    readonly op_name?: string
    readonly input_type_shape?: ReadonlyArray<Record<string, ReadonlyArray<number>>>
  }
}
const events = JSON.parse(readFileSync(file, "utf8")) as Array<Event>
rmSync(dir, { recursive: true, force: true })
const runs = events.filter((e) => e.cat === "Session" && e.name === "model_run")
const last = runs.at(-1)!
const nodes = events.filter((e) =>
  e.cat === "Node" && e.name.endsWith("_kernel_time") && e.ts >= last.ts && e.ts <= last.ts + last.dur
)
const byOp = new Map<string, { us: number; count: number }>()
for (const e of nodes) {
  const op = e.args?.op_name ?? "?"
  const s = byOp.get(op) ?? { us: 0, count: 0 }
  byOp.set(op, { us: s.us + e.dur, count: s.count + 1 })
}
const total = nodes.reduce((a, e) => a + e.dur, 0)
console.error(`second run ${(last.dur / 1000).toFixed(0)} ms, nodes ${(total / 1000).toFixed(0)} ms in ${nodes.length}`)
for (const [op, s] of [...byOp].sort((a, b) => b[1].us - a[1].us)) {
  const share = (100 * s.us / total).toFixed(1)
  console.error(`${op.padEnd(24)} ${(s.us / 1000).toFixed(0).padStart(8)} ms ${share.padStart(5)} % ${s.count} nodes`)
}
// By op and input shapes: which products (the head's chunks, a layer's projections) the time goes to.
const shapeOf = (e: Event) =>
  (e.args?.input_type_shape ?? []).map((t) => `[${Object.values(t)[0]?.join("×")}]`).join(" ")
const byShape = new Map<string, { us: number; count: number }>()
for (const e of nodes) {
  const key = `${e.args?.op_name} ${shapeOf(e)}`
  const s = byShape.get(key) ?? { us: 0, count: 0 }
  byShape.set(key, { us: s.us + e.dur, count: s.count + 1 })
}
for (const [key, s] of [...byShape].sort((a, b) => b[1].us - a[1].us).slice(0, top)) {
  console.error(`  ${(s.us / 1000).toFixed(0).padStart(7)} ms ${String(s.count).padStart(4)}× ${key}`)
}
const params = [...weights.values()].reduce((a, w) => a + w.length, 0)
console.log(JSON.stringify({
  layers,
  batch,
  length,
  threads,
  params,
  runS,
  profiledRunS: last.dur / 1e6,
  nodesS: total / 1e6,
  byOp: Object.fromEntries([...byOp].map(([op, s]) => [op, s.us / 1e6])),
  normS: (t1 - t0) / 1000,
  momentsInitS: (t2 - t1) / 1000,
  adamS: (t3 - t2) / 1000
}))
