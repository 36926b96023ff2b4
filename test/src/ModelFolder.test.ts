import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import type * as Safetensors from "../../src/Safetensors.ts"

const tempDir = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  return yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-model-" })
})

describe("ModelFolder", () => {
  it.effect("init writes a Hugging Face style folder that loads back with tokenizer, template and stop ids", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = `${yield* tempDir}/tiny`
      const config = yield* ModelFolder.init(dir, { preset: "tiny", seed: 5 })
      assert.deepStrictEqual((yield* fs.readDirectory(dir)).sort(), [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json"
      ])
      const json = JSON.parse(yield* fs.readFileString(`${dir}/config.json`))
      assert.strictEqual(json.model_type, "qwen2")
      assert.strictEqual(json.num_key_value_heads, 4)
      const folder = yield* ModelFolder.load(dir)
      assert.deepStrictEqual(folder.config, config)
      assert.strictEqual(folder.name, "tiny")
      assert.isAtLeast(config.vocabSize, folder.tokenizer.vocabSize)
      const expected = Qwen2.initWeights(config, 5)
      assert.deepStrictEqual(folder.weights.get("model.norm.weight"), expected.get("model.norm.weight"))
      assert.deepStrictEqual(
        folder.weights.get("model.layers.1.mlp.up_proj.weight"),
        expected.get("model.layers.1.mlp.up_proj.weight")
      )
      const imEnd = folder.tokenizer.tokenToId("<|im_end|>")!
      assert.include(folder.stopTokenIds, imEnd)
      const text = yield* folder.template.render([{ role: "user", content: "hi" }], {
        addGenerationPrompt: true,
        tools: [{ type: "function", function: { name: "add", description: "add", parameters: { type: "object" } } }]
      })
      assert.include(text, "<tool_call>")
      assert.isTrue(text.endsWith("<|im_start|>assistant\n"))
      assert.strictEqual(folder.tokenizer.decode(folder.tokenizer.encode(text)), text)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("corrupt or mismatched files are typed errors naming the file and tensor", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* tempDir
      const written = yield* ModelFolder.init(dir, { preset: "tiny" })
      const failure = Effect.flip(ModelFolder.load(dir))

      const weights = yield* fs.readFile(`${dir}/model.safetensors`)
      yield* fs.writeFile(`${dir}/model.safetensors`, weights.subarray(0, weights.length - 100))
      const truncated = yield* failure
      assert.strictEqual(truncated.reason._tag, "InvalidWeights")
      assert.match(truncated.file, /model\.safetensors$/)
      // The last tensor of the file is named; the safetensors error is the cause, with its own reason.
      assert.strictEqual(truncated.reason._tag === "InvalidWeights" && truncated.reason.tensor, "lm_head.weight")
      assert.strictEqual((truncated.reason.cause as Safetensors.SafetensorsError).reason._tag, "Corrupt")

      // Weights of another architecture: the first tensor whose shape differs is named.
      const other = { ...written, intermediateSize: 256 }
      yield* ModelFolder.writeModel(`${dir}/other`, other, Qwen2.initWeights(other, 1))
      yield* fs.copyFile(`${dir}/other/model.safetensors`, `${dir}/model.safetensors`)
      const mismatch = yield* failure
      assert.strictEqual(mismatch.reason._tag, "InvalidWeights")
      const tensor = yield* ModelFolder.load(dir).pipe(
        Effect.as(undefined),
        Effect.catchReason("ModelFolderError", "InvalidWeights", (reason) => Effect.succeed(reason.tensor))
      )
      assert.strictEqual(tensor, "model.layers.0.mlp.gate_proj.weight")
      assert.match(mismatch.message, /\[256, 128\], the model needs \[512, 128\]/)

      const config = yield* fs.readFileString(`${dir}/config.json`)
      const threeHeads = config.replace(`"num_attention_heads": 4`, `"num_attention_heads": 3`)
      yield* fs.writeFileString(`${dir}/config.json`, threeHeads)
      const bad = yield* failure
      assert.strictEqual(bad.reason._tag, "InvalidConfig")
      assert.match(bad.message, /hidden_size 128 is not a multiple of num_attention_heads 3/)
      yield* fs.writeFileString(`${dir}/config.json`, "{ nope")
      assert.strictEqual((yield* failure).reason._tag, "InvalidConfig")
      yield* fs.writeFileString(`${dir}/config.json`, config.replace(/"vocab_size": \d+/, `"vocab_size": 100`))
      const small100 = { ...ModelConfig.presets.tiny, vocabSize: 100 }
      yield* ModelFolder.writeModel(dir, small100, Qwen2.initWeights(small100, 1))
      const small = yield* failure
      assert.strictEqual(small.reason._tag, "InvalidTokenizer")
      assert.match(small.message, /265 ids but config.json's vocab_size is 100/)
      yield* fs.remove(`${dir}/config.json`)
      assert.strictEqual((yield* failure).reason._tag, "NotFound")
    }).pipe(Effect.provide(NodeServices.layer)))
})
