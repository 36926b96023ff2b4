/**
 * `agentfly mcp TASK [--http PORT] [--host H] [--data FILE] [--tool-timeout S]`: serves a task's tools and
 * environment over MCP (`actors/McpServer.ts`), one episode per session: over stdio by default (one session: the
 * process's stdin and stdout, until stdin closes), or over streamable HTTP at `http://HOST:PORT/mcp` with `--http`
 * (a session per `initialize`, until its `DELETE`). `TASK` is a built-in task's name or a task module's path. With
 * `--data`, episodes start from the file's rows in turn (a task whose episode reads its row needs them).
 *
 * **Gotchas**
 *
 * Over stdio, stdout is the protocol's channel: everything the process would print there goes to stderr.
 *
 * @since 0.1.0
 */
import { Console, Effect, Option, Path } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as McpServer from "../actors/McpServer.ts"
import * as Tasks from "../environments/Tasks.ts"
import * as Dataset from "../src/Dataset.ts"
import * as Task from "../src/Task.ts"
import { exitOnFailure } from "./train.ts"

/**
 * @category commands
 * @since 0.1.0
 */
export const mcp = Command.make(
  "mcp",
  {
    task: Argument.String("task").pipe(
      Argument.withDescription(`A built-in task (${Object.keys(Tasks.builtins).join(", ")}) or a task module's path`)
    ),
    http: Flag.Int("http").pipe(
      Flag.withDescription("Serve over streamable HTTP on this port (0: any free port) instead of stdio"),
      Flag.filter((p) => p >= 0 && p <= 65535, (p) => `--http must be a port in [0, 65535], got ${p}`),
      Flag.optional
    ),
    host: Flag.String("host").pipe(Flag.withDescription("Address to listen on"), Flag.withDefault("127.0.0.1")),
    data: Flag.String("data").pipe(
      Flag.withDescription("A dataset file whose rows the episodes start from"),
      Flag.optional
    ),
    toolTimeout: Flag.Finite("tool-timeout").pipe(
      Flag.withDescription("Seconds a tool call may run when its tool sets no timeout"),
      Flag.withDefault(30)
    )
  },
  Effect.fn("mcp")(function*(args) {
    const stdio = Option.isNone(args.http)
    // The protocol owns stdout over stdio: logs and stray prints go to stderr.
    if (stdio) console.log = console.error
    const path = yield* Path.Path
    const task = yield* Task.resolve(args.task, { builtins: Tasks.builtins, resolvePath: (p) => path.resolve(p) })
    const rows = Option.isNone(args.data)
      ? undefined
      : (yield* Dataset.load(args.data.value, { fields: task.row })).rows
    const served = yield* McpServer.make(task, { rows, toolTimeout: `${args.toolTimeout} seconds` })
    if (stdio) return yield* McpServer.serveStdio(served)
    const server = yield* McpServer.serveHttp(served, { port: args.http.value, host: args.host })
    yield* Console.error(`serving task ${task.name} over MCP at ${server.url} (one episode per session)`)
    return yield* Effect.never
  }, Effect.scoped, exitOnFailure)
).pipe(Command.withDescription("Serve a task's tools and environment over MCP, one episode per session"))
