/**
 * MCP servers as tools, against the published reference servers (`@modelcontextprotocol/server-memory`,
 * `server-filesystem`) and a hand-written faulty one: the tool list becomes `Tool`s with the servers' JSON Schemas,
 * calls and results go through the tool actor, a stateful server is one process per chain leased through the resource
 * manager and reset between chains, and every failure (a crash mid-call, a hung tool, a malformed result, a server
 * that cannot start) is a typed error and an observation, with no process left behind.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Scope } from "effect"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as McpTools from "../../../actors/McpTools.ts"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as Mcp from "../../../actors/resources/Mcp.ts"
import * as ToolActor from "../../../actors/ToolActor.ts"
import * as Environment from "../../../src/Environment.ts"
import * as Tool from "../../../src/Tool.ts"
import { alive, faulty, filesystem, freshTag, gone, memory } from "./fixtures/servers.ts"

let nextId = 0
const call = (name: string, args: unknown) => ({
  id: `call_${nextId++}`,
  type: "function" as const,
  function: { name, arguments: args }
})

/** The observation's text (tool messages are text). */
const text = (result: ToolActor.CallResult): string => String(result.message.content)

const tempDir = () => mkdtempSync(join(tmpdir(), "agentfly-mcp-"))

/** A chain's environment from a provider, in a scope of its own (closed by the caller: the chain's end). */
const chainContext = (provider: Environment.Provider<McpTools.Session, unknown>, chainId: string) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const context = yield* Scope.provide(provider.acquire({ chainId, groupId: chainId }), scope)
    return { context: context as Context.Context<McpTools.Session>, close: Scope.close(scope, Exit.void) }
  })

describe("McpTools: a server's tools as Tools", () => {
  it.live("the memory server's tools carry its JSON Schemas; calls and results go through the tool actor", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      const tag = freshTag()
      const server = memory(dir, tag)
      const tools = yield* McpTools.tools(server)
      assert.includeMembers(tools.map((t) => t.name), ["create_entities", "read_graph", "search_nodes"])
      const create = tools.find((t) => t.name === "create_entities")!
      const schema = Tool.parametersJsonSchema(create)
      assert.strictEqual(schema.type, "object")
      assert.deepStrictEqual(Object.keys(schema.properties as object), ["entities"], "the server's schema, as written")
      assert.strictEqual(Tool.functionSchema(create).function.parameters, schema)
      assert.deepStrictEqual(alive(tag), [], "listing closed its process")

      const connection = yield* McpTools.connect(server, "shared")
      const actor = yield* ToolActor.make(tools)
      const context = McpTools.context(connection)
      const created = yield* actor.execute(
        call("create_entities", { entities: [{ name: "Ada", entityType: "person", observations: ["wrote notes"] }] }),
        { context }
      )
      assert.isUndefined(created.error, text(created))
      const graph = yield* actor.execute(call("read_graph", {}), { context })
      assert.include(text(graph), "Ada")
      assert.include(text(graph), "wrote notes")
      assert.include(readFileSync(join(dir, "shared.jsonl"), "utf8"), "Ada", "the server wrote its own file")

      // Arguments that break the tool's inputSchema are the model's format error; nothing reaches the server.
      const bad = yield* actor.execute(call("create_entities", { entities: "Ada" }), { context })
      assert.strictEqual(bad.error?.reason._tag, "DecodeError")
      assert.isTrue(bad.error?.isFormatError)
      assert.isTrue(bad.message.is_error)
      assert.match(text(bad), /^Error: invalid arguments for tool "create_entities": .*array/)
      assert.strictEqual(text(yield* actor.execute(call("read_graph", {}), { context })), text(graph))

      // A tool whose session the chain lacks is a wiring error the tool actor names.
      const missing = yield* actor.execute(call("read_graph", {}))
      assert.strictEqual(missing.error?.reason._tag, "MissingEnvironment")
      rmSync(dir, { recursive: true, force: true })
    }).pipe(Effect.scoped))

  it.live("the filesystem server writes and reads through the tools; a refusal of the server is an observation", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      const tag = freshTag()
      const server = filesystem(dir, tag)
      const tools = yield* McpTools.tools(server, { include: ["write_file", "read_text_file"], prefix: "fs_" })
      assert.deepStrictEqual(tools.map((t) => t.name).sort(), ["fs_read_text_file", "fs_write_file"])
      const actor = yield* ToolActor.make(tools)
      const context = McpTools.context(yield* McpTools.connect(server))
      const path = join(dir, "note.txt")
      const written = yield* actor.execute(call("fs_write_file", { path, content: "hello from a chain" }), { context })
      assert.isUndefined(written.error, text(written))
      assert.strictEqual(readFileSync(path, "utf8"), "hello from a chain")
      writeFileSync(path, "changed on disk")
      const read = yield* actor.execute(call("fs_read_text_file", { path }), { context })
      assert.strictEqual(text(read), "changed on disk")
      const outside = yield* actor.execute(call("fs_read_text_file", { path: "/etc/hostname" }), { context })
      assert.strictEqual(outside.error?.reason._tag, "HandlerFailure")
      const cause = (outside.error?.reason as Tool.HandlerFailure).cause as McpTools.McpError
      assert.strictEqual(cause.reason._tag, "ToolFailed")
      assert.match(text(outside), /^Error: .*(denied|outside)/i)
      const unknown = yield* McpTools.tools(server, { include: ["format_disk"] }).pipe(Effect.flip)
      assert.strictEqual(unknown.reason._tag, "Protocol")
      assert.include(unknown.message, "format_disk")
      rmSync(dir, { recursive: true, force: true })
    }).pipe(Effect.scoped))
})

describe("Mcp resources: one server process per chain, leased and reset", () => {
  it.live("with a reset, chains take turns on one process and never see each other's graph", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      const tag = freshTag()
      const server = memory(dir, tag)
      const tools = yield* McpTools.tools(server)
      const actor = yield* ToolActor.make(tools)
      const manager = yield* ResourceManager.make()
      // The memory server reads its file at every call: removing it is a fresh graph.
      const reset = (instance: Mcp.Instance) =>
        Effect.sync(() => rmSync(join(dir, `${instance.id}.jsonl`), { force: true }))
      const provider = yield* Effect.provideService(
        Mcp.provider(server, { pool: { max: 1 }, reset }),
        ResourceManager.ResourceManager,
        manager
      )
      const graphs: Array<string> = []
      for (const [chain, name] of [["a", "Ada"], ["b", "Grace"]] as const) {
        const { context, close } = yield* chainContext(provider, chain)
        const entities = [{ name, entityType: "person", observations: [] }]
        yield* actor.execute(call("create_entities", { entities }), { context })
        graphs.push(text(yield* actor.execute(call("read_graph", {}), { context })))
        yield* close
      }
      assert.include(graphs[0]!, "Ada")
      assert.include(graphs[1]!, "Grace")
      assert.notInclude(graphs[1]!, "Ada", "chain b's process was reset after chain a")
      const stats = (yield* manager.stats("mcp-memory"))!
      assert.strictEqual(stats.starts, 1, "one process served both chains")
      assert.strictEqual(stats.resets, 2)
      assert.lengthOf(alive(tag), 1, "the idle process waits in the pool")
      yield* manager.close("mcp-memory")
      assert.deepStrictEqual(yield* gone(tag), [], "closing the pool ended it")
      rmSync(dir, { recursive: true, force: true })
    }).pipe(Effect.scoped))

  it.live("without a reset, each chain gets a fresh process and the last one ends with its chain", () =>
    Effect.gen(function*() {
      const tag = freshTag()
      const server = faulty(tag)
      const actor = yield* ToolActor.make(yield* McpTools.tools(server, { include: ["count"] }))
      const manager = yield* ResourceManager.make()
      const provider = yield* Effect.provideService(Mcp.provider(server), ResourceManager.ResourceManager, manager)
      const counts: Array<string> = []
      for (const chain of ["a", "b", "c"]) {
        const { context, close } = yield* chainContext(provider, chain)
        counts.push(text(yield* actor.execute(call("count", {}), { context })))
        counts.push(text(yield* actor.execute(call("count", {}), { context })))
        yield* close
        assert.deepStrictEqual(yield* gone(tag), [], `chain ${chain}'s process ended with it`)
      }
      assert.deepStrictEqual(counts, ["1", "2", "1", "2", "1", "2"], "each chain's counter starts from nothing")
      assert.strictEqual((yield* manager.stats("mcp-faulty"))!.starts, 3)
    }).pipe(Effect.scoped))
})

describe("Mcp resources: a stateless server shared by every chain", () => {
  it.live("scope global with a no-op reset: one process for all chains, kept between them", () => {
    const tag = freshTag()
    return Effect.gen(function*() {
      const server = faulty(tag)
      const actor = yield* ToolActor.make(yield* McpTools.tools(server, { include: ["count"] }))
      const manager = yield* ResourceManager.make()
      const provider = yield* Effect.provideService(
        Mcp.provider(server, { scope: "global", reset: () => Effect.void }),
        ResourceManager.ResourceManager,
        manager
      )
      const a = yield* chainContext(provider, "a")
      const b = yield* chainContext(provider, "b")
      assert.strictEqual(text(yield* actor.execute(call("count", {}), { context: a.context })), "1")
      assert.strictEqual(text(yield* actor.execute(call("count", {}), { context: b.context })), "2")
      yield* a.close
      yield* b.close
      const c = yield* chainContext(provider, "c")
      assert.strictEqual(text(yield* actor.execute(call("count", {}), { context: c.context })), "3")
      yield* c.close
      assert.strictEqual((yield* manager.stats("mcp-faulty"))!.starts, 1)
      assert.lengthOf(alive(tag), 1)
    }).pipe(
      Effect.scoped,
      // The manager's scope closed: its pool ended the process.
      Effect.andThen(Effect.map(gone(tag), (left) => assert.deepStrictEqual(left, [])))
    )
  })
})

describe("MCP failures: typed errors, observations, nothing lost, no process left", () => {
  it.live("a crash mid-call, a hung tool, a malformed result, a tool error", () =>
    Effect.gen(function*() {
      const tag = freshTag()
      const server = faulty(tag)
      const tools = yield* McpTools.tools(server, { timeout: "1 second" })
      const actor = yield* ToolActor.make(tools)
      const manager = yield* ResourceManager.make()
      const provider = yield* Effect.provideService(Mcp.provider(server), ResourceManager.ResourceManager, manager)
      const { context, close } = yield* chainContext(provider, "chain")

      assert.strictEqual(text(yield* actor.execute(call("count", {}), { context })), "1")
      const [firstPid] = alive(tag)

      // The process exits in the middle of the call: the model reads the crash; the chain's next call runs on a
      // fresh process (its counter starts again), and the dead one is gone.
      const crash = yield* actor.execute(call("crash", {}), { context })
      assert.strictEqual(crash.error?.reason._tag, "HandlerFailure")
      assert.isTrue(crash.error?.isRetryable, "a crash is retryable")
      const crashCause = (crash.error?.reason as Tool.HandlerFailure).cause as Environment.EnvError
      assert.strictEqual(crashCause.reason._tag, "Crashed")
      assert.isTrue(crash.message.is_error)
      assert.match(text(crash), /^Error: the MCP server faulty exited/)
      assert.strictEqual(text(yield* actor.execute(call("count", {}), { context })), "1")
      assert.isDefined(firstPid)
      assert.notInclude(alive(tag), firstPid, "the crashed process is not left behind")
      assert.strictEqual((yield* manager.stats("mcp-faulty"))!.crashes, 1)

      // A tool that never answers: the tool actor's timeout is the observation; the request is cancelled and the
      // same process answers the next call.
      const hang = yield* actor.execute(call("hang", {}), { context })
      assert.strictEqual(hang.error?.reason._tag, "Timeout")
      assert.strictEqual(text(hang), `Error: tool "hang" timed out after 1s.`)
      assert.strictEqual(text(yield* actor.execute(call("count", {}), { context })), "2")

      // A result that is not an MCP tool result.
      const malformed = yield* actor.execute(call("malformed", {}), { context })
      assert.strictEqual(malformed.error?.reason._tag, "HandlerFailure")
      const malformedCause = (malformed.error?.reason as Tool.HandlerFailure).cause as McpTools.McpError
      assert.strictEqual(malformedCause._tag, "McpError")
      assert.strictEqual(malformedCause.reason._tag, "MalformedResult")
      assert.strictEqual(
        text(malformed),
        "Error: not a valid tool result: content: Invalid input: expected array, received string"
      )

      // The tool's own error (`isError`): its text is the observation.
      const fail = yield* actor.execute(call("fail", {}), { context })
      assert.strictEqual(text(fail), "Error: the widget is broken")
      const failCause = (fail.error?.reason as Tool.HandlerFailure).cause as McpTools.McpError
      assert.strictEqual(failCause.reason._tag, "ToolFailed")

      // Nothing was lost on the way: every call was answered, in order, and counted by reason.
      const metrics = yield* actor.metrics
      assert.strictEqual(metrics["tool/count/calls"], 3)
      assert.strictEqual(metrics["tool/crash/errors/HandlerFailure"], 1)
      assert.strictEqual(metrics["tool/hang/errors/Timeout"], 1)
      assert.strictEqual(metrics["tool/malformed/errors/HandlerFailure"], 1)
      assert.strictEqual(text(yield* actor.execute(call("echo", { text: "still here" }), { context })), "still here")

      yield* close
      assert.deepStrictEqual(yield* gone(tag), [], "the chain's end ended its process, hung request and all")
    }).pipe(Effect.scoped))

  it.live("a server that cannot start is McpError(ConnectFailed), before any chain", () =>
    Effect.gen(function*() {
      const server = McpTools.stdio("nowhere", { command: "/nonexistent/mcp-server" })
      const error = yield* Effect.flip(McpTools.tools(server))
      assert.strictEqual(error._tag, "McpError")
      assert.strictEqual(error.server, "nowhere")
      assert.strictEqual(error.reason._tag, "ConnectFailed")
      assert.isTrue(error.isRetryable)
      const http = McpTools.http("gone", { url: "http://127.0.0.1:9/mcp" })
      assert.strictEqual((yield* Effect.flip(McpTools.tools(http))).reason._tag, "ConnectFailed")
    }))

  it.live("a server that never answers initialize is ConnectFailed after connectTimeoutMs, and is ended", () =>
    Effect.gen(function*() {
      const tag = freshTag()
      const silent = McpTools.stdio("silent", {
        command: process.execPath,
        args: ["-e", "setInterval(() => {}, 1000)", "--", `--tag=${tag}`]
      }, { connectTimeoutMs: 500 })
      const error = yield* Effect.flip(McpTools.tools(silent))
      assert.strictEqual(error.reason._tag, "ConnectFailed")
      assert.strictEqual(error.message, "the server did not answer initialize within 500 ms")
      assert.deepStrictEqual(yield* gone(tag), [], "the silent process was ended")
    }))

  it.live("a shared connection whose server died fails every call with Closed, naming the tool", () =>
    Effect.gen(function*() {
      const tag = freshTag()
      const connection = yield* McpTools.connect(faulty(tag))
      const error = yield* Effect.flip(connection.callTool("crash", {}))
      assert.strictEqual(error.reason._tag, "Closed")
      assert.strictEqual(error.tool, "crash")
      assert.isTrue(connection.isClosed())
      const next = yield* Effect.flip(connection.callTool("echo", { text: "x" }))
      assert.strictEqual(next.reason._tag, "Closed")
      assert.deepStrictEqual(alive(tag), [])
    }).pipe(Effect.scoped))
})
