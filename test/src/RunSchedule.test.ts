import { assert, describe, it } from "@effect/vitest"
import * as RunSchedule from "../../src/RunSchedule.ts"

describe("RunSchedule", () => {
  it("row order: a seeded permutation per epoch, every row once per epoch", () => {
    const order = RunSchedule.rowsAt(10, 3, 0, 30)
    for (let epoch = 0; epoch < 3; epoch++) {
      assert.deepStrictEqual([...order.slice(epoch * 10, epoch * 10 + 10)].sort((a, b) => a - b), [...Array(10).keys()])
    }
    assert.notDeepEqual(order.slice(0, 10), order.slice(10, 20))
    assert.deepStrictEqual(RunSchedule.rowsAt(10, 3, 7, 5), order.slice(7, 12))
    assert.notDeepEqual(RunSchedule.rowsAt(10, 4, 0, 10), order.slice(0, 10))
  })

  it("warm-up checks: every `every` steps from `from`, never at the last step", () => {
    const steps = (n: number, stopAt: { every: number; from?: number }) =>
      Array.from({ length: n }, (_, i) => i + 1).filter((s) => RunSchedule.isCheckStep(s, n, stopAt))
    assert.deepStrictEqual(steps(10, { every: 3 }), [3, 6, 9])
    assert.deepStrictEqual(steps(10, { every: 3, from: 5 }), [5, 8])
    assert.deepStrictEqual(steps(9, { every: 3 }), [3, 6])
  })

  it("sampling versions: the step before in sync mode, maxStaleness older in async, never before a checkpoint", () => {
    const versions = (ahead: number, checkpointEvery: number, from = 0) =>
      Array.from(
        { length: 9 - from },
        (_, i) => RunSchedule.samplingVersion(from + i + 1, { ahead, checkpointEvery, from })
      )
    assert.deepStrictEqual(versions(0, 3), [0, 1, 2, 3, 4, 5, 6, 7, 8])
    assert.deepStrictEqual(versions(1, 3), [0, 0, 1, 3, 3, 4, 6, 6, 7])
    assert.deepStrictEqual(versions(2, 100), [0, 0, 0, 1, 2, 3, 4, 5, 6])
    // Resumed from step 4 (a forced resume off the checkpoint schedule): nothing older than its weights.
    assert.deepStrictEqual(versions(1, 3, 4), [4, 4, 6, 6, 7])
  })

})

describe("RunSchedule: batches and checkpoints", () => {
  const order = { rows: 10, seed: 3, groupsPerStep: 4 }

  it("step s's batch is the run's row order at (s − 1) · groupsPerStep", () => {
    const all = RunSchedule.rowsAt(10, 3, 0, 40)
    for (const step of [1, 2, 3, 7]) {
      const batch = RunSchedule.batchRows(step, order)
      assert.strictEqual(batch.firstSeq, (step - 1) * 4)
      assert.deepStrictEqual(batch.rows, all.slice((step - 1) * 4, step * 4))
    }
  })

  it("dynamic sampling's further batches: seqs past the row order's, fixed by the step and batch alone", () => {
    const options = { ...order, maxBatches: 3 }
    const seen = new Set<number>()
    for (let step = 1; step <= 4; step++) {
      for (let batch = 1; batch < options.maxBatches; batch++) {
        const extra = RunSchedule.extraBatchRows(step, batch, options)
        assert.isAtLeast(extra.firstSeq, RunSchedule.extraSeqs)
        assert.isFalse(seen.has(extra.firstSeq), "no two further batches share seqs")
        seen.add(extra.firstSeq)
        assert.strictEqual(extra.rows.length, 4)
        assert.deepStrictEqual(RunSchedule.extraBatchRows(step, batch, options), extra, "a function of its inputs")
      }
    }
    // Their rows come from an order of their own, not the run's.
    assert.notDeepEqual(
      RunSchedule.extraBatchRows(1, 1, options).rows.concat(RunSchedule.extraBatchRows(1, 2, options).rows),
      RunSchedule.rowsAt(10, 3, 0, 8)
    )
  })

  it("evaluations and checkpoints are due every `every` steps and at the last step", () => {
    const due = Array.from({ length: 10 }, (_, i) => i + 1).filter((s) => RunSchedule.isDue(s, 4, 10))
    assert.deepStrictEqual(due, [4, 8, 10])
    assert.strictEqual(RunSchedule.checkpointName(12), "step-000012")
    assert.deepStrictEqual(RunSchedule.warmupRows(2, { rows: 5, seed: 1, batchSize: 3 }).length, 3)
  })
})
