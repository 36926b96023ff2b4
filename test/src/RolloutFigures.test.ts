/**
 * `RolloutFigures.rolloutFigures`' accuracy standard error: over questions (groups), each the mean of its samples, so
 * samples of one question do not count as independent evidence; tool calls and tool errors, reward metrics and
 * failures as the trainer logs them.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect } from "effect"
import * as ToolActor from "../../actors/ToolActor.ts"
import * as Tool from "../../src/Tool.ts"
import { answered, trajectoryOf } from "../utils/trajectories.ts"
import * as RolloutFigures from "../../src/RolloutFigures.ts"
import type * as Trajectory from "../../src/Trajectory.ts"

const group = (rowIndex: number, outcomes: ReadonlyArray<boolean>) => ({
  groupId: `g${rowIndex}`,
  rowIndex,
  trajectories: outcomes.map((ok) => ({ ...answered("x"), reward: ok ? 1 : 0, metrics: { acc: ok ? 1 : 0 } }))
})

describe("RolloutFigures.rolloutFigures", () => {
  it("accuracy_se is the standard error over questions of their mean accuracy", () => {
    // Question means 1, 0.5, 0, 0.5: mean 0.5, sample sd sqrt(1/6), SE sqrt(1/6)/2.
    const groups = [group(0, [true, true]), group(1, [true, false]), group(2, [false, false]), group(3, [false, true])]
    const figures = RolloutFigures.rolloutFigures(groups, { prefix: "eval" })
    assert.strictEqual(figures["eval/accuracy"], 0.5)
    assert.closeTo(figures["eval/accuracy_se"]!, Math.sqrt(1 / 6) / 2, 1e-12)
  })

  it("termination and episode-end shares are exact: all of 10 trajectories is 1, not a sum of tenths", () => {
    const ended = (t: ReturnType<typeof answered>, episodeEnd: string) => ({ ...t, episodeEnd })
    const trajectories = Array.from({ length: 10 }, (_, i) => ended(answered("x"), i < 3 ? "solved" : "out"))
    const figures = RolloutFigures.rolloutFigures([{ groupId: "g0", rowIndex: 0, trajectories }], { prefix: "eval" })
    assert.strictEqual(figures["eval/termination/no_tool_call"], 1)
    assert.strictEqual(figures["eval/episode_end/solved"], 0.3)
    assert.strictEqual(figures["eval/episode_end/out"], 0.7)
  })

  it("a question answered alike by every sample adds no spread; one question has no standard error", () => {
    const same = RolloutFigures.rolloutFigures([group(0, [true, true]), group(1, [true, true])], { prefix: "eval" })
    assert.strictEqual(same["eval/accuracy_se"], 0)
    assert.strictEqual(
      RolloutFigures.rolloutFigures([group(0, [true, false])], { prefix: "eval" })["eval/accuracy_se"],
      0
    )
  })

  it(
    "the reward's metrics are averaged over the trajectories that carry them; error flags are failures, not figures",
    () => {
      const t = (metrics: Record<string, number>) => ({ ...answered("x"), metrics })
      const figures = RolloutFigures.rolloutFigures([{
        groupId: "g",
        rowIndex: 0,
        trajectories: [
          t({ "reward/answer/searches": 2, "reward/score/r_price": 1 }),
          t({ "reward/answer/searches": 1 }),
          t({ "reward/answer/error": 1 })
        ]
      }], { prefix: "rollout" })
      assert.strictEqual(figures["rollout/reward/answer/searches"], 1.5)
      assert.strictEqual(figures["rollout/reward/score/r_price"], 1)
      assert.isUndefined(figures["rollout/reward/answer/error"])
    }
  )

  it("a reward's errors by reason are counted per step, as rollout/failures/<Reason> is", () => {
    const failed = (reason: string) => ({
      ...answered("x"),
      metrics: { "reward/buggy/error": 1, [`reward/buggy/errors/${reason}`]: 1 }
    })
    const trajectories = [failed("Defect"), failed("Defect"), failed("Timeout"), answered("x")]
    const figures = RolloutFigures.rolloutFigures([{ groupId: "g", rowIndex: 0, trajectories }], { prefix: "rollout" })
    assert.strictEqual(figures["rollout/reward/buggy/errors/Defect"], 2)
    assert.strictEqual(figures["rollout/reward/buggy/errors/Timeout"], 1)
    assert.strictEqual(figures["rollout/failures/RewardFailed"], 3)
  })

  it("a call counted as a tool error (a gateway's malformed call the SDK read as text) makes the call invalid", () => {
    const malformed = { ...answered("x"), metrics: { "tool_errors/ParseFailed": 1 } }
    const none = { ...answered("x"), metrics: { "tool_errors/Timeout": 0 } }
    const trajectories = [malformed, answered("x"), answered("x"), none]
    const figures = RolloutFigures.rolloutFigures([{ groupId: "g", rowIndex: 0, trajectories }], { prefix: "eval" })
    assert.strictEqual(figures["eval/invalid_tool_call_rate"], 0.25)
  })

  it("a reward's not-applicable verdicts are counted per step", () => {
    const unscored = { ...answered("x"), metrics: { "reward/judge/not_applicable": 1 } }
    const trajectories = [unscored, unscored, answered("x"), answered("x")]
    const figures = RolloutFigures.rolloutFigures([{ groupId: "g", rowIndex: 0, trajectories }], { prefix: "rollout" })
    assert.strictEqual(figures["rollout/reward/judge/not_applicable"], 2)
  })

  it.effect("a call of a name that is not the task's tool is no tool_calls series: it is tool_errors/UnknownTool", () =>
    Effect.gen(function*() {
      // The tool actor answers such a call with an UnknownTool error, which the chain records in the trajectory.
      const calculator = Tool.make("calculator", { description: "calc", handler: () => Effect.succeed("1") })
      const tools = ToolActor.toPort(yield* ToolActor.make([calculator]))
      const call = (id: string, name: string) => ({ id, type: "function" as const, function: { name, arguments: {} } })
      const turn = yield* tools.executeTurn([call("c0", "calculator"), call("c1", "calc17ator")], Context.empty())
      assert.deepStrictEqual(turn.errors, ["UnknownTool"])
      const calling = (names: ReadonlyArray<string>, unknown: number) => ({
        ...trajectoryOf([{ role: "user", content: "q" }, {
          role: "assistant",
          content: "",
          tool_calls: names.map((name, i) => call(`c${i}`, name))
        }]),
        metrics: { "tool_errors/UnknownTool": unknown }
      })
      const trajectories = [calling(["calculator", "calc17ator"], 1), calling(["ca\ufffdculator"], 1)]
      const groups = [{ groupId: "g", rowIndex: 0, trajectories }]
      const known = RolloutFigures.rolloutFigures(groups, { prefix: "rollout", tools: ["calculator"] })
      assert.deepStrictEqual(Object.keys(known).filter((k) => k.startsWith("rollout/tool_calls/")), [
        "rollout/tool_calls/calculator"
      ])
      assert.strictEqual(known["rollout/tool_calls/calculator"], 0.5)
      assert.strictEqual(known["rollout/tool_errors/UnknownTool"], 2)
      assert.strictEqual(known["rollout/invalid_tool_call_rate"], 1)
      // Without the task's tools (an agent function, whose tools are its SDK's), every name is its own key.
      assert.strictEqual(
        RolloutFigures.rolloutFigures(groups, { prefix: "rollout" })["rollout/tool_calls/calc17ator"],
        0.5
      )
    }))
})

describe("RolloutFigures: steps", () => {
  it("rollout figures: reward, accuracy, invalid tool calls, turns, calls per tool and staleness", () => {
    const t = (over: Partial<Trajectory.Trajectory>): Trajectory.Trajectory => ({
      trajectoryId: "t",
      groupId: "g",
      chainId: "c",
      messages: [],
      segments: [{ spans: [{ source: "policy", tokenIds: [1, 2], policyVersion: 3 }], messageCount: 0 }],
      termination: "no_tool_call",
      reward: 0,
      rewardStatus: "scored",
      metrics: {},
      trainable: true,
      masked: false,
      ...over
    })
    const call = (name: string) => ({ id: name, type: "function" as const, function: { name, arguments: {} } })
    const group: Trajectory.Group = {
      groupId: "g",
      rowIndex: 0,
      trajectories: [
        t({
          reward: 1,
          metrics: { acc: 1 },
          messages: [{ role: "assistant", content: "", tool_calls: [call("calculator")] }]
        }),
        t({
          reward: 0.5,
          messages: [
            { role: "assistant", content: "", tool_calls: [call("calculator"), call("search")] },
            { role: "tool", content: "bad arguments", tool_call_id: "x", is_error: true },
            { role: "assistant", content: "done" }
          ]
        }),
        t({ termination: "error" }),
        t({
          reward: 1,
          segments: [{ spans: [{ source: "policy", tokenIds: [1], policyVersion: 1 }], messageCount: 0 }]
        })
      ]
    }
    // A weighted sum of rewards: its accuracy is the namespaced metric, whatever the sum.
    const sum = RolloutFigures.rolloutFigures([{
      ...group,
      trajectories: [
        t({ reward: 1.2, metrics: { "reward/mathEqual/acc": 0, "reward/toolCallFormat/reward": 1 } }),
        t({ reward: 0.9, metrics: { "reward/mathEqual/acc": 1 } })
      ]
    }], { prefix: "rollout" })
    assert.strictEqual(sum["rollout/accuracy"], 0.5)
    const f = RolloutFigures.rolloutFigures([group], { prefix: "rollout", policyVersion: 4 })
    assert.strictEqual(f["rollout/reward_mean"], 2.5 / 4)
    assert.strictEqual(f["rollout/accuracy"], 2 / 4, "acc metric, else reward >= 1")
    assert.strictEqual(f["rollout/invalid_tool_call_rate"], 2 / 4, "an error observation or an errored chain")
    assert.strictEqual(f["rollout/turns_mean"], 3 / 4)
    assert.strictEqual(f["rollout/tool_calls/calculator"], 2 / 4)
    assert.strictEqual(f["rollout/tool_calls/search"], 1 / 4)
    assert.strictEqual(f["rollout/policy_tokens"], 7)
    assert.strictEqual(f["rollout/staleness_mean"], (1 + 1 + 1 + 3) / 4)
  })

  it(
    "token budgets: turns cut at maxNewTokens (half the chains or more) and conversations cut at maxContextTokens " +
      "(a quarter or more) are named",
    () => {
      const agent = { maxNewTokens: 48, maxContextTokens: 256 }
      const none = RolloutFigures.budgetWarnings(3, {
        "rollout/termination/stop": 0.4,
        "rollout/termination/context_length": 0.2
      }, agent)
      assert.deepStrictEqual(none, {})
      const both = RolloutFigures.budgetWarnings(3, {
        "rollout/termination/stop": 0.5,
        "rollout/termination/context_length": 0.52
      }, agent)
      assert.include(both.cut, "step 3: 50% of the chains ended with a turn cut at agent.maxNewTokens (48)")
      assert.include(both.full, "step 3: 52% of the chains ended at agent.maxContextTokens (256 tokens)")
      assert.include(both.full, "raise agent.maxContextTokens")
      // An agent function's own max_tokens cut most of them: that is the setting to name.
      const figures = { "rollout/termination/stop": 0.75, "rollout/trajectories": 8 }
      const own = RolloutFigures.budgetWarnings(3, figures, agent, [16, 16, 16])
      assert.include(own.cut, "most at their agent's own request max_tokens (16, below agent.maxNewTokens 48)")
      assert.include(own.cut, "raise max_tokens in the agent's requests")
      assert.include(
        RolloutFigures.budgetWarnings(3, figures, agent, [16, 16]).cut,
        "cut at agent.maxNewTokens (48)",
        "a third of the cut chains"
      )
      // A budget the config does not set is the task's default: the warning says so, and where to override it.
      const webshop = { name: "webshop", defaults: { maxNewTokens: 48 } }
      const fromTask = RolloutFigures.budgetWarnings(3, { "rollout/termination/stop": 0.5 }, agent, [], webshop).cut
      assert.include(fromTask, "cut at agent.maxNewTokens (48, task webshop's default)")
      assert.include(fromTask, "raise agent.maxNewTokens in the config (it overrides the task's default)")
      const ownValue =
        RolloutFigures.budgetWarnings(3, { "rollout/termination/stop": 0.5 }, { maxNewTokens: 64 }, [], webshop).cut
      assert.include(ownValue, "cut at agent.maxNewTokens (64) before")
    }
  )

})

describe("RolloutFigures.stepNotices", () => {
  const agent = { maxNewTokens: 48, maxContextTokens: 512 }
  const chain = (termination: Trajectory.Trajectory["termination"], metrics: Record<string, number> = {}) => ({
    ...answered("x"),
    termination,
    metrics
  })

  it("says nothing of a healthy step", () => {
    const groups = [{ groupId: "g0", rowIndex: 0, trajectories: [chain("answer"), chain("answer")] }]
    const figures = RolloutFigures.rolloutFigures(groups, { prefix: "rollout" })
    assert.deepStrictEqual(RolloutFigures.stepNotices(2, figures, groups, { agent }), [])
  })

  it(
    "names short dynamic sampling, cut turns, dying tools, full contexts and prompts that fill the context, " +
      "in that order",
    () => {
      const trajectories = [
        chain("stop"),
        chain("stop"),
        chain("context_length", { tokens_generated: 0 }),
        chain("context_length", { tokens_generated: 3 })
      ]
      const groups = [{ groupId: "g0", rowIndex: 0, trajectories }]
      const figures = {
        ...RolloutFigures.rolloutFigures(groups, { prefix: "rollout" }),
        "rollout/tool_errors/Defect": 2
      }
      const notices = RolloutFigures.stepNotices(5, figures, groups, {
        agent,
        dynamic: { kept: 1, wanted: 3, batches: 4 }
      })
      assert.deepStrictEqual(notices.map((n) => n.key), ["short", "cut", "defect", "full", "unfit"])
      assert.include(notices[0]!.text, "step 5: dynamic sampling found 1 of 3 groups whose rewards differ in 4 batches")
      assert.include(notices[2]!.text, "2 tool call(s) died in the tool's own code")
      assert.include(notices[4]!.text, "1 of 4 chains ended before sampling a token")
      assert.include(notices[4]!.text, "agent.maxContextTokens (512)")
    }
  )

  it("dynamic sampling that found every group it wanted says nothing", () => {
    const groups = [{ groupId: "g0", rowIndex: 0, trajectories: [chain("answer")] }]
    const figures = RolloutFigures.rolloutFigures(groups, { prefix: "rollout" })
    const notices = RolloutFigures.stepNotices(1, figures, groups, {
      agent,
      dynamic: { kept: 3, wanted: 3, batches: 2 }
    })
    assert.deepStrictEqual(notices, [])
  })

  it("turns cut while repeating themselves are named as a policy running on, not as a budget to raise", () => {
    /** A chain cut at the budget whose last sampled turn is `tokens`. */
    const cutWith = (tokens: ReadonlyArray<number>) => ({
      ...chain("stop"),
      segments: [{
        spans: [{ source: "prompt" as const, tokenIds: [1, 2, 3] }, { source: "policy" as const, tokenIds: tokens }],
        messageCount: 2
      }]
    })
    const loop = [
      ...Array.from({ length: 10 }, (_, i) => 50 + i),
      ...Array.from({ length: 38 }, (_, i) => 41 + (i % 3))
    ]
    const call = Array.from({ length: 48 }, (_, i) => (i * 7919) % 251)
    const notice = (trajectories: ReadonlyArray<Trajectory.Trajectory>) => {
      const groups = [{ groupId: "g0", rowIndex: 0, trajectories }]
      const figures = RolloutFigures.rolloutFigures(groups, { prefix: "rollout" })
      return RolloutFigures.stepNotices(4, figures, groups, { agent }).find((n) => n.key === "cut")!.text
    }
    const looping = notice([cutWith(loop), cutWith(loop), cutWith(loop), chain("answer")])
    assert.include(looping, "most of them repeating themselves to the cut (3 of 3)")
    assert.notInclude(looping, "raise agent.maxNewTokens")
    // Long turns that do not repeat (a call longer than the budget) still ask for a larger budget.
    const long = notice([cutWith(call), cutWith(call), cutWith(loop), chain("answer")])
    assert.include(long, "raise agent.maxNewTokens")
    assert.isTrue(RolloutFigures.runsOn(loop))
    assert.isFalse(RolloutFigures.runsOn(call))
    assert.isFalse(RolloutFigures.runsOn(loop.slice(0, 20)), "too short to tell")
  })
})
