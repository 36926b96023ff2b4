/**
 * The local learner and policy versions on the real parts (tiny Qwen2 policy on onnxruntime, calculator rows): what
 * a batch samples depends on its own requests only, not on what else the engine runs beside it; a step's outcome is
 * typed (Applied, Skipped, CriticOnly); a step that makes the weights non-finite fails with `RunError(NonFinite)`; a
 * checkpoint carries what a resumed run needs to take the same next step.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Schema } from "effect"
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import * as LocalPolicy from "../../actors/LocalPolicy.ts"
import * as RunError from "../../actors/RunError.ts"
import type * as PolicyEngine from "../../actors/PolicyEngine.ts"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as CalculatorTask from "../../environments/calculator/CalculatorTask.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Safetensors from "../../src/Safetensors.ts"
import { Sampler } from "../../src/Sampler.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import * as Rollouts from "../../actors/Rollouts.ts"
import * as Journal from "../../actors/Journal.ts"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as TrainLoop from "../../actors/TrainLoop.ts"
import * as RolloutSetup from "../../actors/RolloutSetup.ts"

const fixture = Effect.gen(function*() {
  const dir = mkdtempSync(join(tmpdir(), "local-policy-"))
  yield* Generate.write({ dir, seed: 5, train: 8, heldOut: 6, validation: 1, demos: 1, noise: 0 })
  // Held-out questions much longer than the training ones: a prefill shared with them left-pads the training prompts.
  const long = readFileSync(join(dir, "heldout.jsonl"), "utf8").trim().split("\n").map((line) => {
    const row = JSON.parse(line)
    return JSON.stringify({
      ...row,
      question: `${row.question} ${"Show the calculator call, then the answer. ".repeat(4)}`
    })
  })
  writeFileSync(join(dir, "long.jsonl"), long.join("\n") + "\n")
  yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
  const folder = yield* ModelFolder.load(join(dir, "model"))
  const config = TrainConfig.onModel(yield* TrainConfig.decode({
      output: join(dir, "run"),
      model: { path: join(dir, "model") },
      data: { train: join(dir, "train.jsonl") },
      task: "calculator",
      agent: { renderTools: false, maxTurns: 2, numChains: 3, maxNewTokens: 48, maxContextTokens: 512 },
      algorithm: { steps: 2, groupsPerStep: 2 },
      eval: { size: 6 }
    }), folder.config)
  const train = yield* Dataset.load(join(dir, "train.jsonl"), { onInvalid: "stop" })
  const heldOut = yield* Dataset.load(join(dir, "long.jsonl"), { onInvalid: "stop" })
  const agent = yield* RolloutSetup.make({
    task: CalculatorTask.make(),
    config,
    format: ChainFormat.ofConfig(config, folder)
  })
  const batch = Rollouts.collectGroups(agent, train.rows.slice(0, 2), {
    firstSeq: 0,
    chains: 3,
    temperature: 1,
    seed: 1234
  })
  return { folder, config, agent, batch, heldOut, train }
})

/** A critic whose first RL step trains it alone. */
const criticWarmup = Schema.decodeUnknownSync(TrainConfig.CriticConfig)({ warmupSteps: 1 })

const sampled = (groups: ReadonlyArray<Trajectory.Group>) =>
  groups.flatMap((g) =>
    g.trajectories.map((t) => ({
      tokens: t.segments.flatMap((s) => Array.from(Trajectory.tokenIds(s))),
      // NaN (a token the policy did not sample) as null, so that equal arrays compare equal
      logprobs: t.segments.flatMap((s) => Array.from(Trajectory.logprobs(s), (x) => (Number.isNaN(x) ? null : x)))
    }))
  )

describe("LocalPolicy", () => {
  it.effect(
    "prefillAlone: one distinct prompt at a time; a request interrupted waiting or admitted lets the next in",
    () =>
      Effect.gen(function*() {
        // A fake engine: a request is "prefilled" when it starts, and samples its first token when its prompt's gate
        // opens.
        const started: Array<string> = []
        const firstToken = new Map<string, Deferred.Deferred<void>>()
        const gate = (prompt: string) => {
          if (!firstToken.has(prompt)) firstToken.set(prompt, Deferred.makeUnsafe<void>())
          return firstToken.get(prompt)!
        }
        const engine = {
          generate: (request: GenerateRequest, options?: PolicyEngine.GenerateOptions) =>
            Effect.gen(function*() {
              const prompt = String.fromCharCode(...request.promptTokenIds)
              started.push(prompt)
              yield* Deferred.await(gate(prompt))
              options?.onToken?.(1, 0)
              return { tokenIds: [1], logprobs: [0], finishReason: "stop" as const, policyVersion: 0 }
            }),
          policyVersion: Effect.succeed(0)
        } as unknown as PolicyEngine.PolicyEngine["Service"]
        const sampler = LocalPolicy.prefillAlone(engine)
        const ask = (prompt: string) =>
          Effect.forkChild(
            sampler.generate({
              promptTokenIds: [...prompt].map((c) => c.charCodeAt(0)),
              sampling: { temperature: 1, maxTokens: 1 }
            })
          )
        const settle = Effect.yieldNow.pipe(Effect.repeat({ times: 20 }))
        const a1 = yield* ask("A")
        const b = yield* ask("B")
        const a2 = yield* ask("A")
        const c = yield* ask("C")
        yield* settle
        assert.deepStrictEqual(started, ["A", "A"], "a group's requests go in together, another prompt waits")
        yield* Fiber.interrupt(b)
        yield* Deferred.succeed(gate("A"), undefined)
        yield* Fiber.join(a1)
        yield* Fiber.join(a2)
        yield* settle
        assert.deepStrictEqual(started, ["A", "A", "C"], "B left while waiting; C is next")
        const d = yield* ask("D")
        yield* settle
        yield* Fiber.interrupt(c)
        yield* settle
        assert.deepStrictEqual(started, ["A", "A", "C", "D"], "C interrupted before its first token lets D in")
        yield* Deferred.succeed(gate("D"), undefined)
        yield* Fiber.join(d)
      })
  )

  for (const maxBatchSize of [4, 8]) {
    it.live(`a batch samples the same tokens and logprobs alone and beside an evaluation (${maxBatchSize} slots)`, () =>
      Effect.gen(function*() {
        const { folder, config, agent, batch, heldOut } = yield* fixture
        const once = <A, E>(rollouts: Effect.Effect<A, E, Sampler>) =>
          Effect.scoped(Effect.flatMap(
            LocalPolicy.make(folder, config, { maxBatchSize }),
            ({ sampler }) => Effect.provideService(rollouts, Sampler, sampler)
          ))
        const alone = yield* once(batch)
        const beside = yield* once(Effect.gen(function*() {
          // Both start together: their first prompts reach the engine in the same instant.
          const rollouts = yield* Effect.forkChild(batch)
          yield* Rollouts.evaluation(agent, heldOut.rows)
          return yield* Fiber.join(rollouts)
        }))
        const a = sampled(alone)
        assert.strictEqual(a.length, 6)
        assert.deepStrictEqual(sampled(beside), a, "bit-identical tokens and logprobs")
      }).pipe(Effect.provide(NodeServices.layer)), 300_000)
  }

  it.live("a batch samples the same tokens and logprobs with the engine on its own thread as on the main thread", () =>
    Effect.gen(function*() {
      const { folder, config, batch } = yield* fixture
      const on = (thread: boolean) =>
        Effect.scoped(Effect.flatMap(
          LocalPolicy.make(folder, { ...config, engine: { thread } }),
          ({ sampler }) => Effect.provideService(batch, Sampler, sampler)
        ))
      const main = sampled(yield* on(false))
      assert.strictEqual(main.length, 6)
      assert.deepStrictEqual(sampled(yield* on(true)), main, "bit-identical tokens and logprobs")
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.live("a step that makes the weights non-finite fails with RunError(NonFinite) naming the first bad weight", () =>
    Effect.gen(function*() {
      const { folder, config: decoded, batch } = yield* fixture
      // lr Infinity (what JSON makes of 1e400) is refused by the config's Schema; a program may still build one.
      const config = {
        ...decoded,
        algorithm: { ...decoded.algorithm, lr: Infinity, advantage: "reinforce++" as const, entropyCoef: 0.01 }
      }
      const error = yield* Effect.scoped(Effect.gen(function*() {
        const { learner, versions, sampler } = yield* LocalPolicy.make(folder, config)
        yield* versions.publish(0)
        const groups = yield* Effect.provideService(batch, Sampler, sampler)
        return yield* Effect.flip(learner.learn(1, groups))
      }))
      assert.instanceOf(error, RunError.RunError)
      assert.instanceOf(error.reason, RunError.NonFinite)
      assert.match(
        error.message,
        /^step 1 made the weights non-finite \(.+\[\d+\] = (NaN|-?Infinity)\); nothing was published or saved$/
      )
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.live(
    "learn's outcome: Skipped (NoSignal) when no group has signal; with KL in the reward equal outcomes still apply",
    () =>
      Effect.gen(function*() {
        const { folder, config: decoded, batch } = yield* fixture
        const on = (klInReward: number | undefined) =>
          Effect.scoped(Effect.gen(function*() {
            const config = {
              ...decoded,
              algorithm: {
                ...decoded.algorithm,
                advantage: "grpo" as const,
                ...(klInReward === undefined ? {} : { klInReward })
              }
            }
            const { learner, versions, sampler } = yield* LocalPolicy.make(folder, config)
            yield* versions.publish(0) // RL starts: the reference is frozen here
            const groups = yield* Effect.provideService(batch, Sampler, sampler)
            // Every chain scored 0: no outcome differs within any group.
            const equal = groups.map((g) => ({
              ...g,
              trajectories: g.trajectories.map((t) => ({ ...t, reward: 0, rewardStatus: "scored" as const }))
            }))
            return yield* learner.learn(1, equal)
          }))
        assert.deepStrictEqual(yield* on(undefined), {
          _tag: "Skipped",
          why: "NoSignal",
          figures: { "learner/applied": 0, "learner/groups_with_signal": 0 }
        }, "outcomes alone: no signal, the step is skipped")
        const kl = yield* on(0.5)
        assert.strictEqual(kl._tag, "Applied", JSON.stringify(kl))
        assert.strictEqual(kl.figures["learner/groups_with_signal"], 2)
        assert.strictEqual(kl.figures["learner/applied"], 1)
        assert.isTrue(
          Number.isFinite(kl.figures["learner/reward_kl"]),
          "the step reached the learner, which scored the KL"
        )
        assert.strictEqual(kl._tag === "Applied" ? kl.loss : NaN, kl.figures["learner/loss"], "the step's loss")
      }).pipe(Effect.provide(NodeServices.layer)),
    120_000
  )

  it.live(
    "gae: the critic's warm-up steps are CriticOnly (the policy unchanged), then a step without gradient is Skipped",
    () =>
      Effect.gen(function*() {
        const { folder, config: decoded, batch } = yield* fixture
        const config = {
          ...decoded,
          algorithm: { ...decoded.algorithm, advantage: "gae" as const },
          critic: criticWarmup
        }
        const outcomes = yield* Effect.scoped(Effect.gen(function*() {
          const { learner, versions, sampler } = yield* LocalPolicy.make(folder, config)
          yield* versions.publish(0) // the critic starts here
          const groups = yield* Effect.provideService(batch, Sampler, sampler)
          const before = yield* learner.fingerprint
          const first = yield* learner.learn(1, groups)
          const unchanged = (yield* learner.fingerprint) === before
          yield* versions.publish(1)
          return { first, unchanged, second: yield* learner.learn(2, groups) }
        }))
        assert.strictEqual(outcomes.first._tag, "CriticOnly")
        assert.strictEqual(outcomes.first.figures["learner/critic_only"], 1)
        assert.strictEqual(outcomes.first.figures["learner/applied"], 0)
        assert.isTrue(Number.isFinite(outcomes.first.figures["critic/loss"]), JSON.stringify(outcomes.first.figures))
        assert.isTrue(outcomes.unchanged, "the policy's weights did not move")
        // Rewards all 0 and a critic that learned values of 0: every advantage is 0, nothing has a gradient.
        assert.strictEqual(outcomes.second._tag, "Skipped", JSON.stringify(outcomes.second))
        assert.strictEqual(outcomes.second.figures["learner/applied"], 0)
        assert.isUndefined(outcomes.second.figures["learner/critic_only"])
      }).pipe(Effect.provide(NodeServices.layer)),
    120_000
  )

  it.live(
    "KL in the reward with recomputed old logprobs: a checkpoint carries the reference; loaded, " +
      "the next step is the same",
    () =>
      Effect.gen(function*() {
        const { folder, config: decoded, batch } = yield* fixture
        const config = {
          ...decoded,
          algorithm: {
            ...decoded.algorithm,
            advantage: "reinforce++" as const,
            entropyCoef: 0.01,
            klInReward: 0.1,
            recomputeOldLogprobs: true
          }
        }
        const checkpoint = mkdtempSync(join(tmpdir(), "local-policy-checkpoint-"))
        const first = yield* Effect.scoped(Effect.gen(function*() {
          const { learner, versions, sampler } = yield* LocalPolicy.make(folder, config)
          yield* versions.publish(0) // the reference is frozen here
          const groups = yield* Effect.provideService(batch, Sampler, sampler)
          const step1 = yield* learner.learn(1, groups)
          yield* versions.publish(1)
          yield* learner.save(checkpoint)
          const saved = yield* learner.fingerprint
          const later = yield* Effect.scoped(
            Effect.flatMap(versions.sampler(1), (s) => Effect.provideService(batch, Sampler, s))
          )
          const step2 = yield* learner.learn(2, later)
          return { later, step1, step2, saved, after: yield* learner.fingerprint }
        }))
        // Step 1 learns from what the reference itself sampled (KL 0 up to the engine's and the trainer's rounding);
        // step 2 from what the policy one update away from it sampled.
        const [kl1, kl2] = [first.step1.figures["learner/reward_kl"]!, first.step2.figures["learner/reward_kl"]!]
        assert.isBelow(Math.abs(kl1), 1e-6)
        assert.isTrue(Number.isFinite(kl2), JSON.stringify(first.step2.figures))
        assert.isAbove(Math.abs(kl2), 100 * Math.abs(kl1))
        assert.isTrue(existsSync(join(checkpoint, "reference.safetensors")))
        const resumed = yield* Effect.scoped(Effect.gen(function*() {
          const { learner } = yield* LocalPolicy.make(folder, config)
          yield* learner.load(checkpoint)
          const loaded = yield* learner.fingerprint
          const step2 = yield* learner.learn(2, first.later)
          return { loaded, step2, after: yield* learner.fingerprint }
        }))
        assert.strictEqual(resumed.loaded, first.saved, "the checkpoint's weights")
        assert.strictEqual(resumed.step2.figures["learner/reward_kl"], first.step2.figures["learner/reward_kl"])
        assert.strictEqual(resumed.after, first.after, "the same step: bit-identical weights")
      }).pipe(Effect.provide(NodeServices.layer)),
    120_000
  )

  it.live(
    "a checkpoint of a run with a KL term but no reference.safetensors fails to load with RunError(Checkpoint)",
    () =>
      Effect.gen(function*() {
        const { folder, config: decoded } = yield* fixture
        const checkpoint = mkdtempSync(join(tmpdir(), "local-policy-checkpoint-"))
        const plain = { ...decoded, algorithm: { ...decoded.algorithm, advantage: "reinforce++" as const } }
        const withKl = { ...plain, algorithm: { ...plain.algorithm, klCoef: 0.1 } }
        const error = yield* Effect.scoped(Effect.gen(function*() {
          yield* Effect.flatMap(LocalPolicy.make(folder, plain), ({ learner }) => learner.save(checkpoint))
          const { learner } = yield* LocalPolicy.make(folder, withKl)
          return yield* Effect.flip(learner.load(checkpoint))
        }))
        assert.instanceOf(error.reason, RunError.Checkpoint)
        assert.strictEqual(
          error.message,
          `${checkpoint}/reference.safetensors is missing: a KL term (algorithm.klCoef or klInReward > 0) needs the ` +
            `reference policy the run started with`
        )
      }).pipe(Effect.provide(NodeServices.layer)),
    120_000
  )

  it.live("learner.moments bfloat16 reaches the trainer (recompute on too): its checkpoint's moments are BF16", () =>
    Effect.gen(function*() {
      const { folder, config: decoded } = yield* fixture
      const checkpoint = mkdtempSync(join(tmpdir(), "local-policy-checkpoint-"))
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          rmSync(checkpoint, { recursive: true, force: true })
          rmSync(dirname(decoded.output), { recursive: true, force: true }) // the fixture's folder
        })
      )
      const config = { ...decoded, learner: { ...decoded.learner, moments: "bfloat16" as const, recompute: true } }
      yield* Effect.scoped(Effect.flatMap(LocalPolicy.make(folder, config), ({ learner }) => learner.save(checkpoint)))
      const index = yield* Safetensors.readIndex(checkpoint, "optimizer")
      assert.deepStrictEqual(new Set([...index.tensors.values()].map((t) => t.dtype)), new Set(["BF16"]))
      const weights = yield* Safetensors.readIndex(checkpoint, "model")
      assert.deepStrictEqual(new Set([...weights.tensors.values()].map((t) => t.dtype)), new Set(["F32"]))
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 120_000)
})

describe("LocalPolicy in a run", () => {
  it.live(
    "a step that makes the weights non-finite stops the run with a typed error before anything is saved",
    () =>
      Effect.gen(function*() {
        const { folder, config: decoded, train } = yield* fixture
        // lr Infinity (what JSON makes of 1e400) is refused by the config's Schema; a program may still build one.
        const config = {
          ...decoded,
          algorithm: { ...decoded.algorithm, lr: Infinity, advantage: "reinforce++" as const, entropyCoef: 0.01 },
          checkpoint: { every: 1, keep: 5 }
        }
        const error = yield* Effect.flip(
          Effect.scoped(TrainLoop.run({
            task: CalculatorTask.make(),
            config,
            format: ChainFormat.ofConfig(config, folder),
            train
          })).pipe(
            Effect.provide(Layer.provideMerge(Rollouts.inProcess, LocalPolicy.layer(folder, config))),
            Effect.provide(ResourceManager.ResourceManager.layer)
          )
        )
        assert.strictEqual(error.reason._tag, "NonFinite")
        assert.match(error.message, /step 1 made the weights non-finite \(.+\[\d+\] = (NaN|-?Infinity)\)/)
        const journal = (yield* Journal.read(join(config.output, "journal.jsonl"))).entries.map((e) => e.entry.kind)
        assert.notInclude(journal, "step", "no learner step journaled")
        assert.notInclude(journal, "checkpoint")
        const checkpoints = join(config.output, "checkpoints")
        assert.deepStrictEqual(existsSync(checkpoints) ? readdirSync(checkpoints) : [], [], "no checkpoint written")
      }).pipe(Effect.provide(NodeServices.layer)),
    120_000
  )
})
