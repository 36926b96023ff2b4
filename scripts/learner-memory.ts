/**
 * One learner step (forward + backward + AdamW through `OnnxTrainer`) at Qwen2.5-0.5B's width (vocab 151,936,
 * hidden 896, 14 heads, 2 KV heads, intermediate 4,864, q/k/v biases, tied head) with few layers, each shape in a
 * child process of its own so that its peak RSS is its own. Prints, per shape: parameters, peak RSS, bytes per
 * parameter, the RSS after each phase, and the time of the first and second step (the first compiles the session).
 *
 *   npx tsx scripts/learner-memory.ts [layers…] [--batch 4] [--length 512] [--workers 1] [--recompute]
 *     [--head-chunk tokens]   (0: the plain head)   [--preset small|medium]   (an embedded preset: one run)
 *     [--marks]   (phase boundaries on stderr with the wall clock, to line up with an outside RSS trace)
 *     [--moments float32|bfloat16]   (AdamW's moments' precision, `OnnxTrainer.Options.moments`)
 *
 * Not run in CI (it needs several GiB). Random weights; the loss is the SFT loss on every token.
 *
 * Measured before the changes of issue 41 point 5 (2 cores, 4 × 512 tokens, 1 worker, onnxruntime's arena off):
 *
 *   layers  params   peak RSS  bytes/param  step 1  step 2   after make  after step 1
 *        1   151 M   9.67 GiB     68.8    13.51 s  17.21 s   1.30 GiB   3.69 GiB
 *        2   166 M  10.21 GiB     66.1    28.46 s  18.12 s   1.40 GiB   4.00 GiB
 *        4   196 M  11.36 GiB     62.3    21.61 s  38.14 s   1.62 GiB   4.78 GiB
 *
 * (step times vary 2× with the load of the shared machine).
 *
 * After issue 41 point 5's changes (chunked output head, the embedding's two gradients summed in place, the first
 * micro-batch's gradients written into the accumulator), same settings, a machine at load 7–9 (wall times mean little;
 * `cpu` is the process's CPU time for step 2):
 *
 *   layers  params   peak RSS  bytes/param  step 2 cpu   (plain head, --head-chunk 0)
 *        1   151 M   4.64 GiB     33.0       29.4 s      9.13 GiB, 64.9 bytes/param, 21.6 s cpu
 *        2   166 M   5.32 GiB     34.4       31.3 s
 *        4   196 M   6.50 GiB     35.7       34.6 s
 *   small    4 M    0.81 GiB    223.5        1.2 s       (--preset small: the process's 0.3 GiB floor dominates)
 *   medium 104 M    5.23 GiB     53.9       16.7 s       (--preset medium, vocabulary 288: activations dominate)
 *
 * Each extra layer adds ≈ 0.62 GiB (0.22 GiB of weights, gradients and moments, ≈ 0.4 GiB of activations at 2,048
 * tokens). The chunked head costs one more [tokens × vocab × hidden] product (its logits recomputed in the
 * backward): 1.36× the CPU time at one layer. `--recompute` (activation recompute) does not yet lower the peak
 * (medium: 5.85 GiB, 1.3× CPU). Every extra layer (14.9 M parameters) adds ≈ 0.57 GiB
 * (≈ 41 bytes a parameter); the 151,936-wide head alone costs ≈ 8 GiB at 2,048 tokens (logits, LogSoftmax, its
 * exponent for the entropy and their gradients are 1.16 GiB each).
 *
 * AdamW's moments in bfloat16 (`--moments bfloat16`, 2026-12-07, 12 layers, 2 × 512 tokens): 8.14 → 6.97 GiB (27.8 →
 * 23.8 bytes a parameter), 21.8 → 24.7 s CPU; with `--recompute` and `MALLOC_MMAP_THRESHOLD_=1048576` 5.54 GiB (18.9).
 * BENCHMARKS.md, "real shapes", has the table.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { spawnSync } from "node:child_process"
import { fileURLToPath } from "node:url"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Optimizer from "../src/Optimizer.ts"
import { microBatch, qwen25Width, weightsOf } from "./shapes.ts"

const GiB = 1024 ** 3

export { qwen25Width }

const rssGiB = () => process.memoryUsage.rss() / GiB
/** With `--marks`, a phase boundary on stderr with the wall clock, to line up with an outside RSS trace. */
const mark = (what: string) => {
  if (!process.argv.includes("--marks")) return
  console.error(`mark ${(Date.now() / 1000).toFixed(2)} ${what} ${rssGiB().toFixed(2)}`)
}
const peakGiB = () => process.resourceUsage().maxRSS * 1024 / GiB

interface Flags {
  readonly batch: number
  readonly length: number
  readonly workers: number
  readonly recompute: boolean
  readonly moments: Optimizer.Precision
  readonly headChunk: number | undefined
  /** An embedded preset instead of Qwen2.5's width. */
  readonly preset: ModelConfig.PresetName | undefined
}

/** One shape, in this process: prints one JSON line. */
const one = (layers: number, flags: Flags) =>
  Effect.gen(function*() {
    const config = flags.preset === undefined ? qwen25Width(layers) : ModelConfig.presets[flags.preset]
    const weights = weightsOf(config)
    const params = [...weights.values()].reduce((n, w) => n + w.length, 0)
    const trainer = yield* OnnxTrainer.make({
      model: OnnxTrainer.qwen2(config),
      weights,
      loss: Loss.sft,
      optimizer: Optimizer.defaultConfig,
      schedule: LrSchedule.constant(1e-5),
      workers: flags.workers,
      ...(flags.recompute ? { recompute: true } : {}),
      moments: flags.moments,
      ...(flags.headChunk === undefined ? {} : { headChunk: flags.headChunk })
    })
    weights.clear() // the trainer copied them
    const afterMake = rssGiB()
    mark("made")
    const mb = microBatch(config, flags.batch, flags.length)
    const times: Array<number> = []
    const cpu: Array<number> = []
    const afterStep: Array<number> = []
    for (let s = 0; s < 2; s++) {
      const t0 = performance.now()
      const c0 = process.cpuUsage()
      mark(`step ${s} start`)
      yield* trainer.trainer.forwardBackward(mb)
      mark(`step ${s} forwardBackward`)
      yield* trainer.trainer.optimStep
      mark(`step ${s} optimStep`)
      times.push((performance.now() - t0) / 1000)
      const c1 = process.cpuUsage(c0)
      cpu.push((c1.user + c1.system) / 1e6)
      afterStep.push(rssGiB())
    }
    const peak = peakGiB()
    console.log(JSON.stringify({
      layers: config.numHiddenLayers,
      params,
      peakGiB: peak,
      bytesPerParam: peak * GiB / params,
      stepS: times,
      cpuS: cpu,
      afterMakeGiB: afterMake,
      afterStepGiB: afterStep
    }))
  }).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i === -1 ? fallback : Number(args[i + 1])
}
const flags: Flags = {
  batch: flag("batch", 4),
  length: flag("length", 512),
  workers: flag("workers", 1),
  recompute: args.includes("--recompute"),
  moments: args.includes("--moments") ? args[args.indexOf("--moments") + 1] as Optimizer.Precision : "float32",
  headChunk: args.includes("--head-chunk") ? flag("head-chunk", 0) : undefined,
  preset: args.includes("--preset") ? args[args.indexOf("--preset") + 1] as ModelConfig.PresetName : undefined
}
if (flags.moments !== "float32" && flags.moments !== "bfloat16") {
  console.error(`--moments must be float32 or bfloat16, got ${flags.moments}`)
  process.exit(2)
}
const oneLayer = args.indexOf("--one")
if (oneLayer !== -1) {
  Effect.runPromise(one(Number(args[oneLayer + 1]), flags)).catch((e) => {
    console.error(e)
    process.exit(1)
  })
} else {
  const layers = args.filter((a, i) => /^\d+$/.test(a) && !args[i - 1]?.startsWith("--")).map(Number)
  const self = fileURLToPath(import.meta.url)
  const g = (x: number) => x.toFixed(2).padStart(6)
  const recompute = flags.recompute ? ", recompute" : ""
  const malloc = process.env["MALLOC_MMAP_THRESHOLD_"] === undefined
    ? ""
    : `, MALLOC_MMAP_THRESHOLD_=${process.env["MALLOC_MMAP_THRESHOLD_"]}`
  console.log(
    `${flags.batch} × ${flags.length} tokens, ${flags.workers} worker(s)${recompute}, ${flags.moments} moments${malloc}`
  )
  console.log("layers  params   peak RSS  bytes/param  step 1  step 2   after make  after step 1")
  for (const n of layers.length > 0 ? layers : [1, 2, 4]) {
    const child = spawnSync(process.execPath, [...process.execArgv, self, ...args, "--one", String(n)], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "inherit"]
    })
    const line = child.stdout.trim().split("\n").at(-1) ?? ""
    if (child.status !== 0 || !line.startsWith("{")) {
      console.log(`${String(n).padStart(6)}  failed (status ${child.status}, signal ${child.signal})`)
      continue
    }
    const r = JSON.parse(line)
    console.log(
      `${String(r.layers).padStart(6)}  ${(r.params / 1e6).toFixed(0).padStart(4)} M ${g(r.peakGiB)} GiB ` +
        `${r.bytesPerParam.toFixed(1).padStart(8)}   ${g(r.stepS[0])} s ${g(r.stepS[1])} s ` +
        `${g(r.afterMakeGiB)} GiB ${g(r.afterStepGiB[0])} GiB   cpu ${g(r.cpuS[0])} s ${g(r.cpuS[1])} s`
    )
  }
}
