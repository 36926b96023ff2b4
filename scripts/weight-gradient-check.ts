/**
 * Whether a weight gradient `Aᵀ·G` computed as `Gemm(A, G, transA=1)` (what `Backward.ts` emitted) and as an
 * explicit transpose then a plain product give the same bits, and how long each takes, at Qwen2.5-0.5B's and the tiny
 * preset's shapes:
 *
 *   node --import tsx scripts/weight-gradient-check.ts [--threads 2] [--reps 5]
 *
 * Variants of `∂Wᵀ [K, N]`: `gemm` (transA), `t2` (Transpose perm [1,0] of the flat `[n, K]` input, then MatMul),
 * `t3` (Transpose perm [2,0,1] of the `[B, T, K]` input, Reshape to `[K, B·T]`, then MatMul); of `∂W [N, K]`:
 * `gemmW` (`Gemm(G, A, transA)`, what onnxruntime makes of the transposed `gemm`), `dw` (Transpose of the gradient
 * `G [n, N]`, then MatMul). Prints one line per shape.
 */
import * as ort from "onnxruntime-node"
import * as Graph from "../src/onnx/Graph.ts"

const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i === -1 ? fallback : Number(args[i + 1])
}
const threads = flag("threads", 2), reps = flag("reps", 5)

const variant = (kind: Kind, B: number, T: number, K: number, N: number) => {
  const g = Graph.make(kind)
  const a = g.input("a", "float32", [B, T, K])
  const grad = g.input("g", "float32", [B * T, N])
  const a2 = g.op("Reshape", [a, g.constant(Graph.int64([2], [B * T, K]))])
  if (kind === "gemmW" || kind === "dw") {
    // ∂W `[N, K]` directly, as onnxruntime runs `Transpose(Gemm(A, G, transA))` (it swaps the operands).
    const out = kind === "gemmW"
      ? g.op("Gemm", [grad, a2], { transA: Graph.int(1) })
      : g.op("MatMul", [g.op("Transpose", [grad], { perm: Graph.ints([1, 0]) }), a2])
    g.output(out, "float32", [N, K])
    return g
  }
  const out = kind === "gemm"
    ? g.op("Gemm", [a2, grad], { transA: Graph.int(1) })
    : kind === "t2"
    ? g.op("MatMul", [g.op("Transpose", [a2], { perm: Graph.ints([1, 0]) }), grad])
    : g.op("MatMul", [
      g.op("Reshape", [
        g.op("Transpose", [a], { perm: Graph.ints([2, 0, 1]) }),
        g.constant(Graph.int64([2], [K, B * T]))
      ]),
      grad
    ])
  g.output(out, "float32", [K, N])
  return g
}

type Kind = "gemm" | "t2" | "t3" | "gemmW" | "dw"
const kinds: ReadonlyArray<Kind> = ["gemm", "t2", "t3", "gemmW", "dw"]

let seed = 12345
const random = (n: number) =>
  Float32Array.from({ length: n }, () => {
    seed = (seed * 1103515245 + 12345) >>> 0
    return (seed / 2 ** 32 - 0.5) * 0.2
  })

const shapes: Array<[string, number, number, number, number]> = [
  ["0.5B qkv/o", 2, 512, 896, 896],
  ["0.5B k/v", 2, 512, 896, 128],
  ["0.5B gate/up", 2, 512, 896, 4864],
  ["0.5B down", 2, 512, 4864, 896],
  ["tiny attn", 16, 192, 128, 128],
  ["tiny gate", 16, 192, 128, 512],
  ["tiny down", 16, 192, 512, 128],
  ["tiny odd", 3, 37, 128, 512]
]
for (const [label, B, T, K, N] of shapes) {
  const feeds = {
    a: new ort.Tensor("float32", random(B * T * K), [B, T, K]),
    g: new ort.Tensor("float32", random(B * T * N), [B * T, N])
  }
  const results: Record<string, { ms: number; data: Float32Array }> = {}
  for (const kind of kinds) {
    const session = await ort.InferenceSession.create(Graph.toModelBytes(variant(kind, B, T, K, N)), {
      intraOpNumThreads: threads,
      interOpNumThreads: 1,
      executionMode: "sequential",
      graphOptimizationLevel: "all",
      extra: { session: { intra_op: { allow_spinning: "0" } } }
    })
    let data: Float32Array = new Float32Array()
    const times: Array<number> = []
    for (let i = 0; i < reps + 1; i++) {
      const t0 = performance.now()
      const out = await session.run(feeds)
      if (i > 0) times.push(performance.now() - t0)
      data = out[Object.keys(out)[0]!]!.data as Float32Array
    }
    await session.release()
    results[kind] = { ms: Math.min(...times), data }
  }
  const same = (x: Float32Array, y: Float32Array) =>
    x.length === y.length && Buffer.compare(Buffer.from(x.buffer), Buffer.from(y.buffer)) === 0
  const flops = 2 * B * T * K * N
  console.log(JSON.stringify({
    label,
    dims: [B * T, K, N],
    gemmMs: results["gemm"]!.ms,
    t2Ms: results["t2"]!.ms,
    t3Ms: results["t3"]!.ms,
    gemmWMs: results["gemmW"]!.ms,
    dwMs: results["dw"]!.ms,
    dwSameBits: same(results["gemmW"]!.data, results["dw"]!.data),
    gemmGflops: flops / results["gemm"]!.ms / 1e6,
    t3Gflops: flops / results["t3"]!.ms / 1e6,
    t2SameBits: same(results["gemm"]!.data, results["t2"]!.data),
    t3SameBits: same(results["gemm"]!.data, results["t3"]!.data)
  }))
}
