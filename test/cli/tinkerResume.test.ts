/**
 * `agentfly train` with `learner.backend: "tinker"` as a user runs it, against our Tinker server (in this test's
 * process, on loopback): a run SIGKILLed mid-RL and resumed with `--resume` loads the engine's state of its last
 * checkpoint (`tinker.json` → `load_weights` with the optimiser), passes the resume's fingerprint check and trains
 * to the end **to the bit of the unbroken run**: the engine's state of the last checkpoint has the unbroken run's
 * weights fingerprint, and every metric but the timings is the unbroken run's. That holds because our server's
 * `asample` admits one prompt at a time into its engine (`LocalPolicy.prefillAlone`): before, it batched requests as
 * they arrived, and two runs with the client in another process already differed in the last bits at their first
 * step (the learner's loss 0.03798714652657509 against 0.03798714280128479).
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Models from "../../actors/tinker/Models.ts"
import * as TinkerServer from "../../actors/tinker/TinkerServer.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { agentfly, calculatorRun, metricsOf } from "../utils/agentfly.ts"

const steps = 6

type Metrics = ReturnType<typeof metricsOf>[number]

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

/** The engine's state that a run's checkpoint names, and its weights' fingerprint. */
const stateOf = (dir: string, output: string, stateDir: string, step: number) => {
  const named = JSON.parse(
    readFileSync(join(dir, output, "checkpoints", `step-${String(step).padStart(6, "0")}`, "tinker.json"), "utf8")
  )
  const [, model, name] = /^tinker:\/\/([^/]+)\/weights\/(.+)$/.exec(named.statePath)!
  const state = join(stateDir, "checkpoints", model!, name!, "trainer_state.json")
  return { path: named.statePath as string, weightsHash: JSON.parse(readFileSync(state, "utf8")).weightsHash as string }
}

describe("agentfly train with learner.backend tinker", () => {
  it.live("SIGKILLed mid-run, --resume loads the engine's state of the last checkpoint and trains to the end", () =>
    Effect.scoped(
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "tinker-resume-"))
        const data = { dir: join(dir, "data"), seed: 5, train: 64, heldOut: 8, validation: 4, demos: 64, noise: 0 }
        yield* Generate.write(data)
        yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
        const folder = yield* ModelFolder.load(join(dir, "model"))
        const stateDir = join(dir, "tinker-state")
        const loads: Array<{ path: string; optimizer: boolean }> = []
        const server = yield* TinkerServer.serve({
          bases: [Models.baseOf("calculator-tiny", folder)],
          stateDir,
          pollMillis: 100,
          onBody: (route, direction, _status, body) => {
            if (route === "load_weights" && direction === "request") loads.push(body as never)
          }
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
        // The engine's state of the newest checkpoint the killed run left (the resumed run prunes it later).
        const names = readdirSync(join(dir, "killed", "checkpoints")).filter((n) => n.startsWith("step-"))
        const newest = names.sort().at(-1)!
        const checkpoint = stateOf(dir, "killed", stateDir, Number(newest.slice(5)))
        const resumed = yield* agentfly(["train", file("killed"), "--resume"])
        assert.strictEqual(resumed.code, 0, resumed.output)
        assert.match(resumed.output, /resuming .*killed from step-00000[24]/)
        assert.strictEqual(trainedOf(resumed.output), trainedOf(unbroken.output), resumed.output)

        // The resume made a model from the engine's state of the last checkpoint, optimiser included.
        assert.include(resumed.output, `from ${newest}`)
        assert.deepInclude(loads.at(-1), { path: checkpoint.path, optimizer: true })
        // The last checkpoint's state was saved by the resumed run's new model, and holds the unbroken run's weights.
        const last = stateOf(dir, "killed", stateDir, steps)
        const lastUnbroken = stateOf(dir, "unbroken", stateDir, steps)
        assert.notStrictEqual(last.path, checkpoint.path)
        assert.notStrictEqual(last.path, lastUnbroken.path)
        assert.strictEqual(last.weightsHash, lastUnbroken.weightsHash)
        // Every figure of every step (rewards, losses, gradient norms, held-out accuracy) but the timings and the
        // client's request counts; a step the killed run logged after its last checkpoint counts as the resume's.
        const figures = (output: string) => {
          const byStep = new Map<string, Array<[string, number]>>()
          for (const m of metricsOf(join(dir, output)) as ReadonlyArray<{ phase: string; step: number } & Metrics>) {
            const timing = (k: string) => /^(perf|time|tinker)\//.test(k) || /_ms$|_per_s$/.test(k)
            byStep.set(`${m.phase} ${m.step}`, Object.entries(m.figures).filter(([k]) => !timing(k)))
          }
          return [...byStep]
        }
        assert.isAbove(figures("unbroken").filter(([k]) => k.startsWith("train")).length, 3)
        assert.deepStrictEqual(figures("killed"), figures("unbroken"))
      }).pipe(Effect.provide(NodeServices.layer))
    ), { timeout: 900_000 })
})
