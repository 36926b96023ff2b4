/**
 * `Trainer.rolloutFigures`' accuracy standard error: over questions (groups), each the mean of its samples, so
 * samples of one question do not count as independent evidence.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Trainer from "../../actors/Trainer.ts"
import { answered } from "../utils/trajectories.ts"

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
})
