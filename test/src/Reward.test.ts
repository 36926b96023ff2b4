import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Schema } from "effect"
import { Reward } from "../../src/index.ts"
import { answered } from "../utils/trajectories.ts"

const Exact = Reward.make("exact", {
  row: Schema.Struct({ answer: Schema.String }),
  score: ({ response, row }) =>
    Effect.succeed({ reward: response === row.answer ? 1 : 0, metrics: { length: response.length } })
})

describe("Reward", () => {
  it.effect("decodes the row, scores the final response and namespaces metrics", () =>
    Effect.gen(function*() {
      const outcome = yield* Exact.evaluate({ trajectory: answered("42", { answer: "42", other: true }) })
      assert.deepStrictEqual(outcome, {
        _tag: "Scored",
        reward: 1,
        metrics: { "reward/exact/length": 2, "reward/exact/reward": 1 }
      })
      const wrong = yield* Exact.evaluate({ trajectory: answered("41"), row: { answer: "42" } })
      assert.strictEqual(wrong._tag === "Scored" && wrong.reward, 0)
    }))

  it.effect("a missing or mistyped row field is an InvalidRow error naming the field", () =>
    Effect.gen(function*() {
      const missing = yield* Effect.flip(Exact.evaluate({ trajectory: answered("42", { answr: "42" }) }))
      assert.strictEqual(missing.reason._tag, "InvalidRow")
      assert.strictEqual(missing.message, `reward "exact": dataset row field ["answer"]: Missing key`)
      const mistyped = yield* Effect.flip(Exact.evaluate({ trajectory: answered("42", { answer: 42 }) }))
      assert.strictEqual(mistyped.message, `reward "exact": dataset row field ["answer"]: Expected string`)
    }))

  it.effect("a bare number is a score; NaN is an InvalidScore error; a scorer failure is ScoreFailed", () =>
    Effect.gen(function*() {
      const bare = Reward.make("bare", { score: () => Effect.succeed(0.5) })
      assert.deepStrictEqual(yield* bare.evaluate({ trajectory: answered("x") }), {
        _tag: "Scored",
        reward: 0.5,
        metrics: { "reward/bare/reward": 0.5 }
      })
      const nan = Reward.make("nan", { score: () => Effect.succeed(Number.NaN) })
      assert.strictEqual((yield* Effect.flip(nan.evaluate({ trajectory: answered("x") }))).reason._tag, "InvalidScore")
      const badMetric = Reward.make("bad", { score: () => Effect.succeed({ reward: 1, metrics: { m: Infinity } }) })
      const e = yield* Effect.flip(badMetric.evaluate({ trajectory: answered("x") }))
      assert.strictEqual(e.message, `metric "m" is Infinity, not a finite number`)
      const failing = Reward.make("failing", { score: () => Effect.fail(new Error("judge unreachable")) })
      const f = yield* Effect.flip(failing.evaluate({ trajectory: answered("x") }))
      assert.strictEqual(f.reason._tag, "ScoreFailed")
      assert.strictEqual(f.message, "judge unreachable")
      assert.isTrue(f.isRetryable)
      // Caught by its reason's tag, with the scorer's failure as the cause; as JSON (a log line) and back, the same.
      const cause = yield* failing.evaluate({ trajectory: answered("x") }).pipe(
        Effect.as(undefined),
        Effect.catchReason("RewardError", "ScoreFailed", (reason) => Effect.succeed(reason.cause))
      )
      assert.strictEqual((cause as Error).message, "judge unreachable")
      const codec = Schema.toCodecJson(Reward.RewardError)
      const back = Schema.decodeUnknownSync(codec)(JSON.parse(JSON.stringify(Schema.encodeSync(codec)(f))))
      assert.instanceOf(back.reason, Reward.ScoreFailed)
      assert.strictEqual(back.reward, "failing")
      assert.strictEqual((back.reason.cause as Error).message, "judge unreachable")
    }))

  it.effect("a score that is not a number says what it is: a string reads quoted, not as the number it spells", () =>
    Effect.gen(function*() {
      // A scorer in plain JavaScript, or one that casts, can return anything.
      const message = (value: unknown) => {
        const reward = Reward.make("r", { score: () => Effect.succeed(value as number) })
        const error = Effect.flip(reward.evaluate({ trajectory: answered("x") }))
        return Effect.map(error, (e) => `${e.reason._tag}: ${e.message}`)
      }
      assert.strictEqual(
        yield* message("1"),
        `InvalidScore: the score is "1" (a string), not a number or { reward, metrics }`
      )
      assert.strictEqual(yield* message(null), "InvalidScore: the score is null, not a number or { reward, metrics }")
      assert.strictEqual(yield* message({ reward: "0" }), `InvalidScore: reward is "0" (a string), not a finite number`)
      assert.strictEqual(yield* message({ reward: NaN }), "InvalidScore: reward is NaN, not a finite number")
      assert.strictEqual(
        yield* message({ reward: 1, metrics: { dials: "3" } }),
        `InvalidScore: metric "dials" is "3" (a string), not a finite number`
      )
    }))

  it.effect("not applicable", () =>
    Effect.gen(function*() {
      const na = Reward.make("na", { score: () => Effect.succeed(Reward.notApplicable("no reference")) })
      assert.deepStrictEqual(yield* na.evaluate({ trajectory: answered("x") }), {
        _tag: "NotApplicable",
        reason: "no reference",
        metrics: { "reward/na/not_applicable": 1 }
      })
    }))

  it.effect("a reward reads the chain's environment through declared dependencies", () =>
    Effect.gen(function*() {
      class Sandbox extends Context.Service<Sandbox, { readonly fileExists: (p: string) => boolean }>()(
        "test/Sandbox"
      ) {}
      const Wrote = Reward.make("wrote", {
        row: Schema.Struct({ path: Schema.String }),
        dependencies: [Sandbox],
        score: Effect.fnUntraced(function*({ row }) {
          const sandbox = yield* Sandbox
          return sandbox.fileExists(row.path) ? 1 : 0
        })
      })
      const outcome = yield* Wrote.evaluate({ trajectory: answered("done", { path: "/out.txt" }) }).pipe(
        Effect.provideService(Sandbox, { fileExists: (p) => p === "/out.txt" })
      )
      assert.strictEqual(outcome._tag === "Scored" && outcome.reward, 1)
      assert.deepStrictEqual(Wrote.dependencies, [Sandbox])
    }))

  describe("combine", () => {
    const Len = Reward.make("len", { score: ({ response }) => Effect.succeed({ reward: response.length / 10 }) })
    const Na = Reward.make("na", { score: () => Effect.succeed(Reward.notApplicable("never")) })

    it.effect("weighted sum, each part's metrics kept under its name", () =>
      Effect.gen(function*() {
        const total = Reward.combine("total", [{ reward: Exact, weight: 0.8 }, { reward: Len, weight: 0.2 }])
        const outcome = yield* total.evaluate({ trajectory: answered("42", { answer: "42" }) })
        assert.strictEqual(outcome._tag, "Scored")
        assert.closeTo(outcome._tag === "Scored" ? outcome.reward : NaN, 0.8 + 0.2 * 0.2, 1e-12)
        assert.deepStrictEqual(Object.keys(outcome.metrics).sort(), [
          "reward/exact/length",
          "reward/exact/reward",
          "reward/len/reward",
          "reward/total/reward"
        ])
      }))

    it.effect("not-applicable parts contribute nothing; all not applicable → not applicable; a failure fails", () =>
      Effect.gen(function*() {
        const some = Reward.combine("some", [{ reward: Len, weight: 1 }, { reward: Na, weight: 5 }])
        const o = yield* some.evaluate({ trajectory: answered("abcde") })
        assert.strictEqual(o._tag === "Scored" && o.reward, 0.5)
        const none = Reward.combine("none", [{ reward: Na, weight: 1 }])
        assert.strictEqual((yield* none.evaluate({ trajectory: answered("x") }))._tag, "NotApplicable")
        const failing = Reward.combine("f", [{ reward: Len, weight: 1 }, { reward: Exact, weight: 1 }])
        const e = yield* Effect.flip(failing.evaluate({ trajectory: answered("x") }))
        assert.strictEqual(e.reward, "exact")
        assert.strictEqual(e.reason._tag, "InvalidRow")
      }))
  })
})
