/**
 * The checks behind `internal/frozenFile.ts` (BENCHMARKS.md, "lora", "The frozen base mapped once by the learner
 * workers"): how onnxruntime-node holds one 32 MiB MatMul weight in several sessions, read from
 * `/proc/self/smaps_rollup` (Linux), and whether two sessions' runs overlap when started from one thread.
 *
 *   npx tsx scripts/frozen-base-checks.ts memory input|inline|file|mem-buf|mem-sab [--prepack] [--sessions 4]
 *   npx tsx scripts/frozen-base-checks.ts overlap
 *   npx tsx scripts/frozen-base-checks.ts graph fold|nofold [--preset medium]
 *
 * `memory` modes: the weight fed as an input each run (`input`), inline in the model bytes (`inline`), an
 * external-data file (`file`), or the `externalData` session option over an `ArrayBuffer` (`mem-buf`) or a
 * `SharedArrayBuffer` (`mem-sab`); pre-packing off unless `--prepack`. Prints the process's RSS, PSS, anonymous
 * memory and file-backed PSS (MiB) at the start, after creating the sessions and after one run of each.
 *
 * `graph`: the LoRA training graph of a preset (2 × 128 tokens, rank 16 on all projections) with its base fed as
 * inputs, then two sessions taking it from one file (`internal/frozenFile.ts`, pre-packing off) with constant folding
 * on (`fold`) or off (`nofold`, what the trainer does): smaps after each, and whether loss, token logprobs and every
 * adapter gradient are bit-identical to the input-fed session's.
 */
import * as ort from "onnxruntime-node"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import * as Autodiff from "../src/autodiff/Autodiff.ts"
import * as FrozenFile from "../src/backends/internal/frozenFile.ts"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as Lora from "../src/Lora.ts"
import * as Loss from "../src/Loss.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Graph from "../src/onnx/Graph.ts"
import type * as Packing from "../src/Packing.ts"

const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i === -1 ? fallback : Number(args[i + 1])
}

const smaps = () => {
  const t = readFileSync("/proc/self/smaps_rollup", "utf8")
  const mib = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+)`, "m").exec(t)?.[1] ?? 0) / 1024
  return ["Rss", "Pss", "Anonymous", "Pss_File"].map((k) => `${k} ${mib(k).toFixed(0)}`).join(", ")
}

/** `y = x @ W` with W `[K, N]` an input or an initializer (inline or in `w.bin`). */
const matmul = (K: number, N: number, w: Float32Array, as: "input" | "inline" | "external") => {
  const g = Graph.make("matmul")
  const x = g.input("x", "float32", [8, K])
  const W = as === "inline"
    ? g.initializer("W", { dtype: "float32", dims: [K, N], data: w })
    : g.input("W", "float32", [K, N])
  g.node("MatMul", [x, W], ["y"])
  g.output("y", "float32", [8, N])
  const external = new Map([["W", { location: "w.bin", offset: 0, length: w.byteLength }]])
  return Graph.toModelBytes(g, as === "external" ? { external } : {})
}

const memory = async (mode: string) => {
  const K = 2048, N = 4096, sessions = flag("sessions", 4)
  const w = Float32Array.from({ length: K * N }, (_, i) => ((i * 2654435761) % 1000) / 1000 - 0.5)
  const dir = mkdtempSync(`${tmpdir()}/frozen-base-checks-`)
  try {
    writeFileSync(`${dir}/w.bin`, new Uint8Array(w.buffer))
    const bytes = matmul(K, N, w, mode === "input" ? "input" : mode === "inline" ? "inline" : "external")
    const data = mode === "mem-sab"
      ? new Uint8Array(new SharedArrayBuffer(w.byteLength))
      : mode === "mem-buf"
      ? new Uint8Array(w.byteLength)
      : undefined
    data?.set(new Uint8Array(w.buffer))
    const session: Record<string, string> = { disable_prepacking: args.includes("--prepack") ? "0" : "1" }
    if (mode === "file") session["model_external_initializers_file_folder_path"] = dir
    const options: ort.InferenceSession.SessionOptions = {
      intraOpNumThreads: 1,
      ...(data === undefined ? {} : { externalData: [{ path: "w.bin", data }] }),
      extra: { session }
    }
    console.log(`${mode}: start            ${smaps()}`)
    const made: Array<ort.InferenceSession> = []
    for (let i = 0; i < sessions; i++) made.push(await ort.InferenceSession.create(bytes, options))
    console.log(`${mode}: ${sessions} sessions       ${smaps()}`)
    const x = new ort.Tensor("float32", new Float32Array(8 * K).fill(0.01), [8, K])
    const feeds: Record<string, ort.Tensor> = { x }
    if (mode === "input") feeds["W"] = new ort.Tensor("float32", w, [K, N])
    let y = 0
    for (const s of made) y = ((await s.run(feeds))["y"]!.data as Float32Array)[5]!
    console.log(`${mode}: after one run each ${smaps()}; y[5] = ${y}`)
    for (const s of made) await s.release()
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

/** Two sessions of a 20-MatMul chain: one run, two one after the other, two started together. */
const overlap = async () => {
  const K = 1024, M = 512
  const g = Graph.make("chain")
  let h = g.input("x", "float32", [M, K])
  const W = g.input("W", "float32", [K, K])
  for (let i = 0; i < 20; i++) h = g.op("MatMul", [h, W])
  g.output(h, "float32", [M, K])
  const bytes = Graph.toModelBytes(g)
  const options = { intraOpNumThreads: 1, interOpNumThreads: 1 }
  const a = await ort.InferenceSession.create(bytes, options), b = await ort.InferenceSession.create(bytes, options)
  const feeds = {
    x: new ort.Tensor("float32", new Float32Array(M * K).fill(0.001), [M, K]),
    W: new ort.Tensor("float32", new Float32Array(K * K).fill(0.001), [K, K])
  }
  await a.run(feeds)
  const time = async (label: string, f: () => Promise<unknown>) => {
    const t0 = performance.now(), c0 = process.cpuUsage()
    await f()
    const c = process.cpuUsage(c0)
    const wall = (performance.now() - t0) / 1000, cpu = (c.user + c.system) / 1e6
    console.log(`${label}: wall ${wall.toFixed(2)} s, CPU ${cpu.toFixed(2)} s`)
  }
  await time("one run", () => a.run(feeds))
  await time("two one after the other", async () => {
    await a.run(feeds)
    await b.run(feeds)
  })
  await time("two started together", () => Promise.all([a.run(feeds), b.run(feeds)]))
}

/** A micro-batch of `batch` rows of `length` tokens, every token in the SFT loss. */
const microBatch = (vocab: number, batch: number, length: number): Packing.MicroBatch => {
  const n = batch * length
  const ids = Int32Array.from({ length: n }, (_, i) => (i * 7919) % vocab)
  return {
    batch,
    length,
    inputIds: ids,
    attentionMask: new Uint8Array(n).fill(1),
    targets: Int32Array.from(ids, (t) => (t + 1) % vocab),
    mask: new Uint8Array(n).fill(1),
    weights: new Float32Array(n).fill(1 / n),
    advantages: new Float32Array(n),
    samplerLogprobs: new Float32Array(n),
    refLogprobs: new Float32Array(n),
    sequenceIndex: Int32Array.from({ length: batch }, (_, i) => i),
    lossTokens: n
  }
}

const graph = async (fold: boolean) => {
  const preset = (args.includes("--preset") ? args[args.indexOf("--preset") + 1] : "medium") as ModelConfig.PresetName
  const config = ModelConfig.presets[preset]
  const base = Qwen2.initWeights(config, 1, 0.05)
  const model = OnnxTrainer.qwen2Lora(config, { rank: 16, alpha: 32, targets: [...Lora.moduleNames] }, base, preset)
  const adapter = model.initial!
  for (const [k, v] of adapter) if (k.includes("lora_B")) v.forEach((_, i) => (v[i] = 0.001 * ((i % 7) - 3)))
  const mb = microBatch(config.vocabSize, 2, 128)
  const tg = await Effect.runPromise(Autodiff.trainingGraph(model.forward(), {
    batch: mb.batch,
    length: mb.length,
    dims: {},
    loss: Loss.sft,
    withGradients: true,
    recompute: false
  }))
  const frozen = new Set(model.frozen!.parameters.map((p) => p.name))
  const feeds = (withBase: boolean) => {
    const out: Record<string, ort.Tensor> = {}
    for (const [k, v] of Object.entries(model.inputs(mb))) if (withBase || !frozen.has(k)) out[k] = v
    out["targets"] = new ort.Tensor("int64", BigInt64Array.from(mb.targets, (t) => BigInt(t)), [mb.batch, mb.length])
    for (const name of tg.lossInputs) {
      if (name === "targets") continue
      const data = name === "loss_weights" ? mb.weights : name === "loss_mask" ? Float32Array.from(mb.mask) : undefined
      out[name] = new ort.Tensor("float32", data ?? new Float32Array(mb.batch * mb.length), [mb.batch, mb.length])
    }
    for (const w of tg.weights) out[w.name] = new ort.Tensor("float32", adapter.get(w.name)!, [...w.dims])
    return out
  }
  const options: ort.InferenceSession.SessionOptions = {
    intraOpNumThreads: 1,
    graphOptimizationLevel: "all",
    enableCpuMemArena: false,
    enableMemPattern: false
  }
  console.log(`start:                    ${smaps()}`)
  const fed = await ort.InferenceSession.create(Graph.toModelBytes(tg.graph), options)
  const expected = await fed.run(feeds(true))
  console.log(`base as inputs, one run:  ${smaps()}`)
  await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
    const { file } = yield* FrozenFile.acquire(model.frozen!.parameters, base)
    const mapped = FrozenFile.sessionOptions(options, file.folder)
    const extra = mapped.extra as { readonly session: object }
    const sessionOptions = fold ? { ...mapped, extra: { session: extra.session } } : mapped
    const bytes = FrozenFile.modelBytes(tg.graph, file)
    const sessions = yield* Effect.promise(() =>
      Promise.all([0, 1].map(() => ort.InferenceSession.create(bytes, sessionOptions)))
    )
    console.log(`2 sessions from the file: ${smaps()}`)
    let same = true
    for (const s of sessions) {
      const out = yield* Effect.promise(() => s.run(feeds(false)))
      for (const name of ["loss", "token_logprobs", ...tg.gradients.values()]) {
        const a = expected[name]!.data as Float32Array, b = out[name]!.data as Float32Array
        same &&= a.every((x, i) => x === b[i])
      }
    }
    console.log(`one run each:             ${smaps()}; bit-identical to the inputs' run: ${same}`)
  })).pipe(Effect.provide(NodeServices.layer)))
}

const main = args[0] === "overlap"
  ? overlap()
  : args[0] === "graph"
  ? graph(args[1] === "fold")
  : memory(args[1] ?? "file")
main.catch((e) => {
  console.error(e)
  process.exit(1)
})
