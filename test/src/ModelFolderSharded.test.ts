/**
 * Model folders as Hugging Face publishes them: weights in BF16, sharded behind `model.safetensors.index.json`,
 * read by streaming; a missing shard or an unreadable file is an error naming the file and the real cause. The
 * folder `scripts/make-real-folder.ts` writes (published config, real tokenizer, BF16 shards) loads as is.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import { spawnSync } from "node:child_process"
import { mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { dirname, join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import * as FloatCodec from "../../src/internal/floatCodec.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../..")

/** What a value becomes once stored as BF16 and read back. */
const throughBf16 = (x: Float32Array): Float32Array => {
  const bits = new Uint16Array(x.length), out = new Float32Array(x.length)
  FloatCodec.narrowBf16(x, bits)
  FloatCodec.widenBf16(bits, out)
  return out
}

const tempFolder = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  return `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-sharded-" })}/model`
})

describe("ModelFolder: sharded BF16 weights", () => {
  it.effect("a folder written as BF16 shards loads back, each value as BF16 rounds it; stale files are gone", () =>
    Effect.gen(function*() {
      const dir = yield* tempFolder
      const config = yield* ModelFolder.init(dir, { preset: "tiny", seed: 5 })
      const weights = Qwen2.initWeights(config, 5)
      yield* ModelFolder.writeModel(dir, config, weights, { dtype: "BF16", maxShardBytes: 100_000 })
      const files = readdirSync(dir).filter((f) => f.includes("safetensors"))
      assert.include(files, "model.safetensors.index.json")
      assert.notInclude(files, "model.safetensors")
      assert.isAbove(files.length, 3)
      const folder = yield* ModelFolder.load(dir)
      for (const [name, data] of weights) assert.deepStrictEqual(folder.weights.get(name), throughBf16(data), name)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.effect("a missing shard is NotFound naming it; a directory where a file should be is Io saying so", () =>
    Effect.gen(function*() {
      const dir = yield* tempFolder
      const config = yield* ModelFolder.init(dir, { preset: "tiny", seed: 5 })
      yield* ModelFolder.writeModel(dir, config, Qwen2.initWeights(config, 5), { maxShardBytes: 200_000 })
      const shards = readdirSync(dir).filter((f) => /^model-\d{5}-of-\d{5}\.safetensors$/.test(f)).sort()
      const last = join(dir, shards.at(-1)!)
      rmSync(last)
      const missing = yield* Effect.flip(ModelFolder.load(dir))
      assert.strictEqual(missing.reason._tag, "NotFound")
      assert.strictEqual(missing.file, last)
      assert.include(missing.message, `lists shard ${shards.at(-1)}, which is missing`)

      rmSync(join(dir, "model.safetensors.index.json"))
      for (const f of shards.slice(0, -1)) rmSync(join(dir, f))
      mkdirSync(join(dir, "model.safetensors"))
      const directory = yield* Effect.flip(ModelFolder.load(dir))
      assert.strictEqual(directory.reason._tag, "Io")
      assert.strictEqual(directory.message, `cannot read ${join(dir, "model.safetensors")}: it is a directory`)
      // config.json likewise: a directory there is Io, not NotFound.
      rmSync(join(dir, "config.json"))
      mkdirSync(join(dir, "config.json"))
      const unreadable = yield* Effect.flip(ModelFolder.load(dir))
      assert.deepStrictEqual([unreadable.reason._tag, unreadable.file], ["Io", join(dir, "config.json")])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.effect("scripts/make-real-folder.ts writes a Qwen2.5-0.5B-shaped folder (cut to 1 layer) that loads as is", () =>
    Effect.gen(function*() {
      const dir = yield* tempFolder
      const made = spawnSync(
        join(repoRoot, "node_modules/.bin/tsx"),
        [join(repoRoot, "scripts/make-real-folder.ts"), "qwen2.5-0.5b", dir, "--layers", "1", "--shard-mb", "150"],
        { encoding: "utf8" }
      )
      assert.strictEqual(made.status, 0, made.stderr)
      const summary = JSON.parse(made.stdout.trim().split("\n").at(-1)!)
      // Embeddings (151,936 × 896, tied head) plus one layer of Qwen2.5-0.5B and the final norm.
      assert.deepStrictEqual([summary.parameters, summary.files], [151936 * 896 + 14_912_384 + 896, 2])
      const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"))
      assert.deepStrictEqual([config.architectures, config.torch_dtype, config.num_hidden_layers], [
        ["Qwen2ForCausalLM"],
        "bfloat16",
        1
      ])
      const folder = yield* ModelFolder.load(dir)
      assert.strictEqual(folder.config.hiddenSize, 896)
      assert.isTrue(folder.config.tieWordEmbeddings)
      assert.isFalse(folder.weights.has("lm_head.weight"))
      assert.strictEqual(folder.weights.get("model.embed_tokens.weight")!.length, 151936 * 896)
      assert.sameMembers([...folder.stopTokenIds].filter((id) => id >= 151643), [151643, 151645])
      assert.strictEqual(folder.tokenizer.tokenToId("<|im_end|>"), 151645)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 120_000)
})
