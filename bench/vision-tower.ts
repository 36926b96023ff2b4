/**
 * `npm run bench -- vision-tower`: what the `tiny-vl` tower costs the learner and the engine's prefill, against the
 * `tiny` text model on the same tokens in the same run.
 *
 * - Learner: one float32 training step (forward, SFT loss, every gradient; AdamW excluded, it is the same code per
 *   parameter) of batch 8 × 64 tokens, each row a 64×64 image (16 pad tokens) then text, against the text graph
 *   on the same ids. CPU time per step (one intra-op thread), median of interleaved rounds.
 * - Engine: a prefill of one such prompt through the vision session against the text session.
 *
 * Headline: the training step with images ÷ without (no target in issue 47; ≤ 1.5 set here).
 */
import * as ort from "onnxruntime-node"
import * as Autodiff from "../src/autodiff/Autodiff.ts"
import * as Loss from "../src/Loss.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as VisionTower from "../src/model/VisionTower.ts"
import * as Graph from "../src/onnx/Graph.ts"
import * as Sampling from "../src/Sampling.ts"
import { Effect } from "effect"
import type { BenchResult } from "./run.ts"

const B = 8, T = 64, PAD = 266, ROUNDS = 15
const vl = VisionTower.presets["tiny-vl"], c = vl.text
const count = (specs: ReadonlyArray<Qwen2.ParameterSpec>) =>
  specs.reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0)
const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

const int64 = (values: ReadonlyArray<number>, dims: ReadonlyArray<number>) =>
  new ort.Tensor("int64", BigInt64Array.from(values, (v) => BigInt(v)), dims)
const f32 = (values: ArrayLike<number>, dims: ReadonlyArray<number>) =>
  new ort.Tensor("float32", Float32Array.from(values), dims)

const options: ort.InferenceSession.SessionOptions = { intraOpNumThreads: 1, interOpNumThreads: 1 }

/** Rows of 16 image pads (a 64×64 image) after 4 text tokens, then text, and their images' tower inputs. */
const data = (rows: number, length: number) => {
  const r = Sampling.rng(7)
  const ids = Array.from({ length: rows * length }, (_, i) => {
    const t = i % length
    return t >= 4 && t < 20 ? PAD : Math.floor(r.next() * 256)
  })
  const images = Array.from({ length: rows }, () => ({
    width: 64,
    height: 64,
    data: Float32Array.from({ length: 3 * 64 * 64 }, () => r.next() * 2 - 1)
  }))
  return { ids, inputs: VisionTower.patchify(vl.vision, images) }
}

const visionFeeds = (inputs: VisionTower.VisionInputs, ids: ReadonlyArray<number>, dims: ReadonlyArray<number>) => {
  const tower = VisionTower.inputFeeds(vl.vision, inputs)
  return {
    pixel_patches: new ort.Tensor("float32", tower.pixel_patches.data, tower.pixel_patches.dims),
    patch_rows: int64(tower.patch_rows.data, tower.patch_rows.dims),
    patch_cols: int64(tower.patch_cols.data, tower.patch_cols.dims),
    patch_mask: int64(tower.patch_mask.data, tower.patch_mask.dims),
    image_token_index: int64(VisionTower.imageTokenIndex(ids, PAD, inputs), dims)
  }
}

/** CPU milliseconds of `run`, median over interleaved rounds, for each named runner. */
const timeAll = async (runners: Record<string, () => Promise<unknown>>) => {
  const times: Record<string, Array<number>> = Object.fromEntries(Object.keys(runners).map((k) => [k, []]))
  for (const run of Object.values(runners)) await run() // warm-up
  for (let round = 0; round < ROUNDS; round++) {
    for (const [name, run] of Object.entries(runners)) {
      const before = process.cpuUsage()
      await run()
      const used = process.cpuUsage(before)
      times[name]!.push((used.user + used.system) / 1000)
    }
  }
  return Object.fromEntries(Object.entries(times).map(([k, v]) => [k, median(v)]))
}

const trainingSessions = async () => {
  const build = (forward: Autodiff.Forward, dims?: Record<string, number>) =>
    Effect.runPromise(Autodiff.trainingGraph(forward, {
      batch: B,
      length: T,
      loss: Loss.sft,
      ...(dims === undefined ? {} : { dims })
    }))
  const { ids, inputs } = data(B, T)
  const text = await build(Qwen2.trainingGraph(c))
  const vision = await build(VisionTower.trainingGraph(vl), { images: inputs.images, patches: inputs.patches })
  const weights = VisionTower.initWeights(vl, 1)
  const common: Record<string, ort.Tensor> = {
    input_ids: int64(ids, [B, T]),
    attention_mask: int64(ids.map(() => 1), [B, T]),
    position_ids: int64(ids.map((_, i) => i % T), [B, T]),
    targets: int64(ids.map((_, i) => ids[i + 1] ?? 0), [B, T]),
    loss_weights: f32(ids.map((_, i) => (i % T >= 20 ? 1 / (B * 44) : 0)), [B, T]),
    loss_mask: f32(ids.map((_, i) => (i % T >= 20 ? 1 : 0)), [B, T])
  }
  const feeds = (specs: ReadonlyArray<Qwen2.ParameterSpec>) =>
    Object.fromEntries(specs.map((s) => [s.name, new ort.Tensor("float32", weights.get(s.name)!, s.shape)]))
  const textSession = await ort.InferenceSession.create(Graph.toModelBytes(text.graph), options)
  const visionSession = await ort.InferenceSession.create(Graph.toModelBytes(vision.graph), options)
  const textFeeds = { ...common, ...feeds(Qwen2.parameters(c)) }
  const allFeeds = { ...common, ...feeds(VisionTower.allParameters(vl)), ...visionFeeds(inputs, ids, [B, T]) }
  return { text: () => textSession.run(textFeeds), vision: () => visionSession.run(allFeeds) }
}

const prefillSessions = async () => {
  const { ids, inputs } = data(1, T)
  const weights = VisionTower.initWeights(vl, 1)
  const past = Object.fromEntries(Array.from({ length: c.numHiddenLayers }, (_, l) =>
    ["key", "value"].map((kv) => [`past.${l}.${kv}`, f32([], [1, c.numKeyValueHeads, 0, ModelConfig.headDim(c)])])
  ).flat())
  const common = {
    ...past,
    input_ids: int64(ids, [1, T]),
    attention_mask: int64(ids.map(() => 1), [1, T]),
    position_ids: int64(ids.map((_, i) => i), [1, T])
  }
  const text = await ort.InferenceSession.create(Graph.toModelBytes(Qwen2.inferenceGraph(c, weights)), options)
  const visionGraph = VisionTower.inferenceGraph(vl, weights)
  const vision = await ort.InferenceSession.create(Graph.toModelBytes(visionGraph), options)
  const visionFeed = { ...common, ...visionFeeds(inputs, ids, [1, T]) }
  return { text: () => text.run(common), vision: () => vision.run(visionFeed) }
}

export default async (): Promise<BenchResult> => {
  const train = await trainingSessions()
  const step = await timeAll({ text: train.text, vision: train.vision })
  const prefill = await prefillSessions()
  const pre = await timeAll({ text: prefill.text, vision: prefill.vision })
  const ratio = step["vision"]! / step["text"]!
  return {
    headline: {
      metric: "tiny-vl training step with a 64×64 image per row ÷ text-only step",
      value: ratio,
      target: 1.5,
      better: "lower"
    },
    parameters: { text: count(Qwen2.parameters(c)), tower: count(VisionTower.parameters(vl)) },
    batch: { rows: B, tokens: T, imageTokensPerRow: 16, patchesPerRow: 64 },
    trainingStepCpuMs: step,
    prefillCpuMs: pre,
    prefillRatio: pre["vision"]! / pre["text"]!
  }
}
