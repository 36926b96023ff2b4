/**
 * The gateway's request and response bodies: a chat or completions request checked field by field into what the
 * gateway reads ({@link ChatBody}, {@link CompletionBody}; a bad one is a 400 naming the field), the canonical key of
 * a message (how a conversation sent back is matched to what was sampled), and a sampled {@link Turn} written as a
 * response or as the chunks of a stream. The wire format both servers share (errors, message conversion, `usage`,
 * HTTP) is `internal/openAiWire.ts`'s.
 *
 * Read: `messages`, `tools`, `max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `n`
 * (1 only), `stream`, `stream_options.include_usage`, `logprobs`, `stop_token_ids`. The rest of OpenAI's documented
 * fields (`tool_choice`, `parallel_tool_calls`, penalties, `user`, `metadata`, `store`, ...) are range-checked,
 * accepted and ignored; any other field is refused as OpenAI refuses it, and so is a value out of OpenAI's range
 * (`internal/openAiRequest.ts`, shared with `agentfly serve`). `stop` strings are refused: a sampled sequence cut
 * inside a token is not token-in/token-out.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import type * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Message from "../../src/Message.ts"
import { suggestion } from "../../src/internal/schemaIssues.ts"
import type * as OpenAiRequest from "../internal/openAiRequest.ts"
import {
  ApiError,
  type Check,
  done,
  event,
  invalid,
  isRecord,
  lift,
  parseArguments,
  refusal,
  toMessage,
  toolCalls,
  toTools,
  usage
} from "../internal/openAiWire.ts"

// ===== Requests =====

/**
 * A checked chat request.
 *
 * @category models
 * @since 0.1.0
 */
export interface ChatBody {
  readonly messages: ReadonlyArray<Message.Message>
  readonly tools: ReadonlyArray<ChatTemplate.ToolSpec>
  readonly maxTokens: number | undefined
  readonly temperature: number | undefined
  readonly topP: number | undefined
  readonly topK: number | undefined
  readonly seed: number | undefined
  readonly stopTokenIds: ReadonlyArray<number>
  readonly stream: boolean
  readonly includeUsage: boolean
  readonly logprobs: boolean
}

/**
 * A checked completions request: the prompt as text or token ids.
 *
 * @category models
 * @since 0.1.0
 */
export interface CompletionBody extends Omit<ChatBody, "messages" | "tools" | "logprobs"> {
  readonly prompt: string | ReadonlyArray<number>
  readonly logprobs: boolean
}

/** The fields the gateway reads beyond OpenAI's documented ones (vLLM's). */
const extensions: { readonly [E in OpenAiRequest.Endpoint]: ReadonlyArray<string> } = {
  chat: ["top_k", "stop_token_ids"],
  completion: ["top_k", "stop_token_ids", "max_completion_tokens"]
}

/** The shared rules (`internal/openAiRequest.ts`): known fields, OpenAI's ranges and types, one choice. */
const checkShared = (body: Record<string, unknown>, endpoint: OpenAiRequest.Endpoint): ApiError | undefined =>
  refusal(body, endpoint, extensions[endpoint])

/** A number field `checkShared` has checked: a number of its range, or absent. */
const numberOf = (body: Record<string, unknown>, key: string): number | undefined => {
  const v = body[key]
  return typeof v === "number" ? v : undefined
}

const isInt = (n: number) => Number.isInteger(n)

/** The sampling fields both endpoints share, once `checkShared` passed. */
const samplingOf = (body: Record<string, unknown>): Check<Omit<ChatBody, "messages" | "tools" | "logprobs">> => {
  const topK = numberOf(body, "top_k")
  const stop = body["stop"]
  if (stop !== undefined && stop !== null && !(Array.isArray(stop) && stop.length === 0)) {
    return invalid("stop sequences are not supported (a cut inside a token breaks token-in/token-out); " +
      "use stop_token_ids", "stop")
  }
  const stopIds = body["stop_token_ids"] ?? []
  if (!Array.isArray(stopIds) || !stopIds.every((id) => typeof id === "number" && isInt(id) && id >= 0)) {
    return invalid("stop_token_ids must be a list of token ids", "stop_token_ids")
  }
  const stream = body["stream"] ?? false
  if (typeof stream !== "boolean") return invalid("stream must be a boolean", "stream")
  const options = body["stream_options"]
  if (options !== undefined && options !== null && !isRecord(options)) {
    return invalid("stream_options must be an object", "stream_options")
  }
  return {
    maxTokens: numberOf(body, "max_completion_tokens") ?? numberOf(body, "max_tokens"),
    temperature: numberOf(body, "temperature"),
    topP: numberOf(body, "top_p"),
    topK: topK === -1 ? undefined : topK,
    seed: numberOf(body, "seed"),
    stopTokenIds: stopIds as ReadonlyArray<number>,
    stream,
    includeUsage: isRecord(options) && options["include_usage"] === true
  }
}

/**
 * Checks a `/chat/completions` body.
 *
 * @category constructors
 * @since 0.1.0
 */
export const decodeChat = (body: unknown): Effect.Effect<ChatBody, ApiError> =>
  Effect.suspend(() => {
    if (!isRecord(body)) return Effect.fail(invalid("the request body must be a JSON object"))
    const refused = checkShared(body, "chat")
    if (refused !== undefined) return Effect.fail(refused)
    const raw = body["messages"]
    if (!Array.isArray(raw) || raw.length === 0) {
      return Effect.fail(invalid("messages must be a non-empty list", "messages"))
    }
    const messages: Array<Message.Message> = []
    for (const [i, m] of raw.entries()) {
      const message = toMessage(m, i)
      if (message instanceof ApiError) return Effect.fail(message)
      messages.push(message)
    }
    const orphan = toolReplyProblem(messages)
    if (orphan !== undefined) {
      const param = `messages.[${orphan.index}]`
      return Effect.fail(
        orphan.id === undefined
          ? invalid(
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with " +
              "'tool_calls'.",
            `${param}.role`
          )
          : invalid(
            `Invalid parameter: 'tool_call_id' of '${orphan.id}' not found in 'tool_calls' of previous message.`,
            `${param}.tool_call_id`
          )
      )
    }
    const tools = toTools(body["tools"])
    if (tools instanceof ApiError) return Effect.fail(tools)
    const logprobs = body["logprobs"] ?? false
    if (typeof logprobs !== "boolean") return Effect.fail(invalid("logprobs must be a boolean", "logprobs"))
    return Effect.map(lift(samplingOf(body)), (sampling) => ({ ...sampling, messages, tools, logprobs }))
  })

/**
 * Checks a `/completions` body (one prompt: a string or a list of token ids).
 *
 * @category constructors
 * @since 0.1.0
 */
export const decodeCompletion = (body: unknown): Effect.Effect<CompletionBody, ApiError> =>
  Effect.suspend(() => {
    if (!isRecord(body)) return Effect.fail(invalid("the request body must be a JSON object"))
    const refused = checkShared(body, "completion")
    if (refused !== undefined) return Effect.fail(refused)
    const prompt = body["prompt"]
    const ids = Array.isArray(prompt) && prompt.length > 0 && prompt.every((t) => typeof t === "number" && isInt(t))
    if (typeof prompt !== "string" && !ids) {
      return Effect.fail(invalid("prompt must be a string or a non-empty list of token ids (one prompt)", "prompt"))
    }
    const logprobs = body["logprobs"]
    return Effect.map(lift(samplingOf(body)), (sampling) => ({
      ...sampling,
      prompt: prompt as string | ReadonlyArray<number>,
      logprobs: typeof logprobs === "number"
    }))
  })

/**
 * The first tool message that answers no call (OpenAI refuses it, and so does every wire format the gateway
 * speaks): `index` is its place in `messages`; `id` is its call id when a preceding assistant message has calls but
 * none of that id, undefined when no assistant message with calls precedes it (only tool messages in between).
 *
 * @category getters
 * @since 0.1.0
 */
export const toolReplyProblem = (
  messages: ReadonlyArray<Message.Message>
): { readonly index: number; readonly id: string | undefined } | undefined => {
  let calls: ReadonlySet<string> | undefined
  for (const [index, m] of messages.entries()) {
    if (m.role === "assistant") {
      calls = m.tool_calls === undefined || m.tool_calls.length === 0
        ? undefined
        : new Set(m.tool_calls.map((c) => c.id))
    } else if (m.role === "tool") {
      if (calls === undefined) return { index, id: undefined }
      if (!calls.has(m.tool_call_id)) return { index, id: m.tool_call_id }
    } else calls = undefined
  }
  return undefined
}

/**
 * A number field of a request: absent (`undefined` or `null`), or a finite number in `[min, max]` (an integer when
 * `integer`); anything else is a 400 naming the field.
 *
 * @category constructors
 * @since 0.1.0
 */
export const numberField = (
  body: Readonly<Record<string, unknown>>,
  key: string,
  range: { readonly min: number; readonly max?: number; readonly integer?: boolean }
): Check<number | undefined> => {
  const v = body[key]
  if (v === undefined || v === null) return undefined
  const kind = range.integer === true ? "an integer" : "a number"
  if (typeof v !== "number" || !Number.isFinite(v) || (range.integer === true && !Number.isInteger(v))) {
    return invalid(`${key} must be ${kind}`, key)
  }
  if (v < range.min || (range.max !== undefined && v > range.max)) {
    const bounds = range.max === undefined ? `at least ${range.min}` : `between ${range.min} and ${range.max}`
    return invalid(`${key} must be ${bounds}, got ${v}`, key)
  }
  return v
}

/**
 * A 400 naming the fields of `body` outside `known` (a near name suggested), or undefined.
 *
 * @category constructors
 * @since 0.1.0
 */
export const unknownFields = (
  body: Readonly<Record<string, unknown>>,
  known: ReadonlySet<string>
): ApiError | undefined => {
  const unknown = Object.keys(body).filter((k) => !known.has(k))
  if (unknown.length === 0) return undefined
  const named = unknown.map((k) => `${k}${suggestion(k, [...known])}`).join(", ")
  return invalid(`Unrecognized request argument${unknown.length > 1 ? "s" : ""} supplied: ${named}`, unknown[0])
}

/**
 * A server-sent event with its `event:` name (what the Responses and Messages streams send).
 *
 * @category constructors
 * @since 0.1.0
 */
export const namedEvent = (name: string, value: unknown): string =>
  `event: ${name}\ndata: ${JSON.stringify(value)}\n\n`

/**
 * A checked body of a wire format as the chat request the recorder answers: the conversation, its tools and
 * sampling (no stop ids, usage or logprobs: the formats' own bodies carry those).
 *
 * @category constructors
 * @since 0.1.0
 */
export const chatBodyOf = (
  messages: ReadonlyArray<Message.Message>,
  tools: ReadonlyArray<ChatTemplate.ToolSpec>,
  sampling: Pick<ChatBody, "maxTokens" | "temperature" | "topP" | "topK" | "stream">
): ChatBody => ({
  messages,
  tools,
  ...sampling,
  seed: undefined,
  stopTokenIds: [],
  includeUsage: false,
  logprobs: false
})

// ===== Matching =====

/** JSON with object keys sorted: the same value however an SDK ordered its keys. */
const canonical = (value: unknown): string => {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`
  if (isRecord(value)) {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`
  }
  return JSON.stringify(value) ?? "null"
}

/**
 * The canonical key of a message: two messages with equal keys are the same turn for the gateway. Assistant text is
 * compared trimmed (SDKs drop whitespace-only text beside tool calls), tool-call arguments as JSON values (key order
 * ignored), a tool message by its call id and text (its `name` is ignored).
 *
 * @category getters
 * @since 0.1.0
 */
export const messageKey = (m: Message.Message): string => {
  const text = Message.text(m.content)
  switch (m.role) {
    case "assistant":
      return `a\u0000${text.trim()}\u0000${
        canonical((m.tool_calls ?? []).map((c) => [c.id, c.function.name, parseArguments(c.function.arguments)]))
      }`
    case "tool":
      return `t\u0000${m.tool_call_id}\u0000${text}`
    default:
      return `${m.role[0]}\u0000${text}`
  }
}

/**
 * The key of a tool list (a request whose tools changed renders another prompt).
 *
 * @category getters
 * @since 0.1.0
 */
export const toolsKey = (tools: ReadonlyArray<ChatTemplate.ToolSpec>): string => canonical(tools)

// ===== Responses =====

/**
 * A sampled assistant turn as the gateway answers it.
 *
 * @category models
 * @since 0.1.0
 */
export interface Turn {
  readonly content: string
  readonly toolCalls: ReadonlyArray<Message.ToolCall>
  readonly finishReason: "stop" | "length" | "tool_calls"
  readonly tokenIds: ReadonlyArray<number>
  readonly logprobs: ReadonlyArray<number>
  readonly policyVersion: number
  readonly promptTokens: number
}

const turnUsage = (turn: Turn) => usage(turn.promptTokens, turn.tokenIds.length)

const chatLogprobs = (turn: Turn) => ({
  content: turn.tokenIds.map((id, i) => ({
    token: `token_id:${id}`,
    logprob: turn.logprobs[i]!,
    bytes: null,
    top_logprobs: []
  }))
})

/**
 * The assistant message of a turn, in OpenAI's shape (`content: null` beside tool calls when there is no text).
 *
 * @category constructors
 * @since 0.1.0
 */
export const assistantMessage = (turn: Turn) => ({
  role: "assistant" as const,
  content: turn.toolCalls.length > 0 && turn.content === "" ? null : turn.content,
  ...(turn.toolCalls.length > 0 ? { tool_calls: toolCalls(turn.toolCalls).map(({ index: _, ...c }) => c) } : {})
})

/**
 * A `chat.completion` body. Besides OpenAI's fields it carries the sampled `token_ids` and the `policy_version`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const chatCompletion = (id: string, created: number, model: string, turn: Turn, logprobs: boolean) => ({
  id,
  object: "chat.completion",
  created,
  model,
  choices: [{
    index: 0,
    message: assistantMessage(turn),
    logprobs: logprobs ? chatLogprobs(turn) : null,
    finish_reason: turn.finishReason,
    token_ids: turn.tokenIds
  }],
  usage: turnUsage(turn),
  policy_version: turn.policyVersion
})

/**
 * The server-sent events of a streamed chat completion: the role, the text, one delta per tool call, the finish
 * reason (with `token_ids` and `policy_version`), the usage when asked for, then `[DONE]`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const chatChunks = (
  id: string,
  created: number,
  model: string,
  turn: Turn,
  options: { readonly includeUsage: boolean; readonly logprobs: boolean }
): Array<string> => {
  const chunk = (choices: ReadonlyArray<unknown>, extra: Record<string, unknown> = {}) =>
    event({ id, object: "chat.completion.chunk", created, model, choices, ...extra })
  const delta = (d: Record<string, unknown>, more: Record<string, unknown> = {}) =>
    chunk([{ index: 0, delta: d, logprobs: null, finish_reason: null, ...more }])
  const events = [delta({ role: "assistant", content: "" })]
  if (turn.content !== "") {
    events.push(delta({ content: turn.content }, options.logprobs ? { logprobs: chatLogprobs(turn) } : {}))
  }
  for (const call of toolCalls(turn.toolCalls)) events.push(delta({ tool_calls: [call] }))
  events.push(chunk([{
    index: 0,
    delta: {},
    logprobs: null,
    finish_reason: turn.finishReason,
    token_ids: turn.tokenIds
  }], { policy_version: turn.policyVersion }))
  if (options.includeUsage) events.push(chunk([], { usage: turnUsage(turn) }))
  events.push(done)
  return events
}

/**
 * A `text_completion` body.
 *
 * @category constructors
 * @since 0.1.0
 */
export const textCompletion = (
  id: string,
  created: number,
  model: string,
  turn: Turn,
  text: string,
  promptTokenIds: ReadonlyArray<number>,
  logprobs: boolean
) => ({
  id,
  object: "text_completion",
  created,
  model,
  choices: [{
    index: 0,
    text,
    token_ids: turn.tokenIds,
    prompt_token_ids: promptTokenIds,
    logprobs: logprobs
      ? {
        tokens: turn.tokenIds.map((t) => `token_id:${t}`),
        token_logprobs: turn.logprobs,
        top_logprobs: null,
        text_offset: []
      }
      : null,
    finish_reason: turn.finishReason === "length" ? "length" : "stop"
  }],
  usage: turnUsage(turn),
  policy_version: turn.policyVersion
})

/**
 * The events of a streamed text completion (the whole text in one event).
 *
 * @category constructors
 * @since 0.1.0
 */
export const completionChunks = (id: string, created: number, model: string, turn: Turn, text: string) => {
  const chunk = (choice: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
    event({ id, object: "text_completion", created, model, choices: [{ index: 0, ...choice }], ...extra })
  return [
    chunk({ text, token_ids: turn.tokenIds, logprobs: null, finish_reason: null }),
    chunk(
      { text: "", token_ids: [], logprobs: null, finish_reason: turn.finishReason === "length" ? "length" : "stop" },
      { policy_version: turn.policyVersion }
    ),
    done
  ]
}

