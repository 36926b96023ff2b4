import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as ModelConfig from "../../../src/model/ModelConfig.ts"
import * as published from "./fixtures/publishedConfigs.ts"

/** The message a config is refused with (fails the test when it decodes). */
const refusal = (json: Record<string, unknown>) =>
  ModelConfig.decode(json).pipe(
    Effect.flip,
    Effect.map((e) => e.message),
    Effect.orElseSucceed(() => "decoded")
  )

describe("ModelConfig", () => {
  it.effect("Qwen2.5-0.5B/1.5B-Instruct's config.json decodes as published (window inactive, biases implied)", () =>
    Effect.gen(function*() {
      const c = yield* ModelConfig.decode(published.qwen25_05bInstruct)
      assert.deepStrictEqual(c, {
        modelType: "qwen2",
        vocabSize: 151936,
        hiddenSize: 896,
        numHiddenLayers: 24,
        numAttentionHeads: 14,
        numKeyValueHeads: 2,
        intermediateSize: 4864,
        maxPositionEmbeddings: 32768,
        ropeTheta: 1000000,
        rmsNormEps: 1e-6,
        tieWordEmbeddings: true,
        attentionBias: true,
        learnedPositions: false,
        bosTokenId: 151643,
        eosTokenId: 151645,
        torchDtype: "bfloat16",
        useSlidingWindow: false,
        slidingWindow: 32768,
        maxWindowLayers: 21
      })
      assert.strictEqual(ModelConfig.headDim(c), 64)
      const big = yield* ModelConfig.decode(published.qwen25_15bInstruct)
      assert.strictEqual(ModelConfig.headDim(big), 128)
      assert.strictEqual(big.numHiddenLayers, 28)
    }))

  it.effect("Qwen3-0.6B's head_dim is independent of the width, with q/k norms and no biases", () =>
    Effect.gen(function*() {
      const c = yield* ModelConfig.decode(published.qwen3_06b)
      assert.strictEqual(c.modelType, "qwen3")
      assert.strictEqual(c.hiddenSize, 1024)
      assert.strictEqual(ModelConfig.headDim(c), 128) // 1024 / 16 would be 64
      assert.isTrue(ModelConfig.hasQkNorm(c))
      assert.isFalse(c.attentionBias)
      assert.strictEqual(c.ropeScaling, null)
      assert.strictEqual(c.slidingWindow, null)
      // Without the key, Qwen3's default is no biases (Qwen2's is biases).
      const { attention_bias: _, ...withoutKey } = published.qwen3_06b
      assert.isFalse((yield* ModelConfig.decode(withoutKey)).attentionBias)
    }))

  it.effect("Llama-3.2-1B-Instruct keeps its llama3 rope scaling, eos list and head_dim; SmolLM2 decodes too", () =>
    Effect.gen(function*() {
      const c = yield* ModelConfig.decode(published.llama32_1bInstruct)
      assert.strictEqual(c.modelType, "llama")
      assert.deepStrictEqual(c.ropeScaling, {
        ropeType: "llama3",
        factor: 32,
        lowFreqFactor: 1,
        highFreqFactor: 4,
        originalMaxPositionEmbeddings: 8192
      })
      assert.deepStrictEqual(c.eosTokenId, [128001, 128008, 128009])
      assert.strictEqual(ModelConfig.headDim(c), 64)
      assert.isFalse(c.attentionBias)
      assert.isFalse(ModelConfig.hasQkNorm(c))
      const smol = yield* ModelConfig.decode(published.smolLm2_135mInstruct)
      assert.strictEqual(smol.ropeScaling, null)
      assert.strictEqual(ModelConfig.headDim(smol), 64)
      assert.strictEqual(smol.numKeyValueHeads, 3)
      assert.strictEqual(smol.ropeTheta, 100000)
    }))

  it.effect("toJson writes each family's own layout back, and it decodes to the same config", () =>
    Effect.gen(function*() {
      for (const json of Object.values(published)) {
        const c = yield* ModelConfig.decode(json)
        const written = ModelConfig.toJson(c, { torchDtype: "bfloat16" })
        const expected: Record<string, unknown> = { head_dim: json.hidden_size / json.num_attention_heads, ...json }
        for (const key of ["architectures", "model_type", "head_dim", "rope_scaling", "torch_dtype"] as const) {
          assert.deepStrictEqual(written[key], expected[key], `${json.model_type} ${key}`)
        }
        assert.deepStrictEqual(yield* ModelConfig.decode(JSON.parse(JSON.stringify(written))), c)
      }
    }))

  it("the presets' config.json is byte for byte what it was", () => {
    assert.strictEqual(
      JSON.stringify(ModelConfig.toJson(ModelConfig.presets.tiny)),
      `{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","vocab_size":288,"hidden_size":128,` +
        `"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":4,"intermediate_size":512,` +
        `"max_position_embeddings":512,"rope_theta":10000,"rms_norm_eps":0.000001,"tie_word_embeddings":false,` +
        `"attention_bias":true,"learned_position_embeddings":true,"head_dim":32,"hidden_act":"silu",` +
        `"torch_dtype":"float32"}`
    )
    for (const preset of Object.values(ModelConfig.presets)) {
      assert.strictEqual(ModelConfig.toJson(preset)["architectures"]?.toString(), "Qwen2ForCausalLM")
    }
  })

  it.effect("what the graph cannot compute is refused, naming the key, its value and what is supported", () =>
    Effect.gen(function*() {
      const qwen2 = published.qwen25_05bInstruct, qwen3 = published.qwen3_06b, llama = published.llama32_1bInstruct
      const cases: ReadonlyArray<[Record<string, unknown>, string]> = [
        [
          { ...qwen2, model_type: "mistral", architectures: ["MistralForCausalLM"] },
          `model_type "mistral" is not supported (supported: qwen2, qwen3, llama)`
        ],
        [
          { ...qwen2, architectures: ["Qwen2ForSequenceClassification"] },
          `architectures "Qwen2ForSequenceClassification" is not supported ` +
          `(supported: Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM)`
        ],
        [
          { ...qwen2, architectures: ["LlamaForCausalLM"] },
          `architectures "LlamaForCausalLM" does not match model_type "qwen2" (expected "Qwen2ForCausalLM")`
        ],
        [{ ...llama, hidden_act: "gelu" }, `hidden_act "gelu" is not supported (supported: silu)`],
        [{ ...llama, mlp_bias: true }, `mlp_bias true is not supported (supported: false)`],
        [
          { ...qwen3, attention_bias: true },
          `attention_bias true is not supported for model_type "qwen3" (supported: false)`
        ],
        [
          { ...llama, rope_scaling: { rope_type: "yarn", factor: 4, original_max_position_embeddings: 32768 } },
          `rope_scaling.rope_type "yarn" is not supported (supported: default, llama3)`
        ],
        [
          { ...qwen2, rope_scaling: { type: "linear", factor: 2 } },
          `rope_scaling.type "linear" is not supported (supported: default, llama3)`
        ],
        [
          { ...qwen3, rope_parameters: { rope_type: "default", rope_theta: 1000000 } },
          `rope_parameters {"rope_type":"default","rope_theta":1000000} is not supported ` +
          `(supported: rope_theta and rope_scaling, transformers 4's layout)`
        ],
        [
          { ...qwen2, use_sliding_window: true, sliding_window: 4096, max_window_layers: 12 },
          `use_sliding_window true is not supported: an active sliding_window 4096 is smaller than ` +
          `max_position_embeddings 32768 (supported: use_sliding_window false, or a window of at least ` +
          `max_position_embeddings)`
        ],
        [
          { ...qwen3, sliding_window: 4096, layer_types: ["full_attention", "sliding_attention"] },
          `layer_types ["full_attention","sliding_attention"] is not supported: an active sliding_window 4096 is ` +
          `smaller than max_position_embeddings 40960 (supported: use_sliding_window false, or a window of at ` +
          `least max_position_embeddings)`
        ],
        [
          { ...qwen3, layer_types: ["full_attention", "chunked_attention"] },
          `layer_types "chunked_attention" is not supported (supported: full_attention, sliding_attention)`
        ],
        [
          { ...llama, rope_scaling: { ...llama.rope_scaling, high_freq_factor: 1 } },
          `rope_scaling.high_freq_factor 1 must be greater than low_freq_factor 1`
        ]
      ]
      for (const [json, message] of cases) assert.include(yield* refusal(json), message)
    }))

  it.effect("a sliding window that is inactive, or covers every position, is accepted", () =>
    Effect.gen(function*() {
      const qwen2 = published.qwen25_05bInstruct
      // Qwen2.5's own window equals its positions: sliding changes nothing.
      yield* ModelConfig.decode({ ...qwen2, use_sliding_window: true })
      // Sliding starts at layer max_window_layers: none when it is past the last layer.
      yield* ModelConfig.decode({ ...qwen2, use_sliding_window: true, sliding_window: 4096, max_window_layers: 24 })
      yield* ModelConfig.decode({ ...qwen2, sliding_window: 4096 })
      const c = yield* ModelConfig.decode({ ...published.qwen3_06b, layer_types: Array(28).fill("full_attention") })
      assert.strictEqual(c.modelType, "qwen3")
      assert.strictEqual(yield* refusal({ ...qwen2, rope_scaling: { type: "default" } }), "decoded")
    }))
})
