/**
 * A whole run through the Tinker API (`learner.backend: "tinker"`) against our own Tinker server on loopback
 * (`actors/tinker/TinkerServer.ts`), beside the same run trained in-process: the calculator task on the tiny preset,
 * a short warm-up, a few RL steps, held-out evaluations and checkpoints. The learner's steps cross as datums to
 * `forward_backward` / `optim_step`, the warm-up hands its state to RL through `save_weights` / `load_weights`, and
 * every rollout samples through `asample` on the published `save_weights_for_sampler` version.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readdirSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Models from "../../actors/tinker/Models.ts"
import * as TinkerServer from "../../actors/tinker/TinkerServer.ts"
import * as Train from "../../actors/Train.ts"
import { task } from "../../environments/calculator/CalculatorTask.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { calculatorRun, metricsOf } from "../utils/agentfly.ts"

const steps = 4

/** The calculator run on the tiny preset; shared prompts off (a Tinker datum is one whole row) on both sides. */
const configOf = (output: string, learner: object) =>
  calculatorRun({
    seed: 13,
    output,
    // Partial credit for a well-formed tool call: groups whose rewards differ after a short warm-up.
    task: { name: "calculator", options: { toolCallFormat: 0.2 } },
    // A warm-up long enough that some chains call the tool well and groups' rewards differ.
    warmup: { data: "data/demos.jsonl", steps: 40, batchSize: 8, lr: 0.003 },
    algorithm: { steps, groupsPerStep: 4, microBatchSize: 8, lr: 0.001 },
    eval: { every: 2, size: 8 },
    checkpoint: { every: 2 },
    learner: { workers: 1, sharePrefix: false, ...learner }
  }, { maxNewTokens: 64 })

const figures = (dir: string, output: string, phase: string, key: string) =>
  metricsOf(join(dir, output)).filter((m) => m.phase === phase).map((m) => m.figures[key])

describe("learner.backend tinker", () => {
  it.live("the calculator run through the Tinker API repeats the in-process run to the bit: figures and weights", () =>
    Effect.scoped(
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "tinker-run-"))
        const data = { dir: join(dir, "data"), seed: 5, train: 64, heldOut: 8, validation: 4, demos: 64, noise: 0 }
        yield* Generate.write(data)
        yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
        const calculator = yield* task({ toolCallFormat: 0.2 })
        const run = (output: string, learner: object) =>
          Train.run({ task: calculator, dir, config: configOf(output, learner) as never, write: () => {}, tty: false })

        const here = yield* run("local", {})
        assert.isAtLeast(here.summary.trained, 1)

        const folder = yield* ModelFolder.load(join(dir, "model"))
        const bodies: Record<string, number> = {}
        const stateDir = join(dir, "tinker-state")
        const server = yield* TinkerServer.serve({
          bases: [Models.baseOf("calculator-tiny", folder)],
          stateDir,
          pollMillis: 100,
          onBody: (route, direction) => {
            if (direction === "request") bodies[route] = (bodies[route] ?? 0) + 1
          }
        })
        const tinker = { backend: "tinker", tinker: { baseUrl: server.baseUrl, baseModel: "calculator-tiny" } }
        const there = yield* run("tinker", tinker)
        assert.isAtLeast(there.summary.trained, 1)

        // Every figure of every phase is the in-process run's to the bit (warm-up, rollouts, learner, evaluations),
        // but entropy, which Tinker's losses do not report, and the timings.
        const local = metricsOf(join(dir, "local"))
        const remote = metricsOf(join(dir, "tinker"))
        assert.deepStrictEqual(remote.map((m) => m.phase), local.map((m) => m.phase))
        assert.isAbove(local.filter((m) => m.phase === "warmup").length, 0)
        const comparable = (figures: Record<string, number>) =>
          Object.entries(figures).filter(([k]) =>
            !/^(perf|time|tinker)\//.test(k) && k !== "learner/entropy" && k !== "learner/step_ms" &&
            k !== "learner/tokens_per_s"
          )
        remote.forEach((m, i) => assert.deepStrictEqual(comparable(m.figures), comparable(local[i]!.figures)))
        assert.isAbove(figures(dir, "local", "train", "learner/applied").filter((a) => a === 1).length, 0)
        // The weights too: the engine's state of the last checkpoint has the in-process checkpoint's fingerprint.
        const last = `step-${String(steps).padStart(6, "0")}`
        const named = JSON.parse(readFileSync(join(dir, "tinker", "checkpoints", last, "tinker.json"), "utf8"))
        const [, model, , name] = /^tinker:\/\/([^/]+)\/(weights)\/(.+)$/.exec(named.statePath)!
        const state = (path: string) => JSON.parse(readFileSync(join(path, "trainer_state.json"), "utf8")).weightsHash
        assert.strictEqual(
          state(join(stateDir, "checkpoints", model!, name!)),
          state(join(dir, "local", "checkpoints", last))
        )
        // Every RL step went through the API: its forward_backward and optim_step, its rollouts through asample.
        assert.isAtLeast(bodies["optim_step"]!, 40 + there.summary.trained)
        assert.isAtLeast(bodies["asample"]!, steps * 4 * 4)
        // A version is saved for the sampler when the weights changed: after the warm-up, then after each applied step.
        assert.strictEqual(bodies["save_weights_for_sampler"], 1 + there.summary.trained)
        for (const m of remote.filter((m) => m.phase === "train")) {
          assert.isAbove(m.figures["tinker/requests"]!, 2)
          assert.strictEqual(m.figures["tinker/retries"], 0)
        }
        // Checkpoints name the engine's state and hold no weights here.
        for (const c of readdirSync(join(dir, "tinker", "checkpoints")).filter((n) => n.startsWith("step-"))) {
          const file = JSON.parse(readFileSync(join(dir, "tinker", "checkpoints", c, "tinker.json"), "utf8"))
          assert.match(file.statePath, /^tinker:\/\//)
          assert.isFalse(existsSync(join(dir, "tinker", "checkpoints", c, "model.safetensors")))
        }
      }).pipe(Effect.provide(NodeServices.layer))
    ), { timeout: 600_000 })
})
