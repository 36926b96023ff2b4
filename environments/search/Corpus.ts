/**
 * The passages a search runs over, and their file format: `corpus.jsonl`, one passage per line, as
 * `{ "id": "12", "title": "Kavo Meli", "text": "Kavo Meli was born in Tobar." }` (`id` and `title` optional) or in
 * Search-R1's format, `{ "id": "12", "contents": "\"Kavo Meli\"\nKavo Meli was born in Tobar." }` (the first line,
 * quoted, is the title). The search task's generator writes the first form; a user's own corpus may use either.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Schema } from "effect"

// ===== Models =====

/**
 * One passage: its id, an optional title (searched with a boost) and its text.
 *
 * @category models
 * @since 0.1.0
 */
export interface Passage {
  readonly id: string
  readonly title?: string | undefined
  readonly text: string
}

/**
 * A line of `corpus.jsonl`: `text` (with an optional `title`) or Search-R1's `contents`.
 *
 * @category models
 * @since 0.1.0
 */
export const Line = Schema.Struct({
  id: Schema.optionalKey(Schema.Union([Schema.String, Schema.Finite])),
  title: Schema.optionalKey(Schema.String),
  text: Schema.optionalKey(Schema.String),
  contents: Schema.optionalKey(Schema.String)
})
export type Line = typeof Line.Type

// ===== Errors =====

/**
 * A corpus file that cannot be read, or a line of it that is not a passage (with its 1-based line number); the
 * message names both.
 *
 * @category errors
 * @since 0.1.0
 */
export class CorpusError extends Schema.TaggedError<CorpusError>()("CorpusError", {
  path: Schema.String,
  line: Schema.optionalKey(Schema.Int),
  message: Schema.String
}) {}

const corpusError = (path: string, detail: string, line?: number) =>
  new CorpusError({
    path,
    ...(line === undefined ? {} : { line }),
    message: `corpus ${path}${line === undefined ? "" : `, line ${line}`}: ${detail}`
  })

// ===== Constructors =====

/** Search-R1's `contents`: `"Title"\ntext`. */
const fromContents = (contents: string): { readonly title?: string; readonly text: string } => {
  const m = /^"([^"\n]*)"\n([\s\S]*)$/.exec(contents)
  return m === null ? { text: contents } : { title: m[1]!, text: m[2]! }
}

const decodeLine = Schema.decodeUnknownExit(Schema.fromJsonString(Line))

/**
 * The passage of one line of text, or why it is not one.
 *
 * @category constructors
 * @since 0.1.0
 */
export const parseLine = (text: string, position: number): Passage | string => {
  const decoded = decodeLine(text)
  if (decoded._tag === "Failure") return "not a JSON object with `text` or `contents`"
  const line = decoded.value
  const body = line.text !== undefined
    ? { ...(line.title === undefined ? {} : { title: line.title }), text: line.text }
    : line.contents !== undefined
    ? fromContents(line.contents)
    : undefined
  if (body === undefined) return "a passage needs `text` or `contents`"
  if (body.text.trim() === "") return "the passage's text is empty"
  return { id: line.id === undefined ? String(position) : String(line.id), ...body }
}

/**
 * Reads `corpus.jsonl` (blank lines are skipped); fails on the first line that is not a passage, or on a file
 * without any.
 *
 * @category constructors
 * @since 0.1.0
 */
export const read = Effect.fn("Corpus.read")(function*(path: string) {
  const fs = yield* FileSystem.FileSystem
  const content = yield* fs.readFileString(path).pipe(
    Effect.mapError((e) => corpusError(path, `cannot read it (${e.message})`))
  )
  const passages: Array<Passage> = []
  for (const [i, text] of content.split("\n").entries()) {
    if (text.trim() === "") continue
    const passage = parseLine(text, passages.length)
    if (typeof passage === "string") return yield* corpusError(path, passage, i + 1)
    passages.push(passage)
  }
  if (passages.length === 0) return yield* corpusError(path, "no passage in it")
  return passages
})
