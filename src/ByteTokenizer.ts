/**
 * A byte-level `tokenizer.json` for the small embedded policy: ids 0–255 are the 256 bytes (id = byte value),
 * followed by the chat template's special tokens as single tokens. With the default ChatML/Qwen2.5-style specials
 * the vocabulary has 265 entries. Any UTF-8 text round-trips exactly; there are no merges, so a token is a byte.
 *
 * The generated files have the shape of a Hugging Face model folder (`tokenizer.json`, `tokenizer_config.json`
 * with `chat_template`, `eos_token`, `pad_token`), so `Tokenizer.load` and `ChatTemplate.load` read them like any
 * downloaded model.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Path } from "effect"
import * as ChatTemplate from "./ChatTemplate.ts"

/**
 * The default special tokens (ids 256–264): ChatML turn markers, Hermes tool-call tags and Qwen3 think tags.
 *
 * @category constants
 * @since 0.1.0
 */
export const defaultSpecialTokens: ReadonlyArray<string> = [
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<tool_call>",
  "</tool_call>",
  "<tool_response>",
  "</tool_response>",
  "<think>",
  "</think>"
]

/**
 * The special tokens of a byte-level vision preset: the defaults, then Qwen2-VL's image tokens
 * (`<|vision_start|>` 265, `<|image_pad|>` 266, `<|vision_end|>` 267; `ChatTemplate.qwenVisionTokens`).
 *
 * @category constants
 * @since 0.1.0
 */
export const visionSpecialTokens: ReadonlyArray<string> = [
  ...defaultSpecialTokens,
  "<|vision_start|>",
  "<|image_pad|>",
  "<|vision_end|>"
]

/**
 * GPT-2's printable stand-in for each byte: the symbols byte-level BPE vocabularies are written in.
 *
 * @category constants
 * @since 0.1.0
 */
export const byteSymbols: ReadonlyArray<string> = (() => {
  const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)
  const out: Array<string> = []
  let next = 256
  for (let b = 0; b < 256; b++) out.push(String.fromCodePoint(printable(b) ? b : next++))
  return out
})()

/**
 * Options of a byte-level tokenizer.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Special tokens after the 256 bytes, in id order. Default: `defaultSpecialTokens`. */
  readonly specialTokens?: ReadonlyArray<string>
  /** End-of-sequence token (must be one of the specials). Default: `<|im_end|>`. */
  readonly eosToken?: string
  /** Padding token (must be one of the specials). Default: `<|endoftext|>`. */
  readonly padToken?: string
}

const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false } as const

/**
 * The `tokenizer.json` object. Specials that are control tokens (`<|…|>`) are marked `special`, the tags
 * (`<tool_call>`, `<think>`, ...) are not, as in Qwen's own tokenizer.
 *
 * @category constructors
 * @since 0.1.0
 */
export const tokenizerJson = (options: Options = {}): Record<string, unknown> => {
  const specials = options.specialTokens ?? defaultSpecialTokens
  const vocab: Record<string, number> = {}
  byteSymbols.forEach((symbol, byte) => {
    vocab[symbol] = byte
  })
  const added = specials.map((content, i) => ({
    id: 256 + i,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: content.startsWith("<|")
  }))
  for (const token of added) vocab[token.content] = token.id
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: null,
    decoder: byteLevel,
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: []
    }
  }
}

/**
 * The `tokenizer_config.json` object, with the chat template embedded as `chat_template`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const tokenizerConfig = (chatTemplate: string, options: Options = {}): Record<string, unknown> => ({
  tokenizer_class: "PreTrainedTokenizerFast",
  add_bos_token: false,
  add_prefix_space: false,
  bos_token: null,
  eos_token: options.eosToken ?? "<|im_end|>",
  pad_token: options.padToken ?? "<|endoftext|>",
  unk_token: null,
  clean_up_tokenization_spaces: false,
  model_max_length: 1 << 20,
  chat_template: chatTemplate
})

/**
 * Vocabulary size for the given specials (265 with the defaults).
 *
 * @category getters
 * @since 0.1.0
 */
export const vocabSize = (options: Options = {}): number => 256 + (options.specialTokens ?? defaultSpecialTokens).length

/**
 * Writes `tokenizer.json` and `tokenizer_config.json` into `dir` (created if missing). The template defaults to
 * the built-in `chatml` template.
 *
 * @category constructors
 * @since 0.1.0
 */
export const writeModelFiles = Effect.fn("ByteTokenizer.writeModelFiles")(function*(
  dir: string,
  options: Options & { readonly chatTemplate?: string } = {}
) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  yield* fs.makeDirectory(dir, { recursive: true })
  yield* fs.writeFileString(path.join(dir, "tokenizer.json"), JSON.stringify(tokenizerJson(options)))
  yield* fs.writeFileString(
    path.join(dir, "tokenizer_config.json"),
    JSON.stringify(tokenizerConfig(options.chatTemplate ?? ChatTemplate.templates.chatml, options), null, 2)
  )
})
