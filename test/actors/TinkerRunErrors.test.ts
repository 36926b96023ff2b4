/**
 * A Tinker run that cannot start says why before anything trains: a key the engine refuses (naming the variable the
 * key is read from) and a base model the engine does not serve (naming it), each a typed `RunError`.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { RunError } from "../../actors/RunError.ts"
import * as Models from "../../actors/tinker/Models.ts"
import * as TinkerServer from "../../actors/tinker/TinkerServer.ts"
import * as Train from "../../actors/Train.ts"
import { task } from "../../environments/calculator/CalculatorTask.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { calculatorRun } from "../utils/agentfly.ts"

const keyVariable = "AGENTFLY_TEST_TINKER_KEY"

describe("learner.backend tinker: refusals at start", () => {
  it.live("a refused key names its variable; an unknown base model is named; nothing trains", () =>
    Effect.scoped(
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "tinker-refused-"))
        const data = { dir: join(dir, "data"), seed: 5, train: 8, heldOut: 4, validation: 2, demos: 8, noise: 0 }
        yield* Generate.write(data)
        yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
        const folder = yield* ModelFolder.load(join(dir, "model"))
        const server = yield* TinkerServer.serve({
          bases: [Models.baseOf("calculator-tiny", folder)],
          apiKeys: ["tml-right"]
        })
        const calculator = yield* task({})
        const run = (output: string, baseModel: string) =>
          Effect.flip(Train.run({
            task: calculator,
            dir,
            config: calculatorRun({
              seed: 1,
              output,
              algorithm: { steps: 2, groupsPerStep: 2 },
              learner: {
                backend: "tinker",
                tinker: { baseUrl: server.baseUrl, baseModel, apiKeyEnv: keyVariable }
              }
            }) as never,
            write: () => {},
            tty: false
          }))
        process.env[keyVariable] = "tml-wrong"
        const refused = yield* run("wrong-key", "calculator-tiny")
        assert.instanceOf(refused, RunError)
        assert.include(refused.message, "the API key was refused")
        assert.include(refused.message, `$${keyVariable}`)
        assert.isFalse(existsSync(join(dir, "wrong-key", "checkpoints", "step-000001")))
        process.env[keyVariable] = "tml-right"
        const unknown = yield* run("unknown-model", "Qwen/Qwen3-8B")
        assert.instanceOf(unknown, RunError)
        assert.include(unknown.message, "Qwen/Qwen3-8B")
        delete process.env[keyVariable]
      }).pipe(Effect.provide(NodeServices.layer))
    ), { timeout: 300_000 })
})
