import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { createHash } from "node:crypto"
import * as Autodiff from "../../../src/autodiff/Autodiff.ts"
import * as Image from "../../../src/Image.ts"
import * as VisionConfig from "../../../src/VisionConfig.ts"
import * as Loss from "../../../src/Loss.ts"
import * as ModelConfig from "../../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import * as VisionTower from "../../../src/model/VisionTower.ts"
import * as Graph from "../../../src/onnx/Graph.ts"
import { batchFeeds, check, type Feed, runWith, session } from "../../utils/gradcheck.ts"
import { tinyConfig } from "../../utils/tinyModel.ts"
import { image, smallVl as smallVlOf, vlWeights } from "../../utils/visionModel.ts"

const B = 2, T = 5, PAD = 12

const smallVl = smallVlOf(
  tinyConfig({ vocabSize: 13, hiddenSize: 8, numAttentionHeads: 2, numKeyValueHeads: 1, intermediateSize: 12 })
)

/** Two images: 4×4 (one merged token) and 8 wide × 4 high (two). */
const images = (seed = 1): ReadonlyArray<VisionTower.Pixels> => [image(4, 4, seed), image(8, 4, seed + 1)]

/** Row 0 holds image 0's pad, row 1 image 1's two pads (after a padding slot). */
const ids = [3, PAD, 4, 1, 5, 0, 9, PAD, PAD, 6]

const visionFeeds = (inputs: VisionTower.VisionInputs, dtype: "float32" | "float64"): Record<string, Feed> => {
  const feeds = VisionTower.inputFeeds(smallVl.vision, inputs)
  return {
    ...feeds,
    pixel_patches: { ...feeds.pixel_patches, dtype },
    image_token_index: { dtype: "int64", dims: [B, T], data: VisionTower.imageTokenIndex(ids, PAD, inputs) }
  }
}

/** The fixed 2 × 5 batch with the two images, and every weight, in float64. */
const gradFeeds = (tg: Autodiff.TrainingGraph, inputs: VisionTower.VisionInputs) => {
  const weights = vlWeights(smallVl, 11)
  const feeds = batchFeeds(tg.lossInputs, Qwen2.positionIds, (mask, batch, length) =>
    Loss.aggregationWeights("token-mean", mask, batch, length, Loss.totals(mask, batch, length)))
  feeds["input_ids"] = { dtype: "int64", dims: [B, T], data: ids }
  Object.assign(feeds, visionFeeds(inputs, "float64"))
  for (const spec of VisionTower.allParameters(smallVl)) {
    feeds[spec.name] = { dtype: "float64", dims: spec.shape, data: weights.get(spec.name)! }
  }
  return feeds
}

const sha = (g: Graph.Graph) => createHash("sha256").update(Graph.toModelBytes(g)).digest("hex")

describe("VisionTower", () => {
  it("without a tower the text graphs are byte for byte those emitted before the tower existed", () => {
    // Hashes of Graph.toModelBytes at commit eb3d3b2 (before the tokenEmbeddings hook).
    const c = ModelConfig.presets.tiny
    const train = sha(Qwen2.trainingGraph(c).graph)
    assert.strictEqual(train, "29314314eb74b40601544ea04b343f1c11d433551a3af6639ae3d4b31390e97c")
    const decode = sha(Qwen2.inferenceGraph(c, "inputs")), shared = sha(Qwen2.sharedPrefixGraph(c).graph)
    assert.strictEqual(decode, "8c119205bfae1fcfa65b4cbf4d63d0728a1d43aaf8da0452469f9a70c5b55396")
    assert.strictEqual(shared, "8a1f1aaae5df5ce6f00cae385a4f14357e0ed97a53b77ae5ca72197a62744718")
    // …and the hashes can fail: the vision-language graph is another one.
    assert.notStrictEqual(sha(VisionTower.trainingGraph(VisionTower.presets["tiny-vl"]).graph), train)
  })

  it("patchify orders patches as Qwen2-VL's processor: merge windows row by row, 2×2 inside, [C, ps, ps] each", () => {
    const v = { ...smallVl.vision, inChannels: 1 }
    // A 1-channel 8 wide × 4 high image whose pixel value is its index: row y, column x → 8y + x.
    const pixels = { width: 8, height: 4, data: Float32Array.from({ length: 32 }, (_, i) => i) }
    // …and a 4×4 one after it, padded to the first's 8 patches.
    const small = { width: 4, height: 4, data: Float32Array.from({ length: 16 }, (_, i) => 100 + i) }
    const out = VisionTower.patchify(v, [pixels, small])
    assert.strictEqual(out.patches, 8)
    assert.deepStrictEqual(out.rows, [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0])
    assert.deepStrictEqual(out.cols, [0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 0, 0, 0, 0])
    assert.deepStrictEqual(out.mask, [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0])
    assert.deepStrictEqual(out.tokens, [2, 1])
    assert.strictEqual(out.stride, 2)
    // Patch 1 is grid (0, 1): pixels (0, 2), (0, 3), (1, 2), (1, 3); patch 4 is grid (0, 2).
    assert.deepStrictEqual(Array.from(out.pixels.subarray(4, 8)), [2, 3, 10, 11])
    assert.deepStrictEqual(Array.from(out.pixels.subarray(16, 20)), [4, 5, 12, 13])
    // The small image's patch 3 is grid (1, 1); its padding is zeros.
    assert.deepStrictEqual(Array.from(out.pixels.subarray(32 + 12, 32 + 16)), [110, 111, 114, 115])
    assert.deepStrictEqual(Array.from(out.pixels.subarray(48)), new Array(16).fill(0))
    // Pads take image 0's tokens 0, 1 then image 1's token at row stride · 1.
    assert.deepStrictEqual(VisionTower.imageTokenIndex([1, PAD, PAD, 2, PAD], PAD, out), [-1, 0, 1, -1, 2])
    assert.throws(() => VisionTower.patchify(v, [{ width: 6, height: 4, data: new Float32Array(24) }]))
    assert.throws(() => VisionTower.imageTokenIndex([PAD, 1, PAD], PAD, out))
  })

  it("tiny-vl: the tiny language model's weights for the same seed, and a tower of the preset's shape", () => {
    const vl = VisionTower.presets["tiny-vl"]
    const w = VisionTower.initWeights(vl, 7)
    const text = Qwen2.initWeights(vl.text, 7)
    for (const [name, data] of text) assert.deepStrictEqual(w.get(name), data, name)
    assert.deepStrictEqual(w.get("visual.patch_embed.proj.weight")!.length, 64 * 3 * 8 * 8)
    assert.deepStrictEqual(w.get("visual.merger.mlp.2.weight")!.length, vl.text.hiddenSize * 256)
    assert.strictEqual(VisionTower.patchify(vl.vision, [{ width: 64, height: 64, data: new Float32Array(3 * 4096) }])
      .tokens[0], 16)
  })

  it("Image.resizeForVision at the preset's geometry feeds patchify, one merged token per template pad", () => {
    const vl = VisionTower.presets["tiny-vl"]
    for (const [width, height] of [[100, 60], [640, 480], [20, 20], [64, 64]] as const) {
      const rgb = Uint8Array.from({ length: width * height * 3 }, (_, i) => (i * 37) % 256)
      const ref = { sha256: "0", width, height, mediaType: "image/png" as const }
      const { grid, pixels } = Image.resizeForVision({ ref, rgb }, VisionTower.geometry(vl.vision))
      assert.isAtMost(grid.width * grid.height, 64 * 64)
      const inputs = VisionTower.patchify(vl.vision, [{ data: pixels, width: grid.width, height: grid.height }])
      assert.deepStrictEqual(inputs.tokens, [Image.visionTokenCount(width, height, VisionTower.geometry(vl.vision))])
      assert.strictEqual(inputs.patches, grid.gridHeight * grid.gridWidth)
    }
  })

  it("the preset's preprocessor_config.json gives the template the tower's geometry (VisionConfig's parser)", () => {
    const v = VisionTower.presets["tiny-vl"].vision
    const read = VisionConfig.fromPreprocessorConfig(JSON.parse(JSON.stringify(VisionTower.preprocessorConfig(v))))
    assert.deepStrictEqual(read?.vision.geometry, VisionTower.geometry(v))
    const ref = { sha256: "0", width: 90, height: 50, mediaType: "image/png" as const }
    const pixels = VisionTower.toPixels(v, { ref, rgb: new Uint8Array(90 * 50 * 3).fill(255) })
    const tokens = Image.visionTokenCount(90, 50, read!.vision.geometry)
    assert.deepStrictEqual(VisionTower.patchify(v, [pixels]).tokens, [tokens])
  })

  for (const tower of ["trained", "frozen"] as const) {
    it.effect(`whole-model gradients with a ${tower} tower match central differences in float64`, () =>
      Effect.gen(function*() {
        const forward = VisionTower.trainingGraph(smallVl, tower)
        const inputs = VisionTower.patchify(smallVl.vision, images())
        const tg = yield* Autodiff.trainingGraph(forward, {
          batch: B,
          length: T,
          loss: Loss.sft,
          dtype: "float64",
          dims: { images: inputs.images, patches: inputs.patches }
        })
        const trained = tower === "trained" ? VisionTower.parameters(smallVl) : []
        const names = [...Qwen2.parameters(smallVl.text), ...trained]
        assert.deepStrictEqual([...forward.weightInputs], names.map((p) => p.name))
        const feeds = gradFeeds(tg, inputs)
        const s = yield* session(tg.graph)
        const { worst, base } = yield* check(s, feeds, forward.weightInputs, { samples: 3, h: 1e-5 })
        for (const w of forward.weightInputs) assert.isBelow(worst[w]!, 1e-5, `${w}: ${worst[w]}`)
        if (tower === "trained") {
          // The image reaches the loss: no tower weight's gradient is zero (each is ≥ 0.01 here).
          for (const spec of VisionTower.parameters(smallVl)) {
            const g = base[tg.gradients.get(spec.name)!]!
            assert.isAbove(Math.max(...Array.from(g, Math.abs)), 1e-3, spec.name)
          }
        }
      }))
  }

  it.effect("activation recompute (the learner's option) gives the same loss and gradients with a tower", () =>
    Effect.gen(function*() {
      const inputs = VisionTower.patchify(smallVl.vision, images())
      const build = (recompute: boolean) =>
        Autodiff.trainingGraph(VisionTower.trainingGraph(smallVl), {
          batch: B,
          length: T,
          loss: Loss.sft,
          dtype: "float64",
          dims: { images: inputs.images, patches: inputs.patches },
          recompute
        })
      const plain = yield* build(false), again = yield* build(true)
      const a = yield* runWith(yield* session(plain.graph), gradFeeds(plain, inputs))
      const b = yield* runWith(yield* session(again.graph), gradFeeds(again, inputs))
      assert.approximately(b["loss"]![0]!, a["loss"]![0]!, 1e-12)
      assert.strictEqual(again.gradients.size, VisionTower.allParameters(smallVl).length)
      for (const [w, name] of plain.gradients) {
        const x = a[name]!, y = b[again.gradients.get(w)!]!
        x.forEach((v, i) => assert.approximately(y[i]!, v, 1e-12, w))
      }
    }))

  it.effect("attention stays within an image; text rows match the text graph; pixels change image rows", () =>
    Effect.gen(function*() {
      const vl = smallVl
      const weights = vlWeights(vl, 3)
      const s = yield* session(VisionTower.trainingGraph(vl).graph)
      const text = yield* session(Qwen2.trainingGraph(vl.text).graph)
      const attention = [1, 1, 1, 1, 1, 0, 1, 1, 1, 1]
      const base: Record<string, Feed> = {
        input_ids: { dtype: "int64", dims: [B, T], data: ids },
        attention_mask: { dtype: "int64", dims: [B, T], data: attention },
        position_ids: {
          dtype: "int64",
          dims: [B, T],
          data: [...Qwen2.positionIds(attention.slice(0, T)), ...Qwen2.positionIds(attention.slice(T))]
        }
      }
      for (const spec of Qwen2.parameters(vl.text)) {
        base[spec.name] = { dtype: "float32", dims: spec.shape, data: weights.get(spec.name)! }
      }
      const tower: Record<string, Feed> = {}
      for (const spec of VisionTower.parameters(vl)) {
        tower[spec.name] = { dtype: "float32", dims: spec.shape, data: weights.get(spec.name)! }
      }
      const run = (pixels: ReadonlyArray<VisionTower.Pixels>) =>
        runWith(s, { ...base, ...tower, ...visionFeeds(VisionTower.patchify(vl.vision, pixels), "float32") })
      const a = (yield* run(images(1)))["logits"]!
      const b = (yield* run([images(1)[0]!, images(9)[1]!]))["logits"]!
      const V = vl.text.vocabSize, row = T * V
      // Only image 1 changed: row 0 (image 0) is the same to the last bit, row 1 is not.
      assert.deepStrictEqual(Array.from(b.subarray(0, row)), Array.from(a.subarray(0, row)))
      const moved = Array.from(b.subarray(row + 3 * V), (x, i) => Math.abs(x - a[row + 3 * V + i]!))
      assert.isAbove(Math.max(...moved), 1e-4)
      // Row 1's text position 1 sees no image yet (causal), so it is the text model's logit.
      const plain = (yield* runWith(text, base))["logits"]!
      for (let i = row + V; i < row + 2 * V; i++) assert.approximately(a[i]!, plain[i]!, 1e-5)
      // Position 0 of row 0 too; position 1 (the pad) is not the pad's text embedding.
      for (let i = 0; i < V; i++) assert.approximately(a[i]!, plain[i]!, 1e-5)
      assert.isAbove(Math.max(...Array.from({ length: V }, (_, i) => Math.abs(a[V + i]! - plain[V + i]!))), 1e-4)
    }))
})
