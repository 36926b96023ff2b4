/**
 * The gateway with the real `openai` SDK against a scripted token sampler (byte tokenizer, qwen2.5 template): tool
 * calls and parallel tool calls, plain and streamed, recorded token-in / token-out (the policy spans are exactly the
 * sampled ids, the tool results are `tool` spans, the loss mask is the policy's tokens); a history rewrite starts a
 * new segment; parallel requests become linked threads; malformed requests get OpenAI-style 4xx bodies and the
 * gateway keeps serving (every field OpenAI documents is accepted, an unknown one or a value out of range is a 400
 * naming it); in serving mode a refused request leaves nothing behind; an episode closed mid-request answers 410,
 * interrupts the sampler and is freed.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Scope } from "effect"
import { Exit } from "effect"
import OpenAI from "openai"
import * as Gateway from "../../../actors/Gateway.ts"
import * as Recorder from "../../../actors/gateway/Recorder.ts"
import * as Sampler from "../../../src/Sampler.ts"
import * as Trajectory from "../../../src/Trajectory.ts"
import { everyChatField, everyCompletionField, refused } from "../fixtures/openAiRequests.ts"
import { calculatorTool, evaluate, format, scriptedSampler, tokenizer, turn } from "./fixtures.ts"

const sampling = { temperature: 1, maxTokens: 256 }

const setup = (sampler: Sampler.Sampler["Service"]) =>
  Effect.gen(function*() {
    const gateway = yield* Gateway.make()
    const open = (id: string, extra: Partial<Recorder.Config> = {}) =>
      gateway.open({ id, groupId: "g", format, sampler, sampling, requestSampling: "cap", ...extra })
    return { gateway, open }
  })

const client = (baseURL: string) => new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 })

type Msg = OpenAI.Chat.Completions.ChatCompletionMessageParam

/** The openai SDK's tool loop: call the model, run its tool calls, repeat until it answers. */
const toolLoop = async (openai: OpenAI, question: string, stream: boolean) => {
  const messages: Array<Msg> = [
    { role: "system", content: "Use the calculator tool." },
    { role: "user", content: question }
  ]
  for (let step = 0; step < 4; step++) {
    let message: OpenAI.Chat.Completions.ChatCompletionMessage
    if (stream) {
      const runner = openai.chat.completions.stream({ model: "any", messages, tools: [calculatorTool] })
      message = (await runner.finalChatCompletion()).choices[0]!.message
    } else {
      message = (await openai.chat.completions.create({ model: "any", messages, tools: [calculatorTool] })).choices[0]!
        .message
    }
    messages.push(message)
    const calls = message.tool_calls ?? []
    if (calls.length === 0) return { answer: message.content, messages }
    for (const c of calls) {
      if (c.type !== "function") continue
      const { expression } = JSON.parse(c.function.arguments) as { expression: string }
      messages.push({ role: "tool", tool_call_id: c.id, content: evaluate(expression) })
    }
  }
  return { answer: null, messages }
}

const spansOf = (t: Trajectory.Trajectory) => t.segments.flatMap((s) => s.spans)

describe("Gateway", () => {
  it.live("openai SDK tool calls, plain and streamed: policy spans are the sampled ids, tool results are masked", () =>
    Effect.gen(function*() {
      const { open } = yield* setup(yield* scriptedSampler(3))
      for (const stream of [false, true]) {
        const episode = yield* open(stream ? "streamed" : "plain")
        const { answer, messages } = yield* Effect.promise(() =>
          toolLoop(client(episode.baseURL), "What is 17*23?", stream)
        )
        assert.strictEqual(answer, "The answer is 391.")
        const call = (messages[2] as OpenAI.Chat.Completions.ChatCompletionMessage).tool_calls![0]!
        assert.strictEqual(call.id, "call_0")
        assert.deepStrictEqual(JSON.parse((call as { function: { arguments: string } }).function.arguments), {
          expression: "17*23"
        })

        const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
        assert.strictEqual(t.segments.length, 1)
        assert.strictEqual(t.termination, "no_tool_call")
        assert.strictEqual(t.metrics["gateway/threads"], 1)
        assert.strictEqual(t.metrics["turns"], 2)
        const policy = spansOf(t).filter((s) => s.source === "policy")
        assert.deepStrictEqual(policy.map((s) => s.tokenIds), [
          turn(`<tool_call>\n{"name":"calculator","arguments":{"expression":"17*23"}}\n</tool_call>`),
          turn("The answer is 391.")
        ])
        assert.isTrue(policy.every((s) => s.policyVersion === 3 && s.logprobs!.length === s.tokenIds.length))
        assert.deepStrictEqual(policy[0]!.logprobs, policy[0]!.tokenIds.map((id, i) => Sampler.scriptedLogprob(id, i)))
        const tool = spansOf(t).filter((s) => s.source === "tool")
        assert.deepStrictEqual(tool.map((s) => tokenizer.decode(s.tokenIds).trim()), ["391"])
        // The loss mask is exactly the policy's tokens; the sequence is the template's render of the conversation.
        const segment = t.segments[0]!
        const mask = Trajectory.lossMask(segment)
        assert.strictEqual(mask.reduce((a, b) => a + b, 0), policy.reduce((n, s) => n + s.tokenIds.length, 0))
        const text = tokenizer.decode(Trajectory.tokenIds(segment))
        assert.include(text, "<|im_start|>system\nUse the calculator tool.")
        assert.include(text, "# Tools")
        assert.strictEqual(Trajectory.sources(segment)[0], "prompt")
        // The message view keeps the transcript's own call ids (the tool result is matched back to its call).
        const view = t.messages
        const [asked, answered] = [view[2]!, view[3]!]
        assert.strictEqual(asked.role === "assistant" ? asked.tool_calls?.[0]?.id : undefined, "call_0_0")
        assert.strictEqual(answered.role === "tool" ? answered.tool_call_id : undefined, "call_0_0")
      }
    }))

  it.live("a turn cut by its request's max_tokens ends as stop; one cut by the context budget, context_length", () =>
    Effect.gen(function*() {
      const { open } = yield* setup(yield* scriptedSampler(3))
      const ask = (baseURL: string, maxTokens: number) =>
        Effect.tryPromise(() =>
          client(baseURL).chat.completions.create({
            model: "any",
            messages: [{ role: "user", content: "What is 17*23?" }],
            max_tokens: maxTokens
          })
        ).pipe(Effect.ignore)
      const cut = yield* open("cut")
      yield* ask(cut.baseURL, 2)
      assert.strictEqual((yield* Recorder.trajectory(cut.recorder, { _tag: "Returned" })).termination, "stop")
      const tight = yield* open("tight", { maxContextTokens: 120 })
      yield* ask(tight.baseURL, 256)
      const ended = yield* Recorder.trajectory(tight.recorder, { _tag: "Returned" })
      assert.strictEqual(ended.termination, "context_length")
    }))

  it.live("parallel tool calls: two calls in one turn, unique ids, both results recorded as tool spans", () =>
    Effect.gen(function*() {
      const { open } = yield* setup(yield* scriptedSampler())
      const episode = yield* open("parallel")
      const { answer, messages } = yield* Effect.promise(() =>
        toolLoop(client(episode.baseURL), "Compute both 2+3 and 4*5.", false)
      )
      const calls = (messages[2] as OpenAI.Chat.Completions.ChatCompletionMessage).tool_calls!
      assert.deepStrictEqual(calls.map((c) => c.id), ["call_0", "call_1"])
      assert.strictEqual(answer, "The answer is 20.")
      const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
      assert.deepStrictEqual(
        spansOf(t).filter((s) => s.source === "tool").map((s) => tokenizer.decode(s.tokenIds).trim()),
        ["5", "20"]
      )
      assert.strictEqual(t.metrics["tool_calls"], 2)
      assert.strictEqual(t.segments.length, 1)
    }))

  it.live(
    "a rewritten history (a summarised exchange) starts a new segment; its sampled tokens stay in the first",
    () =>
      Effect.gen(function*() {
        const { open } = yield* setup(yield* scriptedSampler())
        const episode = yield* open("rewrite")
        const openai = client(episode.baseURL)
        const { messages } = yield* Effect.promise(() => toolLoop(openai, "What is 6*7?", false))
        // The agent summarises its first exchange into a user note and asks again.
        const summarised: Array<Msg> = [
          messages[0]!,
          messages[1]!,
          { role: "user", content: "Earlier you found 42. What is 8*9?" }
        ]
        const next = yield* Effect.promise(() =>
          openai.chat.completions.create({ model: "any", messages: summarised, tools: [calculatorTool] })
        )
        assert.strictEqual(next.choices[0]!.finish_reason, "tool_calls")
        const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
        assert.strictEqual(t.segments.length, 2)
        assert.strictEqual(t.metrics["gateway/rewrites"], 1)
        assert.strictEqual(t.metrics["gateway/threads"], 1)
        const [first, second] = t.segments
        assert.strictEqual(first!.spans.filter((s) => s.source === "policy").length, 2)
        // The new segment's history is all prompt; only the new turn is the policy's.
        const sources = second!.spans.map((s) => s.source)
        assert.deepStrictEqual(sources, ["prompt", "policy"])
        assert.include(tokenizer.decode(second!.spans[0]!.tokenIds), "Earlier you found 42.")
      })
  )

  it.live(
    "parallel requests of one episode (sub-agents) become linked threads, merged into the episode's trajectory",
    () =>
      Effect.gen(function*() {
        const gate = yield* Deferred.make<void>()
        let waiting = 0
        const base = yield* scriptedSampler()
        // Both first requests are held until both arrived, so they are truly concurrent.
        const sampler = Sampler.Sampler.of({
          ...base,
          generate: (request) =>
            Effect.gen(function*() {
              if (++waiting === 2) yield* Deferred.succeed(gate, undefined)
              yield* Deferred.await(gate)
              return yield* base.generate(request)
            })
        })
        const { open } = yield* setup(sampler)
        const episode = yield* open("subagents")
        const openai = client(episode.baseURL)
        const results = yield* Effect.promise(() =>
          Promise.all([toolLoop(openai, "What is 1+1?", false), toolLoop(openai, "What is 1+1?", true)])
        )
        assert.deepStrictEqual(results.map((r) => r.answer), ["The answer is 2.", "The answer is 2."])
        const threads = Recorder.threads(episode.recorder)
        assert.strictEqual(threads.length, 2)
        assert.strictEqual(threads[1]!.parent, 0, "the second thread is linked to the one it ran beside")
        const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
        assert.strictEqual(t.segments.length, 2)
        assert.strictEqual(t.metrics["turns"], 4)
      })
  )

  it.live("malformed requests get OpenAI-style 4xx bodies naming the field; the gateway keeps serving", () =>
    Effect.gen(function*() {
      const { gateway, open } = yield* setup(yield* scriptedSampler())
      const episode = yield* open("bad", { maxContextTokens: 1500 })
      const send = (path: string, body: string, method = "POST") =>
        Effect.promise(async () => {
          const r = await fetch(`${gateway.url}${path}`, {
            method,
            headers: { "content-type": "application/json" },
            ...(method === "GET" ? {} : { body })
          })
          return {
            status: r.status,
            json: (await r.json()) as { error?: { type: string; param: string | null; code: string | null } }
          }
        })
      const chat = "/episodes/bad/v1/chat/completions"
      const user = `{"role":"user","content":"What is 1+1?"}`
      const cases: Array<readonly [string, string, string, number, string | null]> = [
        [chat, "{not json", "POST", 400, null],
        [chat, `[1, 2]`, "POST", 400, null],
        [chat, `{"messages": []}`, "POST", 400, "messages"],
        [chat, `{"messages": [{"role": "wizard", "content": "hi"}]}`, "POST", 400, "messages[0].role"],
        [chat, `{"messages": [{"role": "tool", "content": "5"}]}`, "POST", 400, "messages[0].tool_call_id"],
        [chat, `{"messages": [${user}], "temperature": "hot"}`, "POST", 400, "temperature"],
        [chat, `{"messages": [${user}], "n": 2}`, "POST", 400, "n"],
        [chat, `{"messages": [${user}], "stop": ["\\n"]}`, "POST", 400, "stop"],
        [chat, `{"messages": [${user}], "tools": [{"type": "function"}]}`, "POST", 400, "tools[0]"],
        [chat, `{"messages": [{"role": "user", "content": "${"x".repeat(2000)}"}]}`, "POST", 400, "messages"],
        [chat, `{}`, "GET", 405, null],
        ["/episodes/nobody/v1/chat/completions", `{"messages": [${user}]}`, "POST", 404, null],
        ["/v1/chat/completions", `{"messages": [${user}]}`, "POST", 400, null],
        ["/v1/nothing", `{}`, "POST", 404, null],
        ["/episodes/bad/reward", `{"reward": "high"}`, "POST", 400, "reward"],
        ["/episodes/bad/v1/completions", `{"prompt": "hi"}`, "POST", 501, null]
      ]
      for (const [path, body, method, status, param] of cases) {
        const r = yield* send(path, body, method)
        assert.strictEqual(r.status, status, `${method} ${path} ${body.slice(0, 60)}: ${JSON.stringify(r.json)}`)
        assert.strictEqual(r.json.error?.param ?? null, param, `${path} ${body.slice(0, 60)}`)
        assert.isString(r.json.error?.type)
      }
      assert.strictEqual(
        (yield* send(chat, `{"messages": [{"role": "user", "content": "${"x".repeat(2000)}"}]}`)).json.error?.code,
        "context_length_exceeded"
      )
      const big = yield* Effect.promise(() =>
        fetch(`${gateway.url}${chat}`, { method: "POST", body: "x".repeat(17 * 1024 * 1024) }).then((r) => r.status)
      )
      assert.strictEqual(big, 413)
      // Still serving, on the same episode (a header names it on the plain path too).
      const ok = yield* Effect.promise(() =>
        new OpenAI({
          baseURL: `${gateway.url}/v1`,
          apiKey: "x",
          maxRetries: 0,
          defaultHeaders: { "x-agentfly-episode": "bad" }
        })
          .chat.completions.create({
            model: "any",
            messages: [{ role: "user", content: "What is 2+2?" }],
            tools: [calculatorTool]
          })
      )
      assert.strictEqual(ok.choices[0]!.finish_reason, "tool_calls")
      assert.deepStrictEqual((yield* send("/v1/models", "", "GET")).status, 200)
      const posted = yield* send("/episodes/bad/reward", `{"reward": 0.5, "metrics": {"acc": 1}}`)
      assert.strictEqual(posted.status, 200)
      assert.deepStrictEqual(episode.posted(), { reward: 0.5, metrics: { acc: 1 } })
      // Refused requests left nothing behind: the one thread is the header request's.
      assert.strictEqual(Recorder.threads(episode.recorder).length, 1)
    }))

  it.live(
    "every field OpenAI documents is accepted (openai SDK); " +
      "an unknown field or a value out of OpenAI's range is a 400 naming it",
    () =>
      Effect.gen(function*() {
        const { open } = yield* setup(yield* scriptedSampler())
        const episode = yield* open("fields", { tokenizer })
        const openai = client(episode.baseURL)
        const question: Msg = { role: "user", content: "What is 2+2?" }
        const chat = yield* Effect.promise(() =>
          openai.chat.completions.create(everyChatField([question], [calculatorTool], 64))
        )
        assert.strictEqual(chat.choices[0]!.finish_reason, "tool_calls")
        const text = yield* Effect.promise(() => openai.completions.create(everyCompletionField("Once upon", 4)))
        assert.strictEqual(text.choices[0]!.finish_reason, "length")
        const base = {
          chat: { messages: [{ role: "user", content: "What is 1+1?" }] },
          completion: { prompt: "Once upon" }
        }
        for (const r of refused) {
          const path = r.endpoint === "chat" ? "chat/completions" : "completions"
          const answer = yield* Effect.promise(async () => {
            const response = await fetch(`${episode.baseURL}/${path}`, {
              method: "POST",
              headers: { "content-type": "application/json" },
              body: JSON.stringify({ ...base[r.endpoint], ...r.fields })
            })
            return { status: response.status, json: (await response.json()) as { error: unknown } }
          })
          const label = `${path} ${JSON.stringify(r.fields)}`
          assert.strictEqual(answer.status, 400, label)
          assert.deepStrictEqual(answer.json.error, {
            message: r.message,
            type: "invalid_request_error",
            param: r.param,
            code: r.code
          }, label)
        }
        // The refused requests left nothing behind: the two threads and requests are the SDK's.
        assert.strictEqual(episode.recorder.requests, 2)
        assert.strictEqual(Recorder.threads(episode.recorder).length, 2)
      })
  )

  it.live(
    "serving mode: a refused request records nothing; an episode with only refused requests is never written",
    () =>
      Effect.gen(function*() {
        const finished: Array<Gateway.Finished> = []
        const gateway = yield* Gateway.make({
          autoOpen: {
            episode: {
              format,
              sampler: yield* scriptedSampler(),
              sampling,
              requestSampling: "honour",
              maxContextTokens: 400,
              renderTools: false
            },
            idleTimeout: "300 millis",
            onEnd: (f) => Effect.sync(() => void finished.push(f))
          }
        })
        const post = (path: string, body: unknown) =>
          Effect.promise(async () => {
            const r = await fetch(`${gateway.url}${path}`, { method: "POST", body: JSON.stringify(body) })
            const json = (await r.json()) as { error?: { param: string | null; code: string | null } }
            return { status: r.status, json }
          })
        const question: Msg = { role: "user", content: "What is 1+1?" }
        const long = yield* post("/episodes/long/v1/chat/completions", {
          messages: [{ role: "user", content: "x".repeat(500) }]
        })
        assert.deepStrictEqual(
          [long.status, long.json.error?.code, long.json.error?.param],
          [400, "context_length_exceeded", "messages"]
        )
        const hot = yield* post("/episodes/hot/v1/chat/completions", { messages: [question], temperature: 5 })
        assert.deepStrictEqual([hot.status, hot.json.error?.param], [400, "temperature"])
        // A tool loop whose second request (a long tool result) is refused for the context, then retried shorter.
        const openai = client(`${gateway.url}/episodes/kept/v1`)
        const messages: Array<Msg> = [question]
        const first = (yield* Effect.promise(() =>
          openai.chat.completions.create({ model: "any", messages, tools: [calculatorTool] })
        )).choices[0]!.message
        const call = first.tool_calls![0]!
        messages.push(first)
        const refusedStatus = yield* Effect.promise(() =>
          openai.chat.completions.create({
            model: "any",
            messages: [...messages, { role: "tool", tool_call_id: call.id, content: "x".repeat(600) }],
            tools: [calculatorTool]
          }).then(() => 200, (e: { status?: number }) => e.status ?? -1)
        )
        assert.strictEqual(refusedStatus, 400)
        const answer = yield* Effect.promise(() =>
          openai.chat.completions.create({
            model: "any",
            messages: [...messages, { role: "tool", tool_call_id: call.id, content: "2" }],
            tools: [calculatorTool]
          })
        )
        assert.strictEqual(answer.choices[0]!.message.content, "The answer is 2.")
        assert.strictEqual((yield* post("/episodes/kept/reward", { reward: 1 })).status, 200)
        yield* Effect.sleep("1 second") // past the idle timeout of the episodes that were only refused
        assert.deepStrictEqual(
          finished.map((f) => f.trajectory.chainId),
          ["kept"],
          "the refused-only episodes: not written"
        )
        const kept = finished[0]!.trajectory
        // The retry continued the thread as if the refused request had never come: one segment, no trace of it.
        assert.strictEqual(kept.segments.length, 1)
        const sources = kept.segments[0]!.spans.map((span) => span.source)
        assert.deepStrictEqual(sources, ["prompt", "policy", "template", "tool", "template", "policy"])
        assert.notInclude(tokenizer.decode(Trajectory.tokenIds(kept.segments[0]!)), "xxxx")
        const { metrics, termination } = kept
        assert.deepStrictEqual(
          [metrics["gateway/requests"], metrics["gateway/rewrites"], termination],
          [2, 0, "no_tool_call"]
        )
        // The refused episodes' ids were never written under: free for a new episode.
        const again = yield* post("/episodes/long/v1/chat/completions", { messages: [question] })
        assert.strictEqual(again.status, 200)
      })
  )

  it.live(
    "an episode closed while its request runs: the client gets 410, the sampler is interrupted, nothing leaks",
    () =>
      Effect.gen(function*() {
        const started = yield* Deferred.make<void>()
        const interrupted = yield* Deferred.make<void>()
        const sampler = Sampler.Sampler.of({
          generate: () =>
            Deferred.succeed(started, undefined).pipe(
              Effect.andThen(Effect.never),
              Effect.onInterrupt(() => Deferred.succeed(interrupted, undefined))
            ),
          policyVersion: Effect.succeed(0)
        })
        const { gateway, open } = yield* setup(sampler)
        const scope = yield* Scope.make()
        const episode = yield* open("abandoned").pipe(Scope.provide(scope))
        const request = client(episode.baseURL).chat.completions.create({
          model: "any",
          messages: [{ role: "user", content: "What is 1+1?" }]
        }).then(() => 200, (e: { status?: number }) => e.status ?? -1)
        yield* Deferred.await(started)
        assert.strictEqual((yield* gateway.stats).episodes, 1)
        yield* Scope.close(scope, Exit.void)
        assert.strictEqual(yield* Effect.promise(() => request), 410)
        yield* Deferred.await(interrupted)
        const stats = yield* gateway.stats
        assert.strictEqual(stats.episodes, 0)
        assert.strictEqual(stats.inFlight, 0)
        const again = yield* Effect.promise(() =>
          client(episode.baseURL).chat.completions.create({ model: "any", messages: [{ role: "user", content: "hi" }] })
            .then(() => 200, (e: { status?: number }) => e.status ?? -1)
        )
        assert.strictEqual(again, 404)
        const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Abandoned", message: "closed" })
        assert.isTrue(t.masked)
        assert.strictEqual(t.termination, "interrupted")
      })
  )
})
