/**
 * Segment rewards through the learner: a folded trajectory's segments carry rewards of their own, which the learner
 * puts on each segment's last policy token; the configured estimator then gives each segment its advantage
 * (`docs/context-folding.md`). Checked on the advantages the recording backend sees, per target token.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Ref } from "effect"
import * as Learner from "../../actors/Learner.ts"
import { GradientBackend, Loss } from "../../src/index.ts"
import type { Trajectory } from "../../src/index.ts"

const segment = (prompt: Array<number>, sampled: Array<number>): Trajectory.Segment => ({
  spans: [
    { source: "prompt", tokenIds: prompt },
    { source: "policy", tokenIds: sampled, logprobs: sampled.map(() => -1) }
  ],
  messageCount: 0
})

/** The other row of the group: one segment (target 11) that earned nothing. */
const other = (): Trajectory.Trajectory => ({ ...folded("b", 0), segments: [segment([1, 2], [11])] })

/** Two segments: [prompt 1 2, policy 5] then [prompt 7, policy 8 9]; `rewards` on the segments when given. */
const folded = (id: string, reward: number, rewards?: readonly [number, number]): Trajectory.Trajectory => ({
  trajectoryId: id,
  groupId: "g",
  chainId: id,
  messages: [],
  segments: [
    segment([1, 2], [5]),
    segment([7], [8, 9])
  ].map((s, k) => (rewards === undefined ? s : { ...s, reward: rewards[k]! })),
  termination: "answer",
  reward,
  rewardStatus: "scored",
  metrics: {},
  trainable: true,
  masked: false
})

/** The advantage of each trained target token (a: 5, 8, 9; b: 11), as the backend saw it. */
const advantagesOf = (trajectories: ReadonlyArray<Trajectory.Trajectory>, estimator: Learner.Options["estimator"]) =>
  Effect.gen(function*() {
    const recording = yield* GradientBackend.RecordingRef
    const result = yield* Learner.update([{ groupId: "g", rowIndex: 0, trajectories }], {
      estimator,
      loss: Loss.grpo,
      tokenBudget: 64,
      lengthMultiple: 4
    })
    assert.strictEqual(result.outcome, "applied")
    const { microBatches } = yield* Ref.get(recording)
    const out = new Map<number, number>()
    for (const mb of microBatches) {
      mb.mask.forEach((m, i) => {
        if (m && !out.has(mb.targets[i]!)) out.set(mb.targets[i]!, mb.advantages[i]!)
      })
    }
    return out
  }).pipe(Effect.provide(GradientBackend.layerRecording()))

describe("Learner.update with segment rewards", () => {
  it.effect("reinforce++: a segment's advantage is its reward-to-go; `last` is the unsegmented trajectory", () =>
    Effect.gen(function*() {
      const early = yield* advantagesOf([folded("a", 1, [1, 0]), other()], "reinforce++")
      // The reward was earned in the first segment: its token gets return 1, the later ones 0.
      assert.isAbove(early.get(5)!, early.get(8)!)
      assert.strictEqual(early.get(8), early.get(9))
      const last = yield* advantagesOf([folded("a", 1, [0, 1]), other()], "reinforce++")
      const plain = yield* advantagesOf([folded("a", 1), other()], "reinforce++")
      // `last` puts the reward where an unsegmented trajectory has it: the same advantages, token for token.
      assert.deepStrictEqual([...last], [...plain])
      assert.strictEqual(last.get(5), last.get(9))
    }))

  it.effect("grpo: every segment of a trajectory gets its advantage, from the sum of its segment rewards", () =>
    Effect.gen(function*() {
      const split = yield* advantagesOf([folded("a", 1, [0.5, 0.5]), other()], "grpo")
      const a = 0.5 / (Math.SQRT1_2 + 1e-6)
      for (const target of [5, 8, 9]) assert.approximately(split.get(target)!, a, 1e-5)
      assert.approximately(split.get(11)!, -a, 1e-5)
    }))
})
