/**
 * `engine.weights` (issue 41 point 6): a run whose engines are fed the published versions' arrays as inputs learns
 * what the default run learns; a run keeps only the published versions its schedule may sample; `agentfly train`
 * hands the folder's weights over once the learner has its own copy.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as LocalSetup from "../../actors/internal/localSetup.ts"
import * as LocalPolicy from "../../actors/LocalPolicy.ts"
import * as Train from "../../actors/Train.ts"
import * as Generate from "../../examples/guess/generate.ts"
import { task } from "../../examples/guess/task.ts"
import * as MemoryEstimate from "../../src/MemoryEstimate.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"

interface Entry {
  readonly kind: string
  readonly step?: number
  readonly weightsHash?: string
  readonly meanReward?: number
}

const journal = (dir: string): Array<Entry> =>
  readFileSync(join(dir, "journal.jsonl"), "utf8").trim().split("\n").map((line) => JSON.parse(line) as Entry)

describe("engine.weights", () => {
  it.live("a run with its engines fed as inputs ends on the default run's weights, step for step", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "engine-weights-"))
      try {
        yield* Generate.write(
          { dir: join(dir, "data"), seed: 3, train: 16, heldOut: 4, validation: 0, demos: 0, noise: 0 },
          task.defaults.systemPrompt!
        ).pipe(Effect.provide(NodeServices.layer))
        const run = (output: string, weights: "auto" | "inputs", mode: "sync" | "async" = "sync") =>
          Train.run({
            task,
            dir,
            config: {
              seed: 1,
              output,
              model: { path: "model", preset: "tiny", initSeed: 1 },
              data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
              agent: { numChains: 2 },
              // Every step trains whatever the untrained policy's rewards (see Train.test.ts).
              algorithm: { steps: 3, groupsPerStep: 2, microBatchSize: 4, advantage: "reinforce++", entropyCoef: 0.01 },
              eval: { every: 100, size: 4 },
              engine: { weights },
              // Async: batches sampled up to one version behind, from the last `maxStaleness + 1` kept.
              ...(mode === "async" ? { mode, maxStaleness: 1 } : {})
            },
            write: () => undefined,
            tty: false
          })
        yield* run("default", "auto") // the tiny preset: pre-packed initializers
        yield* run("inputs", "inputs")
        const [a, b] = [journal(join(dir, "default")), journal(join(dir, "inputs"))]
        const steps = (j: Array<Entry>) => j.filter((e) => e.kind === "step").map((e) => e.weightsHash)
        assert.strictEqual(steps(a).length, 3)
        // Same sampled tokens, logprobs within onnxruntime's rounding: the learner sees the same batches and its
        // update is deterministic, so the weights after every step hash the same.
        assert.deepStrictEqual(steps(b), steps(a))
        const rewards = (j: Array<Entry>) => j.filter((e) => e.kind === "group").map((e) => e.meanReward)
        assert.deepStrictEqual(rewards(b), rewards(a))
        yield* run("async-default", "auto", "async")
        yield* run("async-inputs", "inputs", "async")
        const [c, d] = [journal(join(dir, "async-default")), journal(join(dir, "async-inputs"))]
        assert.strictEqual(steps(c).length, 3)
        assert.deepStrictEqual(steps(d), steps(c))
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    }), 600_000)

  it.live(
    "a sync run keeps the newest version only; the folder's weights handed over are released, the learning unchanged",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "engine-weights-versions-"))
        try {
          yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
          const config = yield* TrainConfig.decode({
            output: join(dir, "run"),
            model: { path: join(dir, "model") },
            data: { train: join(dir, "train.jsonl") },
            task: "calculator",
            algorithm: { steps: 2, groupsPerStep: 2, advantage: "reinforce++", entropyCoef: 0.01 },
            engine: { weights: "inputs" }
          })
          const versionsOf = (release: boolean) =>
            Effect.scoped(Effect.gen(function*() {
              const folder = yield* ModelFolder.load(join(dir, "model"))
              const count = folder.weights.size
              const { learner, versions } = yield* LocalPolicy.make(folder, config, { releaseFolderWeights: release })
              const left = folder.weights.size
              // No warm-up: version 0 is the folder's weights, taken from the learner where they were released.
              yield* versions.publish(0)
              yield* Effect.scoped(versions.sampler(0))
              const at0 = yield* learner.fingerprint
              yield* versions.publish(1) // unchanged weights, a newer version
              const older = yield* Effect.flip(Effect.scoped(versions.sampler(0)))
              yield* Effect.scoped(versions.sampler(1))
              return { count, left, at0, older: older.message }
            }))
          const kept = yield* versionsOf(false)
          const released = yield* versionsOf(true)
          assert.strictEqual(kept.left, kept.count)
          assert.strictEqual(released.left, 0)
          assert.isAbove(released.count, 0)
          assert.strictEqual(released.at0, kept.at0)
          assert.include(kept.older, "policy version 0 is not among the published versions 1")
        } finally {
          rmSync(dir, { recursive: true, force: true })
        }
      }).pipe(Effect.provide(NodeServices.layer)),
    120_000
  )

  it.effect("auto feeds the engines as inputs only where the run fits the machine no other way", () =>
    Effect.gen(function*() {
      const folderConfig = ModelConfig.presets.medium
      const config = TrainConfig.onModel(yield* TrainConfig.decode({
        output: "run",
        model: { path: "model" },
        data: { train: "train.jsonl" },
        task: "calculator",
        algorithm: { steps: 1, microBatchSize: 1 },
        learner: { workers: 1 },
        agent: { maxContextTokens: 512 }
      }), folderConfig)
      const setupOf = (fsContext: unknown) =>
        ({
          config,
          folder: { config: folderConfig, vision: undefined },
          remote: undefined,
          tinker: undefined,
          releaseFolder: true,
          fsContext
        }) as unknown as Omit<LocalSetup.Setup, "engineWeights">
      const setup = setupOf(yield* Effect.context<never>())
      const settings = { microBatchSize: 1, sequenceLength: 512, workers: 1, reference: false, critic: false }
      const packed = MemoryEstimate.estimate(folderConfig, settings).total
      const fed = MemoryEstimate.estimate(folderConfig, {
        ...settings,
        engineWeights: "inputs",
        folderReleased: true,
        publishedVersions: 0 // a sync run holds no copy while its learner steps
      }).total
      assert.isBelow(fed, packed)
      // The machine's memory is read in the run's context, as `LocalPolicy.make` captures it.
      const at = (bytes: number) =>
        Effect.context<never>().pipe(
          Effect.flatMap((context) => LocalSetup.engineWeightsOf(setupOf(context))),
          Effect.provideService(LocalSetup.MachineMemory, bytes)
        )
      assert.strictEqual(yield* at(packed + 1), "initializers") // fits either way: the faster decoding
      assert.strictEqual(yield* at((packed + fed) / 2), "inputs") // fits only fed as inputs
      assert.strictEqual(yield* at(fed - 1), "initializers") // fits neither way: refused later, as before
      const forced = { ...setup, config: { ...config, engine: { weights: "inputs" as const } } }
      assert.strictEqual(yield* LocalSetup.engineWeightsOf(forced), "inputs")
    }))

  it("the estimate counts the sampling side per mode: inputs hold the published versions only", () => {
    const c = ModelConfig.presets.medium
    const settings = { microBatchSize: 1, sequenceLength: 512, workers: 1 }
    const P = MemoryEstimate.estimate(c, settings).parameters
    const side = (s: Partial<MemoryEstimate.Settings>) =>
      MemoryEstimate.estimate(c, { ...settings, ...s }).extra - MemoryEstimate.estimate(c, { ...settings, engine: false })
        .extra
    assert.closeTo(side({}), 20 * P, 1)
    assert.closeTo(side({ engineWeights: "inputs" }), 8 * P, 1) // one version and the folder's weights
    assert.closeTo(side({ engineWeights: "inputs", folderReleased: true }), 4 * P, 1)
    assert.closeTo(side({ engineWeights: "inputs", folderReleased: true, publishedVersions: 3 }), 12 * P, 1)
  })
})
