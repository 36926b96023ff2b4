/**
 * `agentfly train` with `learner.backend: "tinker"` as a user runs it, against our Tinker server (in this test's
 * process, on loopback): a run SIGKILLed mid-RL and resumed with `--resume` loads the engine's state of its last
 * checkpoint (`tinker.json` → `load_weights` with the optimiser) and ends on the weights of the same run unbroken.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Models from "../../actors/tinker/Models.ts"
import * as TinkerServer from "../../actors/tinker/TinkerServer.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { agentfly, calculatorRun, metricsOf } from "../utils/agentfly.ts"

const steps = 6

const configOf = (output: string, baseUrl: string) =>
  calculatorRun({
    seed: 13,
    output,
    task: { name: "calculator", options: { toolCallFormat: 0.2 } },
    warmup: { data: "data/demos.jsonl", steps: 40, batchSize: 8, lr: 0.003 },
    algorithm: { steps, groupsPerStep: 4, microBatchSize: 8, lr: 0.001 },
    eval: { every: 3, size: 8 },
    checkpoint: { every: 2 },
    learner: { workers: 1, backend: "tinker", tinker: { baseUrl, baseModel: "calculator-tiny" } }
  }, { maxNewTokens: 96 })

/** The fingerprint of the engine's state that a run's last checkpoint names. */
const lastState = (dir: string, output: string, stateDir: string): string => {
  const named = JSON.parse(
    readFileSync(join(dir, output, "checkpoints", `step-${String(steps).padStart(6, "0")}`, "tinker.json"), "utf8")
  )
  const [, model, name] = /^tinker:\/\/([^/]+)\/weights\/(.+)$/.exec(named.statePath)!
  const state = join(stateDir, "checkpoints", model!, name!, "trainer_state.json")
  return JSON.parse(readFileSync(state, "utf8")).weightsHash
}

describe("agentfly train with learner.backend tinker", () => {
  it.live("SIGKILLed mid-run, --resume goes on from the engine's state and ends on the unbroken run's weights", () =>
    Effect.scoped(
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "tinker-resume-"))
        const data = { dir: join(dir, "data"), seed: 5, train: 64, heldOut: 8, validation: 4, demos: 64, noise: 0 }
        yield* Generate.write(data)
        yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
        const folder = yield* ModelFolder.load(join(dir, "model"))
        const stateDir = join(dir, "tinker-state")
        const server = yield* TinkerServer.serve({
          bases: [Models.baseOf("calculator-tiny", folder)],
          stateDir,
          pollMillis: 100
        })
        const file = (output: string) => {
          const path = join(dir, `${output}.json`)
          writeFileSync(path, JSON.stringify(configOf(output, server.baseUrl)))
          return path
        }

        const unbroken = yield* agentfly(["train", file("unbroken")])
        assert.strictEqual(unbroken.code, 0, unbroken.output)
        // Steps without a learning signal are skipped (a short warm-up): the warm-up's weights and the steps that
        // applied are what a resume must restore from the engine's state (a new model would hold the base weights).
        const trainedOf = (output: string) => /trained (\d+) of 6 steps/.exec(output)?.[1]
        assert.isDefined(trainedOf(unbroken.output), unbroken.output)

        // Killed once its third RL step is in the metrics: the last checkpoint is step 2's.
        const metrics = join(dir, "killed", "metrics.jsonl")
        const trained = () =>
          existsSync(metrics) &&
          readFileSync(metrics, "utf8").split("\n").filter((l) => l.includes("\"phase\":\"train\"")).length >= 3
        const killed = yield* agentfly(["train", file("killed")], trained)
        assert.strictEqual(killed.signal, "SIGKILL", killed.output)
        const resumed = yield* agentfly(["train", file("killed"), "--resume"])
        assert.strictEqual(resumed.code, 0, resumed.output)
        assert.match(resumed.output, /resuming .*killed from step-00000[24]/)
        assert.strictEqual(trainedOf(resumed.output), trainedOf(unbroken.output), resumed.output)

        assert.strictEqual(lastState(dir, "killed", stateDir), lastState(dir, "unbroken", stateDir))
        const losses = (output: string) =>
          metricsOf(join(dir, output)).filter((m) => m.phase === "train").map((m) => m.figures["learner/loss"])
        assert.deepStrictEqual(losses("killed"), losses("unbroken"))
      }).pipe(Effect.provide(NodeServices.layer))
    ), { timeout: 900_000 })
})
