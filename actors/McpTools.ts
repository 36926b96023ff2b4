/**
 * MCP servers as tools: a server's tool list becomes `Tool`s (their JSON Schemas as the server wrote them), and
 * their calls go through the tool actor like any native tool's (timeouts, retries, output budgets, errors as
 * observations).
 *
 * - A {@link Server} says where a server is: a command spoken to over stdio ({@link stdio}), or a URL spoken to over
 *   streamable HTTP ({@link http}). Each server has a service key ({@link Server.key}) whose value is a
 *   {@link Session}: the tools of that server declare it in their `dependencies`, and the chain's environment
 *   provides it, so that a stateful server can be one process per chain (`resources/Mcp.ts`: leased through the
 *   resource manager and reset between chains).
 * - {@link tools} connects once, lists the server's tools and closes: a task built from them knows its tools (and
 *   renders them into the prompt) before any chain starts. Arguments are checked against each tool's `inputSchema`
 *   (the SDK's ajv validator) before they reach the server, so a malformed call is the model's `DecodeError`, as for a
 *   native tool.
 * - Every failure is a typed {@link McpError} naming the server, with a `reason`: the server could not be started
 *   or reached (`ConnectFailed`), its connection closed mid-call (`Closed`, a crash: retryable), the SDK's own request
 *   limit ran out (`Timeout`), the tool answered `isError` (`ToolFailed`: its text is what the model reads), the
 *   result is not a valid MCP result (`MalformedResult`), or the server answered with a JSON-RPC error (`Protocol`).
 *   A call interrupted by the tool actor's timeout is cancelled on the server (`notifications/cancelled`).
 *
 * @since 0.1.0
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import type { Transport as SdkTransport } from "@modelcontextprotocol/sdk/shared/transport.js"
import { ErrorCode, McpError as SdkError } from "@modelcontextprotocol/sdk/types.js"
import type { CallToolResult, Tool as SdkTool } from "@modelcontextprotocol/sdk/types.js"
import { AjvJsonSchemaValidator } from "@modelcontextprotocol/sdk/validation/ajv"
import { Context, Effect, Result, Schema } from "effect"
import type { Scope } from "effect"
import type * as Environment from "../src/Environment.ts"
import { Tool } from "../src/index.ts"
import type * as Resource from "../src/Resource.ts"

// ===== Servers =====

/**
 * A server run as a child process and spoken to over its stdin and stdout.
 *
 * @category models
 * @since 0.1.0
 */
export interface StdioTransport {
  readonly _tag: "Stdio"
  readonly command: string
  readonly args?: ReadonlyArray<string> | undefined
  /** Added to the few variables the SDK passes on (`PATH`, `HOME`, …). */
  readonly env?: Readonly<Record<string, string>> | undefined
  readonly cwd?: string | undefined
}

/**
 * A server spoken to over streamable HTTP.
 *
 * @category models
 * @since 0.1.0
 */
export interface HttpTransport {
  readonly _tag: "Http"
  readonly url: string
  readonly headers?: Readonly<Record<string, string>> | undefined
}

/**
 * A server reached through a transport of the SDK's own making (its `InMemoryTransport` to a server in this
 * process, a custom transport).
 *
 * @category models
 * @since 0.1.0
 */
export interface SdkTransportOf {
  readonly _tag: "Sdk"
  readonly transport: SdkTransport
}

/**
 * Where a server is.
 *
 * @category models
 * @since 0.1.0
 */
export type Transport = StdioTransport | HttpTransport | SdkTransportOf

/**
 * What the tools of a server call: the server's session of the chain (its own process, or a shared one).
 *
 * @category models
 * @since 0.1.0
 */
export interface Session {
  readonly server: string
  readonly callTool: (
    name: string,
    args: Readonly<Record<string, unknown>>
  ) => Effect.Effect<CallToolResult, McpError | Environment.EnvError | Resource.LeaseError>
}

/**
 * An MCP server: its name (used in errors, metrics and its service key), where it is (per instance: a stateful
 * server may take a state file of its own per chain), and how long one request may take in the SDK (default 10
 * minutes: the tool actor's timeout is the one that matters) and its start (default 30 seconds).
 *
 * @category models
 * @since 0.1.0
 */
export interface Server {
  readonly name: string
  readonly transport: (instanceId: string) => Transport
  readonly requestTimeoutMs: number
  /** How long starting and initializing a session may take (default 30 seconds). */
  readonly connectTimeoutMs: number
  /** The service the server's tools need: its {@link Session} for the chain. */
  readonly key: Context.Key<Session, Session>
}

/**
 * Options of {@link stdio} and {@link http}.
 *
 * @category models
 * @since 0.1.0
 */
export interface ServerOptions {
  readonly requestTimeoutMs?: number | undefined
  readonly connectTimeoutMs?: number | undefined
}

const keyOf = (name: string) => Context.Service<Session>(`agentfly/actors/McpTools/${name}`)

/**
 * A server started as `command args…` and spoken to over stdio. `options` may depend on the instance's id (a state
 * file per chain: `(id) => ({ command, env: { MEMORY_FILE_PATH: \`/tmp/\${id}.jsonl\` } })`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const stdio = (
  name: string,
  options:
    | Omit<StdioTransport, "_tag">
    | ((instanceId: string) => Omit<StdioTransport, "_tag">),
  serverOptions: ServerOptions = {}
): Server => ({
  name,
  transport: (id) => ({ _tag: "Stdio", ...(typeof options === "function" ? options(id) : options) }),
  requestTimeoutMs: serverOptions.requestTimeoutMs ?? 600_000,
  connectTimeoutMs: serverOptions.connectTimeoutMs ?? 30_000,
  key: keyOf(name)
})

/**
 * A server at a streamable-HTTP URL (`http://127.0.0.1:8931/mcp`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const http = (
  name: string,
  options: Omit<HttpTransport, "_tag"> | ((instanceId: string) => Omit<HttpTransport, "_tag">),
  serverOptions: ServerOptions = {}
): Server => ({
  name,
  transport: (id) => ({ _tag: "Http", ...(typeof options === "function" ? options(id) : options) }),
  requestTimeoutMs: serverOptions.requestTimeoutMs ?? 600_000,
  connectTimeoutMs: serverOptions.connectTimeoutMs ?? 30_000,
  key: keyOf(name)
})

/**
 * A server reached through an SDK transport made per instance (`InMemoryTransport.createLinkedPair()`'s client
 * side, with the server connected to the other side).
 *
 * @category constructors
 * @since 0.1.0
 */
export const sdk = (
  name: string,
  transport: (instanceId: string) => SdkTransport,
  serverOptions: ServerOptions = {}
): Server => ({
  name,
  transport: (id) => ({ _tag: "Sdk", transport: transport(id) }),
  requestTimeoutMs: serverOptions.requestTimeoutMs ?? 600_000,
  connectTimeoutMs: serverOptions.connectTimeoutMs ?? 30_000,
  key: keyOf(name)
})

// ===== Errors =====

/**
 * The server could not be started, reached or initialized.
 *
 * @category errors
 * @since 0.1.0
 */
export class ConnectFailed extends Schema.TaggedError<ConnectFailed>()("ConnectFailed", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The connection closed while a call was running or before it was sent: the server exited (a crash) or went away.
 *
 * @category errors
 * @since 0.1.0
 */
export class Closed extends Schema.TaggedError<Closed>()("Closed", { message: Schema.String }) {}

/**
 * The SDK's request limit (`requestTimeoutMs`) ran out.
 *
 * @category errors
 * @since 0.1.0
 */
export class RequestTimeout extends Schema.TaggedError<RequestTimeout>()("Timeout", {
  message: Schema.String,
  timeoutMs: Schema.Number
}) {}

/**
 * The tool answered with `isError: true`; `message` is its text, what the model reads.
 *
 * @category errors
 * @since 0.1.0
 */
export class ToolFailed extends Schema.TaggedError<ToolFailed>()("ToolFailed", { message: Schema.String }) {}

/**
 * The server's answer is not a valid MCP tool result (or its structured content does not match the tool's
 * `outputSchema`).
 *
 * @category errors
 * @since 0.1.0
 */
export class MalformedResult extends Schema.TaggedError<MalformedResult>()("MalformedResult", {
  message: Schema.String
}) {}

/**
 * The server answered with a JSON-RPC error (`code`).
 *
 * @category errors
 * @since 0.1.0
 */
export class Protocol extends Schema.TaggedError<Protocol>()("Protocol", {
  message: Schema.String,
  code: Schema.Number
}) {}

/**
 * Why an MCP request failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const McpErrorReason = Schema.Union([
  ConnectFailed,
  Closed,
  RequestTimeout,
  ToolFailed,
  MalformedResult,
  Protocol
])
export type McpErrorReason = typeof McpErrorReason.Type

/**
 * A failed request to the MCP server `server` (for tool `tool`, when a call). `message` is the reason's; handle
 * reasons with `Effect.catchReason("McpError", "Closed", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class McpError extends Schema.TaggedError<McpError>()("McpError", {
  server: Schema.String,
  tool: Schema.optionalKey(Schema.String),
  reason: McpErrorReason
}) {
  /** A crash, a timeout or a server that could not be reached: worth another try, on a fresh process. */
  get isRetryable(): boolean {
    const tag = this.reason._tag
    return tag === "Closed" || tag === "Timeout" || tag === "ConnectFailed"
  }
  override get message(): string {
    return this.reason.message
  }
}

const textOf = (e: unknown): string => (e instanceof Error ? e.message : String(e))

/** The reason of what the SDK threw or rejected with. */
const reasonOf = (server: Server, e: unknown): McpErrorReason => {
  if (e instanceof SdkError) {
    // The client's own checks of a result against the tool's `outputSchema` throw with these codes and words.
    if (/structured content|output schema/i.test(e.message)) return new MalformedResult({ message: e.message })
    if (e.code === ErrorCode.ConnectionClosed) return new Closed({ message: `the server closed the connection` })
    if (e.code === ErrorCode.RequestTimeout) {
      return new RequestTimeout({
        message: `no answer within ${server.requestTimeoutMs} ms`,
        timeoutMs: server.requestTimeoutMs
      })
    }
    return new Protocol({ message: e.message, code: e.code })
  }
  // A result that fails the SDK's result schema is rejected with the schema library's (zod's) error and its issues.
  const issues = typeof e === "object" && e !== null ? (e as { issues?: unknown }).issues : undefined
  if (Array.isArray(issues)) {
    const what = issues.map((i: { path?: ReadonlyArray<unknown>; message?: unknown }) =>
      `${(i.path ?? []).join(".") || "(result)"}: ${String(i.message)}`
    )
    return new MalformedResult({ message: `not a valid tool result: ${oneLine(what.join("; "))}` })
  }
  if (/not connected/i.test(textOf(e))) return new Closed({ message: "the server is not connected" })
  return new Protocol({ message: textOf(e), code: 0 })
}

const oneLine = (text: string): string => {
  const flat = text.replace(/\s+/g, " ")
  return flat.length > 300 ? `${flat.slice(0, 300)}…` : flat
}

const mcpError = (server: Server, reason: McpErrorReason, tool?: string): McpError =>
  new McpError({ server: server.name, ...(tool === undefined ? {} : { tool }), reason })

// ===== Connections =====

/**
 * One live connection to a server: its SDK client, the child's pid (stdio) and whether the connection has closed.
 *
 * @category models
 * @since 0.1.0
 */
export interface Connection {
  readonly server: Server
  readonly client: Client
  /** The server process's id, for a stdio server. */
  readonly pid: number | undefined
  /** Whether the connection has closed (the process exited, the HTTP session ended). */
  readonly isClosed: () => boolean
  readonly callTool: (
    name: string,
    args: Readonly<Record<string, unknown>>
  ) => Effect.Effect<CallToolResult, McpError>
  readonly listTools: Effect.Effect<ReadonlyArray<SdkTool>, McpError>
  readonly ping: Effect.Effect<void, McpError>
}

const sdkTransport = (transport: Transport): SdkTransport =>
  transport._tag === "Sdk"
    ? transport.transport
    : transport._tag === "Stdio"
    ? new StdioClientTransport({
      command: transport.command,
      args: [...(transport.args ?? [])],
      ...(transport.env === undefined ? {} : { env: { ...transport.env } }),
      ...(transport.cwd === undefined ? {} : { cwd: transport.cwd }),
      // The server's own log lines stay out of ours (and out of the protocol channel).
      stderr: "ignore"
    })
    : new StreamableHTTPClientTransport(
      new URL(transport.url),
      transport.headers === undefined ? undefined : { requestInit: { headers: { ...transport.headers } } }
    )

/**
 * Connects to an instance of `server` (starting its process, for stdio) and initializes the session; closing the
 * scope closes the session and ends the process (stdin closed, then SIGTERM, then SIGKILL, as the SDK does).
 *
 * @category constructors
 * @since 0.1.0
 */
export const connect = (server: Server, instanceId = "main"): Effect.Effect<Connection, McpError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.suspend(() => {
      const transport = sdkTransport(server.transport(instanceId))
      const client = new Client({ name: "agentfly", version: "0.1.0" })
      let closed = false
      client.onclose = () => void (closed = true)
      // A failed start leaves a process behind unless the transport is closed here.
      return Effect.tryPromise({
        try: () => client.connect(transport, { timeout: server.connectTimeoutMs }),
        catch: (e) =>
          mcpError(
            server,
            new ConnectFailed({
              message: e instanceof SdkError && e.code === ErrorCode.RequestTimeout
                ? `the server did not answer initialize within ${server.connectTimeoutMs} ms`
                : `cannot connect: ${oneLine(textOf(e))}`,
              cause: e
            })
          )
      }).pipe(
        Effect.tapError(() => Effect.promise(() => client.close().catch(() => undefined))),
        Effect.as(makeConnection(server, client, transport, () => closed))
      )
    }),
    closeConnection
  )

/** Ends an HTTP session on the server (its `DELETE`: a server may hold state per session), then closes the client. */
const closeConnection = (connection: Connection): Effect.Effect<void> => {
  const transport = connection.client.transport
  const end = transport instanceof StreamableHTTPClientTransport && !connection.isClosed()
    ? Effect.ignore(Effect.tryPromise(() => transport.terminateSession()))
    : Effect.void
  return Effect.andThen(end, Effect.ignore(Effect.tryPromise(() => connection.client.close())))
}

const makeConnection = (
  server: Server,
  client: Client,
  transport: SdkTransport,
  isClosed: () => boolean
): Connection => ({
  server,
  client,
  pid: transport instanceof StdioClientTransport ? (transport.pid ?? undefined) : undefined,
  isClosed,
  callTool: (name, args) =>
    Effect.suspend(() =>
      isClosed()
        ? Effect.fail(mcpError(server, new Closed({ message: "the server's connection is closed" }), name))
        : Effect.tryPromise({
          // The signal aborts when the caller is interrupted (the tool actor's timeout): the SDK then tells the
          // server that the request is cancelled.
          try: (signal) =>
            client.callTool({ name, arguments: { ...args } }, undefined, {
              signal,
              timeout: server.requestTimeoutMs
            }) as Promise<CallToolResult>,
          catch: (e) => mcpError(server, reasonOf(server, e), name)
        })
    ),
  listTools: Effect.gen(function*() {
    const out: Array<SdkTool> = []
    let cursor: string | undefined
    do {
      const page = yield* Effect.tryPromise({
        try: () =>
          client.listTools(cursor === undefined ? undefined : { cursor }, { timeout: server.requestTimeoutMs }),
        catch: (e) => mcpError(server, reasonOf(server, e))
      })
      out.push(...page.tools)
      cursor = page.nextCursor
    } while (cursor !== undefined)
    return out
  }),
  ping: Effect.tryPromise({
    try: () => client.ping({ timeout: server.requestTimeoutMs }),
    catch: (e) => mcpError(server, reasonOf(server, e))
  }).pipe(Effect.asVoid)
})

/**
 * A connection as the session its server's tools call.
 *
 * @category constructors
 * @since 0.1.0
 */
export const session = (connection: Connection): Session => ({
  server: connection.server.name,
  callTool: connection.callTool
})

/**
 * The context a chain's tools of `server` need, over one connection (a shared server, a test).
 *
 * @category constructors
 * @since 0.1.0
 */
export const context = (connection: Connection): Context.Context<Session> =>
  Context.make(connection.server.key, session(connection))

// ===== Results =====

/**
 * A tool result as the text the model reads: its text blocks, one after the other; other blocks (images, audio,
 * resources) named by what they are; its structured content as JSON when it has no content blocks.
 *
 * @category getters
 * @since 0.1.0
 */
export const resultText = (result: CallToolResult): string => {
  const parts = result.content.map((block) => {
    switch (block.type) {
      case "text":
        return block.text
      case "image":
      case "audio":
        return `[${block.type}: ${block.mimeType}, ${block.data.length} base64 characters]`
      case "resource":
        return "text" in block.resource ? String(block.resource.text) : `[resource: ${block.resource.uri}]`
      case "resource_link":
        return `[resource: ${block.uri}]`
      default:
        return `[${(block as { type: string }).type}]`
    }
  })
  if (parts.length === 0 && result.structuredContent !== undefined) return JSON.stringify(result.structuredContent)
  return parts.join("\n")
}

// ===== Tools =====

/**
 * Options of {@link tools}.
 *
 * @category models
 * @since 0.1.0
 */
export interface ToolsOptions {
  /** Only these of the server's tools (default: all). */
  readonly include?: ReadonlyArray<string> | undefined
  /** Prefixed to every tool's name (`memory_`), when two servers' tools would share a name. */
  readonly prefix?: string | undefined
  /** Each tool's timeout (default: the run's tool timeout). */
  readonly timeout?: Tool.Options<any, any, any, any>["timeout"]
  /** Each tool's output budget (default: the tool actor's). */
  readonly maxOutput?: Tool.OutputBudget | undefined
  /**
   * Retries of a call that failed retryably (a crash: the next attempt runs on the replacement process, whose state
   * is fresh; a timeout). Default: none, so the model reads the failure.
   */
  readonly retry?: Tool.RetryPolicy | undefined
}

const validator = new AjvJsonSchemaValidator()

/** Arguments: a JSON object that the tool's `inputSchema` accepts (any object when the schema cannot compile). */
const parametersOf = (info: SdkTool) => {
  const compiled = Result.try(() => validator.getValidator(info.inputSchema as never))
  const check = Result.isSuccess(compiled) ? compiled.success : undefined
  return Schema.Record(Schema.String, Schema.Unknown).check(
    Schema.makeFilter((args: Readonly<Record<string, unknown>>) => {
      if (check === undefined) return true
      const verdict = check(args)
      return verdict.valid ? true : verdict.errorMessage
    })
  )
}

/**
 * One of a server's tools as a `Tool` whose handler calls it through the chain's {@link Session} of the server.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromInfo = (server: Server, info: SdkTool, options: ToolsOptions = {}): McpTool =>
  Tool.make(`${options.prefix ?? ""}${info.name}`, {
    description: info.description ?? info.title ?? info.name,
    parameters: parametersOf(info),
    success: Schema.String,
    failure: Schema.Unknown,
    strict: false,
    jsonSchema: info.inputSchema as Record<string, unknown>,
    dependencies: [server.key],
    ...(options.timeout === undefined ? {} : { timeout: options.timeout }),
    ...(options.maxOutput === undefined ? {} : { maxOutput: options.maxOutput }),
    ...(options.retry === undefined ? {} : { retry: options.retry }),
    handler: (args) =>
      Effect.flatMap(Effect.service(server.key), (s) => s.callTool(info.name, args)).pipe(
        Effect.flatMap((result) =>
          result.isError === true
            ? Effect.fail(mcpError(server, new ToolFailed({ message: resultText(result) }), info.name))
            : Effect.succeed(resultText(result))
        )
      )
  })

/**
 * A server's tool: JSON-object arguments checked against its `inputSchema`, its text result, any failure.
 *
 * @category models
 * @since 0.1.0
 */
export type McpTool = Tool.Tool<string, any, typeof Schema.String, typeof Schema.Unknown, Session>

/**
 * The tools of `server`: connects to one instance (id `"list"`), lists its tools and closes it. Each tool's
 * parameters are its `inputSchema`, shown to the model as written and checked before a call is sent; its handler
 * calls the chain's {@link Session} of the server (the `dependencies` of every tool).
 *
 * **Gotchas**
 *
 * The list is read once, when the task is made: a server whose tools change per instance is not supported. A
 * server whose start fails fails here, with `McpError(ConnectFailed)`, before any rollout.
 *
 * @category constructors
 * @since 0.1.0
 */
export const tools = (
  server: Server,
  options: ToolsOptions = {}
): Effect.Effect<ReadonlyArray<McpTool>, McpError> =>
  Effect.scoped(
    Effect.gen(function*() {
      const connection = yield* connect(server, "list")
      const infos = yield* connection.listTools
      const include = options.include
      if (include !== undefined) {
        const missing = include.filter((name) => !infos.some((info) => info.name === name))
        if (missing.length > 0) {
          return yield* mcpError(
            server,
            new Protocol({
              message: `the server has no tool ${missing.join(", ")} (it has: ${infos.map((i) => i.name).join(", ")})`,
              code: ErrorCode.MethodNotFound
            })
          )
        }
      }
      return infos.filter((info) => include === undefined || include.includes(info.name)).map((info) =>
        fromInfo(server, info, options)
      )
    })
  )
