/**
 * A model folder with Qwen2-VL's `preprocessor_config.json` loads with a vision template (its image tokens and
 * geometry); without it, the template is the text template it was; a file that is not JSON is refused, named.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import { readFileSync, writeFileSync } from "node:fs"
import * as VisionTower from "../../src/model/VisionTower.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"

describe("ModelFolder: vision", () => {
  it.effect("preprocessor_config.json gives the template vision; without it nothing changes", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-folder-vision-" })}/tiny`
      yield* ModelFolder.init(dir, { preset: "tiny", seed: 1 })
      const text = yield* ModelFolder.load(dir)
      assert.isUndefined(text.template.vision)
      writeFileSync(
        `${dir}/preprocessor_config.json`,
        JSON.stringify({ patch_size: 8, merge_size: 2, min_pixels: 256, max_pixels: 4096 })
      )
      const vision = yield* ModelFolder.load(dir)
      assert.deepStrictEqual(vision.template.vision, {
        start: "<|vision_start|>",
        pad: "<|image_pad|>",
        end: "<|vision_end|>",
        geometry: { patchSize: 8, mergeSize: 2, minPixels: 256, maxPixels: 4096 }
      })
      assert.strictEqual(vision.template.source, text.template.source)
      writeFileSync(`${dir}/preprocessor_config.json`, "{not json")
      const error = yield* Effect.flip(ModelFolder.load(dir))
      assert.include(error.message, "preprocessor_config.json")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.effect("a tiny-vl folder carries its tower (vision_config, visual.* weights, pads); a broken key is named", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-folder-vl-" })}/tiny-vl`
      const config = yield* ModelFolder.init(dir, { preset: "tiny-vl", seed: 3 })
      const folder = yield* ModelFolder.load(dir)
      const vl = VisionTower.presets["tiny-vl"]
      assert.deepStrictEqual(folder.vision, { text: config, vision: vl.vision })
      // The same weights as VisionTower.initWeights gives, tower included.
      const expected = VisionTower.initWeights({ text: config, vision: vl.vision }, 3)
      assert.deepStrictEqual([...folder.weights.keys()].sort(), [...expected.keys()].sort())
      const merger = "visual.merger.mlp.2.weight"
      assert.deepStrictEqual(folder.weights.get(merger), expected.get(merger))
      // The template writes one pad per tower token, and the tokenizer knows the pad.
      assert.deepStrictEqual(folder.template.vision?.geometry, VisionTower.geometry(vl.vision))
      assert.strictEqual(folder.tokenizer.tokenToId("<|image_pad|>"), 266)
      assert.strictEqual(config.vocabSize, folder.tokenizer.vocabSize)
      const raw = JSON.parse(readFileSync(`${dir}/config.json`, "utf8"))
      delete raw.vision_config.patch_size
      writeFileSync(`${dir}/config.json`, JSON.stringify(raw))
      const error = yield* Effect.flip(ModelFolder.load(dir))
      assert.include(error.message, "vision_config.patch_size")
      // A text folder has no tower.
      yield* ModelFolder.init(`${dir}-text`, { preset: "tiny", seed: 3 })
      assert.isUndefined((yield* ModelFolder.load(`${dir}-text`)).vision)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
})
