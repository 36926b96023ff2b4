/**
 * A model folder with Qwen2-VL's `preprocessor_config.json` loads with a vision template (its image tokens and
 * geometry); without it, the template is the text template it was; a file that is not JSON is refused, named.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import { writeFileSync } from "node:fs"
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
})
