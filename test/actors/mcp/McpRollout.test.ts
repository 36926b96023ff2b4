/**
 * A rollout whose chains use MCP tools end to end, on the tiny preset's tokenizer and chat template: a task made
 * from the reference memory server's tool list (plus the native `answer`), each chain with a server process of its
 * own leased through the resource manager. The policy is scripted (a random tiny model writes no tool calls), so the
 * trajectories can be checked token by token; everything between the sampler and the server is the real code:
 * template rendering, the tool-call parser, the tool actor, the lease, the SDK client, the server process.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, Stream } from "effect"
import { rmSync } from "node:fs"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as McpTools from "../../../actors/McpTools.ts"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as Mcp from "../../../actors/resources/Mcp.ts"
import * as Rollout from "../../../actors/Rollout.ts"
import * as Answer from "../../../environments/answer/Answer.ts"
import * as ModelFolder from "../../../src/ModelFolder.ts"
import * as Sampler from "../../../src/Sampler.ts"
import * as Task from "../../../src/Task.ts"
import * as Trajectory from "../../../src/Trajectory.ts"
import { fileURLToPath } from "node:url"
import * as TaskRuntime from "../../../actors/TaskRuntime.ts"
import * as Tool from "../../../src/Tool.ts"
import { tag as notesTag } from "./fixtures/notesTask.ts"
import { freshTag, gone, memory } from "./fixtures/servers.ts"

describe("a rollout with MCP tools", () => {
  it.live("chains remember through their own memory server and answer; no server outlives the run", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-mcp-rollout-" })
      yield* ModelFolder.init(`${dir}/tiny`, { preset: "tiny", seed: 1 })
      const folder = yield* ModelFolder.load(`${dir}/tiny`)
      const tag = freshTag()
      const server = memory(dir, tag)
      const tools = yield* McpTools.tools(server, { include: ["create_entities", "read_graph"] })
      const task = Task.make("mcp-notes", {
        tools: [...tools, Answer.answer],
        environment: Mcp.provider(server, { pool: { max: 4 } }),
        layer: ResourceManager.ResourceManager.layer,
        defaults: { systemPrompt: "Remember, then answer." }
      })

      // Turn k of a chain: remember the row's name with the chain's seed, read the graph back, answer the name.
      const imEnd = folder.tokenizer.tokenToId("<|im_end|>")!
      const scripted: Array<ReadonlyArray<number>> = []
      const script = (request: Sampler.GenerateRequest) => {
        const prompt = folder.tokenizer.decode(request.promptTokenIds)
        const k = prompt.split("<|im_start|>assistant").length - 2
        const name = /Remember (\w+)/.exec(prompt)![1]!
        const entities = [{ name, entityType: "person", observations: [`seed ${request.sampling.seed}`] }]
        const call = [
          { name: "create_entities", arguments: { entities } },
          { name: "read_graph", arguments: {} },
          { name: "answer", arguments: { answer: name } }
        ][k]!
        const ids = [...folder.tokenizer.encode(`<tool_call>\n${JSON.stringify(call)}\n</tool_call>`), imEnd]
        scripted.push(ids)
        return { tokenIds: ids, logprobs: ids.map(() => -0.5) }
      }

      const events = yield* Stream.runCollect(Rollout.runTask({
        task,
        rows: [{ question: "Remember Ada." }, { question: "Remember Grace." }],
        numChains: 2,
        maxTurns: 4,
        sampling: { temperature: 1, maxTokens: 256, seed: 100 },
        format: ChainFormat.fromTemplate({ tokenizer: folder.tokenizer, template: folder.template }),
        runId: "mcp"
      })).pipe(Effect.provide(Sampler.layerScripted(script)))

      const all = events.flatMap((e) => (e._tag === "Group" ? e.group.trajectories : []))
      assert.lengthOf(all, 4)
      const seeds = new Set<string>()
      for (const t of all) {
        assert.strictEqual(t.termination, "answer", t.error)
        const name = /Remember (\w+)/.exec(String(t.messages.find((m) => m.role === "user")!.content))![1]!
        assert.strictEqual(Trajectory.finalResponse(t), name)
        const [created, graph] = t.messages.filter((m) => m.role === "tool").map((m) => String(m.content))
        assert.include(created!, name)
        // The graph the chain read back is its own: its one entity, its seed, nobody else's.
        const read = JSON.parse(graph!) as { entities: Array<{ name: string; observations: Array<string> }> }
        assert.lengthOf(read.entities, 1, graph)
        assert.strictEqual(read.entities[0]!.name, name)
        assert.lengthOf(read.entities[0]!.observations, 1)
        seeds.add(read.entities[0]!.observations[0]!)
        // Token-in/token-out: the policy spans are the sampled ids; the MCP observations are never trained on.
        const spans = t.segments[0]!.spans
        const policy = spans.filter((s) => s.source === "policy")
        assert.lengthOf(policy, 3)
        for (const span of policy) assert.isTrue(scripted.some((ids) => ids.join() === span.tokenIds.join()))
        assert.isTrue(spans.some((s) => s.source === "tool"))
      }
      assert.deepStrictEqual([...seeds].sort(), ["seed 100", "seed 101", "seed 102", "seed 103"])
      assert.deepStrictEqual(yield* gone(tag), [], "every chain's server ended with the run")
      rmSync(dir, { recursive: true, force: true })
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.live("a task module whose task is read from an MCP server resolves by path, as a config names it", () =>
    Effect.gen(function*() {
      const path = fileURLToPath(new URL("./fixtures/notesTask.ts", import.meta.url))
      const task = yield* Task.resolve(path, { builtins: {}, resolvePath: (p) => p })
      assert.strictEqual(task.name, "notes")
      assert.deepStrictEqual(task.tools.map((t) => t.name), ["create_entities", "read_graph", "answer"])
      assert.strictEqual(Tool.functionSchema(task.tools[0]!).function.parameters.type, "object")
      // The start check leases the environment for a probe chain: one server process, started and ended.
      const runtime = yield* TaskRuntime.make(task)
      const names = runtime.tools.schemas.map((s) => (s as Tool.FunctionSchema).function.name)
      assert.deepStrictEqual(names, ["create_entities", "read_graph", "answer"])
    }).pipe(Effect.scoped, Effect.andThen(Effect.map(gone(notesTag), (left) => assert.deepStrictEqual(left, []))))
  )
})
