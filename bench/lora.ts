/**
 * `npm run bench -- lora`: what LoRA costs and saves, each figure against full fine-tuning measured in the same run.
 *
 * - **Learner step**: one step (forward, backward, AdamW through `OnnxTrainer`) of the `small` preset and of the
 *   `medium` preset cut to 4 layers, full fine-tuning and LoRA (rank 16 on all seven projections), each in a child
 *   process of its own so that its peak RSS is its own; the second step's wall and CPU time (the first compiles
 *   the session).
 * - **Publication**: a policy version to `agentfly serve` on loopback: the LoRA adapter (a PEFT folder written, then
 *   `POST /v1/load_lora_adapter`) against the full weights (`PUT /v1/weights`), bytes and milliseconds, median of 5.
 *
 * Headline: LoRA step time ÷ full fine-tuning step time at the cut `medium` shape (target ≤ 1: LoRA not slower).
 *
 *   npm run bench -- lora            (LORA_BENCH_BATCH / LORA_BENCH_LENGTH change the micro-batch, default 2 × 256)
 */
import { NodeServices } from "@effect/platform-node"
import { Clock, Effect, FileSystem } from "effect"
import { spawnSync } from "node:child_process"
import { fileURLToPath } from "node:url"
import * as AdapterSync from "../actors/AdapterSync.ts"
import * as OpenAiServer from "../actors/OpenAiServer.ts"
import { make as makeEngine, PolicyEngine } from "../actors/PolicyEngine.ts"
import * as WeightsPut from "../actors/internal/weightsPut.ts"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as Lora from "../src/Lora.ts"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Optimizer from "../src/Optimizer.ts"
import { microBatch } from "../scripts/shapes.ts"
import type { BenchResult } from "./run.ts"

const GiB = 1024 ** 3
const all: Lora.Config = { rank: 16, alpha: 32, targets: [...Lora.moduleNames] }
const batch = Number(process.env["LORA_BENCH_BATCH"] ?? 2)
const length = Number(process.env["LORA_BENCH_LENGTH"] ?? 256)

interface StepFigures {
  readonly preset: string
  readonly mode: "full" | "lora"
  readonly baseParams: number
  readonly trainedParams: number
  readonly peakGiB: number
  readonly stepS: number
  readonly cpuS: number
}

/**
 * The shapes: the `small` preset, and the `medium` preset cut to 4 of its 12 layers (width 768, 38 M parameters),
 * so that full fine-tuning stays under the 2 GiB a process may take on the shared machines this runs on.
 */
const shapes: Record<string, ModelConfig.ModelConfig> = {
  small: ModelConfig.presets.small,
  medium4: { ...ModelConfig.presets.medium, numHiddenLayers: 4 }
}

/** One (shape, mode) in this process: prints its figures as one JSON line. */
const oneStep = (preset: string, mode: "full" | "lora") =>
  Effect.gen(function*() {
    const config = shapes[preset]!
    const base = Qwen2.initWeights(config, 1)
    const model = mode === "full" ? OnnxTrainer.qwen2(config) : OnnxTrainer.qwen2Lora(config, all, base, preset)
    const trainer = yield* OnnxTrainer.make({
      model,
      weights: base,
      loss: Loss.sft,
      optimizer: Optimizer.defaultConfig,
      schedule: LrSchedule.constant(1e-4),
      intraOpThreads: 1
    })
    const mb = microBatch(config, batch, length)
    let stepS = 0, cpuS = 0
    for (let s = 0; s < 2; s++) {
      const t0 = performance.now(), c0 = process.cpuUsage()
      yield* trainer.trainer.forwardBackward(mb)
      yield* trainer.trainer.optimStep
      const c1 = process.cpuUsage(c0)
      stepS = (performance.now() - t0) / 1000
      cpuS = (c1.user + c1.system) / 1e6
    }
    const count = (ps: ReadonlyArray<{ readonly shape: ReadonlyArray<number> }>) =>
      ps.reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0)
    const figures: StepFigures = {
      preset,
      mode,
      baseParams: count(Qwen2.parameters(config)),
      trainedParams: count(model.parameters),
      peakGiB: process.resourceUsage().maxRSS * 1024 / GiB,
      stepS,
      cpuS
    }
    console.log(JSON.stringify(figures))
  }).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

const stepIn = (preset: string, mode: string): StepFigures => {
  const self = fileURLToPath(import.meta.url)
  const child = spawnSync(process.execPath, [...process.execArgv, self, "--step", preset, mode], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
    env: process.env
  })
  const line = child.stdout.trim().split("\n").at(-1) ?? ""
  if (child.status !== 0 || !line.startsWith("{")) throw new Error(`${preset}/${mode} failed: ${child.status}`)
  return JSON.parse(line) as StepFigures
}

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/** Adapter vs full-weights publication to one `agentfly serve` on loopback. */
const publication = (preset: ModelConfig.PresetName) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const root = yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-bench-lora-" })
    yield* ModelFolder.init(`${root}/model`, { preset, seed: 1 })
    const folder = yield* ModelFolder.load(`${root}/model`)
    const engine = yield* makeEngine({ config: folder.config, weights: folder.weights })
    const server = yield* OpenAiServer.make(folder, {
      acceptWeights: {},
      loraBase: folder.weights,
      maxBodyBytes: 1 << 30
    }).pipe(Effect.provideService(PolicyEngine, engine))
    const adapter = Lora.init(folder.config, all)
    const adapterRuns: Array<AdapterSync.Publication> = []
    for (let v = 1; v <= 5; v++) {
      adapterRuns.push(yield* AdapterSync.publish({
        urls: [server.baseUrl],
        dir: `${root}/adapters`,
        name: "policy",
        version: v,
        model: folder.config,
        lora: all,
        adapter,
        baseModel: `${root}/model`
      }))
    }
    const fullMs: Array<number> = []
    let fullBytes = 0
    for (let v = 1; v <= 5; v++) {
      const t0 = yield* Clock.currentTimeMillis
      const bytes = WeightsPut.serialize(Qwen2.parameters(folder.config), folder.weights) as Uint8Array
      const outcome = yield* Effect.promise(() =>
        WeightsPut.put(server.baseUrl, bytes, { version: v, runId: "bench", timeoutMs: 120_000, token: undefined })
      )
      if (outcome !== undefined) throw new Error(`PUT /v1/weights: ${JSON.stringify(outcome)}`)
      fullMs.push((yield* Clock.currentTimeMillis) - t0)
      fullBytes = bytes.byteLength
    }
    return {
      preset,
      adapterBytes: adapterRuns[0]!.bytes,
      adapterMs: median(adapterRuns.map((p) => p.millis)),
      fullBytes,
      fullMs: median(fullMs)
    }
  }).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

export default async (): Promise<BenchResult> => {
  const steps: Array<StepFigures> = []
  for (const preset of Object.keys(shapes)) {
    for (const mode of ["full", "lora"]) steps.push(stepIn(preset, mode))
  }
  const ratio = (preset: string, key: "stepS" | "cpuS" | "peakGiB") =>
    steps.find((s) => s.preset === preset && s.mode === "lora")![key] /
    steps.find((s) => s.preset === preset && s.mode === "full")![key]
  const publications = [await Effect.runPromise(publication("small"))]
  for (const s of steps) {
    console.log(
      `${s.preset.padEnd(6)} ${s.mode.padEnd(4)} trained ${s.trainedParams} of ${s.baseParams} params  ` +
        `peak ${s.peakGiB.toFixed(2)} GiB  step ${s.stepS.toFixed(2)} s (cpu ${s.cpuS.toFixed(2)} s)`
    )
  }
  for (const p of publications) {
    console.log(
      `${p.preset}: adapter ${p.adapterBytes} B in ${p.adapterMs} ms; full weights ${p.fullBytes} B in ${p.fullMs} ms`
    )
  }
  return {
    headline: {
      metric: "LoRA step time / full FT step time (medium, 4 layers)",
      value: ratio("medium4", "stepS"),
      target: 1,
      better: "lower"
    },
    microBatch: `${batch} x ${length} tokens, 1 intra-op thread`,
    lora: all,
    steps,
    ratios: {
      small: { stepTime: ratio("small", "stepS"), cpuTime: ratio("small", "cpuS"), peakRss: ratio("small", "peakGiB") },
      medium4: {
        stepTime: ratio("medium4", "stepS"),
        cpuTime: ratio("medium4", "cpuS"),
        peakRss: ratio("medium4", "peakGiB")
      }
    },
    publications
  }
}

const at = process.argv.indexOf("--step")
if (at !== -1) {
  Effect.runPromise(oneStep(process.argv[at + 1]!, process.argv[at + 2] as "full" | "lora"))
    .catch((e) => {
      console.error(e)
      process.exit(1)
    })
}
