/**
 * Parity: the same agent rolled out through the gateway (an `openai`-SDK agent function) and through
 * `Rollout.runTask` (the chain loop), with the same seeds, gives the same token ids, the same loss masks and sources,
 * and the same logprobs (to float32 rounding) and policy versions:
 * - on the real engine (tiny Qwen2 policy on onnxruntime, seeded sampling), episodes of up to three turns whose
 *   environment speaks between turns (`env` spans) and ends them, some cut short by max tokens;
 * - with the calculator tool (its results from the same `ToolActor` both ways), single and parallel tool calls.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Schema, Stream } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import OpenAI from "openai"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as AgentRollout from "../../../actors/gateway/AgentRollout.ts"
import * as PolicyEngine from "../../../actors/PolicyEngine.ts"
import * as Rollout from "../../../actors/Rollout.ts"
import type * as ToolActorModule from "../../../actors/ToolActor.ts"
import * as ToolActor from "../../../actors/ToolActor.ts"
import * as Calculator from "../../../environments/calculator/Calculator.ts"
import * as AgentTask from "../../../src/AgentTask.ts"
import * as ModelFolder from "../../../src/ModelFolder.ts"
import * as Sampler from "../../../src/Sampler.ts"
import type { SamplingParams } from "../../../src/Sampler.ts"
import * as Task from "../../../src/Task.ts"
import * as Trajectory from "../../../src/Trajectory.ts"
import { format as byteFormat, scriptedSampler } from "./fixtures.ts"

type Msg = OpenAI.Chat.Completions.ChatCompletionMessageParam

/** Compares two runs' trajectories chain by chain. */
const assertSame = (
  viaChain: ReadonlyArray<Trajectory.Trajectory>,
  viaGateway: ReadonlyArray<Trajectory.Trajectory>
) => {
  assert.deepStrictEqual(viaGateway.map((t) => t.chainId), viaChain.map((t) => t.chainId))
  viaChain.forEach((a, i) => {
    const b = viaGateway[i]!
    assert.strictEqual(b.segments.length, a.segments.length, a.chainId)
    a.segments.forEach((sa, j) => {
      const sb = b.segments[j]!
      assert.deepStrictEqual(
        [...Trajectory.tokenIds(sb)],
        [...Trajectory.tokenIds(sa)],
        `${a.chainId} segment ${j} ids`
      )
      assert.deepStrictEqual([...Trajectory.lossMask(sb)], [...Trajectory.lossMask(sa)], `${a.chainId} mask`)
      assert.deepStrictEqual(Trajectory.sources(sb), Trajectory.sources(sa), `${a.chainId} sources`)
      const la = Trajectory.logprobs(sa)
      const lb = Trajectory.logprobs(sb)
      la.forEach((x, k) => (Number.isNaN(x) ? assert.isNaN(lb[k]) : assert.closeTo(lb[k]!, x, 1e-4)))
      assert.deepStrictEqual(
        sb.spans.map((s) => s.policyVersion),
        sa.spans.map((s) => s.policyVersion)
      )
    })
  })
}

const trajectoriesOf = (events: ReadonlyArray<Rollout.Event>) =>
  events.flatMap((e) => (e._tag === "Trajectory" ? [e.trajectory] : []))
    .sort((a, b) => (a.chainId < b.chainId ? -1 : 1))

describe("gateway parity with Rollout.runTask", () => {
  it.live(
    "the real engine, seeded: episodes whose environment speaks between turns, token for token",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "gateway-parity-"))
        yield* ModelFolder.init(dir, { preset: "tiny", seed: 7 })
        const folder = yield* ModelFolder.load(dir)
        const engine = yield* PolicyEngine.make({ config: folder.config, weights: folder.weights, version: 2 })
        const sampler = Sampler.Sampler.of({ generate: (r) => engine.generate(r), policyVersion: engine.policyVersion })
        // Llama-3 JSON calls: random text from an untrained policy never looks like one (Hermes tags would be
        // sampled now and then, and the chain would feed the parse error back, which an SDK agent does not).
        const format = ChainFormat.fromTemplate({
          tokenizer: folder.tokenizer,
          template: folder.template,
          toolCallFormat: "llama3"
        })
        const rows = [{ question: "Say something." }, { question: "Say something else." }]
        const sampling: SamplingParams = { temperature: 1, maxTokens: 160, seed: 31 }
        const chainTask = Task.make("talk", {
          episode: { step: ({ turn }) => Effect.succeed(turn >= 3 ? { end: "done" } : { messages: ["Try again."] }) },
          defaults: { systemPrompt: "Talk." }
        })
        const viaChain = trajectoriesOf(
          yield* Rollout.runTask({
            task: chainTask,
            rows,
            numChains: 3,
            maxTurns: 5,
            maxContextTokens: 512,
            sampling,
            format,
            runId: "p"
          }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, sampler))
        )

        const agentTask = AgentTask.make("talk", {
          agent: async (input, client) => {
            const openai = new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey, maxRetries: 0 })
            const messages = [...input.messages] as Array<Msg>
            for (let turn = 1; turn <= 3; turn++) {
              const reply = await openai.chat.completions.create({ model: client.model, messages })
              messages.push(reply.choices[0]!.message)
              if (reply.choices[0]!.finish_reason === "length") return 0
              if (turn < 3) messages.push({ role: "user", content: "Try again." })
            }
            return 0
          },
          defaults: { systemPrompt: "Talk." }
        })
        const viaGateway = (yield* AgentRollout.runTask({
          task: agentTask,
          rows,
          numChains: 3,
          maxContextTokens: 512,
          sampling,
          format,
          runId: "p"
        }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, sampler))).flatMap((g) => g.trajectories)

        assertSame(viaChain, viaGateway)
        // The runs did what the test is about: later turns after the environment's words, turns cut by max tokens.
        assert.isTrue(
          viaChain.some((t) => Trajectory.sources(t.segments[0]!).includes("env")),
          viaChain.map((t) => t.termination).join()
        )
        assert.isTrue(viaChain.some((t) => t.termination === "stop"))
        assert.isTrue(
          viaChain.every((t) =>
            t.segments.flatMap((s) => s.spans).every((s) => s.source !== "policy" || s.policyVersion === 2)
          )
        )
        assert.isAbove(
          new Set(viaChain.map((t) => Trajectory.tokenIds(t.segments[0]!).join())).size,
          4,
          "seeds differ per chain"
        )
      }).pipe(Effect.provide(NodeServices.layer)),
    60_000
  )

  it.live("the calculator tool, single and parallel calls: the tool results are the same tool spans", () =>
    Effect.gen(function*() {
      const tools = [Calculator.calculator]
      const rows = [
        { question: "What is 17*23?", answer: "391" },
        { question: "Compute both 2+3 and 4*5.", answer: "20" }
      ]
      const sampling: SamplingParams = { temperature: 1, maxTokens: 256, seed: 5 }
      const chainTask = Task.make("calc", { row: Schema.Struct({ answer: Schema.String }), tools })
      const viaChain = trajectoriesOf(yield* Rollout.runTask({
        task: chainTask,
        rows,
        numChains: 2,
        maxTurns: 4,
        sampling,
        format: byteFormat,
        systemPrompt: "Use the calculator tool.",
        runId: "p"
      }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, yield* scriptedSampler(4))))

      // The agent runs its calls with a ToolActor of the same tools, so the observations are the chain's.
      const actor: ToolActorModule.Service = yield* ToolActor.make(tools)
      const port = ToolActor.toPort(actor)
      const agentTask = AgentTask.make("calc", {
        agent: async (input, client) => {
          const openai = new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey, maxRetries: 0 })
          const messages = [...input.messages] as Array<Msg>
          for (let turn = 0; turn < 4; turn++) {
            const reply = await openai.chat.completions.create({
              model: client.model,
              messages,
              tools: [...actor.functionSchemas]
            })
            const message = reply.choices[0]!.message
            messages.push(message)
            const calls = (message.tool_calls ?? []).flatMap((c) =>
              c.type === "function"
                ? [{
                  id: c.id,
                  type: "function" as const,
                  function: { name: c.function.name, arguments: JSON.parse(c.function.arguments) }
                }]
                : []
            )
            if (calls.length === 0) return 1
            const result = await Effect.runPromise(port.executeTurn(calls, Context.empty()))
            for (const m of result.messages) messages.push(m as Msg)
          }
          return 0
        }
      })
      const viaGateway = (yield* AgentRollout.runTask({
        task: agentTask,
        rows,
        numChains: 2,
        sampling,
        format: byteFormat,
        systemPrompt: "Use the calculator tool.",
        runId: "p"
      }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, yield* scriptedSampler(4)))).flatMap((g) =>
        g.trajectories
      )
      assert.isTrue(viaGateway.every((t) => !t.masked && t.reward === 1), viaGateway.map((t) => t.error).join())
      assertSame(viaChain, viaGateway)
      assert.deepStrictEqual(viaChain.map((t) => t.metrics["tool_calls"]), [1, 1, 2, 2])
      assert.deepStrictEqual(viaGateway.map((t) => t.metrics["tool_calls"]), [1, 1, 2, 2])
    }))
})
