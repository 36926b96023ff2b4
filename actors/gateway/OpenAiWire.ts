/**
 * The OpenAI chat-completions wire format as the gateway speaks it: request bodies checked field by field (a bad
 * one is an OpenAI-style 4xx `{ error: { message, type, param, code } }` naming the field), messages converted to
 * the project's `Message` schema and back, the canonical key of a message (how a conversation sent back is matched
 * to what was sampled), and the response, chunk and error bodies.
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
import * as Http from "node:http"
import { Data, Effect, Option, Schema } from "effect"
import type * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Message from "../../src/Message.ts"
import * as OpenAiRequest from "../internal/openAiRequest.ts"

// ===== Errors =====

/**
 * An error answered to the client with `status`. (An in-process error: it never leaves the gateway, which writes
 * it as an OpenAI error body.)
 *
 * @category errors
 * @since 0.1.0
 */
export class ApiError extends Data.TaggedError("ApiError")<{
  readonly status: number
  readonly message: string
  readonly param?: string | undefined
  readonly code?: string | undefined
}> {}

/**
 * A 400 `invalid_request_error`.
 *
 * @category errors
 * @since 0.1.0
 */
export const invalid = (message: string, param?: string, code?: string): ApiError =>
  new ApiError({ status: 400, message, param, code })

/**
 * The OpenAI error body of an error.
 *
 * @category constructors
 * @since 0.1.0
 */
export const errorBody = (e: ApiError) => ({
  error: {
    message: e.message,
    type: e.status >= 500 ? "server_error" : e.status === 404 ? "not_found_error" : "invalid_request_error",
    param: e.param ?? null,
    code: e.code ?? null
  }
})

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

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

type Check<A> = A | ApiError

/** The fields the gateway reads beyond OpenAI's documented ones (vLLM's). */
const extensions: { readonly [E in OpenAiRequest.Endpoint]: ReadonlyArray<string> } = {
  chat: ["top_k", "stop_token_ids"],
  completion: ["top_k", "stop_token_ids", "max_completion_tokens"]
}

/** The shared rules (`internal/openAiRequest.ts`): known fields, OpenAI's ranges and types, one choice. */
const checkShared = (body: Record<string, unknown>, endpoint: OpenAiRequest.Endpoint): ApiError | undefined => {
  const refused = OpenAiRequest.check(body, endpoint, extensions[endpoint])
  return refused === undefined ? undefined : invalid(refused.message, refused.param, refused.code)
}

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

const decodeJson = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))

/** Tool-call arguments arrive as a JSON string: the decoded value, or the string itself when it is not JSON. */
const parseArguments = (args: unknown): unknown =>
  typeof args === "string" ? Option.getOrElse(decodeJson(args), () => args) : args

const contentOf = (raw: unknown, param: string, allowNull: boolean): Check<Message.Content> => {
  if (raw === undefined || raw === null) return allowNull ? "" : invalid(`${param} is required`, param)
  if (typeof raw === "string") return raw
  if (!Array.isArray(raw)) return invalid(`${param} must be a string or a list of content parts`, param)
  const parts: Array<Message.ContentPart> = []
  for (const [i, part] of raw.entries()) {
    if (isRecord(part) && (part["type"] === "text" || part["type"] === "input_text") && typeof part["text"] === "string") {
      parts.push({ type: "text", text: part["text"] })
    } else if (isRecord(part) && part["type"] === "image_url" && isRecord(part["image_url"])) {
      const url = part["image_url"]["url"]
      if (typeof url !== "string") return invalid(`${param}[${i}].image_url.url must be a string`, `${param}[${i}]`)
      parts.push({ type: "image_url", image_url: { url } })
    } else {
      return invalid(`${param}[${i}] is not a text or image_url part`, `${param}[${i}]`)
    }
  }
  return parts
}

const toolCallsOf = (raw: unknown, param: string): Check<Array<Message.ToolCall>> => {
  if (!Array.isArray(raw)) return invalid(`${param} must be a list`, param)
  const calls: Array<Message.ToolCall> = []
  for (const [j, c] of raw.entries()) {
    const p = `${param}[${j}]`
    const fn = isRecord(c) ? c["function"] : undefined
    if (!isRecord(c) || typeof c["id"] !== "string" || !isRecord(fn) || typeof fn["name"] !== "string") {
      return invalid(`${p} must be { id, type: "function", function: { name, arguments } }`, p)
    }
    calls.push({ id: c["id"], type: "function", function: { name: fn["name"], arguments: parseArguments(fn["arguments"] ?? "{}") } })
  }
  return calls
}

/**
 * One OpenAI message as a `Message` (`developer` is `system`; `content: null` beside tool calls is empty).
 *
 * @category constructors
 * @since 0.1.0
 */
export const toMessage = (raw: unknown, index: number): Check<Message.Message> => {
  const param = `messages[${index}]`
  if (!isRecord(raw)) return invalid(`${param} must be an object`, param)
  const role = raw["role"]
  switch (role) {
    case "system":
    case "developer":
    case "user": {
      const content = contentOf(raw["content"], `${param}.content`, false)
      if (content instanceof ApiError) return content
      return { role: role === "user" ? "user" : "system", content }
    }
    case "assistant": {
      const rawCalls = raw["tool_calls"]
      const calls = rawCalls === undefined || rawCalls === null ? [] : toolCallsOf(rawCalls, `${param}.tool_calls`)
      if (calls instanceof ApiError) return calls
      const content = contentOf(raw["content"], `${param}.content`, true)
      if (content instanceof ApiError) return content
      const reasoning = raw["reasoning_content"]
      return {
        role: "assistant",
        content,
        ...(calls.length > 0 ? { tool_calls: calls } : {}),
        ...(typeof reasoning === "string" ? { reasoning_content: reasoning } : {})
      }
    }
    case "tool": {
      const id = raw["tool_call_id"]
      if (typeof id !== "string") return invalid(`${param}.tool_call_id must be a string`, `${param}.tool_call_id`)
      const content = contentOf(raw["content"], `${param}.content`, true)
      if (content instanceof ApiError) return content
      const name = raw["name"]
      return { role: "tool", content, tool_call_id: id, ...(typeof name === "string" ? { name } : {}) }
    }
    default:
      return invalid(`${param}.role must be system, developer, user, assistant or tool`, `${param}.role`)
  }
}

const toolsOf = (raw: unknown): Check<Array<ChatTemplate.ToolSpec>> => {
  if (raw === undefined || raw === null) return []
  if (!Array.isArray(raw)) return invalid("tools must be a list", "tools")
  const tools: Array<ChatTemplate.ToolSpec> = []
  for (const [i, t] of raw.entries()) {
    const fn = isRecord(t) ? t["function"] : undefined
    if (!isRecord(t) || t["type"] !== "function" || !isRecord(fn) || typeof fn["name"] !== "string") {
      return invalid(`tools[${i}] must be { type: "function", function: { name, description?, parameters? } }`, `tools[${i}]`)
    }
    const description = fn["description"]
    // The shape chat templates render (and `Tool.functionSchema` writes): extra keys such as `strict` are dropped.
    tools.push({
      type: "function",
      function: {
        name: fn["name"],
        ...(typeof description === "string" ? { description } : {}),
        ...(fn["parameters"] === undefined ? {} : { parameters: fn["parameters"] })
      }
    })
  }
  return tools
}

const lift = <A>(check: Check<A>): Effect.Effect<A, ApiError> =>
  check instanceof ApiError ? Effect.fail(check) : Effect.succeed(check)

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
    const tools = toolsOf(body["tools"])
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

const wireCalls = (calls: ReadonlyArray<Message.ToolCall>) =>
  calls.map((c, index) => ({
    index,
    id: c.id,
    type: "function" as const,
    function: {
      name: c.function.name,
      arguments: typeof c.function.arguments === "string" ? c.function.arguments : JSON.stringify(c.function.arguments)
    }
  }))

const usage = (turn: Turn) => ({
  prompt_tokens: turn.promptTokens,
  completion_tokens: turn.tokenIds.length,
  total_tokens: turn.promptTokens + turn.tokenIds.length
})

const chatLogprobs = (turn: Turn) => ({
  content: turn.tokenIds.map((id, i) => ({ token: `token_id:${id}`, logprob: turn.logprobs[i]!, bytes: null, top_logprobs: [] }))
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
  ...(turn.toolCalls.length > 0 ? { tool_calls: wireCalls(turn.toolCalls).map(({ index: _, ...c }) => c) } : {})
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
  usage: usage(turn),
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
    `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model, choices, ...extra })}\n\n`
  const delta = (d: Record<string, unknown>, more: Record<string, unknown> = {}) =>
    chunk([{ index: 0, delta: d, logprobs: null, finish_reason: null, ...more }])
  const events = [delta({ role: "assistant", content: "" })]
  if (turn.content !== "") {
    events.push(delta({ content: turn.content }, options.logprobs ? { logprobs: chatLogprobs(turn) } : {}))
  }
  for (const call of wireCalls(turn.toolCalls)) events.push(delta({ tool_calls: [call] }))
  events.push(chunk([{
    index: 0,
    delta: {},
    logprobs: null,
    finish_reason: turn.finishReason,
    token_ids: turn.tokenIds
  }], { policy_version: turn.policyVersion }))
  if (options.includeUsage) events.push(chunk([], { usage: usage(turn) }))
  events.push("data: [DONE]\n\n")
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
      ? { tokens: turn.tokenIds.map((t) => `token_id:${t}`), token_logprobs: turn.logprobs, top_logprobs: null, text_offset: [] }
      : null,
    finish_reason: turn.finishReason === "length" ? "length" : "stop"
  }],
  usage: usage(turn),
  policy_version: turn.policyVersion
})

/**
 * The events of a streamed text completion (the whole text in one event).
 *
 * @category constructors
 * @since 0.1.0
 */
export const completionChunks = (id: string, created: number, model: string, turn: Turn, text: string) => {
  const event = (choice: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
    `data: ${JSON.stringify({ id, object: "text_completion", created, model, choices: [{ index: 0, ...choice }], ...extra })}\n\n`
  return [
    event({ text, token_ids: turn.tokenIds, logprobs: null, finish_reason: null }),
    event({ text: "", token_ids: [], logprobs: null, finish_reason: turn.finishReason === "length" ? "length" : "stop" }, {
      policy_version: turn.policyVersion
    }),
    "data: [DONE]\n\n"
  ]
}

// ===== HTTP =====

/**
 * Reads a JSON body of at most `maxBytes` (413 beyond, 400 when it is not JSON).
 *
 * @category constructors
 * @since 0.1.0
 */
export const readJson = (req: Http.IncomingMessage, maxBytes: number): Effect.Effect<unknown, ApiError> =>
  Effect.callback<unknown, ApiError>((resume) => {
    const chunks: Array<Buffer> = []
    let size = 0
    let done = false
    req.on("data", (c: Buffer) => {
      size += c.length
      if (size > maxBytes && !done) {
        done = true
        resume(Effect.fail(new ApiError({ status: 413, message: `the request body exceeds ${maxBytes} bytes` })))
      } else if (!done) chunks.push(c)
    })
    req.on("end", () => {
      if (done) return
      done = true
      const text = Buffer.concat(chunks).toString("utf8")
      // No body at all is an empty object (`curl -X POST …/end`); each route's Schema then names what it lacks.
      if (text.trim() === "") return resume(Effect.succeed({}))
      // JSON.parse itself: a Schema decode of the same text costs several times more, on every request.
      resume(Effect.try({ try: () => JSON.parse(text) as unknown, catch: () => invalid("the request body is not valid JSON") }))
    })
    req.on("error", () => {
      if (!done) resume(Effect.fail(invalid("the request body could not be read")))
      done = true
    })
  })

/**
 * Answers `value` as JSON (or just ends the response when headers already went out).
 *
 * @category constructors
 * @since 0.1.0
 */
export const sendJson = (res: Http.ServerResponse, status: number, value: unknown): Effect.Effect<void> =>
  Effect.sync(() => {
    if (res.headersSent) {
      res.end()
      return
    }
    res.writeHead(status, { "content-type": "application/json" })
    res.end(JSON.stringify(value))
  })

/**
 * Writes server-sent events and ends the response.
 *
 * @category constructors
 * @since 0.1.0
 */
export const sendEvents = (res: Http.ServerResponse, events: ReadonlyArray<string>): Effect.Effect<void> =>
  Effect.sync(() => {
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" })
    res.end(events.join(""))
  })
