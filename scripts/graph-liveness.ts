/**
 * What the learner's training graph holds alive, counted node by node in the graph's order (no onnxruntime, no
 * memory: the graph is only built): at Qwen2.5-0.5B's width cut to `layers`, for `batch × length` tokens, the peak
 * of the values alive at once (graph outputs excluded: the gradients are written into the trainer's accumulators)
 * and which ops' outputs make it up. Where `MemoryEstimate`'s activation formula comes from, and how issue 41's
 * transposed-weight and gradient-copy findings were seen.
 *
 *   npx tsx scripts/graph-liveness.ts [layers] [--batch 2] [--length 512] [--recompute]
 *
 * Counted (2 × 512 tokens, 2026-12-07): at 1 layer 146 MiB of activations a layer besides the head's 519 MiB ∂W
 * (the attention's probabilities 28, four `[tokens, F]` MLP tensors 76, twelve of the hidden width 42); before the
 * linear layers' backward read `W` itself, 57 MiB a layer more (the transposed weights). At 24 layers: 4,310 MiB
 * (3,791 besides the head's ∂W); with `--recompute` 1,307 MiB (788 besides it: 0.21×). Before each gradient was
 * its own node's output, the recompute graph's peak was at its end: every gradient waited for an `Identity` there.
 */
import { Effect } from "effect"
import * as Autodiff from "../src/autodiff/Autodiff.ts"
import * as Shapes from "../src/autodiff/Shapes.ts"
import * as Loss from "../src/Loss.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import { qwen25Width } from "./shapes.ts"

const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i === -1 ? fallback : Number(args[i + 1])
}
const layers = Number(args.find((a, i) => /^\d+$/.test(a) && !args[i - 1]?.startsWith("--")) ?? 1)
const batch = flag("batch", 2)
const length = flag("length", 512)
const config = qwen25Width(layers)
const recompute = args.includes("--recompute")
const options = { batch, length, loss: Loss.sft, recompute }
const tg = Effect.runSync(Autodiff.trainingGraph(Qwen2.trainingGraph(config), options))
const g = tg.graph
const shapes = Shapes.make(g, { batch, seq: length })
const width = (d: string) => (d === "int64" || d === "float64" ? 8 : d === "bool" ? 1 : 4)
const bytes = (v: string) => {
  if (!shapes.has(v)) return 0
  const info = shapes.get(v)
  return info.dims.reduce((a, b) => a * b, 1) * width(info.dtype)
}
const producer = new Map<string, number>()
const last = new Map<string, number>()
g.nodes.forEach((n, i) => {
  for (const o of n.outputs) producer.set(o, i)
  for (const x of n.inputs) last.set(x, i)
})
const outputs = new Set(g.outputs.map((o) => o.name))
const ends = new Map<number, Array<string>>()
for (const [v, i] of last) if (producer.has(v) && !outputs.has(v)) ends.set(i, [...(ends.get(i) ?? []), v])
let live = 0
let peak = 0
let peakAt = 0
g.nodes.forEach((n, i) => {
  for (const o of n.outputs) if (last.has(o) && !outputs.has(o)) live += bytes(o)
  if (live > peak) [peak, peakAt] = [live, i]
  for (const v of ends.get(i) ?? []) live -= bytes(v)
})
const MiB = 2 ** 20
const byOp = new Map<string, { count: number; bytes: number }>()
for (const [v, p] of producer) {
  const l = last.get(v)
  if (l === undefined || outputs.has(v) || p > peakAt || l <= peakAt) continue
  const op = g.nodes[p]!.op
  const e = byOp.get(op) ?? { count: 0, bytes: 0 }
  byOp.set(op, { count: e.count + 1, bytes: e.bytes + bytes(v) })
}
const what = `${layers} layer(s), ${batch} × ${length} tokens${recompute ? ", recompute" : ""}`
console.log(`${what}: ${g.nodes.length} nodes`)
console.log(`peak ${(peak / MiB).toFixed(0)} MiB alive at node ${peakAt} (${g.nodes[peakAt]!.op}), by op:`)
for (const [op, e] of [...byOp].sort((a, b) => b[1].bytes - a[1].bytes)) {
  if (e.bytes < MiB) continue
  console.log(`  ${op.padEnd(12)} × ${String(e.count).padStart(4)}  ${(e.bytes / MiB).toFixed(0)} MiB`)
}
