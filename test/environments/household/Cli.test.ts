/**
 * The household task through the real command line: `agentfly train examples/household/short.json` (the built-in
 * task by name; a tiny policy's short warm-up on the oracle's demonstrations, then a few GRPO steps) on freshly
 * generated data, then `agentfly eval` of the run's last checkpoint. Real time: ≈ 50 s on 2 idle cores, ≈ 105 s
 * beside a training run.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Data from "../../../environments/household/Data.ts"
import * as Generate from "../../../examples/household/generate.ts"
import * as Science from "../../../examples/household/generate-science.ts"
import { agentfly, evalCheckpoint, metricsOf, shortConfig } from "../../utils/agentfly.ts"


describe("household task on the command line", () => {
  it.live("agentfly train short.json trains the built-in task end to end; agentfly eval reads its checkpoint", () =>
    Effect.gen(function*() {
      const data = mkdtempSync(join(tmpdir(), "household-short-data-"))
      // The example's curriculum, few rows.
      yield* Data.write({ ...Generate.defaults, train: 64, heldOut: 16, validation: 8, demos: 120, dir: data })
      const dir = mkdtempSync(join(tmpdir(), "household-short-"))
      const config = shortConfig("household", data, dir)
      const run = yield* agentfly(["train", config])
      assert.strictEqual(run.code, 0, run.output)
      assert.match(run.output, /on task household/)
      assert.match(run.output, /held-out accuracy [\d.]+ (± [\d.]+ )?\(step 0\) → [\d.]+ (± [\d.]+ )?\(step 4\)/)
      assert.isTrue(existsSync(join(dir, "run", "report.html")))
      const records = metricsOf(join(dir, "run"))
      const train = records.filter((r) => r.phase === "train")
      assert.strictEqual(train.length, 4)
      assert.isAbove(train.filter((r) => r.figures["learner/applied"] === 1).length, 0, "a GRPO step was applied")
      // The chains acted in their worlds, turn after turn (the environment answered each), and the commands term
      // scored them.
      assert.isTrue(train.every((r) => (r.figures["rollout/turns_mean"] ?? 0) > 1), JSON.stringify(train[0]))
      assert.isTrue(train.some((r) => (r.figures["rollout/reward_mean"] ?? 0) > 0), JSON.stringify(train[0]))

      const evaluated = yield* evalCheckpoint(config, dir, "step-000004")
      assert.strictEqual(evaluated.code, 0, evaluated.output)
      assert.match(evaluated.output, /held-out accuracy [\d.]+/)
      assert.strictEqual(evaluated.result!["questions"], 16)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.live("agentfly train science-short.json: the science family's smoke run (small preset, a few steps)", () =>
    Effect.gen(function*() {
      const data = mkdtempSync(join(tmpdir(), "science-short-data-"))
      yield* Data.write({ ...Science.defaults, train: 16, heldOut: 4, validation: 4, demos: 40, dir: data })
      const dir = mkdtempSync(join(tmpdir(), "science-short-"))
      const config = shortConfig("household", data, dir, "science-short.json")
      const run = yield* agentfly(["train", config])
      assert.strictEqual(run.code, 0, run.output)
      assert.match(run.output, /on task science/)
      // The shipped config's turn budget holds its generator's demonstrations (it warned about itself at 32).
      assert.notInclude(run.output, "longer than agent.maxNewTokens")
      const train = metricsOf(join(dir, "run")).filter((r) => r.phase === "train")
      assert.strictEqual(train.length, 2)
      assert.isTrue(train.every((r) => (r.figures["rollout/turns_mean"] ?? 0) > 1), JSON.stringify(train[0]))
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})
