/**
 * The search task through the real command line: `agentfly train examples/search/short.json` (the built-in task by
 * name, a tiny policy's short warm-up on the oracle's demonstrations, then a few GRPO steps) on freshly generated
 * data, then `agentfly eval` of the run's last checkpoint. Real time: ≈ 40–60 s on 2 cores.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Generate from "../../../examples/search/generate.ts"
import { agentfly, evalCheckpoint, metricsOf, shortConfig } from "../../utils/agentfly.ts"


describe("search task on the command line", () => {
  it.live("agentfly train short.json trains the built-in task end to end; agentfly eval reads its checkpoint", () =>
    Effect.gen(function*() {
      const data = mkdtempSync(join(tmpdir(), "search-short-data-"))
      // The default world (the task's default options), few questions.
      yield* Generate.write({ ...Generate.defaults, train: 64, heldOut: 16, validation: 16, demos: 200, dir: data })
      const dir = mkdtempSync(join(tmpdir(), "search-short-"))
      const config = shortConfig("search", data, dir)
      const run = yield* agentfly(["train", config])
      assert.strictEqual(run.code, 0, run.output)
      assert.match(run.output, /on task search/)
      assert.match(run.output, /held-out accuracy [\d.]+ ± [\d.]+ \(step 0\) → [\d.]+ ± [\d.]+ \(step 4\)/)
      assert.isTrue(existsSync(join(dir, "run", "report.html")))
      const records = metricsOf(join(dir, "run"))
      const train = records.filter((r) => r.phase === "train")
      assert.strictEqual(train.length, 4)
      assert.isAbove(train.filter((r) => r.figures["learner/applied"] === 1).length, 0, "a GRPO step was applied")
      // The chains searched (the warm-up taught the call) and the reward's metrics reached the figures.
      assert.isTrue(train.some((r) => (r.figures["rollout/reward/answer/searches"] ?? 0) > 0), JSON.stringify(train[0]))

      const evaluated = yield* evalCheckpoint(config, dir, "step-000004")
      assert.strictEqual(evaluated.code, 0, evaluated.output)
      assert.match(evaluated.output, /held-out accuracy [\d.]+/)
      assert.strictEqual(evaluated.result!["questions"], 16)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})
