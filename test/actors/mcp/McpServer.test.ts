/**
 * Tasks as MCP servers, tested with the official SDK's client: the calculator task's tools listed (with the JSON
 * Schemas the chat template shows) and called over streamable HTTP and over stdio (`agentfly mcp calculator`, the
 * real command); a stateful task served one episode per session (its own environment, its row, its start and step),
 * each session's environment released when the session ends.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js"
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js"
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Scope } from "effect"
import { fileURLToPath } from "node:url"
import * as McpServer from "../../../actors/McpServer.ts"
import * as McpTools from "../../../actors/McpTools.ts"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as Mcp from "../../../actors/resources/Mcp.ts"
import * as ToolActor from "../../../actors/ToolActor.ts"
import * as Calculator from "../../../environments/calculator/Calculator.ts"
import * as CalculatorTask from "../../../environments/calculator/CalculatorTask.ts"
import * as Environment from "../../../src/Environment.ts"
import * as Task from "../../../src/Task.ts"
import * as Tool from "../../../src/Tool.ts"
import * as Counter from "./fixtures/counterTask.ts"

const root = fileURLToPath(new URL("../../../", import.meta.url))

/** A connected SDK client over streamable HTTP, closed with the scope; `end` ends its session (`DELETE`). */
const httpClient = (url: string) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const transport = new StreamableHTTPClientTransport(new URL(url))
      const client = new Client({ name: "test", version: "1.0.0" })
      await client.connect(transport)
      return { client, end: () => transport.terminateSession() }
    }),
    ({ client }) => Effect.promise(() => client.close())
  )

/** The texts of a call's result, and whether it is an error. */
const callText = (client: Client, name: string, args: Record<string, unknown>) =>
  Effect.promise(async () => {
    const result = (await client.callTool({ name, arguments: args })) as CallToolResult
    return {
      text: result.content.map((c) => (c.type === "text" ? c.text : `[${c.type}]`)),
      isError: result.isError === true
    }
  })

/** Waits until `served` has `open` episodes open (a session's end is handled after the client's call returns). */
const openEpisodes = (served: McpServer.Served, open: number) =>
  Effect.gen(function*() {
    for (let i = 0; i < 100 && (yield* served.counts).open !== open; i++) yield* Effect.sleep("50 millis")
    return (yield* served.counts).open
  })

const calculatorChecks = (client: Client) =>
  Effect.gen(function*() {
    const { tools } = yield* Effect.promise(() => client.listTools())
    assert.deepStrictEqual(tools.map((t) => t.name), ["calculator"])
    assert.deepStrictEqual(tools[0]!.inputSchema, Tool.parametersJsonSchema(Calculator.calculator))
    assert.strictEqual(tools[0]!.description, Calculator.calculator.description)
    assert.deepStrictEqual(yield* callText(client, "calculator", { expression: "99*46*89" }), {
      text: ["405306"],
      isError: false
    })
    const refused = yield* callText(client, "calculator", { expression: "import('fs')" })
    assert.isTrue(refused.isError)
    assert.match(refused.text[0]!, /^Error: /)
    const malformed = yield* callText(client, "calculator", { expr: "1+1" })
    assert.isTrue(malformed.isError)
    assert.match(malformed.text[0]!, /^Error: invalid arguments for tool "calculator"/)
    const unknown = yield* callText(client, "rm", {})
    assert.isTrue(unknown.isError)
    assert.match(unknown.text[0]!, /^Error: unknown tool "rm"/)
  })

describe("McpServer: tasks as MCP servers", () => {
  it.live("the calculator task over streamable HTTP: its tools listed with their JSON Schemas and called", () =>
    Effect.gen(function*() {
      const task = yield* CalculatorTask.task({})
      const served = yield* McpServer.make(task)
      const http = yield* McpServer.serveHttp(served, { port: 0 })
      const { client } = yield* httpClient(http.url)
      yield* calculatorChecks(client)
      assert.deepStrictEqual(yield* served.counts, { started: 1, open: 1 })
    }).pipe(Effect.scoped))

  it.live("one episode per session: its own environment, its row, its start and step; released at its end", () =>
    Effect.gen(function*() {
      const rows = [
        { index: 0, line: 1, question: "Count.", fields: { target: 3 } },
        { index: 1, line: 2, question: "Count.", fields: { target: 5 } }
      ]
      const served = yield* McpServer.make(Counter.task, { rows })
      const http = yield* McpServer.serveHttp(served, { port: 0 })
      const a = yield* httpClient(http.url)
      const b = yield* httpClient(http.url)
      const prompt = yield* Effect.promise(() => a.client.getPrompt({ name: "episode" }))
      assert.deepStrictEqual(
        prompt.messages.map((m) => (m.content.type === "text" ? m.content.text : "")),
        ["Use add.", "Count.", "Reach 3."],
        "the system prompt, the row's question, what the episode's start said"
      )
      assert.deepStrictEqual(yield* callText(a.client, "add", { by: 2 }), { text: ["2"], isError: false })
      assert.deepStrictEqual(yield* callText(b.client, "add", { by: 1 }), { text: ["1"], isError: false })
      assert.deepStrictEqual(yield* callText(a.client, "add", { by: 1 }), {
        text: ["3", "Done.", "[the episode has ended: reached]"],
        isError: false
      })
      const late = yield* callText(a.client, "add", { by: 1 })
      assert.isTrue(late.isError)
      assert.match(late.text[0]!, /the episode has ended \(reached\)/)
      assert.deepStrictEqual(yield* callText(b.client, "add", { by: 1 }), { text: ["2"], isError: false })
      assert.deepStrictEqual(yield* served.counts, { started: 2, open: 2 })
      // A session's end (the client's DELETE) releases its episode's environment, and only its own.
      yield* Effect.promise(() => a.end())
      assert.strictEqual(yield* openEpisodes(served, 1), 1)
      assert.strictEqual((yield* Counter.provider.stats!)["env/counter/open"], 1)
      yield* Effect.promise(() => b.end())
      assert.strictEqual(yield* openEpisodes(served, 0), 0)
      assert.strictEqual((yield* Counter.provider.stats!)["env/counter/open"], 0)
    }).pipe(Effect.scoped))

  it.live("an episode that cannot start refuses its session, saying why; the server keeps serving", () =>
    Effect.gen(function*() {
      const task = Task.make("broken", {
        tools: Counter.task.tools,
        environment: Counter.provider,
        episode: {
          start: () => Effect.fail(Environment.envError("counter", "reset", "ResetFailed", "the board is missing"))
        }
      })
      const served = yield* McpServer.make(task)
      const http = yield* McpServer.serveHttp(served, { port: 0 })
      const refused = yield* Effect.flip(Effect.tryPromise(async () => {
        const client = new Client({ name: "test", version: "1.0.0" })
        await client.connect(new StreamableHTTPClientTransport(new URL(http.url)))
      }))
      assert.include(String(refused.cause), "episode 0 could not start: the board is missing")
      assert.deepStrictEqual(yield* served.counts, { started: 1, open: 0 })
      assert.strictEqual((yield* Counter.provider.stats!)["env/counter/open"], 0, "its environment was released")
    }).pipe(Effect.scoped))

  it.live("served back to our own MCP tools over streamable HTTP: each leased chain is a session and an episode", () =>
    Effect.gen(function*() {
      const rows = [{ index: 0, line: 1, question: "Count.", fields: { target: 100 } }]
      const served = yield* McpServer.make(Counter.task, { rows })
      const http = yield* McpServer.serveHttp(served, { port: 0 })
      const server = McpTools.http("counter", { url: http.url })
      const tools = yield* McpTools.tools(server, { include: ["add"] })
      assert.deepStrictEqual(Tool.parametersJsonSchema(tools[0]!), served.task.tools.map(Tool.parametersJsonSchema)[0])
      const actor = yield* ToolActor.make(tools)
      const manager = yield* ResourceManager.make()
      const provider = yield* Effect.provideService(Mcp.provider(server), ResourceManager.ResourceManager, manager)
      const chain = Effect.fnUntraced(function*(chainId: string, by: number) {
        const scope = yield* Scope.make()
        const context = yield* Scope.provide(provider.acquire({ chainId, groupId: chainId }), scope)
        const call = { id: "c", type: "function" as const, function: { name: "add", arguments: { by } } }
        const first = yield* actor.execute(call, { context: context as Context.Context<McpTools.Session> })
        const second = yield* actor.execute(call, { context: context as Context.Context<McpTools.Session> })
        return { texts: [first.message.content, second.message.content], close: Scope.close(scope, Exit.void) }
      })
      const a = yield* chain("a", 2)
      const b = yield* chain("b", 5)
      assert.deepStrictEqual(a.texts, ["2", "4"])
      assert.deepStrictEqual(b.texts, ["5", "10"], "chain b's episode has a counter of its own")
      assert.strictEqual((yield* served.counts).open, 2)
      yield* a.close
      yield* b.close
      // Released chains' sessions are closed (recreate: no reset given), and with them their episodes.
      assert.strictEqual(yield* openEpisodes(served, 0), 0)
    }).pipe(Effect.scoped))

  it.live("`agentfly mcp calculator` over stdio, with the SDK's client; the server exits with its session", () =>
    Effect.gen(function*() {
      const transport = new StdioClientTransport({
        command: process.execPath,
        args: [`${root}bin/agentfly.mjs`, "mcp", "calculator"],
        cwd: root,
        stderr: "pipe"
      })
      let stderr = ""
      transport.stderr?.on("data", (chunk: Buffer) => void (stderr += chunk.toString()))
      const client = new Client({ name: "test", version: "1.0.0" })
      yield* Effect.promise(() => client.connect(transport, { timeout: 120_000 }))
      const pid = transport.pid!
      yield* calculatorChecks(client)
      yield* Effect.promise(() => client.close())
      const exited = (() => {
        try {
          process.kill(pid, 0)
          return false
        } catch {
          return true
        }
      })()
      assert.isTrue(exited, `the server process ${pid} exited when its stdin closed; stderr: ${stderr}`)
    }))
})
