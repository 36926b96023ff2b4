/**
 * `agentfly train --resume` of a run that started from another run's checkpoint (`model.from`): the resume starts
 * from its own checkpoint and says only that; it printed "starting from the weights of … (model.from)" first, which
 * the resume then contradicted.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Generate from "../../examples/calculator/generate.ts"
import { agentfly, calculatorRun } from "../utils/agentfly.ts"

describe("agentfly train --resume after model.from", () => {
  it.live("says it resumes from its own checkpoint, not that it starts from model.from's weights", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "resume-from-"))
      const data = { dir: join(dir, "data"), seed: 5, train: 64, heldOut: 8, validation: 4, demos: 64, noise: 0 }
      yield* Generate.write(data)
      const rl = { groupsPerStep: 2, lr: 0.001, advantage: "reinforce++", entropyCoef: 0.01 }
      writeFileSync(join(dir, "base.json"), JSON.stringify(calculatorRun({
        seed: 11,
        output: "base",
        algorithm: { steps: 1, ...rl },
        eval: { every: 1, size: 8 }
      })))
      const base = yield* agentfly(["train", join(dir, "base.json")])
      assert.strictEqual(base.code, 0, base.output)
      const { warmup: _, ...variant } = calculatorRun({
        seed: 11,
        output: "variant",
        model: { path: "model", preset: "tiny", initSeed: 3, from: "base/checkpoints/step-000000" },
        algorithm: { steps: 1, ...rl },
        eval: { every: 1, size: 8 },
        checkpoint: { every: 1 }
      })
      writeFileSync(join(dir, "variant.json"), JSON.stringify(variant))
      const first = yield* agentfly(["train", join(dir, "variant.json")])
      assert.strictEqual(first.code, 0, first.output)
      assert.match(first.output, /starting from the weights of \S+base\/checkpoints\/step-000000 \(model.from\)/)
      const resumed = yield* agentfly(["train", join(dir, "variant.json"), "--resume", "--steps", "2"])
      assert.strictEqual(resumed.code, 0, resumed.output)
      assert.match(resumed.output, /resuming \S+ from step-000001 \(step 1\)/)
      assert.notInclude(resumed.output, "starting from the weights of")
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})
