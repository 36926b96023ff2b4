/**
 * Tool-call parsers: from the raw text of an assistant turn to `{ content, toolCalls, errors }`.
 *
 * - `hermes`: Qwen2.5/Qwen3 `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several per turn.
 * - `llama3`: Llama 3.x JSON calls `{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`,
 *   several joined by `;`).
 * - `react`: `Thought: ... / Action: tool / Action Input: {json}`, repairing near-JSON input.
 * - `codeBlock`: exactly one fenced code block becomes a call of a code tool.
 *
 * Parsers are pure, synchronous and total: bad model output never throws. Invalid JSON, an unclosed tag or an
 * unknown shape each come back as a `ToolCallParseError` in `errors`, whose `message` is written to be shown to
 * the model as an observation; the calls that did parse are still returned (unlike AgentFly, which silently
 * drops calls with invalid JSON).
 *
 * Pass the text without the end-of-turn token. Call ids are `${idPrefix}${i}` (default `call_0`, `call_1`, ...):
 * deterministic, so a rollout can make them unique per turn with a prefix.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import type * as ChatTemplate from "./ChatTemplate.ts"
import * as Json from "./internal/json.ts"
import type * as Message from "./Message.ts"

// ===== Models =====

/**
 * The call body is not JSON (and could not be repaired where repair is on).
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidJson extends Schema.TaggedError<InvalidJson>()("InvalidJson", { message: Schema.String }) {}

/**
 * `<tool_call>`, a code fence or a Llama 3 JSON call opened and never closed (often: output truncated).
 *
 * @category errors
 * @since 0.1.0
 */
export class UnclosedTag extends Schema.TaggedError<UnclosedTag>()("UnclosedTag", { message: Schema.String }) {}

/**
 * Valid JSON, but not `{ name: string, arguments: object }`; or a stray closing tag.
 *
 * @category errors
 * @since 0.1.0
 */
export class UnknownShape extends Schema.TaggedError<UnknownShape>()("UnknownShape", { message: Schema.String }) {}

/**
 * Several code blocks where exactly one is expected.
 *
 * @category errors
 * @since 0.1.0
 */
export class AmbiguousBlocks extends Schema.TaggedError<AmbiguousBlocks>()("AmbiguousBlocks", {
  message: Schema.String
}) {}

/**
 * Why some of the output could not be read as a tool call.
 *
 * @category errors
 * @since 0.1.0
 */
export const ParseErrorReason = Schema.Union([InvalidJson, UnclosedTag, UnknownShape, AmbiguousBlocks])
export type ParseErrorReason = typeof ParseErrorReason.Type

/**
 * A part of the output that is not a usable tool call. `raw` is the offending text (at most 200 characters);
 * `message` is the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class ParseError extends Schema.TaggedError<ParseError>()("ToolCallParseError", {
  raw: Schema.String,
  reason: ParseErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag; a reason left out is a compile error. */
const reasons = { InvalidJson, UnclosedTag, UnknownShape, AmbiguousBlocks } satisfies Record<
  ParseErrorReason["_tag"],
  new(fields: { readonly message: string }) => ParseErrorReason
>

/**
 * @category models
 * @since 0.1.0
 */
export interface ParseResult {
  /** The text outside tool-call regions, trimmed. */
  readonly content: string
  readonly toolCalls: ReadonlyArray<Message.ToolCall>
  readonly errors: ReadonlyArray<ParseError>
}

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Call ids are `${idPrefix}${i}`. Default `"call_"`. */
  readonly idPrefix?: string | undefined
  /** Repair near-JSON (single quotes, trailing commas, ...). Default: true for `react`, false otherwise. */
  readonly repair?: boolean | undefined
}

/**
 * @category models
 * @since 0.1.0
 */
export interface CodeBlockOptions extends Options {
  /** Name of the tool the block calls. Default `"code_interpreter"`. */
  readonly toolName?: string | undefined
  /** Argument that receives the code. Default `"code"`. */
  readonly argumentName?: string | undefined
  /** Accepted info strings (`python`, `py`, ...); a block with another language is ignored. Default: any. */
  readonly languages?: ReadonlyArray<string> | undefined
}

// ===== Helpers =====

const clip = (text: string): string => (text.length > 200 ? `${text.slice(0, 197)}...` : text)

const error = (reason: ParseErrorReason["_tag"], message: string, raw: string): ParseError =>
  new ParseError({ raw: clip(raw), reason: new reasons[reason]({ message }) })

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

const readJson = (text: string, repair: boolean): { readonly value: unknown } | undefined =>
  repair ? Json.parseLenient(text) : Json.parseStrict(text.trim())

/**
 * Turns a decoded call object into a tool call: `name` must be a non-empty string and `arguments` (or
 * `parameters`) an object, or a JSON string holding one; missing arguments mean `{}`.
 */
const toCall = (
  value: unknown,
  id: string,
  raw: string
): { readonly call: Message.ToolCall } | { readonly error: ParseError } => {
  const shape = `expected {"name": <tool name>, "arguments": {...}}`
  if (!isRecord(value)) return { error: error("UnknownShape", `tool call is not a JSON object; ${shape}`, raw) }
  const fn = isRecord(value.function) ? value.function : value
  const name = fn.name
  if (typeof name !== "string" || name.trim().length === 0) {
    return { error: error("UnknownShape", `tool call has no "name"; ${shape}`, raw) }
  }
  let args = fn.arguments ?? fn.parameters ?? {}
  if (typeof args === "string") {
    const parsed = Json.parseStrict(args)
    if (parsed === undefined || !isRecord(parsed.value)) {
      return { error: error("InvalidJson", `arguments of ${name} are a string that is not a JSON object`, raw) }
    }
    args = parsed.value
  }
  if (!isRecord(args)) return { error: error("UnknownShape", `arguments of ${name} must be a JSON object`, raw) }
  return { call: { id, type: "function", function: { name: name.trim(), arguments: args } } }
}

/**
 * Reads one call body (an object, or an array of objects) into calls and errors; a body that does not read is
 * `unreadable` (default: `InvalidJson`).
 */
const readBody = (
  body: string,
  repair: boolean,
  nextId: () => string,
  calls: Array<Message.ToolCall>,
  errors: Array<ParseError>,
  unreadable: readonly [ParseErrorReason["_tag"], string] = ["InvalidJson", "tool call is not valid JSON"]
): void => {
  const json = readJson(body, repair)
  if (json === undefined) {
    errors.push(error(unreadable[0], unreadable[1], body))
    return
  }
  for (const value of Array.isArray(json.value) ? json.value : [json.value]) {
    const result = toCall(value, nextId(), body)
    if ("call" in result) calls.push(result.call)
    else errors.push(result.error)
  }
}

const idGenerator = (options: Options | undefined): () => string => {
  const prefix = options?.idPrefix ?? "call_"
  let i = 0
  return () => `${prefix}${i++}`
}

// ===== Parsers =====

const OPEN = "<tool_call>"
const CLOSE = "</tool_call>"

/**
 * Hermes / Qwen: every `<tool_call>...</tool_call>` block is a call (a block may also hold a JSON array of calls).
 * An unclosed block and a stray `</tool_call>` are errors; neither is part of `content`.
 *
 * @category decoding
 * @since 0.1.0
 */
export const hermes = (text: string, options?: Options): ParseResult => {
  const repair = options?.repair ?? false
  const nextId = idGenerator(options)
  const calls: Array<Message.ToolCall> = []
  const errors: Array<ParseError> = []
  const content: Array<string> = []
  let pos = 0
  for (;;) {
    const open = text.indexOf(OPEN, pos)
    const outside = text.slice(pos, open === -1 ? text.length : open)
    if (outside.includes(CLOSE)) errors.push(error("UnknownShape", `${CLOSE} without a matching ${OPEN}`, outside))
    content.push(outside.split(CLOSE).join(""))
    if (open === -1) break
    const bodyStart = open + OPEN.length
    const close = text.indexOf(CLOSE, bodyStart)
    const reopen = text.indexOf(OPEN, bodyStart)
    if (close === -1 || (reopen !== -1 && reopen < close)) {
      const end = close === -1 ? text.length : reopen
      errors.push(error("UnclosedTag", `${OPEN} is never closed with ${CLOSE}`, text.slice(open, end)))
      if (close === -1) break
      pos = reopen
      continue
    }
    readBody(text.slice(bodyStart, close), repair, nextId, calls, errors)
    pos = close + CLOSE.length
  }
  return { content: content.join("").trim(), toolCalls: calls, errors }
}

const PYTHON_TAG = "<|python_tag|>"

/**
 * Llama 3.x JSON calls, as the Llama 3.1–3.3 templates ask for them (`Respond in the format {"name": function name,
 * "parameters": dictionary of argument name and its value}`): the turn (after an optional `<|python_tag|>`) is one
 * or more JSON objects `{"name": ..., "parameters": {...}}` separated by `;` or `,`, or a JSON array of them. A turn
 * that does not start with `{` or `[` is plain content. Errors mirror {@link hermes}: a body that is not JSON is
 * `InvalidJson`, an object without a name `UnknownShape`, a call never closed (a truncated turn) `UnclosedTag`.
 *
 * @category decoding
 * @since 0.1.0
 */
export const llama3 = (text: string, options?: Options): ParseResult => {
  const repair = options?.repair ?? false
  const nextId = idGenerator(options)
  const trimmed = text.trim()
  const tagged = trimmed.startsWith(PYTHON_TAG)
  const body = tagged ? trimmed.slice(PYTHON_TAG.length).trim() : trimmed
  if (!body.startsWith("{") && !body.startsWith("[")) {
    return tagged
      ? { content: "", toolCalls: [], errors: [error("UnknownShape", `${PYTHON_TAG} is not followed by JSON`, body)] }
      : { content: trimmed, toolCalls: [], errors: [] }
  }
  const calls: Array<Message.ToolCall> = []
  const errors: Array<ParseError> = []
  let pos = 0
  while (pos < body.length) {
    const end = Json.scanValueEnd(body, pos)
    if (end === -1) {
      const truncated = ["UnclosedTag", "tool call JSON is never closed (the turn may have been cut off)"] as const
      readBody(body.slice(pos), repair, nextId, calls, errors, truncated)
      break
    }
    readBody(body.slice(pos, end), repair, nextId, calls, errors)
    pos = end
    while (pos < body.length && /[\s;,]/.test(body[pos]!)) pos++
    if (pos < body.length && body[pos] !== "{" && body[pos] !== "[") {
      errors.push(error("UnknownShape", "text after a JSON tool call", body.slice(pos)))
      break
    }
  }
  return { content: "", toolCalls: calls, errors }
}

const reactLine = /^\s*(thought|action input|action|input|observation|final answer)\s*:\s?(.*)$/i

/**
 * ReAct: `Thought: ...`, `Action: <tool name>`, `Action Input: <json>` (or `Input:`). Only the first action is a
 * call; its input runs until the next `Observation:`/`Thought:`/`Action:` line and is repaired when it is near-JSON.
 * `content` is the text before the action (the thought), or the whole text when there is no action.
 *
 * @category decoding
 * @since 0.1.0
 */
export const react = (text: string, options?: Options): ParseResult => {
  const repair = options?.repair ?? true
  const nextId = idGenerator(options)
  const lines = text.split("\n")
  const actionAt = lines.findIndex((line) => /^\s*action\s*:/i.test(line))
  if (actionAt === -1) return { content: text.trim(), toolCalls: [], errors: [] }
  const content = lines.slice(0, actionAt).join("\n").trim()
  const name = (reactLine.exec(lines[actionAt]!)?.[2] ?? "").trim().replace(/^[`"']+|[`"']+$/g, "")
  const inputLines: Array<string> = []
  let seenInput = false
  for (let i = actionAt + 1; i < lines.length; i++) {
    const m = reactLine.exec(lines[i]!)
    const label = m?.[1]?.toLowerCase()
    if (!seenInput) {
      if (label === "action input" || label === "input") {
        seenInput = true
        inputLines.push(m![2]!)
      } else if (lines[i]!.trim().length > 0) break
    } else if (label === "observation" || label === "thought" || label === "action" || label === "final answer") break
    else inputLines.push(lines[i]!)
  }
  const raw = lines.slice(actionAt).join("\n")
  if (name.length === 0) {
    return { content, toolCalls: [], errors: [error("UnknownShape", "Action: names no tool", raw)] }
  }
  if (!seenInput) {
    return { content, toolCalls: [], errors: [error("UnknownShape", `Action: ${name} has no Action Input:`, raw)] }
  }
  const input = inputLines.join("\n").trim()
  const json = input.length === 0 ? { value: {} } : readJson(input, repair)
  if (json === undefined) {
    return { content, toolCalls: [], errors: [error("InvalidJson", `Action Input of ${name} is not JSON`, input)] }
  }
  if (!isRecord(json.value)) {
    return {
      content,
      toolCalls: [],
      errors: [error("UnknownShape", `Action Input of ${name} must be a JSON object`, input)]
    }
  }
  const call: Message.ToolCall = { id: nextId(), type: "function", function: { name, arguments: json.value } }
  return { content, toolCalls: [call], errors: [] }
}

const fenceLine = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/

/**
 * Exactly one fenced code block (```` ```python ... ``` ````) becomes a call `{ [argumentName]: code }` of
 * `toolName`. No block: plain content. Several blocks: an `AmbiguousBlocks` error and no call. An unclosed fence:
 * `UnclosedTag`. `content` is the text outside the block.
 *
 * @category decoding
 * @since 0.1.0
 */
export const codeBlock = (text: string, options?: CodeBlockOptions): ParseResult => {
  const nextId = idGenerator(options)
  const lines = text.split("\n")
  const blocks: Array<{ start: number; end: number; language: string }> = []
  for (let i = 0; i < lines.length; i++) {
    const open = fenceLine.exec(lines[i]!)
    if (open === null) continue
    const fence = open[1]!
    const closing = new RegExp(`^ {0,3}${fence[0] === "`" ? "`" : "~"}{${fence.length},}\\s*$`)
    let end = -1
    for (let j = i + 1; j < lines.length && end === -1; j++) if (closing.test(lines[j]!)) end = j
    if (end === -1) {
      return {
        content: lines.slice(0, i).join("\n").trim(),
        toolCalls: [],
        errors: [error("UnclosedTag", "code block is never closed", lines.slice(i).join("\n"))]
      }
    }
    blocks.push({ start: i, end, language: open[2]!.toLowerCase() })
    i = end
  }
  const accepted = options?.languages === undefined
    ? blocks
    : blocks.filter((b) => options.languages!.some((l) => l.toLowerCase() === b.language))
  if (accepted.length === 0) return { content: text.trim(), toolCalls: [], errors: [] }
  if (accepted.length > 1) {
    return {
      content: text.trim(),
      toolCalls: [],
      errors: [error("AmbiguousBlocks", `${accepted.length} code blocks; write exactly one`, text)]
    }
  }
  const block = accepted[0]!
  const code = lines.slice(block.start + 1, block.end).join("\n")
  const content = [...lines.slice(0, block.start), ...lines.slice(block.end + 1)].join("\n").trim()
  const call: Message.ToolCall = {
    id: nextId(),
    type: "function",
    function: { name: options?.toolName ?? "code_interpreter", arguments: { [options?.argumentName ?? "code"]: code } }
  }
  return { content, toolCalls: [call], errors: [] }
}

/**
 * The parser of a tool-call convention (as named by `ChatTemplate.toolCallFormat`).
 *
 * @category decoding
 * @since 0.1.0
 */
export const parse = (format: ChatTemplate.ToolCallFormat, text: string, options?: CodeBlockOptions): ParseResult => {
  switch (format) {
    case "hermes":
      return hermes(text, options)
    case "llama3":
      return llama3(text, options)
    case "react":
      return react(text, options)
    case "code":
      return codeBlock(text, options)
  }
}

/**
 * The assistant message of a parse, for the trajectory's message view.
 *
 * @category constructors
 * @since 0.1.0
 */
export const toAssistantMessage = (result: ParseResult): Message.Message =>
  result.toolCalls.length > 0
    ? { role: "assistant", content: result.content, tool_calls: result.toolCalls }
    : { role: "assistant", content: result.content }
