/**
 * Tasks as MCP servers: any task's tools and environment served over MCP, so that a harness that uses MCP tools can
 * play our environments (`agentfly mcp TASK`).
 *
 * - **One session per episode.** Each MCP session (a stdio connection, or a streamable-HTTP session) is one episode:
 *   it leases the task's environment as a rollout chain does (its own instance, per the task's provider), takes the
 *   next row (when rows are given: in turn, from the first), runs the episode's `start`, and releases everything when
 *   the session closes (the client's `DELETE`, stdin closed, the server's end).
 * - **Tools**: `tools/list` is the task's tools with their JSON Schemas (as the chat template shows them); a
 *   `tools/call` runs through the task's tool actor (its timeouts, output budgets, errors as observations), so a
 *   failed call is a result with `isError: true` and the text the model would read. After each call the episode's
 *   `step` runs (the call as a one-call turn): what the environment says is appended to the result, and when it ends
 *   the episode, or a terminal tool (`answer`) succeeded, later calls are refused with the reason.
 * - **Prompt**: `prompts/get` of `episode` is the episode's conversation so far (the row's prompt and what `start`
 *   said), for a harness to start from.
 *
 * Rewards are not served: score the harness's episodes where they are recorded (the gateway).
 *
 * @since 0.1.0
 */
import { Server } from "@modelcontextprotocol/sdk/server/index.js"
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js"
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js"
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js"
import {
  CallToolRequestSchema,
  GetPromptRequestSchema,
  isInitializeRequest,
  ListPromptsRequestSchema,
  ListToolsRequestSchema
} from "@modelcontextprotocol/sdk/types.js"
import type { CallToolResult, GetPromptResult } from "@modelcontextprotocol/sdk/types.js"
import { Cause, Deferred, Effect, Exit, FiberSet, Schema, Scope } from "effect"
import type { Context } from "effect"
import { randomUUID } from "node:crypto"
import { createServer } from "node:http"
import type { IncomingMessage, ServerResponse } from "node:http"
import type * as Dataset from "../src/Dataset.ts"
import * as Environment from "../src/Environment.ts"
import type * as Message from "../src/Message.ts"
import * as Task from "../src/Task.ts"
import * as Tool from "../src/Tool.ts"
import * as TaskRuntime from "./TaskRuntime.ts"

// ===== Models =====

/**
 * Options of {@link make}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The rows episodes start from, taken in turn (default: none; a task whose episode reads its row needs them). */
  readonly rows?: ReadonlyArray<Dataset.Row> | undefined
  /** The timeout of tools that set none (default 30 seconds). */
  readonly toolTimeout?: import("effect").Duration.Input | undefined
  /** The system prompt of the episodes' conversations (default: the task's). */
  readonly systemPrompt?: string | undefined
}

/**
 * A task ready to be served: every new session is a new episode.
 *
 * @category models
 * @since 0.1.0
 */
export interface Served {
  readonly task: Task.Any
  /** Serves one episode over `transport` until it closes (or the returned scope closes). */
  readonly connect: (transport: Transport) => Effect.Effect<Session, ServeError, Scope.Scope>
  /** Episodes started so far, and those still open. */
  readonly counts: Effect.Effect<{ readonly started: number; readonly open: number }>
}

/**
 * One served episode.
 *
 * @category models
 * @since 0.1.0
 */
export interface Session {
  readonly episodeId: string
  /** Resolves when the session has closed and its environment was released. */
  readonly closed: Effect.Effect<void>
}

// ===== Errors =====

/**
 * A session could not start (its environment could not be leased, its episode's `start` failed) or the HTTP server
 * could not listen.
 *
 * @category errors
 * @since 0.1.0
 */
export class ServeError extends Schema.TaggedError<ServeError>()("McpServeError", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

const serveError = (what: string) => (e: unknown) =>
  new ServeError({ message: `${what}: ${e instanceof Error ? e.message : String(e)}`, cause: e })

// ===== Episodes =====

/** The state of one session's episode. */
interface Episode {
  readonly id: string
  readonly context: Context.Context<any>
  readonly conversation: ReadonlyArray<Message.Message>
  turn: number
  ended: string | undefined
}

const text = (t: string) => ({ type: "text" as const, text: t })

/** Message content as text (image parts named). */
const contentText = (content: Message.Message["content"]): string =>
  typeof content === "string"
    ? content
    : (content ?? []).map((part) => (part.type === "text" ? part.text : "[image]")).join("")

/** A tool call as the tool actor and the episode see it; its id is the request's. */
const toolCall = (id: string, name: string, args: unknown): Message.ToolCall => ({
  id,
  type: "function",
  function: { name, arguments: args ?? {} }
})

/** The row, prompt and start of episode `index`. */
const openEpisode = Effect.fnUntraced(function*(
  runtime: TaskRuntime.TaskRuntime,
  options: Options,
  index: number,
  scope: Scope.Scope
) {
  const { task } = runtime
  const rows = options.rows ?? []
  const row: Dataset.Row = rows.length === 0 ? { index, line: 0, fields: {} } : rows[index % rows.length]!
  const id = `episode-${index}`
  const chain: Environment.ChainInfo = { chainId: id, groupId: id, rowIndex: row.index, row: row.fields, seed: index }
  const context = yield* Scope.provide(runtime.environment.acquire(chain), scope)
  const prompt = Task.conversation(task, row, options.systemPrompt ?? task.defaults.systemPrompt)
  const said = runtime.episode?.start === undefined ? undefined : yield* Effect.provideContext(
    runtime.episode.start({ ...chain, rowIndex: row.index, row: row.fields, seed: index, messages: prompt }),
    context
  )
  const conversation = [...prompt, ...(said === undefined ? [] : Environment.toMessages(said))]
  return { id, context, conversation, turn: 0, ended: undefined } satisfies Episode as Episode
})

/** Runs one call of the episode and its step; the result as MCP writes it. */
const callTool = Effect.fnUntraced(function*(
  runtime: TaskRuntime.TaskRuntime,
  episode: Episode,
  requestId: string,
  name: string,
  args: unknown
) {
  if (episode.ended !== undefined) {
    return { content: [text(`the episode has ended (${episode.ended}); open a new session`)], isError: true }
  }
  const call = toolCall(requestId, name, args)
  const turn = yield* Effect.result(runtime.tools.executeTurn([call], episode.context))
  if (turn._tag === "Failure") return { content: [text(`Error: ${turn.failure.message}`)], isError: true }
  const [observation] = turn.success.messages
  const content = [text(contentText(observation?.content ?? ""))]
  const isError = observation?.role === "tool" && observation.is_error === true
  episode.turn++
  if (turn.success.terminal) episode.ended = "answer"
  if (runtime.episode?.step !== undefined) {
    const step = yield* Effect.result(Effect.provideContext(
      runtime.episode.step({
        turn: episode.turn,
        assistant: { role: "assistant", content: "", tool_calls: [call] },
        observations: turn.success.messages
      }),
      episode.context
    ))
    if (step._tag === "Failure") {
      episode.ended = "env_failed"
      content.push(text(`the environment failed: ${step.failure.message}`))
    } else {
      for (const m of Environment.toMessages(step.success?.messages ?? [])) content.push(text(contentText(m.content)))
      if (step.success?.end !== undefined) episode.ended = step.success.end
    }
  }
  if (episode.ended !== undefined) content.push(text(`[the episode has ended: ${episode.ended}]`))
  return { content, isError } satisfies CallToolResult as CallToolResult
})

/** The episode's conversation as an MCP prompt (system and tool messages are user text: MCP has two roles). */
const promptOf = (task: Task.Any, episode: Episode): GetPromptResult => ({
  description: task.description ?? task.name,
  messages: episode.conversation.map((m) => ({
    role: m.role === "assistant" ? "assistant" as const : "user" as const,
    content: text(contentText(m.content))
  }))
})

// ===== Constructors =====

/**
 * Serves `task`: builds its runtime (tool actor, environment provider, the start check) in the current scope; every
 * session of {@link Served.connect} is then one episode.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <RE>(
  task: Task.Task<RE>,
  options: Options = {}
): Effect.Effect<Served, Task.TaskError, RE | Scope.Scope> =>
  Effect.gen(function*() {
    const runtime = yield* TaskRuntime.make(task, { toolTimeout: options.toolTimeout })
    const run = yield* FiberSet.makeRuntimePromise<never>()
    const listed = task.tools.map((tool) => ({
      name: tool.name,
      description: tool.description,
      inputSchema: Tool.parametersJsonSchema(tool) as { type: "object" }
    }))
    const counts = { started: 0, open: 0 }

    const connect = (transport: Transport): Effect.Effect<Session, ServeError, Scope.Scope> =>
      Effect.gen(function*() {
        const index = counts.started++
        const scope = yield* Scope.make()
        const done = yield* Deferred.make<void>()
        const close = Effect.andThen(Scope.close(scope, Exit.void), Deferred.succeed(done, undefined))
        // A failure or a defect of the lease or the start alike refuses the session (interruption stays one).
        const episode = yield* openEpisode(runtime, options, index, scope).pipe(
          Effect.catchCause((cause) =>
            Effect.andThen(
              close,
              Cause.hasInterruptsOnly(cause)
                ? Effect.failCause(cause as Cause.Cause<never>)
                : Effect.fail(serveError(`episode ${index} could not start`)(Cause.squash(cause)))
            )
          )
        )
        counts.open++
        yield* Scope.addFinalizer(scope, Effect.sync(() => void counts.open--))
        const server = new Server(
          { name: `agentfly-${task.name}`, version: "0.1.0" },
          { capabilities: { tools: {}, prompts: {} } }
        )
        server.setRequestHandler(ListToolsRequestSchema, () => ({ tools: listed }))
        server.setRequestHandler(CallToolRequestSchema, (request, extra) =>
          run(
            callTool(runtime, episode, `${episode.id}-${String(extra.requestId)}`, request.params.name,
              request.params.arguments),
            { signal: extra.signal }
          ))
        server.setRequestHandler(ListPromptsRequestSchema, () => ({
          prompts: [{ name: "episode", description: `The conversation this episode of ${task.name} starts from` }]
        }))
        server.setRequestHandler(GetPromptRequestSchema, (request) => {
          if (request.params.name !== "episode") throw new Error(`no prompt named ${request.params.name}`)
          return promptOf(task, episode)
        })
        server.onclose = () => void run(close)
        yield* Effect.tryPromise({ try: () => server.connect(transport), catch: serveError("cannot connect") }).pipe(
          Effect.tapError(() => close)
        )
        // The caller's scope ends the session too (a server shutting down).
        yield* Effect.addFinalizer(() => Effect.andThen(Effect.promise(() => server.close()), close))
        return { episodeId: episode.id, closed: Deferred.await(done) }
      })

    return { task, connect, counts: Effect.sync(() => ({ ...counts })) }
  })

/**
 * Serves one episode over this process's stdin and stdout, until stdin closes.
 *
 * **Gotchas**
 *
 * stdout is the protocol's channel: nothing else may print to it (the CLI sends console output to stderr).
 *
 * @category constructors
 * @since 0.1.0
 */
export const serveStdio = (served: Served): Effect.Effect<void, ServeError> =>
  Effect.scoped(Effect.flatMap(served.connect(new StdioServerTransport()), (session) => session.closed))

/**
 * A served task over streamable HTTP.
 *
 * @category models
 * @since 0.1.0
 */
export interface HttpServer {
  /** `http://host:port/mcp` */
  readonly url: string
  readonly port: number
}

const decodeJson = Schema.decodeUnknownExit(Schema.fromJsonString(Schema.Unknown))

/** A request's JSON body, parsed (undefined when it has none or it is not JSON). */
const readBody = (req: IncomingMessage): Effect.Effect<unknown> =>
  Effect.callback<unknown>((resume) => {
    const chunks: Array<Buffer> = []
    req.on("data", (chunk: Buffer) => chunks.push(chunk))
    req.on("end", () => {
      const parsed = decodeJson(Buffer.concat(chunks).toString("utf8"))
      resume(Effect.succeed(Exit.isSuccess(parsed) ? parsed.value : undefined))
    })
    req.on("error", () => resume(Effect.succeed(undefined)))
  })

const refuse = (res: ServerResponse, status: number, message: string) => {
  res.writeHead(status, { "content-type": "application/json" })
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message }, id: null }))
}

/**
 * Serves a task over streamable HTTP at `http://host:port/mcp` (default host 127.0.0.1; port 0 picks a free one):
 * an `initialize` without a session id opens a session, and with it an episode; the session's `DELETE` closes it.
 * Closing the scope closes every session and the server.
 *
 * @category constructors
 * @since 0.1.0
 */
export const serveHttp = (
  served: Served,
  options: { readonly port?: number | undefined; readonly host?: string | undefined } = {}
): Effect.Effect<HttpServer, ServeError, Scope.Scope> =>
  Effect.gen(function*() {
    const host = options.host ?? "127.0.0.1"
    const run = yield* FiberSet.makeRuntimePromise<never>()
    const sessions = new Map<string, StreamableHTTPServerTransport>()
    const serverScope = yield* Effect.scope

    const open = (req: IncomingMessage, res: ServerResponse, body: unknown) =>
      Effect.gen(function*() {
        const transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (id) => void sessions.set(id, transport)
        })
        transport.onclose = () => void (transport.sessionId !== undefined && sessions.delete(transport.sessionId))
        const started = yield* Effect.exit(Scope.provide(served.connect(transport), serverScope))
        if (Exit.isFailure(started)) return refuse(res, 500, Cause.pretty(started.cause))
        yield* Effect.promise(() => transport.handleRequest(req, res, body))
      })

    const handle = (req: IncomingMessage, res: ServerResponse) =>
      Effect.gen(function*() {
        if (new URL(req.url ?? "/", "http://x").pathname !== "/mcp") return refuse(res, 404, "not found: use /mcp")
        const id = req.headers["mcp-session-id"]
        const known = typeof id === "string" ? sessions.get(id) : undefined
        const body = req.method === "POST" ? yield* readBody(req) : undefined
        if (known !== undefined) return yield* Effect.promise(() => known.handleRequest(req, res, body))
        if (typeof id === "string") return refuse(res, 404, `no session ${id} (it ended, or never began)`)
        if (req.method === "POST" && isInitializeRequest(body)) return yield* open(req, res, body)
        return refuse(res, 400, "no session: send initialize first, without an mcp-session-id header")
      })

    const server = createServer((req, res) =>
      void run(Effect.catchCause(handle(req, res), (cause) =>
        Effect.sync(() => {
          if (!res.headersSent) refuse(res, 500, Cause.pretty(cause))
        })))
    )
    const port = yield* Effect.acquireRelease(
      Effect.callback<number, ServeError>((resume) => {
        server.once("error", (e) => resume(Effect.fail(serveError(`cannot listen on ${host}:${options.port}`)(e))))
        server.listen(options.port ?? 0, host, () => {
          const address = server.address()
          resume(Effect.succeed(typeof address === "object" && address !== null ? address.port : 0))
        })
      }),
      () =>
        Effect.callback<void>((resume) => {
          server.closeAllConnections()
          server.close(() => resume(Effect.void))
        })
    )
    return { url: `http://${host}:${port}/mcp`, port }
  })
