/**
 * `agentfly train` with `learner.url`, as a user runs it: an `agentfly trainer` process runs the learner's steps. The
 * run ends with the same weights as the same run trained in-process; with the trainer SIGKILLed mid-run and started
 * again, the run stops naming the fix, and `--resume` ends on those same weights.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Generate from "../../examples/calculator/generate.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { agentfly, calculatorRun, metricsOf, startCommand } from "../utils/agentfly.ts"
import { freePort } from "../utils/redisServer.ts"

const startTrainer = (args: ReadonlyArray<string>) => startCommand("trainer", args)

const steps = 6

/** The calculator task on the tiny preset, checkpoints every 2 steps; `learner` as given. */
const configOf = (output: string, learner: object) =>
  calculatorRun({
    seed: 13,
    output,
    // A KL term: its frozen reference is a second trainer on the server, and goes into every checkpoint.
    algorithm: {
      steps,
      groupsPerStep: 4,
      microBatchSize: 8,
      lr: 0.001,
      advantage: "reinforce++",
      entropyCoef: 0.01,
      klCoef: 0.05
    },
    eval: { every: 3, size: 8 },
    checkpoint: { every: 2 },
    learner: { workers: 2, ...learner }
  })

/** The weights' fingerprint in a run's last checkpoint. */
const finalWeights = (dir: string, output: string): string =>
  JSON.parse(
    readFileSync(
      join(dir, output, "checkpoints", `step-${String(steps).padStart(6, "0")}`, "trainer_state.json"),
      "utf8"
    )
  ).weightsHash

describe("agentfly train with a trainer server (learner.url)", () => {
  it.live(
    "trains to the weights an in-process run reaches; after a trainer's death, --resume reaches them too",
    () =>
      Effect.scoped(
        Effect.gen(function*() {
          const dir = mkdtempSync(join(tmpdir(), "train-trainer-"))
          yield* Generate.write({
            dir: join(dir, "data"),
            seed: 5,
            train: 64,
            heldOut: 8,
            validation: 4,
            demos: 64,
            noise: 0
          })
          yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
          const train = (name: string, learner: object, extra: ReadonlyArray<string> = []) => {
            const file = join(dir, `${name}.json`)
            writeFileSync(file, JSON.stringify(configOf(name, learner)))
            return agentfly(["train", file, ...extra])
          }

          const here = yield* train("local", {})
          assert.strictEqual(here.code, 0, here.output)
          const expected = finalWeights(dir, "local")

          const port = yield* freePort
          const first = yield* startTrainer(["--port", String(port)])
          const url = first.url
          const there = yield* train("remote", { url })
          assert.strictEqual(there.code, 0, there.output)
          assert.include(there.output, `trained ${steps} of ${steps} steps`)
          assert.strictEqual(finalWeights(dir, "remote"), expected)
          // The steps ran there: the warm-up's trainer, then the RL one.
          assert.match(
            first.output(),
            /trainer policy-\w+: 0\.\d+ M parameters, 2 worker\(s\), cpu[\s\S]*trainer policy-\w+:/
          )
          assert.match(first.output(), /trainer reference-\w+:/)
          assert.deepStrictEqual(
            metricsOf(join(dir, "remote")).filter((m) => m.phase === "train").map((m) => m.figures["learner/loss"]),
            metricsOf(join(dir, "local")).filter((m) => m.phase === "train").map((m) => m.figures["learner/loss"])
          )
          // Every step's record says what went over the wire: the step's calls, the weights (≈ 2.7 MB) back once.
          for (const m of metricsOf(join(dir, "remote")).filter((m) => m.phase === "train")) {
            assert.isAbove(m.figures["trainer/calls"]!, 2)
            assert.isAbove(m.figures["trainer/received_mb"]!, 2.5)
            assert.strictEqual(m.figures["trainer/retries"], 0)
          }
          // The KL term was computed (against the reference there), not zero.
          assert.isAbove(
            Math.max(
              ...metricsOf(join(dir, "remote")).filter((m) => m.phase === "train").map((m) => m.figures["learner/kl"]!)
            ),
            0
          )

          // Async mode (rollouts a version ahead of the learner) repeats in-process to the bit as well.
          const asyncMode = { mode: "async", maxStaleness: 1 }
          const asyncFile = (name: string, learner: object) => {
            const file = join(dir, `${name}.json`)
            writeFileSync(file, JSON.stringify({ ...configOf(name, learner), ...asyncMode }))
            return file
          }
          const asyncHere = yield* agentfly(["train", asyncFile("async-local", {})])
          assert.strictEqual(asyncHere.code, 0, asyncHere.output)
          const asyncThere = yield* agentfly(["train", asyncFile("async-remote", { url })])
          assert.strictEqual(asyncThere.code, 0, asyncThere.output)
          assert.strictEqual(finalWeights(dir, "async-remote"), finalWeights(dir, "async-local"))
          assert.notStrictEqual(finalWeights(dir, "async-local"), expected)

          // The trainer dies after the run's third step and comes back empty on the same port.
          const metrics = join(dir, "killed", "metrics.jsonl")
          const trained = () =>
            existsSync(metrics)
              ? readFileSync(metrics, "utf8").split("\n").filter((l) => l.includes("\"phase\":\"train\"")).length
              : 0
          const fiber = yield* Effect.forkChild(train("killed", { url }))
          while (trained() < 3) yield* Effect.sleep(20)
          first.child.kill("SIGKILL")
          yield* startTrainer(["--port", String(port)])
          const killed = yield* Fiber.join(fiber)
          assert.notStrictEqual(killed.code, 0, killed.output)
          assert.include(killed.output, "no longer holds this run's trainer")
          assert.include(killed.output, "sending it again")
          assert.include(killed.output, "resume the run from its last checkpoint")
          const resumed = yield* train("killed", { url }, ["--resume"])
          assert.strictEqual(resumed.code, 0, resumed.output)
          assert.strictEqual(finalWeights(dir, "killed"), expected)
        }).pipe(Effect.provide(NodeServices.layer))
      ),
    { timeout: 300_000 }
  )

  it.live(
    "PPO with a critic (gae) through a trainer server: the policy and the critic end as in-process",
    () =>
      Effect.scoped(
        Effect.gen(function*() {
          const dir = mkdtempSync(join(tmpdir(), "train-trainer-gae-"))
          yield* Generate.write({
            dir: join(dir, "data"),
            seed: 5,
            train: 64,
            heldOut: 8,
            validation: 4,
            demos: 64,
            noise: 0
          })
          yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
          const train = (name: string, learner: object) => {
            const file = join(dir, `${name}.json`)
            const config = configOf(name, learner) as unknown as { readonly algorithm: object; readonly agent: object }
            // A warm-up long enough and turns long enough for tool calls, scored in part for their format: rewards that
            // differ from 0, for the critic to learn.
            writeFileSync(
              file,
              JSON.stringify({
                ...config,
                task: { name: "calculator", options: { toolCallFormat: 0.5 } },
                agent: { ...config.agent, maxNewTokens: 96 },
                warmup: { data: "data/demos.jsonl", steps: 40, batchSize: 8, lr: 0.003 },
                algorithm: { ...config.algorithm, advantage: "gae", lambda: 0.95, klCoef: 0 },
                critic: { lr: 0.003 }
              })
            )
            return agentfly(["train", file])
          }
          const here = yield* train("local", {})
          assert.strictEqual(here.code, 0, here.output)
          const server = yield* startTrainer(["--port", String(yield* freePort)])
          const there = yield* train("remote", { url: server.url })
          assert.strictEqual(there.code, 0, there.output)
          assert.match(server.output(), /trainer critic-\w+:/)
          assert.strictEqual(finalWeights(dir, "remote"), finalWeights(dir, "local"))
          const critic = (output: string) =>
            readFileSync(
              join(dir, output, "checkpoints", `step-${String(steps).padStart(6, "0")}`, "critic", "model.safetensors")
            )
          assert.isTrue(critic("remote").equals(critic("local")), "the same critic, saved into the run's folder")
          const values = (output: string) =>
            metricsOf(join(dir, output)).filter((m) => m.phase === "train").map((m) => m.figures["critic/value_mean"])
          assert.deepStrictEqual(values("remote"), values("local"))
          assert.isAbove(Math.max(...values("local").map((v) => Math.abs(v ?? 0))), 0, "the critic learned")
        }).pipe(Effect.provide(NodeServices.layer))
      ),
    { timeout: 300_000 }
  )
})
