import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as TrainConfig from "../../src/TrainConfig.ts"

const minimal = {
  output: "runs/x",
  model: { path: "model", preset: "tiny" },
  data: { train: "data/train.jsonl" },
  task: "calculator",
  algorithm: { steps: 10 }
}

describe("TrainConfig learner", () => {
  it.effect("learner.workers defaults to 2 threads and takes 1 for the single-thread learner", () =>
    Effect.gen(function*() {
      assert.strictEqual((yield* TrainConfig.decode(minimal)).learner.workers, 2)
      assert.strictEqual((yield* TrainConfig.decode({ ...minimal, learner: { workers: 1 } })).learner.workers, 1)
    }))

  it.effect("a mistyped or non-positive worker count is rejected with its path", () =>
    Effect.gen(function*() {
      const typo = yield* Effect.flip(TrainConfig.decode({ ...minimal, learner: { worker: 2 } }))
      assert.include(typo.issues.join("\n"), "learner.worker: unknown key (did you mean \"workers\"?)")
      const zero = yield* Effect.flip(TrainConfig.decode({ ...minimal, learner: { workers: 0 } }))
      assert.strictEqual(zero.reason, "Invalid")
      assert.match(zero.issues.join("\n"), /^learner\.workers/m)
    }))
})
