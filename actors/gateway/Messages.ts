/**
 * Anthropic's Messages API (`POST /v1/messages`) as a pure translation to and from the one chat request the
 * recorder answers (`Bodies.ChatBody`) and the turn it sampled (`Bodies.Turn`). The wire is `@anthropic-ai/sdk`
 * 1.17's `resources/messages` definition (the tests check the bodies against its types).
 *
 * - **Request**: `system` (a string or text blocks) is the system message; a user message's `tool_result` blocks
 *   become tool messages (in their order) and its other blocks (`text`, `image`) one user message after them; an
 *   assistant message's `text` blocks are its content and its `tool_use` blocks its calls (`input` is the
 *   arguments). `thinking` blocks are dropped (the gateway never writes them); documents and server tools are
 *   refused. `tools` are `{ name, description?, input_schema }`. `max_tokens` is required, as Anthropic's API
 *   requires it; `stop_sequences` are refused (a cut inside a token is not token-in/token-out); `thinking`,
 *   `tool_choice`, `metadata` and the like are accepted and ignored. A `system` message inside `messages` (Claude
 *   Code's `mid-conversation-system` beta) is a system message there.
 * - **Answer**: a `message` with a `text` block (left out beside calls when empty) and a `tool_use` block per call
 *   (its `id` the episode's own `call_<n>`), `stop_reason` `tool_use`, `max_tokens` or `end_turn`, `usage`; or its
 *   stream: `message_start`, per block `content_block_start` / `content_block_delta` (`text_delta`,
 *   `input_json_delta`) / `content_block_stop`, `message_delta` (the stop reason and output tokens), `message_stop`.
 * - **Errors** are Anthropic's body, `{ type: "error", error: { type, message } }`.
 *
 * @since 0.1.0
 */
import type * as ChatTemplate from "../../src/ChatTemplate.ts"
import type * as Message from "../../src/Message.ts"
import { ApiError, type Check, invalid, isRecord } from "../internal/openAiWire.ts"
import * as Bodies from "./Bodies.ts"

// ===== Requests =====

/** `@anthropic-ai/sdk` 1.17 `MessageCreateParamsBase`'s fields, and the beta ones Claude Code sends. */
const documented = new Set([
  "model",
  "max_tokens",
  "messages",
  "cache_control",
  "container",
  "context_management",
  "diagnostics",
  "inference_geo",
  "mcp_servers",
  "metadata",
  "output_config",
  "output_format",
  "service_tier",
  "speed",
  "stop_sequences",
  "stream",
  "system",
  "temperature",
  "thinking",
  "tool_choice",
  "tools",
  "top_k",
  "top_p",
  "user_profile_id",
  "workspace_id"
])

/** The text of blocks that must all be text (`system`, a tool result's content). */
const textOf = (raw: unknown, param: string): Check<string> => {
  if (typeof raw === "string") return raw
  if (!Array.isArray(raw)) return invalid(`${param} must be a string or a list of text blocks`, param)
  const texts: Array<string> = []
  for (const [i, block] of raw.entries()) {
    if (!isRecord(block) || block["type"] !== "text" || typeof block["text"] !== "string") {
      return invalid(`${param}[${i}] must be a text block`, `${param}[${i}]`)
    }
    texts.push(block["text"])
  }
  return texts.join("\n")
}

const imageOf = (block: Record<string, unknown>, param: string): Check<Message.ContentPart> => {
  const source = block["source"]
  if (isRecord(source) && source["type"] === "base64" && typeof source["data"] === "string") {
    return { type: "image_url", image_url: { url: `data:${String(source["media_type"])};base64,${source["data"]}` } }
  }
  if (isRecord(source) && source["type"] === "url" && typeof source["url"] === "string") {
    return { type: "image_url", image_url: { url: source["url"] } }
  }
  return invalid(`${param}.source must be a base64 or url image source`, `${param}.source`)
}

/** A user message's blocks: its tool results as tool messages, then the rest as one user message. */
const userMessages = (content: unknown, param: string): Check<Array<Message.Message>> => {
  if (typeof content === "string") return [{ role: "user", content }]
  if (!Array.isArray(content)) return invalid(`${param} must be a string or a list of blocks`, param)
  const results: Array<Message.Message> = []
  const parts: Array<Message.ContentPart> = []
  for (const [i, block] of content.entries()) {
    const p = `${param}[${i}]`
    const type = isRecord(block) ? block["type"] : undefined
    if (type === "text" && typeof block!["text"] === "string") parts.push({ type: "text", text: block!["text"] })
    else if (type === "image") {
      const image = imageOf(block!, p)
      if (image instanceof ApiError) return image
      parts.push(image)
    } else if (type === "tool_result" && typeof block!["tool_use_id"] === "string") {
      const text = textOf(block!["content"] ?? "", `${p}.content`)
      if (text instanceof ApiError) return text
      results.push({ role: "tool", tool_call_id: block!["tool_use_id"], content: text })
    } else return invalid(`${p}: a ${JSON.stringify(type)} block is not supported here (text, image, tool_result)`, p)
  }
  const rest: Array<Message.Message> = parts.length === 0
    ? []
    : [{ role: "user", content: parts.every((x) => x.type === "text") ? parts.map((x) => x.text).join("") : parts }]
  return [...results, ...rest]
}

const assistantMessage = (content: unknown, param: string): Check<Message.Message> => {
  if (typeof content === "string") return { role: "assistant", content }
  if (!Array.isArray(content)) return invalid(`${param} must be a string or a list of blocks`, param)
  let text = ""
  const calls: Array<Message.ToolCall> = []
  for (const [i, block] of content.entries()) {
    const p = `${param}[${i}]`
    const type = isRecord(block) ? block["type"] : undefined
    if (type === "text" && typeof block!["text"] === "string") text += block!["text"]
    else if (type === "tool_use" && typeof block!["id"] === "string" && typeof block!["name"] === "string") {
      calls.push({ id: block!["id"], type: "function", function: { name: block!["name"], arguments: block!["input"] } })
    } else if (type !== "thinking" && type !== "redacted_thinking") {
      return invalid(`${p}: a ${JSON.stringify(type)} block is not supported here (text, tool_use)`, p)
    }
  }
  return { role: "assistant", content: text, ...(calls.length > 0 ? { tool_calls: calls } : {}) }
}

const toolsOf = (raw: unknown): Check<Array<ChatTemplate.ToolSpec>> => {
  if (raw === undefined || raw === null) return []
  if (!Array.isArray(raw)) return invalid("tools must be a list", "tools")
  const tools: Array<ChatTemplate.ToolSpec> = []
  for (const [i, t] of raw.entries()) {
    const custom = isRecord(t) && (t["type"] === undefined || t["type"] === null || t["type"] === "custom")
    if (!custom || typeof t["name"] !== "string" || !isRecord(t["input_schema"])) {
      const type = isRecord(t) && typeof t["type"] === "string" ? `${t["type"]} tools are` : "this tool is"
      return invalid(`tools.${i}: ${type} not supported: use { name, description?, input_schema }`, `tools.${i}`)
    }
    const description = t["description"]
    tools.push({
      type: "function",
      function: {
        name: t["name"],
        ...(typeof description === "string" ? { description } : {}),
        parameters: t["input_schema"]
      }
    })
  }
  return tools
}

/**
 * Checks a `/v1/messages` body into the chat request the recorder answers.
 *
 * @category constructors
 * @since 0.1.0
 */
export const decode = (body: unknown): Check<Bodies.ChatBody> => {
  if (!isRecord(body)) return invalid("the request body must be a JSON object")
  const unknown = Bodies.unknownFields(body, documented)
  if (unknown !== undefined) {
    return new ApiError({ ...unknown, message: `${unknown.param}: Extra inputs are not permitted` })
  }
  const maxTokens = Bodies.numberField(body, "max_tokens", { min: 1, integer: true })
  if (maxTokens instanceof ApiError) return maxTokens
  if (maxTokens === undefined) return invalid("max_tokens: Field required", "max_tokens")
  const temperature = Bodies.numberField(body, "temperature", { min: 0, max: 1 })
  if (temperature instanceof ApiError) return temperature
  const topP = Bodies.numberField(body, "top_p", { min: 0, max: 1 })
  if (topP instanceof ApiError) return topP
  const topK = Bodies.numberField(body, "top_k", { min: 0, integer: true })
  if (topK instanceof ApiError) return topK
  const stops = body["stop_sequences"]
  if (Array.isArray(stops) && stops.length > 0) {
    return invalid("stop_sequences are not supported (a cut inside a token breaks token-in/token-out)",
      "stop_sequences")
  }
  const stream = body["stream"] ?? false
  if (typeof stream !== "boolean") return invalid("stream must be a boolean", "stream")
  const messages: Array<Message.Message> = []
  if (body["system"] !== undefined && body["system"] !== null) {
    const system = textOf(body["system"], "system")
    if (system instanceof ApiError) return system
    messages.push({ role: "system", content: system })
  }
  const raw = body["messages"]
  if (!Array.isArray(raw) || raw.length === 0) return invalid("messages: a non-empty list is required", "messages")
  for (const [i, m] of raw.entries()) {
    const param = `messages.${i}`
    if (!isRecord(m)) return invalid(`${param} must be an object`, param)
    if (m["role"] === "user") {
      const some = userMessages(m["content"], `${param}.content`)
      if (some instanceof ApiError) return some
      messages.push(...some)
    } else if (m["role"] === "assistant") {
      const one = assistantMessage(m["content"], `${param}.content`)
      if (one instanceof ApiError) return one
      messages.push(one)
    } else if (m["role"] === "system") {
      // The mid-conversation system message of Claude Code's `mid-conversation-system` beta.
      const text = textOf(m["content"], `${param}.content`)
      if (text instanceof ApiError) return text
      messages.push({ role: "system", content: text })
    } else return invalid(`${param}.role must be user or assistant`, `${param}.role`)
  }
  const orphan = Bodies.toolReplyProblem(messages)
  if (orphan !== undefined) {
    const id = (messages[orphan.index] as Extract<Message.Message, { role: "tool" }>).tool_call_id
    return invalid(`unexpected \`tool_use_id\` found in \`tool_result\` blocks: ${id}. Each \`tool_result\` block ` +
      "must have a corresponding `tool_use` block in the previous message.", "messages")
  }
  const tools = toolsOf(body["tools"])
  if (tools instanceof ApiError) return tools
  return Bodies.chatBodyOf(messages, tools, { maxTokens, temperature, topP, topK, stream })
}

/**
 * Checks a `/v1/messages/count_tokens` body (a messages request without `max_tokens` or `stream`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const decodeCount = (body: unknown): Check<Bodies.ChatBody> =>
  isRecord(body) && body["max_tokens"] === undefined ? decode({ ...body, max_tokens: 1 }) : decode(body)

// ===== Responses =====

const stopReason = (turn: Bodies.Turn) =>
  turn.toolCalls.length > 0
    ? "tool_use" as const
    : turn.finishReason === "length"
    ? "max_tokens" as const
    : "end_turn" as const

/** A call's arguments as `tool_use.input`: an object (what a model wrote that is no object is kept under `_raw`). */
const inputOf = (args: unknown): unknown => (isRecord(args) ? args : { _raw: args })

const blocks = (turn: Bodies.Turn) => [
  ...(turn.content !== "" || turn.toolCalls.length === 0
    ? [{ type: "text" as const, text: turn.content, citations: null }]
    : []),
  ...turn.toolCalls.map((c) => ({
    type: "tool_use" as const,
    id: c.id,
    name: c.function.name,
    input: inputOf(c.function.arguments),
    caller: { type: "direct" as const }
  }))
]

const usageOf = (turn: Bodies.Turn, outputTokens: number) => ({
  input_tokens: turn.promptTokens,
  output_tokens: outputTokens,
  cache_creation_input_tokens: 0,
  cache_read_input_tokens: 0,
  cache_creation: null,
  inference_geo: null,
  output_tokens_details: null,
  server_tool_use: null,
  service_tier: "standard" as const,
  speed: null
})

/**
 * The `message` answering a turn; besides Anthropic's fields it carries the sampled `token_ids` and the
 * `policy_version`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const message = (id: string, model: string, turn: Bodies.Turn) => ({
  id,
  type: "message" as const,
  role: "assistant" as const,
  model,
  content: blocks(turn),
  stop_reason: stopReason(turn),
  stop_sequence: null,
  stop_details: null,
  container: null,
  diagnostics: null,
  usage: usageOf(turn, turn.tokenIds.length),
  token_ids: turn.tokenIds,
  policy_version: turn.policyVersion
})

/**
 * The stream of a turn: `message_start`, each block's start, one delta and stop, `message_delta`, `message_stop`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const events = (id: string, model: string, turn: Bodies.Turn): Array<string> => {
  const out: Array<string> = []
  const emit = (type: string, fields: Record<string, unknown>) => out.push(Bodies.namedEvent(type, { type, ...fields }))
  const start = {
    ...message(id, model, turn),
    content: [],
    stop_reason: null,
    usage: usageOf(turn, 0)
  }
  emit("message_start", { message: start })
  blocks(turn).forEach((block, index) => {
    if (block.type === "text") {
      emit("content_block_start", { index, content_block: { ...block, text: "" } })
      emit("content_block_delta", { index, delta: { type: "text_delta", text: block.text } })
    } else {
      emit("content_block_start", { index, content_block: { ...block, input: {} } })
      const partial = JSON.stringify(block.input)
      emit("content_block_delta", { index, delta: { type: "input_json_delta", partial_json: partial } })
    }
    emit("content_block_stop", { index })
  })
  emit("message_delta", {
    delta: { stop_reason: stopReason(turn), stop_sequence: null },
    usage: { output_tokens: turn.tokenIds.length }
  })
  emit("message_stop", {})
  return out
}

/**
 * Anthropic's error body for an API error (its `type` from the status).
 *
 * @category constructors
 * @since 0.1.0
 */
export const errorBody = (e: ApiError) => ({
  type: "error" as const,
  error: {
    type: e.status === 401
      ? "authentication_error"
      : e.status === 404
      ? "not_found_error"
      : e.status === 413
      ? "request_too_large"
      : e.status === 429
      ? "rate_limit_error"
      : e.status === 503
      ? "overloaded_error"
      : e.status >= 500
      ? "api_error"
      : "invalid_request_error",
    message: e.message
  }
})
