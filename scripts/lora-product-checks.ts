/**
 * One product `y = x·Wᵀ` with `W [out, in]` fed as an input, the ways onnxruntime can run it, against the merged
 * engine's way (`MatMul(x, Transpose(W))` with `W` an initializer: folded and pre-packed once). Milliseconds per run,
 * best of `--runs`, for 1, 8 and 64 rows, each graph alternated with the others:
 *
 *   npx tsx scripts/lora-product-checks.ts [--out 4864] [--in 896] [--runs 20] [--threads 2]
 */
import * as ort from "onnxruntime-node"
import * as Graph from "../src/onnx/Graph.ts"

const arg = (name: string, fallback: number) => {
  const i = process.argv.indexOf(`--${name}`)
  return i < 0 ? fallback : Number(process.argv[i + 1])
}
const out = arg("out", 4864), inF = arg("in", 896), runs = arg("runs", 20), threads = arg("threads", 2)
const ms = "com.microsoft"
const w = Float32Array.from({ length: out * inF }, (_, i) => Math.sin(i) * 0.02)

type Way = "initializer" | "transpose" | "fusedTransB" | "fusedSwapped" | "gemmTransB"
const graphOf = (way: Way): Uint8Array => {
  const g = Graph.make(way)
  const x = g.input("x", "float32", ["rows", inF])
  const W = way === "initializer" ? g.initializer("W", { dtype: "float32", dims: [out, inF], data: w })
    : g.input("W", "float32", [out, inF])
  let y: string
  if (way === "initializer" || way === "transpose") {
    y = g.op("MatMul", [x, g.op("Transpose", [W], { perm: Graph.ints([1, 0]) })])
  } else if (way === "fusedTransB") {
    y = g.node("FusedMatMul", [x, W], ["f"], { transB: Graph.int(1) }, ms)[0]!
  } else if (way === "gemmTransB") {
    y = g.op("Gemm", [x, W], { transB: Graph.int(1) })
  } else {
    // (W·xᵀ)ᵀ: the weight is the A operand, which the kernel streams; only x is packed.
    const t = g.node("FusedMatMul", [W, x], ["f"], { transB: Graph.int(1) }, ms)[0]!
    y = g.op("Transpose", [t], { perm: Graph.ints([1, 0]) })
  }
  g.node("Identity", [y], ["y"])
  g.output("y", "float32", ["rows", out])
  return Graph.toModelBytes(g)
}

const ways: ReadonlyArray<Way> = ["initializer", "transpose", "fusedTransB", "gemmTransB", "fusedSwapped"]
const sessions = new Map<Way, ort.InferenceSession>()
for (const way of ways) {
  sessions.set(way, await ort.InferenceSession.create(graphOf(way), {
    executionProviders: ["cpu"], graphOptimizationLevel: "all", intraOpNumThreads: threads, interOpNumThreads: 1
  }))
}
const wTensor = new ort.Tensor("float32", w, [out, inF])
const result: Record<string, Record<string, number>> = {}
for (const rows of [1, 8, 64]) {
  const x = new ort.Tensor("float32", Float32Array.from({ length: rows * inF }, (_, i) => Math.cos(i)), [rows, inF])
  const best = new Map<Way, number>(ways.map((way) => [way, Infinity]))
  let reference: Float32Array | undefined
  for (let r = 0; r < runs; r++) {
    for (const way of ways) {
      const feeds = way === "initializer" ? { x } : { x, W: wTensor }
      const t0 = performance.now()
      const y = (await sessions.get(way)!.run(feeds))["y"]!.data as Float32Array
      best.set(way, Math.min(best.get(way)!, performance.now() - t0))
      reference ??= Float32Array.from(y)
      if (r === 0 && y.some((v, i) => Math.abs(v - reference![i]!) > 1e-3)) throw new Error(`${way} differs`)
    }
  }
  result[`rows${rows}`] = Object.fromEntries([...best].map(([k, v]) => [k, +v.toFixed(3)]))
}
console.log(JSON.stringify({ out, in: inF, threads, runs, bestMs: result }))
