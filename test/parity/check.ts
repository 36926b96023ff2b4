/** The parity check every family runs: export with our exporter, score the same ids in both engines, compare. */
import { Console, Effect, FileSystem } from "effect"
import { readFileSync } from "node:fs"
import { join } from "node:path"
import * as Gguf from "../../src/Gguf.ts"
import type * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Sampling from "../../src/Sampling.ts"
import type * as Tokenizer from "../../src/Tokenizer.ts"
import { argmax, llama, llamaScores, loadModel, logSoftmax, ours, peakedWeights } from "./engines.ts"

export interface ParityCase {
  readonly name: string
  readonly config: ModelConfig.ModelConfig
  readonly configJson: Record<string, unknown>
  readonly tokenizerDir: string
  readonly tokenizer: Tokenizer.Tokenizer
  readonly file: string
  readonly weightStd: { readonly std: number; readonly headStd: number }
}

const text = "<|im_start|>user\nWrite `fib(n)` in Python, then say 你好 and 🎉 twice.<|im_end|>\n" +
  "<|im_start|>assistant\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"

/** ≥ 64 ids: a chat-shaped text as the tokenizer cuts it, then seeded random ids of the base vocabulary to 80. */
export const scoredIds = (tokenizer: Tokenizer.Tokenizer, baseVocab: number): Array<number> => {
  const ids = tokenizer.encode(text).slice(0, 80)
  const r = Sampling.rng(41)
  while (ids.length < 80) ids.push(Math.floor(r.next() * baseVocab))
  return ids
}

/** Our exporter's GGUF F32 of the case's model (a scope of its own: the metadata's token arrays die with it). */
const exportGguf = Effect.fnUntraced(function*(p: ParityCase, weights: ReadonlyMap<string, Float32Array>) {
  const contents = yield* Gguf.fromHf({
    name: p.name,
    config: p.configJson,
    tensors: Qwen2.parameters(p.config).map((s) => ({ name: s.name, shape: s.shape, data: weights.get(s.name)! })),
    tokenizer: JSON.parse(readFileSync(join(p.tokenizerDir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(readFileSync(join(p.tokenizerDir, "tokenizer_config.json"), "utf8"))
  }, p.file)
  yield* Gguf.write(p.file, contents, "F32")
})

export const checkParity = Effect.fn("checkParity")(function*(p: ParityCase) {
  const fs = yield* FileSystem.FileSystem
  const weights = peakedWeights(Qwen2.parameters(p.config), 7, p.weightStd)
  yield* exportGguf(p, weights)
  assert(yield* fs.exists(p.file))
  const ids = scoredIds(p.tokenizer, 128000)
  // llama.cpp first, its model disposed before ours runs: the two engines' copies of the weights never coexist.
  const reference = yield* Effect.scoped(Effect.gen(function*() {
    const model = yield* loadModel(yield* llama, p.file)
    return yield* llamaScores(model, ids, 10, 32)
  }))
  const engine = yield* ours(p.config, weights)
  const logits = yield* engine.logits(ids)
  const oursGreedy = yield* engine.greedy(ids, 32)
  const maxLseDiff = engine.maxLseDiff()
  yield* engine.release
  const V = p.config.vocabSize
  let top1Mismatches = 0, maxLogprobDiff = 0
  for (let t = 0; t < ids.length; t++) {
    const row = logits.subarray(t * V, (t + 1) * V)
    const lp = logSoftmax(row)
    const top = reference.tops[t]!
    if (argmax(row) !== top.tokens[0]) top1Mismatches++
    top.tokens.forEach((token, k) => {
      maxLogprobDiff = Math.max(maxLogprobDiff, Math.abs(lp[token]! - top.logprobs[k]!))
    })
  }
  yield* Console.log(
    `${p.name}: ${ids.length} positions, top-1 mismatches ${top1Mismatches}, max |Δ logprob| ` +
      `${maxLogprobDiff.toExponential(2)}, top-1 p ≈ ${Math.exp(reference.tops[0]!.logprobs[0]!).toFixed(3)}, ` +
      `greedy ${oursGreedy.join(",") === reference.continuation.join(",") ? "identical" : "differs"}, ` +
      `decode graph's log-sum-exp within ${maxLseDiff.toExponential(1)} of JavaScript's`
  )
  return {
    positions: ids.length,
    top1Mismatches,
    maxLogprobDiff,
    maxLseDiff,
    oursGreedy,
    llamaGreedy: reference.continuation
  }
})

function assert(condition: boolean): asserts condition {
  if (!condition) throw new Error("the GGUF file was not written")
}
