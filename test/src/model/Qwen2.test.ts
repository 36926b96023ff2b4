import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import * as ort from "onnxruntime-node"
import * as ModelConfig from "../../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import * as Graph from "../../../src/onnx/Graph.ts"
import * as Sampling from "../../../src/Sampling.ts"
import { referenceLogits } from "../../utils/referenceQwen2.ts"

const config = (overrides: Partial<ModelConfig.ModelConfig> = {}): ModelConfig.ModelConfig => ({
  ...ModelConfig.presets.tiny,
  vocabSize: 61,
  hiddenSize: 32,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  intermediateSize: 48,
  maxPositionEmbeddings: 64,
  ...overrides
})

/** Random weights with non-trivial norms and biases, large enough that argmax is well separated. */
const weights = (c: ModelConfig.ModelConfig, seed: number): Qwen2.Weights => {
  const w = Qwen2.initWeights(c, seed, 0.25)
  const r = Sampling.rng(seed + 1)
  for (const [name, data] of w) {
    if (name.endsWith("bias")) for (let i = 0; i < data.length; i++) data[i] = Sampling.normal(r) * 0.3
    if (name.endsWith("norm.weight")) for (let i = 0; i < data.length; i++) data[i] = 1 + Sampling.normal(r) * 0.2
  }
  return w
}

const i64 = (values: ReadonlyArray<number>, dims: ReadonlyArray<number>) =>
  new ort.Tensor("int64", BigInt64Array.from(values, BigInt), dims)

const session = (g: Graph.Graph) => Effect.promise(() => ort.InferenceSession.create(Graph.toModelBytes(g)))

const trainingLogits = Effect.fnUntraced(function*(
  s: ort.InferenceSession,
  c: ModelConfig.ModelConfig,
  w: Qwen2.Weights,
  rows: ReadonlyArray<ReadonlyArray<number>>,
  masks: ReadonlyArray<ReadonlyArray<number>>
) {
  const B = rows.length, T = rows[0]!.length
  const feeds: Record<string, ort.Tensor> = {
    input_ids: i64(rows.flat(), [B, T]),
    attention_mask: i64(masks.flat(), [B, T]),
    position_ids: i64(masks.flatMap(Qwen2.positionIds), [B, T])
  }
  for (const spec of Qwen2.parameters(c)) feeds[spec.name] = new ort.Tensor("float32", w.get(spec.name)!, spec.shape)
  const out = yield* Effect.promise(() => s.run(feeds))
  return out["logits"]!.data as Float32Array
})

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!))
  return m
}

/** `[1, KV, P, hd]` ++ `[1, KV, T, hd]` along the slot axis. */
const appendSlots = (past: ort.Tensor, fresh: ort.Tensor, KV: number, hd: number): ort.Tensor => {
  const P = past.dims[2]!, T = fresh.dims[2]!
  const a = past.data as Float32Array, b = fresh.data as Float32Array
  const out = new Float32Array(KV * (P + T) * hd)
  for (let h = 0; h < KV; h++) {
    out.set(a.subarray(h * P * hd, (h + 1) * P * hd), h * (P + T) * hd)
    out.set(b.subarray(h * T * hd, (h + 1) * T * hd), (h * (P + T) + P) * hd)
  }
  return new ort.Tensor("float32", out, [1, KV, P + T, hd])
}

describe("Qwen2", () => {
  it.effect("the training graph equals a plain-loop reference forward pass (GQA, biases, untied head)", () =>
    Effect.gen(function*() {
      for (const c of [config(), config({ tieWordEmbeddings: false, numKeyValueHeads: 1 })]) {
        const w = weights(c, 7)
        const { graph, weightInputs } = Qwen2.trainingGraph(c)
        assert.deepStrictEqual(Graph.problems(graph), [])
        assert.deepStrictEqual([...weightInputs].sort(), Qwen2.parameters(c).map((p) => p.name).sort())
        const ids = [3, 17, 5, 60, 0, 42, 9, 9, 31]
        const logits = yield* trainingLogits(yield* session(graph), c, w, [ids], [ids.map(() => 1)])
        const ref = referenceLogits(c, w, ids)
        ref.forEach((row, t) => {
          const got = Sampling.logSoftmax(logits.subarray(t * c.vocabSize, (t + 1) * c.vocabSize))
          assert.isBelow(maxAbsDiff(got, Sampling.logSoftmax(row)), 1e-4, `position ${t}`)
        })
      }
    }))

  it.effect("left padding does not change the logits of real tokens", () =>
    Effect.gen(function*() {
      const c = config(), w = weights(c, 3)
      const s = yield* session(Qwen2.trainingGraph(c).graph)
      const a = [5, 8, 13, 21, 34, 55], b = [2, 4, 8]
      const batched = yield* trainingLogits(s, c, w, [a, [0, 0, 0, ...b]], [[1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]])
      const alone = yield* trainingLogits(s, c, w, [b], [[1, 1, 1]])
      const V = c.vocabSize
      assert.isBelow(maxAbsDiff(batched.subarray(9 * V, 12 * V), alone), 1e-4)
    }))

  it.effect("KV-cache greedy decoding equals full recomputation, token for token", () =>
    Effect.gen(function*() {
      const c = config(), w = weights(c, 11), V = c.vocabSize, hd = ModelConfig.headDim(c)
      const full = yield* session(Qwen2.trainingGraph(c).graph)
      const cached = yield* session(Qwen2.inferenceGraph(c, w))
      const prompt = [1, 2, 3, 4, 5]
      // Reference: recompute the whole sequence each step.
      const reference = [...prompt]
      for (let step = 0; step < 24; step++) {
        const T = reference.length
        const logits = yield* trainingLogits(full, c, w, [reference], [reference.map(() => 1)])
        reference.push(Sampling.argmax(logits.subarray((T - 1) * V, T * V)))
      }
      // KV cache: prefill, then one token per step.
      const seq = [...prompt]
      let past: Record<string, ort.Tensor> = {}
      for (let l = 0; l < c.numHiddenLayers; l++) {
        for (const n of ["key", "value"]) {
          past[`past.${l}.${n}`] = new ort.Tensor("float32", new Float32Array(0), [1, c.numKeyValueHeads, 0, hd])
        }
      }
      let input = prompt
      for (let step = 0; step < 24; step++) {
        const out = yield* Effect.promise(() =>
          cached.run({
            ...past,
            input_ids: i64(input, [1, input.length]),
            attention_mask: i64(seq.map(() => 1), [1, seq.length]),
            position_ids: i64(input.map((_, i) => seq.length - input.length + i), [1, input.length])
          })
        )
        const logits = out["logits"]!
        assert.deepStrictEqual(logits.dims, [1, 1, V])
        const next = Sampling.argmax(logits.data as Float32Array)
        seq.push(next)
        input = [next]
        // The graph returns the new tokens' keys and values only; the caller appends them to its cache.
        const appended: Record<string, ort.Tensor> = {}
        for (let l = 0; l < c.numHiddenLayers; l++) {
          for (const n of ["key", "value"]) {
            const old = past[`past.${l}.${n}`]!, fresh = out[`new.${l}.${n}`]!
            assert.deepStrictEqual(fresh.dims, [1, c.numKeyValueHeads, step === 0 ? prompt.length : 1, hd])
            appended[`past.${l}.${n}`] = appendSlots(old, fresh, c.numKeyValueHeads, hd)
          }
        }
        past = appended
      }
      assert.deepStrictEqual(seq, reference)
      assert.isAbove(new Set(seq.slice(prompt.length)).size, 1) // a degenerate constant output would prove little
    }))

  it.effect("cache slots the attention mask leaves out change nothing (the engine's cache has holes)", () =>
    Effect.gen(function*() {
      const c = config(), w = weights(c, 5), hd = ModelConfig.headDim(c), KV = c.numKeyValueHeads
      const cached = yield* session(Qwen2.inferenceGraph(c, w))
      const prompt = [3, 1, 4, 1, 5, 9]
      const empty: Record<string, ort.Tensor> = {}
      for (let l = 0; l < c.numHiddenLayers; l++) {
        for (const n of ["key", "value"]) {
          empty[`past.${l}.${n}`] = new ort.Tensor("float32", new Float32Array(0), [1, KV, 0, hd])
        }
      }
      const pre = yield* Effect.promise(() =>
        cached.run({
          ...empty,
          input_ids: i64(prompt, [1, prompt.length]),
          attention_mask: i64(prompt.map(() => 1), [1, prompt.length]),
          position_ids: i64(prompt.map((_, i) => i), [1, prompt.length])
        })
      )
      // The same cache twice: contiguous, and with 3 slots of junk after the prompt, masked out.
      const holes = 3, P = prompt.length
      const contiguous: Record<string, ort.Tensor> = {}, withHoles: Record<string, ort.Tensor> = {}
      for (let l = 0; l < c.numHiddenLayers; l++) {
        for (const n of ["key", "value"]) {
          const fresh = pre[`new.${l}.${n}`]!
          contiguous[`past.${l}.${n}`] = fresh
          const data = new Float32Array(KV * (P + holes) * hd).fill(7.5)
          const src = fresh.data as Float32Array
          for (let h = 0; h < KV; h++) data.set(src.subarray(h * P * hd, (h + 1) * P * hd), h * (P + holes) * hd)
          withHoles[`past.${l}.${n}`] = new ort.Tensor("float32", data, [1, KV, P + holes, hd])
        }
      }
      const step = (past: Record<string, ort.Tensor>, mask: ReadonlyArray<number>) =>
        Effect.promise(() =>
          cached.run({
            ...past,
            input_ids: i64([2], [1, 1]),
            attention_mask: i64(mask, [1, mask.length]),
            position_ids: i64([P], [1, 1])
          })
        )
      const a = yield* step(contiguous, [...prompt.map(() => 1), 1])
      const b = yield* step(withHoles, [...prompt.map(() => 1), 0, 0, 0, 1])
      const la = a["logits"]!.data as Float32Array, lb = b["logits"]!.data as Float32Array
      for (let i = 0; i < la.length; i++) assert.closeTo(lb[i]!, la[i]!, 1e-5)
      assert.deepStrictEqual(a["new.0.key"]!.data, b["new.0.key"]!.data)
    }))

  it("the graphs use exactly the documented op set (the learner's autodiff contract)", () => {
    const documented = [...Qwen2.forwardOps.differentiable, ...Qwen2.forwardOps.nonDifferentiable].sort()
    const ops = (g: Graph.Graph) => [...new Set(g.nodes.map((n) => n.op))].sort()
    const training = ops(Qwen2.trainingGraph(config()).graph)
    const inference = Qwen2.inferenceGraph(config(), "inputs")
    // The decoding graph adds Concat and Slice (scores over the cache and the new tokens; the last position) and
    // Identity (the new keys and values as outputs) to the training graph's ops.
    assert.deepStrictEqual(ops(inference), documented)
    assert.deepStrictEqual(training, documented.filter((op) => !["Concat", "Slice", "Identity"].includes(op)))
    assert.deepStrictEqual(inference.outputs.map((o) => o.name), [
      "new.0.key",
      "new.0.value",
      "new.1.key",
      "new.1.value",
      "logits"
    ])
  })

  it("seeded initialisation is deterministic and covers every parameter with the right size", () => {
    const c = config({ tieWordEmbeddings: false })
    const a = Qwen2.initWeights(c, 42), b = Qwen2.initWeights(c, 42), d = Qwen2.initWeights(c, 43)
    for (const spec of Qwen2.parameters(c)) {
      assert.strictEqual(a.get(spec.name)!.length, spec.shape.reduce((x, y) => x * y, 1))
      assert.deepStrictEqual(a.get(spec.name), b.get(spec.name))
    }
    assert.notDeepEqual(a.get("lm_head.weight"), d.get("lm_head.weight"))
    const e = a.get("model.embed_tokens.weight")!
    const std = Math.sqrt(e.reduce((s, v) => s + v * v, 0) / e.length)
    assert.closeTo(std, 0.02, 0.002)
    assert.strictEqual(a.get("model.layers.1.self_attn.k_proj.weight")!.length, 2 * 8 * 32)
  })

  it.effect("config.json decodes with Hugging Face keys and defaults, and bad shapes are typed errors", () =>
    Effect.gen(function*() {
      const json = ModelConfig.toJson(ModelConfig.presets.tiny)
      assert.strictEqual(json["hidden_size"], 128)
      assert.strictEqual(json["model_type"], "qwen2")
      const back = yield* ModelConfig.decode(JSON.parse(JSON.stringify(json)))
      assert.deepStrictEqual(back, ModelConfig.presets.tiny)
      const minimal = yield* ModelConfig.decode({
        model_type: "qwen2",
        vocab_size: 10,
        hidden_size: 8,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        intermediate_size: 16,
        max_position_embeddings: 32
      })
      assert.strictEqual(minimal.ropeTheta, 10000)
      assert.strictEqual(minimal.attentionBias, true)
      const bad = yield* Effect.exit(ModelConfig.decode({ ...json, num_key_value_heads: 3 }))
      assert.isTrue(Exit.isFailure(bad))
      assert.match(String(Exit.isFailure(bad) ? bad.cause : ""), /num_key_value_heads 3/)
    }))
})
