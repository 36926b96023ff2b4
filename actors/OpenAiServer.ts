/**
 * An OpenAI-compatible HTTP server in front of the local {@link PolicyEngine}: `GET /v1/models`,
 * `POST /v1/completions` (text or token-id prompts) and `POST /v1/chat/completions` (messages, `tools`, tool calls
 * parsed back into `tool_calls`); both stream as server-sent events with `stream: true`.
 *
 * **Token ids.** Every choice carries `token_ids` (the sampled ids) and the response carries `policy_version`, so
 * the project's own `OpenAiCompatSampler` (and vLLM-style clients) can train on exactly what was sampled. The
 * vLLM extensions `return_token_ids`, `return_tokens_as_token_ids` (logprob tokens written `token_id:<id>`),
 * `stop_token_ids`, `top_k`, `skip_special_tokens` and `include_stop_str_in_output` are accepted.
 *
 * **Errors.** A bad request gets an OpenAI-style body `{ error: { message, type, param, code } }` with a 4xx
 * status (400 invalid request, 404 unknown route or model, 405, 413 body too large); an engine failure is a 5xx.
 * The server never crashes on input.
 *
 * **Streaming.** Tokens are written as they are sampled (the engine's per-token callback). With `tools`, text is
 * streamed until a tool-call tag starts; the parsed calls follow in one `tool_calls` delta at the end.
 *
 * The server is plain `node:http` owned by a scope: closing the scope stops listening, ends open connections and
 * interrupts the requests they were waiting for.
 *
 * @since 0.1.0
 */
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { Clock, Data, Effect, Fiber, FiberSet, Option, Schema } from "effect"
import type { Scope } from "effect"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import type * as Message from "../src/Message.ts"
import type { FinishReason, GenerateRequest, GenerateResult } from "../src/Sampler.ts"
import type * as Tokenizer from "../src/Tokenizer.ts"
import * as ToolCallParser from "../src/ToolCallParser.ts"
import { PolicyEngine } from "./PolicyEngine.ts"

// ===== Models =====

/**
 * What the server needs to know about the model besides the engine: its name and text-side files.
 *
 * @category models
 * @since 0.1.0
 */
export interface Model {
  readonly name: string
  readonly tokenizer: Tokenizer.Tokenizer
  readonly template: ChatTemplate.ChatTemplate
  /** Ids that end a turn: they stop every completion unless the request sets `ignore_eos` (vLLM's extension). */
  readonly stopTokenIds: ReadonlyArray<number>
}

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Default `127.0.0.1`. */
  readonly host?: string
  /** Default 0: a free port. */
  readonly port?: number
  /** Largest request body accepted (default 4 MiB). */
  readonly maxBodyBytes?: number
}

/**
 * A running server.
 *
 * @category models
 * @since 0.1.0
 */
export interface Server {
  readonly port: number
  /** The API root, e.g. `http://127.0.0.1:8000/v1`. */
  readonly baseUrl: string
}

/** An error answered to the client (internal: never leaves this module). */
class ApiError extends Data.TaggedError("ApiError")<{
  readonly status: number
  readonly message: string
  readonly param?: string
  readonly code?: string
}> {}

const invalid = (message: string, param?: string) =>
  new ApiError(param === undefined ? { status: 400, message } : { status: 400, message, param })

// ===== Request schemas =====

const Sampling = {
  model: Schema.optionalKey(Schema.String),
  max_tokens: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  max_completion_tokens: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  temperature: Schema.optionalKey(Schema.NullOr(Schema.Number)),
  top_p: Schema.optionalKey(Schema.NullOr(Schema.Number)),
  top_k: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  seed: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  n: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  stop: Schema.optionalKey(Schema.NullOr(Schema.Union([Schema.String, Schema.Array(Schema.String)]))),
  stop_token_ids: Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.Int))),
  ignore_eos: Schema.optionalKey(Schema.Boolean),
  stream: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  skip_special_tokens: Schema.optionalKey(Schema.Boolean),
  include_stop_str_in_output: Schema.optionalKey(Schema.Boolean),
  return_token_ids: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  return_tokens_as_token_ids: Schema.optionalKey(Schema.NullOr(Schema.Boolean))
}

const CompletionRequest = Schema.Struct({
  ...Sampling,
  prompt: Schema.Union([
    Schema.String,
    Schema.Array(Schema.Int),
    Schema.Array(Schema.String),
    Schema.Array(Schema.Array(Schema.Int))
  ]),
  logprobs: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  echo: Schema.optionalKey(Schema.NullOr(Schema.Boolean))
})

const ChatCompletionRequest = Schema.Struct({
  ...Sampling,
  messages: Schema.Array(Schema.Unknown).check(Schema.isMinLength(1)),
  tools: Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.Unknown))),
  tool_choice: Schema.optionalKey(Schema.Unknown),
  logprobs: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  top_logprobs: Schema.optionalKey(Schema.NullOr(Schema.Int))
})

type SamplingFields = { readonly [K in keyof typeof Sampling]?: (typeof Sampling)[K]["Type"] }

const decode = <S extends Schema.Top & { readonly DecodingServices: never }>(schema: S, body: unknown) =>
  Schema.decodeUnknownEffect(schema)(body).pipe(Effect.mapError((e) => invalid(e.message)))

// ===== Helpers =====

/** Decoded text of `ids` that ends in an incomplete UTF-8 sequence is held back until it completes. */
const stableText = (text: string): string => (text.endsWith("\uFFFD") ? text.replace(/\uFFFD+$/, "") : text)

const makeText = (model: Model, skipSpecial: boolean) => {
  const special = new Set(
    [...model.tokenizer.addedTokens.entries()].filter(([t]) => t.startsWith("<|")).map(([, id]) => id)
  )
  return (ids: ReadonlyArray<number>): string =>
    model.tokenizer.decode(ids.filter((id) => model.tokenizer.isValidId(id) && !(skipSpecial && special.has(id))))
}

const generateRequest = Effect.fnUntraced(function*(
  model: Model,
  body: SamplingFields,
  promptTokenIds: ReadonlyArray<number>,
  chat: boolean
) {
  if (body.n !== undefined && body.n !== null && body.n !== 1) return yield* invalid("only n = 1 is supported", "n")
  const stopIds = new Set(body.stop_token_ids ?? [])
  if (body.ignore_eos !== true) for (const id of model.stopTokenIds) stopIds.add(id)
  const stops = body.stop === undefined || body.stop === null ?
    [] :
    typeof body.stop === "string" ?
    [body.stop] :
    body.stop
  for (const s of stops) {
    const id = model.tokenizer.tokenToId(s)
    if (id === undefined) {
      return yield* invalid(`stop string ${JSON.stringify(s)} is not a single token; use stop_token_ids`, "stop")
    }
    stopIds.add(id)
  }
  const topK = body.top_k ?? undefined
  const request: GenerateRequest = {
    promptTokenIds,
    sampling: {
      temperature: body.temperature ?? 1,
      maxTokens: body.max_completion_tokens ?? body.max_tokens ?? (chat ? 256 : 16),
      stopTokenIds: [...stopIds],
      ...(body.top_p === undefined || body.top_p === null ? {} : { topP: body.top_p }),
      ...(topK === undefined || topK === -1 ? {} : { topK }),
      ...(body.seed === undefined || body.seed === null ? {} : { seed: body.seed })
    }
  }
  return request
})

const samplerError = (e: { readonly reason: string; readonly message: string }) =>
  new ApiError(
    e.reason === "BadRequest" ?
      { status: 400, message: e.message } :
      e.reason === "Overloaded" ?
      { status: 429, message: e.message } :
      { status: e.reason === "Closed" ? 503 : 500, message: e.message, code: e.reason }
  )

const parseArguments = (args: string): unknown =>
  Option.getOrElse(Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))(args), () => args)

/** OpenAI messages → our Message schema: tool-call arguments arrive as JSON strings. */
const conversation = (body: typeof ChatCompletionRequest.Type) => {
  const messages = body.messages.map((m) => {
    const calls = (m as { tool_calls?: unknown }).tool_calls
    if (!Array.isArray(calls)) return m
    return {
      ...(m as object),
      tool_calls: calls.map((c) => {
        const fn = (c as { function?: { arguments?: unknown } })?.function
        // A malformed argument string stays a string: the template renders it as the model wrote it.
        return typeof fn?.arguments === "string" ?
          { ...c, function: { ...fn, arguments: parseArguments(fn.arguments) } } :
          c
      })
    }
  })
  return ChatTemplate.decodeConversation({ messages, tools: body.tools ?? [] }).pipe(
    Effect.mapError((e) => invalid(e.message, "messages"))
  )
}

const openAiToolCalls = (calls: ReadonlyArray<Message.ToolCall>) =>
  calls.map((c, index) => ({
    index,
    id: c.id,
    type: "function" as const,
    function: {
      name: c.function.name,
      arguments: typeof c.function.arguments === "string" ? c.function.arguments : JSON.stringify(c.function.arguments)
    }
  }))

const finishOf = (reason: FinishReason, calls: number) => (calls > 0 ? "tool_calls" : reason)

const usage = (prompt: number, completion: number) => ({
  prompt_tokens: prompt,
  completion_tokens: completion,
  total_tokens: prompt + completion
})

const readBody = (req: Http.IncomingMessage, maxBody: number) =>
  Effect.callback<unknown, ApiError>((resume) => {
    const chunks: Array<Buffer> = []
    let size = 0, done = false
    req.on("data", (c: Buffer) => {
      size += c.length
      if (size > maxBody && !done) {
        done = true
        resume(Effect.fail(new ApiError({ status: 413, message: `the request body exceeds ${maxBody} bytes` })))
      } else chunks.push(c)
    })
    req.on("end", () => {
      if (done) return
      done = true
      const text = Buffer.concat(chunks).toString("utf8")
      resume(Effect.try({
        try: () => JSON.parse(text) as unknown,
        catch: () => invalid("the request body is not valid JSON")
      }))
    })
    req.on("error", () => {
      if (!done) resume(Effect.fail(new ApiError({ status: 400, message: "the request body could not be read" })))
      done = true
    })
  })

const sendJson = (res: Http.ServerResponse, status: number, value: unknown) =>
  Effect.sync(() => {
    if (res.headersSent) return res.end()
    res.writeHead(status, { "content-type": "application/json" })
    res.end(JSON.stringify(value))
  })

const errorBody = (e: ApiError) => ({
  error: {
    message: e.message,
    type: e.status >= 500 ? "server_error" : "invalid_request_error",
    param: e.param ?? null,
    code: e.code ?? null
  }
})

// ===== Constructor =====

/**
 * Starts the server in the current scope.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("OpenAiServer.make")(function*(model: Model, options: Options = {}) {
  const engine = yield* PolicyEngine
  const run = yield* FiberSet.makeRuntime<never>()
  const maxBody = options.maxBodyBytes ?? 4 * 1024 * 1024
  let counter = 0
  const nextId = (prefix: string) => `${prefix}-${++counter}`
  const now = Effect.map(Clock.currentTimeMillis, (ms) => Math.floor(ms / 1000))

  const generate = (request: GenerateRequest, onToken?: (id: number, lp: number) => void) =>
    engine.generate(request, { onToken }).pipe(Effect.mapError(samplerError))

  const completionText = (result: GenerateResult, ids: ReadonlyArray<number>, body: SamplingFields) => {
    const keepStop = body.include_stop_str_in_output === true
    const shown = result.finishReason === "stop" && !keepStop ? ids.slice(0, -1) : ids
    return makeText(model, body.skip_special_tokens ?? true)(shown)
  }

  const completionRequests = Effect.fnUntraced(function*(raw: unknown) {
    const body = yield* decode(CompletionRequest, raw)
    if (body.echo === true) return yield* invalid("echo is not supported", "echo")
    const prompts: ReadonlyArray<string | ReadonlyArray<number>> =
      typeof body.prompt === "string" ? [body.prompt] : body.prompt.length > 0 && typeof body.prompt[0] === "number"
      ? [body.prompt as ReadonlyArray<number>]
      : (body.prompt as ReadonlyArray<string | ReadonlyArray<number>>)
    if (prompts.length === 0) return yield* invalid("the prompt is empty", "prompt")
    const requests = yield* Effect.forEach(prompts, (p) => {
      const ids = typeof p === "string" ? model.tokenizer.encode(p) : p
      return generateRequest(model, body, ids, false)
    })
    return { body, requests }
  })

  const logprobToken = (id: number, asIds: boolean) => (asIds ? `token_id:${id}` : model.tokenizer.decode([id]))

  /** `stream: true` on /v1/completions: one event per sampled token (its text delta may be empty). */
  const completionsStream = Effect.fnUntraced(function*(raw: unknown, res: Http.ServerResponse) {
    const { body, requests } = yield* completionRequests(raw)
    if (requests.length !== 1) return yield* invalid("stream: true takes a single prompt", "prompt")
    const request = requests[0]!
    const id = nextId("cmpl"), created = yield* now
    const event = (choice: Record<string, unknown>) =>
      `data: ${
        JSON.stringify({
          id,
          object: "text_completion",
          created,
          model: model.name,
          choices: [{ index: 0, ...choice }]
        })
      }\n\n`
    const text = makeText(model, body.skip_special_tokens ?? true)
    const stop = new Set(request.sampling.stopTokenIds)
    const asIds = body.return_tokens_as_token_ids === true
    const withLogprobs = body.logprobs !== undefined && body.logprobs !== null
    const shown: Array<number> = []
    let sent = 0
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" })
    const onToken = (tokenId: number, logprob: number) => {
      if (!stop.has(tokenId) || body.include_stop_str_in_output === true) shown.push(tokenId)
      const current = stableText(text(shown))
      const delta = current.length > sent ? current.slice(sent) : ""
      sent = Math.max(sent, current.length)
      res.write(event({
        text: delta,
        token_ids: [tokenId],
        logprobs: withLogprobs ? { tokens: [logprobToken(tokenId, asIds)], token_logprobs: [logprob] } : null,
        finish_reason: null
      }))
    }
    const result = yield* generate(request, onToken)
    const full = text(shown)
    res.write(event({
      text: full.length > sent ? full.slice(sent) : "",
      token_ids: [],
      finish_reason: result.finishReason,
      policy_version: result.policyVersion
    }))
    res.end("data: [DONE]\n\n")
  })

  const completions = Effect.fnUntraced(function*(raw: unknown) {
    const { body, requests } = yield* completionRequests(raw)
    const results = yield* Effect.forEach(requests, (r) => generate(r), { concurrency: "unbounded" })
    const asIds = body.return_tokens_as_token_ids === true
    const choices = results.map((result, index) => ({
      index,
      text: completionText(result, result.tokenIds, body),
      token_ids: result.tokenIds,
      prompt_token_ids: requests[index]!.promptTokenIds,
      logprobs: body.logprobs === undefined || body.logprobs === null ? null : {
        tokens: result.tokenIds.map((id) => logprobToken(id, asIds)),
        token_logprobs: result.logprobs,
        top_logprobs: result.tokenIds.map((id, i) => ({ [logprobToken(id, asIds)]: result.logprobs[i]! })),
        text_offset: result.tokenIds.map(() => 0)
      },
      finish_reason: result.finishReason,
      policy_version: result.policyVersion
    }))
    const promptTokens = requests.reduce((n, r) => n + r.promptTokenIds.length, 0)
    const completionTokens = results.reduce((n, r) => n + r.tokenIds.length, 0)
    return {
      id: nextId("cmpl"),
      object: "text_completion",
      created: yield* now,
      model: model.name,
      choices,
      usage: usage(promptTokens, completionTokens),
      policy_version: results[0]!.policyVersion
    }
  })

  const chatPrompt = Effect.fnUntraced(function*(body: typeof ChatCompletionRequest.Type) {
    const { messages, tools } = yield* conversation(body)
    const text = yield* model.template.render(messages, { addGenerationPrompt: true, tools }).pipe(
      Effect.mapError((e) => invalid(e.message, "messages"))
    )
    return { ids: model.tokenizer.encode(text), tools }
  })

  const toolCallsOf = (text: string, tools: ReadonlyArray<unknown>) => {
    if (tools.length === 0) return { content: text, toolCalls: [] as ReadonlyArray<Message.ToolCall> }
    const parsed = ToolCallParser.parse(model.template.toolCallFormat, text)
    return { content: parsed.content, toolCalls: parsed.toolCalls }
  }

  const chatLogprobs = (result: GenerateResult) => ({
    content: result.tokenIds.map((id, i) => {
      const token = model.tokenizer.decode([id])
      return { token, logprob: result.logprobs[i]!, bytes: [...new TextEncoder().encode(token)], top_logprobs: [] }
    })
  })

  const chat = Effect.fnUntraced(function*(raw: unknown) {
    const body = yield* decode(ChatCompletionRequest, raw)
    const { ids, tools } = yield* chatPrompt(body)
    const request = yield* generateRequest(model, body, ids, true)
    const result = yield* generate(request)
    const text = completionText(result, result.tokenIds, { ...body, include_stop_str_in_output: false })
    const { content, toolCalls } = toolCallsOf(text, tools)
    return {
      id: nextId("chatcmpl"),
      object: "chat.completion",
      created: yield* now,
      model: model.name,
      choices: [{
        index: 0,
        message: {
          role: "assistant",
          content: toolCalls.length > 0 && content === "" ? null : content,
          ...(toolCalls.length > 0 ? { tool_calls: openAiToolCalls(toolCalls) } : {})
        },
        logprobs: body.logprobs === true ? chatLogprobs(result) : null,
        finish_reason: finishOf(result.finishReason, toolCalls.length),
        token_ids: result.tokenIds,
        policy_version: result.policyVersion
      }],
      prompt_token_ids: ids,
      usage: usage(ids.length, result.tokenIds.length),
      policy_version: result.policyVersion
    }
  })

  const chatStream = Effect.fnUntraced(function*(raw: unknown, res: Http.ServerResponse) {
    const body = yield* decode(ChatCompletionRequest, raw)
    const { ids, tools } = yield* chatPrompt(body)
    const request = yield* generateRequest(model, body, ids, true)
    const id = nextId("chatcmpl"), created = yield* now
    const chunk = (delta: Record<string, unknown>, finish: string | null, extra: Record<string, unknown> = {}) =>
      `data: ${
        JSON.stringify({
          id,
          object: "chat.completion.chunk",
          created,
          model: model.name,
          choices: [{ index: 0, delta, finish_reason: finish, ...extra }]
        })
      }\n\n`
    const text = makeText(model, true)
    const stop = new Set(request.sampling.stopTokenIds)
    const sampled: Array<number> = []
    let sent = 0, holding = false
    const toolOpen = tools.length > 0 ? "<tool_call>" : undefined
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" })
    res.write(chunk({ role: "assistant", content: "" }, null))
    const onToken = (tokenId: number, logprob: number) => {
      if (stop.has(tokenId)) return
      sampled.push(tokenId)
      if (holding) return
      let current = stableText(text(sampled))
      const tag = toolOpen === undefined ? -1 : current.indexOf(toolOpen)
      if (tag >= 0) {
        holding = true
        current = current.slice(0, tag)
      } else if (toolOpen !== undefined) {
        // Hold back a suffix that could be the start of the tool-call tag.
        for (let k = Math.min(toolOpen.length - 1, current.length); k > 0; k--) {
          if (toolOpen.startsWith(current.slice(current.length - k))) {
            current = current.slice(0, current.length - k)
            break
          }
        }
      }
      if (current.length > sent) {
        const delta = current.slice(sent)
        const logprobs = { logprobs: { content: [{ token: delta, logprob, top_logprobs: [] }] } }
        res.write(chunk({ content: delta }, null, body.logprobs === true ? logprobs : {}))
        sent = current.length
      }
    }
    const result = yield* generate(request, onToken)
    const full = text(sampled)
    const { content, toolCalls } = toolCallsOf(full, tools)
    if (toolCalls.length === 0 && full.length > sent) res.write(chunk({ content: full.slice(sent) }, null))
    else if (toolCalls.length > 0) {
      const rest = content.length > sent ? content.slice(sent) : ""
      res.write(chunk({ ...(rest === "" ? {} : { content: rest }), tool_calls: openAiToolCalls(toolCalls) }, null))
    }
    const finish = finishOf(result.finishReason, toolCalls.length)
    res.write(chunk({}, finish, { token_ids: result.tokenIds, policy_version: result.policyVersion }))
    res.end("data: [DONE]\n\n")
  })

  const checkModel = (body: unknown) => {
    const name = (body as { model?: unknown } | null)?.model
    return typeof name === "string" && name !== model.name ?
      Effect.fail(
        new ApiError({
          status: 404,
          message: `model ${JSON.stringify(name)} does not exist; this server has ${JSON.stringify(model.name)}`,
          param: "model",
          code: "model_not_found"
        })
      ) :
      Effect.void
  }

  const route = (req: Http.IncomingMessage, res: Http.ServerResponse): Effect.Effect<void, ApiError> => {
    const path = (req.url ?? "/").split("?")[0]!.replace(/\/+$/, "")
    const post = (
      handler: (body: unknown) => Effect.Effect<unknown, ApiError>,
      stream: (body: unknown, res: Http.ServerResponse) => Effect.Effect<void, ApiError>
    ) =>
      req.method !== "POST" ?
        Effect.fail(new ApiError({ status: 405, message: `${req.method} is not allowed on ${path}; use POST` })) :
        readBody(req, maxBody).pipe(
          Effect.tap(checkModel),
          Effect.flatMap((body) =>
            (body as { stream?: unknown } | null)?.stream === true ?
              stream(body, res) :
              Effect.flatMap(handler(body), (value) => sendJson(res, 200, value))
          )
        )
    switch (path) {
      case "/v1/models":
        return Effect.flatMap(now, (created) =>
          sendJson(res, 200, {
            object: "list",
            data: [{ id: model.name, object: "model", created, owned_by: "agentfly" }]
          }))
      case "/v1/completions":
        return post(completions, completionsStream)
      case "/v1/chat/completions":
        return post(chat, chatStream)
      default:
        return Effect.fail(new ApiError({ status: 404, message: `no route ${req.method} ${path}` }))
    }
  }

  const handle = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
    const fiber = run(
      route(req, res).pipe(
        Effect.catch((e) =>
          res.headersSent ?
            // Mid-stream failure: report it as a final event, then end the stream.
            Effect.sync(() => res.end(`data: ${JSON.stringify(errorBody(e))}\n\ndata: [DONE]\n\n`)) :
            sendJson(res, e.status, errorBody(e))
        ),
        Effect.catchDefect((defect) =>
          sendJson(res, 500, errorBody(new ApiError({ status: 500, message: `internal error: ${String(defect)}` })))
        )
      )
    )
    res.on("close", () => {
      if (!res.writableFinished) run(Fiber.interrupt(fiber))
    })
  }

  const server = Http.createServer(handle)
  yield* Effect.acquireRelease(
    Effect.callback<void>((resume) => {
      server.listen(options.port ?? 0, options.host ?? "127.0.0.1", () => resume(Effect.void))
    }),
    () =>
      Effect.callback<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  )
  const port = (server.address() as AddressInfo).port
  const result: Server = { port, baseUrl: `http://${options.host ?? "127.0.0.1"}:${port}/v1` }
  return result
}) satisfies (model: Model, options?: Options) => Effect.Effect<Server, never, PolicyEngine | Scope.Scope>
