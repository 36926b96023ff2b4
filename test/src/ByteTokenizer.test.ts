import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import * as TrajectoryBuilder from "../../src/TrajectoryBuilder.ts"

describe("ByteTokenizer", () => {
  it("has 256 distinct byte symbols and 9 default specials: V = 265", () => {
    assert.strictEqual(new Set(ByteTokenizer.byteSymbols).size, 256)
    assert.strictEqual(ByteTokenizer.byteSymbols[65], "A")
    assert.strictEqual(ByteTokenizer.byteSymbols[32], "Ġ")
    assert.strictEqual(ByteTokenizer.vocabSize(), 265)
    const json = ByteTokenizer.tokenizerJson() as {
      added_tokens: Array<{ id: number; content: string; special: boolean }>
    }
    assert.deepStrictEqual(
      json.added_tokens.map((t) => [t.id, t.content]),
      ByteTokenizer.defaultSpecialTokens.map((t, i) => [256 + i, t])
    )
    assert.isTrue(json.added_tokens.find((t) => t.content === "<|im_end|>")!.special)
    assert.isFalse(json.added_tokens.find((t) => t.content === "<tool_call>")!.special)
  })

  it.effect("writes a Hugging Face style folder that Tokenizer.load and ChatTemplate.load read back", () =>
    Effect.gen(function*() {
      const dir = join(mkdtempSync(join(tmpdir(), "agentfly-byte-")), "model")
      yield* ByteTokenizer.writeModelFiles(dir)
      const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"))
      assert.strictEqual(config.chat_template, ChatTemplate.templates.chatml)
      assert.strictEqual(config.eos_token, "<|im_end|>")
      assert.strictEqual(config.pad_token, "<|endoftext|>")
      const tokenizer = yield* Tokenizer.load(dir)
      const template = yield* ChatTemplate.load(dir)
      assert.strictEqual(template.endOfTurn, "<|im_end|>")
      assert.strictEqual(template.toolCallFormat, "hermes")
      const messages = [{ role: "user" as const, content: "2+2=?" }]
      const builder = yield* TrajectoryBuilder.start({ tokenizer, template, messages })
      const ids = TrajectoryBuilder.promptTokenIds(builder)
      assert.deepStrictEqual(ids.slice(0, 1), [257])
      assert.strictEqual(tokenizer.decode(ids), "<|im_start|>user\n2+2=?<|im_end|>\n<|im_start|>assistant\n")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("custom specials and eos (e.g. a Llama-style set) get ids after the bytes", () =>
    Effect.gen(function*() {
      const options = { specialTokens: ["<|begin_of_text|>", "<|eot_id|>"], eosToken: "<|eot_id|>" }
      const tokenizer = yield* Tokenizer.make(
        ByteTokenizer.tokenizerJson(options),
        ByteTokenizer.tokenizerConfig("", options)
      )
      assert.strictEqual(tokenizer.vocabSize, 258)
      assert.strictEqual(tokenizer.eosTokenId, 257)
      assert.deepStrictEqual(tokenizer.encode("<|begin_of_text|>hi<|eot_id|>"), [256, 104, 105, 257])
    }))
})
