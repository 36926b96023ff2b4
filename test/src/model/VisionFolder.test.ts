import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ModelFolder from "../../../src/ModelFolder.ts"

/** Qwen2.5-VL-3B-Instruct's published `config.json` (transformers 4.49 layout). */
const qwen25vl3b = {
  architectures: ["Qwen2_5_VLForConditionalGeneration"],
  attention_dropout: 0,
  bos_token_id: 151643,
  eos_token_id: 151645,
  vision_start_token_id: 151652,
  vision_end_token_id: 151653,
  vision_token_id: 151654,
  image_token_id: 151655,
  video_token_id: 151656,
  hidden_act: "silu",
  hidden_size: 2048,
  initializer_range: 0.02,
  intermediate_size: 11008,
  max_position_embeddings: 128000,
  max_window_layers: 70,
  model_type: "qwen2_5_vl",
  num_attention_heads: 16,
  num_hidden_layers: 36,
  num_key_value_heads: 2,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000,
  sliding_window: 32768,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  use_cache: true,
  use_sliding_window: false,
  vision_config: {
    depth: 32,
    hidden_act: "silu",
    hidden_size: 1280,
    intermediate_size: 3420,
    num_heads: 16,
    in_chans: 3,
    out_hidden_size: 2048,
    patch_size: 14,
    spatial_merge_size: 2,
    spatial_patch_size: 14,
    window_size: 112,
    fullatt_block_indexes: [7, 15, 23, 31],
    tokens_per_second: 2,
    temporal_patch_size: 2
  },
  rope_scaling: { type: "mrope", mrope_section: [16, 24, 24] },
  vocab_size: 151936
}

const refusal = (config: Record<string, unknown>) =>
  Effect.gen(function*() {
    const dir = mkdtempSync(join(tmpdir(), "agentfly-vl-"))
    yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
    writeFileSync(join(dir, "config.json"), JSON.stringify(config))
    const error = yield* Effect.flip(ModelFolder.readConfig(dir))
    return error.message
  })

describe("a vision-language model folder", () => {
  it.effect("Qwen2.5-VL and Qwen2-VL are refused with one message: the architecture, why, and what is supported", () =>
    Effect.gen(function*() {
      const message = yield* refusal(qwen25vl3b)
      assert.include(message, `architectures "Qwen2_5_VLForConditionalGeneration" (model_type "qwen2_5_vl")`)
      assert.include(message, "window attention")
      assert.include(message, `M-RoPE (rope_scaling "mrope")`)
      assert.include(message, `preset "tiny-vl"`)
      assert.include(message, "Supported: Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM")
      // One reason, not the generic ones for each key (model_type, rope_scaling type).
      assert.notInclude(message, "is not supported (supported: qwen2")
      const qwen2vl = { ...qwen25vl3b, architectures: ["Qwen2VLForConditionalGeneration"], model_type: "qwen2_vl" }
      assert.include(yield* refusal(qwen2vl), `architectures "Qwen2VLForConditionalGeneration" (model_type "qwen2_vl")`)
      // A text Qwen2.5 folder's refusal for another architecture is unchanged.
      const other = yield* refusal({ ...qwen25vl3b, architectures: ["MistralForCausalLM"], model_type: "mistral" })
      assert.include(other, `model_type "mistral" is not supported (supported: qwen2, qwen3, llama)`)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
})
