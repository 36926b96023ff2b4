import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as ort from "onnxruntime-node"
import * as EngineModel from "../../../actors/internal/engineModel.ts"
import * as ModelConfig from "../../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import * as Graph from "../../../src/onnx/Graph.ts"
import * as Sampling from "../../../src/Sampling.ts"
import { randomWeights, tinyConfig } from "../../utils/tinyModel.ts"

/** Qwen2.5-1.5B's published shapes: 1.54 B parameters, 6.2 GB of float32, over onnxruntime's 2 GB model limit. */
const qwen15b: ModelConfig.ModelConfig = {
  ...ModelConfig.presets.medium,
  vocabSize: 151936,
  hiddenSize: 1536,
  numHiddenLayers: 28,
  numAttentionHeads: 12,
  numKeyValueHeads: 2,
  intermediateSize: 8960,
  maxPositionEmbeddings: 32768,
  ropeTheta: 1000000,
  tieWordEmbeddings: true,
  attentionBias: true
}

const options: ort.InferenceSession.SessionOptions = { executionProviders: ["cpu"], intraOpNumThreads: 1 }

/** Last-position logits of one decode-graph run over `ids` with an empty cache. */
const logits = (session: ort.InferenceSession, c: ModelConfig.ModelConfig, ids: ReadonlyArray<number>,
  weights?: Qwen2.Weights) =>
  Effect.promise(async () => {
    const feeds = emptyCacheFeeds(c, ids)
    for (const spec of weights === undefined ? [] : Qwen2.parameters(c)) {
      feeds[spec.name] = new ort.Tensor("float32", weights!.get(spec.name)!, spec.shape)
    }
    return Float32Array.from((await session.run(feeds))["logits"]!.data as Float32Array)
  })

/** The feeds of a decode step over `ids` with an empty cache. */
const emptyCacheFeeds = (c: ModelConfig.ModelConfig, ids: ReadonlyArray<number>): Record<string, ort.Tensor> => {
  const T = ids.length, hd = ModelConfig.headDim(c)
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, T]),
    attention_mask: new ort.Tensor("int64", new BigInt64Array(T).fill(1n), [1, T]),
    position_ids: new ort.Tensor("int64", BigInt64Array.from(ids, (_, i) => BigInt(i)), [1, T])
  }
  for (let l = 0; l < c.numHiddenLayers; l++) {
    for (const kv of ["key", "value"]) {
      feeds[`past.${l}.${kv}`] = new ort.Tensor("float32", new Float32Array(0), [1, c.numKeyValueHeads, 0, hd])
    }
  }
  return feeds
}

const create = (bytes: Uint8Array, extra: Partial<ort.InferenceSession.SessionOptions> = {}) =>
  Effect.promise(() => ort.InferenceSession.create(bytes, { ...options, ...extra }))

const maxAbsDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i]!)), 0)

describe("engineModel", () => {
  it("a model over onnxruntime's 2 GB limit is built from its config alone: no weight bytes in the protobuf", () => {
    const parameterBytes = EngineModel.parameterCount(qwen15b) * 4
    assert.isAbove(parameterBytes, 6e9)
    for (const weightsAs of ["initializers", "inputs"] as const) {
      const bytes = EngineModel.modelBytes(qwen15b, weightsAs)
      // What remains is the graph and its RoPE tables (32,768 positions × 128 × 2 floats = 33.5 MB).
      assert.isBelow(bytes.length, 40e6)
      assert.strictEqual(EngineModel.modelBytes(qwen15b, weightsAs), bytes) // built once per config
    }
  })

  for (const tied of [true, false]) {
    it.effect(`external initializers and fed weights give the baked model's logits (tied head: ${tied})`, () =>
      Effect.gen(function*() {
        const c = tinyConfig({ tieWordEmbeddings: tied })
        const w = randomWeights(c, 3)
        const ids = [1, 5, 9, 2, 33]
        const baked = yield* logits(yield* create(Graph.toModelBytes(Qwen2.inferenceGraph(c, w))), c, ids)
        const external = yield* create(EngineModel.modelBytes(c, "initializers"), {
          externalData: EngineModel.externalData(c, w)
        })
        assert.isBelow(maxAbsDiff(yield* logits(external, c, ids), baked), 1e-5)
        const fed = yield* create(EngineModel.modelBytes(c, "inputs"))
        assert.isBelow(maxAbsDiff(yield* logits(fed, c, ids, w), baked), 1e-5)
      }))
  }

  it("models of 50 M parameters and more decode with fused kernels and products, small presets their old graph", () => {
    const ops = (bytes: Uint8Array) => new TextDecoder("latin1").decode(bytes)
    assert.isTrue(Qwen2.isLarge(qwen15b))
    assert.isTrue(Qwen2.isLarge(ModelConfig.presets.medium))
    assert.isFalse(Qwen2.isLarge(ModelConfig.presets.small))
    assert.isFalse(Qwen2.isLarge(ModelConfig.presets.tiny))
    for (const weightsAs of ["initializers", "inputs"] as const) {
      assert.include(ops(EngineModel.modelBytes(qwen15b, weightsAs)), "SimplifiedLayerNormalization")
      assert.include(ops(EngineModel.modelBytes(qwen15b, weightsAs)), "logsumexp")
      assert.notInclude(ops(EngineModel.modelBytes(ModelConfig.presets.small, weightsAs)), "logsumexp")
    }
    // A large model's initializers are multiplied as `FusedMatMul(x, W, transB = 1)`: no transposed copy to fold.
    assert.include(ops(EngineModel.modelBytes(qwen15b, "initializers")), "FusedMatMul")
    assert.notInclude(ops(EngineModel.modelBytes(ModelConfig.presets.small, "initializers")), "FusedMatMul")
  })

  for (const qkNorm of [false, true]) {
    it.effect(`the fused kernels give the plain graph's logits and each row's log-sum-exp (q/k norms: ${qkNorm})`, () =>
      Effect.gen(function*() {
        const c = tinyConfig(qkNorm ? { modelType: "qwen3", attentionBias: false } : {})
        const w = randomWeights(c, 5)
        const ids = [4, 8, 15, 16, 23, 42]
        const plain = yield* logits(yield* create(Graph.toModelBytes(Qwen2.inferenceGraph(c, w))), c, ids)
        const fused = yield* create(Graph.toModelBytes(Qwen2.inferenceGraph(c, w, undefined, false, true)))
        assert.isBelow(maxAbsDiff(yield* logits(fused, c, ids), plain), 1e-5)
        const lse = yield* Effect.promise(() => fused.run(emptyCacheFeeds(c, ids)))
        const got = (lse["logsumexp"]!.data as Float64Array)[0]!
        assert.isBelow(Math.abs(got - Sampling.logSumExp(lse["logits"]!.data as Float32Array)), 1e-12)
      }))
  }

  it.effect("the session owns its weights: views into one buffer work, and later writes to them change nothing", () =>
    Effect.gen(function*() {
      const c = tinyConfig({ tieWordEmbeddings: true })
      const w = randomWeights(c, 4)
      // The learner's arrays may be views into one buffer; copy them into such a layout at odd offsets.
      const total = [...w.values()].reduce((n, a) => n + a.length + 3, 0)
      const buffer = new Float32Array(total)
      let offset = 0
      const views = new Map<string, Float32Array>()
      for (const [name, a] of w) {
        offset += 3
        const view = buffer.subarray(offset, offset + a.length)
        view.set(a)
        views.set(name, view)
        offset += a.length
      }
      const ids = [7, 3, 3, 8]
      const baked = yield* logits(yield* create(Graph.toModelBytes(Qwen2.inferenceGraph(c, w))), c, ids)
      const session = yield* create(EngineModel.modelBytes(c, "initializers"), {
        externalData: EngineModel.externalData(c, views)
      })
      assert.isBelow(maxAbsDiff(yield* logits(session, c, ids), baked), 1e-5)
      buffer.fill(0.5) // the learner's next optimizer step writes its arrays in place
      assert.isBelow(maxAbsDiff(yield* logits(session, c, ids), baked), 1e-5)
    }))

  it.effect("engines loading the same weights as the same version share one session, released with its last user", () =>
    Effect.gen(function*() {
      const created: Array<{ released: number }> = []
      const create = () => {
        const s = { released: 0, release: () => Promise.resolve(void s.released++) }
        created.push(s)
        return Promise.resolve(s as unknown as ort.InferenceSession)
      }
      const fail = (e: unknown) => e
      const w = new Map<string, Float32Array>(), other = new Map<string, Float32Array>()
      const a = yield* EngineModel.acquireSession(w, 3, "k", create, fail)
      const b = yield* EngineModel.acquireSession(w, 3, "k", create, fail)
      assert.strictEqual(created.length, 1)
      assert.strictEqual(a.session, b.session)
      // Another version, other options or another map: a session of its own.
      yield* EngineModel.acquireSession(w, 4, "k", create, fail)
      yield* EngineModel.acquireSession(w, 3, "other options", create, fail)
      yield* EngineModel.acquireSession(other, 3, "k", create, fail)
      assert.strictEqual(created.length, 4)
      yield* a.unload
      assert.strictEqual(created[0]!.released, 0)
      yield* b.unload
      assert.strictEqual(created[0]!.released, 1)
      // Once released, the next engine of that version loads it again.
      yield* EngineModel.acquireSession(w, 3, "k", create, fail)
      assert.strictEqual(created.length, 5)
    }))

  it.effect("a failed load fails every engine waiting for it, and the next attempt loads again", () =>
    Effect.gen(function*() {
      let attempts = 0
      const create = () => {
        attempts++
        return attempts === 1 ? Promise.reject(new Error("no")) : Promise.resolve({} as ort.InferenceSession)
      }
      const w = new Map<string, Float32Array>()
      const failure = yield* Effect.flip(EngineModel.acquireSession(w, 0, "k", create, (e) => String(e)))
      assert.strictEqual(failure, "Error: no")
      yield* EngineModel.acquireSession(w, 0, "k", create, (e) => String(e))
      assert.strictEqual(attempts, 2)
    }))
})
