/** Helpers for gradient checks: run a graph on onnxruntime-node and compare with central finite differences. */
import { Effect } from "effect"
import * as ort from "onnxruntime-node"
import * as Graph from "../../src/onnx/Graph.ts"

export interface Feed {
  readonly dtype: "float64" | "float32" | "int64"
  readonly dims: ReadonlyArray<number>
  readonly data: ArrayLike<number>
}

const tensor = (f: Feed): ort.Tensor =>
  f.dtype === "int64"
    ? new ort.Tensor("int64", BigInt64Array.from(Array.from(f.data), (v) => BigInt(v)), [...f.dims])
    : f.dtype === "float64"
    ? new ort.Tensor("float64", Float64Array.from(f.data), [...f.dims])
    : new ort.Tensor("float32", Float32Array.from(f.data), [...f.dims])

export const session = (graph: Graph.Graph) =>
  Effect.promise(() => ort.InferenceSession.create(Graph.toModelBytes(graph), { graphOptimizationLevel: "disabled" }))

/** Rows `[start, end)` of the feed `of`, fed as `name` (`Autodiff.TrainingGraph.views`). */
export interface View {
  readonly name: string
  readonly of: string
  readonly start: number
  readonly end: number
}

/** Runs `s` on `feeds`, plus `views` of them (taken from the feeds of this run, perturbed or not). */
export const runWith = (
  s: ort.InferenceSession,
  feeds: Readonly<Record<string, Feed>>,
  views: ReadonlyArray<View> = []
) =>
  Effect.promise(async () => {
    const t: Record<string, ort.Tensor> = {}
    for (const [k, f] of Object.entries(feeds)) t[k] = tensor(f)
    for (const v of views) {
      const w = feeds[v.of]!
      const columns = w.dims[1]!
      const rows = Array.from(w.data).slice(v.start * columns, v.end * columns)
      t[v.name] = tensor({ dtype: w.dtype, dims: [v.end - v.start, columns], data: rows })
    }
    const out = await s.run(t)
    const result: Record<string, Float64Array> = {}
    for (const [k, v] of Object.entries(out)) result[k] = Float64Array.from(v.data as ArrayLike<number>)
    return result
  })

/** Deterministic pseudo-random numbers in [-1, 1). */
export const noise = (n: number, seed: number): Array<number> => {
  let s = seed >>> 0
  return Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0
    return (s / 2 ** 32) * 2 - 1
  })
}

/**
 * Checks `grad.<name>` of every input in `wrt` against central differences of `loss`, on up to `samples` elements
 * per input. Returns the worst relative error max|Δ| / (max|g| + 1e-12) per input.
 */
export const check = (
  s: ort.InferenceSession,
  feeds: Readonly<Record<string, Feed>>,
  wrt: ReadonlyArray<string>,
  options: {
    readonly h?: number
    readonly samples?: number
    readonly gradName?: (w: string) => string
    readonly views?: ReadonlyArray<View>
  } = {}
) =>
  Effect.gen(function*() {
    const h = options.h ?? 1e-6
    const gradName = options.gradName ?? ((w: string) => `grad.${w}`)
    const views = options.views ?? []
    const base = yield* runWith(s, feeds, views)
    const worst: Record<string, number> = {}
    for (const w of wrt) {
      const feed = feeds[w]!
      const analytic = base[gradName(w)]!
      const n = feed.data.length
      const samples = options.samples ?? n
      const picks = samples >= n ? Array.from({ length: n }, (_, i) => i) : noise(samples, n + w.length).map((u) =>
        Math.floor(((u + 1) / 2) * n)
      )
      let maxDiff = 0
      let maxGrad = 0
      for (const i of picks) {
        const plus = Array.from(feed.data)
        const minus = Array.from(feed.data)
        plus[i] = plus[i]! + h
        minus[i] = minus[i]! - h
        const lp = (yield* runWith(s, { ...feeds, [w]: { ...feed, data: plus } }, views))["loss"]![0]!
        const lm = (yield* runWith(s, { ...feeds, [w]: { ...feed, data: minus } }, views))["loss"]![0]!
        const numeric = (lp - lm) / (2 * h)
        maxDiff = Math.max(maxDiff, Math.abs(numeric - analytic[i]!))
        maxGrad = Math.max(maxGrad, Math.abs(analytic[i]!), Math.abs(numeric))
      }
      worst[w] = maxDiff / (maxGrad + 1e-12)
    }
    return { worst, base }
  })

/**
 * The inputs of a training graph's gradient check on one fixed batch of 2 rows × 5 tokens (the second row padded
 * at its end): ids, attention, positions, targets, token-mean loss weights and mask, and small noise for any other
 * loss input (`lossInputs`: advantages, sampler logprobs, …). The weights are the caller's to add.
 */
export const batchFeeds = (
  lossInputs: ReadonlyArray<string>,
  positionIds: (attention: ReadonlyArray<number>) => ArrayLike<number>,
  aggregationWeights: (mask: Uint8Array, batch: number, length: number) => ArrayLike<number>
): Record<string, Feed> => {
  const B = 2, T = 5
  const attention = [1, 1, 1, 1, 1, 0, 1, 1, 1, 1]
  const mask = Uint8Array.from({ length: B * T }, (_, i) => (i % T === 0 || attention[i] === 0 ? 0 : 1))
  const feeds: Record<string, Feed> = {
    input_ids: { dtype: "int64", dims: [B, T], data: [3, 1, 4, 1, 5, 0, 9, 2, 6, 12] },
    attention_mask: { dtype: "int64", dims: [B, T], data: attention },
    position_ids: {
      dtype: "int64",
      dims: [B, T],
      data: [...Array.from(positionIds(attention.slice(0, T))), ...Array.from(positionIds(attention.slice(T)))]
    },
    targets: { dtype: "int64", dims: [B, T], data: [1, 4, 1, 5, 9, 0, 2, 6, 12, 7] },
    loss_weights: { dtype: "float64", dims: [B, T], data: Array.from(aggregationWeights(mask, B, T)) },
    loss_mask: { dtype: "float64", dims: [B, T], data: Array.from(mask) }
  }
  for (const k of lossInputs) {
    feeds[k] ??= { dtype: "float64", dims: [B, T], data: noise(B * T, k.length).map((v) => 0.1 * v) }
  }
  return feeds
}
