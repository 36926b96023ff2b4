import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Schedule } from "effect"
import { TestClock } from "effect/testing"
import * as ChainPolicy from "../../actors/internal/chainPolicy.ts"
import * as RolloutChain from "../../actors/RolloutChain.ts"
import type * as ChainPorts from "../../src/ChainPorts.ts"
import * as Environment from "../../src/Environment.ts"
import * as RolloutError from "../../src/RolloutError.ts"
import * as Sampler from "../../src/Sampler.ts"
import { charFormat, turn } from "./fixtures/charFormat.ts"

// ===== Fixtures =====

const error = (reason: RolloutError.Reason, message = `${reason} happened`) =>
  new RolloutError.RolloutError({ reason, message })

const settings = (policies?: RolloutError.Policies, retry?: ChainPolicy.Settings["retry"]): ChainPolicy.Settings => ({
  policies,
  retry,
  stats: RolloutChain.makeStats()
})

/** A step that fails with `failures[i]` on its i-th run and succeeds with "done" once they run out. */
const flaky = (failures: ReadonlyArray<RolloutError.RolloutError>) => {
  const runs = { count: 0 }
  const step = Effect.suspend(() => {
    const failure = failures[runs.count++]
    return failure === undefined ? Effect.succeed("done") : Effect.fail(failure)
  })
  return { runs, step }
}

const spec: RolloutChain.Spec = {
  trajectoryId: "t",
  groupId: "g",
  chainId: "c",
  messages: [{ role: "user", content: "add" }]
}

/** A chain over the char format, a scripted sampler and tools that add (`add`) or answer (`answer`). */
const chainConfig = (
  sampler: Sampler.Sampler["Service"],
  overrides?: Partial<RolloutChain.Config>
): RolloutChain.Config => ({
  turnSource: { _tag: "Tokens", sampler },
  format: charFormat,
  tools: {
    schemas: [],
    executeTurn: (calls) =>
      Effect.succeed({
        messages: calls.map((call) => ({ role: "tool" as const, content: "ok", tool_call_id: call.id })),
        terminal: calls.some((call) => call.function.name === "answer")
      })
  },
  reward: () => Effect.succeed({ reward: 1, status: "scored" }),
  environment: Environment.none as unknown as Environment.Provider<any, any, never>,
  sampling: { temperature: 1, maxTokens: 100 },
  maxTurns: 4,
  retry: Schedule.recurs(2),
  stats: RolloutChain.makeStats(),
  ...overrides
})

const runChain = (script: Sampler.Script, overrides?: Partial<RolloutChain.Config>) =>
  Effect.gen(function*() {
    const config = chainConfig(yield* Sampler.makeScripted(script), overrides)
    const exit = yield* Effect.exit(RolloutChain.run(spec, config))
    return { exit, stats: config.stats }
  })

const outcomeOf = <A, E>(exit: Exit.Exit<A, E>): A => {
  if (Exit.isFailure(exit)) throw new Error(`the chain failed: ${String(exit.cause)}`)
  return exit.value
}

// ===== Tests =====

describe("chainPolicy.settle: an error its policy resolves", () => {
  for (const verdict of ["zero_reward", "mask", "drop_group", "feedback"] as const) {
    it.effect(`${verdict} without a recovery ends the chain: ChainEnded carries the error and the verdict`, () =>
      Effect.gen(function*() {
        const s = settings({ overrides: { EnvFailed: verdict } })
        const failure = error("EnvFailed")
        const ended = yield* Effect.flip(ChainPolicy.settle(s, failure))
        assert.instanceOf(ended, ChainPolicy.ChainEnded)
        assert.strictEqual(ended._tag === "ChainEnded" && ended.error, failure)
        assert.strictEqual(ended._tag === "ChainEnded" && ended.verdict, verdict)
        assert.strictEqual(s.stats.errors.get("EnvFailed"), 1, "counted once, under its reason")
      }))
  }

  it.effect("abort_run fails with the error itself, not as an ending", () =>
    Effect.gen(function*() {
      const failure = error("SamplerUnusable")
      const failed = yield* Effect.flip(ChainPolicy.settle(settings(), failure, () => "recovered"))
      assert.strictEqual(failed, failure)
    }))

  it.effect("a retry reason settled directly gets its afterRetry policy (mask unless set)", () =>
    Effect.gen(function*() {
      const byDefault = yield* Effect.flip(ChainPolicy.settle(settings(), error("SamplerTransient")))
      assert.strictEqual(byDefault._tag === "ChainEnded" && byDefault.verdict, "mask")
      const set = yield* Effect.flip(ChainPolicy.settle(settings({ afterRetry: "zero_reward" }), error("LeaseFailed")))
      assert.strictEqual(set._tag === "ChainEnded" && set.verdict, "zero_reward")
    }))

  it.effect("feedbackAs: feedback for a reason the model can read is the step's value; otherwise the chain ends", () =>
    Effect.gen(function*() {
      const recover = ChainPolicy.feedbackAs((e) => `the model reads: ${e.message}`)
      const read = yield* ChainPolicy.settle(settings(), error("ToolFailed", "bad args"), recover)
      assert.strictEqual(read, "the model reads: bad args")
      // `feedback` on a reason no observation can carry (a refused request) ends the chain.
      const s = settings({ overrides: { SamplerRejected: "feedback" } })
      const ended = yield* Effect.flip(ChainPolicy.settle(s, error("SamplerRejected"), recover))
      assert.strictEqual(ended._tag === "ChainEnded" && ended.verdict, "feedback")
      // Another policy on a readable reason ends it too.
      const masked = settings({ overrides: { ToolFailed: "mask" } })
      const byMask = yield* Effect.flip(ChainPolicy.settle(masked, error("ToolFailed"), recover))
      assert.strictEqual(byMask._tag === "ChainEnded" && byMask.verdict, "mask")
    }))

  it("endingOf: an ending by error; feedback that no observation carried masks", () => {
    const failure = error("SamplerRejected")
    const ending = ChainPolicy.endingOf(new ChainPolicy.ChainEnded({ error: failure, verdict: "feedback" }))
    assert.deepStrictEqual(ending, { termination: "error", error: failure, policy: "mask" })
    const dropped = ChainPolicy.endingOf(new ChainPolicy.ChainEnded({ error: failure, verdict: "drop_group" }))
    assert.strictEqual(dropped.policy, "drop_group")
  })
})

describe("chainPolicy.withPolicy: the retry path", () => {
  it.effect("a step that succeeds runs once and counts nothing", () =>
    Effect.gen(function*() {
      const s = settings()
      const { runs, step } = flaky([])
      assert.strictEqual(yield* ChainPolicy.withPolicy(s, step), "done")
      assert.strictEqual(runs.count, 1)
      assert.strictEqual(s.stats.errors.size, 0)
    }))

  it.effect("a retry reason is retried until the step succeeds; errors that recovered are not counted", () =>
    Effect.gen(function*() {
      const s = settings(undefined, Schedule.recurs(3))
      const { runs, step } = flaky([error("SamplerTransient"), error("SamplerTransient")])
      assert.strictEqual(yield* ChainPolicy.withPolicy(s, step), "done")
      assert.strictEqual(runs.count, 3)
      assert.strictEqual(s.stats.errors.size, 0)
    }))

  it.effect("retries run out: the afterRetry policy ends the chain, counted once", () =>
    Effect.gen(function*() {
      const s = settings({ afterRetry: "drop_group" }, Schedule.recurs(2))
      const { runs, step } = flaky(Array.from({ length: 10 }, () => error("LeaseFailed")))
      const ended = yield* Effect.flip(ChainPolicy.withPolicy(s, step))
      // The first failure is the schedule's first input: `recurs(2)` is two retries.
      assert.strictEqual(runs.count, 3, "one run and the schedule's two retries")
      assert.strictEqual(ended._tag === "ChainEnded" && ended.verdict, "drop_group")
      assert.strictEqual(s.stats.errors.get("LeaseFailed"), 1)
    }))

  it.effect("a retry that fails for a reason of another policy stops retrying and applies that policy", () =>
    Effect.gen(function*() {
      const s = settings(undefined, Schedule.recurs(5))
      const { runs, step } = flaky([error("SamplerTransient"), error("ToolFailed"), error("SamplerTransient")])
      const value = yield* ChainPolicy.withPolicy(s, step, ChainPolicy.feedbackAs((e) => e.reason))
      assert.strictEqual(value, "ToolFailed")
      assert.strictEqual(runs.count, 2)
      assert.deepStrictEqual([...s.stats.errors], [["ToolFailed", 1]])
    }))

  it.effect("the default schedule: five retries exponential from 100 ms, the first one after a delay too", () =>
    Effect.gen(function*() {
      const { runs, step } = flaky(Array.from({ length: 10 }, () => error("SamplerTransient")))
      const fiber = yield* Effect.forkChild(Effect.flip(ChainPolicy.withPolicy(settings(), step)))
      yield* TestClock.adjust(50)
      assert.strictEqual(runs.count, 1, "no retry at once: the first waits about 100 ms")
      yield* TestClock.adjust(60_000)
      const ended = yield* Fiber.join(fiber)
      assert.strictEqual(runs.count, 6, "one run and five retries")
      assert.strictEqual(ended._tag === "ChainEnded" && ended.verdict, "mask")
    }))

  it.effect("withVerdict: every policy but abort_run is the step's value (a reward's failure ends nothing)", () =>
    Effect.gen(function*() {
      const s = settings({ overrides: { RewardFailed: "drop_group" } })
      const { step } = flaky([error("RewardFailed")])
      const verdict = yield* ChainPolicy.withVerdict(s, step, (e, v) => `${e.reason}/${v}`)
      assert.strictEqual(verdict, "RewardFailed/drop_group")
      const abort = settings({ overrides: { RewardFailed: "abort_run" } })
      const failed = yield* Effect.flip(ChainPolicy.withVerdict(abort, flaky([error("RewardFailed")]).step, () => 0))
      assert.strictEqual(failed._tag, "RolloutError")
    }))
})

describe("RolloutChain.run: every ending meets in one place", () => {
  it.effect("a lease failure ends the chain before its prompt: masked, the spec's messages, counted once", () =>
    Effect.gen(function*() {
      const environment = Environment.make("perChain", () => Effect.fail(new Error("pool closed")))
      const { exit, stats } = yield* runChain([turn("never sampled")], {
        environment: environment as unknown as Environment.Provider<any, any, never>,
        policies: { overrides: { LeaseFailed: "mask" } }
      })
      const { trajectory, dropGroup } = outcomeOf(exit)
      assert.strictEqual(trajectory.termination, "error")
      assert.strictEqual(trajectory.error, "LeaseFailed: pool closed")
      assert.isTrue(trajectory.masked)
      assert.strictEqual(trajectory.rewardStatus, "failed")
      assert.deepStrictEqual(trajectory.messages, spec.messages)
      assert.deepStrictEqual(trajectory.segments, [])
      assert.isFalse(dropGroup)
      assert.strictEqual(stats.errors.get("LeaseFailed"), 1)
      assert.strictEqual(stats.terminations.get("error"), 1)
      assert.strictEqual(stats.turns, 0)
    }))

  it.effect("an error on a later turn keeps the transcript so far; drop_group asks for the group's drop", () =>
    Effect.gen(function*() {
      const { exit, stats } = yield* runChain(
        (_, call) => call === 0 ? turn(`CALL add {}`) : Sampler.samplerError("BadRequest", "prompt too long"),
        { policies: { overrides: { SamplerRejected: "drop_group" } } }
      )
      const { trajectory, dropGroup } = outcomeOf(exit)
      assert.isTrue(dropGroup)
      assert.strictEqual(trajectory.termination, "error")
      assert.strictEqual(trajectory.errorReason, "SamplerRejected")
      assert.isTrue(trajectory.masked)
      assert.deepStrictEqual(trajectory.messages.map((m) => m.role), ["user", "assistant", "tool"])
      assert.strictEqual(trajectory.metrics.turns, 1)
      assert.strictEqual(trajectory.metrics.tool_calls, 1)
      assert.strictEqual(stats.samplerCalls, 2)
      assert.deepStrictEqual([...stats.errors], [["SamplerRejected", 1]])
    }))

  it.effect("zero_reward: the chain ends scored 0 and kept; the reward is not asked", () =>
    Effect.gen(function*() {
      let rewards = 0
      const { exit } = yield* runChain([turn(`CALL add {oops`)], {
        policies: { overrides: { ParseFailed: "zero_reward" } },
        reward: () => Effect.sync(() => ({ reward: ++rewards, status: "scored" as const }))
      })
      const { trajectory } = outcomeOf(exit)
      assert.strictEqual(trajectory.termination, "error")
      assert.strictEqual(trajectory.rewardStatus, "scored")
      assert.strictEqual(trajectory.reward, 0)
      assert.isFalse(trajectory.masked)
      assert.strictEqual(trajectory.errorReason, "ParseFailed")
      assert.strictEqual(rewards, 0)
    }))

  it.effect("feedback: a failed tool turn becomes one observation per call and the chain goes on", () =>
    Effect.gen(function*() {
      let executions = 0
      const { exit } = yield* runChain([turn(`CALL add {}\nCALL add {}`), turn(`CALL answer {}`)], {
        tools: {
          schemas: [],
          executeTurn: (calls): Effect.Effect<ChainPorts.ToolTurn, RolloutError.RolloutError> =>
            ++executions === 1
              ? Effect.fail(error("ToolFailed", "add is down"))
              : Effect.succeed({ messages: [], terminal: calls.some((c) => c.function.name === "answer") })
        }
      })
      const { trajectory } = outcomeOf(exit)
      assert.strictEqual(trajectory.termination, "answer")
      assert.isUndefined(trajectory.error)
      const fed = trajectory.messages.filter((m) => m.role === "tool")
      assert.deepStrictEqual(fed.map((m) => m.role === "tool" && [m.content, m.is_error]), [
        ["add is down", true],
        ["add is down", true]
      ])
    }))

  it.effect("abort_run fails the chain with the error; no trajectory", () =>
    Effect.gen(function*() {
      const { exit, stats } = yield* runChain(() => Sampler.samplerError("NoTokenIds", "chat api"))
      assert.isTrue(Exit.isFailure(exit))
      const failure = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
      const reason = failure?._tag === "Fail" ? failure.error.reason : undefined
      assert.strictEqual(reason, "SamplerUnusable")
      assert.strictEqual(stats.terminations.size, 0)
    }))

  it.effect("chat mode with a format that cannot append a recorded message: TemplateFailed masks", () =>
    Effect.gen(function*() {
      const stats = RolloutChain.makeStats()
      const { appendAssistant: _, ...plain } = yield* charFormat.start(spec.messages, [])
      const config = chainConfig(yield* Sampler.makeScripted([]), {
        turnSource: {
          _tag: "Chat",
          chat: { complete: () => Effect.die("never asked") } as unknown as Sampler.ChatSampler["Service"]
        },
        format: { ...charFormat, start: () => Effect.succeed(plain) },
        stats
      })
      const { trajectory } = yield* RolloutChain.run(spec, config)
      assert.strictEqual(trajectory.errorReason, "TemplateFailed")
      assert.isTrue(trajectory.masked)
      assert.isFalse(trajectory.trainable)
      assert.strictEqual(stats.samplerCalls, 0)
    }))
})

describe("RolloutChain.metrics: the run's counters as figures", () => {
  it("means per chain and per call, and one figure per tool, termination and error reason", () => {
    const stats = RolloutChain.makeStats()
    assert.strictEqual(RolloutChain.metrics(stats)["rollout/turns_per_chain"], 0, "no chain finished: 0, not NaN")
    assert.strictEqual(RolloutChain.metrics(stats)["rollout/sampler_latency_ms"], 0)
    Object.assign(stats, { chainsFinished: 4, turns: 10, samplerCalls: 5, samplerLatencyMs: 30 })
    stats.toolCalls.set("add", 3)
    stats.terminations.set("answer", 4)
    stats.errors.set("ParseFailed", 2)
    const figures = RolloutChain.metrics(stats)
    assert.strictEqual(figures["rollout/turns_per_chain"], 2.5)
    assert.strictEqual(figures["rollout/sampler_latency_ms"], 6)
    assert.strictEqual(figures["rollout/tool_calls/add"], 3)
    assert.strictEqual(figures["rollout/termination/answer"], 4)
    assert.strictEqual(figures["rollout/errors/ParseFailed"], 2)
  })

  it.effect("a chain counts its turns, tokens, tool calls and ending in the run's stats", () =>
    Effect.gen(function*() {
      const { exit, stats } = yield* runChain([turn(`CALL add {}`), turn(`CALL answer {}`)])
      const { trajectory } = outcomeOf(exit)
      assert.strictEqual(trajectory.termination, "answer")
      assert.strictEqual(trajectory.reward, 1)
      assert.strictEqual(stats.turns, 2)
      assert.strictEqual(stats.tokensGenerated, turn(`CALL add {}`).length + turn(`CALL answer {}`).length)
      assert.strictEqual(stats.tokensGenerated, trajectory.metrics.tokens_generated)
      assert.deepStrictEqual([...stats.toolCalls], [["add", 1], ["answer", 1]])
      assert.deepStrictEqual([...stats.terminations], [["answer", 1]])
      assert.strictEqual(stats.errors.size, 0)
    }))
})
