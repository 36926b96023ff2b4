/**
 * `npm run bench -- pipeline`: wall time of the same number of learner steps in sync mode and in async mode
 * (`maxStaleness` 1 and 2), measured in one run through the real `Trainer` pipeline (Rollout chains, journal,
 * checkpoints, metrics files). Each chain makes one tool call with a simulated 50 ms latency, then answers; the
 * sampler costs `SAMPLER_MS` per turn and a learner step `LEARN_MS` (sleeps, standing for onnxruntime calls that
 * leave the event loop free, as the real ones do). Headline: sync time / async (maxStaleness 1) time.
 *
 * The speedup is bounded by (rollout + learn) / max(rollout, learn) per step: the figure shows that the pipeline
 * overlaps them as designed, not the speed of a particular model.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as TrainLoop from "../actors/TrainLoop.ts"
import * as Dataset from "../src/Dataset.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import { charFormat } from "../test/actors/fixtures/charFormat.ts"
import * as Toy from "../test/actors/fixtures/toyPolicy.ts"

const TOOL_MS = 50
const SAMPLER_MS = 100
const LEARN_MS = 250
const STEPS = 12

const once = (mode: "sync" | "async", maxStaleness: number) =>
  Effect.gen(function*() {
    const config = yield* TrainConfig.decode({
      output: mkdtempSync(join(tmpdir(), `bench-pipeline-${mode}-`)),
      seed: 1,
      model: { path: "unused" },
      data: { train: "unused" },
      agent: { numChains: 8, maxTurns: 3, maxNewTokens: 16 },
      algorithm: { steps: STEPS, groupsPerStep: 8 },
      mode,
      maxStaleness,
      eval: { every: 1000 },
      checkpoint: { every: 4 }
    })
    const train = yield* Dataset.parse("rows", Array.from({ length: 64 }, (_, i) => `{"question":"q${i}"}`).join("\n"))
    const started = performance.now()
    yield* Effect.scoped(TrainLoop.run({
      config,
      train,
      format: charFormat,
      task: Toy.task({ toolMs: TOOL_MS })
    })).pipe(Effect.provide(Toy.layer({ samplerMs: SAMPLER_MS, learnMs: LEARN_MS })))
    return (performance.now() - started) / 1000
  })

export default async () => {
  const figures = await Effect.runPromise(
    Effect.gen(function*() {
      // Warm-up run (JIT), then the measured runs.
      yield* once("sync", 0)
      const sync = yield* once("sync", 0)
      const async1 = yield* once("async", 1)
      const async2 = yield* once("async", 2)
      return { sync, async1, async2 }
    }).pipe(Effect.provide(NodeServices.layer))
  )
  return {
    headline: {
      metric: "async (maxStaleness 1) speedup over sync",
      value: figures.sync / figures.async1,
      target: 2,
      better: "higher" as const
    },
    steps: STEPS,
    toolLatencyMs: TOOL_MS,
    samplerMsPerTurn: SAMPLER_MS,
    learnerMsPerStep: LEARN_MS,
    syncSeconds: figures.sync,
    async1Seconds: figures.async1,
    async2Seconds: figures.async2,
    speedupStaleness1: figures.sync / figures.async1,
    speedupStaleness2: figures.sync / figures.async2
  }
}
