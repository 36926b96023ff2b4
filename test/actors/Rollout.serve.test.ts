/**
 * End to end over HTTP: `Rollout.run` → `OpenAiCompatSampler` → the project's own
 * OpenAI-compatible server (`agentfly serve`'s `OpenAiServer`) on a loopback port, for a tiny model folder. The
 * server's engine is scripted (it writes a tool call, then an answer) so that the trajectory can be checked token by
 * token; everything between the chain and the engine is the real code.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, Layer, Stream } from "effect"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as Rollout from "../../actors/Rollout.ts"
import * as ToolActor from "../../actors/ToolActor.ts"
import * as OpenAiCompatSampler from "../../src/backends/OpenAiCompatSampler.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import { Add, Answer } from "../utils/arithmeticTools.ts"
import { scriptedEngine as engineFrom } from "../utils/scriptedEngine.ts"

const turns = [
  `<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>`,
  `<tool_call>\n{"name": "answer", "arguments": {"value": 5}}\n</tool_call>`
]

/** An engine that writes `turns[k]` (then `<|im_end|>`) for the k-th assistant turn of the prompt it gets. */
const scriptedEngine = (folder: ModelFolder.ModelFolder, served: { count: number }): PolicyEngine["Service"] => {
  const imEnd = folder.tokenizer.tokenToId("<|im_end|>")!
  return engineFrom(folder, (request: GenerateRequest) =>
    Effect.sync(() => {
      served.count++
      const prompt = folder.tokenizer.decode(request.promptTokenIds)
      const k = prompt.split("<|im_start|>assistant").length - 2
      const ids = [...folder.tokenizer.encode(turns[k] ?? "done"), imEnd]
      const logprobs = ids.map((_, i) => -0.01 * (i + 1))
      return { tokenIds: ids, logprobs, finishReason: "stop" as const, policyVersion: 9 }
    }))
}

describe("Rollout over HTTP against agentfly's own OpenAI-compatible server", () => {
  it.live("token-in/token-out trajectories through the HTTP backend and the server", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-rollout-" })}/tiny-rollout`
      yield* ModelFolder.init(dir, { preset: "tiny", seed: 1 })
      const folder = yield* ModelFolder.load(dir)
      const served = { count: 0 }
      const server = yield* OpenAiServer.make(folder).pipe(
        Effect.provideService(PolicyEngine, scriptedEngine(folder, served))
      )
      const samplerLayer = OpenAiCompatSampler.layer({ baseUrl: server.baseUrl, model: folder.name }).pipe(
        Layer.provide(NodeHttpClient.layerNodeHttp)
      )
      const tools = ToolActor.toPort(yield* ToolActor.make([Add, Answer]))
      const format = ChainFormat.fromTemplate({ tokenizer: folder.tokenizer, template: folder.template })
      const events = yield* Stream.runCollect(Rollout.run({
        rows: [{ messages: [{ role: "user", content: "2+3?" }] }, { messages: [{ role: "user", content: "3+2?" }] }],
        numChains: 3,
        maxTurns: 4,
        sampling: { temperature: 1, maxTokens: 64, seed: 7 },
        format,
        tools
      })).pipe(Effect.provide(samplerLayer))
      const groups = events.flatMap((e) => (e._tag === "Group" ? [e.group] : []))
      assert.strictEqual(groups.length, 2)
      const all = groups.flatMap((g) => g.trajectories)
      assert.strictEqual(all.length, 6)
      const imEnd = folder.tokenizer.tokenToId("<|im_end|>")!
      for (const t of all) {
        assert.strictEqual(t.termination, "answer", t.error)
        assert.isTrue(t.trainable)
        assert.strictEqual(Trajectory.finalResponse(t), "5")
        assert.deepStrictEqual(t.messages.filter((m) => m.role === "tool").map((m) => m.content), ["5", "5"])
        const policy = t.segments[0]!.spans.filter((s) => s.source === "policy")
        assert.deepStrictEqual(policy.map((s) => s.tokenIds), turns.map((x) => [...folder.tokenizer.encode(x), imEnd]))
        for (const span of policy) {
          assert.strictEqual(span.policyVersion, 9)
          assert.deepStrictEqual(span.logprobs, span.tokenIds.map((_, i) => -0.01 * (i + 1)))
        }
      }
      assert.strictEqual(served.count, 12, "6 chains × 2 turns reached the server's engine")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
})
