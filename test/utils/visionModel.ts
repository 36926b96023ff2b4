/** A small vision-language model for tests: config, weights, images and a no-cache reference forward pass. */
import { Effect } from "effect"
import * as ort from "onnxruntime-node"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as VisionTower from "../../src/model/VisionTower.ts"
import * as Graph from "../../src/onnx/Graph.ts"
import { noise } from "./gradcheck.ts"
import { randomWeights, tinyConfig } from "./tinyModel.ts"

/** A tower small enough for central differences over every weight, on a text model of `text`'s shape. */
export const smallVl = (text = tinyConfig()): VisionTower.VlConfig => ({
  text,
  vision: {
    depth: 2,
    hiddenSize: 8,
    numHeads: 2,
    intermediateSize: 12,
    patchSize: 2,
    temporalPatchSize: 1,
    spatialMergeSize: 2,
    inChannels: 3,
    maxGridSide: 8,
    ropeTheta: 10000,
    rmsNormEps: 1e-6,
    maxPixels: 64
  }
})

/** The language model's and the tower's weights, large enough that every path carries a visible gradient. */
export const vlWeights = (vl: VisionTower.VlConfig, seed: number): Map<string, Float32Array> => {
  const weights = new Map(randomWeights(vl.text, seed))
  const tower = VisionTower.initWeights(vl, seed, 0.35)
  VisionTower.parameters(vl).forEach((spec, k) => {
    const data = tower.get(spec.name)!
    const wobble = noise(data.length, seed + k)
    if (spec.init === "ones") data.forEach((_, i) => (data[i] = 1 + 0.2 * wobble[i]!))
    if (spec.init === "zeros") data.forEach((_, i) => (data[i] = 0.3 * wobble[i]!))
    weights.set(spec.name, data)
  })
  return weights
}

/** A channels-first 3-channel image of pixels in [-1, 1). */
export const image = (width: number, height: number, seed: number): VisionTower.Pixels => ({
  width,
  height,
  data: Float32Array.from(noise(3 * width * height, seed))
})

/**
 * A no-cache forward pass of one sequence with its images (`VisionTower.trainingGraph`): logits `[T, V]`. Only the
 * first `promptLength` positions' pads are images (a sampled pad id is a text token, as the engine decodes it).
 */
export const makeVlReference = (vl: VisionTower.VlConfig, imageTokenId: number) =>
  Effect.gen(function*() {
    const session = yield* Effect.promise(() =>
      ort.InferenceSession.create(Graph.toModelBytes(VisionTower.trainingGraph(vl).graph))
    )
    return (
      w: Qwen2.Weights,
      ids: ReadonlyArray<number>,
      images: ReadonlyArray<VisionTower.Pixels>,
      promptLength = ids.length
    ) =>
      Effect.promise(async () => {
        const T = ids.length
        const inputs = VisionTower.patchify(vl.vision, images)
        const int64 = (values: ReadonlyArray<number>, dims: ReadonlyArray<number>) =>
          new ort.Tensor("int64", BigInt64Array.from(values, (x) => BigInt(x)), dims)
        const tower = VisionTower.inputFeeds(vl.vision, inputs)
        const feeds: Record<string, ort.Tensor> = {
          input_ids: int64(ids, [1, T]),
          attention_mask: int64(ids.map(() => 1), [1, T]),
          position_ids: int64(ids.map((_, i) => i), [1, T]),
          pixel_patches: new ort.Tensor("float32", tower.pixel_patches.data, tower.pixel_patches.dims),
          patch_rows: int64(tower.patch_rows.data, tower.patch_rows.dims),
          patch_cols: int64(tower.patch_cols.data, tower.patch_cols.dims),
          patch_mask: int64(tower.patch_mask.data, tower.patch_mask.dims),
          image_token_index: int64([
            ...VisionTower.imageTokenIndex(ids.slice(0, promptLength), imageTokenId, inputs),
            ...ids.slice(promptLength).map(() => -1)
          ], [1, T])
        }
        for (const spec of VisionTower.allParameters(vl)) {
          feeds[spec.name] = new ort.Tensor("float32", w.get(spec.name)!, spec.shape)
        }
        return (await session.run(feeds))["logits"]!.data as Float32Array
      })
  })
