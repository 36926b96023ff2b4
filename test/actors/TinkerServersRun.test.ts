/**
 * A Tinker LoRA run (`learner.backend: "tinker"`, `learner.tinker.loraRank`) that samples on the user's own server
 * (`engine.servers`): our Tinker server trains, `agentfly serve --accept-weights` (in-process, vLLM's
 * `load_lora_adapter`) samples. After each `save_weights_for_sampler` the run fetches the checkpoint's archive,
 * loads the adapter on the server under its versioned name, and every rollout is sampled there (none through
 * `asample`), each answer's digest checked against the published adapter's.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readdirSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as Models from "../../actors/tinker/Models.ts"
import * as TinkerServer from "../../actors/tinker/TinkerServer.ts"
import * as Train from "../../actors/Train.ts"
import { task } from "../../environments/calculator/CalculatorTask.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import { parseAdapterName } from "../../src/backends/OpenAiCompatSampler.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Lora from "../../src/Lora.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { calculatorRun, metricsOf } from "../utils/agentfly.ts"

describe("learner.backend tinker with engine.servers", () => {
  it.live("a LoRA run samples on the user's server: each version's adapter loaded there, by version and digest", () =>
    Effect.scoped(
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "tinker-servers-"))
        const data = { dir: join(dir, "data"), seed: 5, train: 64, heldOut: 8, validation: 4, demos: 64, noise: 0 }
        yield* Generate.write(data)
        yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
        const folder = yield* ModelFolder.load(join(dir, "model"))
        const bodies: Record<string, number> = {}
        const stateDir = join(dir, "tinker-state")
        const tinker = yield* TinkerServer.serve({
          bases: [Models.baseOf("calculator-tiny", folder)],
          stateDir,
          pollMillis: 100,
          onBody: (route, direction) => {
            if (direction === "request") bodies[route] = (bodies[route] ?? 0) + 1
          }
        })
        // The user's server: `agentfly serve --accept-weights` on the same base.
        const engine = yield* makeEngine({ config: folder.config, weights: folder.weights })
        const serve = yield* OpenAiServer.make(folder, { acceptWeights: {}, loraBase: folder.weights }).pipe(
          Effect.provideService(PolicyEngine, engine)
        )
        const calculator = yield* task({ toolCallFormat: 0.2 })
        const learner = {
          workers: 1,
          sharePrefix: false,
          backend: "tinker",
          tinker: { baseUrl: tinker.baseUrl, baseModel: "calculator-tiny", loraRank: 4 }
        }
        const config = calculatorRun({
          seed: 13,
          output: "run",
          task: { name: "calculator", options: { toolCallFormat: 0.2 } },
          // A warm-up long enough that groups' rewards differ (as `TinkerRun.test.ts`).
          warmup: { data: "data/demos.jsonl", steps: 120, batchSize: 8, lr: 0.004 },
          algorithm: { steps: 3, groupsPerStep: 4, microBatchSize: 8, lr: 0.001 },
          engine: { servers: [serve.baseUrl] },
          learner
        }, { maxNewTokens: 64 })
        const run = yield* Train.run({ task: calculator, dir, config: config as never, write: () => {}, tty: false })
        const metrics = metricsOf(join(dir, "run"))
        assert.strictEqual(metrics.filter((m) => m.phase === "train").length, 3)
        assert.isAtLeast(run.summary.trained, 1)
        // Every rollout was sampled on the user's server: none through the engine's asample.
        assert.strictEqual(bodies["asample"], undefined)
        assert.strictEqual(bodies["save_weights_for_sampler"], 1 + run.summary.trained)
        for (const m of metrics.filter((m) => m.phase === "train")) {
          assert.isAbove(m.figures["servers/requests"]!, 0)
          assert.strictEqual(m.figures["servers/failures"], 0)
        }
        // The server holds the newest version's adapter under its versioned name; its digest is that of the adapter
        // the engine saved for the sampler (read from the Tinker server's own files, not through the archive).
        const listed = yield* Effect.promise(() =>
          fetch(`${serve.baseUrl}/models`).then((r) => r.json() as Promise<{ data: Array<{ id: string }> }>)
        )
        const names = listed.data.map((m) => parseAdapterName(m.id)).filter((n) => n !== undefined)
        const newest = names.reduce((a, b) => (b!.version > a!.version ? b : a))!
        // Each step publishes a version; unchanged weights (a step with no signal) are the same adapter again.
        assert.strictEqual(newest.version, 3)
        // The sampler weights the engine saved last (`vN`, over the warm-up's model and RL's).
        const checkpoints = join(stateDir, "checkpoints")
        const saves = readdirSync(checkpoints).flatMap((model) =>
          existsSync(join(checkpoints, model, "sampler_weights"))
            ? readdirSync(join(checkpoints, model, "sampler_weights")).map((name) => ({ model, name }))
            : []
        ).sort((a, b) => Number(a.name.slice(1)) - Number(b.name.slice(1)))
        assert.strictEqual(saves.length, 1 + run.summary.trained)
        const last = saves.at(-1)!
        const saved = yield* Lora.load(Models.adapterDir(checkpoints, last.model, last.name), folder.config)
        assert.strictEqual(newest.digest, Checkpoint.fingerprint(saved.adapter))
        // The adapter was trained (B moved from 0), and the servers got the engine's settings (alpha 32 of our
        // engine, read from the archive's adapter_config.json) with its tensors.
        assert.strictEqual(saved.config.rank, 4)
        const pushed = yield* Lora.load(join(dir, "run", "adapters", "policy-v3"), folder.config)
        assert.deepStrictEqual(pushed.config, saved.config)
        assert.strictEqual(Checkpoint.fingerprint(pushed.adapter), newest.digest)
        assert.isTrue([...saved.adapter].some(([n, d]) => n.endsWith("lora_B.weight") && d.some((x) => x !== 0)))
      }).pipe(Effect.provide(NodeServices.layer))
    ), { timeout: 600_000 })
})
