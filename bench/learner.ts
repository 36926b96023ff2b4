/**
 * `npm run bench -- learner`: training throughput of the ONNX learner on the tiny preset (batch 8 × 64 tokens,
 * masked NLL, AdamW), against two baselines measured in the same run:
 *
 * 1. `@tensorflow/tfjs` with the wasm backend computing the same model (Qwen2: RMSNorm, RoPE, GQA, SwiGLU, the
 *    preset's untied head and learned positions), the same loss and its gradients, with Adam (a dev-only comparator).
 *    The wasm backend has no gradient kernel for `gather` (the embedding is a one-hot matmul) and its transposed matmul
 *    is slow, so its matmul gradient transposes explicitly: the best configuration found in
 *    `shared/prototypes/ml/tfjs_bench.mjs`. Both engines start from the same weights; the loss and an embedding
 *    gradient are compared as a sanity check.
 * 2. The roofline: a plain onnxruntime MatMul chain with the same total FLOPs as one training step.
 *
 * ORT runs in three configurations, interleaved in the same rounds: one thread with 2 intra-op threads (the
 * trainer's single-thread default), one intra-op thread, and `workers: 2` (rows split over 2 worker threads with one
 * intra-op thread each: what `agentfly train` uses by default, `learner.workers` 2).
 *
 * Headline: tokens/s of the ORT learner as the product configures it (`workers: 2`) ÷ tfjs-wasm tokens/s
 * (target ≥ 10).
 */
import { NodeServices } from "@effect/platform-node"
import * as tf from "@tensorflow/tfjs"
import "@tensorflow/tfjs-backend-wasm"
import { Effect } from "effect"
import { readdirSync, readFileSync } from "node:fs"
import * as ort from "onnxruntime-node"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Graph from "../src/onnx/Graph.ts"
import * as Optimizer from "../src/Optimizer.ts"
import * as Packing from "../src/Packing.ts"
import * as Sampling from "../src/Sampling.ts"
import type { BenchResult } from "./run.ts"

const B = 8
const T = 64
const c = ModelConfig.presets.tiny
const D = c.hiddenSize, H = c.numAttentionHeads, KV = c.numKeyValueHeads, hd = D / H, F = c.intermediateSize
const V = c.vocabSize, L = c.numHiddenLayers, N = B * T

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/** Matmul FLOPs of one forward pass (2·M·K·N each); a training step is ≈ 3× (two gradient matmuls per matmul). */
const forwardFlops = N * (L * (2 * D * D * 2 + 2 * D * KV * hd * 2 + 2 * D * F * 3 + 2 * T * hd * H * 2) + 2 * D * V)
const stepFlops = 3 * forwardFlops

const batchData = (rows = B, length = T) => {
  const r = Sampling.rng(5)
  const tokenIds = Array.from({ length: rows }, () => Int32Array.from({ length }, () => Math.floor(r.next() * V)))
  // loss on the second half of each sequence (the "response")
  return tokenIds.map((ids) => ({ tokenIds: ids, lossMask: Uint8Array.from(ids, (_, t) => (t >= length / 2 ? 1 : 0)) }))
}

// ===== onnxruntime learner =====

/** On-CPU nanoseconds of every thread of this process (`/proc/self/task/TID/schedstat`). */
const threadCpu = (): Map<string, number> =>
  new Map(readdirSync("/proc/self/task").flatMap((tid) => {
    const stat = readFileSync(`/proc/self/task/${tid}/schedstat`, "utf8").split(" ")[0]
    return stat === undefined ? [] : [[tid, Number(stat)]]
  }))

/**
 * What a step would take with a free core per thread: the main thread's CPU time (serial with the workers: it
 * prepares the shards and waits) plus the busiest other thread's. Between steps the threads are idle, so the deltas
 * of the snapshots around a step are that step's.
 */
const criticalPath = (before: Map<string, number>, after: Map<string, number>): number => {
  let main = 0
  let busiest = 0
  for (const [tid, ns] of after) {
    const ms = (ns - (before.get(tid) ?? 0)) / 1e6
    if (tid === String(process.pid)) main = ms
    else busiest = Math.max(busiest, ms)
  }
  return main + busiest
}

const ortLearner = (weights: Qwen2.Weights, intraOpThreads: number, rows = B, length = T, workers = 1) =>
  Effect.gen(function*() {
    const trainer = yield* OnnxTrainer.make({
      model: OnnxTrainer.qwen2(c),
      intraOpThreads,
      workers,
      weights,
      loss: Loss.sft,
      optimizer: Optimizer.defaultConfig,
      schedule: LrSchedule.constant(1e-3)
    })
    const { microBatches } = yield* Packing.pack(batchData(rows, length), {
      tokenBudget: rows * length,
      lengthMultiple: length,
      aggregation: "token-mean"
    })
    const mb = microBatches[0]!
    const first = yield* trainer.trainer.forwardBackward(mb) // compiles the session (starts the workers)
    const embedGradient = (yield* trainer.gradients).get("model.embed_tokens.weight")!
    yield* trainer.trainer.optimStep
    /**
     * One timed step: [forward+backward ms, whole step ms, process CPU ms of the step, critical-path CPU ms: the main
     * thread's CPU time plus that of the busiest other thread (a worker, or an intra-op thread)].
     */
    const step = Effect.gen(function*() {
      const threads0 = threadCpu()
      const cpu0 = process.cpuUsage()
      const t0 = performance.now()
      yield* trainer.trainer.forwardBackward(mb)
      const t1 = performance.now()
      yield* trainer.trainer.optimStep
      const t2 = performance.now()
      const cpu = process.cpuUsage(cpu0)
      return [t1 - t0, t2 - t0, (cpu.user + cpu.system) / 1000, criticalPath(threads0, threadCpu())] as const
    })
    return { initialLoss: first.loss, embedGradient, step }
  })

// ===== tfjs-wasm comparator =====

const T2 = (x: tf.Tensor) => {
  const r = x.rank
  const perm = Array.from({ length: r }, (_, i) => i)
  perm[r - 1] = r - 2
  perm[r - 2] = r - 1
  return tf.transpose(x, perm)
}

/** matMul whose gradient uses explicit transposes (tfjs-wasm's fast path). */
const mm = tf.customGrad(((a: tf.Tensor, b: tf.Tensor, save: (ts: Array<tf.Tensor>) => void) => {
  save([a, b])
  return {
    value: tf.matMul(a as tf.Tensor2D, b as tf.Tensor2D),
    gradFunc: (dy: tf.Tensor, saved: Array<tf.Tensor>) => [
      tf.matMul(dy as tf.Tensor2D, T2(saved[1]!) as tf.Tensor2D),
      tf.matMul(T2(saved[0]!) as tf.Tensor2D, dy as tf.Tensor2D)
    ]
  }
}) as never) as unknown as (a: tf.Tensor, b: tf.Tensor) => tf.Tensor

const tfjsLearner = async (weights: Qwen2.Weights) => {
  await tf.setBackend("wasm")
  await tf.ready()
  const data = batchData()
  const ids = tf.tensor1d(data.flatMap((d) => Array.from(d.tokenIds.subarray(0, T))), "int32")
  const targets = tf.tensor1d(data.flatMap((d) => [...Array.from(d.tokenIds.subarray(1)), 0]), "int32")
  const maskArr = data.flatMap((d) => [...Array.from(d.lossMask.subarray(1)), 0])
  const mask = tf.tensor1d(maskArr)
  const maskSum = maskArr.reduce((a, b) => a + b, 0)
  const w = (name: string, transpose: boolean) => {
    const spec = Qwen2.parameters(c).find((p) => p.name === name)!
    const t = tf.tensor(weights.get(name)!, [...spec.shape])
    return tf.variable(transpose ? tf.transpose(t) : t)
  }
  const E = w("model.embed_tokens.weight", false)
  const layers = Array.from({ length: L }, (_, i) => {
    const p = `model.layers.${i}`
    return {
      g1: w(`${p}.input_layernorm.weight`, false),
      g2: w(`${p}.post_attention_layernorm.weight`, false),
      wq: w(`${p}.self_attn.q_proj.weight`, true),
      bq: w(`${p}.self_attn.q_proj.bias`, false),
      wk: w(`${p}.self_attn.k_proj.weight`, true),
      bk: w(`${p}.self_attn.k_proj.bias`, false),
      wv: w(`${p}.self_attn.v_proj.weight`, true),
      bv: w(`${p}.self_attn.v_proj.bias`, false),
      wo: w(`${p}.self_attn.o_proj.weight`, true),
      wg: w(`${p}.mlp.gate_proj.weight`, true),
      wu: w(`${p}.mlp.up_proj.weight`, true),
      wd: w(`${p}.mlp.down_proj.weight`, true)
    }
  })
  const gF = w("model.norm.weight", false)
  const head = c.tieWordEmbeddings ? E : w("lm_head.weight", false)
  const positions = c.learnedPositions
    ? tf.tile(tf.slice(w("model.embed_positions.weight", false), [0, 0], [T, D]), [B, 1])
    : undefined
  const tables = Qwen2.ropeTables(c)
  const cos = tf.tensor(tables.cos.subarray(0, T * hd / 2), [1, T, 1, hd / 2])
  const sin = tf.tensor(tables.sin.subarray(0, T * hd / 2), [1, T, 1, hd / 2])
  const causal = tf.tensor2d(Array.from({ length: T * T }, (_, k) => (k % T <= Math.floor(k / T) ? 0 : -1e9)), [T, T])
  const rms = (x: tf.Tensor, g: tf.Tensor) =>
    tf.mul(tf.mul(x, tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), c.rmsNormEps))), g)
  const rope = (x: tf.Tensor) => {
    const [x1, x2] = tf.split(x, 2, -1) as [tf.Tensor, tf.Tensor]
    return tf.concat([tf.sub(tf.mul(x1, cos), tf.mul(x2, sin)), tf.add(tf.mul(x2, cos), tf.mul(x1, sin))], -1)
  }
  // [B, KV, T, hd] → [B, H, T, hd]: query head kv·G + j shares kv head kv (tile has no rank-5 gradient on wasm)
  const repeatKv = (x: tf.Tensor) =>
    tf.concat(tf.split(x, KV, 1).flatMap((part) => Array.from({ length: H / KV }, () => part)), 1)
  const lossFn = () => {
    let x = mm(tf.oneHot(ids, V).toFloat(), E) // gather has no gradient kernel on wasm
    if (positions !== undefined) x = tf.add(x, positions)
    for (const l of layers) {
      const h = rms(x, l.g1)
      const q = tf.transpose(rope(tf.reshape(tf.add(mm(h, l.wq), l.bq), [B, T, H, hd])), [0, 2, 1, 3])
      const k = repeatKv(tf.transpose(rope(tf.reshape(tf.add(mm(h, l.wk), l.bk), [B, T, KV, hd])), [0, 2, 1, 3]))
      const v = repeatKv(tf.transpose(tf.reshape(tf.add(mm(h, l.wv), l.bv), [B, T, KV, hd]), [0, 2, 1, 3]))
      const probs = tf.softmax(tf.add(tf.mul(mm(q, T2(k)), 1 / Math.sqrt(hd)), causal))
      const o = tf.reshape(tf.transpose(mm(probs, v), [0, 2, 1, 3]), [N, D])
      x = tf.add(x, mm(o, l.wo))
      const h2 = rms(x, l.g2)
      const gate = mm(h2, l.wg)
      x = tf.add(x, mm(tf.mul(tf.mul(gate, tf.sigmoid(gate)), mm(h2, l.wu)), l.wd))
    }
    const logits = mm(rms(x, gF), T2(head))
    const picked = tf.sum(tf.mul(tf.logSoftmax(logits), tf.oneHot(targets, V)), -1)
    return tf.div(tf.neg(tf.sum(tf.mul(picked, mask))), maskSum) as tf.Scalar
  }
  const { value, grads } = tf.variableGrads(lossFn, [E])
  const initialLoss = (await value.data())[0]!
  const embedGradient = Float32Array.from(await grads[E.name]!.data())
  tf.dispose([value, ...Object.values(grads)])
  const optimizer = tf.train.adam(1e-3, 0.9, 0.98, 1e-8)
  /** One timed step: [wall ms, process CPU ms]. */
  const step = async () => {
    const cpu0 = process.cpuUsage()
    const t0 = performance.now()
    const loss = tf.tidy(() => optimizer.minimize(lossFn, true)!)
    await loss.data()
    loss.dispose()
    const cpu = process.cpuUsage(cpu0)
    return [performance.now() - t0, (cpu.user + cpu.system) / 1000] as const
  }
  await step() // the first step includes kernel set-up
  return { initialLoss, embedGradient, step }
}

// ===== roofline =====

const roofline = async (flops: number) => {
  const n = 512
  const chain = Math.max(1, Math.round(flops / (2 * n ** 3)))
  const g = Graph.make("roofline")
  const a = g.input("a", "float32", [n, n])
  // Independent products with distinct inputs: a chain would drift into denormals, and identical nodes would be
  // merged by onnxruntime's common-subexpression elimination.
  const products = Array.from({ length: chain }, (_, i) => g.op("MatMul", [a, g.input(`w${i}`, "float32", [n, n])]))
  g.node(chain === 1 ? "Identity" : "Sum", products, ["y"])
  g.output("y", "float32", [n, n])
  const session = await ort.InferenceSession.create(Graph.toModelBytes(g), {
    intraOpNumThreads: 2,
    interOpNumThreads: 1,
    extra: { session: { intra_op: { allow_spinning: "0" } } } // as the trainer runs
  })
  const scale = 1 / Math.sqrt(n)
  const w = new ort.Tensor("float32", Float32Array.from({ length: n * n }, (_, i) => Math.cos(i) * scale), [n, n])
  const feeds: Record<string, ort.Tensor> = {
    a: new ort.Tensor("float32", Float32Array.from({ length: n * n }, (_, i) => Math.sin(i) * scale), [n, n])
  }
  for (let i = 0; i < chain; i++) feeds[`w${i}`] = w
  await session.run(feeds)
  const step = async () => {
    const t0 = performance.now()
    await session.run(feeds)
    return performance.now() - t0
  }
  return { step, flops: chain * 2 * n ** 3 }
}

/** Per-step figures of one ORT learner across the interleaved rounds. */
interface Series {
  readonly fwdBwd: Array<number>
  readonly step: Array<number>
  readonly cpu: Array<number>
  readonly cores: Array<number>
  readonly critical: Array<number>
  /** tfjs step ÷ this learner's median step, per round. */
  readonly roundRatios: Array<number>
}

const series = (): Series => ({ fwdBwd: [], step: [], cpu: [], cores: [], critical: [], roundRatios: [] })

/** Four steps of `learner` in one round, recorded into `into` with the round's ratio against `tfjsMs`. */
const measureRound = <E>(
  learner: { readonly step: Effect.Effect<readonly [number, number, number, number], E> },
  into: Series,
  tfjsMs: number
) =>
  Effect.gen(function*() {
    const mine: Array<number> = []
    for (let k = 0; k < 4; k++) {
      const [fb, full, cpu, critical] = yield* learner.step
      into.critical.push(critical)
      into.fwdBwd.push(fb)
      into.step.push(full)
      into.cpu.push(cpu)
      into.cores.push(cpu / full)
      mine.push(full)
    }
    into.roundRatios.push(tfjsMs / median(mine))
  })

export default async (): Promise<BenchResult> => {
  const weights = Qwen2.initWeights(c, 1)
  const tfjs = await tfjsLearner(weights)
  const roof = await roofline(stepFlops)
  return Effect.runPromise(Effect.scoped(Effect.gen(function*() {
    const onnx = yield* ortLearner(weights, 2)
    const onnx1 = yield* ortLearner(weights, 1)
    const workers = yield* ortLearner(weights, 1, B, T, 2)
    // Interleave the engines so that they share the machine's (noisy, shared) load alike.
    const tfjsStep: Array<number> = [], tfjsCpu: Array<number> = [], roofMs: Array<number> = []
    const ort = series(), ort1 = series(), split = series()
    for (let round = 0; round < 10; round++) {
      const [t, tc] = yield* Effect.promise(tfjs.step)
      tfjsStep.push(t)
      tfjsCpu.push(tc)
      for (let k = 0; k < 3; k++) roofMs.push(yield* Effect.promise(roof.step))
      yield* measureRound(onnx, ort, t)
      yield* measureRound(onnx1, ort1, t)
      yield* measureRound(workers, split, t)
    }
    // The calculator demo's shape (shared/reference/demo-feasibility.md): B 16 × T 192 per step.
    const demo = yield* ortLearner(weights, 2, 16, 192)
    const demoWorkers = yield* ortLearner(weights, 1, 16, 192, 2)
    const demoMs: Array<number> = [], demoWorkersMs: Array<number> = []
    for (let k = 0; k < 5; k++) {
      demoMs.push((yield* demo.step)[1])
      demoWorkersMs.push((yield* demoWorkers.step)[1])
    }
    let diff = 0
    let scale = 0
    let workersDiff = 0
    for (let i = 0; i < onnx.embedGradient.length; i++) {
      diff = Math.max(diff, Math.abs(onnx.embedGradient[i]! - tfjs.embedGradient[i]!))
      workersDiff = Math.max(workersDiff, Math.abs(workers.embedGradient[i]! - tfjs.embedGradient[i]!))
      scale = Math.max(scale, Math.abs(tfjs.embedGradient[i]!))
    }
    const ortMs = median(ort.step), fbMs = median(ort.fwdBwd), tfjsMs = median(tfjsStep), rooflineMs = median(roofMs)
    const workersMs = median(split.step), workersFbMs = median(split.fwdBwd)
    const achieved = stepFlops / (fbMs / 1000) / 1e9
    const peak = roof.flops / (rooflineMs / 1000) / 1e9
    return {
      headline: {
        metric: "training tokens/s, ORT learner (workers 2, the CLI default) ÷ tfjs-wasm (median of 10 rounds)",
        value: median(split.roundRatios),
        target: 10,
        better: "higher" as const
      },
      loadAverage: readFileSync("/proc/loadavg", "utf8").trim(),
      workers2StepMs: workersMs,
      workers2ForwardBackwardMs: workersFbMs,
      workers2OptimStepMs: workersMs - workersFbMs,
      workers2TokensPerS: (N * 1000) / workersMs,
      workers2RatioOfMedians: tfjsMs / workersMs,
      workers2CpuMsPerStep: median(split.cpu),
      // CPU time ÷ wall time of a step: how many cores the process actually got (2 workers can use up to 2)
      workers2CoresUsed: median(split.cores),
      ortCoresUsed: median(ort.cores),
      // A model, not a measurement of wall time: the step on a machine with a free core per thread (see criticalPath)
      workers2CriticalPathMs: median(split.critical),
      ortCriticalPathMs: median(ort.critical),
      tfjsWasmCpuRatioToWorkers2CriticalPath: median(tfjsCpu) / median(split.critical),
      workers2RoundRatios: split.roundRatios,
      workers2SpeedupOverOneThread: ortMs / workersMs,
      workers2EmbedGradientMaxRelDiff: workersDiff / scale,
      demoShapeWorkers2StepMs: median(demoWorkersMs),
      preset: "tiny",
      batch: B,
      tokensPerRow: T,
      parameters: [...weights.values()].reduce((n, w) => n + w.length, 0),
      ortStepMs: ortMs,
      ortForwardBackwardMs: fbMs,
      ortAdamMs: ortMs - fbMs,
      ortTokensPerS: (N * 1000) / ortMs,
      ratioOfMedians: tfjsMs / ortMs,
      ortCpuMsPerStep: median(ort.cpu),
      tfjsWasmCpuMsPerStep: median(tfjsCpu),
      tokensPerCpuSecondRatio: median(tfjsCpu) / median(ort.cpu),
      roundRatios: ort.roundRatios,
      singleThreadRatio: median(ort.roundRatios),
      ortOneThreadStepMs: median(ort1.step),
      demoShapeStepMs: median(demoMs),
      oneThreadRatio: median(ort1.roundRatios),
      tfjsWasmStepMs: tfjsMs,
      tfjsWasmTokensPerS: (N * 1000) / tfjsMs,
      sameLoss: { ort: onnx.initialLoss, tfjs: tfjs.initialLoss },
      embedGradientMaxRelDiff: diff / scale,
      stepGflop: stepFlops / 1e9,
      achievedGflops: achieved,
      rooflineMatMulGflops: peak,
      fractionOfRoofline: achieved / peak
    }
  })).pipe(Effect.provide(NodeServices.layer)))
}
