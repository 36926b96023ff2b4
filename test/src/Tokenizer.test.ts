import * as NodeServices from "@effect/platform-node/NodeServices"
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import fc from "fast-check"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import { Qwen } from "../utils/qwen.ts"

const specials = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "<|endoftext|>"]
// Text mixing special tokens with arbitrary unicode (CJK, emoji, whitespace runs, JSON-ish punctuation).
const mixedText = fc.array(
  fc.oneof(
    fc.constantFrom(...specials),
    fc.string({ unit: "binary", maxLength: 12 }),
    fc.constantFrom("\n", "\n\n", "  ", " \n", "{\"a\": 1}", "你好", "é", "🙂", "assistant\n")
  ),
  { maxLength: 12 }
).map((parts) => parts.join(""))

/** The reference cut: a regular expression over the added tokens, longest first, as Hugging Face matches them. */
const splitByRegExp = (tokenizer: Tokenizer.Tokenizer, text: string): Array<string> => {
  const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")
  const tokens = [...tokenizer.addedTokens.keys()].sort((a, b) => b.length - a.length)
  return text.split(new RegExp(`(${tokens.map(escape).join("|")})`)).filter((piece) => piece.length > 0)
}

layer(Qwen.layer)("Tokenizer (real Qwen tokenizer.json)", (it) => {
  it.effect("added tokens are single ids; encode adds no BOS; decode round-trips a rendered chat", () =>
    Effect.gen(function*() {
      const { tokenizer } = yield* Qwen
      assert.strictEqual(tokenizer.vocabSize, 151669)
      assert.deepStrictEqual(tokenizer.encode("<|im_start|>user\nhi<|im_end|>"), [151644, 872, 198, 6023, 151645])
      assert.strictEqual(tokenizer.tokenToId("<tool_call>"), 151657)
      assert.strictEqual(tokenizer.eosToken, "<|im_end|>")
      assert.strictEqual(tokenizer.eosTokenId, 151645)
      assert.deepStrictEqual(tokenizer.encode(""), [])
      const text = "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"é 你好\"}}\n" +
        "</tool_call><|im_end|>"
      assert.strictEqual(tokenizer.decode(tokenizer.encode(text)), text)
    }))

  it.effect("encoding the pieces split at added tokens equals encoding the whole text (property)", () =>
    Effect.gen(function*() {
      const { tokenizer } = yield* Qwen
      fc.assert(
        fc.property(mixedText, (text) => {
          const whole = tokenizer.encode(text)
          const pieces = tokenizer.splitAdded(text)
          assert.strictEqual(pieces.join(""), text)
          assert.deepStrictEqual(pieces.flatMap((p) => tokenizer.encode(p)), whole)
          assert.deepStrictEqual(pieces, splitByRegExp(tokenizer, text))
          const encoded = tokenizer.encodePieces(text)
          assert.deepStrictEqual(encoded.ids, whole)
          assert.deepStrictEqual(encoded.textEnds, pieces.map((_, i) => pieces.slice(0, i + 1).join("").length))
          const ends = pieces.map((_, i) => pieces.slice(0, i + 1).flatMap((p) => tokenizer.encode(p)).length)
          assert.deepStrictEqual(encoded.idEnds, ends)
        }),
        { numRuns: 200, seed: 42 }
      )
    }))

  it.effect("bad ids: validateIds fails with InvalidTokenId, decode marks them instead of throwing", () =>
    Effect.gen(function*() {
      const { tokenizer } = yield* Qwen
      const error = yield* Effect.flip(Tokenizer.validateIds(tokenizer, [1, 2, 151669]))
      assert.strictEqual(error.reason._tag, "InvalidTokenId")
      assert.match(error.message, /151669 at position 2/)
      const bad = yield* Tokenizer.validateIds(tokenizer, [1, 2, 151669]).pipe(
        Effect.as(undefined),
        Effect.catchReason("TokenizerError", "InvalidTokenId", ({ id, position }) => Effect.succeed({ id, position }))
      )
      assert.deepStrictEqual(bad, { id: 151669, position: 2 })
      yield* Tokenizer.validateIds(tokenizer, [0, 151668])
      assert.strictEqual(tokenizer.decode([9707, -1, 1.5, 1e9, 9707]), "Hello\uFFFD\uFFFD\uFFFDHello")
      assert.strictEqual(tokenizer.idToToken(-3), undefined)
    }))
})

describe("Tokenizer (byte-level tokenizer.json)", () => {
  const tokenizer = Effect.runSync(Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig("")))

  it("is 256 bytes (id = byte) plus the specials as single tokens", () => {
    assert.strictEqual(tokenizer.vocabSize, 265)
    assert.deepStrictEqual(tokenizer.encode("A\n"), [65, 10])
    assert.deepStrictEqual(tokenizer.encode("é"), [0xc3, 0xa9])
    assert.deepStrictEqual(tokenizer.encode("<|im_start|>x<tool_call><think>"), [257, 120, 259, 263])
    assert.strictEqual(tokenizer.eosTokenId, 258)
  })

  it("round-trips any UTF-8 text exactly, one id per byte outside specials (property)", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary", maxLength: 200 }), (text) => {
        const ids = tokenizer.encode(text)
        assert.strictEqual(tokenizer.decode(ids), text)
        if (!specials.some((s) => text.includes(s))) {
          assert.strictEqual(ids.length, new TextEncoder().encode(text).length)
        }
      }),
      { numRuns: 200, seed: 7 }
    )
  })

  it("long texts: ASCII read directly past the decoder's 4,096-byte chunks, and a non-ASCII tail after it", () => {
    const ascii = Array.from({ length: 10_000 }, (_, i) => String.fromCharCode(32 + (i % 95))).join("")
    assert.deepStrictEqual(tokenizer.encode(ascii), [...new TextEncoder().encode(ascii)])
    assert.strictEqual(tokenizer.decode(tokenizer.encode(ascii)), ascii)
    const mixed = ascii.slice(0, 5_000) + "é 你好 🙂" + ascii.slice(0, 5_000)
    assert.deepStrictEqual(tokenizer.encode(mixed), [...new TextEncoder().encode(mixed)])
    assert.strictEqual(tokenizer.decode(tokenizer.encode(mixed)), mixed)
  })

  it("encodes and decodes natively exactly as the Hugging Face tokenizer of the same tokenizer.json (property)", () => {
    const hf = new HfTokenizer(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig(""))
    const options = { skip_special_tokens: false, clean_up_tokenization_spaces: false }
    fc.assert(
      fc.property(
        mixedText,
        // Any ids of the vocabulary: split and invalid UTF-8 sequences, specials between the bytes of a character.
        fc.array(fc.oneof(fc.integer({ min: 0, max: 264 }), fc.constantFrom(0xe4, 0xbd, 0xa0, 0xf0, 0x9f)), {
          minLength: 1,
          maxLength: 40
        }),
        (text, ids) => {
          assert.deepStrictEqual(tokenizer.encode(text), hf.encode(text, { add_special_tokens: false }).ids)
          assert.deepStrictEqual(tokenizer.splitAdded(text), splitByRegExp(tokenizer, text))
          assert.deepStrictEqual(tokenizer.encodePieces(text).ids, tokenizer.encode(text))
          assert.strictEqual(tokenizer.decode(ids), hf.decode(ids, options))
        }
      ),
      { numRuns: 2000, seed: 16 }
    )
  })
})

describe("Tokenizer.load errors", () => {
  const run = <A, E>(effect: Effect.Effect<A, E, any>) => Effect.provide(effect, NodeServices.layer)

  it.effect("a missing folder, malformed JSON and a non-tokenizer each give their reason", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "agentfly-tok-"))
      const missing = yield* Effect.flip(run(Tokenizer.load(join(dir, "nope"))))
      assert.strictEqual(missing.reason._tag, "NotFound")
      writeFileSync(join(dir, "tokenizer.json"), "{ not json")
      assert.strictEqual((yield* Effect.flip(run(Tokenizer.load(dir)))).reason._tag, "InvalidJson")
      writeFileSync(join(dir, "tokenizer.json"), JSON.stringify({ hello: 1 }))
      assert.strictEqual((yield* Effect.flip(run(Tokenizer.load(dir)))).reason._tag, "InvalidTokenizer")
      writeFileSync(join(dir, "tokenizer.json"), JSON.stringify({ model: { type: "Nonsense" } }))
      assert.strictEqual((yield* Effect.flip(run(Tokenizer.load(dir)))).reason._tag, "InvalidTokenizer")
      const stripping = ByteTokenizer.tokenizerJson() as { added_tokens: Array<Record<string, unknown>> }
      stripping.added_tokens[0]!.lstrip = true
      const rejected = yield* Effect.flip(Tokenizer.make(stripping))
      assert.strictEqual(rejected.reason._tag, "InvalidTokenizer")
      assert.include(rejected.message, "lstrip")
    }))

  it.effect("loads a folder written by ByteTokenizer.writeModelFiles", () =>
    Effect.gen(function*() {
      const dir = join(mkdtempSync(join(tmpdir(), "agentfly-tok-")), "tiny")
      yield* run(ByteTokenizer.writeModelFiles(dir))
      const tokenizer = yield* run(Tokenizer.load(dir))
      assert.strictEqual(tokenizer.vocabSize, 265)
      assert.strictEqual(tokenizer.padToken, "<|endoftext|>")
    }))
})
