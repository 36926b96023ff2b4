/**
 * OpenAI's Responses API (`POST /v1/responses`) as a pure translation to and from the one chat request the recorder
 * answers (`Bodies.ChatBody`) and the turn it sampled (`Bodies.Turn`): a request's `instructions` and `input` items
 * become messages, its function tools tool specs; the turn becomes `output` items, a `response` object or the
 * documented stream of events. The wire is openai-node 7.59's `resources/responses` definition (the tests check the
 * bodies against its types).
 *
 * - **Input**: a string (one user message) or items: messages (`user`, `system`, `developer`, `assistant`; text
 *   as a string or `input_text` / `output_text` / `input_image` parts), `function_call` (folded into the assistant
 *   message before it, as the chat template renders calls), `function_call_output` (a tool message). `reasoning`
 *   items are dropped (the gateway never writes them); `item_reference`, files and built-in tools are refused.
 * - **Chains**: with `previous_response_id`, the stored conversation of that response (its input and output; not
 *   its `instructions`, as OpenAI does) comes before the new input. Responses are stored per episode unless
 *   `store: false`; an unknown id is a 400 naming it.
 * - **Ids**: `resp_<n>`, `msg_<n>`, `fc_<n>_<k>`; a function call's `call_id` is the episode's own (`call_<n>`),
 *   which the recorder maps back to the transcript's.
 * - **Refused as OpenAI refuses**: an unknown field, a `function_call_output` whose `call_id` answers no call.
 *
 * @since 0.1.0
 */
import type * as ChatTemplate from "../../src/ChatTemplate.ts"
import type * as Message from "../../src/Message.ts"
import { ApiError, type Check, invalid, isRecord, parseArguments, toolCalls } from "../internal/openAiWire.ts"
import * as Bodies from "./Bodies.ts"

// ===== Requests =====

/**
 * A checked Responses request.
 *
 * @category models
 * @since 0.1.0
 */
export interface Request {
  /** What the recorder answers: `instructions` (a system message), the chain's conversation, the new input. */
  readonly chat: Bodies.ChatBody
  /** The conversation to store under the response (without `instructions`), before its output. */
  readonly conversation: ReadonlyArray<Message.Message>
  readonly instructions: string | null
  readonly previousResponseId: string | null
  readonly store: boolean
  /** Echoed in the response, as sent. */
  readonly echo: {
    readonly tools: ReadonlyArray<unknown>
    readonly toolChoice: unknown
    readonly parallelToolCalls: boolean
    readonly maxOutputTokens: number | null
    readonly temperature: number | null
    readonly topP: number | null
    readonly metadata: unknown
  }
}

/** openai-node 7.59 `ResponseCreateParamsBase`'s fields. */
const documented = new Set([
  "access_programs",
  "background",
  "background_options",
  "context_management",
  "conversation",
  "image",
  "include",
  "input",
  "instructions",
  "max_output_tokens",
  "max_tool_calls",
  "metadata",
  "model",
  "moderation",
  "parallel_tool_calls",
  "previous_response_id",
  "prompt",
  "prompt_cache_key",
  "prompt_cache_options",
  "prompt_cache_retention",
  "reasoning",
  "safety_identifier",
  "service_tier",
  "store",
  "stream",
  "stream_options",
  "temperature",
  "text",
  "tool_choice",
  "tools",
  "top_logprobs",
  "top_p",
  "truncation",
  "user"
])

/** Fields whose non-empty values ask for what a recording gateway cannot do. */
const unsupported: ReadonlyArray<readonly [string, string]> = [
  ["conversation", "conversation objects are not supported: send the input, or chain with previous_response_id"],
  ["prompt", "stored prompts are not supported: send instructions and input"],
  ["background", "background responses are not supported"]
]

/** Text of `content` parts (`input_text`, `output_text`, `refusal`) or an image part; anything else is refused. */
const contentOf = (raw: unknown, param: string): Check<Message.Content> => {
  if (typeof raw === "string") return raw
  if (!Array.isArray(raw)) return invalid(`${param} must be a string or a list of content parts`, param)
  const parts: Array<Message.ContentPart> = []
  for (const [i, part] of raw.entries()) {
    const p = `${param}[${i}]`
    if (!isRecord(part)) return invalid(`${p} must be a content part`, p)
    const type = part["type"]
    if ((type === "input_text" || type === "output_text") && typeof part["text"] === "string") {
      parts.push({ type: "text", text: part["text"] })
    } else if (type === "refusal" && typeof part["refusal"] === "string") {
      parts.push({ type: "text", text: part["refusal"] })
    } else if (type === "input_image" && typeof part["image_url"] === "string") {
      parts.push({ type: "image_url", image_url: { url: part["image_url"] } })
    } else {
      return invalid(`${p}: a ${String(type)} part is not supported (input_text, output_text, input_image with ` +
        `image_url)`, p)
    }
  }
  return parts.length === 1 && parts[0]!.type === "text" ? parts[0]!.text : parts
}

type Building = { role: "assistant"; content: Message.Content; tool_calls?: Array<Message.ToolCall> } | Message.Message

/** One item of `input` added to `out` (a function call folded into the assistant message just before it). */
const addItem = (out: Array<Building>, item: unknown, param: string): ApiError | undefined => {
  if (!isRecord(item)) return invalid(`${param} must be an object`, param)
  const type = item["type"] ?? (item["role"] !== undefined ? "message" : undefined)
  switch (type) {
    case "message": {
      const role = item["role"]
      const content = contentOf(item["content"], `${param}.content`)
      if (content instanceof ApiError) return content
      if (role === "user" || role === "system" || role === "developer") {
        out.push({ role: role === "user" ? "user" : "system", content })
      } else if (role === "assistant") out.push({ role: "assistant", content })
      else return invalid(`${param}.role must be user, system, developer or assistant`, `${param}.role`)
      return undefined
    }
    case "function_call": {
      const { call_id: id, name, arguments: args } = item
      if (typeof id !== "string" || typeof name !== "string" || typeof args !== "string") {
        return invalid(`${param} must be { type: "function_call", call_id, name, arguments }`, param)
      }
      const call: Message.ToolCall = { id, type: "function", function: { name, arguments: parseArguments(args) } }
      const last = out.at(-1)
      if (last?.role === "assistant") (last as { tool_calls?: Array<Message.ToolCall> }).tool_calls = [
        ...(last.tool_calls ?? []),
        call
      ]
      else out.push({ role: "assistant", content: "", tool_calls: [call] })
      return undefined
    }
    case "function_call_output": {
      const id = item["call_id"]
      if (typeof id !== "string") return invalid(`${param}.call_id must be a string`, `${param}.call_id`)
      const content = contentOf(item["output"], `${param}.output`)
      if (content instanceof ApiError) return content
      out.push({ role: "tool", tool_call_id: id, content })
      return undefined
    }
    case "reasoning":
      return undefined
    default:
      return invalid(
        `${param}: ${JSON.stringify(type)} items are not supported (message, function_call, function_call_output)`,
        param
      )
  }
}

/**
 * The messages of `input` (a string is one user message), or the first problem.
 *
 * @category constructors
 * @since 0.1.0
 */
export const inputMessages = (input: unknown): Check<Array<Message.Message>> => {
  if (typeof input === "string") return [{ role: "user", content: input }]
  if (!Array.isArray(input)) return invalid("input must be a string or a list of items", "input")
  const out: Array<Building> = []
  for (const [i, item] of input.entries()) {
    const problem = addItem(out, item, `input[${i}]`)
    if (problem !== undefined) return problem
  }
  return out as Array<Message.Message>
}

/** Function tools as tool specs; any other tool type is refused. */
const toolsOf = (raw: unknown): Check<Array<ChatTemplate.ToolSpec>> => {
  if (raw === undefined || raw === null) return []
  if (!Array.isArray(raw)) return invalid("tools must be a list", "tools")
  const tools: Array<ChatTemplate.ToolSpec> = []
  for (const [i, t] of raw.entries()) {
    if (!isRecord(t) || t["type"] !== "function" || typeof t["name"] !== "string") {
      const type = isRecord(t) ? JSON.stringify(t["type"]) : "this"
      const use = `use { type: "function", name, parameters }`
      return invalid(`tools[${i}]: ${type} tools are not supported: ${use}`, `tools[${i}]`)
    }
    const description = t["description"]
    tools.push({
      type: "function",
      function: {
        name: t["name"],
        ...(typeof description === "string" ? { description } : {}),
        ...(t["parameters"] === undefined || t["parameters"] === null ? {} : { parameters: t["parameters"] })
      }
    })
  }
  return tools
}

/** The fields beside `input` and `tools`: the ones that ask for the unsupported, text formats, numbers. */
const optionsOf = (body: Record<string, unknown>) => {
  for (const [key, why] of unsupported) {
    const v = body[key]
    if (v !== undefined && v !== null && v !== false) return invalid(why, key)
  }
  const format = isRecord(body["text"]) ? body["text"]["format"] : undefined
  if (isRecord(format) && format["type"] !== "text") {
    return invalid(`text.format ${JSON.stringify(format["type"])} is not supported (text only)`, "text.format")
  }
  const maxOutputTokens = Bodies.numberField(body, "max_output_tokens", { min: 1, integer: true })
  if (maxOutputTokens instanceof ApiError) return maxOutputTokens
  const temperature = Bodies.numberField(body, "temperature", { min: 0, max: 2 })
  if (temperature instanceof ApiError) return temperature
  const topP = Bodies.numberField(body, "top_p", { min: 0, max: 1 })
  if (topP instanceof ApiError) return topP
  for (const key of ["store", "stream", "parallel_tool_calls"]) {
    const v = body[key]
    if (v !== undefined && v !== null && typeof v !== "boolean") return invalid(`${key} must be a boolean`, key)
  }
  const instructions = body["instructions"]
  if (instructions !== undefined && instructions !== null && typeof instructions !== "string") {
    return invalid("instructions must be a string", "instructions")
  }
  const previous = body["previous_response_id"]
  if (previous !== undefined && previous !== null && typeof previous !== "string") {
    return invalid("previous_response_id must be a string", "previous_response_id")
  }
  return { maxOutputTokens, temperature, topP, instructions: instructions ?? null, previous: previous ?? null }
}

/**
 * Checks a `/v1/responses` body; `stored` gives the conversation of a stored response of the episode.
 *
 * @category constructors
 * @since 0.1.0
 */
export const decode = (
  body: unknown,
  stored: (id: string) => ReadonlyArray<Message.Message> | undefined
): Check<Request> => {
  if (!isRecord(body)) return invalid("the request body must be a JSON object")
  const unknown = Bodies.unknownFields(body, documented)
  if (unknown !== undefined) return unknown
  const options = optionsOf(body)
  if (options instanceof ApiError) return options
  const input = inputMessages(body["input"] ?? [])
  if (input instanceof ApiError) return input
  const tools = toolsOf(body["tools"])
  if (tools instanceof ApiError) return tools
  const earlier = options.previous === null ? [] : stored(options.previous)
  if (earlier === undefined) {
    return invalid(`Previous response with id '${options.previous}' not found.`, "previous_response_id",
      "previous_response_not_found")
  }
  const conversation = [...earlier, ...input]
  if (conversation.length === 0) return invalid("input must hold at least one item", "input")
  const orphan = Bodies.toolReplyProblem(conversation)
  if (orphan !== undefined) {
    const id = (conversation[orphan.index] as Extract<Message.Message, { role: "tool" }>).tool_call_id
    return invalid(`No tool call found for function call output with call_id ${id}.`, "input")
  }
  const messages: Array<Message.Message> = options.instructions === null
    ? conversation
    : [{ role: "system", content: options.instructions }, ...conversation]
  const stream = body["stream"] === true
  return {
    chat: Bodies.chatBodyOf(messages, tools, {
      maxTokens: options.maxOutputTokens,
      temperature: options.temperature,
      topP: options.topP,
      topK: undefined,
      stream
    }),
    conversation,
    instructions: options.instructions,
    previousResponseId: options.previous,
    store: body["store"] !== false,
    echo: {
      tools: Array.isArray(body["tools"]) ? body["tools"] : [],
      toolChoice: body["tool_choice"] ?? "auto",
      parallelToolCalls: body["parallel_tool_calls"] !== false,
      maxOutputTokens: options.maxOutputTokens ?? null,
      temperature: options.temperature ?? null,
      topP: options.topP ?? null,
      metadata: isRecord(body["metadata"]) ? body["metadata"] : {}
    }
  }
}

// ===== Responses =====

/**
 * What a response is written from: its ids and time, the model, the request and the sampled turn.
 *
 * @category models
 * @since 0.1.0
 */
export interface Answer {
  /** The n of `resp_<n>`, `msg_<n>`, `fc_<n>_<k>`. */
  readonly n: number
  readonly createdAt: number
  readonly model: string
  readonly request: Request
  readonly turn: Bodies.Turn
}

/**
 * The assistant message a turn adds to the conversation (what a chained request continues from): the shape the
 * recorder keyed it by.
 *
 * @category constructors
 * @since 0.1.0
 */
export const assistantOf = (turn: Bodies.Turn): Message.Message => ({
  role: "assistant",
  content: turn.content,
  ...(turn.toolCalls.length > 0 ? { tool_calls: turn.toolCalls } : {})
})

const outputItems = (answer: Answer, status: "completed" | "in_progress") => {
  const { turn, n } = answer
  const items: Array<Record<string, unknown>> = []
  if (turn.content !== "" || turn.toolCalls.length === 0) {
    items.push({
      type: "message",
      id: `msg_${n}`,
      status,
      role: "assistant",
      content: [{ type: "output_text", text: turn.content, annotations: [], logprobs: [] }]
    })
  }
  for (const [k, call] of toolCalls(turn.toolCalls).entries()) {
    items.push({
      type: "function_call",
      id: `fc_${n}_${k}`,
      call_id: call.id,
      name: call.function.name,
      arguments: call.function.arguments,
      status
    })
  }
  return items
}

/**
 * The `response` object of an answer (`status` `completed`, or `incomplete` when the turn was cut by max tokens);
 * besides OpenAI's fields it carries the sampled `token_ids` and the `policy_version`. While streaming, the
 * `in_progress` one has no output yet.
 *
 * @category constructors
 * @since 0.1.0
 */
export const response = (answer: Answer, phase: "in_progress" | "done" = "done") => {
  const { request, turn } = answer
  const cut = turn.finishReason === "length"
  const done = phase === "done"
  const output = done ? outputItems(answer, "completed") : []
  return {
    id: `resp_${answer.n}`,
    object: "response" as const,
    created_at: answer.createdAt,
    status: !done ? "in_progress" as const : cut ? "incomplete" as const : "completed" as const,
    error: null,
    incomplete_details: done && cut ? { reason: "max_output_tokens" as const } : null,
    instructions: request.instructions,
    max_output_tokens: request.echo.maxOutputTokens,
    model: answer.model,
    output,
    output_text: done ? turn.content : "",
    parallel_tool_calls: request.echo.parallelToolCalls,
    previous_response_id: request.previousResponseId,
    reasoning: { effort: null, summary: null },
    store: request.store,
    temperature: request.echo.temperature,
    text: { format: { type: "text" as const } },
    tool_choice: request.echo.toolChoice,
    tools: request.echo.tools,
    top_p: request.echo.topP,
    truncation: "disabled" as const,
    metadata: request.echo.metadata,
    access_programs: null,
    ...(done
      ? {
        usage: {
          input_tokens: turn.promptTokens,
          input_tokens_details: { cached_tokens: 0, cache_write_tokens: 0 },
          output_tokens: turn.tokenIds.length,
          output_tokens_details: { reasoning_tokens: 0 },
          total_tokens: turn.promptTokens + turn.tokenIds.length
        },
        token_ids: turn.tokenIds,
        policy_version: turn.policyVersion
      }
      : {})
  }
}

/**
 * The documented event stream of an answer: `response.created`, `response.in_progress`, per output item
 * `response.output_item.added`, its text (`response.content_part.added`, `response.output_text.delta`,
 * `response.output_text.done`, `response.content_part.done`) or arguments (`response.function_call_arguments.delta`,
 * `.done`), `response.output_item.done`, then `response.completed` (or `response.incomplete`). Each event has its
 * `sequence_number`; the text and each call's arguments come in one delta.
 *
 * @category constructors
 * @since 0.1.0
 */
export const events = (answer: Answer): Array<string> => {
  const out: Array<string> = []
  const emit = (type: string, fields: Record<string, unknown>) =>
    out.push(Bodies.namedEvent(type, { type, sequence_number: out.length, ...fields }))
  const pending = response(answer, "in_progress")
  emit("response.created", { response: pending })
  emit("response.in_progress", { response: pending })
  const final = response(answer)
  final.output.forEach((item, output_index) => {
    const id = item["id"] as string
    if (item["type"] === "message") {
      const part = { type: "output_text", text: "", annotations: [], logprobs: [] }
      const text = answer.turn.content
      emit("response.output_item.added", { output_index, item: { ...item, status: "in_progress", content: [] } })
      emit("response.content_part.added", { item_id: id, output_index, content_index: 0, part })
      emit("response.output_text.delta", { item_id: id, output_index, content_index: 0, delta: text, logprobs: [] })
      emit("response.output_text.done", { item_id: id, output_index, content_index: 0, text, logprobs: [] })
      emit("response.content_part.done", { item_id: id, output_index, content_index: 0, part: { ...part, text } })
    } else {
      const args = item["arguments"] as string
      emit("response.output_item.added", { output_index, item: { ...item, status: "in_progress", arguments: "" } })
      emit("response.function_call_arguments.delta", { item_id: id, output_index, delta: args })
      emit("response.function_call_arguments.done", {
        item_id: id,
        output_index,
        name: item["name"],
        arguments: args
      })
    }
    emit("response.output_item.done", { output_index, item })
  })
  emit(final.status === "incomplete" ? "response.incomplete" : "response.completed", { response: final })
  return out
}
