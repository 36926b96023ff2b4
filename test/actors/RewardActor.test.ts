import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Fiber, Schema } from "effect"
import { TestClock } from "effect/testing"
import * as RewardActor from "../../actors/RewardActor.ts"
import { Reward } from "../../src/index.ts"
import { answered } from "../utils/trajectories.ts"

const Exact = Reward.make("exact", {
  row: Schema.Struct({ answer: Schema.String }),
  score: ({ response, row }) => Effect.succeed({ reward: response === row.answer ? 1 : 0, metrics: { acc: 1 } })
})

describe("RewardActor", () => {
  it.effect("writes reward, status and metrics into the trajectory", () =>
    Effect.gen(function*() {
      const actor = yield* RewardActor.make(Exact, { onError: "drop" })
      const t = answered("42", { answer: "42" })
      const { trajectory, error } = yield* actor.score({ ...t, metrics: { "rollout/turns": 1 } })
      assert.isUndefined(error)
      assert.strictEqual(trajectory.reward, 1)
      assert.strictEqual(trajectory.rewardStatus, "scored")
      assert.isFalse(trajectory.masked)
      assert.deepStrictEqual(trajectory.metrics, {
        "rollout/turns": 1,
        "reward/exact/acc": 1,
        "reward/exact/reward": 1
      })
    }))

  it.effect("not applicable → excluded from the baseline", () =>
    Effect.gen(function*() {
      const na = Reward.make("na", { score: () => Effect.succeed(Reward.notApplicable("no gold")) })
      const { trajectory } = yield* (yield* RewardActor.make(na, { onError: "zero" })).score(answered("x"))
      assert.strictEqual(trajectory.rewardStatus, "not_applicable")
      assert.strictEqual(trajectory.reward, 0)
    }))

  it.effect("error policy \"zero\": reward 0, kept in the baseline, error recorded", () =>
    Effect.gen(function*() {
      const actor = yield* RewardActor.make(Exact, { onError: "zero" })
      const { trajectory, error } = yield* actor.score(answered("42", { wrong: 1 }))
      assert.strictEqual(error?.reason, "InvalidRow")
      assert.strictEqual(trajectory.reward, 0)
      assert.strictEqual(trajectory.rewardStatus, "scored")
      assert.isFalse(trajectory.masked)
      assert.strictEqual(trajectory.metrics["reward/exact/errors/InvalidRow"], 1)
    }))

  it.effect("error policy \"drop\": failed and masked; a defect in the scorer is a Defect error, not a crash", () =>
    Effect.gen(function*() {
      const buggy = Reward.make("buggy", { score: () => Effect.sync((): number => JSON.parse("{")) })
      const actor = yield* RewardActor.make(buggy, { onError: "drop" })
      const { trajectory, error } = yield* actor.score(answered("x"))
      assert.strictEqual(error?.reason, "Defect")
      assert.strictEqual(trajectory.rewardStatus, "failed")
      assert.isTrue(trajectory.masked)
      assert.strictEqual(trajectory.metrics["reward/buggy/error"], 1)
    }))

  it.effect("a scorer that outlives the timeout (TestClock)", () =>
    Effect.gen(function*() {
      const slow = Reward.make("slow", { score: () => Effect.as(Effect.sleep("1 minute"), 1) })
      const actor = yield* RewardActor.make(slow, { onError: "drop", timeout: "5 seconds" })
      const fiber = yield* Effect.forkChild(actor.score(answered("x")))
      yield* TestClock.adjust("5 seconds")
      const { trajectory, error } = yield* Fiber.join(fiber)
      assert.strictEqual(error?.reason, "Timeout")
      assert.strictEqual(trajectory.rewardStatus, "failed")
    }))

  it.effect("provides the chain's environment context to the scorer", () =>
    Effect.gen(function*() {
      class Env extends Context.Service<Env, { readonly solved: boolean }>()("test/Env") {}
      const solved = Reward.make("solved", {
        dependencies: [Env],
        score: () => Effect.map(Effect.service(Env), (env) => (env.solved ? 1 : 0))
      })
      const actor = yield* RewardActor.make(solved, { onError: "zero", concurrency: 2 })
      const { trajectory } = yield* actor.score(answered("x"), { context: Context.make(Env, { solved: true }) })
      assert.strictEqual(trajectory.reward, 1)
    }))
})
