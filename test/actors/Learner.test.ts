import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Ref } from "effect"
import * as Learner from "../../actors/Learner.ts"
import {
  Advantage,
  Loss,
  LrSchedule,
  OnnxTrainer,
  Optimizer,
  Packing,
  GradientBackend,
  Qwen2,
  Sampling
} from "../../src/index.ts"
import type { Trajectory } from "../../src/index.ts"
import { tinyConfig } from "../utils/tinyModel.ts"

/** A one-step trajectory: prompt tokens then one sampled action. */
const trajectory = (
  id: string,
  groupId: string,
  prompt: ReadonlyArray<number>,
  action: number,
  logprob: number,
  reward: number,
  overrides: Partial<Trajectory.Trajectory> = {}
): Trajectory.Trajectory => ({
  trajectoryId: id,
  groupId,
  chainId: id,
  messages: [],
  segments: [{
    spans: [
      { source: "prompt", tokenIds: [...prompt] },
      { source: "policy", tokenIds: [action], logprobs: [logprob], policyVersion: 0 }
    ],
    messageCount: 0
  }],
  termination: "answer",
  reward,
  rewardStatus: "scored",
  metrics: {},
  trainable: true,
  masked: false,
  ...overrides
})

const options: Learner.Options = {
  estimator: "grpo",
  loss: Loss.grpo,
  tokenBudget: 64,
  lengthMultiple: 4
}

/** The model of the tests that run a real trainer: one layer, 16 tokens. */
const smallModel = tinyConfig({
  vocabSize: 16,
  hiddenSize: 16,
  numAttentionHeads: 2,
  numKeyValueHeads: 1,
  intermediateSize: 32,
  numHiddenLayers: 1
})

/**
 * The one-step bandit of the learning tests: after the prompt [3, 9] the policy picks one of 16 tokens, and token 7 is
 * rewarded. `read` gives a trainer's per-action outputs after the prompt (a policy's logprobs, a critic's values)
 * from its forward-only pass; `sample` draws `n` trajectories from logprobs `lp`.
 */
const bandit = (() => {
  const config = smallModel
  const prompt = [3, 9]
  const rewarded = 7
  const probe = Packing.packUnsafe(
    Array.from(
      { length: config.vocabSize },
      (_, v) => ({ tokenIds: Int32Array.of(...prompt, v), lossMask: Uint8Array.of(0, 0, 1) })
    ),
    { tokenBudget: 1024, lengthMultiple: 4, aggregation: "token-mean" }
  ).microBatches[0]!
  const read = <E>(trainer: {
    readonly logprobs: (mb: Packing.MicroBatch) => Effect.Effect<{ readonly tokenLogprobs: Float32Array }, E>
  }) =>
    Effect.map(trainer.logprobs(probe), ({ tokenLogprobs }) => {
      const out = new Float64Array(config.vocabSize)
      probe.sequenceIndex.forEach((v, r) => (out[v] = tokenLogprobs[r * probe.length + prompt.length - 1]!))
      return out
    })
  const sample = (lp: Float64Array, rng: ReturnType<typeof Sampling.rng>, n: number, groupId: string) =>
    Array.from({ length: n }, (_, i) => {
      let u = rng.next()
      let action = 0
      while (action < config.vocabSize - 1 && (u -= Math.exp(lp[action]!)) > 0) action++
      return trajectory(`${groupId}.${i}`, groupId, prompt, action, lp[action]!, action === rewarded ? 1 : 0)
    })
  return { config, rewarded, read, sample }
})()

describe("Learner.update", () => {
  it.effect("advantages exclude not-applicable and masked trajectories; one optimiser step reports its figures", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      const g1: Trajectory.Group = {
        groupId: "g1",
        rowIndex: 0,
        trajectories: [
          trajectory("a", "g1", [1, 2], 5, -1, 1),
          trajectory("b", "g1", [1, 2], 6, -2, 0),
          trajectory("c", "g1", [1, 2], 7, -3, 9, { rewardStatus: "not_applicable" }),
          trajectory("d", "g1", [1, 2], 8, -4, 9, { masked: true })
        ]
      }
      const g2: Trajectory.Group = {
        groupId: "g2",
        rowIndex: 1,
        trajectories: [
          trajectory("e", "g2", [3], 4, -1, 2),
          trajectory("f", "g2", [3], 4, -1, 4),
          trajectory("g", "g2", [3], 4, -1, 0)
        ]
      }
      const report = yield* Learner.update([g1, g2], options)
      const { microBatches, steps } = yield* Ref.get(recording)
      assert.strictEqual(steps, 1)
      const rows = microBatches.flatMap((mb) =>
        Array.from(mb.sequenceIndex, (index, r) => {
          if (index < 0) return [] // an empty padding row
          const t = Array.from(mb.mask.subarray(r * mb.length, (r + 1) * mb.length)).indexOf(1)
          return [{
            target: mb.targets[r * mb.length + t]!,
            advantage: mb.advantages[r * mb.length + t]!,
            old: mb.samplerLogprobs[r * mb.length + t]!
          }]
        }).flat()
      )
      // c and d (actions 7, 8) are out of the loss; a/b are ±1/√2 around mean 0.5 (std of [1, 0] = √½); e's reward
      // is its group's mean, so its advantage is 0 and it is not computed
      assert.deepStrictEqual(rows.map((r) => r.target).sort(), [4, 4, 5, 6])
      const a = rows.find((r) => r.target === 5)!
      assert.approximately(a.advantage, 0.5 / (Math.SQRT1_2 + 1e-6), 1e-5)
      assert.strictEqual(a.old, -1)
      const g2Advantages = rows.filter((r) => r.target === 4).map((r) => r.advantage).sort((x, y) => x - y)
      const expected = yield* Advantage.compute("grpo", {
        batch: 3,
        length: 1,
        tokenRewards: Float64Array.of(2, 4, 0),
        responseMask: Uint8Array.of(1, 1, 1),
        groupIndex: Int32Array.of(0, 0, 0)
      })
      const want = Array.from(expected.advantages).filter((x) => x !== 0).sort((x, y) => x - y)
      assert.strictEqual(g2Advantages.length, 2)
      g2Advantages.forEach((v, i) => assert.approximately(v, want[i]!, 1e-5))
      assert.strictEqual(report.outcome, "applied")
      assert.strictEqual(report.figures["excluded"], 2)
      assert.strictEqual(report.figures["learner/optimizer_steps"], 1)
      for (const key of [
        "learner/loss",
        "learner/clip_frac",
        "learner/approx_kl",
        "learner/entropy",
        "learner/grad_norm",
        "learner/tokens_per_s",
        "learner/step_ms"
      ]) {
        assert.isTrue(Number.isFinite(report.figures[key]), key)
      }
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("mini-batches and epochs: one optimiser step per mini-batch of whole groups, each normalised alone", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      // Four groups; group g samples action 10 + g, so a micro-batch's targets tell which groups it holds.
      const groups: Array<Trajectory.Group> = [0, 1, 2, 3].map((g) => ({
        groupId: `g${g}`,
        rowIndex: g,
        trajectories: [0, 1].map((c) => trajectory(`t${g}${c}`, `g${g}`, [1, 2], 10 + g, -1, c))
      }))
      const result = yield* Learner.update(groups, { ...options, miniBatches: 2, epochs: 2 })
      assert.strictEqual(result.outcome, "applied")
      assert.strictEqual(result.figures["learner/optimizer_steps"], 4)
      const { microBatches, steps } = yield* Ref.get(recording)
      assert.strictEqual(steps, 4)
      const actions = (mb: Packing.MicroBatch) =>
        [...new Set(Array.from(mb.targets).filter((_, i) => mb.mask[i] === 1))].sort((a, b) => a - b)
      // tokenBudget 64 holds a whole mini-batch: one micro-batch per optimiser step, epochs repeat the order.
      assert.deepStrictEqual(microBatches.map(actions), [[10, 11], [12, 13], [10, 11], [12, 13]])
      // token-mean weights sum to 1 within each mini-batch, not over the whole step.
      for (const mb of microBatches) assert.approximately(mb.weights.reduce((a, w) => a + w, 0), 1, 1e-6)
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("sharePrefix: a group's prompt packed once, each chain's rest in its row; the weights are unchanged", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      const prompt = Array.from({ length: 12 }, (_, i) => 20 + i)
      const groups: Array<Trajectory.Group> = [0, 1].map((g) => ({
        groupId: `g${g}`,
        rowIndex: g,
        trajectories: [0, 1, 3].map((c) => trajectory(`t${g}${c}`, `g${g}`, [g, ...prompt], 10 + c, -1, c))
      }))
      const unpadded = { ...options, tokenBudget: 128, padRows: false }
      yield* Learner.update(groups, { ...unpadded, sharePrefix: true })
      yield* Learner.update(groups, unpadded)
      const [shared, plain] = (yield* Ref.get(recording)).microBatches
      // 6 rows of 13 + 1 tokens → the 2 groups' 12 common tokens once, and 6 rows of each chain's last 2
      assert.deepStrictEqual([plain!.batch, plain!.length], [6, 16])
      assert.deepStrictEqual([shared!.batch, shared!.length, shared!.prefix!.batch, shared!.prefix!.length], [6, 4, 2, 12])
      assert.deepStrictEqual([...shared!.prefix!.index], [0, 0, 0, 1, 1, 1])
      assert.deepStrictEqual([...shared!.positionIds!.subarray(0, 4)], [12, 13, 0, 0])
      const weights = (mb: Packing.MicroBatch) => Array.from(mb.weights).filter((w) => w !== 0).sort()
      assert.deepStrictEqual(weights(shared!), weights(plain!))
      assert.strictEqual(shared!.lossTokens, plain!.lossTokens)
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("groups without reward variance cost no compute but count in the normalisation (a weaker step)", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      // Group 0 has a signal (rewards 0, 1); group 1 does not (1, 1). Each samples its own action: 10 or 11.
      const groups: Array<Trajectory.Group> = [[0, 1], [1, 1]].map((rewards, g) => ({
        groupId: `g${g}`,
        rowIndex: g,
        trajectories: rewards.map((r, c) => trajectory(`t${g}${c}`, `g${g}`, [1, 2], 10 + g, -1, r))
      }))
      const actions = (mb: Packing.MicroBatch) =>
        [...new Set(Array.from(mb.targets).filter((_, i) => mb.mask[i] === 1))].sort((a, b) => a - b)
      const weightSum = (mb: Packing.MicroBatch) => mb.weights.reduce((a, w) => a + w, 0)
      for (const aggregation of ["token-mean", "seq-mean-token-mean"] as const) {
        yield* Ref.set(recording, { microBatches: [], steps: 0 })
        const result = yield* Learner.update(groups, { ...options, loss: { ...Loss.grpo, aggregation } })
        assert.strictEqual(result.outcome, "applied")
        const { microBatches } = yield* Ref.get(recording)
        assert.deepStrictEqual(microBatches.map(actions), [[10]], "only the group with a signal is computed")
        assert.approximately(weightSum(microBatches[0]!), 0.5, 1e-6, `${aggregation}: normalised over all 4 trajectories`)
      }
      // An entropy term gives every token a gradient: then everything is computed.
      yield* Ref.set(recording, { microBatches: [], steps: 0 })
      yield* Learner.update(groups, { ...options, loss: { ...Loss.grpo, entropyCoef: 0.01 } })
      const { microBatches } = yield* Ref.get(recording)
      assert.deepStrictEqual(microBatches.map(actions), [[10, 11]])
      assert.approximately(weightSum(microBatches[0]!), 1, 1e-6)
      // No signal at all: nothing to compute, no optimiser step.
      yield* Ref.set(recording, { microBatches: [], steps: 0 })
      const none = yield* Learner.update([groups[1]!], options)
      assert.strictEqual(none.outcome, "empty")
      assert.strictEqual((yield* Ref.get(recording)).steps, 0)
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("a trajectory with two segments becomes two rows carrying its advantage", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      const twoSegments = trajectory("a", "g", [1, 2], 5, -1, 1)
      const withSecond: Trajectory.Trajectory = {
        ...twoSegments,
        segments: [...twoSegments.segments, {
          spans: [{ source: "prompt", tokenIds: [7] }, { source: "policy", tokenIds: [8, 9], logprobs: [-0.5, -0.25] }],
          messageCount: 0
        }]
      }
      const result = yield* Learner.update([{
        groupId: "g",
        rowIndex: 0,
        trajectories: [withSecond, trajectory("b", "g", [1, 2], 6, -1, 0)]
      }], options)
      assert.strictEqual(result.outcome, "applied")
      const { microBatches } = yield* Ref.get(recording)
      const lossTokens = microBatches.flatMap((mb) =>
        Array.from(
          mb.mask,
          (
            m,
            i
          ) => (m ? { target: mb.targets[i]!, advantage: mb.advantages[i]!, old: mb.samplerLogprobs[i]! } : undefined)
        )
          .filter((x) => x !== undefined)
      )
      const a = 0.5 / (Math.SQRT1_2 + 1e-6)
      assert.deepStrictEqual(lossTokens.map((t) => t.target).sort(), [5, 6, 8, 9])
      for (const t of lossTokens) assert.approximately(t.advantage, t.target === 6 ? -a : a, 1e-5)
      assert.approximately(lossTokens.find((t) => t.target === 9)!.old, -0.25, 1e-7)
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("a step whose trajectories are all excluded is empty: nothing computed, no optimiser step", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      const result = yield* Learner.update([{
        groupId: "x",
        rowIndex: 0,
        trajectories: [
          trajectory("a", "x", [1], 2, -1, 1, { trainable: false }),
          trajectory("b", "x", [1], 3, -1, 0, { masked: true }),
          trajectory("c", "x", [1], 4, -1, 0, { rewardStatus: "not_applicable" })
        ]
      }], options)
      assert.strictEqual(result.outcome, "empty")
      assert.strictEqual(result.figures["excluded"], 3)
      assert.deepStrictEqual(yield* Ref.get(recording), { microBatches: [], steps: 0 })
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("a non-finite mini-batch is skipped and the others apply; all non-finite is an outcome, not an error", () =>
    Effect.gen(function*() {
      const recorded = yield* GradientBackend.GradientBackend
      const recording = yield* GradientBackend.RecordingRef
      // The recording trainer, whose optimiser steps fail as `failures` says (by call, from 0).
      const failing = (failures: ReadonlyArray<GradientBackend.GradientBackendErrorReason["_tag"] | undefined>) => {
        let calls = 0
        return GradientBackend.GradientBackend.of({
          ...recorded,
          optimStep: Effect.suspend(() => {
            const reason = failures[calls++]
            return reason === undefined
              ? recorded.optimStep
              : Effect.fail(GradientBackend.gradientBackendError(reason, `step ${calls - 1}`))
          })
        })
      }
      const groups: Array<Trajectory.Group> = [0, 1].map((g) => ({
        groupId: `g${g}`,
        rowIndex: g,
        trajectories: [0, 1].map((c) => trajectory(`t${g}${c}`, `g${g}`, [1, 2], 10 + g, -1, c))
      }))
      const step = (failures: ReadonlyArray<GradientBackend.GradientBackendErrorReason["_tag"] | undefined>) =>
        Learner.update(groups, { ...options, miniBatches: 2 }).pipe(
          Effect.provideService(GradientBackend.GradientBackend, failing(failures))
        )
      const partial = yield* step(["NonFiniteGradient"])
      assert.strictEqual(partial.outcome, "applied")
      assert.strictEqual(partial.figures["learner/optimizer_steps"], 1)
      assert.strictEqual(partial.figures["learner/micro_batches"], 2)
      assert.strictEqual((yield* Ref.get(recording)).steps, 1)
      const none = yield* step(["NonFiniteGradient", "NonFiniteGradient"])
      assert.strictEqual(none.outcome, "non_finite")
      assert.isFalse("learner/loss" in none.figures)
      assert.strictEqual((yield* Ref.get(recording)).steps, 1)
      // any other optimiser failure fails the step
      const error = yield* Effect.flip(step([undefined, "Run"]))
      assert.strictEqual(error.reason._tag, "Trainer")
      assert.strictEqual(error.message, "step 1")
      // The trainer's own error is the cause, with its reason.
      assert.strictEqual((error.reason.cause as GradientBackend.GradientBackendError).reason._tag, "Run")
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("policy tokens without sampler logprobs are a typed error for PPO-style losses", () =>
    Effect.gen(function*() {
      const noLogprobs: Trajectory.Trajectory = {
        ...trajectory("a", "x", [1], 2, -1, 1),
        segments: [{
          spans: [{ source: "prompt", tokenIds: [1] }, { source: "policy", tokenIds: [2] }],
          messageCount: 0
        }]
      }
      const group = { groupId: "x", rowIndex: 0, trajectories: [noLogprobs, trajectory("b", "x", [1], 3, -1, 0)] }
      const error = yield* Effect.flip(Learner.update([group], options))
      assert.strictEqual(error.reason._tag, "MissingLogprobs")
      // recomputing the old policy without importance weights does not need them
      const ok = yield* Learner.update([group], { ...options, recomputeOldLogprobs: true })
      assert.strictEqual(ok.outcome, "applied")
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("KL in the reward: r − β·(log π_sampler − log π_ref) on every policy token, before advantages", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      const oneToken = trajectory("a", "g", [1], 5, -2, 1)
      const threeTokens: Trajectory.Trajectory = {
        ...trajectory("b", "g", [1], 6, -2, 1),
        segments: [{
          spans: [
            { source: "prompt", tokenIds: [1] },
            { source: "policy", tokenIds: [6, 7, 8], logprobs: [-2, -2, -2] }
          ],
          messageCount: 0
        }]
      }
      const group = { groupId: "g", rowIndex: 0, trajectories: [oneToken, threeTokens] }
      // the reference gives every target logprob −1: each policy token's reward moves by −0.1·(−2 − (−1)) = +0.1
      const reference = (mb: Packing.MicroBatch) => Effect.succeed(new Float32Array(mb.batch * mb.length).fill(-1))
      const result = yield* Learner.update([group], {
        ...options,
        estimator: "grpo-no-std",
        klInReward: 0.1,
        reference
      })
      assert.approximately(result.figures["learner/reward_kl"]!, -1, 1e-6)
      const { microBatches } = yield* Ref.get(recording)
      const advantageOf = (target: number) => {
        for (const mb of microBatches) {
          for (let i = 0; i < mb.mask.length; i++) if (mb.mask[i] && mb.targets[i] === target) return mb.advantages[i]!
        }
        return Number.NaN
      }
      // scores 1.1 and 1.3 around their mean 1.2
      assert.approximately(advantageOf(5), -0.1, 1e-6)
      for (const t of [6, 7, 8]) assert.approximately(advantageOf(t), 0.1, 1e-6)
      const missing = yield* Effect.flip(Learner.update([group], { ...options, klInReward: 0.1 }))
      assert.strictEqual(missing.reason._tag, "Config")
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("a KL loss without a reference policy is a Config error before any gradient", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      const group = {
        groupId: "x",
        rowIndex: 0,
        trajectories: [trajectory("a", "x", [1], 2, -1, 1), trajectory("b", "x", [1], 3, -1, 0)]
      }
      const error = yield* Effect.flip(Learner.update([group], { ...options, loss: { ...Loss.grpo, klCoef: 0.1 } }))
      assert.strictEqual(error.reason._tag, "Config")
      assert.deepStrictEqual(yield* Ref.get(recording), { microBatches: [], steps: 0 })
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("GRPO on a one-step bandit: the probability of the rewarded token rises monotonically (within noise)", () =>
    Effect.gen(function*() {
      const { config, rewarded } = bandit
      const trainer = yield* OnnxTrainer.make({
        model: OnnxTrainer.qwen2(config),
        weights: Qwen2.initWeights(config, 3),
        loss: Loss.grpo,
        optimizer: Optimizer.defaultConfig,
        schedule: LrSchedule.constant(1e-2)
      })
      const policy = bandit.read(trainer)
      let applied = 0
      const rng = Sampling.rng(17)
      const probabilities: Array<number> = []
      for (let step = 0; step < 30; step++) {
        const lp = yield* policy
        probabilities.push(Math.exp(lp[rewarded]!))
        const groups = Array.from({ length: 2 }, (_, g): Trajectory.Group => ({
          groupId: `${step}.${g}`,
          rowIndex: step,
          trajectories: bandit.sample(lp, rng, 16, `${step}.${g}`)
        }))
        // A step where no chain found the rewarded action has no signal: nothing is applied.
        const before = yield* trainer.trainer.step
        const report = yield* Learner.update(groups, { ...options, tokenBudget: 256 }).pipe(
          Effect.provideService(GradientBackend.GradientBackend, trainer.trainer)
        )
        const after = yield* trainer.trainer.step
        if (report.outcome === "applied") {
          applied++
          assert.strictEqual(after, before + 1)
        } else {
          assert.strictEqual(report.outcome, "empty")
          assert.strictEqual(after, before)
        }
      }
      assert.isAbove(applied, 20, "most steps had a signal")
      probabilities.push(Math.exp((yield* policy)[rewarded]!))
      const first = probabilities[0]!
      const last = probabilities.at(-1)!
      assert.isBelow(first, 0.15, `starts near uniform: ${first}`)
      assert.isAbove(last, 0.6, `curve: ${probabilities.map((p) => p.toFixed(3)).join(" ")}`)
      // monotone within noise: no drop larger than 0.03, and at most 3 drops at all
      const drops = probabilities.slice(1).map((p, i) => probabilities[i]! - p).filter((d) => d > 0)
      assert.isAtMost(drops.length, 3, `drops: ${drops}`)
      assert.isTrue(drops.every((d) => d < 0.03), `drops: ${drops}`)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})


describe("Learner with a KL penalty to a frozen reference", () => {
  it.effect("KL starts at 0 (same weights) and grows as the policy moves away from the reference", () =>
    Effect.gen(function*() {
      const config = smallModel
      const weights = Qwen2.initWeights(config, 3)
      const loss: Loss.Config = { ...Loss.grpo, klCoef: 0.05, klEstimator: "k3" }
      const trainer = yield* OnnxTrainer.make({
        model: OnnxTrainer.qwen2(config),
        weights,
        loss,
        optimizer: Optimizer.defaultConfig,
        schedule: LrSchedule.constant(1e-2)
      })
      const reference = yield* OnnxTrainer.makeReference(OnnxTrainer.qwen2(config), weights)
      const kls: Array<number> = []
      for (let step = 0; step < 5; step++) {
        const trajectories = [
          4,
          5,
          6,
          7
        ].map((a) => trajectory(`${step}.${a}`, `${step}`, [3, 9], a, -Math.log(16), a === 7 ? 1 : 0))
        const r = yield* Learner.update([{ groupId: `${step}`, rowIndex: step, trajectories }], {
          ...options,
          loss,
          reference
        }).pipe(Effect.provideService(GradientBackend.GradientBackend, trainer.trainer))
        assert.strictEqual(r.outcome, "applied")
        kls.push(r.figures["learner/kl"]!)
      }
      assert.approximately(kls[0]!, 0, 1e-6)
      assert.isAbove(kls.at(-1)!, 1e-4, `kl: ${kls}`)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})

describe("Learner with recomputed old logprobs and truncated importance weights", () => {
  it.effect("stale sampler logprobs move the PPO ratio unless the old policy is recomputed (then TIS corrects)", () =>
    Effect.gen(function*() {
      const config = smallModel
      const loss: Loss.Config = { ...Loss.grpo, tisCap: 2 }
      const run = (recomputeOldLogprobs: boolean) =>
        Effect.gen(function*() {
          const trainer = yield* OnnxTrainer.make({
            model: OnnxTrainer.qwen2(config),
            weights: Qwen2.initWeights(config, 3),
            loss,
            optimizer: Optimizer.defaultConfig,
            schedule: LrSchedule.constant(1e-2)
          })
          // the sampler was far from the learner: its logprobs are 1.5 nats lower than the learner's (≈ −ln 16)
          const stale = -Math.log(16) - 1.5
          const group: Trajectory.Group = {
            groupId: "g",
            rowIndex: 0,
            trajectories: [4, 5, 6, 7].map((a) => trajectory(`${a}`, "g", [3, 9], a, stale, a === 7 ? 1 : 0))
          }
          return yield* Learner.update([group], { ...options, loss, recomputeOldLogprobs }).pipe(
            Effect.provideService(GradientBackend.GradientBackend, trainer.trainer)
          )
        })
      const plain = yield* run(false)
      const recomputed = yield* run(true)
      // without recomputation the ratio π/π_sampler ≈ e^1.5 is clipped for positive advantages
      assert.isAbove(Math.abs(plain.figures["learner/approx_kl"]!), 1)
      assert.isAbove(plain.figures["learner/clip_frac"]!, 0)
      // with it, the ratio is exactly 1 at the update: no clipping, no approximate KL
      assert.approximately(recomputed.figures["learner/approx_kl"]!, 0, 1e-6)
      assert.strictEqual(recomputed.figures["learner/clip_frac"], 0)
      assert.strictEqual(recomputed.outcome, "applied")
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})

describe("Learner step failures", () => {
  it.effect("a step abandoned after some micro-batches leaves no gradient behind", () =>
    Effect.gen(function*() {
      const config = smallModel
      const make = OnnxTrainer.make({
        model: OnnxTrainer.qwen2(config),
        weights: Qwen2.initWeights(config, 3),
        loss: Loss.grpo,
        optimizer: Optimizer.defaultConfig,
        schedule: LrSchedule.constant(1e-2)
      })
      const good: Trajectory.Group = {
        groupId: "g",
        rowIndex: 0,
        trajectories: [trajectory("a", "g", [3, 9], 7, -2.7, 1), trajectory("b", "g", [3, 9], 4, -2.7, 0)]
      }
      // the longer (first-packed) trajectories are fine; the last micro-batch has a token outside the vocabulary
      const bad: Trajectory.Group = {
        groupId: "h",
        rowIndex: 1,
        trajectories: [
          trajectory("c", "h", [3, 9, 1, 2, 3, 4], 7, -2.7, 1),
          trajectory("d", "h", [3, 9, 1, 2, 3, 4], 5, -2.7, 0),
          trajectory("e", "h", [99], 5, -2.7, 0)
        ]
      }
      const small = { ...options, tokenBudget: 8, lengthMultiple: 8 }
      const dirty = yield* make
      const failure = yield* Effect.flip(
        Learner.update([bad], small).pipe(Effect.provideService(GradientBackend.GradientBackend, dirty.trainer))
      )
      assert.strictEqual(failure.reason._tag, "Trainer")
      yield* Learner.update([good], small).pipe(Effect.provideService(GradientBackend.GradientBackend, dirty.trainer))
      const clean = yield* make
      yield* Learner.update([good], small).pipe(Effect.provideService(GradientBackend.GradientBackend, clean.trainer))
      const a = yield* dirty.trainer.weights
      const b = yield* clean.trainer.weights
      for (const [name, w] of a) assert.deepStrictEqual(Array.from(w), Array.from(b.get(name)!), name)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})

describe("Learner with a critic (PPO with GAE)", () => {
  /** A critic that values tokens by `value` and records what it is trained on (a second recording trainer). */
  const scriptedCritic = (value: number | ((batch: Packing.MicroBatch) => Float32Array)) =>
    Effect.map(Layer.build(GradientBackend.layerRecording(new Map(), value)), (context) => ({
      critic: Context.get(context, GradientBackend.GradientBackend),
      recording: Context.get(context, GradientBackend.RecordingRef)
    }))

  it.effect("advantages are the returns minus the critic's values (whitened); the critic learns the returns", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      const { critic, recording: criticRecording } = yield* scriptedCritic(0.25)
      const group = {
        groupId: "g",
        rowIndex: 0,
        trajectories: [
          trajectory("a", "g", [1], 5, -2, 1),
          trajectory("b", "g", [1], 6, -2, 0),
          trajectory("c", "g", [1], 7, -2, 0.5)
        ]
      }
      const result = yield* Learner.update([group], { ...options, estimator: "gae", loss: Loss.ppo, critic })
      assert.strictEqual(result.outcome, "applied")
      const { microBatches } = yield* Ref.get(recording)
      const { microBatches: trained, steps } = yield* Ref.get(criticRecording)
      const at = (mbs: ReadonlyArray<Packing.MicroBatch>, target: number, field: "advantages" | "samplerLogprobs") => {
        for (const mb of mbs) for (let i = 0; i < mb.mask.length; i++) if (mb.mask[i] && mb.targets[i] === target) return mb[field][i]!
        return Number.NaN
      }
      // γ = λ = 1: each one-token answer's advantage is r − 0.25 (0.75, −0.25, 0.25), whitened over the batch.
      const raw = [0.75, -0.25, 0.25]
      const mean = raw.reduce((a, b) => a + b, 0) / 3
      const std = Math.sqrt(raw.reduce((a, b) => a + (b - mean) ** 2, 0) / 2)
      // The third is the mean: a zero advantage, so its row costs the policy no compute.
      ;[5, 6].forEach((t, i) => assert.approximately(at(microBatches, t, "advantages"), (raw[i]! - mean) / std, 1e-4))
      assert.isNaN(at(microBatches, 7, "advantages"))
      // The critic's rows: the returns (the rewards, γ = λ = 1) as targets, its own values as the old ones.
      ;[5, 6, 7].forEach((t, i) => assert.approximately(at(trained, t, "advantages"), [1, 0, 0.5][i]!, 1e-6))
      for (const t of [5, 6, 7]) assert.approximately(at(trained, t, "samplerLogprobs"), 0.25, 1e-6)
      assert.strictEqual(steps, 1)
      assert.approximately(result.figures["critic/value_mean"]!, 0.25, 1e-6)
      assert.approximately(result.figures["critic/return_mean"]!, 0.5, 1e-6)
      assert.strictEqual(result.figures["critic/optimizer_steps"], 1)
      // The critic's warm-up: the critic trains, the policy's trainer is not touched.
      const warmup = yield* Learner.update([group], { ...options, estimator: "gae", loss: Loss.ppo, critic, criticOnly: true })
      assert.strictEqual(warmup.outcome, "critic_only")
      assert.strictEqual((yield* Ref.get(criticRecording)).steps, 2)
      assert.deepStrictEqual((yield* Ref.get(recording)).microBatches.length, microBatches.length, "no policy compute")
      assert.strictEqual((yield* Ref.get(recording)).steps, 1, "no policy step")
      const missing = yield* Effect.flip(Learner.update([group], { ...options, estimator: "gae", loss: Loss.ppo }))
      assert.strictEqual(missing.reason._tag, "Config")
      assert.include(missing.message, "critic")
    }).pipe(Effect.scoped, Effect.provide(GradientBackend.layerRecording())))

  it.effect("multi-turn: each policy token gets the value of the state before it, tool tokens carry none (GAE skips them)", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      // The critic values the state before token y at y / 10, so every value shows which token it was given to.
      const { critic, recording: criticRecording } = yield* scriptedCritic((mb) =>
        Float32Array.from(mb.targets, (y) => y / 10)
      )
      const turns = (id: string, policy: ReadonlyArray<ReadonlyArray<number>>, reward: number) => ({
        ...trajectory(id, "g", [1, 2], 0, -1, reward),
        segments: [{
          spans: [
            { source: "prompt" as const, tokenIds: [1, 2] },
            { source: "policy" as const, tokenIds: [...policy[0]!], logprobs: policy[0]!.map(() => -1) },
            { source: "tool" as const, tokenIds: [3, 4] },
            { source: "policy" as const, tokenIds: [...policy[1]!], logprobs: policy[1]!.map(() => -1) }
          ],
          messageCount: 0
        }]
      })
      const group = { groupId: "g", rowIndex: 0, trajectories: [turns("a", [[5, 6], [9]], 1), turns("b", [[10], [11]], 0)] }
      yield* Learner.update([group], { ...options, estimator: "gae", loss: Loss.ppo, critic })
      // γ = λ = 1: the advantage of a policy token is R − V(before it): a 0.5, 0.4, 0.1; b −1.0, −1.1; then whitened.
      const raw = new Map([[5, 0.5], [6, 0.4], [9, 0.1], [10, -1.0], [11, -1.1]])
      const mean = [...raw.values()].reduce((x, y) => x + y, 0) / raw.size
      const std = Math.sqrt([...raw.values()].reduce((x, y) => x + (y - mean) ** 2, 0) / (raw.size - 1))
      const seen = (mbs: ReadonlyArray<Packing.MicroBatch>, field: "advantages" | "samplerLogprobs") => {
        const out = new Map<number, number>()
        for (const mb of mbs) for (let i = 0; i < mb.mask.length; i++) if (mb.mask[i]) out.set(mb.targets[i]!, mb[field][i]!)
        return out
      }
      const advantages = seen((yield* Ref.get(recording)).microBatches, "advantages")
      assert.deepStrictEqual([...advantages.keys()].sort((x, y) => x - y), [5, 6, 9, 10, 11], "tool tokens carry no loss")
      for (const [token, a] of raw) assert.approximately(advantages.get(token)!, (a - mean) / std, 1e-4, `token ${token}`)
      // The critic's own rows: its old values where it valued them, the returns (the reward) as targets.
      const trained = (yield* Ref.get(criticRecording)).microBatches
      for (const [token, value] of seen(trained, "samplerLogprobs")) assert.approximately(value, token / 10, 1e-6)
      for (const [token, target] of seen(trained, "advantages")) assert.approximately(target, token < 10 ? 1 : 0, 1e-6)
    }).pipe(Effect.scoped, Effect.provide(GradientBackend.layerRecording())))

  it.effect("PPO with a real critic on a one-step bandit: the critic's value approaches the mean reward and the rewarded token's probability rises", () =>
    Effect.gen(function*() {
      const { config, rewarded } = bandit
      const weights = Qwen2.initWeights(config, 3)
      const policy = yield* OnnxTrainer.make({
        model: OnnxTrainer.qwen2(config),
        weights,
        loss: Loss.ppo,
        optimizer: Optimizer.defaultConfig,
        schedule: LrSchedule.constant(1e-2)
      })
      const critic = yield* OnnxTrainer.make({
        model: OnnxTrainer.qwen2Value(config),
        weights: Qwen2.criticWeights(config, weights),
        loss: Loss.value,
        optimizer: Optimizer.defaultConfig,
        schedule: LrSchedule.constant(1e-2)
      })
      const rng = Sampling.rng(17)
      const probabilities: Array<number> = []
      const values: Array<number> = []
      const rewards: Array<number> = []
      for (let step = 0; step < 30; step++) {
        const lp = yield* bandit.read(policy)
        probabilities.push(Math.exp(lp[rewarded]!))
        values.push((yield* bandit.read(critic))[0]!) // the value of the state after the prompt (any action row)
        const trajectories = bandit.sample(lp, rng, 32, `${step}`)
        rewards.push(trajectories.filter((t) => t.reward === 1).length / trajectories.length)
        yield* Learner.update([{ groupId: `${step}`, rowIndex: step, trajectories }], {
          ...options,
          estimator: "gae",
          loss: Loss.ppo,
          tokenBudget: 256,
          critic: critic.trainer
        }).pipe(Effect.provideService(GradientBackend.GradientBackend, policy.trainer))
      }
      const first = probabilities[0]!
      const last = probabilities.at(-1)!
      assert.isBelow(first, 0.15, `starts near uniform: ${first}`)
      assert.isAbove(last, 0.5, `curve: ${probabilities.map((p) => p.toFixed(3)).join(" ")}`)
      // The value head starts at 0 and tracks the rising mean reward: close to the last steps' rewards.
      assert.strictEqual(values[0], 0)
      const recent = rewards.slice(-5).reduce((a, b) => a + b, 0) / 5
      assert.isBelow(Math.abs(values.at(-1)! - recent), 0.2, `values ${values.map((v) => v.toFixed(2)).join(" ")} vs rewards ${recent}`)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.effect("a critic with shared prompts (sharePrefix) values and learns as with whole rows", () =>
    Effect.gen(function*() {
      const config = { ...smallModel, numHiddenLayers: 2 }
      // A value head of random weights, so that values differ from token to token.
      const start = Qwen2.criticWeights(config, Qwen2.initWeights(config, 5))
      start.set("value_head.weight", Float32Array.from({ length: 16 }, (_, i) => Math.sin(i + 1) * 0.3))
      const prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
      const groups = [0, 1].map((g): Trajectory.Group => ({
        groupId: `g${g}`,
        rowIndex: g,
        trajectories: [0, 1, 2, 3].map((i) => ({
          ...trajectory(`${g}.${i}`, `g${g}`, prompt.map((t) => (t + g) % 16), 11, -1, (i + g) % 3 === 0 ? 1 : 0),
          segments: [{
            spans: [
              { source: "prompt" as const, tokenIds: prompt.map((t) => (t + g) % 16) },
              { source: "policy" as const, tokenIds: [11 + (i % 3), 12, 13 - g], logprobs: [-1, -1, -1] }
            ],
            messageCount: 0
          }]
        }))
      }))
      const stepWith = (sharePrefix: boolean) =>
        Effect.gen(function*() {
          const critic = yield* OnnxTrainer.make({
            model: OnnxTrainer.qwen2Value(config),
            weights: start,
            loss: Loss.value,
            optimizer: Optimizer.defaultConfig,
            schedule: LrSchedule.constant(1e-2)
          })
          const result = yield* Effect.gen(function*() {
            const result = yield* Learner.update(groups, {
              ...options,
              estimator: "gae",
              loss: Loss.ppo,
              tokenBudget: 256,
              sharePrefix,
              critic: critic.trainer
            })
            const { microBatches } = yield* Ref.get(yield* GradientBackend.RecordingRef)
            return { result, microBatches }
          }).pipe(Effect.provide(GradientBackend.layerRecording()))
          return { ...result, weights: yield* critic.trainer.weights }
        })
      const whole = yield* stepWith(false)
      const shared = yield* stepWith(true)
      assert.isTrue(shared.microBatches.some((mb) => mb.prefix !== undefined), "the policy's rows shared their prompts")
      for (const key of ["critic/value_mean", "critic/mse", "critic/loss", "critic/explained_variance"]) {
        assert.approximately(shared.result.figures[key]!, whole.result.figures[key]!, 1e-5, key)
      }
      assert.notStrictEqual(whole.result.figures["critic/value_mean"], 0)
      const advantages = (mbs: ReadonlyArray<Packing.MicroBatch>) =>
        mbs.flatMap((mb) => [...mb.advantages].filter((_, i) => mb.mask[i] === 1)).sort((a, b) => a - b)
      const a = advantages(whole.microBatches), b = advantages(shared.microBatches)
      assert.strictEqual(a.length, 24)
      a.forEach((x, i) => assert.approximately(b[i]!, x, 1e-4))
      for (const [name, w] of whole.weights) {
        const v = shared.weights.get(name)!
        w.forEach((x, i) => assert.approximately(v[i]!, x, 1e-5, name))
      }
    }).pipe(Effect.provide(NodeServices.layer)))
})
