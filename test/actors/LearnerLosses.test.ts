/**
 * The losses of issue 48 in a run: how a config chooses them (`LocalPolicy.lossConfig`, the async trust region),
 * DAPO's over-long shaping before advantages, and GSPO and CISPO learning a one-step bandit on a real trainer.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Ref } from "effect"
import * as Learner from "../../actors/Learner.ts"
import * as LocalPolicy from "../../actors/LocalPolicy.ts"
import { GradientBackend, Loss, LrSchedule, OnnxTrainer, Optimizer, Packing, Qwen2, Sampling } from "../../src/index.ts"
import type { Trajectory } from "../../src/index.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import { tinyConfig } from "../utils/tinyModel.ts"

const minimal = {
  output: "runs/x",
  model: { path: "model", preset: "tiny" },
  data: { train: "data/train.jsonl" },
  task: "calculator",
  algorithm: { steps: 10 }
}

const trajectory = (
  id: string,
  prompt: ReadonlyArray<number>,
  actions: ReadonlyArray<number>,
  logprob: number,
  reward: number
): Trajectory.Trajectory => ({
  trajectoryId: id,
  groupId: "g",
  chainId: id,
  messages: [],
  segments: [{
    spans: [
      { source: "prompt", tokenIds: [...prompt] },
      { source: "policy", tokenIds: [...actions], logprobs: actions.map(() => logprob), policyVersion: 0 }
    ],
    messageCount: 0
  }],
  termination: "answer",
  reward,
  rewardStatus: "scored",
  metrics: {},
  trainable: true,
  masked: false
})

describe("lossConfig: a config's loss", () => {
  it.effect("the demo's keys give GRPO's loss as before; policyLoss, dualClip and the async trust region", () =>
    Effect.gen(function*() {
      const sync = yield* TrainConfig.decode(minimal)
      const plain = LocalPolicy.lossConfig(sync.algorithm, 1, sync)
      assert.deepStrictEqual(plain, { ...Loss.grpo, aggregation: "token-mean" }) // no dual clip, no new key
      const async = yield* TrainConfig.decode({ ...minimal, mode: "async", maxStaleness: 3 })
      assert.strictEqual(LocalPolicy.lossConfig(async.algorithm, 1, async).dualClip, 3)
      const fresh = yield* TrainConfig.decode({ ...minimal, mode: "async", maxStaleness: 0 })
      assert.isUndefined(LocalPolicy.lossConfig(fresh.algorithm, 1, fresh).dualClip)
      const off = yield* TrainConfig.decode({ ...minimal, mode: "async", algorithm: { steps: 10, dualClip: "off" } })
      assert.isUndefined(LocalPolicy.lossConfig(off.algorithm, 1, off).dualClip)
      const set = yield* TrainConfig.decode({ ...minimal, algorithm: { steps: 10, dualClip: 5 } })
      assert.strictEqual(LocalPolicy.lossConfig(set.algorithm, 1, set).dualClip, 5)
      // GSPO and CISPO bound their own ratios: no dual clip by default in async mode
      const gspo = yield* TrainConfig.decode({
        ...minimal,
        mode: "async",
        algorithm: { steps: 10, policyLoss: "gspo" }
      })
      const loss = LocalPolicy.lossConfig(gspo.algorithm, 1, gspo)
      assert.strictEqual(loss.policyLoss, "gspo")
      assert.isUndefined(loss.dualClip)
    }))

  it.effect("bad keys are rejected with their path", () =>
    Effect.gen(function*() {
      const dual = yield* Effect.flip(
        TrainConfig.decode({ ...minimal, algorithm: { steps: 10, policyLoss: "cispo", dualClip: 3 } })
      )
      assert.include(dual.issues.join("\n"), "algorithm.dualClip: only policyLoss \"ppo\" has a dual clip")
      const one = yield* Effect.flip(TrainConfig.decode({ ...minimal, algorithm: { steps: 10, dualClip: 1 } }))
      assert.match(one.issues.join("\n"), /^algorithm\.dualClip/m)
      const typo = yield* Effect.flip(TrainConfig.decode({ ...minimal, algorithm: { steps: 10, policyLoss: "gpso" } }))
      assert.match(typo.issues.join("\n"), /^algorithm\.policyLoss/m)
      const buffer = yield* Effect.flip(
        TrainConfig.decode({ ...minimal, algorithm: { steps: 10, overlong: { maxTokens: 10, bufferTokens: 20 } } })
      )
      assert.include(buffer.issues.join("\n"), "algorithm.overlong.bufferTokens: 20 is more than maxTokens (10)")
    }))
})

describe("Learner.update with DAPO's over-long shaping", () => {
  it.effect("equal rewards, one response over the limit: the shaped rewards differ, so the group has advantages", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      const group = {
        groupId: "g",
        rowIndex: 0,
        trajectories: [trajectory("short", [1], [5], -1, 1), trajectory("long", [1], [6, 7, 8, 9], -1, 1)]
      }
      const options: Learner.Options = { estimator: "grpo-no-std", loss: Loss.dapo, tokenBudget: 64 }
      // without shaping: no signal, nothing trained
      assert.strictEqual((yield* Learner.update([group], options)).outcome, "empty")
      // maxTokens 3, buffer 2: 1 token → 0, 4 tokens → −1; advantages ±0.5 around the mean
      const shaped = yield* Learner.update([group], { ...options, overlong: { maxTokens: 3, bufferTokens: 2 } })
      assert.strictEqual(shaped.outcome, "applied")
      const { microBatches } = yield* Ref.get(recording)
      const advantageOf = (target: number) => {
        for (const mb of microBatches) {
          for (let i = 0; i < mb.mask.length; i++) if (mb.mask[i] && mb.targets[i] === target) return mb.advantages[i]!
        }
        return Number.NaN
      }
      assert.approximately(advantageOf(5), 0.5, 1e-6)
      for (const t of [6, 7, 8, 9]) assert.approximately(advantageOf(t), -0.5, 1e-6)
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("GSPO and CISPO read the sampler's logprobs: a trajectory without them is MissingLogprobs", () =>
    Effect.gen(function*() {
      const unscored: Trajectory.Trajectory = {
        ...trajectory("a", [1], [5], -1, 1),
        segments: [{
          spans: [{ source: "prompt", tokenIds: [1] }, { source: "policy", tokenIds: [5] }],
          messageCount: 0
        }]
      }
      const group = { groupId: "g", rowIndex: 0, trajectories: [unscored, trajectory("b", [1], [6], -1, 0)] }
      for (const loss of [Loss.gspo, Loss.cispo]) {
        const error = yield* Effect.flip(Learner.update([group], { estimator: "grpo", loss, tokenBudget: 64 }))
        assert.strictEqual(error.reason._tag, "MissingLogprobs")
      }
    }).pipe(Effect.provide(GradientBackend.layerRecording())))
})

describe("GSPO and CISPO on a one-step bandit (a real trainer)", () => {
  const config = tinyConfig({
    vocabSize: 16,
    hiddenSize: 16,
    numAttentionHeads: 2,
    numKeyValueHeads: 1,
    intermediateSize: 32,
    numHiddenLayers: 1
  })
  const prompt = [3, 9]
  const rewarded = 7
  const probe = Packing.packUnsafe(
    Array.from(
      { length: config.vocabSize },
      (_, v) => ({ tokenIds: Int32Array.of(...prompt, v), lossMask: Uint8Array.of(0, 0, 1) })
    ),
    { tokenBudget: 1024, lengthMultiple: 4, aggregation: "token-mean" }
  ).microBatches[0]!

  const losses = [["gspo", { ...Loss.gspo, clipLow: 0.2, clipHigh: 0.2 }], ["cispo", Loss.cispo]] as const
  for (const [name, loss] of losses) {
    it.effect(`${name}: the rewarded token's probability rises from uniform`, () =>
      Effect.gen(function*() {
        const trainer = yield* OnnxTrainer.make({
          model: OnnxTrainer.qwen2(config),
          weights: Qwen2.initWeights(config, 3),
          loss,
          optimizer: Optimizer.defaultConfig,
          schedule: LrSchedule.constant(1e-2)
        })
        const read = Effect.map(trainer.logprobs(probe), ({ tokenLogprobs }) => {
          const out = new Float64Array(config.vocabSize)
          probe.sequenceIndex.forEach((v, r) => (out[v] = tokenLogprobs[r * probe.length + prompt.length - 1]!))
          return out
        })
        const rng = Sampling.rng(17)
        const first = Math.exp((yield* read)[rewarded]!)
        for (let step = 0; step < 25; step++) {
          const lp = yield* read
          const trajectories = Array.from({ length: 32 }, (_, i) => {
            let u = rng.next()
            let action = 0
            while (action < config.vocabSize - 1 && (u -= Math.exp(lp[action]!)) > 0) action++
            return { ...trajectory(`${step}.${i}`, prompt, [action], lp[action]!, action === rewarded ? 1 : 0) }
          })
          yield* Learner.update([{ groupId: `${step}`, rowIndex: step, trajectories }], {
            estimator: "grpo",
            loss,
            tokenBudget: 256,
            lengthMultiple: 4,
            // two optimiser steps on the same samples: the second is off-policy, where the ratios matter
            miniBatches: 1,
            epochs: 2
          }).pipe(Effect.provideService(GradientBackend.GradientBackend, trainer.trainer))
        }
        const last = Math.exp((yield* read)[rewarded]!)
        assert.isBelow(first, 0.15, `starts near uniform: ${first}`)
        assert.isAbove(last, 0.5, `ends at ${last}`)
      }).pipe(Effect.provide(NodeServices.layer)), 300_000)
  }
})
