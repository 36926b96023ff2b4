/**
 * `Trainer.rolloutFigures`' accuracy standard error: over questions (groups), each the mean of its samples, so
 * samples of one question do not count as independent evidence.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Trainer from "../../actors/Trainer.ts"
import { answered, trajectoryOf } from "../utils/trajectories.ts"

const group = (rowIndex: number, outcomes: ReadonlyArray<boolean>) => ({
  groupId: `g${rowIndex}`,
  rowIndex,
  trajectories: outcomes.map((ok) => ({ ...answered("x"), reward: ok ? 1 : 0, metrics: { acc: ok ? 1 : 0 } }))
})

describe("Trainer.rolloutFigures", () => {
  it("accuracy_se is the standard error over questions of their mean accuracy", () => {
    // Question means 1, 0.5, 0, 0.5: mean 0.5, sample sd sqrt(1/6), SE sqrt(1/6)/2.
    const groups = [group(0, [true, true]), group(1, [true, false]), group(2, [false, false]), group(3, [false, true])]
    const figures = Trainer.rolloutFigures(groups, { prefix: "eval" })
    assert.strictEqual(figures["eval/accuracy"], 0.5)
    assert.closeTo(figures["eval/accuracy_se"]!, Math.sqrt(1 / 6) / 2, 1e-12)
  })

  it("a question answered alike by every sample adds no spread; one question has no standard error", () => {
    const same = Trainer.rolloutFigures([group(0, [true, true]), group(1, [true, true])], { prefix: "eval" })
    assert.strictEqual(same["eval/accuracy_se"], 0)
    assert.strictEqual(Trainer.rolloutFigures([group(0, [true, false])], { prefix: "eval" })["eval/accuracy_se"], 0)
  })

  it("the reward's metrics are averaged over the trajectories that carry them; error flags are failures, not figures", () => {
    const t = (metrics: Record<string, number>) => ({ ...answered("x"), metrics })
    const figures = Trainer.rolloutFigures([{
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
    const figures = Trainer.rolloutFigures([{ groupId: "g", rowIndex: 0, trajectories }], { prefix: "rollout" })
    assert.strictEqual(figures["rollout/reward/buggy/errors/Defect"], 2)
    assert.strictEqual(figures["rollout/reward/buggy/errors/Timeout"], 1)
    assert.strictEqual(figures["rollout/failures/RewardFailed"], 3)
  })

  it("a call counted as a tool error (a gateway's malformed call the SDK read as text) makes the call invalid", () => {
    const malformed = { ...answered("x"), metrics: { "tool_errors/ParseFailed": 1 } }
    const none = { ...answered("x"), metrics: { "tool_errors/Timeout": 0 } }
    const trajectories = [malformed, answered("x"), answered("x"), none]
    const figures = Trainer.rolloutFigures([{ groupId: "g", rowIndex: 0, trajectories }], { prefix: "eval" })
    assert.strictEqual(figures["eval/invalid_tool_call_rate"], 0.25)
  })

  it("a reward's not-applicable verdicts are counted per step", () => {
    const unscored = { ...answered("x"), metrics: { "reward/judge/not_applicable": 1 } }
    const trajectories = [unscored, unscored, answered("x"), answered("x")]
    const figures = Trainer.rolloutFigures([{ groupId: "g", rowIndex: 0, trajectories }], { prefix: "rollout" })
    assert.strictEqual(figures["rollout/reward/judge/not_applicable"], 2)
  })

  it("calls to names that are not the task's tools count once, as tool_calls/(unknown)", () => {
    const calling = (...names: ReadonlyArray<string>) =>
      trajectoryOf([{ role: "user", content: "q" }, {
        role: "assistant",
        content: "",
        tool_calls: names.map((name, i) => ({
          id: `c${i}`,
          type: "function" as const,
          function: { name, arguments: {} }
        }))
      }])
    const trajectories = [calling("calculator", "calc17ator"), calling("ca\ufffdculator")]
    const groups = [{ groupId: "g", rowIndex: 0, trajectories }]
    const known = Trainer.rolloutFigures(groups, { prefix: "rollout", tools: ["calculator"] })
    assert.deepStrictEqual(
      Object.keys(known).filter((k) => k.startsWith("rollout/tool_calls/")).sort(),
      ["rollout/tool_calls/(unknown)", "rollout/tool_calls/calculator"]
    )
    assert.strictEqual(known["rollout/tool_calls/(unknown)"], 1)
    assert.strictEqual(known["rollout/tool_calls/calculator"], 0.5)
    // Without the task's tools (a caller that has none), every name is its own key, as before.
    assert.strictEqual(Trainer.rolloutFigures(groups, { prefix: "rollout" })["rollout/tool_calls/calc17ator"], 0.5)
  })
})
