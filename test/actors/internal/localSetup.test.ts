import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, Scope } from "effect"
import { totalmem } from "node:os"
import { checkMemory, MachineMemory, machineMemory, type Setup } from "../../../actors/internal/localSetup.ts"
import * as MemoryEstimate from "../../../src/MemoryEstimate.ts"
import type * as ModelFolder from "../../../src/ModelFolder.ts"
import * as TrainConfig from "../../../src/TrainConfig.ts"
import { qwen25Width } from "../../../scripts/shapes.ts"

const GiB = 1024 ** 3

const qwen05 = qwen25Width(24)

/** The parts of a setup the check reads: the model's config, the run's config, the file system. */
const setupOf = (config: TrainConfig.TrainConfig) =>
  Effect.gen(function*() {
    const fsContext = yield* Effect.context<FileSystem.FileSystem | Scope.Scope>()
    const folder = { config: qwen05 } as ModelFolder.ModelFolder
    return { folder, config, remote: undefined, fsContext } as unknown as Setup
  })

const runConfig = TrainConfig.decode({
  output: "runs/x",
  model: { path: "model" },
  data: { train: "data/train.jsonl" },
  task: "calculator",
  agent: { maxContextTokens: 512 },
  algorithm: { steps: 10, microBatchSize: 16 },
  learner: { workers: 2 }
})

describe("localSetup.checkMemory", () => {
  it.effect("a 0.5 B run on a 24 GiB machine is refused before any trainer, with the estimate and what fits", () =>
    Effect.gen(function*() {
      const setup = yield* setupOf(yield* runConfig)
      const error = yield* Effect.flip(checkMemory(setup).pipe(Effect.provideService(MachineMemory, 24 * GiB)))
      assert.strictEqual(error.reason._tag, "Learner")
      assert.match(error.message, /the run needs about [\d.]+ GiB \(weights [\d.]+ GiB, gradients/)
      assert.include(error.message, "more than the 24.00 GiB this machine has")
      assert.include(error.message, "algorithm.microBatchSize 1 with learner.workers 1")
      const cause = error.reason.cause as MemoryEstimate.OutOfMemory
      assert.strictEqual(cause._tag, "OutOfMemory")
      assert.strictEqual(cause.available, 24 * GiB)
      assert.deepStrictEqual(cause.fits.map((f) => [f.microBatchSize, f.workers]), [[1, 1]])
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("the same run on a 256 GiB machine, and a run on a remote trainer, are let through", () =>
    Effect.gen(function*() {
      const setup = yield* setupOf(yield* runConfig)
      yield* checkMemory(setup).pipe(Effect.provideService(MachineMemory, 256 * GiB))
      const remote = { ...setup, remote: {} } as unknown as Setup
      yield* checkMemory(remote).pipe(Effect.provideService(MachineMemory, 1 * GiB))
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("learner.recompute counts its saving only with glibc's mmap threshold fixed (MALLOC_MMAP_THRESHOLD_)", () =>
    Effect.gen(function*() {
      const base = yield* runConfig
      const config = { ...base, learner: { ...base.learner, workers: 1, recompute: true } }
      const setup = yield* setupOf({ ...config, algorithm: { ...config.algorithm, microBatchSize: 1 } })
      const estimateWith = (fixed: boolean) =>
        Effect.gen(function*() {
          const saved = process.env["MALLOC_MMAP_THRESHOLD_"]
          if (fixed) process.env["MALLOC_MMAP_THRESHOLD_"] = "1048576"
          else delete process.env["MALLOC_MMAP_THRESHOLD_"]
          const restore = Effect.sync(() => {
            if (saved === undefined) delete process.env["MALLOC_MMAP_THRESHOLD_"]
            else process.env["MALLOC_MMAP_THRESHOLD_"] = saved
          })
          const error = yield* Effect.flip(checkMemory(setup).pipe(Effect.provideService(MachineMemory, 1 * GiB)))
            .pipe(Effect.ensuring(restore))
          return (error.reason.cause as MemoryEstimate.OutOfMemory).estimate
        })
      const settings = { microBatchSize: 1, sequenceLength: 512, workers: 1, reference: false, critic: false }
      const plain = MemoryEstimate.estimate(qwen05, settings).total
      assert.strictEqual(yield* estimateWith(false), plain)
      const recomputed = MemoryEstimate.estimate(qwen05, { ...settings, recompute: true }).total
      assert.strictEqual(yield* estimateWith(true), recomputed)
      assert.isBelow(yield* estimateWith(true), plain)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("without a fixed size, the machine's memory is positive and at most the physical memory", () =>
    Effect.gen(function*() {
      const bytes = yield* machineMemory()
      assert.isAbove(bytes, 0)
      assert.isAtMost(bytes, totalmem())
    }).pipe(Effect.provide(NodeServices.layer)))
})
