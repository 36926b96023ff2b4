/**
 * The local policy on the real parts (tiny Qwen2 policy on onnxruntime, calculator rows): what a batch samples
 * depends on its own requests only, not on what else the engine runs beside it; a step that makes the weights
 * non-finite stops the run before anything is saved.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer } from "effect"
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Journal from "../../actors/Journal.ts"
import * as LocalPolicy from "../../actors/LocalPolicy.ts"
import type * as PolicyEngine from "../../actors/PolicyEngine.ts"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as CalculatorTask from "../../environments/calculator/CalculatorTask.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { Sampler } from "../../src/Sampler.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import * as TrainLoop from "../../actors/TrainLoop.ts"
import * as Rollouts from "../../actors/Rollouts.ts"
import * as RolloutSetup from "../../actors/RolloutSetup.ts"

const fixture = Effect.gen(function*() {
  const dir = mkdtempSync(join(tmpdir(), "local-policy-"))
  yield* Generate.write({ dir, seed: 5, train: 8, heldOut: 6, validation: 1, demos: 1, noise: 0 })
  // Held-out questions much longer than the training ones: a prefill shared with them left-pads the training prompts.
  const long = readFileSync(join(dir, "heldout.jsonl"), "utf8").trim().split("\n").map((line) => {
    const row = JSON.parse(line)
    return JSON.stringify({ ...row, question: `${row.question} ${"Show the calculator call, then the answer. ".repeat(4)}` })
  })
  writeFileSync(join(dir, "long.jsonl"), long.join("\n") + "\n")
  yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
  const folder = yield* ModelFolder.load(join(dir, "model"))
  const config = LocalPolicy.onModel(
    folder,
    yield* TrainConfig.decode({
      output: join(dir, "run"),
      model: { path: join(dir, "model") },
      data: { train: join(dir, "train.jsonl") },
      task: "calculator",
      agent: { renderTools: false, maxTurns: 2, numChains: 3, maxNewTokens: 48, maxContextTokens: 512 },
      algorithm: { steps: 2, groupsPerStep: 2 },
      eval: { size: 6 }
    })
  )
  const train = yield* Dataset.load(join(dir, "train.jsonl"), { onInvalid: "stop" })
  const heldOut = yield* Dataset.load(join(dir, "long.jsonl"), { onInvalid: "stop" })
  const agent = yield* RolloutSetup.make({ task: CalculatorTask.make(), config, format: ChainFormat.ofConfig(config, folder) })
  const batch = Rollouts.collectGroups(agent, train.rows.slice(0, 2), { firstSeq: 0, chains: 3, temperature: 1, seed: 1234 })
  return { folder, config, agent, batch, heldOut, train }
})

const sampled = (groups: ReadonlyArray<Trajectory.Group>) =>
  groups.flatMap((g) =>
    g.trajectories.map((t) => ({
      tokens: t.segments.flatMap((s) => Array.from(Trajectory.tokenIds(s))),
      // NaN (a token the policy did not sample) as null, so that equal arrays compare equal
      logprobs: t.segments.flatMap((s) => Array.from(Trajectory.logprobs(s), (x) => (Number.isNaN(x) ? null : x)))
    }))
  )

describe("LocalPolicy", () => {
  it.effect("prefillAlone: one distinct prompt at a time; a request interrupted waiting or admitted lets the next in", () =>
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
        Effect.forkChild(sampler.generate({ promptTokenIds: [...prompt].map((c) => c.charCodeAt(0)), sampling: { temperature: 1, maxTokens: 1 } }))
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
    }))

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
      }).pipe(Effect.provide(NodeServices.layer)), 120_000)
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
    }).pipe(Effect.provide(NodeServices.layer)), 120_000)

  it.live("a step that makes the weights non-finite stops the run with a typed error before anything is saved", () =>
    Effect.gen(function*() {
      const { folder, config: decoded, train } = yield* fixture
      // lr Infinity (what JSON makes of 1e400) is refused by the config's Schema; a program may still build one.
      const config = {
        ...decoded,
        algorithm: { ...decoded.algorithm, lr: Infinity, advantage: "reinforce++" as const, entropyCoef: 0.01 },
        checkpoint: { every: 1, keep: 5 }
      }
      const error = yield* Effect.flip(Effect.scoped(TrainLoop.run({
        task: CalculatorTask.make(),
        config,
        format: ChainFormat.ofConfig(config, folder),
        train
      })).pipe(Effect.provide(Layer.provideMerge(Rollouts.inProcess, LocalPolicy.layer(folder, config))), Effect.provide(ResourceManager.ResourceManager.layer)))
      assert.strictEqual(error.reason._tag, "NonFinite")
      assert.match(error.message, /step 1 made the weights non-finite \(.+\[\d+\] = (NaN|-?Infinity)\)/)
      const journal = (yield* Journal.read(join(config.output, "journal.jsonl"))).entries.map((e) => e.entry.kind)
      assert.notInclude(journal, "step", "no learner step journaled")
      assert.notInclude(journal, "checkpoint")
      const checkpoints = join(config.output, "checkpoints")
      assert.deepStrictEqual(existsSync(checkpoints) ? readdirSync(checkpoints) : [], [], "no checkpoint written")
    }).pipe(Effect.provide(NodeServices.layer)), 120_000)

  it.live("with KL in the reward a GRPO step whose groups' outcomes are all equal is not skipped (each chain pays its own KL)", () =>
    Effect.gen(function*() {
      const { folder, config: decoded, batch } = yield* fixture
      const on = (klInReward: number | undefined) =>
        Effect.scoped(Effect.gen(function*() {
          const config = {
            ...decoded,
            algorithm: { ...decoded.algorithm, advantage: "grpo" as const, ...(klInReward === undefined ? {} : { klInReward }) }
          }
          const { learner, sampler, versions } = yield* LocalPolicy.make(folder, config)
          yield* versions.publish(0) // RL starts: the reference is frozen here
          const groups = yield* Effect.provideService(batch, Sampler, sampler)
          // Every chain scored 0: no outcome differs within any group.
          const equal = groups.map((g) => ({
            ...g,
            trajectories: g.trajectories.map((t) => ({ ...t, reward: 0, rewardStatus: "scored" as const }))
          }))
          return (yield* learner.learn(1, equal)).figures
        }))
      const plain = yield* on(undefined)
      assert.strictEqual(plain["learner/applied"], 0, "outcomes alone: no signal, the step is skipped")
      assert.strictEqual(plain["learner/groups_with_signal"], 0)
      const kl = yield* on(0.5)
      assert.strictEqual(kl["learner/groups_with_signal"], 2, JSON.stringify(kl))
      assert.isTrue(Number.isFinite(kl["learner/reward_kl"]), "the step reached the learner and scored the reference")
    }).pipe(Effect.provide(NodeServices.layer)), 120_000)

  it.live("KL in the reward and recomputed old logprobs from the config: the reward's KL is recorded, the reference saved", () =>
    Effect.gen(function*() {
      const { folder, config: decoded, train } = yield* fixture
      const config = {
        ...decoded,
        algorithm: {
          ...decoded.algorithm,
          advantage: "reinforce++" as const,
          entropyCoef: 0.01,
          klInReward: 0.1,
          recomputeOldLogprobs: true
        },
        checkpoint: { every: 2, keep: 5 }
      }
      yield* Effect.scoped(TrainLoop.run({
        task: CalculatorTask.make(),
        config,
        format: ChainFormat.ofConfig(config, folder),
        train
      })).pipe(Effect.provide(Layer.provideMerge(Rollouts.inProcess, LocalPolicy.layer(folder, config))), Effect.provide(ResourceManager.ResourceManager.layer))
      const steps = readFileSync(join(config.output, "metrics.jsonl"), "utf8").trim().split("\n")
        .map((l) => JSON.parse(l) as { phase: string; figures: Record<string, number> })
        .filter((r) => r.phase === "train")
      assert.strictEqual(steps.length, 2)
      // Step 1 samples with the reference itself (KL 0); step 2 with the policy one update away from it.
      for (const r of steps) assert.isTrue(Number.isFinite(r.figures["learner/reward_kl"]), JSON.stringify(r.figures))
      assert.notStrictEqual(steps[1]!.figures["learner/reward_kl"], 0)
      assert.isTrue(existsSync(join(config.output, "checkpoints", "step-000002", "reference.safetensors")))
    }).pipe(Effect.provide(NodeServices.layer)), 120_000)
})
