/**
 * The OpenAI wire format both OpenAI-compatible servers speak (`agentfly serve`, `OpenAiServer.ts`, and the
 * recording gateway, `Gateway.ts`): the one {@link ApiError} they answer with and its `{ error: { message, type,
 * param, code } }` body, reading a JSON body within a limit, writing JSON and server-sent events, the `usage` block,
 * and messages converted between OpenAI's shape and the project's `Message` schema (tool-call arguments are a JSON
 * string on the wire, a value in a `Message`).
 *
 * What each server reads from a request is its own (the server decodes with Schemas, the gateway field by field);
 * the rules both apply before that, known fields and OpenAI's ranges, are `openAiRequest.ts`'s, answered here as a
 * 400 by {@link refusal}.
 *
 * @since 0.1.0
 */
import type * as Http from "node:http"
import { Data, Effect, Fiber, Option, Schema } from "effect"
import type * as ChatTemplate from "../../src/ChatTemplate.ts"
import type * as Message from "../../src/Message.ts"
import type { SamplerError } from "../../src/Sampler.ts"
import * as Auth from "./auth.ts"
import * as HttpActor from "./http.ts"
import * as OpenAiRequest from "./openAiRequest.ts"

// ===== Errors =====

/**
 * An error answered to the client with `status`. (An in-process error: it never leaves the server, which writes
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
 * A 404 (an unknown route, model or episode).
 *
 * @category errors
 * @since 0.1.0
 */
export const notFound = (message: string, code?: string): ApiError => new ApiError({ status: 404, message, code })

/**
 * A 405 naming the method the route takes.
 *
 * @category errors
 * @since 0.1.0
 */
export const notAllowed = (method: string, path: string, allowed: string): ApiError =>
  new ApiError({ status: 405, message: `${method} is not allowed on ${path}; use ${allowed}` })

/**
 * A 401: no or a wrong bearer token (`how` says where the token is set). Every route answers it alike, known or not.
 *
 * @category errors
 * @since 0.1.0
 */
export const unauthorized = (how: string): ApiError =>
  new ApiError({ status: 401, message: `a valid bearer token is required (${how})`, code: "unauthorized" })

/**
 * A 503: more requests in flight than the server answers at once; retry later.
 *
 * @category errors
 * @since 0.1.0
 */
export const overloaded = (max: number): ApiError =>
  new ApiError({ status: 503, message: `the server is answering ${max} requests already; retry`, code: "overloaded" })

/**
 * A 500 for a defect: the server answers it rather than crash.
 *
 * @category errors
 * @since 0.1.0
 */
export const internalError = (defect: unknown): ApiError =>
  new ApiError({ status: 500, message: `internal error: ${String(defect)}` })

/**
 * A sampler's failure as the client sees it: 400 for a request the engine refused, 429 when it is overloaded, 503
 * when it is closed, else 500 (the reason in `code`).
 *
 * @category errors
 * @since 0.1.0
 */
export const samplerError = (e: SamplerError): ApiError =>
  new ApiError(
    e.reason._tag === "BadRequest"
      ? { status: 400, message: e.message, code: "sampler_rejected" }
      : e.reason._tag === "Overloaded"
      ? { status: 429, message: e.message, code: "overloaded" }
      : { status: e.reason._tag === "Closed" ? 503 : 500, message: e.message, code: e.reason._tag }
  )

/**
 * The first rule of `openAiRequest.ts` that `body` breaks, as a 400, or `undefined`.
 *
 * @category errors
 * @since 0.1.0
 */
export const refusal = (
  body: Readonly<Record<string, unknown>>,
  endpoint: OpenAiRequest.Endpoint,
  extensions: Iterable<string>
): ApiError | undefined => {
  const refused = OpenAiRequest.check(body, endpoint, extensions)
  return refused === undefined ? undefined : invalid(refused.message, refused.param, refused.code)
}

/**
 * The OpenAI error body of an error. Every 4xx is an `invalid_request_error`, as OpenAI's own (its unknown model
 * and unknown route are 404s of that type); a 5xx is a `server_error`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const errorBody = (e: ApiError) => ({
  error: {
    message: e.message,
    type: e.status >= 500 ? "server_error" : "invalid_request_error",
    param: e.param ?? null,
    code: e.code ?? null
  }
})

// ===== Bodies =====

/**
 * The `usage` block of a completion.
 *
 * @category constructors
 * @since 0.1.0
 */
export const usage = (promptTokens: number, completionTokens: number) => ({
  prompt_tokens: promptTokens,
  completion_tokens: completionTokens,
  total_tokens: promptTokens + completionTokens
})

/**
 * Tool calls in OpenAI's shape, each with its `index` (what a streamed delta carries): the arguments as a JSON
 * string, a string argument (what a model wrote that is not JSON) as it is.
 *
 * @category constructors
 * @since 0.1.0
 */
export const toolCalls = (calls: ReadonlyArray<Message.ToolCall>) =>
  calls.map((c, index) => ({
    index,
    id: c.id,
    type: "function" as const,
    function: {
      name: c.function.name,
      arguments: typeof c.function.arguments === "string" ? c.function.arguments : JSON.stringify(c.function.arguments)
    }
  }))

const decodeJson = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))

/**
 * Tool-call arguments as they arrive (a JSON string): the decoded value, or the string itself when it is not JSON
 * (a template renders it as the model wrote it). Anything but a string is kept.
 *
 * @category constructors
 * @since 0.1.0
 */
export const parseArguments = (args: unknown): unknown =>
  typeof args === "string" ? Option.getOrElse(decodeJson(args), () => args) : args

// ===== Messages =====

/**
 * A JSON object (not an array, not `null`).
 *
 * @category guards
 * @since 0.1.0
 */
export const isRecord = (u: unknown): u is Record<string, unknown> =>
  typeof u === "object" && u !== null && !Array.isArray(u)

/**
 * A converted value, or why it could not be: the caller fails with the error (the first one found).
 *
 * @category models
 * @since 0.1.0
 */
export type Check<A> = A | ApiError

const contentOf = (raw: unknown, param: string, allowNull: boolean): Check<Message.Content> => {
  if (raw === undefined || raw === null) return allowNull ? "" : invalid(`${param} is required`, param)
  if (typeof raw === "string") return raw
  if (!Array.isArray(raw)) return invalid(`${param} must be a string or a list of content parts`, param)
  const parts: Array<Message.ContentPart> = []
  for (const [i, part] of raw.entries()) {
    const text = isRecord(part) && (part["type"] === "text" || part["type"] === "input_text")
    if (text && typeof part["text"] === "string") {
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
    const args = parseArguments(fn["arguments"] ?? "{}")
    calls.push({ id: c["id"], type: "function", function: { name: fn["name"], arguments: args } })
  }
  return calls
}

/**
 * One OpenAI message as a `Message` (`developer` is `system`; `content: null` beside tool calls is empty; tool-call
 * arguments parsed). A malformed one is a 400 naming `messages[index]` or the field within it.
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

/**
 * A request's `tools` as the specs chat templates render (extra keys such as `strict` are dropped).
 *
 * @category constructors
 * @since 0.1.0
 */
export const toTools = (raw: unknown): Check<Array<ChatTemplate.ToolSpec>> => {
  if (raw === undefined || raw === null) return []
  if (!Array.isArray(raw)) return invalid("tools must be a list", "tools")
  const tools: Array<ChatTemplate.ToolSpec> = []
  for (const [i, t] of raw.entries()) {
    const fn = isRecord(t) ? t["function"] : undefined
    if (!isRecord(t) || t["type"] !== "function" || !isRecord(fn) || typeof fn["name"] !== "string") {
      const shape = `{ type: "function", function: { name, description?, parameters? } }`
      return invalid(`tools[${i}] must be ${shape}`, `tools[${i}]`)
    }
    const description = fn["description"]
    // The shape chat templates render (and `Tool.functionSchema` writes).
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

/**
 * A {@link Check} as an effect.
 *
 * @category constructors
 * @since 0.1.0
 */
export const lift = <A>(check: Check<A>): Effect.Effect<A, ApiError> =>
  check instanceof ApiError ? Effect.fail(check) : Effect.succeed(check)

// ===== HTTP =====

/**
 * A body's bytes within `maxBytes` (`http.ts`: refused from `Content-Length`, or as soon as it passes the limit),
 * its failures as API errors (413, 400).
 *
 * @category constructors
 * @since 0.1.0
 */
export const readBytes = (req: Http.IncomingMessage, maxBytes: number): Effect.Effect<Buffer, ApiError> =>
  Effect.mapError(HttpActor.readBody(req, maxBytes), (e) => new ApiError({ status: e.status, message: e.message }))

/**
 * A JSON body within `maxBytes` (413 beyond, 400 when it is not JSON). No body at all is an empty object (`curl -X
 * POST …/end`): each route then names what it lacks.
 *
 * @category constructors
 * @since 0.1.0
 */
export const readJson = (req: Http.IncomingMessage, maxBytes: number): Effect.Effect<unknown, ApiError> =>
  Effect.flatMap(readBytes(req, maxBytes), (bytes) => {
    const text = bytes.toString("utf8")
    if (text.trim() === "") return Effect.succeed({})
    // JSON.parse itself: a Schema decode of the same text costs several times more, on every request.
    return Effect.try({
      try: () => JSON.parse(text) as unknown,
      catch: () => invalid("the request body is not valid JSON")
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
    // A refusal before (or instead of) reading the body closes the connection: Node would drain the rest otherwise.
    const close = Auth.closesConnection(status) ? { connection: "close" } : {}
    res.writeHead(status, { "content-type": "application/json", ...close })
    res.end(JSON.stringify(value))
  })

/**
 * Writes the status line of a server-sent event stream.
 *
 * @category constructors
 * @since 0.1.0
 */
export const startEvents = (res: Http.ServerResponse): void => {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" })
}

/**
 * One server-sent event of a JSON value.
 *
 * @category constructors
 * @since 0.1.0
 */
export const event = (value: unknown): string => `data: ${JSON.stringify(value)}\n\n`

/**
 * The event that ends every stream.
 *
 * @category constants
 * @since 0.1.0
 */
export const done = "data: [DONE]\n\n"

/**
 * Writes server-sent events and ends the response.
 *
 * @category constructors
 * @since 0.1.0
 */
export const sendEvents = (res: Http.ServerResponse, events: ReadonlyArray<string>): Effect.Effect<void> =>
  Effect.sync(() => {
    startEvents(res)
    res.end(events.join(""))
  })

/**
 * Answers an error: its JSON body with its status, or, when a stream has begun, a final error event and the end of
 * the stream.
 *
 * @category constructors
 * @since 0.1.0
 */
export const sendError = (res: Http.ServerResponse, e: ApiError): Effect.Effect<void> =>
  res.headersSent
    ? Effect.sync(() => {
      if (!res.writableEnded) res.end(event(errorBody(e)) + done)
    })
    : sendJson(res, e.status, errorBody(e))

/**
 * A request handler for `node:http`: runs `respond` (its errors and defects answered, `failed` told of each) with
 * `run`, and interrupts it when the client goes away before the answer is written.
 *
 * @category constructors
 * @since 0.1.0
 */
export const handler = (
  run: (effect: Effect.Effect<void>) => Fiber.Fiber<void>,
  respond: (req: Http.IncomingMessage, res: Http.ServerResponse) => Effect.Effect<void, ApiError>,
  failed: () => void = () => {}
) =>
(req: Http.IncomingMessage, res: Http.ServerResponse): void => {
  const fiber = run(
    respond(req, res).pipe(
      Effect.catch((e) => Effect.andThen(Effect.sync(failed), sendError(res, e))),
      Effect.catchDefect((defect) => Effect.andThen(Effect.sync(failed), sendError(res, internalError(defect))))
    )
  )
  res.on("close", () => {
    if (!res.writableFinished) run(Fiber.interrupt(fiber))
  })
}
