/**
 * `cli/setup.ts`: command-line overrides (`--steps`, `--seed`, `--output`) are decoded with the config file, by the
 * same Schema, so an override out of bounds fails as the key in the file would, naming it. A task's path options
 * are resolved against the config file, and the config a run records holds them absolute.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Result } from "effect"
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
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
      for (
        const [overrides, path] of [
          [{ steps: 0 }, "algorithm.steps"],
          [{ steps: -5 }, "algorithm.steps"],
          [{ steps: 2.5 }, "algorithm.steps"],
          [{ seed: -7 }, "seed"]
        ] as const
      ) {
        const error = yield* failure(Setup.load(file, overrides))
        assert.isTrue(
          error.issues.some((i) => i.startsWith(path + ":")),
          `${JSON.stringify(overrides)}: ${error.issues.join("; ")}`
        )
      }
      const { config } = yield* Setup.load(file, { steps: 3, seed: 7 })
      assert.strictEqual(config.algorithm.steps, 3)
      assert.strictEqual(config.seed, 7)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("task options that are not an object are named as task.options, not as a wrong task", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "config-"))
      for (const options of ["toolCallFormat=0.2", null, [1]]) {
        writeFileSync(join(dir, "c.json"), JSON.stringify({ ...minimal, task: { name: "calculator", options } }))
        const error = yield* failure(Setup.load(join(dir, "c.json")))
        assert.include(
          error.message,
          `task.options: expected an object of the task's options, got ${JSON.stringify(options)}`
        )
      }
      writeFileSync(join(dir, "c.json"), JSON.stringify({ ...minimal, task: 7 }))
      assert.include((yield* failure(Setup.load(join(dir, "c.json")))).message, "task: expected a task name")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a task's path options are recorded absolute: the run's config.json loads the same from elsewhere", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "config-"))
      const file = join(dir, "c.json")
      writeFileSync(file, JSON.stringify({ ...minimal, task: { name: "swe", options: { root: "folders", pool: 2 } } }))
      const { config } = yield* Setup.load(file)
      assert.deepStrictEqual(config.task, { name: "swe", options: { root: join(dir, "folders"), pool: 2 } })
      // As `agentfly eval RUN/config.json` reads it: the run's directory is not the config's.
      const run = join(dir, "runs", "x")
      mkdirSync(run, { recursive: true })
      writeFileSync(join(run, "config.json"), JSON.stringify(config))
      const recorded = yield* Setup.load(join(run, "config.json"))
      assert.deepStrictEqual(recorded.config.task, config.task)
      // A built-in name or a task without path options is kept as written.
      writeFileSync(
        file,
        JSON.stringify({ ...minimal, task: { name: "calculator", options: { toolCallFormat: 0.2 } } })
      )
      assert.deepStrictEqual((yield* Setup.load(file)).config.task, {
        name: "calculator",
        options: { toolCallFormat: 0.2 }
      })
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a config with the old tools and reward keys and no task says what became of them", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "setup-old-"))
      const { task: _task, ...withoutTask } = minimal
      writeFileSync(join(dir, "c.json"), JSON.stringify({ ...withoutTask, tools: ["calculator"], reward: "math" }))
      const error = yield* failure(Setup.load(join(dir, "c.json")))
      assert.include(error.message, "task: missing")
      assert.include(error.message, "tools and reward are no longer config keys: a task holds its tools and its reward")
      writeFileSync(join(dir, "d.json"), JSON.stringify(withoutTask))
      assert.notInclude((yield* failure(Setup.load(join(dir, "d.json")))).message, "no longer config keys")
    }).pipe(Effect.provide(NodeServices.layer)))
})
