/**
 * Tokenizers backed by a Hugging Face `tokenizer.json` (`@huggingface/tokenizers`): the real Qwen / Llama
 * tokenizers of a model folder, and the byte-level tokenizer that `ByteTokenizer` generates for the embedded policy.
 *
 * A `Tokenizer` is a value, not a service: a process may hold several (the policy's, a judge's). Loading can fail
 * (missing file, malformed JSON, an unsupported model type) and returns a typed `TokenizerError`; once loaded,
 * `encode` and `decode` are pure, synchronous and total.
 *
 * `encode` never adds special tokens (no BOS): chat templates write every special token themselves, so the text a
 * template renders maps to exactly its tokens. Added tokens (`<|im_start|>`, `<tool_call>`, ...) are always single
 * tokens, and the text is cut at them before the model runs, which is what lets `TrajectoryBuilder` tokenize an
 * observation suffix on its own and still get the ids of the whole text.
 *
 * @since 0.1.0
 */
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers"
import { Effect, FileSystem, Option, Path, Result, Schema } from "effect"

// ===== Errors =====

/**
 * A file (`tokenizer.json`) is missing or cannot be read.
 *
 * @category errors
 * @since 0.1.0
 */
export class NotFound extends Schema.TaggedError<NotFound>()("NotFound", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * A file is not JSON.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidJson extends Schema.TaggedError<InvalidJson>()("InvalidJson", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The JSON is not a tokenizer the runtime understands.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidTokenizer extends Schema.TaggedError<InvalidTokenizer>()("InvalidTokenizer", {
  message: Schema.String
}) {}

/**
 * An id outside the vocabulary, or not an integer.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidTokenId extends Schema.TaggedError<InvalidTokenId>()("InvalidTokenId", {
  message: Schema.String,
  /** The id. */
  id: Schema.Number,
  /** Its position in the ids given. */
  position: Schema.Int
}) {}

/**
 * Why a tokenizer could not be loaded or used.
 *
 * @category errors
 * @since 0.1.0
 */
export const TokenizerErrorReason = Schema.Union([NotFound, InvalidJson, InvalidTokenizer, InvalidTokenId])
export type TokenizerErrorReason = typeof TokenizerErrorReason.Type

/**
 * A tokenizer could not be loaded or used. `message` is the reason's. Handle reasons with
 * `Effect.catchReason("TokenizerError", "NotFound", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class TokenizerError extends Schema.TaggedError<TokenizerError>()("TokenizerError", {
  reason: TokenizerErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `tokenizerError`; a reason left out is a compile error. */
const reasons = { NotFound, InvalidJson, InvalidTokenizer, InvalidTokenId } satisfies Record<
  TokenizerErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message.
 *
 * @category errors
 * @since 0.1.0
 */
export type TokenizerErrorFacts<Tag extends TokenizerErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `TokenizerError` of the reason tagged `tag`: `tokenizerError("InvalidTokenId", text, { id, position })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const tokenizerError = <Tag extends TokenizerErrorReason["_tag"]>(
  tag: Tag,
  message: string,
  facts?: TokenizerErrorFacts<Tag>
): TokenizerError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => TokenizerErrorReason
  return new TokenizerError({ reason: new Reason({ ...facts, message }) })
}

// ===== Models =====

const TypeId = "~agentfly/Tokenizer"

/**
 * A loaded tokenizer.
 *
 * - `encode(text)`: token ids of `text`, without any added BOS/EOS.
 * - `decode(ids)`: the text of `ids`, special tokens included. Ids outside the vocabulary decode to U+FFFD
 *   (never a crash); call `validateIds` first where a bad id must be an error.
 * - `addedTokens`: every added token (content → id); each is always encoded as one token.
 * - `splitAdded(text)`: `text` cut into pieces that are either exactly one added token or plain text; encoding
 *   the pieces one by one gives the ids of the whole text.
 * - `encodePieces(text)`: the pieces of `splitAdded` with their ids, read in one pass (no piece is looked up again).
 *
 * @category models
 * @since 0.1.0
 */
export interface Tokenizer {
  readonly [TypeId]: typeof TypeId
  /** One more than the largest id (base vocabulary plus added tokens). */
  readonly vocabSize: number
  readonly addedTokens: ReadonlyMap<string, number>
  /** The tokenizer_config's `eos_token`, when it names a known token. */
  readonly eosToken: string | undefined
  readonly eosTokenId: number | undefined
  readonly bosToken: string | undefined
  readonly padToken: string | undefined
  readonly encode: (text: string) => Array<number>
  readonly decode: (ids: ReadonlyArray<number> | Int32Array) => string
  readonly tokenToId: (token: string) => number | undefined
  readonly idToToken: (id: number) => string | undefined
  readonly isValidId: (id: number) => boolean
  readonly splitAdded: (text: string) => Array<string>
  readonly encodePieces: (text: string) => EncodedPieces
}

/**
 * `text` as `splitAdded` cuts it, with its ids: `ids` is `encode(text)`, and piece `i` ends at character
 * `textEnds[i]` of `text` and at index `idEnds[i]` of `ids` (its ids are an added token's id, or the model's ids of
 * the plain text).
 *
 * @category models
 * @since 0.1.0
 */
export interface EncodedPieces {
  readonly ids: Array<number>
  readonly textEnds: Array<number>
  readonly idEnds: Array<number>
}

// ===== Constructors =====

const tokenName = (value: unknown): string | undefined =>
  typeof value === "string"
    ? value
    : typeof value === "object" && value !== null && typeof (value as { content?: unknown }).content === "string"
    ? (value as { content: string }).content
    : undefined

const shortText = 64
const cacheSize = 4096

const construct = (tokenizerJson: object, config: Record<string, unknown>): Option.Option<HfTokenizer> =>
  Option.liftThrowable(() => new HfTokenizer(tokenizerJson, config))()

/**
 * Builds a tokenizer from a parsed `tokenizer.json` object and an optional parsed `tokenizer_config.json`.
 *
 * **Gotchas**: added tokens marked `lstrip`/`rstrip` swallow neighbouring spaces in Hugging Face tokenizers;
 * `splitAdded` does not model that, so such tokenizers are rejected (no chat model we target uses them).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("Tokenizer.make")(function*(tokenizerJson: unknown, config: unknown = {}) {
  const json = tokenizerJson as { model?: { vocab?: unknown }; added_tokens?: unknown }
  if (typeof json !== "object" || json === null || typeof json.model !== "object" || json.model === null) {
    return yield* tokenizerError("InvalidTokenizer", "tokenizer.json has no `model` object")
  }
  const cfg = (typeof config === "object" && config !== null ? config : {}) as Record<string, unknown>
  const added: Array<{ id: number; content: string; lstrip?: boolean; rstrip?: boolean }> =
    Array.isArray(json.added_tokens) ? json.added_tokens : []
  for (const token of added) {
    if (typeof token?.content !== "string" || token.content.length === 0 || !Number.isInteger(token.id)) {
      return yield* tokenizerError("InvalidTokenizer", "an added token lacks `id`/`content`")
    }
    if (token.lstrip === true || token.rstrip === true) {
      return yield* tokenizerError(
        "InvalidTokenizer",
        `added token ${JSON.stringify(token.content)} strips whitespace (lstrip/rstrip): not supported`
      )
    }
  }
  const hf = construct(tokenizerJson as object, cfg)
  if (Option.isNone(hf)) {
    return yield* tokenizerError(
      "InvalidTokenizer",
      "@huggingface/tokenizers rejected tokenizer.json (unsupported model, normalizer or pre-tokenizer)"
    )
  }
  return fromHf(hf.value, added, cfg, isByteLevel(json as Record<string, unknown>, added.length))
})

// ===== Byte-level fast path =====

/** GPT-2's printable stand-in for each byte (`bytes_to_unicode`), as byte-level vocabularies write bytes. */
const byteSymbols: ReadonlyArray<string> = (() => {
  const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)
  const out: Array<string> = []
  let next = 256
  for (let b = 0; b < 256; b++) out.push(String.fromCodePoint(printable(b) ? b : next++))
  return out
})()

/**
 * Whether `tokenizer.json` is a pure byte-level vocabulary (what `ByteTokenizer` writes): a BPE model without
 * merges whose ids 0–255 are the 256 byte symbols and whose other entries are the added tokens, no normalizer, a
 * `ByteLevel` pre-tokenizer without prefix space and a `ByteLevel` decoder. Then a text's ids are its UTF-8 bytes
 * between added tokens, and `encode` / `decode` need no tokenizer model.
 */
const isByteLevel = (json: Record<string, unknown>, addedCount: number): boolean => {
  const model = json["model"] as Record<string, unknown>
  const pre = json["pre_tokenizer"] as Record<string, unknown> | null | undefined
  const decoder = json["decoder"] as Record<string, unknown> | null | undefined
  const vocab = model["vocab"]
  if (model["type"] !== "BPE" || !Array.isArray(model["merges"]) || model["merges"].length > 0) return false
  if (model["byte_fallback"] === true || (json["normalizer"] ?? null) !== null) return false
  if (pre?.["type"] !== "ByteLevel" || pre["add_prefix_space"] === true) return false
  if (decoder?.["type"] !== "ByteLevel") return false
  if (typeof vocab !== "object" || vocab === null) return false
  const entries = vocab as Record<string, unknown>
  return Object.keys(entries).length === 256 + addedCount && byteSymbols.every((symbol, b) => entries[symbol] === b)
}

const utf8 = new TextEncoder()
const utf8Decoder = new TextDecoder()

// Rollouts tokenize every observation and decode every sample: most of that text is ASCII, whose UTF-8 bytes are its
// char codes. A TextEncoder / TextDecoder call allocates a buffer per piece, several times the cost of a loop over
// char codes (`encodeBytePieces`, `decodeUtf8`).

/** The text of the UTF-8 bytes `ids[start, end)`; invalid sequences as U+FFFD. */
const decodeUtf8 = (ids: ReadonlyArray<number>, start: number, end: number): string => {
  let ascii = true
  for (let i = start; i < end && ascii; i++) ascii = ids[i]! < 0x80
  if (!ascii) return utf8Decoder.decode(Uint8Array.from(ids.slice(start, end)))
  let out = ""
  // String.fromCharCode over chunks: one call per 4,096 bytes stays far below the engine's argument limit.
  for (let i = start; i < end; i += 4096) {
    out += String.fromCharCode.apply(null, ids.slice(i, Math.min(end, i + 4096)) as Array<number>)
  }
  return out
}

/** Whether `token` is at `text[at]`, whose first char is known to match (most candidates differ in a char or two). */
const followsAt = (text: string, at: number, token: string): boolean => {
  if (at + token.length > text.length) return false
  for (let k = 1; k < token.length; k++) if (text.charCodeAt(at + k) !== token.charCodeAt(k)) return false
  return true
}

/** An added token found in a text: where it starts, its content and id. */
interface AddedMatch {
  readonly at: number
  readonly content: string
  readonly id: number
}

/**
 * Added tokens found as the regular expression `(a|b|…)` over them, longest first (as Hugging Face matches them),
 * would find them: `at(text, i)` is the longest one starting at `i`, `next(text, from)` the first one at or after
 * `from` (the leftmost start, the longest token there). A scan over char codes: a rollout tokenizes every
 * observation, and a regular expression with one alternative per added token (22 for Qwen) costs several times
 * more, once to split and once more to look each piece up.
 */
const addedMatcher = (addedTokens: ReadonlyMap<string, number>) => {
  const byFirst = new Map<number, Array<AddedMatch>>()
  for (const [content, id] of [...addedTokens].sort(([a], [b]) => b.length - a.length)) {
    const first = content.charCodeAt(0)
    const candidates = byFirst.get(first) ?? []
    candidates.push({ at: 0, content, id })
    byFirst.set(first, candidates)
  }
  const starts = new Uint8Array(65536)
  for (const first of byFirst.keys()) starts[first] = 1
  /** The longest added token starting at `text[i]`. */
  const at = (text: string, i: number): AddedMatch | undefined => {
    if (starts[text.charCodeAt(i)] === 0) return undefined
    for (const candidate of byFirst.get(text.charCodeAt(i))!) {
      if (followsAt(text, i, candidate.content)) return { at: i, content: candidate.content, id: candidate.id }
    }
    return undefined
  }
  const next = (text: string, from: number): AddedMatch | undefined => {
    for (let i = from; i < text.length; i++) {
      const match = at(text, i)
      if (match !== undefined) return match
    }
    return undefined
  }
  return { at, next }
}

/** An array written from index 0 again on every use, so that its storage is allocated once, not grown per text. */
interface Scratch {
  items: Array<number>
  length: number
}

const put = (scratch: Scratch, value: number): void => {
  scratch.items[scratch.length++] = value
}

/** The values written, in an array of their size; a scratch that grew past `maxScratch` lets its storage go. */
const taken = (scratch: Scratch): Array<number> => {
  const values = scratch.items.slice(0, scratch.length)
  if (scratch.items.length > maxScratch) scratch.items = []
  scratch.length = 0
  return values
}

const maxScratch = 1 << 16

// One text at a time: encoding never calls out of this module, so no call can start inside another.
const scratchIds: Scratch = { items: [], length: 0 }
const scratchTextEnds: Scratch = { items: [], length: 0 }
const scratchIdEnds: Scratch = { items: [], length: 0 }

/**
 * A byte-level vocabulary's `encodePieces` in one pass over the text: added tokens and ASCII bytes as they come,
 * and from a plain run's first non-ASCII character on, the run's remaining UTF-8 bytes at once.
 * Ids go to a scratch first: pushed onto a new array, they were the largest allocation of a rollout turn (an array
 * grown five times for a 300-byte observation).
 */
const encodeBytePieces = (matcher: ReturnType<typeof addedMatcher>, text: string): EncodedPieces => {
  const cut = (end: number) => {
    put(scratchTextEnds, end)
    put(scratchIdEnds, scratchIds.length)
  }
  let runStart = 0
  let i = 0
  while (i < text.length) {
    const match = matcher.at(text, i)
    if (match !== undefined) {
      if (i > runStart) cut(i)
      put(scratchIds, match.id)
      i += match.content.length
      cut(i)
      runStart = i
      continue
    }
    const c = text.charCodeAt(i)
    if (c < 0x80) {
      put(scratchIds, c)
      i++
      continue
    }
    const end = matcher.next(text, i)?.at ?? text.length
    for (const byte of utf8.encode(text.slice(i, end))) put(scratchIds, byte)
    i = end
  }
  if (i > runStart) cut(i)
  return { ids: taken(scratchIds), textEnds: taken(scratchTextEnds), idEnds: taken(scratchIdEnds) }
}

type AddedMatcher = ReturnType<typeof addedMatcher>

/** Calls `plain(start, end)` for each plain run of `text` and `token(match)` for each added token, in order. */
const scanAdded = (
  matcher: AddedMatcher,
  text: string,
  plain: (start: number, end: number) => void,
  token: (match: AddedMatch) => void
) => {
  let from = 0
  for (let match = matcher.next(text, 0); match !== undefined; match = matcher.next(text, from)) {
    if (match.at > from) plain(from, match.at)
    token(match)
    from = match.at + match.content.length
  }
  if (from < text.length) plain(from, text.length)
}

/**
 * A pure byte-level vocabulary decodes natively, with the Hugging Face tokenizer's results (checked in
 * `test/src/Tokenizer.test.ts`): bytes decode run by run between added tokens, an invalid sequence as U+FFFD.
 */
const byteLevelDecoder = (added: ReadonlyArray<{ id: number; content: string }>) => {
  const addedById = new Map(added.map((t) => [t.id, t.content]))
  // Below the smallest added id there is nothing to look up (a byte-level vocabulary's bytes come first).
  const firstAddedId = added.reduce((min, t) => Math.min(min, t.id), Infinity)
  return (ids: ReadonlyArray<number>): string => {
    let out = ""
    let start = 0
    const bytes = (end: number) => (end > start ? decodeUtf8(ids, start, end) : "")
    for (let i = 0; i < ids.length; i++) {
      const content = ids[i]! < firstAddedId ? undefined : addedById.get(ids[i]!)
      if (content === undefined) continue
      out += bytes(i) + content
      start = i + 1
    }
    return out + bytes(ids.length)
  }
}

/** `encodeModel` with short pieces memoized (template scaffolding such as "\n" or "user\n" recurs every turn). */
const memoizedShort = (encodeModel: (text: string) => Array<number>) => {
  const cache = new Map<string, Array<number>>()
  return (text: string): Array<number> => {
    if (text.length === 0) return []
    if (text.length > shortText) return encodeModel(text)
    const cached = cache.get(text)
    if (cached !== undefined) return cached.slice()
    if (cache.size >= cacheSize) cache.clear()
    const ids = encodeModel(text)
    cache.set(text, ids)
    return ids.slice()
  }
}

/** Pieces of `text` with its plain runs through `encode` and each added token as its id. */
const encodeModelPieces = (
  matcher: AddedMatcher,
  hasAdded: boolean,
  encode: (text: string) => Array<number>,
  text: string
): EncodedPieces => {
  const pieces: EncodedPieces = { ids: [], textEnds: [], idEnds: [] }
  const cut = (end: number) => {
    pieces.textEnds.push(end)
    pieces.idEnds.push(pieces.ids.length)
  }
  const plain = (start: number, end: number) => {
    for (const id of encode(text.slice(start, end))) pieces.ids.push(id)
    cut(end)
  }
  if (!hasAdded) plain(0, text.length)
  else {
    scanAdded(matcher, text, plain, (match) => {
      pieces.ids.push(match.id)
      cut(match.at + match.content.length)
    })
  }
  return pieces
}

/** Decodes valid runs and marks each bad id with U+FFFD, so a display of garbage never throws. */
const decodeMarkingBad = (
  ids: ReadonlyArray<number>,
  isValidId: (id: number) => boolean,
  decodeModel: (ids: ReadonlyArray<number>) => string
): string => {
  let out = ""
  let run: Array<number> = []
  for (const id of ids) {
    if (isValidId(id)) run.push(id)
    else {
      if (run.length > 0) out += decodeModel(run)
      run = []
      out += "\uFFFD"
    }
  }
  return run.length > 0 ? out + decodeModel(run) : out
}

const fromHf = (
  hf: HfTokenizer,
  added: ReadonlyArray<{ id: number; content: string }>,
  cfg: Record<string, unknown>,
  byteLevel: boolean
): Tokenizer => {
  const vocab = hf.get_vocab(true)
  let vocabSize = 0
  for (const id of vocab.values()) if (id >= vocabSize) vocabSize = id + 1
  const addedTokens = new Map(added.map((t) => [t.content, t.id]))
  const matcher = addedMatcher(addedTokens)
  // Most vocabularies have no holes: then a range check is enough (this runs on every sampled id).
  const dense = vocab.size === vocabSize
  const isValidId = (id: number) =>
    Number.isInteger(id) && id >= 0 && id < vocabSize && (dense || hf.id_to_token(id) !== undefined)
  const eosToken = tokenName(cfg.eos_token)
  const encodeOptions = { add_special_tokens: false } as const
  const decodeOptions = { skip_special_tokens: false, clean_up_tokenization_spaces: false } as const
  const splitAdded = (text: string): Array<string> => {
    if (added.length === 0) return [text]
    const pieces: Array<string> = []
    scanAdded(matcher, text, (start, end) => pieces.push(text.slice(start, end)), (match) => pieces.push(match.content))
    return pieces
  }
  // A pure byte-level vocabulary encodes and decodes natively: ids are UTF-8 bytes between added tokens.
  const encode = byteLevel
    ? (text: string): Array<number> => (text.length === 0 ? [] : encodeBytePieces(matcher, text).ids)
    : memoizedShort((text: string): Array<number> => hf.encode(text, encodeOptions).ids)
  const decodeModel = byteLevel
    ? byteLevelDecoder(added)
    : (ids: ReadonlyArray<number>): string => hf.decode(ids as Array<number>, decodeOptions)
  return {
    [TypeId]: TypeId,
    vocabSize,
    addedTokens,
    eosToken,
    eosTokenId: eosToken === undefined ? undefined : hf.token_to_id(eosToken),
    bosToken: tokenName(cfg.bos_token),
    padToken: tokenName(cfg.pad_token),
    encode,
    decode: (input) => {
      if (input.length === 0) return ""
      // Typed arrays (e.g. `Trajectory.tokenIds`) are accepted; the Hugging Face decoder wants a plain array.
      const ids = Array.isArray(input) ? input as Array<number> : Array.from(input)
      return ids.every(isValidId) ? decodeModel(ids) : decodeMarkingBad(ids, isValidId, decodeModel)
    },
    tokenToId: (token) => hf.token_to_id(token),
    idToToken: (id) => (isValidId(id) ? hf.id_to_token(id) : undefined),
    isValidId,
    splitAdded,
    encodePieces: byteLevel
      ? (text: string) => encodeBytePieces(matcher, text)
      : (text: string) => encodeModelPieces(matcher, added.length > 0, encode, text)
  }
}

/**
 * Fails with `InvalidTokenId` unless every id is an integer inside the vocabulary.
 *
 * @category combinators
 * @since 0.1.0
 */
export const validateIds = (tokenizer: Tokenizer, ids: ReadonlyArray<number>): Effect.Effect<void, TokenizerError> =>
  Effect.fromResult(checkIds(tokenizer, ids))

/**
 * `validateIds` as a `Result`, for callers that run synchronously.
 *
 * @category combinators
 * @since 0.1.0
 */
export const checkIds = (tokenizer: Tokenizer, ids: ReadonlyArray<number>): Result.Result<void, TokenizerError> => {
  const bad = ids.findIndex((id) => !tokenizer.isValidId(id))
  return bad === -1 ? Result.void : Result.fail(
    tokenizerError(
      "InvalidTokenId",
      `token id ${ids[bad]} at position ${bad} is outside the vocabulary (size ${tokenizer.vocabSize})`,
      { id: ids[bad]!, position: bad }
    )
  )
}

const parseJson = Option.liftThrowable((text: string): unknown => JSON.parse(text))

/**
 * Reads and parses a JSON file, failing with a `TokenizerError`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const readJsonFile = Effect.fn("Tokenizer.readJsonFile")(function*(file: string) {
  const fs = yield* FileSystem.FileSystem
  const text = yield* fs.readFileString(file).pipe(
    Effect.mapError((e) => tokenizerError("NotFound", `cannot read ${file}`, { cause: e }))
  )
  const value = parseJson(text)
  if (Option.isNone(value)) {
    return yield* tokenizerError("InvalidJson", `${file} is not valid JSON`)
  }
  return value.value
})

/**
 * Loads `tokenizer.json` and (when present) `tokenizer_config.json` from a Hugging Face style model folder.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fn("Tokenizer.load")(function*(modelDir: string) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const tokenizerJson = yield* readJsonFile(path.join(modelDir, "tokenizer.json"))
  const configFile = path.join(modelDir, "tokenizer_config.json")
  const hasConfig = yield* fs.exists(configFile).pipe(Effect.orElseSucceed(() => false))
  const config = hasConfig ? yield* readJsonFile(configFile) : {}
  return yield* make(tokenizerJson, config)
})
