/**
 * One LoRA learner step (forward + backward + AdamW of the adapters through `OnnxTrainer`, the base frozen) at
 * Qwen2.5-0.5B's shapes (all 24 layers unless `--layers`) or an embedded preset, in this process: prints one JSON
 * line with the base's float32 bytes, the RSS before the second step, its peak, the step times and tokens/s.
 *
 *   npx tsx scripts/lora-memory.ts [--layers 24] [--preset small|medium] [--batch 2] [--length 512] [--rank 16]
 *     [--workers 1]
 *
 * The peak over (base float32 bytes + activations) is the ratio, the activations taken as measured: what the
 * second step adds to the RSS before it (peak − RSS before step 2). Random weights; the SFT loss on every token;
 * rank `--rank` with alpha 2·rank on all seven projections. Not run in CI (the 0.5 B shapes need ≈ 10 GiB).
 *
 * On Linux also the PSS (`/proc/self/smaps_rollup`, sampled every 50 ms by a thread of its own, so also while a
 * session blocks the main thread): with `--workers` > 1 the workers map the base from one file
 * (`internal/frozenFile.ts`), and the RSS counts a mapped page once per mapping (per session), the PSS once.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { existsSync, readFileSync } from "node:fs"
import { Worker } from "node:worker_threads"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as Lora from "../src/Lora.ts"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Optimizer from "../src/Optimizer.ts"
import { microBatch, qwen25Width, weightsOf } from "./shapes.ts"

const GiB = 1024 ** 3

const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i === -1 ? fallback : Number(args[i + 1])
}
const preset = args.includes("--preset") ? args[args.indexOf("--preset") + 1] as ModelConfig.PresetName : undefined

const qwen25 = qwen25Width

const rssGiB = () => process.memoryUsage.rss() / GiB
const peakGiB = () => process.resourceUsage().maxRSS * 1024 / GiB

/** Rss, Pss, anonymous and file-backed PSS in GiB (Linux), now and their peaks since the last reset. */
interface Smaps {
  readonly rss: number
  readonly pss: number
  readonly anon: number
  readonly pssFile: number
}

const samplerCode = `
const { parentPort } = require("node:worker_threads")
const fs = require("node:fs")
const read = () => {
  const t = fs.readFileSync("/proc/self/smaps_rollup", "utf8")
  const kB = (k) => Number((new RegExp("^" + k + ":\\\\s+(\\\\d+)", "m").exec(t) || [0, 0])[1]) / 1048576
  return { rss: kB("Rss"), pss: kB("Pss"), anon: kB("Anonymous"), pssFile: kB("Pss_File") }
}
let peak = read()
setInterval(() => { const now = read(); for (const k in now) peak[k] = Math.max(peak[k], now[k]) }, 50)
parentPort.on("message", (m) => {
  const now = read()
  for (const k in now) peak[k] = Math.max(peak[k], now[k])
  parentPort.postMessage({ now, peak })
  if (m === "reset") peak = now
})
`

/** A sampler thread (none where there is no `/proc`): `ask("reset")` answers and restarts the peaks. */
const startSampler = () => {
  if (!existsSync("/proc/self/smaps_rollup")) return undefined
  const worker = new Worker(samplerCode, { eval: true })
  worker.unref()
  const ask = (m: "get" | "reset") =>
    Effect.promise(() =>
      new Promise<{ readonly now: Smaps; readonly peak: Smaps }>((resolve) => {
        worker.once("message", resolve)
        worker.postMessage(m)
      })
    )
  return { ask, stop: () => worker.terminate() }
}

/** The machine's memory in use and its page cache (GiB), as \`free\` reads them from /proc/meminfo. */
const meminfo = () => {
  if (!existsSync("/proc/meminfo")) return undefined
  const t = readFileSync("/proc/meminfo", "utf8")
  const kB = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+)`, "m").exec(t)?.[1] ?? 0) / 1048576
  return { used: kB("MemTotal") - kB("MemAvailable"), cached: kB("Cached") }
}

const main = Effect.gen(function*() {
  const config = preset === undefined ? qwen25(flag("layers", 24)) : ModelConfig.presets[preset]
  const rank = flag("rank", 16)
  const lora: Lora.Config = { rank, alpha: 2 * rank, targets: [...Lora.moduleNames] }
  const batch = flag("batch", 2), length = flag("length", 512), workers = flag("workers", 1)
  const base = weightsOf(config)
  const baseBytes = [...base.values()].reduce((n, w) => n + w.byteLength, 0)
  const afterBase = rssGiB()
  const sampler = startSampler()
  const memory: Array<unknown> = [meminfo()]
  const model = OnnxTrainer.qwen2Lora(config, lora, base, preset ?? "qwen2.5-0.5b-shapes")
  const trainer = yield* OnnxTrainer.make({
    model,
    weights: base,
    loss: Loss.sft,
    optimizer: Optimizer.defaultConfig,
    schedule: LrSchedule.constant(1e-4),
    workers
  })
  const afterMake = rssGiB()
  const mb = microBatch(config, batch, length)
  const times: Array<number> = [], cpu: Array<number> = [], before: Array<number> = []
  const smaps: Array<unknown> = []
  for (let s = 0; s < 2; s++) {
    before.push(rssGiB())
    if (sampler !== undefined) smaps.push({ before: (yield* sampler.ask("reset")).now })
    memory.push(meminfo())
    const t0 = performance.now(), c0 = process.cpuUsage()
    yield* trainer.trainer.forwardBackward(mb)
    yield* trainer.trainer.optimStep
    times.push((performance.now() - t0) / 1000)
    const c1 = process.cpuUsage(c0)
    cpu.push((c1.user + c1.system) / 1e6)
    if (sampler !== undefined) Object.assign(smaps[s]!, { peak: (yield* sampler.ask("get")).peak })
  }
  memory.push(meminfo())
  if (sampler !== undefined) yield* Effect.promise(() => sampler.stop())
  const peak = peakGiB()
  const activations = peak - before[1]!
  const trained = model.parameters.reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0)
  console.log(JSON.stringify({
    shape: preset ?? `qwen2.5-0.5b (${config.numHiddenLayers} layers)`,
    tokens: batch * length,
    workers,
    baseParams: baseBytes / 4,
    trainedParams: trained,
    baseGiB: baseBytes / GiB,
    afterBaseGiB: afterBase,
    afterMakeGiB: afterMake,
    beforeStepGiB: before,
    peakGiB: peak,
    activationsGiB: activations,
    ratio: peak / (baseBytes / GiB + activations),
    stepS: times,
    cpuS: cpu,
    tokensPerS: (batch * length) / times[1]!,
    // Per step: smaps_rollup before it and its peaks during it (GiB); then /proc/meminfo at the start, before each
    // step and at the end.
    smaps,
    meminfo: memory
  }))
}).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

Effect.runPromise(main).catch((e) => {
  console.error(e)
  process.exit(1)
})
