/**
 * `agentfly train` with `engine.servers`, as a user runs it: two `agentfly serve --accept-weights` processes sample
 * the rollouts and follow the learner's weights; one is killed with SIGKILL mid-run and the run still trains every
 * step on the other, says so, and leaves the survivor at the last version.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as Generate from "../../examples/calculator/generate.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { agentfly, metricsOf } from "../utils/agentfly.ts"

const root = resolve(import.meta.dirname, "../..")

/** `agentfly serve ARGS…` in a child process, and its API root once it listens; the scope kills it. */
const serve = (args: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly child: ChildProcess; readonly url: string }, Error>((resume) => {
      const child = spawn(process.execPath, ["--import", "tsx", "cli/main.ts", "serve", ...args], {
        cwd: root,
        stdio: ["ignore", "pipe", "pipe"]
      })
      let text = ""
      child.stdout.on("data", (chunk: Buffer) => {
        text += chunk.toString()
        const url = /at (http:\/\/\S+\/v1)/.exec(text)?.[1]
        if (url !== undefined) resume(Effect.succeed({ child, url }))
      })
      child.stderr.on("data", (chunk: Buffer) => (text += chunk.toString()))
      child.on("exit", (code) => resume(Effect.fail(new Error(`serve exited with ${code}: ${text}`))))
      return Effect.sync(() => child.kill("SIGKILL"))
    }),
    ({ child }) => Effect.sync(() => child.kill("SIGKILL"))
  )

describe("agentfly train with inference servers", () => {
  it.live("two servers sample and follow the learner; one SIGKILLed mid-run, the run trains every step", () =>
    Effect.scoped(Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "train-servers-"))
      yield* Generate.write({ dir: join(dir, "data"), seed: 5, train: 64, heldOut: 8, validation: 4, demos: 64, noise: 0 })
      // The servers serve the same model folder the run trains (its tokenizer and shapes); its weights are replaced.
      yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
      const flags = ["--model-dir", join(dir, "model"), "--port", "0", "--accept-weights"]
      const a = yield* serve(flags)
      const b = yield* serve(flags)
      const steps = 8
      writeFileSync(join(dir, "config.json"), JSON.stringify({
        seed: 11,
        output: "run",
        model: { path: "model", preset: "tiny", initSeed: 3 },
        data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
        task: "calculator",
        agent: {
          systemPrompt: "Use the calculator tool.",
          renderTools: false,
          maxTurns: 2,
          numChains: 4,
          maxNewTokens: 24,
          maxContextTokens: 256
        },
        warmup: { data: "data/demos.jsonl", steps: 4, batchSize: 8, lr: 0.003 },
        // Every step moves the weights (an entropy bonus under a non-group-relative estimator), so that every push
        // is a new version.
        algorithm: {
          steps,
          groupsPerStep: 4,
          microBatchSize: 8,
          lr: 0.001,
          advantage: "reinforce++",
          entropyCoef: 0.01
        },
        eval: { every: 4, size: 8 },
        engine: { servers: [a.url, b.url] }
      }))
      // Server b dies once the run has logged its second step.
      const metrics = join(dir, "run", "metrics.jsonl")
      let killedAt: number | undefined
      const watch = setInterval(() => {
        if (killedAt !== undefined || !existsSync(metrics)) return
        const trained = readFileSync(metrics, "utf8").split("\n").filter((l) => l.includes('"phase":"train"')).length
        if (trained >= 2) {
          killedAt = trained
          b.child.kill("SIGKILL")
        }
      }, 20)
      const run = yield* agentfly(["train", join(dir, "config.json")]).pipe(
        Effect.ensuring(Effect.sync(() => clearInterval(watch)))
      )
      assert.strictEqual(run.code, 0, run.output)
      assert.isDefined(killedAt, "server b was never killed")
      assert.isBelow(killedAt!, steps)
      assert.include(run.output, `trained ${steps} of ${steps} steps`)
      assert.include(run.output, `inference server ${b.url} failed`)
      const trainSteps = metricsOf(join(dir, "run")).filter((m) => m.phase === "train")
      assert.strictEqual(trainSteps.length, steps)
      // The survivor holds the run's last version; every step's rollouts came from the servers.
      const models = yield* Effect.promise(() => fetch(`${a.url}/models`).then((r) => r.json()))
      assert.strictEqual((models as { data: Array<{ policy_version: number }> }).data[0]!.policy_version, steps)
      for (const m of trainSteps) assert.isAbove(m.figures["rollout/policy_tokens"]!, 0)
    }).pipe(Effect.provide(NodeServices.layer))), { timeout: 240_000 })
})
