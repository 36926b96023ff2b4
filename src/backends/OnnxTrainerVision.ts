/**
 * The learner's vision-language model (`OnnxTrainer.Model`): the text model of {@link OnnxTrainer.qwen2} plus the
 * tower of `model/VisionTower.ts`, trained together. A micro-batch's images are its rows' (`Packing.Sequence.images`,
 * `MicroBatch.images`), in pad order; the graph's `images` and `patches` dimensions follow them (one compiled graph
 * per shape, as for lengths). A micro-batch without images feeds one blank image nothing reads.
 *
 * **Gotchas**
 *
 * Sequences with images are never in shared-prompt groups (`Packing`), and a row whose pads do not number its
 * images' tokens is a defect: the template and `VisionTower.geometry` must agree (`VisionTower.preprocessorConfig`).
 *
 * @since 0.1.0
 */
import * as ort from "onnxruntime-node"
import * as VisionTower from "../model/VisionTower.ts"
import type * as Packing from "../Packing.ts"
import * as OnnxTrainer from "./OnnxTrainer.ts"

/** The images of a micro-batch (a blank one when it has none) and whether they are real. */
const imagesOf = (vl: VisionTower.VlConfig, mb: Packing.MicroBatch) => {
  const images = (mb.images ?? []).flat()
  if (images.length > 0) return { images, real: true }
  const side = vl.vision.patchSize * vl.vision.spatialMergeSize
  const blank = { width: side, height: side, data: new Float32Array(vl.vision.inChannels * side * side) }
  return { images: [blank], real: false }
}

/**
 * The Qwen2 text model with a vision tower (every weight trained), for `OnnxTrainer.make`: inputs those of
 * {@link OnnxTrainer.qwen2} plus the tower's (`VisionTower.inputFeeds`) and `image_token_index` from the rows'
 * `imageTokenId` pads.
 *
 * @category constructors
 * @since 0.1.0
 */
export const qwen2Vl = (vl: VisionTower.VlConfig, imageTokenId: number): OnnxTrainer.Model => {
  const text = OnnxTrainer.qwen2(vl.text)
  const m = vl.vision.spatialMergeSize, ps = vl.vision.patchSize
  return {
    parameters: VisionTower.allParameters(vl),
    vocabSize: vl.text.vocabSize,
    forward: () => VisionTower.trainingGraph(vl),
    dims: (mb) => {
      const { images } = imagesOf(vl, mb)
      const patches = Math.max(...images.map((i) => Math.ceil((i.width / ps) * (i.height / ps) / (m * m)) * m * m))
      return { images: images.length, patches }
    },
    inputs: (mb, context) => {
      const { images, real } = imagesOf(vl, mb)
      const inputs = VisionTower.patchify(vl.vision, images)
      const feeds = VisionTower.inputFeeds(vl.vision, inputs)
      const int64 = (f: { readonly data: ArrayLike<number>; readonly dims: ReadonlyArray<number> }) =>
        new ort.Tensor("int64", BigInt64Array.from(Array.from(f.data), (x) => BigInt(x)), f.dims)
      const index = VisionTower.imageTokenIndex(mb.inputIds, imageTokenId, real ? inputs : { ...inputs, tokens: [] })
      return {
        ...text.inputs(mb, context),
        pixel_patches: new ort.Tensor("float32", inputs.pixels, feeds.pixel_patches.dims),
        patch_rows: int64(feeds.patch_rows),
        patch_cols: int64(feeds.patch_cols),
        patch_mask: int64(feeds.patch_mask),
        image_token_index: int64({ data: index, dims: [mb.batch, mb.length] })
      }
    }
  }
}
