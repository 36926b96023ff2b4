/**
 * The Responses API (`POST /v1/responses`) with the official `openai` SDK's `client.responses` (plain, streamed,
 * chained with `previous_response_id`) and OpenAI Agents JS's `OpenAIResponsesModel`, each unchanged but for the base
 * URL, against the scripted calculator policy: the record is the chat-completions record token for token; bodies and
 * events are typed by the SDK's own definitions; what OpenAI refuses is refused.
 */
import { Agent, OpenAIResponsesModel, run, setTracingDisabled, tool } from "@openai/agents"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import OpenAI from "openai"
import { z } from "zod"
import * as Gateway from "../../../actors/Gateway.ts"
import * as Recorder from "../../../actors/gateway/Recorder.ts"
import * as Responses from "../../../actors/gateway/Responses.ts"
import type * as Bodies from "../../../actors/gateway/Bodies.ts"
import type * as Sampler from "../../../src/Sampler.ts"
import * as Trajectory from "../../../src/Trajectory.ts"
import { calculatorTool, chatLoop, evaluate, format, record, scriptedSampler } from "./fixtures.ts"

setTracingDisabled(true)

const sampling = { temperature: 1, maxTokens: 256 }

const setup = (sampler: Sampler.Sampler["Service"]) =>
  Effect.gen(function*() {
    const gateway = yield* Gateway.make()
    const open = (id: string) =>
      gateway.open({ id, groupId: "g", format, sampler, sampling, requestSampling: "cap" })
    return { gateway, open }
  })

const client = (baseURL: string) => new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 })

const fnTool: OpenAI.Responses.FunctionTool = {
  type: "function",
  name: calculatorTool.function.name,
  description: calculatorTool.function.description,
  parameters: calculatorTool.function.parameters,
  strict: true
}

/** The Responses tool loop: send the whole history back each time (or only the new items, chained by id). */
const responsesLoop = async (openai: OpenAI, question: string, mode: "history" | "stream" | "chained") => {
  const history: Array<OpenAI.Responses.ResponseInputItem> = [{ role: "user", content: question }]
  let input: Array<OpenAI.Responses.ResponseInputItem> = [...history]
  let previous: string | undefined
  for (let step = 0; step < 4; step++) {
    const params = {
      model: "any",
      instructions: "Use the calculator tool.",
      input,
      tools: [fnTool],
      ...(previous === undefined || mode !== "chained" ? {} : { previous_response_id: previous })
    }
    const response = mode === "stream"
      ? await openai.responses.stream(params).finalResponse()
      : await openai.responses.create(params)
    previous = response.id
    const calls = response.output.flatMap((o) =>
      o.type === "function_call" ? [o as OpenAI.Responses.ResponseFunctionToolCall] : []
    )
    if (calls.length === 0) return { answer: response.output_text, response }
    const outputs = calls.map((c): OpenAI.Responses.ResponseInputItem => ({
      type: "function_call_output",
      call_id: c.call_id,
      output: evaluate((JSON.parse(c.arguments) as { expression: string }).expression)
    }))
    history.push(...(response.output as Array<OpenAI.Responses.ResponseInputItem>), ...outputs)
    input = mode === "chained" ? outputs : [...history]
  }
  return { answer: undefined, response: undefined }
}

const turnOf = (over: Partial<Bodies.Turn> = {}): Bodies.Turn => ({
  content: "",
  toolCalls: [{ id: "call_0", type: "function", function: { name: "calculator", arguments: { expression: "1+1" } } }],
  finishReason: "tool_calls",
  tokenIds: [1, 2, 3],
  logprobs: [-1, -1, -1],
  policyVersion: 2,
  promptTokens: 10,
  ...over
})

describe("Gateway: the Responses API", () => {
  it.live("openai SDK responses (whole history, streamed, chained by previous_response_id): the chat record", () =>
    Effect.gen(function*() {
      const { open } = yield* setup(yield* scriptedSampler(3))
      for (const question of ["What is 17*23?", "Compute both 2+3 and 4*5."]) {
        const reference = yield* open(`chat-${question.length}`)
        const expected = yield* Effect.promise(() => chatLoop(client(reference.baseURL), question))
        const want = record(yield* Recorder.trajectory(reference.recorder, { _tag: "Returned" }))
        for (const mode of ["history", "stream", "chained"] as const) {
          const episode = yield* open(`${mode}-${question.length}`)
          const { answer, response } = yield* Effect.promise(() =>
            responsesLoop(client(episode.baseURL), question, mode)
          )
          assert.strictEqual(answer, expected, mode)
          assert.strictEqual(response!.status, "completed")
          assert.isAbove(response!.usage!.output_tokens, 0)
          const usage = response!.usage!
          assert.strictEqual(usage.total_tokens, usage.input_tokens + usage.output_tokens)
          const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
          assert.deepStrictEqual(record(t), want, `${mode}: the same ids, mask and sources as chat completions`)
          assert.strictEqual(t.metrics["gateway/rewrites"], 0, mode)
        }
      }
    }))

  it.live("the stream is the documented event sequence, each event typed by the SDK, numbered in order", () =>
    Effect.gen(function*() {
      const { open } = yield* setup(yield* scriptedSampler(3))
      const episode = yield* open("events")
      const types: Array<string> = []
      const numbers: Array<number> = []
      yield* Effect.promise(async () => {
        const stream = await client(episode.baseURL).responses.create({
          model: "any",
          input: "What is 2+2?",
          tools: [fnTool],
          stream: true
        })
        for await (const event of stream) {
          types.push(event.type)
          numbers.push(event.sequence_number)
        }
      })
      assert.deepStrictEqual(types, [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed"
      ])
      assert.deepStrictEqual(numbers, types.map((_, i) => i))
      // A text answer: its part and text events.
      const answer = Responses.events({
        n: 1,
        createdAt: 0,
        model: "m",
        request: { ...stubRequest, chat: { ...stubRequest.chat, stream: true } },
        turn: turnOf({ content: "Hi.", toolCalls: [], finishReason: "stop" })
      }).map((e) => JSON.parse(e.split("\ndata: ")[1]!) as OpenAI.Responses.ResponseStreamEvent)
      assert.deepStrictEqual(answer.map((e) => e.type), [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed"
      ])
    }))

  it.live("400s: a chain from a store: false response, an output answering no call, a built-in tool, a typo", () =>
    Effect.gen(function*() {
      const { open } = yield* setup(yield* scriptedSampler(3))
      const episode = yield* open("refusals")
      const openai = client(episode.baseURL)
      const status = (params: Record<string, unknown>) =>
        Effect.promise(() =>
          openai.responses.create(
            { model: "any", ...params } as OpenAI.Responses.ResponseCreateParamsNonStreaming
          ).then(
            (r) => ({ status: 200, message: r.id }),
            (e: InstanceType<typeof OpenAI.APIError>) => ({ status: e.status, message: e.message })
          )
        )
      const unstored = yield* status({ input: "What is 1+1?", store: false })
      assert.strictEqual(unstored.status, 200)
      const chained = yield* status({ input: "go on", previous_response_id: unstored.message })
      assert.strictEqual(chained.status, 400)
      assert.include(chained.message, `Previous response with id '${unstored.message}' not found.`)
      const orphan = yield* status({
        input: [{ role: "user", content: "hi" }, { type: "function_call_output", call_id: "call_9", output: "1" }]
      })
      assert.strictEqual(orphan.status, 400)
      assert.include(orphan.message, "No tool call found for function call output with call_id call_9.")
      const builtIn = yield* status({ input: "hi", tools: [{ type: "web_search" }] })
      assert.strictEqual(builtIn.status, 400)
      assert.include(builtIn.message, "\"web_search\" tools are not supported")
      const unknown = yield* status({ input: "hi", temprature: 1 })
      assert.strictEqual(unknown.status, 400)
      assert.include(unknown.message, "temprature (did you mean \"temperature\"?)")
      // The refusals are recorded as the sampler's (the failure table's reason), never a crash of the agent.
      assert.deepStrictEqual(episode.recorder.failures.map((f) => f.reason), [
        "SamplerRejected",
        "SamplerRejected",
        "SamplerRejected",
        "SamplerRejected"
      ])
    }))

  it.live("Agents JS in its Responses mode (OpenAIResponsesModel), plain and streamed, unchanged but the URL", () =>
    Effect.gen(function*() {
      const { open } = yield* setup(yield* scriptedSampler(3))
      for (const stream of [false, true]) {
        const episode = yield* open(`agents-${stream}`)
        const output = yield* Effect.promise(async () => {
          const calculator = tool({
            name: "calculator",
            description: "Evaluate an arithmetic expression",
            parameters: z.object({ expression: z.string() }),
            execute: async ({ expression }) => evaluate(expression)
          })
          const agent = new Agent({
            name: "calc",
            instructions: "Use the calculator tool.",
            tools: [calculator],
            model: new OpenAIResponsesModel(client(episode.baseURL), "any")
          })
          if (!stream) return (await run(agent, "What is 17*23?")).finalOutput
          const streamed = await run(agent, "What is 17*23?", { stream: true })
          await streamed.completed
          return streamed.finalOutput
        })
        assert.strictEqual(output, "The answer is 391.")
        const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
        assert.strictEqual(t.segments.length, 1, "the agent's second request continued its first")
        assert.strictEqual(t.metrics["turns"], 2)
        assert.deepStrictEqual(
          Trajectory.sources(t.segments[0]!).filter((s, i, all) => s !== all[i - 1]),
          ["prompt", "policy", "template", "tool", "template", "policy"]
        )
      }
    }))

  it("the body is the SDK's Response type; the call's id is the episode's, no message item beside calls", () => {
    const body: OpenAI.Responses.Response = Responses.response({
      n: 7,
      createdAt: 5,
      model: "m",
      request: stubRequest,
      turn: turnOf()
    }) as unknown as OpenAI.Responses.Response
    assert.strictEqual(body.id, "resp_7")
    assert.deepStrictEqual(body.output, [{
      type: "function_call",
      id: "fc_7_0",
      call_id: "call_0",
      name: "calculator",
      arguments: "{\"expression\":\"1+1\"}",
      status: "completed"
    }])
    const cut = Responses.response({ n: 1, createdAt: 5, model: "m", request: stubRequest, turn: turnOf({
      content: "partial",
      toolCalls: [],
      finishReason: "length"
    }) })
    assert.strictEqual(cut.status, "incomplete")
    assert.deepStrictEqual(cut.incomplete_details, { reason: "max_output_tokens" })
  })
})

const decoded = Responses.decode({ model: "m", input: "hi" }, () => undefined)
const stubRequest = decoded as Responses.Request

// Compile-time: the bodies are the SDK's types (but for what is echoed as sent, and the items' precise union).
void ((r: ReturnType<typeof Responses.response>) =>
  r satisfies Omit<OpenAI.Responses.Response, "tools" | "tool_choice" | "metadata" | "output">)
