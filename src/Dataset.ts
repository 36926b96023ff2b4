/**
 * Datasets of prompts and demonstrations, in AgentFly's format: a JSON array or JSONL of rows, each an object with
 * a `question` (the user turn) or `messages` (a conversation, which overrides `question`), plus any extra fields,
 * which flow unchanged to rewards (`answer`, `task_id`, ...).
 *
 * A row that fails validation is reported with its line number (1-based, in the file); `onInvalid` decides whether
 * the load stops at the first bad row (`"stop"`, the default) or skips it and reports it in `skipped`. A file that
 * is not JSON at all (an unterminated array) always fails.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Result, Schema } from "effect"
import * as SchemaIssues from "./internal/schemaIssues.ts"
import * as Message from "./Message.ts"

// ===== Models =====

/**
 * One validated row. `fields` holds every key of the row except `question` and `messages`.
 *
 * @category models
 * @since 0.1.0
 */
export interface Row {
  /** 0-based position among the valid rows. */
  readonly index: number
  /** 1-based line of the file where the row starts. */
  readonly line: number
  readonly question?: string
  readonly messages?: Message.Conversation
  readonly fields: Readonly<Record<string, unknown>>
}

/**
 * A row left out, with why.
 *
 * @category models
 * @since 0.1.0
 */
export interface RowIssue {
  readonly line: number
  readonly message: string
}

/**
 * @category models
 * @since 0.1.0
 */
export interface Dataset {
  readonly name: string
  readonly rows: ReadonlyArray<Row>
  readonly skipped: ReadonlyArray<RowIssue>
  /** The row Schemas whose decoded values the rows' fields hold ({@link refine}): never decoded by them again. */
  readonly decodedBy?: ReadonlyArray<Schema.Codec<any, any>> | undefined
}

/**
 * What a row must hold:
 * - `"prompt"`: a non-empty `question`, or `messages` with at least one message (rollout datasets);
 * - `"conversation"`: `messages` with at least one assistant message (SFT demonstrations).
 *
 * @category models
 * @since 0.1.0
 */
export type Kind = "prompt" | "conversation"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly kind?: Kind
  readonly onInvalid?: "skip" | "stop"
  /** A Schema the rows' fields must also decode with (a task's `row`; see {@link refine}). */
  readonly fields?: Schema.Codec<any, any> | undefined
  /** Where the path came from (`data.train`, `--data`): a file that cannot be read is named with it. */
  readonly from?: string | undefined
}

// ===== Errors =====

/**
 * The file does not exist or cannot be read.
 *
 * @category errors
 * @since 0.1.0
 */
export class Unreadable extends Schema.TaggedError<Unreadable>()("Unreadable", {
  message: Schema.String,
  path: Schema.String,
  /** The file system's error. */
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Not a JSON array or JSONL at all.
 *
 * @category errors
 * @since 0.1.0
 */
export class Malformed extends Schema.TaggedError<Malformed>()("Malformed", { message: Schema.String }) {}

/**
 * A row failed validation and `onInvalid` is "stop".
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidRow extends Schema.TaggedError<InvalidRow>()("InvalidRow", {
  message: Schema.String,
  /** The row's line in its file (1-based; a row of an in-memory list: its index + 1). */
  line: Schema.Int
}) {}

/**
 * No valid row.
 *
 * @category errors
 * @since 0.1.0
 */
export class Empty extends Schema.TaggedError<Empty>()("Empty", { message: Schema.String }) {}

/**
 * Why a dataset could not be loaded.
 *
 * @category errors
 * @since 0.1.0
 */
export const DatasetErrorReason = Schema.Union([Unreadable, Malformed, InvalidRow, Empty])
export type DatasetErrorReason = typeof DatasetErrorReason.Type

/**
 * A dataset could not be loaded. Handle reasons with `Effect.catchReason("DatasetError", "InvalidRow", …)`;
 * `message` is the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class DatasetError extends Schema.TaggedError<DatasetError>()("DatasetError", {
  dataset: Schema.String,
  reason: DatasetErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `datasetError`; a reason left out is a compile error. */
const reasons = { Unreadable, Malformed, InvalidRow, Empty } satisfies Record<DatasetErrorReason["_tag"], unknown>

/**
 * The facts a reason carries besides its message (`line` of `InvalidRow`, `path` and `cause` of `Unreadable`).
 *
 * @category errors
 * @since 0.1.0
 */
export type DatasetErrorFacts<Tag extends DatasetErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `DatasetError` of `dataset` for the reason tagged `tag`: `datasetError(name, "InvalidRow", text, { line })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const datasetError = <Tag extends DatasetErrorReason["_tag"]>(
  dataset: string,
  tag: Tag,
  message: string,
  ...[facts]: {} extends DatasetErrorFacts<Tag> ? [facts?: DatasetErrorFacts<Tag>] : [facts: DatasetErrorFacts<Tag>]
): DatasetError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => DatasetErrorReason
  return new DatasetError({ dataset, reason: new Reason({ ...facts, message }) })
}

// ===== Validation =====

const Fields = Schema.Struct({
  question: Schema.optionalKey(Schema.String),
  messages: Schema.optionalKey(Message.Conversation)
})

const decodeJson = Schema.decodeUnknownResult(Schema.fromJsonString(Schema.Unknown))
const decodeFields = Schema.decodeUnknownResult(Fields)

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

/** Validates one row's JSON text; returns the row or a one-line reason. */
const validate = (text: string, kind: Kind): Result.Result<Omit<Row, "index" | "line">, string> => {
  const json = decodeJson(text)
  if (Result.isFailure(json)) return Result.fail(`not valid JSON (${json.failure.message.split("\n")[0]})`)
  const value = json.success
  if (!isRecord(value)) {
    return Result.fail(`expected an object, got ${Array.isArray(value) ? "an array" : typeof value}`)
  }
  const decoded = decodeFields(value)
  if (Result.isFailure(decoded)) return Result.fail(decoded.failure.message.replace(/\n\s*/g, " "))
  const { question } = decoded.success
  const messages = decoded.success.messages === undefined ? undefined : withObjectArguments(decoded.success.messages)
  if (typeof messages === "string") return Result.fail(messages)
  if (kind === "conversation") {
    if (messages === undefined) return Result.fail("a demonstration needs `messages`")
    if (!messages.some((m) => m.role === "assistant")) return Result.fail("`messages` has no assistant message")
  } else if (messages === undefined || messages.length === 0) {
    if (question === undefined) return Result.fail("a row needs a `question` or `messages`")
    if (question.trim() === "") return Result.fail("`question` is empty")
  }
  const { messages: _m, question: _q, ...fields } = value
  return Result.succeed({
    ...(question === undefined ? {} : { question }),
    ...(messages === undefined ? {} : { messages }),
    fields
  })
}

/**
 * Tool-call arguments written as OpenAI's API returns them, a JSON string, become the object they encode (chat
 * templates render an object; a string would be rendered quoted, and the policy would learn to escape JSON). A string
 * that does not encode an object is an error.
 */
const withObjectArguments = (messages: Message.Conversation): Message.Conversation | string => {
  let problem: string | undefined
  const out = messages.map((m, i) => {
    if (m.role !== "assistant" || m.tool_calls === undefined) return m
    return {
      ...m,
      tool_calls: m.tool_calls.map((call) => {
        const args = call.function.arguments
        if (typeof args !== "string") return call
        const parsed = Result.try(() => JSON.parse(args) as unknown)
        if (Result.isFailure(parsed) || !isRecord(parsed.success)) {
          problem ??= `messages[${i}]: the arguments of tool call "${call.function.name}" are a string that is not ` +
            `a JSON object: ${JSON.stringify(args.slice(0, 80))}`
          return call
        }
        return { ...call, function: { ...call.function, arguments: parsed.success } }
      })
    }
  })
  return problem ?? out
}

// ===== Splitting =====

/**
 * Splits the text of a JSON array into the texts of its top-level elements, with the 1-based line where each
 * starts. Returns undefined when the array is not closed (a truncated or non-JSON file).
 *
 * @category parsing
 * @since 0.1.0
 */
export const splitJsonArray = (text: string): Array<{ line: number; text: string }> | undefined => {
  const out: Array<{ line: number; text: string }> = []
  let line = 1
  let depth = 0
  let inString = false
  let start = -1
  let startLine = 1
  const flush = (end: number) => {
    const element = text.slice(start, end)
    if (element.trim() !== "") out.push({ line: startLine, text: element })
    start = -1
  }
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!
    if (c === "\n") line++
    if (inString) {
      if (c === "\\") i++
      else if (c === "\"") inString = false
      continue
    }
    if (depth === 1 && start === -1 && !/\s|,|\]/.test(c)) {
      start = i
      startLine = line
    }
    if (c === "\"") inString = true
    else if (c === "[" || c === "{") depth++
    else if (c === "]" || c === "}") {
      depth--
      if (depth === 0) {
        if (start !== -1) flush(i)
        return text.slice(i + 1).trim() === "" ? out : undefined
      }
    } else if (c === "," && depth === 1 && start !== -1) flush(i)
  }
  return undefined
}

/** The non-blank lines of a JSONL text with their 1-based numbers. */
const splitJsonl = (text: string): Array<{ line: number; text: string }> =>
  text.split("\n").flatMap((t, i) => (t.trim() === "" ? [] : [{ line: i + 1, text: t }]))

// ===== Constructors =====

/**
 * Parses and validates the text of a dataset (a JSON array when the first non-blank character is `[`, JSONL
 * otherwise).
 *
 * @category constructors
 * @since 0.1.0
 */
export const parse = (name: string, text: string, options: Options = {}): Effect.Effect<Dataset, DatasetError> =>
  Effect.gen(function*() {
    const kind = options.kind ?? "prompt"
    const isArray = text.trimStart().startsWith("[")
    const pieces = isArray ? splitJsonArray(text) : splitJsonl(text)
    if (pieces === undefined) {
      return yield* datasetError(name, "Malformed", "unterminated JSON array")
    }
    const rows: Array<Row> = []
    const skipped: Array<RowIssue> = []
    for (const piece of pieces) {
      const result = validate(piece.text, kind)
      if (Result.isSuccess(result)) {
        rows.push({ index: rows.length, line: piece.line, ...result.success })
      } else if (options.onInvalid === "skip") {
        skipped.push({ line: piece.line, message: result.failure })
      } else {
        return yield* datasetError(name, "InvalidRow", `${name}:${piece.line}: ${result.failure}`, { line: piece.line })
      }
    }
    if (rows.length === 0) {
      return yield* datasetError(name, "Empty", `${name}: no valid row`)
    }
    return { name, rows, skipped }
  })

/**
 * Reads and parses a dataset file.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fn("Dataset.load")(function*(path: string, options: Options = {}) {
  const fs = yield* FileSystem.FileSystem
  const text = yield* fs.readFileString(path).pipe(
    Effect.mapError((e) =>
      datasetError(
        path,
        "Unreadable",
        `${options.from === undefined ? "" : `${options.from}: `}${path}: ${
          e.reason._tag === "NotFound" ? "no such file" : e.message
        }`,
        { path, cause: e }
      )
    )
  )
  const dataset = yield* parse(path, text, options)
  return options.fields === undefined ? dataset : yield* refine(dataset, options.fields, options)
})

// ===== Getters =====

/**
 * The prompt messages of a row: its `messages` if present, otherwise an optional system prompt and the
 * `question` as the user turn.
 *
 * @category getters
 * @since 0.1.0
 */
export const promptMessages = (row: Row, systemPrompt?: string): Message.Conversation => {
  if (row.messages !== undefined && row.messages.length > 0) return row.messages
  const user: Message.Message = { role: "user", content: row.question ?? "" }
  return systemPrompt === undefined ? [user] : [{ role: "system", content: systemPrompt }, user]
}

/**
 * Checks every row's fields against a task's row Schema (`Task.row`), replacing them with the decoded values. A row
 * that fails is reported with its line: the load stops there (`onInvalid: "stop"`, the default) or skips the row
 * and lists it in `skipped`. A dataset already decoded by `fields` is returned as it is: a Schema that transforms
 * its input (a number from a string) would refuse its own output.
 *
 * @category combinators
 * @since 0.1.0
 */
export const refine = (
  dataset: Dataset,
  fields: Schema.Codec<any, any>,
  options: { readonly onInvalid?: "skip" | "stop" | undefined } = {}
): Effect.Effect<Dataset, DatasetError> =>
  Effect.gen(function*() {
    if (dataset.decodedBy?.includes(fields) === true) return dataset
    const decode = Schema.decodeUnknownResult(fields)
    const rows: Array<Row> = []
    const skipped: Array<RowIssue> = [...dataset.skipped]
    for (const row of dataset.rows) {
      const decoded = decode(row.fields, SchemaIssues.decodeOptions)
      if (Result.isSuccess(decoded)) {
        // Fields the Schema does not name pass through (they may still reach a reward).
        rows.push({
          ...row,
          index: rows.length,
          fields: { ...row.fields, ...(decoded.success as Record<string, unknown>) }
        })
        continue
      }
      // As a config's problems are said: `field: what was expected, got what was given` (cut when long).
      const message = SchemaIssues.formatIssues(fields, decoded.failure.issue).join("; ")
      if (options.onInvalid === "skip") {
        skipped.push({ line: row.line, message })
      } else {
        const text = `${dataset.name}:${row.line}: ${message}`
        return yield* datasetError(dataset.name, "InvalidRow", text, { line: row.line })
      }
    }
    if (rows.length === 0) {
      return yield* datasetError(dataset.name, "Empty", `${dataset.name}: no valid row`)
    }
    return { name: dataset.name, rows, skipped, decodedBy: [...(dataset.decodedBy ?? []), fields] }
  })

/**
 * Writes a generator's splits as JSONL files `<dir>/<name>.jsonl` (one JSON value per line; the directory is created
 * if missing) and returns how many rows each holds. Splits named `heldOut` go to `heldout.jsonl`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const writeSplits = Effect.fn("Dataset.writeSplits")(function*<const Names extends string>(
  dir: string,
  splits: { readonly [K in Names]: ReadonlyArray<unknown> }
) {
  const fs = yield* FileSystem.FileSystem
  yield* fs.makeDirectory(dir, { recursive: true })
  const counts = {} as Record<Names, number>
  for (const name of Object.keys(splits) as Array<Names>) {
    const rows = splits[name]
    yield* fs.writeFileString(
      `${dir}/${name.toLowerCase()}.jsonl`,
      rows.map((r) => JSON.stringify(r)).join("\n") + "\n"
    )
    counts[name] = rows.length
  }
  return counts
})
