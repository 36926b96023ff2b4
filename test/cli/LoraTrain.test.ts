/**
 * A LoRA run end to end (`model.lora`): SFT warm-up, GRPO-family RL with a KL term (its reference the policy RL
 * starts from), checkpoints that are PEFT adapter folders, and `kill -9` mid-run followed by `--resume` ending with
 * the unbroken run's weights; an unknown target is refused before any work, naming the modules the model has.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, beforeAll, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import * as PolicyEngine from "../../actors/PolicyEngine.ts"
import * as Export from "../../cli/export.ts"
import * as Train from "../../cli/train.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Lora from "../../src/Lora.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Safetensors from "../../src/Safetensors.ts"
import { agentfly, calculatorRun } from "../utils/agentfly.ts"

const quiet = (lines: Array<string>) => ({ write: (t: string) => void lines.push(t), tty: false })

const lora = {
  rank: 4,
  alpha: 8,
  targets: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
}
const data = { seed: 4, train: 16, heldOut: 4, validation: 2, demos: 64, noise: 0 }

/**
 * A base worth adapting: the tiny preset after a full fine-tuning warm-up. A random base's frozen head and final
 * norm cap its logits near uniform (|logit| ≲ 1.3 at its 0.02-wide embeddings), so LoRA cannot warm it up alone.
 */
let warmBase = ""
beforeAll(() =>
  Effect.runPromise(Effect.gen(function*() {
    const dir = mkdtempSync(join(tmpdir(), "lora-base-"))
    yield* Generate.write({ dir: join(dir, "data"), ...data })
    const config = join(dir, "config.json")
    writeFileSync(config, JSON.stringify(calculatorRun({
      seed: 5,
      output: "run",
      task: { name: "calculator", options: { toolCallFormat: 0.2 } },
      warmup: { data: "data/demos.jsonl", steps: 80, batchSize: 8, lr: 0.004 },
      algorithm: { steps: 1, groupsPerStep: 2, lr: 0.0003 },
      checkpoint: { every: 1 }
    }, { maxNewTokens: 64 })))
    // Only the warm-up's checkpoint matters (its one RL step may find no signal and say so).
    yield* Effect.ignore(Train.run({ config, ...quiet([]) }))
    warmBase = join(dir, "run", "checkpoints", "step-000000")
  }).pipe(Effect.scoped, Effect.provide(NodeServices.layer))), 600_000)

const setup = (mode: "sync" | "async", extra: Record<string, unknown> = {}, dropout = 0) =>
  Effect.gen(function*() {
    const dir = mkdtempSync(join(tmpdir(), "lora-run-"))
    yield* Generate.write({ dir: join(dir, "data"), ...data })
    const config = join(dir, "config.json")
    const run = calculatorRun({
      seed: 5,
      output: "run",
      model: { path: "model", preset: "tiny", initSeed: 3, from: warmBase, lora: { ...lora, dropout } },
      task: { name: "calculator", options: { toolCallFormat: 0.2 } },
      // A short LoRA warm-up on the warmed base, then GRPO with a KL term against the policy RL starts from.
      warmup: { data: "data/demos.jsonl", steps: 3, batchSize: 8, lr: 0.003 },
      algorithm: { steps: 3, groupsPerStep: 4, lr: 0.003, klCoef: 0.05, advantage: "grpo" },
      mode,
      ...(mode === "async" ? { maxStaleness: 1 } : {}),
      eval: { every: 3, size: 2 },
      checkpoint: { every: 1, keep: 5 },
      ...extra
    }, { maxNewTokens: 64 })
    writeFileSync(config, JSON.stringify(run))
    return { dir, config }
  })


describe("agentfly train with model.lora", () => {
  it.live("trains the adapter alone, checkpoints it in PEFT's layout, and resumes exactly after kill -9", () =>
    Effect.gen(function*() {
      const { dir, config } = yield* setup("sync")
      const lines: Array<string> = []
      const reference = yield* Train.run({ config, output: join(dir, "a"), ...quiet(lines) })
      assert.strictEqual(reference.summary.steps, 3)

      const ckpt = join(dir, "a", "checkpoints", "step-000003")
      const adapterConfig = JSON.parse(readFileSync(join(ckpt, "adapter_config.json"), "utf8"))
      assert.strictEqual(adapterConfig.peft_type, "LORA")
      assert.strictEqual(adapterConfig.r, 4)
      assert.strictEqual(adapterConfig.lora_alpha, 8)
      assert.deepStrictEqual(adapterConfig.target_modules, lora.targets)
      // The base is what the run started from (`model.from`, a full fine-tuning warm-up's checkpoint).
      assert.strictEqual(adapterConfig.base_model_name_or_path, warmBase)
      const warmup = readFileSync(join(dir, "a", "metrics.jsonl"), "utf8").split("\n")
        .filter((l) => l.includes("warmup/loss"))
      assert.strictEqual(warmup.length, 3) // the SFT warm-up trained the adapter
      const header = yield* Safetensors.readHeader(join(ckpt, "adapter_model.safetensors"))
      assert.isAbove(header.tensors.size, 0)
      for (const name of header.tensors.keys()) {
        assert.match(name, /^base_model\.model\.model\.layers\.\d+\..*lora_[AB]\.weight$/)
      }
      // The learner's own tensors are the adapter's: no base weight is saved, and AdamW's moments are the adapter's.
      const model = yield* Safetensors.readHeader(join(ckpt, "model.safetensors"))
      assert.deepStrictEqual([...model.tensors.keys()].sort(), [...header.tensors.keys()].sort())
      const optimizer = yield* Safetensors.readHeader(join(ckpt, "optimizer.safetensors"))
      assert.strictEqual(optimizer.tensors.size, 2 * header.tensors.size)

      // `agentfly export` merges the adapter into that base: W + (alpha/r)·B·A.
      const out = join(dir, "merged")
      yield* Export.exportModel({ modelDir: ckpt, format: "hf", dtype: "f32", out })
      const exported = yield* ModelFolder.load(out)
      const folder = yield* ModelFolder.load(join(dir, "model"))
      const base = (yield* Checkpoint.load(warmBase, Qwen2.parameters(folder.config))).weights
      const read = yield* Lora.load(ckpt, folder.config)
      const expected = Lora.merge(folder.config, read.config, base, read.adapter)
      const q = "model.layers.0.self_attn.q_proj.weight"
      assert.deepStrictEqual(exported.weights.get(q), expected.get(q))
      assert.notDeepEqual(exported.weights.get(q), base.get(q))
      assert.deepStrictEqual(exported.weights.get("model.norm.weight"), base.get("model.norm.weight"))

      // kill -9 once the journal records step 2's checkpoint (a resume starts from the journal's newest; its files
      // alone, written just before the record, are not enough), then resume: the same weights as the unbroken run.
      const journal = join(dir, "run", "journal.jsonl")
      const killed = yield* agentfly(
        ["train", config],
        () => existsSync(journal) && /"kind":"checkpoint","step":2\b/.test(readFileSync(journal, "utf8")),
        "SIGKILL"
      )
      assert.strictEqual(killed.signal, "SIGKILL", killed.output)
      const resumed = yield* Train.run({ config, output: join(dir, "run"), resume: true, ...quiet(lines) })
      assert.isAtLeast(resumed.summary.fromStep, 2)
      assert.strictEqual(resumed.summary.fingerprint, reference.summary.fingerprint)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 600_000)

  it.live("runs async with the adapter published to the engine at every version, with dropout", () =>
    Effect.gen(function*() {
      // Dropout on the adapters' inputs, shared prompts included (their rows get masks of their own).
      const { dir, config } = yield* setup("async", { checkpoint: { every: 3 } }, 0.05)
      const result = yield* Train.run({ config, output: join(dir, "run"), ...quiet([]) })
      assert.strictEqual(result.summary.steps, 3)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 600_000)

  it.live("publishes each version to an inference server as an adapter (load_lora_adapter), never the weights", () =>
    Effect.gen(function*() {
      const { dir, config } = yield* setup("sync", { checkpoint: { every: 3 } })
      // `agentfly serve --accept-weights` on the run's base (the warm-up's checkpoint), in this process.
      yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
      const folder = yield* ModelFolder.load(join(dir, "model"))
      const base = (yield* Checkpoint.load(warmBase, Qwen2.parameters(folder.config))).weights as Qwen2.Weights
      const engine = yield* PolicyEngine.make({ config: folder.config, weights: base })
      const server = yield* OpenAiServer.make(folder, { acceptWeights: {}, loraBase: base }).pipe(
        Effect.provideService(PolicyEngine.PolicyEngine, engine)
      )
      const run = JSON.parse(readFileSync(config, "utf8"))
      writeFileSync(config, JSON.stringify({ ...run, engine: { servers: [server.baseUrl] } }))
      const result = yield* Train.run({ config, output: join(dir, "run"), ...quiet([]) })
      assert.strictEqual(result.summary.steps, 3)
      const models = yield* Effect.promise(() => fetch(`${server.baseUrl}/models`).then((r) => r.json()))
      const byId = new Map(models.data.map((m: { id: string }) => [m.id, m]))
      // The base's weights were never replaced (no PUT /v1/weights); the adapter holds the last version.
      assert.strictEqual((byId.get(folder.name) as { policy_version: number }).policy_version, 0)
      // Each version under a name with its version and digest; the one before the newest stays, older ones went.
      const adapterIds = [...byId.keys()].filter((id) => id !== folder.name) as Array<string>
      const shapes = adapterIds.map((id) => id.replace(/[0-9a-f]{16}$/, "D")).sort()
      assert.deepStrictEqual(shapes, ["policy-v2-D", "policy-v3-D"])
      const newest = byId.get(adapterIds.find((id) => id.startsWith("policy-v3-"))!) as { policy_version: number }
      assert.strictEqual(newest.policy_version, 3)
      const adapters = readdirSync(join(dir, "run", "adapters")).sort()
      assert.includeMembers(adapters, ["policy-v1", "policy-v2", "policy-v3"])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 600_000)

  it.live("runs PPO with a critic (the critic trains fully) and GRPO with dynamic sampling", () =>
    Effect.gen(function*() {
      const ppo = yield* setup("sync", {
        algorithm: { steps: 2, groupsPerStep: 4, lr: 0.003, advantage: "gae", lambda: 0.95, klCoef: 0 },
        checkpoint: { every: 2 }
      })
      const critic = yield* Train.run({ config: ppo.config, output: join(ppo.dir, "run"), ...quiet([]) })
      assert.strictEqual(critic.summary.steps, 2)
      const dapo = yield* setup("sync", {
        algorithm: { steps: 2, groupsPerStep: 4, lr: 0.003, advantage: "grpo", dynamicSampling: { maxBatches: 2 } },
        checkpoint: { every: 2 }
      })
      const dynamic = yield* Train.run({ config: dapo.config, output: join(dapo.dir, "run"), ...quiet([]) })
      assert.strictEqual(dynamic.summary.steps, 2)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 600_000)

  it.live("refuses a target the model does not have, naming the ones it has", () =>
    Effect.gen(function*() {
      const { dir, config } = yield* setup("sync")
      const bad = JSON.parse(readFileSync(config, "utf8"))
      bad.model.lora = { ...lora, targets: ["q_proj", "c_attn"] }
      writeFileSync(config, JSON.stringify(bad))
      const error = yield* Effect.flip(Train.run({ config, output: join(dir, "run"), ...quiet([]) }))
      assert.include((error as Error).message, "\"c_attn\" is not a module of this model; it has q_proj, k_proj")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 120_000)
})
