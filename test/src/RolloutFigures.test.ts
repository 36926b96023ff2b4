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
    assert.strictEqual(RolloutFigures.rolloutFigures([group(0, [true, false])], { prefix: "eval" })["eval/accuracy_se"], 0)
  })

  it("the reward's metrics are averaged over the trajectories that carry them; error flags are failures, not figures", () => {
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
  })

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
      assert.strictEqual(RolloutFigures.rolloutFigures(groups, { prefix: "rollout" })["rollout/tool_calls/calc17ator"], 0.5)
    }))
})
