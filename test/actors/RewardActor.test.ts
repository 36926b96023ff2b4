import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Fiber, Logger, Schema } from "effect"
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
      assert.strictEqual(error?.reason._tag, "InvalidRow")
      assert.strictEqual(trajectory.reward, 0)
      assert.strictEqual(trajectory.rewardStatus, "scored")
      assert.isFalse(trajectory.masked)
      assert.strictEqual(trajectory.metrics["reward/exact/errors/InvalidRow"], 1)
      // Every error's message names its reward, once, whoever wrote it.
      assert.strictEqual(error?.message, `reward "exact": dataset row field ["answer"]: Missing key`)
      const down = Reward.make("judge", { score: () => Effect.fail(new Error("the judge is down")) })
      const failed = yield* (yield* RewardActor.make(down, { onError: "zero" })).score(answered("x"))
      assert.strictEqual(failed.error?.message, `reward "judge": the judge is down`)
      // Renamed with its reward, the error keeps its reason's cause: the scorer's own failure.
      assert.strictEqual(failed.error?.reason._tag, "ScoreFailed")
      assert.strictEqual((failed.error?.reason.cause as Error).message, "the judge is down")
    }))

  it.effect("error policy \"drop\": failed and masked; a defect in the scorer is a Defect error, not a crash", () =>
    Effect.gen(function*() {
      const buggy = Reward.make("buggy", { score: () => Effect.sync((): number => JSON.parse("{")) })
      const actor = yield* RewardActor.make(buggy, { onError: "drop" })
      const { trajectory, error } = yield* actor.score(answered("x"))
      assert.strictEqual(error?.reason._tag, "Defect")
      assert.instanceOf(error?.reason.cause, Error) // what the scorer threw
      assert.strictEqual(trajectory.rewardStatus, "failed")
      assert.isTrue(trajectory.masked)
      assert.strictEqual(trajectory.metrics["reward/buggy/error"], 1)
    }))

  it.effect("a defect's error names the reward and what it threw", () =>
    Effect.gen(function*() {
      const buggy = Reward.make("buggy", {
        score: () =>
          Effect.sync((): number => {
            throw new Error("boom: odd target 3")
          })
      })
      const { error } = yield* (yield* RewardActor.make(buggy, { onError: "zero" })).score(answered("x"))
      assert.strictEqual(error?.reason._tag, "Defect")
      assert.instanceOf(error?.reason.cause, Error) // what the scorer threw
      assert.strictEqual(error?.message, `reward "buggy" threw: boom: odd target 3`)
    }))

  it.effect("logs a reward's first failure of each reason with its cause, then at most one count line per 30s", () => {
    const logs: Array<{ message: string; cause: boolean }> = []
    const collector = Logger.make((o) => {
      const message = (o.message as ReadonlyArray<unknown>).map(String).join(" ")
      logs.push({ message, cause: o.cause.reasons.length > 0 })
    })
    return Effect.gen(function*() {
      const target = (t: ReturnType<typeof answered>) => Number(t.row?.["target"])
      const buggy = Reward.make("buggy", {
        score: ({ trajectory }) =>
          Effect.sync(() => {
            if (target(trajectory) % 2 === 1) throw new Error(`boom: odd target ${target(trajectory)}`)
            return 1
          })
      })
      const actor = yield* RewardActor.make(buggy, { onError: "zero" })
      const scoreAll = (targets: ReadonlyArray<number>) =>
        Effect.forEach(targets, (n) => actor.score(answered("x", { target: n })), { discard: true })
      yield* scoreAll([1, 2, 3, 5, 7])
      assert.deepStrictEqual(logs, [{
        message: `reward "buggy" threw: boom: odd target 1 (Defect; zero policy: scored 0). Later failures of this ` +
          `reward are counted, at most one line per 30s`,
        cause: true
      }])
      yield* TestClock.adjust("30 seconds")
      yield* scoreAll([9, 11])
      assert.strictEqual(logs.length, 2)
      assert.deepStrictEqual(logs[1], {
        message: `reward "buggy" failed 4 more times in the last 30s (zero policy); last: reward "buggy" threw: ` +
          `boom: odd target 9`,
        cause: false
      })
      yield* scoreAll([13])
      assert.strictEqual(logs.length, 2, "the next count waits for the next 30s")
      // A score the runtime refuses (NaN) is said without a stack: it would point into the runtime, not the scorer.
      const nan = yield* RewardActor.make(Reward.make("nan", { score: () => Effect.succeed(NaN) }), { onError: "zero" })
      yield* nan.score(answered("x"))
      assert.deepStrictEqual(logs[2], {
        message: `reward "nan": reward is NaN, not a finite number (InvalidScore; zero policy: scored 0). Later ` +
          `failures of this reward are counted, at most one line per 30s`,
        cause: false
      })
    }).pipe(Effect.provideService(Logger.CurrentLoggers, new Set([collector])))
  })

  it.effect("a scorer that outlives the timeout (TestClock)", () =>
    Effect.gen(function*() {
      const slow = Reward.make("slow", { score: () => Effect.as(Effect.sleep("1 minute"), 1) })
      const actor = yield* RewardActor.make(slow, { onError: "drop", timeout: "5 seconds" })
      const fiber = yield* Effect.forkChild(actor.score(answered("x")))
      yield* TestClock.adjust("5 seconds")
      const { trajectory, error } = yield* Fiber.join(fiber)
      assert.strictEqual(error?.reason._tag, "Timeout")
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
