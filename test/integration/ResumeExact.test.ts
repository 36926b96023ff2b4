/**
 * Exact resume on the real parts (tiny Qwen2 policy on onnxruntime, the calculator's rows and tools), in the demo's
 * shape: a sampled training run that evaluates every 2 steps and checkpoints at the same steps, stopped after its
 * step-2 checkpoint and resumed from it. In an unbroken run the evaluation at step 2 runs beside step 3's rollouts; a
 * resumed run skips that evaluation (it is already logged), so anything that lets rollouts depend on what shares
 * the engine with them shows up here as different weights. Fewer engine slots than rollouts make requests queue
 * and meet in prefills (as the demo's 64 chains fill the default 64 slots), and held-out prompts much longer than
 * the training ones make a shared prefill pad them.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Result } from "effect"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Journal from "../../actors/Journal.ts"
import * as LocalPolicy from "../../actors/LocalPolicy.ts"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as CalculatorTask from "../../environments/calculator/CalculatorTask.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Reward from "../../src/Reward.ts"
import { Sampler } from "../../src/Sampler.ts"
import type * as Task from "../../src/Task.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import * as TrainLoop from "../../actors/TrainLoop.ts"
import * as RunError from "../../actors/RunError.ts"
import * as Learner from "../../actors/Learner.ts"
import { PolicyVersions } from "../../actors/PolicyVersions.ts"
import * as Rollouts from "../../actors/Rollouts.ts"

const journalOf = (output: string) =>
  Effect.map(Journal.read(join(output, "journal.jsonl")), (r) => r.entries.map((e) => e.entry))

const evalsOf = (output: string) =>
  readFileSync(join(output, "metrics.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l))
    .filter((r) => r.phase === "eval").map((r) => ({ step: r.step, figures: r.figures }))

describe("exact resume", () => {
  // One learner thread (workers 1) and two workers splitting rows: both must be deterministic; so must an async run
  // (its batches' policy versions are fixed by the schedule, and each batch samples on an engine of its own), with the
  // engine on the main thread (the default) and on a thread of its own, where messages between threads could
  // reorder work; and PPO with a critic (`gae`), whose values decide the advantages: a critic not saved or not
  // loaded would give the resumed run other advantages, hence other weights.
  const cases = [
    [1, "sync", false, "reinforce++"],
    [2, "sync", false, "reinforce++"],
    [2, "async", false, "reinforce++"],
    [2, "async", true, "reinforce++"],
    [2, "sync", false, "gae"]
  ] as const
  for (const [workers, mode, thread, advantage] of cases) {
    it.live(
      `a run resumed from an evaluation step's checkpoint ends with the same weights and journal ` +
        `(learner.workers ${workers}, ${mode}${thread ? ", engine thread" : ""}, ${advantage})`,
      () =>
        Effect.gen(function*() {
          const dir = mkdtempSync(join(tmpdir(), "resume-exact-"))
          yield* Generate.write({
            dir: join(dir, "data"),
            seed: 5,
            train: 32,
            heldOut: 6,
            validation: 2,
            demos: 2,
            noise: 0
          })
          yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
          const folder = yield* ModelFolder.load(join(dir, "model"))
          const configFor = (output: string) =>
            TrainConfig.decode({
              seed: 11,
              output,
              model: { path: join(dir, "model") },
              data: { train: join(dir, "data", "train.jsonl"), eval: join(dir, "data", "heldout.jsonl") },
              task: "calculator",
              agent: {
                systemPrompt: "Use the calculator tool.",
                renderTools: false,
                maxTurns: 2,
                numChains: 3,
                maxNewTokens: 48,
                maxContextTokens: 512
              },
              // Every step moves the weights (an entropy bonus under a non-group-relative estimator), so a difference
              // in any step's rollouts reaches the final weights.
              algorithm: {
                steps: 4,
                groupsPerStep: 2,
                microBatchSize: 4,
                lr: 0.001,
                lrSchedule: "cosine",
                advantage,
                entropyCoef: 0.01
              },
              eval: { every: 2, size: 6 },
              checkpoint: { every: 2, keep: 3 },
              learner: { workers },
              mode,
              maxStaleness: 1,
              engine: { thread }
            }).pipe(Effect.map((c) => TrainConfig.onModel(c, folder.config)))
          const train = yield* Dataset.load(join(dir, "data", "train.jsonl"), { onInvalid: "stop" })
          // Held-out questions much longer than the training ones: an evaluation that shares the engine's decode batch
          // with training rollouts widens the keys/values every row of that batch attends over.
          const long = readFileSync(join(dir, "data", "heldout.jsonl"), "utf8").trim().split("\n").map((line) => {
            const row = JSON.parse(line)
            return JSON.stringify({
              ...row,
              question: `${row.question} ${"Show the calculator call, then the answer. ".repeat(4)}`
            })
          })
          writeFileSync(join(dir, "data", "long.jsonl"), long.join("\n") + "\n")
          const heldOut = yield* Dataset.load(join(dir, "data", "long.jsonl"), { onInvalid: "stop" })
          // The calculator's rows and tools, scored by the share of digits in the last answer: an untrained policy's
          // rewards then differ within a group, so the sampler's logprobs (the PPO ratio's denominator) reach the
          // weights.
          const digits = Reward.make("digits", {
            score: ({ trajectory }) =>
              Effect.sync(() => {
                const text = Trajectory.lastAssistantText(trajectory)
                return text.length === 0 ? 0 : text.replace(/[^0-9]/g, "").length / text.length
              })
          })
          const task: Task.Task = { ...CalculatorTask.make(), reward: digits }
          const runOnce = (config: TrainConfig.TrainConfig, options: { failAt?: number; resume?: boolean } = {}) =>
            Effect.scoped(Effect.gen(function*() {
              // A batch smaller than the rollouts (as the demo's 64 chains fill the default 64): requests queue for
              // slots.
              // Fewer slots than rollouts (as the demo's 64 chains fill the default 64): requests wait for a free slot,
              // and those that find one at the same step are prefilled together, left-padded to the longest.
              const local = yield* LocalPolicy.make(folder, config, { maxBatchSize: 4 })
              const learner: Learner.Learner["Service"] = {
                ...local.learner,
                learn: (step, groups) =>
                  step === options.failAt
                    ? Effect.fail(RunError.runError("Learner", `stopped at step ${step}`))
                    : local.learner.learn(step, groups)
              }
              return yield* TrainLoop.run({
                task,
                config,
                format: ChainFormat.ofConfig(config, folder),
                train,
                eval: heldOut,
                resume: options.resume === true
              }).pipe(
                Effect.provide(Rollouts.inProcess),
                Effect.provideService(Learner.Learner, learner),
                Effect.provideService(PolicyVersions, local.versions),
                Effect.provideService(Sampler, local.sampler),
                Effect.provide(ResourceManager.ResourceManager.layer)
              )
            }))

          const a = yield* configFor(join(dir, "a"))
          const full = yield* runOnce(a)
          const b = yield* configFor(join(dir, "b"))
          const stopped = yield* Effect.result(runOnce(b, { failAt: 3 }))
          assert.isTrue(Result.isFailure(stopped), "the run stopped at step 3")
          const resumed = yield* runOnce(b, { resume: true })
          assert.strictEqual(resumed.fromStep, 2, "resumed from the step-2 checkpoint")

          assert.strictEqual(resumed.fingerprint, full.fingerprint, "the same final weights")
          const reference = yield* journalOf(a.output)
          const journal = yield* journalOf(b.output)
          const withoutStarts = (j: ReadonlyArray<Journal.Entry>) => j.filter((e) => e.kind !== "start")
          assert.deepStrictEqual(withoutStarts(journal), withoutStarts(reference), "every journal record")
          assert.deepStrictEqual(evalsOf(b.output).map((e) => e.step), [0, 2, 4])
          const figures = (e: { figures: Record<string, number> }) =>
            Object.fromEntries(
              Object.entries(e.figures).filter(([k]) => !k.startsWith("time/") && !k.startsWith("perf/"))
            )
          assert.deepStrictEqual(evalsOf(b.output).map(figures), evalsOf(a.output).map(figures), "the same evaluations")
          const weights = (run: string) => readFileSync(join(run, "checkpoints", "step-000004", "model.safetensors"))
          assert.isTrue(weights(a.output).equals(weights(b.output)), "bit-identical final checkpoints")
          if (advantage === "gae") {
            const critic = (run: string) =>
              readFileSync(join(run, "checkpoints", "step-000004", "critic", "model.safetensors"))
            assert.isTrue(critic(a.output).equals(critic(b.output)), "bit-identical final critics")
            const trained = evalsOf(a.output).length > 0 &&
              readFileSync(join(a.output, "metrics.jsonl"), "utf8").includes("\"critic/optimizer_steps\":1")
            assert.isTrue(trained, "the critic took optimiser steps")
          }
          const hashes = reference.flatMap((e) => (e.kind === "step" ? [e.weightsHash] : []))
          assert.strictEqual(new Set(hashes).size, 4, "every step changed the weights")
        }).pipe(Effect.provide(NodeServices.layer)),
      120_000
    )
  }
})
