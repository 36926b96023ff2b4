/**
 * `npm run bench -- memory`: peak resident memory of a training run against model size, so that a user can tell
 * what a bigger model needs.
 *
 * For each preset (`tiny` ≈ 0.66 M parameters, `small`, `medium` ≈ 104 M) a short calculator run goes through
 * `agentfly train` in a child process: warm-up (SFT) steps with a greedy validation check, RL steps, and evaluations
 * before and after. Every record of its `metrics.jsonl` carries the peak RSS since the record before
 * (`perf/peak_rss_mb`), so each phase's peak is the largest over its records.
 *
 * The models start untrained, so every calculator reward is 0 and GRPO would skip every step (no signal, nothing
 * for the learner to do). The runs therefore use `reinforce++` with a small entropy bonus: every micro-batch of every
 * step then goes through forward and backward, as in a step where every group has signal: the learner's worst case.
 * The tiny run otherwise has the demo's shapes (8 groups × 8 chains, 96 new tokens, 256-token context, micro-batches
 * of 16 × 256 tokens, 2 learner workers); the larger presets take fewer, shorter chains to fit a few steps in
 * minutes on two cores.
 *
 * Speed: the trainer's sessions now run without onnxruntime's CPU memory arena (`OnnxTrainer.Options.memoryArena`,
 * the main saving). {@link arenaSpeed} times learner steps of the demo's shape (16 × 256-token micro-batches of four
 * lengths, 2 workers) with and without it, in interleaved rounds in this process.
 *
 * Headline: the tiny preset's RL-phase peak RSS in MB (target ≤ 1024).
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { spawnSync } from "node:child_process"
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { loadavg, tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Optimizer from "../src/Optimizer.ts"
import * as Packing from "../src/Packing.ts"
import * as Sampling from "../src/Sampling.ts"
import type { BenchResult } from "./run.ts"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")

interface Shape {
  readonly preset: ModelConfig.PresetName
  readonly warmupSteps: number
  readonly warmupBatch: number
  readonly rlSteps: number
  readonly groupsPerStep: number
  readonly numChains: number
  readonly maxNewTokens: number
  readonly microBatchSize: number
  readonly evalSize: number
}

const shapes: ReadonlyArray<Shape> = [
  {
    preset: "tiny",
    warmupSteps: 20,
    warmupBatch: 16,
    rlSteps: 6,
    groupsPerStep: 8,
    numChains: 8,
    maxNewTokens: 96,
    microBatchSize: 16,
    evalSize: 50
  },
  {
    preset: "small",
    warmupSteps: 10,
    warmupBatch: 16,
    rlSteps: 4,
    groupsPerStep: 4,
    numChains: 8,
    maxNewTokens: 96,
    microBatchSize: 16,
    evalSize: 20
  },
  {
    preset: "medium",
    warmupSteps: 2,
    warmupBatch: 4,
    rlSteps: 2,
    groupsPerStep: 1,
    numChains: 4,
    maxNewTokens: 16,
    microBatchSize: 4,
    evalSize: 4
  }
]

const configOf = (shape: Shape, dir: string, data: string) => ({
  name: `memory-${shape.preset}`,
  seed: 1,
  output: join(dir, "run"),
  model: { path: join(dir, "model"), preset: shape.preset, initSeed: 1 },
  data: { train: join(data, "train.jsonl"), eval: join(data, "heldout.jsonl") },
  task: "calculator",
  agent: {
    systemPrompt: "Use the calculator tool.",
    renderTools: false,
    maxTurns: 2,
    numChains: shape.numChains,
    maxNewTokens: shape.maxNewTokens,
    maxContextTokens: 256,
    temperature: 1
  },
  warmup: {
    data: join(data, "demos.jsonl"),
    steps: shape.warmupSteps,
    lr: 0.002,
    warmupSteps: 1,
    batchSize: shape.warmupBatch,
    // One greedy validation check, at the last but one step: the warm-up's sampler is measured too.
    stopAt: {
      data: join(data, "validation.jsonl"),
      accuracy: 1,
      every: Math.max(1, shape.warmupSteps - 1),
      from: Math.max(1, shape.warmupSteps - 1),
      size: shape.evalSize
    }
  },
  algorithm: {
    steps: shape.rlSteps,
    groupsPerStep: shape.groupsPerStep,
    lr: 0.0003,
    microBatchSize: shape.microBatchSize,
    advantage: "reinforce++",
    entropyCoef: 0.001
  },
  mode: "sync",
  eval: { every: shape.rlSteps, size: shape.evalSize },
  checkpoint: { every: shape.rlSteps },
  learner: { workers: 2 }
})

const median = (xs: ReadonlyArray<number>) =>
  xs.length === 0 ? Number.NaN : [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

interface Record {
  readonly phase: "warmup" | "train" | "eval"
  readonly step: number
  readonly figures: { readonly [key: string]: number }
}

const measure = (shape: Shape, data: string) => {
  const dir = mkdtempSync(join(tmpdir(), `bench-memory-${shape.preset}-`))
  const configPath = join(dir, "config.json")
  writeFileSync(configPath, JSON.stringify(configOf(shape, dir, data), null, 2))
  const started = performance.now()
  // The command itself, as a user runs it: its shebang sets MALLOC_ARENA_MAX (`node bin/agentfly.mjs` would not).
  const child = spawnSync(join(root, "bin/agentfly.mjs"), ["train", configPath], {
    cwd: root,
    encoding: "utf8",
    maxBuffer: 64 * 2 ** 20
  })
  const seconds = (performance.now() - started) / 1000
  if (child.status !== 0) {
    throw new Error(`${shape.preset}: agentfly train exited with ${child.status}\n${child.stderr}\n${child.stdout}`)
  }
  const records: Array<Record> = readFileSync(join(dir, "run", "metrics.jsonl"), "utf8").trim().split("\n")
    .map((line) => JSON.parse(line))
  rmSync(dir, { recursive: true, force: true })
  const peak = (phase: Record["phase"]) =>
    Math.max(...records.filter((r) => r.phase === phase).map((r) => r.figures["perf/peak_rss_mb"] ?? Number.NaN))
  const stepSeconds = (phase: Record["phase"]) =>
    median(records.filter((r) => r.phase === phase && r.step > 1).map((r) => r.figures["time/step_s"]!))
  const parameters = Qwen2.parameters(ModelConfig.presets[shape.preset])
    .reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0)
  const result = {
    preset: shape.preset,
    parameters,
    // Weights, Adam's two moments and the gradient accumulator, float32: the floor any trainer of this model needs.
    optimizerStateMb: Math.round((parameters * 4 * 4) / 2 ** 20),
    warmupPeakMb: peak("warmup"),
    rlPeakMb: peak("train"),
    evalPeakMb: peak("eval"),
    warmupStepS: stepSeconds("warmup"),
    rlStepS: stepSeconds("train"),
    runS: seconds,
    shape
  }
  console.log(
    `  ${shape.preset} (${(parameters / 1e6).toFixed(2)} M parameters): peak RSS warm-up ${result.warmupPeakMb} MB, ` +
      `RL ${result.rlPeakMb} MB, eval ${result.evalPeakMb} MB; run ${seconds.toFixed(0)} s`
  )
  return result
}

/**
 * Learner steps with and without onnxruntime's CPU arena, interleaved: per round, each trainer takes one optimiser
 * step over four micro-batches (16 × 256, 21 × 192, 32 × 128, 64 × 64 tokens: the shapes an RL step of the demo
 * packs), in alternating order. Returns the median step of each and the median of the per-round ratios.
 */
const arenaSpeed = (rounds: number) =>
  Effect.gen(function*() {
    const c = { ...ModelConfig.presets.tiny, vocabSize: 300 }
    const weights = Qwen2.initWeights(c, 1)
    const trainerWith = (memoryArena: boolean) =>
      OnnxTrainer.make({
        model: OnnxTrainer.qwen2(c),
        weights,
        loss: Loss.grpo,
        optimizer: Optimizer.defaultConfig,
        schedule: LrSchedule.constant(1e-4),
        workers: 2,
        intraOpThreads: 1,
        memoryArena
      })
    const r = Sampling.rng(7)
    const batches = [256, 192, 128, 64].map((length) => {
      const sequences = Array.from({ length: 16 }, () => {
        const n = length - Math.floor(r.next() * 12)
        const tokenIds = Int32Array.from({ length: n }, () => Math.floor(r.next() * 280))
        return {
          tokenIds,
          lossMask: Uint8Array.from(tokenIds, (_, i) => (i > n / 3 ? 1 : 0)),
          samplerLogprobs: Float32Array.from(tokenIds, () => -1 - r.next()),
          advantages: Float32Array.from(tokenIds, () => r.next() - 0.5)
        }
      })
      return Packing.packUnsafe(sequences, { tokenBudget: 16 * 256, aggregation: "seq-mean-token-mean", padRows: true })
        .microBatches
    }).flat()
    const on = yield* trainerWith(true)
    const off = yield* trainerWith(false)
    const step = (t: typeof on) =>
      Effect.gen(function*() {
        const t0 = performance.now()
        for (const mb of batches) yield* t.trainer.forwardBackward(mb)
        yield* t.trainer.optimStep
        return performance.now() - t0
      })
    yield* step(on) // compiles every shape
    yield* step(off)
    const onMs: Array<number> = []
    const offMs: Array<number> = []
    for (let round = 0; round < rounds; round++) {
      const [first, second] = round % 2 === 0 ? [on, off] : [off, on]
      const a = yield* step(first)
      const b = yield* step(second)
      onMs.push(first === on ? a : b)
      offMs.push(first === on ? b : a)
    }
    return {
      rounds,
      microBatches: batches.map((mb) => `${mb.batch}x${mb.length}`),
      arenaStepMs: median(onMs),
      noArenaStepMs: median(offMs),
      noArenaOverArenaRatio: median(offMs.map((x, i) => x / onMs[i]!)),
      roundRatios: offMs.map((x, i) => x / onMs[i]!)
    }
  }).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

export default async (): Promise<BenchResult> => {
  const loadBefore = loadavg()[0]!
  const data = mkdtempSync(join(tmpdir(), "bench-memory-data-"))
  mkdirSync(data, { recursive: true })
  const generated = spawnSync(
    process.execPath,
    ["--import", "tsx", join(root, "examples/calculator/generate.ts"), data, "12345"],
    { cwd: root, encoding: "utf8" }
  )
  if (generated.status !== 0) throw new Error(`generating the calculator data failed\n${generated.stderr}`)
  const only = process.env["BENCH_MEMORY_PRESETS"]?.split(",")
  const runs = shapes.filter((s) => only === undefined || only.includes(s.preset)).map((s) => measure(s, data))
  rmSync(data, { recursive: true, force: true })
  const tiny = runs.find((r) => r.preset === "tiny")
  const speed = process.env["BENCH_MEMORY_SPEED"] === "0"
    ? undefined
    : await Effect.runPromise(arenaSpeed(Number(process.env["BENCH_MEMORY_ROUNDS"] ?? 12)))
  if (speed !== undefined) {
    console.log(
      `  learner step, demo shapes: ${speed.noArenaStepMs.toFixed(0)} ms without the arena, ` +
        `${speed.arenaStepMs.toFixed(0)} ms with it (ratio of rounds ${speed.noArenaOverArenaRatio.toFixed(3)})`
    )
  }
  return {
    headline: {
      metric: "peak RSS of the tiny preset's RL phase (MB; calculator demo shapes, every step through the learner)",
      value: tiny?.rlPeakMb ?? Number.NaN,
      target: 1024,
      better: "lower"
    },
    loadAverage: { before: loadBefore, after: loadavg()[0]! },
    runs,
    speed
  }
}
