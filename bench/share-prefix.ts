/**
 * `npm run bench -- share-prefix`: the learner's forward and backward over one GRPO step's trajectories (8 groups
 * × 8 chains), each chain in a row of its own against a group's chains sharing their prompt in rows
 * (`learner.sharePrefix`, `Packing.Options.sharePrefix`), on the tiny preset with the trainer as `agentfly train`
 * configures it (2 workers, a budget of 16 × 256 tokens a micro-batch, rows padded to the capacity).
 *
 * Two shapes of data: the calculator demo's (a prompt of ≈ 79 tokens, chains of ≈ 123 more: what its runs record)
 * and a long prompt (≈ 300 tokens: a system prompt with tool schemas, chains of ≈ 100). Random token ids: the cost
 * depends on shapes only. Each variant's micro-batches are compiled before timing; rounds alternate the variants.
 *
 * Headline: the long prompt's time a step without ÷ with sharing. The target 1 is "never slower" where sharing
 * is meant to help; no issue sets a figure.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { loadavg } from "node:os"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Optimizer from "../src/Optimizer.ts"
import * as Packing from "../src/Packing.ts"
import * as Sampling from "../src/Sampling.ts"
import type { BenchResult } from "./run.ts"

const ROUNDS = 8
const c = ModelConfig.presets.tiny
const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/** 8 groups of 8 chains: prompts of `prompt` to `prompt` + 9 tokens, chains' own tokens `rest` ± 30. */
const step = (prompt: number, rest: number): Array<Packing.Sequence> => {
  const r = Sampling.rng(1)
  const token = () => Math.floor(r.next() * 250)
  const prompts = Array.from({ length: 8 }, () => Array.from({ length: prompt + Math.floor(r.next() * 10) }, token))
  return prompts.flatMap((p) =>
    Array.from({ length: 8 }, (_, m) => {
      const ids = [...p, ...Array.from({ length: rest - 30 + Math.floor(r.next() * 60) }, token)]
      return {
        tokenIds: Int32Array.from(ids),
        lossMask: Uint8Array.from(ids, (_, t) => (t >= p.length ? 1 : 0)),
        samplerLogprobs: Float32Array.from(ids, () => -1),
        advantages: Float32Array.from(ids, () => (m % 2 === 0 ? 1 : -1))
      }
    })
  )
}

const figures = Effect.gen(function*() {
  const loadBefore = loadavg()[0]!
  const trainer = yield* OnnxTrainer.make({
    model: OnnxTrainer.qwen2(c),
    workers: 2,
    weights: Qwen2.initWeights(c, 1),
    loss: Loss.grpo,
    optimizer: Optimizer.defaultConfig,
    schedule: LrSchedule.constant(1e-3)
  })
  const shapes = { demo: step(79, 123), longPrompt: step(300, 100) }
  const result: Record<string, unknown> = {}
  for (const [name, sequences] of Object.entries(shapes)) {
    const pack = (share: boolean) =>
      Packing.pack(sequences, {
        tokenBudget: 16 * 256,
        maxLength: c.maxPositionEmbeddings,
        aggregation: "token-mean",
        padRows: true,
        sharePrefix: share
      })
    const variants = { rows: yield* pack(false), shared: yield* pack(true) }
    const run = (p: Packing.Packed) =>
      Effect.gen(function*() {
        const t0 = performance.now()
        for (const mb of p.microBatches) yield* trainer.trainer.forwardBackward(mb)
        yield* trainer.trainer.discard
        return performance.now() - t0
      })
    yield* run(variants.rows) // compiles every shape
    yield* run(variants.shared)
    const times = { rows: [] as Array<number>, shared: [] as Array<number> }
    for (let i = 0; i < ROUNDS; i++) {
      times.rows.push(yield* run(variants.rows))
      times.shared.push(yield* run(variants.shared))
    }
    const describe = (p: Packing.Packed) => ({
      microBatches: p.microBatches.map((mb) =>
        `${mb.batch}×${mb.length}${mb.prefix === undefined ? "" : ` + ${mb.prefix.batch}×${mb.prefix.length}`}`
      ),
      cells: p.microBatches.reduce(
        (n, mb) => n + mb.batch * mb.length + (mb.prefix?.batch ?? 0) * (mb.prefix?.length ?? 0),
        0
      )
    })
    result[name] = {
      rows: { ms: median(times.rows), rounds: times.rows, ...describe(variants.rows) },
      shared: { ms: median(times.shared), rounds: times.shared, ...describe(variants.shared) },
      speedup: median(times.rows) / median(times.shared)
    }
    console.log(
      `  ${name}: a row each ${median(times.rows).toFixed(0)} ms, shared ${median(times.shared).toFixed(0)} ms`
    )
  }
  const long = result["longPrompt"] as { readonly speedup: number }
  return {
    headline: {
      metric: "learner time per GRPO step, a row per chain / a group's chains sharing their prompt (300-token prompts)",
      value: long.speedup,
      target: 1,
      better: "higher" as const
    },
    ...result,
    loadAverage: { before: loadBefore, after: loadavg()[0]! }
  }
})

export default (): Promise<BenchResult> =>
  Effect.runPromise(figures.pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
