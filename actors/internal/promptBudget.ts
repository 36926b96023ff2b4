/**
 * What a request of the OpenAI-compatible server may cost in tokens, checked before the work it bounds
 * (`OpenAiServer.ts`, "Limits"): a prompt is tokenized only as far as its limit ({@link encodeWithin}), and a
 * request's tokens are its prompts' plus `max_tokens` per prompt ({@link asked}).
 *
 * @since 0.1.0
 */
import type { ModelConfig } from "../../src/model/ModelConfig.ts"
import type { SamplingParams } from "../../src/Sampler.ts"
import type * as Tokenizer from "../../src/Tokenizer.ts"
import { invalid } from "./openAiWire.ts"

/**
 * The most characters one token can stand for. A vocabulary's token strings are at least as long as the text they
 * decode to (byte-level BPE writes one character per byte, SentencePiece `▁` per space, byte fallback `<0xNN>` per
 * byte); the factor 4 covers normalizers that shorten text before it is split (NFC composes at most 3 code units
 * into one).
 *
 * @category getters
 * @since 0.1.0
 */
export const charsPerTokenBound = (tokenizer: Tokenizer.Tokenizer): number => {
  let longest = 1
  for (let id = 0; id < tokenizer.vocabSize; id++) longest = Math.max(longest, tokenizer.idToToken(id)?.length ?? 0)
  for (const token of tokenizer.addedTokens.keys()) longest = Math.max(longest, token.length)
  return 4 * longest
}

/** Texts longer than this are counted in pieces of about `piece` characters before they are tokenized whole. */
const piece = 4096

const isSpace = (c: string | undefined) => c === undefined || /\s/.test(c)

/**
 * Where to cut `text` near `at`: at a space between two non-spaces, where the pre-tokenizers of GPT-2-style
 * byte-level BPE (Qwen, Llama 3) and SentencePiece split anyway, so the pieces' tokens are the whole text's; else
 * (a run of `piece / 2` characters without such a space) right at `at`, keeping surrogate pairs whole.
 */
const cutNear = (text: string, at: number): { readonly at: number; readonly exact: boolean } => {
  for (let i = at; i > at - piece / 2; i--) {
    if (text[i] === " " && !isSpace(text[i - 1]) && !isSpace(text[i + 1])) return { at: i, exact: true }
  }
  const code = text.charCodeAt(at)
  return { at: code >= 0xdc00 && code <= 0xdfff ? at - 1 : at, exact: false }
}

/**
 * The token ids of `text` if there are at most `limit`, else a count known to exceed it (`exact: false`: a lower
 * bound). A text longer than `limit × charsPerToken` is refused from its length; one longer than two pieces is
 * first tokenized piece by piece, stopping as soon as the count passes `limit` (with a slack of 16 tokens per cut
 * that is not at a space, where a piece's tokens may differ from the whole text's). Only a text within the limit
 * is tokenized whole, so a 4 MB prompt costs at most about `limit` tokens' worth of tokenizing.
 *
 * **Gotchas**: a single word of hundreds of thousands of letters is still slow to tokenize within the limit
 * (@huggingface/tokenizers' BPE is quadratic in a word's length); the body limit bounds it.
 *
 * @category validation
 * @since 0.1.0
 */
export const encodeWithin = (
  tokenizer: Tokenizer.Tokenizer,
  charsPerToken: number,
  text: string,
  limit: number
): { readonly ids: ReadonlyArray<number> } | { readonly over: number; readonly exact: boolean } => {
  const lower = Math.ceil(text.length / charsPerToken)
  if (lower > limit) return { over: lower, exact: false }
  if (text.length > 2 * piece) {
    let count = 0, slack = 0
    for (let from = 0; from < text.length;) {
      const cut = from + piece >= text.length ? { at: text.length, exact: true } : cutNear(text, from + piece)
      count += tokenizer.encode(text.slice(from, cut.at)).length
      if (!cut.exact) slack += 16
      if (count > limit + slack) return { over: count - slack, exact: false }
      from = cut.at
    }
  }
  const ids = tokenizer.encode(text)
  return ids.length > limit ? { over: ids.length, exact: true } : { ids }
}

/**
 * What a prompt of `n` known tokens adds to a request's token budget: its tokens and its completion's.
 *
 * @category getters
 * @since 0.1.0
 */
export const asked = (config: ModelConfig, sampling: SamplingParams, promptTokens: number) =>
  promptTokens + Math.min(sampling.maxTokens, config.maxPositionEmbeddings)

/**
 * A 400 for a request over `max` tokens (`exact: false`: at least `n`).
 *
 * @category errors
 * @since 0.1.0
 */
export const tooManyTokens = (n: number, exact: boolean, max: number, param: string) =>
  invalid(
    `the request asks for ${exact ? "" : "at least "}${n} tokens (its prompts' tokens plus max_tokens per prompt); ` +
      `this server takes at most ${max} per request`,
    param
  )

/**
 * A 400 for a prompt longer than the context.
 *
 * @category errors
 * @since 0.1.0
 */
export const overContext = (n: number, exact: boolean, config: ModelConfig, param: string) =>
  invalid(
    `the prompt has ${exact ? "" : "at least "}${n} tokens; the context holds ${config.maxPositionEmbeddings}`,
    param
  )
