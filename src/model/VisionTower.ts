/**
 * A Qwen2.5-VL-style vision tower in the same emitted graph as the language model: a patch embedding (a MatMul over
 * flattened patches, Qwen's Conv3d with stride = kernel), `depth` pre-norm transformer blocks (RMSNorm, fused qkv
 * with biases, **2-D rotary position embeddings** as Qwen2-VL's `VisionRotaryEmbedding`: half of each head's
 * rotary pairs turn with the patch's row, half with its column; attention bidirectional within an image and never
 * across images; a SwiGLU MLP with biases) and a 2×2 patch merger (RMSNorm, four neighbours concatenated, Linear →
 * GELU (tanh form) → Linear into the language model's width). The merged tokens replace the token embeddings of the
 * `<|image_pad|>` positions of the language model's input (before its learned positions are added), by an index
 * input; everything after is the text model's graph ({@link Qwen2.forward}).
 *
 * **Graph inputs** (besides the text model's): `pixel_patches [images, patches, C·tps·ps·ps]` float32, each
 * image's patches in Qwen2-VL's order (its 2×2 merge windows row by row, the four patches of a window consecutive)
 * and padded to the largest image's count ({@link patchify}); `patch_rows`, `patch_cols [images, patches]` int64
 * (each patch's place in its image's grid); `patch_mask [images, patches]` int64 (1 real, 0 padding);
 * `image_token_index [batch, seq]` int64 (the merged token a position takes, -1 for a text position:
 * {@link imageTokenIndex}). Attention runs per image: its cost grows with the images' patches squared, each alone,
 * not with the batch's. A request without any image uses the text graph, unchanged.
 *
 * Differences from Qwen2.5-VL, said plainly: every block attends over its whole image (no window attention), the
 * language model keeps 1-D positions (no M-RoPE) and the merger's GELU is the tanh form; so a real Qwen2.5-VL
 * checkpoint is refused (`ModelFolder.ts`), not silently misread.
 *
 * @since 0.1.0
 */
import * as Image from "../Image.ts"
import * as Graph from "../onnx/Graph.ts"
import * as Sampling from "../Sampling.ts"
import * as ModelConfig from "./ModelConfig.ts"
import * as Qwen2 from "./Qwen2.ts"

// ===== Models =====

/**
 * The tower's shape, in Qwen2.5-VL's `vision_config` terms.
 *
 * @category models
 * @since 0.1.0
 */
export interface VisionConfig {
  /** Transformer blocks. */
  readonly depth: number
  /** The tower's width. */
  readonly hiddenSize: number
  readonly numHeads: number
  /** The SwiGLU MLP's width. */
  readonly intermediateSize: number
  /** Pixels per patch side. */
  readonly patchSize: number
  /** Frames per patch (Qwen: 2, an image repeated); 1 here for the presets. */
  readonly temporalPatchSize: number
  /** Patches per merge-window side (2: four patches make one language-model token). */
  readonly spatialMergeSize: number
  readonly inChannels: number
  /** The largest grid side (patches) the rotary tables cover. */
  readonly maxGridSide: number
  readonly ropeTheta: number
  readonly rmsNormEps: number
  /** The largest image area (pixels) the resize keeps (Qwen's `max_pixels`); larger images are scaled down. */
  readonly maxPixels: number
}

/**
 * A vision-language model: the text model, its tower and the special tokens of its template.
 *
 * @category models
 * @since 0.1.0
 */
export interface VlConfig {
  readonly text: ModelConfig.ModelConfig
  readonly vision: VisionConfig
}

/**
 * Names of the presets.
 *
 * @category models
 * @since 0.1.0
 */
export type PresetName = "tiny-vl"

/**
 * `tiny-vl`: the `tiny` language model and a tower of 2 blocks, width 64, 4 heads, patch 8, 2×2 merge, images
 * resized to at most 64×64 pixels (64 patches, 16 language-model tokens). Trains on 2 cores.
 *
 * @category constructors
 * @since 0.1.0
 */
export const presets: Readonly<Record<PresetName, VlConfig>> = {
  "tiny-vl": {
    text: ModelConfig.presets.tiny,
    vision: {
      depth: 2,
      hiddenSize: 64,
      numHeads: 4,
      intermediateSize: 128,
      patchSize: 8,
      temporalPatchSize: 1,
      spatialMergeSize: 2,
      inChannels: 3,
      maxGridSide: 64,
      ropeTheta: 10000,
      rmsNormEps: 1e-6,
      maxPixels: 64 * 64
    }
  }
}

/**
 * The tower's keys as `config.json`'s `vision_config` (Qwen2.5-VL's names where they exist) of a folder that
 * `agentfly init-model --preset tiny-vl` writes; {@link fromConfigJson} reads them back.
 *
 * @category getters
 * @since 0.1.0
 */
export const toConfigJson = (v: VisionConfig): Record<string, number> => ({
  depth: v.depth,
  hidden_size: v.hiddenSize,
  num_heads: v.numHeads,
  intermediate_size: v.intermediateSize,
  patch_size: v.patchSize,
  temporal_patch_size: v.temporalPatchSize,
  spatial_merge_size: v.spatialMergeSize,
  in_chans: v.inChannels,
  max_grid_side: v.maxGridSide,
  rope_theta: v.ropeTheta,
  rms_norm_eps: v.rmsNormEps,
  max_pixels: v.maxPixels
})

/**
 * The tower of a `config.json` (its `vision_config` as {@link toConfigJson} writes it): `undefined` when there is
 * none, else the config or the first key that is missing or not a positive number.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromConfigJson = (raw: unknown): VisionConfig | { readonly missing: string } | undefined => {
  const c = typeof raw === "object" && raw !== null ? (raw as Record<string, unknown>)["vision_config"] : undefined
  if (typeof c !== "object" || c === null) return undefined
  const keys = Object.keys(toConfigJson(presets["tiny-vl"].vision))
  const values: Record<string, number> = {}
  for (const key of keys) {
    const value = (c as Record<string, unknown>)[key]
    if (typeof value !== "number" || !(value > 0)) return { missing: `vision_config.${key}` }
    values[key] = value
  }
  return {
    depth: values["depth"]!,
    hiddenSize: values["hidden_size"]!,
    numHeads: values["num_heads"]!,
    intermediateSize: values["intermediate_size"]!,
    patchSize: values["patch_size"]!,
    temporalPatchSize: values["temporal_patch_size"]!,
    spatialMergeSize: values["spatial_merge_size"]!,
    inChannels: values["in_chans"]!,
    maxGridSide: values["max_grid_side"]!,
    ropeTheta: values["rope_theta"]!,
    rmsNormEps: values["rms_norm_eps"]!,
    maxPixels: values["max_pixels"]!
  }
}

/**
 * The tower's resize geometry for `Image.visionGrid` / `Image.resizeForVision` (Qwen2-VL's `smart_resize`): an
 * image becomes `tokens` merged tokens, one `<|image_pad|>` each, and {@link patchify} takes its pixels as they are.
 *
 * @category getters
 * @since 0.1.0
 */
export const geometry = (v: VisionConfig): Image.VisionGeometry => ({
  patchSize: v.patchSize,
  mergeSize: v.spatialMergeSize,
  minPixels: (v.patchSize * v.spatialMergeSize) ** 2,
  maxPixels: v.maxPixels
})

/**
 * Values per flattened patch: `C · tps · ps · ps`.
 *
 * @category getters
 * @since 0.1.0
 */
export const patchDim = (v: VisionConfig): number => v.inChannels * v.temporalPatchSize * v.patchSize * v.patchSize

/**
 * The tower's parameters, Qwen2.5-VL's names (`visual.*`) and layouts (`[out, in]`; the patch embedding a Conv3d
 * kernel `[width, C, tps, ps, ps]`), merger output of the language model's width.
 *
 * @category getters
 * @since 0.1.0
 */
export const parameters = (vl: VlConfig): ReadonlyArray<Qwen2.ParameterSpec> => {
  const v = vl.vision, w = v.hiddenSize, F = v.intermediateSize, m = w * v.spatialMergeSize ** 2
  const specs: Array<Qwen2.ParameterSpec> = [{
    name: "visual.patch_embed.proj.weight",
    shape: [w, v.inChannels, v.temporalPatchSize, v.patchSize, v.patchSize],
    init: "normal"
  }]
  const linear = (name: string, out: number, inp: number) =>
    specs.push({ name: `${name}.weight`, shape: [out, inp], init: "normal" }, {
      name: `${name}.bias`,
      shape: [out],
      init: "zeros"
    })
  for (let i = 0; i < v.depth; i++) {
    const p = `visual.blocks.${i}`
    specs.push({ name: `${p}.norm1.weight`, shape: [w], init: "ones" })
    linear(`${p}.attn.qkv`, 3 * w, w)
    linear(`${p}.attn.proj`, w, w)
    specs.push({ name: `${p}.norm2.weight`, shape: [w], init: "ones" })
    linear(`${p}.mlp.gate_proj`, F, w)
    linear(`${p}.mlp.up_proj`, F, w)
    linear(`${p}.mlp.down_proj`, w, F)
  }
  specs.push({ name: "visual.merger.ln_q.weight", shape: [w], init: "ones" })
  linear("visual.merger.mlp.0", m, m)
  linear("visual.merger.mlp.2", vl.text.hiddenSize, m)
  return specs
}

/**
 * Every weight of the vision-language model: the text model's ({@link Qwen2.parameters}), then the tower's.
 *
 * @category getters
 * @since 0.1.0
 */
export const allParameters = (vl: VlConfig): ReadonlyArray<Qwen2.ParameterSpec> => [
  ...Qwen2.parameters(vl.text),
  ...parameters(vl)
]

/**
 * Weights by parameter name, float32, row-major: the text model's and the tower's.
 *
 * @category models
 * @since 0.1.0
 */
export type Weights = Qwen2.Weights

/**
 * Deterministic initialisation from a seed: the language model's weights exactly as {@link Qwen2.initWeights}
 * gives them for the same seed, then the tower's from a second stream (projections ~ N(0, std²), norms 1, biases 0).
 *
 * @category constructors
 * @since 0.1.0
 */
export const initWeights = (vl: VlConfig, seed: number, std = 0.02): Map<string, Float32Array> => {
  const weights = Qwen2.initWeights(vl.text, seed, std)
  const r = Sampling.rng(seed + 0x9e3779b9)
  for (const spec of parameters(vl)) {
    const n = spec.shape.reduce((a, b) => a * b, 1)
    const data = new Float32Array(n)
    if (spec.init === "ones") data.fill(1)
    else if (spec.init === "normal") for (let i = 0; i < n; i++) data[i] = Sampling.normal(r) * std
    weights.set(spec.name, data)
  }
  return weights
}

/**
 * The `preprocessor_config.json` of a folder with this tower (Qwen2-VL's `Qwen2VLImageProcessor` keys), which
 * `VisionConfig.read` turns into the template's image tokens: one pad per merged token of {@link geometry}'s resize.
 *
 * @category getters
 * @since 0.1.0
 */
export const preprocessorConfig = (v: VisionConfig): Record<string, unknown> => ({
  image_processor_type: "Qwen2VLImageProcessor",
  patch_size: v.patchSize,
  merge_size: v.spatialMergeSize,
  temporal_patch_size: v.temporalPatchSize,
  min_pixels: (v.patchSize * v.spatialMergeSize) ** 2,
  max_pixels: v.maxPixels,
  image_mean: [...Image.clipNormalisation.mean],
  image_std: [...Image.clipNormalisation.std]
})

// ===== Pixels to the graph's inputs =====

/**
 * An image as the tower reads it: float32 pixels `[C, height, width]` (already resized and normalised, e.g. by
 * `Image.resizeForVision`), with sides multiples of `patchSize · spatialMergeSize`.
 *
 * @category models
 * @since 0.1.0
 */
export interface Pixels {
  readonly data: Float32Array
  readonly width: number
  readonly height: number
}

/**
 * A decoded image (`Image.decode`, `MessageImages.decodeAll`) as the tower reads it: resized by {@link geometry}
 * and normalised (CLIP's mean and std unless given), channels first.
 *
 * @category constructors
 * @since 0.1.0
 */
export const toPixels = (
  v: VisionConfig,
  image: Pick<Image.Image, "ref" | "rgb">,
  normalisation: Image.VisionNormalisation = Image.clipNormalisation
): Pixels => {
  const { grid, pixels } = Image.resizeForVision(image, geometry(v), normalisation)
  return { data: pixels, width: grid.width, height: grid.height }
}

/**
 * The tower's inputs for a list of images (in the order their pad tokens appear in the batch, row by row), each
 * image's patches padded to the largest's count, so that attention runs per image (`[images, patches, patches]`
 * scores) and never across images.
 *
 * @category models
 * @since 0.1.0
 */
export interface VisionInputs {
  readonly images: number
  /** Patches per image, padded: the largest image's count. */
  readonly patches: number
  /** `[images, patches, C·tps·ps·ps]`, zeros on padding. */
  readonly pixels: Float32Array
  /** Each patch's grid row and column `[images, patches]` (0 on padding). */
  readonly rows: ReadonlyArray<number>
  readonly cols: ReadonlyArray<number>
  /** 1 on a real patch, 0 on padding `[images, patches]`. */
  readonly mask: ReadonlyArray<number>
  /** Merged (language-model) tokens per image. */
  readonly tokens: ReadonlyArray<number>
  /** Rows of the tower's output per image, `patches / m²`: image `i`'s tokens start at row `i · stride`. */
  readonly stride: number
}

/** One image's patches in Qwen2-VL's order, written at `out[at…]`, with their grid rows and columns. */
const patchesOf = (v: VisionConfig, image: Pixels, index: number, out: Float32Array, at: number) => {
  const ps = v.patchSize, m = v.spatialMergeSize, C = v.inChannels, tps = v.temporalPatchSize, K = patchDim(v)
  const { height: H, width: W } = image
  if (H % (ps * m) !== 0 || W % (ps * m) !== 0 || image.data.length !== C * H * W) {
    throw new Error(`image ${index}: ${W}×${H} is not a ${C}-channel image with sides multiples of ${ps * m}`)
  }
  const gh = H / ps, gw = W / ps, rows: Array<number> = [], cols: Array<number> = []
  for (let bh = 0; bh < gh / m; bh++) {
    for (let bw = 0; bw < gw / m; bw++) {
      for (let i = 0; i < m; i++) {
        for (let j = 0; j < m; j++) {
          const r = bh * m + i, q = bw * m + j
          let k = at + rows.length * K
          for (let c = 0; c < C; c++) {
            for (let t = 0; t < tps; t++) {
              for (let y = 0; y < ps; y++) {
                const from = c * H * W + (r * ps + y) * W + q * ps
                out.set(image.data.subarray(from, from + ps), k)
                k += ps
              }
            }
          }
          rows.push(r), cols.push(q)
        }
      }
    }
  }
  return { rows, cols }
}

/**
 * Cuts images into patches in Qwen2-VL's order: merge windows row by row, the `m × m` patches of a window
 * consecutive, each patch's values in the Conv3d kernel's order `[C, tps, ps, ps]` (an image repeated over `tps`
 * frames); then pads each image's patches to the largest count. Fails with a defect on an empty list or a side that
 * is not a multiple of `patchSize · spatialMergeSize`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const patchify = (v: VisionConfig, images: ReadonlyArray<Pixels>): VisionInputs => {
  if (images.length === 0) throw new Error("patchify: no image")
  const K = patchDim(v), ps = v.patchSize, m = v.spatialMergeSize
  const counts = images.map((i) => (i.width / ps) * (i.height / ps))
  const N = Math.max(...counts.map((n) => Math.ceil(n / (m * m)) * m * m))
  const pixels = new Float32Array(images.length * N * K)
  const rows = new Array<number>(images.length * N).fill(0), cols = [...rows], mask = [...rows]
  images.forEach((image, i) => {
    const grid = patchesOf(v, image, i, pixels, i * N * K)
    grid.rows.forEach((r, n) => {
      rows[i * N + n] = r
      cols[i * N + n] = grid.cols[n]!
      mask[i * N + n] = 1
    })
  })
  const tokens = counts.map((n) => n / (m * m))
  return { images: images.length, patches: N, pixels, rows, cols, mask, tokens, stride: N / (m * m) }
}

/**
 * The tower's graph inputs for `inputs` (module notes), as dtype, dims and data.
 *
 * @category constructors
 * @since 0.1.0
 */
export const inputFeeds = (v: VisionConfig, inputs: VisionInputs) => {
  const dims = [inputs.images, inputs.patches]
  return {
    pixel_patches: { dtype: "float32" as const, dims: [...dims, patchDim(v)], data: inputs.pixels },
    patch_rows: { dtype: "int64" as const, dims, data: inputs.rows },
    patch_cols: { dtype: "int64" as const, dims, data: inputs.cols },
    patch_mask: { dtype: "int64" as const, dims, data: inputs.mask }
  }
}

/**
 * `image_token_index [batch, seq]`: for each position holding `imageTokenId`, the merged token it takes (the
 * `k`-th token of image `i` is row `i · patches / m² + k` of the tower's output; pads are numbered in order, row by
 * row, across the batch), -1 elsewhere. Fails with a defect when the pads do not number the images' tokens.
 *
 * @category constructors
 * @since 0.1.0
 */
export const imageTokenIndex = (
  ids: ArrayLike<number>,
  imageTokenId: number,
  inputs: Pick<VisionInputs, "stride" | "tokens">
): Array<number> => {
  const { stride } = inputs
  const expected = inputs.tokens.reduce((a, b) => a + b, 0)
  let next = 0, image = 0, within = 0
  const index = Array.from(ids, (id) => {
    if (id !== imageTokenId || next++ >= expected) return -1
    while (within >= inputs.tokens[image]!) image++, within = 0
    return image * stride + within++
  })
  if (next !== expected) throw new Error(`${next} image pad tokens for ${expected} image tokens`)
  return index
}

// ===== The graph =====

const i64 = (g: Graph.Graph, values: ReadonlyArray<number>): string => g.constant(Graph.int64([values.length], values))
const f32 = (g: Graph.Graph, value: number): string => g.constant(Graph.float32([], [value]))

const linear = (g: Graph.Graph, x: string, w: string, b?: string): string => {
  const y = g.op("MatMul", [x, g.op("Transpose", [w], { perm: Graph.ints([1, 0]) })])
  return b === undefined ? y : g.op("Add", [y, b])
}

/** Each patch's rotary cos and sin `[images, 1, patches, hd]`: `[row, col, row, col]` angles, hd/4 frequencies each. */
const rotary = (g: Graph.Graph, v: VisionConfig, rows: string, cols: string) => {
  const hd = v.hiddenSize / v.numHeads, dim = hd / 2, quarter = hd / 4
  const cos = new Float32Array(v.maxGridSide * quarter), sin = new Float32Array(v.maxGridSide * quarter)
  for (let p = 0; p < v.maxGridSide; p++) {
    for (let j = 0; j < quarter; j++) {
      const angle = p / Math.pow(v.ropeTheta, (2 * j) / dim)
      cos[p * quarter + j] = Math.cos(angle)
      sin[p * quarter + j] = Math.sin(angle)
    }
  }
  const table = (data: Float32Array) => {
    const t = g.constant({ dtype: "float32", dims: [v.maxGridSide, quarter], data })
    const r = g.op("Gather", [t, rows], { axis: Graph.int(0) }), c = g.op("Gather", [t, cols], { axis: Graph.int(0) })
    return g.op("Unsqueeze", [g.op("Concat", [r, c, r, c], { axis: Graph.int(-1) }), i64(g, [1])])
  }
  return { cos: table(cos), sin: table(sin) }
}

type Param = (name: string) => string

/** Block `i` on `x [images, patches, w]`, attention within each image, its padding masked by `bias`. */
const block = (
  g: Graph.Graph,
  v: VisionConfig,
  i: number,
  x: string,
  rot: { readonly cos: string; readonly sin: string; readonly bias: string },
  param: Param
): string => {
  const p = `visual.blocks.${i}`, w = v.hiddenSize, H = v.numHeads, hd = w / H
  const h = Qwen2.rmsNorm(g, x, param(`${p}.norm1.weight`), v.rmsNormEps)
  const qkv = linear(g, h, param(`${p}.attn.qkv.weight`), param(`${p}.attn.qkv.bias`))
  const heads = (t: string) =>
    g.op("Transpose", [g.op("Reshape", [t, i64(g, [0, 0, H, hd])])], { perm: Graph.ints([0, 2, 1, 3]) })
  const [q, k, val] = g.opN("Split", [qkv], 3, { axis: Graph.int(-1) }).map(heads) as [string, string, string]
  const rq = Qwen2.rope(g, q, rot.cos, rot.sin, hd), rk = Qwen2.rope(g, k, rot.cos, rot.sin, hd)
  const scores = g.op("Mul", [
    g.op("MatMul", [rq, g.op("Transpose", [rk], { perm: Graph.ints([0, 1, 3, 2]) })]),
    f32(g, 1 / Math.sqrt(hd))
  ])
  const probs = g.op("Softmax", [g.op("Add", [scores, rot.bias])], { axis: Graph.int(-1) })
  const o = g.op("Transpose", [g.op("MatMul", [probs, val])], { perm: Graph.ints([0, 2, 1, 3]) })
  const lin = (n: string, t: string) => linear(g, t, param(`${p}.${n}.weight`), param(`${p}.${n}.bias`))
  const y = g.op("Add", [x, lin("attn.proj", g.op("Reshape", [o, i64(g, [0, 0, w])]))])
  const h2 = Qwen2.rmsNorm(g, y, param(`${p}.norm2.weight`), v.rmsNormEps)
  const gate = lin("mlp.gate_proj", h2)
  const act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), lin("mlp.up_proj", h2)])
  return g.op("Add", [y, lin("mlp.down_proj", act)])
}

/**
 * The tower on the vision inputs: merged tokens `[images · patches / m², D]` (D the language model's width; the
 * `k`-th token of image `i` is row `i · patches / m² + k`).
 *
 * @category math
 * @since 0.1.0
 */
export const tower = (g: Graph.Graph, vl: VlConfig, param: Param): string => {
  const v = vl.vision, K = patchDim(v), w = v.hiddenSize
  const patches = g.input("pixel_patches", "float32", ["images", "patches", K])
  const rows = g.input("patch_rows", "int64", ["images", "patches"])
  const cols = g.input("patch_cols", "int64", ["images", "patches"])
  const mask = g.input("patch_mask", "int64", ["images", "patches"])
  const kernel = g.op("Reshape", [param("visual.patch_embed.proj.weight"), i64(g, [w, K])])
  let x = linear(g, patches, kernel)
  // Keys of padding patches are masked ([images, 1, 1, patches]); their own outputs are never read.
  const real = g.op("Unsqueeze", [g.op("Cast", [mask], { to: Graph.int(Graph.dataTypeCode.bool) }), i64(g, [1, 2])])
  const rot = { ...rotary(g, v, rows, cols), bias: g.op("Where", [real, f32(g, 0), f32(g, -1e9)]) }
  for (let i = 0; i < v.depth; i++) x = block(g, v, i, x, rot, param)
  const normed = Qwen2.rmsNorm(g, x, param("visual.merger.ln_q.weight"), v.rmsNormEps)
  const grouped = g.op("Reshape", [normed, i64(g, [-1, w * v.spatialMergeSize ** 2])])
  const h = linear(g, grouped, param("visual.merger.mlp.0.weight"), param("visual.merger.mlp.0.bias"))
  // GELU in its tanh form (torch's `approximate="tanh"`, within 1e-3 of the exact one Qwen's merger uses):
  // onnxruntime has no float64 Erf, which the gradient checks run in.
  const cube = g.op("Mul", [g.op("Mul", [h, h]), h])
  const inner = g.op("Mul", [g.op("Add", [h, g.op("Mul", [cube, f32(g, 0.044715)])]), f32(g, Math.sqrt(2 / Math.PI))])
  const gelu = g.op("Mul", [g.op("Mul", [h, f32(g, 0.5)]), g.op("Add", [g.op("Tanh", [inner]), f32(g, 1)])])
  return linear(g, gelu, param("visual.merger.mlp.2.weight"), param("visual.merger.mlp.2.bias"))
}

/** Replaces the embeddings of image positions (`image_token_index ≥ 0`) by the merged tokens they index. */
const insert = (merged: string, index: string) => (g: Graph.Graph, embedded: string): string => {
  const isText = g.op("Less", [index, g.constant(Graph.int64([], [0]))])
  const safe = g.op("Where", [isText, g.constant(Graph.int64([], [0])), index])
  const image = g.op("Gather", [merged, safe], { axis: Graph.int(0) })
  return g.op("Where", [g.op("Unsqueeze", [isText, i64(g, [2])]), embedded, image])
}

/**
 * @category models
 * @since 0.1.0
 */
export interface VlForwardOptions extends Omit<Qwen2.ForwardOptions, "tokenEmbeddings" | "lora" | "head"> {
  /** `"trained"` (default): the tower's weights are `weightInputs`; `"frozen"`: graph inputs without gradients. */
  readonly tower?: "trained" | "frozen"
}

/**
 * Emits the vision-language forward into `g`: the text model's inputs and outputs ({@link Qwen2.forward}) plus the
 * vision inputs (module notes). The tower's weights are graph inputs or initializers as the text model's are.
 *
 * @category constructors
 * @since 0.1.0
 */
export const forward = (g: Graph.Graph, vl: VlConfig, options: VlForwardOptions): Qwen2.ForwardOutputs => {
  const specs = new Map(parameters(vl).map((s) => [s.name, s]))
  const towerInputs: Array<string> = []
  const param: Param = (name) => {
    const spec = specs.get(name)!
    if (g.initializers.has(name) || towerInputs.includes(name)) return name
    if (options.weights === "inputs") {
      towerInputs.push(name)
      return g.input(name, "float32", spec.shape)
    }
    const data = options.weights.get(name)
    const n = spec.shape.reduce((a, b) => a * b, 1)
    if (data === undefined || data.length !== n) {
      throw new Error(`weight ${name}: expected ${n} floats [${spec.shape.join(", ")}], got ${data?.length ?? "none"}`)
    }
    return g.initializer(name, { dtype: "float32", dims: spec.shape, data })
  }
  const tokenEmbeddings = (gr: Graph.Graph, embedded: string) => {
    const index = gr.input("image_token_index", "int64", ["batch", "seq"])
    return insert(tower(gr, vl, param), index)(gr, embedded)
  }
  const out = Qwen2.forward(g, vl.text, { ...options, tokenEmbeddings })
  return { ...out, weightInputs: options.tower === "frozen" ? out.weightInputs : [...out.weightInputs, ...towerInputs] }
}

/**
 * The learner's vision-language forward: no KV cache, weights as inputs, logits `[B, T, V]`. Train it with
 * `Autodiff.trainingGraph(…, { dims: { patches } })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const trainingGraph = (
  vl: VlConfig,
  tower: "trained" | "frozen" = "trained"
): { readonly graph: Graph.Graph } & Qwen2.ForwardOutputs => {
  const graph = Graph.make("qwen2_vl_train")
  return { graph, ...forward(graph, vl, { kvCache: false, weights: "inputs", tower }) }
}

/**
 * The sampler's prefill graph for requests with images: KV cache, last-position logits; its text-only twin is
 * {@link Qwen2.inferenceGraph}, which the same weights serve.
 *
 * @category constructors
 * @since 0.1.0
 */
export const inferenceGraph = (vl: VlConfig, weights: "inputs" | Qwen2.Weights): Graph.Graph => {
  const graph = Graph.make("qwen2_vl_decode")
  forward(graph, vl, { kvCache: true, weights, lastTokenOnly: true })
  return graph
}
