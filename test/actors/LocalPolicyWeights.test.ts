/**
 * The local learner takes its weights (a copy of every weight) and hashes them (the finiteness check, the journaled
 * fingerprint) once per change of the weights, not once per use: counted here by wrapping `OnnxTrainer`'s trainers
 * and `Checkpoint.fingerprint`. Before the change an RL step took three copies and hashed them twice.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { vi } from "vitest"
import { mkdirSync, mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as LocalPolicy from "../../actors/LocalPolicy.ts"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as CalculatorTask from "../../environments/calculator/CalculatorTask.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { Sampler } from "../../src/Sampler.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as Rollouts from "../../actors/Rollouts.ts"
import * as RolloutSetup from "../../actors/RolloutSetup.ts"

const counts = vi.hoisted(() => ({ weights: 0, fingerprints: 0 }))
vi.mock("../../src/Checkpoint.ts", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../src/Checkpoint.ts")>()
  return {
    ...original,
    fingerprint: (weights: ReadonlyMap<string, Float32Array>) => {
      counts.fingerprints++
      return original.fingerprint(weights)
    }
  }
})
vi.mock("../../src/backends/OnnxTrainer.ts", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../src/backends/OnnxTrainer.ts")>()
  return {
    ...original,
    make: (options: Parameters<typeof original.make>[0]) =>
      Effect.map(original.make(options), (made) => ({
        ...made,
        trainer: {
          ...made.trainer,
          weights: Effect.suspend(() => {
            counts.weights++
            return made.trainer.weights
          })
        }
      }))
  }
})

/** The counts of what `effect` did. */
const counted = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    counts.weights = 0
    counts.fingerprints = 0
    const value = yield* effect
    return { value, weights: counts.weights, fingerprints: counts.fingerprints }
  })

const fixture = Effect.gen(function*() {
  const dir = mkdtempSync(join(tmpdir(), "local-policy-weights-"))
  yield* Generate.write({ dir, seed: 5, train: 8, heldOut: 6, validation: 1, demos: 4, noise: 0 })
  yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
  const folder = yield* ModelFolder.load(join(dir, "model"))
  const config = TrainConfig.onModel(yield* TrainConfig.decode({
      output: join(dir, "run"),
      model: { path: join(dir, "model") },
      data: { train: join(dir, "train.jsonl") },
      task: "calculator",
      agent: { renderTools: false, maxTurns: 2, numChains: 3, maxNewTokens: 48, maxContextTokens: 512 },
      // reinforce++ with an entropy term: every step applies, whatever the rewards.
      algorithm: { steps: 3, groupsPerStep: 2, advantage: "reinforce++", entropyCoef: 0.01 },
      warmup: { data: join(dir, "demos.jsonl"), steps: 2, batchSize: 2 }
    }), folder.config)
  const train = yield* Dataset.load(join(dir, "train.jsonl"), { onInvalid: "stop" })
  const demos = yield* Dataset.load(join(dir, "demos.jsonl"), { kind: "conversation" })
  const format = ChainFormat.ofConfig(config, folder)
  const agent = yield* RolloutSetup.make({ task: CalculatorTask.make(), config, format })
  const options = { firstSeq: 0, chains: 3, temperature: 1, seed: 1234 }
  const batch = Rollouts.collectGroups(agent, train.rows.slice(0, 2), options)
  return { dir, folder, config, batch, demos }
})

describe("LocalPolicy weights", () => {
  it.live(
    "a warm-up and RL steps take the weights once per change and hash them once (was: 3 copies, 2 hashes a step)",
    () =>
      Effect.gen(function*() {
        const { dir, folder, config, batch, demos } = yield* fixture
        yield* Effect.scoped(Effect.gen(function*() {
          const { learner, versions, sampler } = yield* LocalPolicy.make(folder, config)
          const sft = (step: number) => Effect.andThen(learner.sft(step, demos.rows.slice(0, 2)), learner.fingerprint)
          // The first SFT step starts the SFT trainer from the current weights: one copy more.
          assert.deepInclude(yield* counted(sft(1)), { weights: 2, fingerprints: 1 })
          assert.deepInclude(yield* counted(sft(2)), { weights: 1, fingerprints: 1 })
          // The end of the warm-up: the RL trainer starts from the weights already taken, which are published.
          assert.deepInclude(yield* counted(Effect.andThen(versions.publish(0), learner.fingerprint)), {
            weights: 0,
            fingerprints: 0
          })
          const groups = yield* Effect.provideService(batch, Sampler, sampler)
          const step = (n: number) =>
            Effect.gen(function*() {
              const outcome = yield* learner.learn(n, groups)
              yield* versions.publish(n)
              return { outcome: outcome._tag, fingerprint: yield* learner.fingerprint }
            })
          const first = yield* counted(step(1))
          assert.deepStrictEqual(first, { value: first.value, weights: 1, fingerprints: 1 })
          assert.strictEqual(first.value.outcome, "Applied")
          const checkpoint = join(dir, "step-1")
          mkdirSync(checkpoint)
          yield* learner.save(checkpoint)
          const second = yield* counted(step(2))
          assert.deepInclude(second, { weights: 1, fingerprints: 1 })
          assert.notStrictEqual(
            second.value.fingerprint,
            first.value.fingerprint,
            "a step's new weights, not the cached"
          )
          // A load changes the weights: its fingerprint is the checkpoint's, hashed once more.
          const loaded = yield* counted(Effect.andThen(learner.load(checkpoint), learner.fingerprint))
          assert.deepStrictEqual(loaded, { value: first.value.fingerprint, weights: 1, fingerprints: 1 })
        }))
      }).pipe(Effect.provide(NodeServices.layer)),
    120_000
  )
})
