import { assert, describe, it } from "@effect/vitest"
import * as BatchCheck from "../../src/BatchCheck.ts"
import type * as Trajectory from "../../src/Trajectory.ts"
import { answered } from "../utils/trajectories.ts"

/** A trajectory with one prompt span and one policy span of `ids` sampled by `version`. */
const sampled = (ids: ReadonlyArray<number>, version: number, logprob = -0.5): Trajectory.Trajectory => ({
  ...answered("x"),
  reward: 1,
  segments: [{
    messageCount: 2,
    spans: [
      { source: "prompt", tokenIds: [1, 2, 3] },
      { source: "policy", tokenIds: ids, logprobs: ids.map(() => logprob), policyVersion: version }
    ]
  }]
})

const group = (row: number, trajectories: ReadonlyArray<Trajectory.Trajectory>, firstSeq = 8): Trajectory.Group => ({
  groupId: `s${firstSeq}-g${row}`,
  rowIndex: row,
  trajectories
})

const request: BatchCheck.Request = { rows: 2, chains: 2, firstSeq: 8, versions: { from: 3, to: 4 }, vocabSize: 100 }

describe("BatchCheck.problems", () => {
  it("a batch that answers its request has none; a dropped group is allowed", () => {
    const groups = [group(0, [sampled([5, 6], 3), sampled([7], 4)]), group(1, [sampled([9], 3)])]
    assert.deepStrictEqual(BatchCheck.problems(groups, request), [])
    assert.deepStrictEqual(BatchCheck.problems(groups.slice(1), request), [], "row 0's group was dropped")
  })

  it("rows nobody asked for, a row answered twice, a wrong id, more trajectories than chains", () => {
    const found = BatchCheck.problems([
      group(0, [sampled([5], 3)]),
      group(0, [sampled([5], 3)]),
      group(5000, [sampled([5], 3)]),
      { ...group(1, [sampled([5], 3), sampled([5], 3), sampled([5], 3)]), groupId: "s0-g1" }
    ], request)
    assert.strictEqual(found.length, 4, found.join("\n"))
    assert.include(found[0], "answers row 0 a second time")
    assert.include(found[1], "answers row 5000, outside the batch's 2 rows")
    assert.include(found[2], `should be "s8-g1"`)
    assert.include(found[3], "holds 3 trajectories, more than the 2 chains asked")
  })

  it(
    "tokens of a version nobody published, outside the vocabulary, logprobs that are not logprobs, a reward of NaN",
    () => {
      const found = BatchCheck.problems([
        group(0, [sampled([5], 999999), sampled([100], 3)]),
        group(1, [sampled([5], 3, Number.NaN), { ...sampled([5], 3), reward: Number.NaN }])
      ], request)
      assert.include(found[0], "policy version 999999, not one of the versions 3–4")
      assert.include(found[1], "token id 100, outside the model's vocabulary (100)")
      assert.include(found[2], "a sampled logprob of NaN")
      assert.include(found[3], "a reward of NaN")
    }
  )

  it("names five problems and counts the rest", () => {
    const many = Array.from({ length: 8 }, (_, i) => group(10 + i, []))
    const found = BatchCheck.problems(many, request)
    assert.strictEqual(found.length, 6)
    assert.strictEqual(found[5], "… and 3 more")
  })
})
