/**
 * The CLI refuses NaN weights with one line and a non-zero exit, before it listens: `agentfly serve` and `agentfly
 * gateway` on a model folder whose weights hold a NaN, and `agentfly gateway --checkpoint` on a checkpoint that holds
 * one (it printed a stack trace).
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import { spawnSync } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Optimizer from "../../src/Optimizer.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Safetensors from "../../src/Safetensors.ts"
import { cli } from "../utils/agentfly.ts"

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../..")

const tensor = "model.layers.0.mlp.down_proj.weight"

/** `agentfly ARGS…` to its end (it must not start listening). */
const agentfly = (args: ReadonlyArray<string>) => {
  const run = spawnSync(process.execPath, [cli, ...args, "--port", "0"], {
    cwd: repoRoot,
    encoding: "utf8",
    timeout: 300_000
  })
  // npm's own warnings about the environment are not the command's output.
  const lines = (run.stdout + run.stderr).split("\n").filter((l) => l.trim() !== "" && !l.startsWith("npm warn"))
  return { status: run.status, lines }
}

/** A tiny folder with finite weights, one with a NaN in `tensor`, and a checkpoint of the first with a NaN. */
const fixtures = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const root = mkdtempSync(join(tmpdir(), "agentfly-nan-cli-"))
  const config = yield* ModelFolder.init(`${root}/good`, { preset: "tiny", seed: 1 })
  yield* ModelFolder.init(`${root}/nan`, { preset: "tiny", seed: 1 })
  const weights = Qwen2.initWeights(config, 1)
  const parameters = Qwen2.parameters(config)
  const named = parameters.map((p) => ({ name: p.name, shape: p.shape, data: weights.get(p.name)! }))
  yield* Checkpoint.save(`${root}/run/checkpoints/step-000001`, {
    weights: named,
    optimizer: Optimizer.makeState(weights),
    policyVersion: 1,
    rngState: [1, 2, 3, 4]
  })
  // NaN written after the save (which refuses it): a file damaged or forged afterwards.
  weights.get(tensor)![3] = NaN
  yield* ModelFolder.writeModel(`${root}/nan`, config, weights)
  yield* fs.writeFile(`${root}/run/checkpoints/step-000001/model.safetensors`, Safetensors.serialize(named))
  return root
}).pipe(Effect.provide(NodeServices.layer))

describe("agentfly serve / gateway on NaN weights", () => {
  it.effect("a NaN model folder or checkpoint: one line naming the tensor, a non-zero exit, no stack trace", () =>
    Effect.gen(function*() {
      const root = yield* fixtures
      const checkpoint = `${root}/run/checkpoints/step-000001`
      const runs = {
        serve: agentfly(["serve", "--model-dir", `${root}/nan`]),
        gateway: agentfly(["gateway", "--model-dir", `${root}/nan`, "--output", `${root}/episodes.jsonl`]),
        gatewayCheckpoint: agentfly([
          "gateway",
          "--model-dir",
          `${root}/good`,
          "--checkpoint",
          checkpoint,
          "--output",
          `${root}/episodes.jsonl`
        ])
      }
      for (const [name, run] of Object.entries(runs)) {
        assert.strictEqual(run.status, 1, `${name}: ${run.lines.join("\n")}`)
        assert.lengthOf(run.lines, 1, `${name}: ${run.lines.join("\n")}`)
        assert.notMatch(run.lines[0]!, /^\s+at |Error:|listening|serving|gateway for/, name)
      }
      assert.strictEqual(
        runs.serve.lines[0],
        `${root}/nan/model.safetensors: tensor "${tensor}" holds 1 non-finite value (the first: ${tensor}[3] = ` +
          "NaN); weights with NaN or ±Infinity cannot sample or train"
      )
      assert.strictEqual(runs.gateway.lines[0], runs.serve.lines[0])
      assert.strictEqual(runs.gatewayCheckpoint.lines[0], `${checkpoint}: ${tensor}[3] = NaN is not finite`)
    }), { timeout: 300_000 })
})
