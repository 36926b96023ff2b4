/**
 * `cli/setup.ts`: command-line overrides (`--steps`, `--seed`, `--output`) are decoded with the config file, by the
 * same Schema, so an override out of bounds fails as the key in the file would, naming it.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Result } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Setup from "../../cli/setup.ts"
import type * as TrainConfig from "../../src/TrainConfig.ts"

const minimal = {
  output: "runs/x",
  model: { path: "model", preset: "tiny" },
  data: { train: "data/train.jsonl" },
  task: "calculator",
  algorithm: { steps: 10 }
}

const failure = <A, R>(effect: Effect.Effect<A, unknown, R>) =>
  Effect.map(Effect.result(effect), (r) => {
    assert.isTrue(Result.isFailure(r), "expected a failure")
    return (r as Result.Failure<A, TrainConfig.ConfigError>).failure
  })

describe("cli setup", () => {
  it.effect("command-line overrides go through the same Schema as the file", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "config-"))
      writeFileSync(join(dir, "c.json"), JSON.stringify(minimal))
      const file = join(dir, "c.json")
      for (const [overrides, path] of [[{ steps: 0 }, "algorithm.steps"], [{ steps: -5 }, "algorithm.steps"], [{ steps: 2.5 }, "algorithm.steps"], [{ seed: -7 }, "seed"]] as const) {
        const error = yield* failure(Setup.load(file, overrides))
        assert.isTrue(error.issues.some((i) => i.startsWith(path + ":")), `${JSON.stringify(overrides)}: ${error.issues.join("; ")}`)
      }
      const { config } = yield* Setup.load(file, { steps: 3, seed: 7 })
      assert.strictEqual(config.algorithm.steps, 3)
      assert.strictEqual(config.seed, 7)
    }).pipe(Effect.provide(NodeServices.layer)))
})
