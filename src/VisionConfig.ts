/**
 * A model folder's vision geometry, read from Hugging Face's `preprocessor_config.json` (Qwen2-VL's
 * `Qwen2VLImageProcessor`: `patch_size`, `merge_size`, `min_pixels` / `max_pixels` or `size.shortest_edge` /
 * `size.longest_edge`, `image_mean`, `image_std`), so that a vision model's template writes its image tokens
 * (`ChatTemplate.withVision`). A folder without that file is a text model (`undefined`).
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Path } from "effect"
import * as ChatTemplate from "./ChatTemplate.ts"
import type * as Image from "./Image.ts"
import * as Tokenizer from "./Tokenizer.ts"

/**
 * A vision model's template settings and its tower's input normalisation.
 *
 * @category models
 * @since 0.1.0
 */
export interface VisionConfig {
  readonly vision: ChatTemplate.Vision
  readonly normalisation: Image.VisionNormalisation
}

const num = (value: unknown): number | undefined =>
  typeof value === "number" && Number.isFinite(value) && value > 0 ? value : undefined

const triple = (value: unknown): readonly [number, number, number] | undefined =>
  Array.isArray(value) && value.length === 3 && value.every((x) => typeof x === "number")
    ? [value[0], value[1], value[2]]
    : undefined

/**
 * The vision settings of a parsed `preprocessor_config.json`; `undefined` when it has no `patch_size` and
 * `merge_size` (not a Qwen2-VL-style processor).
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromPreprocessorConfig = (config: unknown): VisionConfig | undefined => {
  if (typeof config !== "object" || config === null) return undefined
  const c = config as Record<string, unknown>
  const patchSize = num(c["patch_size"])
  const mergeSize = num(c["merge_size"])
  if (patchSize === undefined || mergeSize === undefined) return undefined
  const size = (typeof c["size"] === "object" && c["size"] !== null ? c["size"] : {}) as Record<string, unknown>
  const minPixels = num(c["min_pixels"]) ?? num(size["shortest_edge"])
  const maxPixels = num(c["max_pixels"]) ?? num(size["longest_edge"])
  const mean = triple(c["image_mean"])
  const std = triple(c["image_std"])
  return {
    vision: {
      ...ChatTemplate.qwenVisionTokens,
      geometry: {
        patchSize,
        mergeSize,
        ...(minPixels === undefined ? {} : { minPixels }),
        ...(maxPixels === undefined ? {} : { maxPixels })
      }
    },
    normalisation: mean !== undefined && std !== undefined ? { mean, std } : {
      mean: [0.48145466, 0.4578275, 0.40821073],
      std: [0.26862954, 0.26130258, 0.27577711]
    }
  }
}

/**
 * Reads `<modelDir>/preprocessor_config.json`: the folder's vision settings, or `undefined` for a text model (no
 * such file, or not a Qwen2-VL-style processor). A file that is not JSON fails with the tokenizer's `InvalidJson`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const read = Effect.fn("VisionConfig.read")(function*(modelDir: string) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const file = path.join(modelDir, "preprocessor_config.json")
  if (!(yield* fs.exists(file).pipe(Effect.orElseSucceed(() => false)))) return undefined
  return fromPreprocessorConfig(yield* Tokenizer.readJsonFile(file))
})

/**
 * The template for a model folder: with its vision settings where it has them.
 *
 * @category constructors
 * @since 0.1.0
 */
export const applyTo = (template: ChatTemplate.ChatTemplate, config: VisionConfig | undefined) =>
  config === undefined ? template : ChatTemplate.withVision(template, config.vision)
