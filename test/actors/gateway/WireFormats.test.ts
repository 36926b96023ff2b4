/**
 * One episode model for every wire format: the same calculator agent written against chat completions (`openai`),
 * the Responses API (`openai`'s `responses`) and Anthropic's Messages API (`@anthropic-ai/sdk`), rolled out through
 * the gateway with the same seeds, records the same token ids, loss masks, sources, logprobs and policy versions as
 * the native rollout path (`Rollout.runTask`); a history rewrite starts the same new segment whatever the format;
 * rewards and ends are by episode id, whatever format the episode spoke.
 */
import Anthropic from "@anthropic-ai/sdk"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Schema, Stream } from "effect"
import OpenAI from "openai"
import * as AgentRollout from "../../../actors/gateway/AgentRollout.ts"
import * as Gateway from "../../../actors/Gateway.ts"
import * as Recorder from "../../../actors/gateway/Recorder.ts"
import * as Rollout from "../../../actors/Rollout.ts"
import * as ToolActor from "../../../actors/ToolActor.ts"
import * as Calculator from "../../../environments/calculator/Calculator.ts"
import * as AgentTask from "../../../src/AgentTask.ts"
import type * as Message from "../../../src/Message.ts"
import * as Sampler from "../../../src/Sampler.ts"
import type { SamplingParams } from "../../../src/Sampler.ts"
import * as Task from "../../../src/Task.ts"
import * as Trajectory from "../../../src/Trajectory.ts"
import { format, scriptedSampler } from "./fixtures.ts"

type Wire = "chat" | "responses" | "messages"
type Call = Message.ToolCall
/** One model call in a format: the conversation so far (chat shape) in, the answer's text and calls out. */
type Ask = (messages: ReadonlyArray<Message.Message>) => Promise<{ text: string; calls: Array<Call> }>

const tools = [Calculator.calculator]

const call = (id: string, name: string, args: unknown): Call => ({
  id,
  type: "function",
  function: { name, arguments: args }
})

/** A client of one wire format over the episode's base URL, speaking whole histories. */
const asker = (wire: Wire, baseURL: string, functionSchemas: ReadonlyArray<ChatSchema>): Ask => {
  const openai = new OpenAI({ baseURL, apiKey: "k", maxRetries: 0 })
  const anthropic = new Anthropic({ baseURL: baseURL.replace(/\/v1$/, ""), apiKey: "k", maxRetries: 0 })
  const system = (ms: ReadonlyArray<Message.Message>) =>
    ms.filter((m) => m.role === "system").map((m) => m.content as string).join("\n")
  const rest = (ms: ReadonlyArray<Message.Message>) => ms.filter((m) => m.role !== "system")
  const argsOf = (c: Call) => JSON.stringify(c.function.arguments)
  switch (wire) {
    case "chat":
      return async (messages) => {
        const reply = await openai.chat.completions.create({
          model: "m",
          messages: messages.map((m) =>
            m.role === "assistant" && m.tool_calls !== undefined
              ? {
                ...m,
                tool_calls: m.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: argsOf(c) } }))
              }
              : m
          ) as Array<OpenAI.Chat.Completions.ChatCompletionMessageParam>,
          tools: functionSchemas.map((s) => ({
            type: "function" as const,
            function: { ...s.function, parameters: { ...s.function.parameters } }
          }))
        })
        const message = reply.choices[0]!.message
        return {
          text: message.content ?? "",
          calls: (message.tool_calls ?? []).flatMap((c) =>
            c.type === "function"
              ? [call(c.id, c.function.name, JSON.parse(c.function.arguments))]
              : []
          )
        }
      }
    case "responses":
      return async (messages) => {
        type Item = OpenAI.Responses.ResponseInputItem
        const input: Array<Item> = rest(messages).flatMap((m): Array<Item> =>
          m.role === "tool"
            ? [{ type: "function_call_output", call_id: m.tool_call_id, output: m.content as string }]
            : m.role === "assistant"
            ? [
              ...(m.content === "" ? [] : [{ role: "assistant" as const, content: m.content as string }]),
              ...(m.tool_calls ?? []).map((c) => ({
                type: "function_call" as const,
                call_id: c.id,
                name: c.function.name,
                arguments: argsOf(c)
              }))
            ]
            : [{ role: m.role as "user", content: m.content as string }]
        )
        const response = await openai.responses.create({
          model: "m",
          instructions: system(messages),
          input,
          tools: functionSchemas.map((s) => ({
            type: "function" as const,
            strict: false,
            name: s.function.name,
            ...(s.function.description === undefined ? {} : { description: s.function.description }),
            parameters: { ...s.function.parameters }
          }))
        })
        return {
          text: response.output_text,
          calls: response.output.flatMap((o) =>
            o.type === "function_call"
              ? [call(o.call_id, o.name, JSON.parse(o.arguments))]
              : []
          )
        }
      }
    case "messages":
      return async (messages) => {
        const ms: Array<Anthropic.MessageParam> = []
        for (const m of rest(messages)) {
          if (m.role === "tool") {
            const block = { type: "tool_result" as const, tool_use_id: m.tool_call_id, content: m.content as string }
            const last = ms.at(-1)
            if (last?.role === "user" && Array.isArray(last.content)) last.content.push(block)
            else ms.push({ role: "user", content: [block] })
          } else if (m.role === "assistant") {
            ms.push({
              role: "assistant",
              content: [
                ...(m.content === "" ? [] : [{ type: "text" as const, text: m.content as string }]),
                ...(m.tool_calls ?? []).map((c) => ({
                  type: "tool_use" as const,
                  id: c.id,
                  name: c.function.name,
                  input: c.function.arguments
                }))
              ]
            })
          } else ms.push({ role: "user", content: m.content as string })
        }
        const reply = await anthropic.messages.create({
          model: "m",
          max_tokens: 1024,
          system: system(messages),
          messages: ms,
          tools: functionSchemas.map((s) => ({
            name: s.function.name,
            ...(s.function.description === undefined ? {} : { description: s.function.description }),
            input_schema: s.function.parameters as Anthropic.Tool.InputSchema
          }))
        })
        return {
          text: reply.content.map((b) => (b.type === "text" ? b.text : "")).join(""),
          calls: reply.content.flatMap((b) =>
            b.type === "tool_use" ? [call(b.id, b.name, b.input)] : []
          )
        }
      }
  }
}

interface ChatSchema {
  readonly function: {
    readonly name: string
    readonly description?: string
    readonly parameters: { readonly [key: string]: unknown }
  }
}

type Trajectories = ReadonlyArray<Trajectory.Trajectory>

const assertSame = (label: string, a: Trajectories, b: Trajectories) => {
  assert.deepStrictEqual(b.map((t) => t.chainId), a.map((t) => t.chainId), label)
  a.forEach((ta, i) => {
    const tb = b[i]!
    assert.strictEqual(tb.segments.length, ta.segments.length, `${label} ${ta.chainId} segments`)
    ta.segments.forEach((sa, j) => {
      const sb = tb.segments[j]!
      assert.deepStrictEqual([...Trajectory.tokenIds(sb)], [...Trajectory.tokenIds(sa)], `${label} ${ta.chainId} ids`)
      assert.deepStrictEqual([...Trajectory.lossMask(sb)], [...Trajectory.lossMask(sa)], `${label} mask`)
      assert.deepStrictEqual(Trajectory.sources(sb), Trajectory.sources(sa), `${label} sources`)
      assert.deepStrictEqual([...Trajectory.logprobs(sb)].map(String), [...Trajectory.logprobs(sa)].map(String))
      assert.deepStrictEqual(sb.spans.map((s) => s.policyVersion), sa.spans.map((s) => s.policyVersion))
    })
  })
}

const byChain = (ts: ReadonlyArray<Trajectory.Trajectory>) => [...ts].sort((a, b) => (a.chainId < b.chainId ? -1 : 1))

describe("one episode model for every wire format", () => {
  it.live("chat completions, Responses and Messages record what the native rollout path records, token for token", () =>
    Effect.gen(function*() {
      const rows = [
        { question: "What is 17*23?", answer: "391" },
        { question: "Compute both 2+3 and 4*5.", answer: "20" }
      ]
      const sampling: SamplingParams = { temperature: 1, maxTokens: 256, seed: 5 }
      const native = byChain((yield* Rollout.runTask({
        task: Task.make("calc", { row: Schema.Struct({ answer: Schema.String }), tools }),
        rows,
        numChains: 2,
        maxTurns: 4,
        sampling,
        format,
        systemPrompt: "Use the calculator tool.",
        runId: "w"
      }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, yield* scriptedSampler(4))))
        .flatMap((e) => (e._tag === "Trajectory" ? [e.trajectory] : [])))
      assert.deepStrictEqual(native.map((t) => t.metrics["tool_calls"]), [1, 1, 2, 2])

      const actor = yield* ToolActor.make(tools)
      const port = ToolActor.toPort(actor)
      for (const wire of ["chat", "responses", "messages"] as const) {
        const task = AgentTask.make("calc", {
          agent: async (input, client) => {
            const ask = asker(wire, client.baseURL, actor.functionSchemas as ReadonlyArray<ChatSchema>)
            const messages: Array<Message.Message> = [...input.messages]
            for (let turn = 0; turn < 4; turn++) {
              const { text, calls } = await ask(messages)
              messages.push({ role: "assistant", content: text, ...(calls.length > 0 ? { tool_calls: calls } : {}) })
              if (calls.length === 0) return 1
              const result = await Effect.runPromise(port.executeTurn(calls, Context.empty()))
              messages.push(...result.messages)
            }
            return 0
          }
        })
        const viaGateway = byChain((yield* AgentRollout.runTask({
          task,
          rows,
          numChains: 2,
          sampling,
          format,
          systemPrompt: "Use the calculator tool.",
          runId: "w"
        }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, yield* scriptedSampler(4))))
          .flatMap((g) => g.trajectories))
        const errors = viaGateway.map((t) => t.error)
        assert.isTrue(viaGateway.every((t) => !t.masked && t.reward === 1), `${wire}: ${errors}`)
        assertSame(wire, native, viaGateway)
        assert.deepStrictEqual(viaGateway.map((t) => t.metrics["tool_calls"]), [1, 1, 2, 2], wire)
      }
    }))

  it.live("a history rewrite starts the same new segment in every format", () =>
    Effect.gen(function*() {
      const gateway = yield* Gateway.make()
      const sampler = yield* scriptedSampler(4)
      const functionSchemas = (yield* ToolActor.make(tools)).functionSchemas as ReadonlyArray<ChatSchema>
      const records: Array<ReturnType<typeof recordOf>> = []
      for (const wire of ["chat", "responses", "messages"] as const) {
        const episode = yield* gateway.open({
          id: `rewrite-${wire}`,
          groupId: "g",
          format,
          sampler,
          sampling: { temperature: 1, maxTokens: 256 },
          requestSampling: "cap"
        })
        const ask = asker(wire, episode.baseURL, functionSchemas)
        yield* Effect.promise(async () => {
          const start: Array<Message.Message> = [
            { role: "system", content: "Use the calculator tool." },
            { role: "user", content: "What is 6*7?" }
          ]
          const first = await ask(start)
          // The agent rewrites its history: the call is summarised as a user turn and the question asked again.
          await ask([...start, { role: "user", content: `(the calculator said 42 for ${first.calls.length} call)` }, {
            role: "user",
            content: "What is 6*7?"
          }])
        })
        const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
        assert.strictEqual(t.metrics["gateway/rewrites"], 1, wire)
        records.push(recordOf(t))
      }
      assert.strictEqual(records[0]!.length, 2, "two segments: before and after the rewrite")
      assert.deepStrictEqual(records[1], records[0], "Responses: the chat record")
      assert.deepStrictEqual(records[2], records[0], "Messages: the chat record")
    }))

  it.live("rewards and ends by episode id, whatever the format; a never-opened id is a 404 naming it", () =>
    Effect.gen(function*() {
      const ended: Array<Trajectory.Trajectory> = []
      const gateway = yield* Gateway.make({
        autoOpen: {
          episode: {
            format,
            sampler: yield* scriptedSampler(4),
            sampling: { temperature: 1, maxTokens: 64 },
            requestSampling: "honour"
          },
          onEnd: (finished) => Effect.sync(() => void ended.push(finished.trajectory))
        }
      })
      const functionSchemas = (yield* ToolActor.make(tools)).functionSchemas as ReadonlyArray<ChatSchema>
      const post = (path: string, body: unknown) =>
        Effect.promise(() =>
          fetch(`${gateway.url}${path}`, { method: "POST", body: JSON.stringify(body) })
            .then(async (r) => ({ status: r.status, text: await r.text() }))
        )
      for (const wire of ["chat", "responses", "messages"] as const) {
        yield* Effect.promise(() =>
          asker(wire, `${gateway.url}/episodes/by-id-${wire}/v1`, functionSchemas)([{ role: "user", content: "Hello" }])
        )
        const done = wire === "messages"
          ? yield* post(`/episodes/by-id-${wire}/end`, {})
          : yield* post(`/episodes/by-id-${wire}/reward`, { reward: wire === "chat" ? 0.25 : 0.75 })
        assert.strictEqual(done.status, 200, done.text)
      }
      for (const route of ["reward", "end"]) {
        const never = yield* post(`/episodes/never-opened/${route}`, { reward: 1 })
        assert.strictEqual(never.status, 404, route)
        assert.include(never.text, "no open episode \\\"never-opened\\\"")
      }
      yield* Effect.sleep(50)
      const byId = new Map(ended.map((t) => [t.trajectoryId, t]))
      assert.deepStrictEqual([...byId.keys()].sort(), ["by-id-chat", "by-id-messages", "by-id-responses"])
      assert.strictEqual(byId.get("by-id-chat")!.reward, 0.25)
      assert.strictEqual(byId.get("by-id-responses")!.reward, 0.75)
      assert.strictEqual(byId.get("by-id-responses")!.rewardStatus, "scored")
      // Ended without a reward: not scored, and not pending either.
      assert.strictEqual(byId.get("by-id-messages")!.rewardStatus, "not_applicable")
      assert.isTrue([...byId.values()].every((t) => t.segments.length === 1 && t.metrics["turns"] === 1))
      assert.strictEqual((yield* gateway.stats).episodes, 0, "a never-opened id opened nothing")
    }))
})

const recordOf = (t: Trajectory.Trajectory) =>
  t.segments.map((s) => ({
    ids: [...Trajectory.tokenIds(s)],
    mask: [...Trajectory.lossMask(s)],
    sources: Trajectory.sources(s)
  }))
