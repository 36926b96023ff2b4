import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import OpenAI from "openai"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as OpenAiCompatSampler from "../../src/backends/OpenAiCompatSampler.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import { scriptedEngine } from "../utils/scriptedEngine.ts"

/** A fresh tiny model folder, its engine and a server on a free loopback port. */
const setup = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-serve-" })}/tiny-test`
  yield* ModelFolder.init(dir, { preset: "tiny", seed: 3 })
  const folder = yield* ModelFolder.load(dir)
  const engine = yield* makeEngine({ config: folder.config, weights: folder.weights, version: 4 })
  const server = yield* OpenAiServer.make(folder).pipe(Effect.provideService(PolicyEngine, engine))
  const client = new OpenAI({ baseURL: server.baseUrl, apiKey: "unused", maxRetries: 0 })
  return { folder, engine, server, client }
})

/** A scripted engine that "samples" the given text (then `<|im_end|>`), for deterministic tool-call output. */
const scripted = (folder: ModelFolder.ModelFolder, text: string): PolicyEngine["Service"] => {
  const ids = [...folder.tokenizer.encode(text), folder.tokenizer.tokenToId("<|im_end|>")!]
  return scriptedEngine(folder, (_request: GenerateRequest, options) =>
    Effect.sync(() => {
      ids.forEach((id) => options?.onToken?.(id, -0.25))
      return { tokenIds: ids, logprobs: ids.map(() => -0.25), finishReason: "stop" as const, policyVersion: 9 }
    }))
}

const post = (url: string, body: string, method = "POST") =>
  Effect.promise(async () => {
    const response = await fetch(url, {
      method,
      headers: { "content-type": "application/json" },
      body: method === "GET" ? null : body
    })
    const json = (await response.json()) as { error?: { message: string; type: string; param: string | null } }
    return { status: response.status, json }
  })

const live = Effect.provide(NodeServices.layer)

/** The streamed shapes the tests read (the openai client's types do not know vLLM's extra fields). */
interface TextChoice {
  readonly text: string
  readonly token_ids: Array<number>
  readonly logprobs: { readonly token_logprobs: Array<number> } | null
  readonly finish_reason: string | null
}
interface ChatDelta {
  readonly delta: {
    readonly content?: string | null
    readonly tool_calls?: Array<{ readonly function?: { readonly name?: string; readonly arguments?: string } }>
  }
  readonly finish_reason: string | null
  readonly token_ids?: Array<number>
}

describe("OpenAiServer", () => {
  it.live("the openai client lists the model and gets completions with token ids and logprobs", () =>
    live(Effect.gen(function*() {
      const { folder, engine, client } = yield* setup
      const models = yield* Effect.promise(() => client.models.list())
      assert.deepStrictEqual(models.data.map((m) => m.id), ["tiny-test"])

      const prompt = [10, 20, 30, 40]
      const response = yield* Effect.promise(() =>
        client.completions.create({
          model: "tiny-test",
          prompt,
          max_tokens: 12,
          temperature: 0,
          logprobs: 1,
          // vLLM-style extensions the rollout backend sends
          ...({ return_tokens_as_token_ids: true, ignore_eos: true } as object)
        })
      )
      const choice = response.choices[0]! as typeof response.choices[0] & { token_ids: Array<number> }
      const direct = yield* engine.generate({ promptTokenIds: prompt, sampling: { temperature: 0, maxTokens: 12 } })
      assert.deepStrictEqual(choice.token_ids, direct.tokenIds)
      assert.deepStrictEqual(choice.logprobs!.tokens, direct.tokenIds.map((id) => `token_id:${id}`))
      assert.deepStrictEqual(choice.logprobs!.token_logprobs, direct.logprobs)
      assert.strictEqual(choice.finish_reason, "length")
      // Only `<|…|>` tokens are special (skipped); `<think>`, `<tool_call>` and the like are text, as in Qwen.
      const shown = direct.tokenIds.filter((id) => folder.tokenizer.idToToken(id)?.startsWith("<|") === false)
      assert.strictEqual(choice.text, folder.tokenizer.decode(shown))
      assert.strictEqual((response as unknown as { policy_version: number }).policy_version, 4)
      assert.deepStrictEqual(response.usage, { prompt_tokens: 4, completion_tokens: 12, total_tokens: 16 })

      // Streamed: one event per sampled token, the same ids, logprobs and text as the plain response.
      const events = yield* Effect.promise(async () => {
        const stream = await client.completions.create({
          model: "tiny-test",
          prompt,
          max_tokens: 12,
          temperature: 0,
          logprobs: 1,
          stream: true,
          ...({ ignore_eos: true } as object)
        })
        const out: Array<{ choices: Array<TextChoice> }> = []
        for await (const e of stream) out.push(e as never)
        return out
      })
      assert.strictEqual(events.length, 13) // 12 tokens and a final event
      assert.deepStrictEqual(events.flatMap((e) => e.choices[0]!.token_ids), direct.tokenIds)
      assert.deepStrictEqual(events.slice(0, 12).map((e) => e.choices[0]!.logprobs!.token_logprobs[0]), direct.logprobs)
      assert.strictEqual(events.map((e) => e.choices[0]!.text).join(""), choice.text)
      assert.strictEqual(events.at(-1)!.choices[0]!.finish_reason, "length")

      const text = yield* Effect.promise(() =>
        client.completions.create({ model: "tiny-test", prompt: "Hello", max_tokens: 5, seed: 1 })
      )
      const ids = (text.choices[0] as unknown as { prompt_token_ids: Array<number> }).prompt_token_ids
      assert.deepStrictEqual(ids, folder.tokenizer.encode("Hello"))
    })))

  it.live("chat completions (plain and streamed) agree, with token ids and policy version", () =>
    live(Effect.gen(function*() {
      const { client } = yield* setup
      const messages = [{ role: "system" as const, content: "Be brief." }, { role: "user" as const, content: "Hi!" }]
      const plain = yield* Effect.promise(() =>
        client.chat.completions.create({ model: "tiny-test", messages, max_tokens: 24, temperature: 0, logprobs: true })
      )
      const choice = plain.choices[0]! as typeof plain.choices[0] & { token_ids: Array<number> }
      assert.strictEqual(choice.message.role, "assistant")
      assert.strictEqual(choice.token_ids.length, plain.usage!.completion_tokens)
      assert.strictEqual(choice.logprobs!.content!.length, choice.token_ids.length)
      const chunks = yield* Effect.promise(async () => {
        const stream = await client.chat.completions.create({
          model: "tiny-test",
          messages,
          max_tokens: 24,
          temperature: 0,
          stream: true
        })
        const out: Array<unknown> = []
        for await (const chunk of stream) out.push(chunk)
        return out as Array<{ choices: Array<ChatDelta> }>
      })
      assert.isAbove(chunks.length, 3) // a role chunk, several content chunks, a final chunk
      const streamed = chunks.map((c) => c.choices[0]!.delta.content ?? "").join("")
      assert.strictEqual(streamed, choice.message.content)
      const last = chunks.at(-1)!.choices[0]!
      assert.strictEqual(last.finish_reason, choice.finish_reason)
      assert.deepStrictEqual(last.token_ids, choice.token_ids)
    })))

  it.live("tool calls in the model's output come back as tool_calls, plain and streamed", () =>
    live(Effect.gen(function*() {
      const { folder } = yield* setup
      const output = `Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>`
      const server = yield* OpenAiServer.make(folder).pipe(
        Effect.provideService(PolicyEngine, scripted(folder, output))
      )
      const client = new OpenAI({ baseURL: server.baseUrl, apiKey: "unused", maxRetries: 0 })
      const tools = [{
        type: "function" as const,
        function: {
          name: "add",
          description: "Add two numbers",
          parameters: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } } }
        }
      }]
      const messages = [
        { role: "user" as const, content: "2+3?" },
        {
          role: "assistant" as const,
          content: null,
          tool_calls: [{
            id: "c0",
            type: "function" as const,
            function: { name: "add", arguments: "{\"a\":1,\"b\":1}" }
          }]
        },
        { role: "tool" as const, tool_call_id: "c0", content: "2" },
        { role: "user" as const, content: "Now 2+3." }
      ]
      const plain = yield* Effect.promise(() => client.chat.completions.create({ model: "tiny-test", messages, tools }))
      const choice = plain.choices[0]!
      assert.strictEqual(choice.finish_reason, "tool_calls")
      assert.strictEqual(choice.message.content, "Let me add.")
      const call = choice.message.tool_calls![0]! as { id: string; function: { name: string; arguments: string } }
      assert.strictEqual(call.function.name, "add")
      assert.deepStrictEqual(JSON.parse(call.function.arguments), { a: 2, b: 3 })

      const chunks = yield* Effect.promise(async () => {
        const stream = await client.chat.completions.create({ model: "tiny-test", messages, tools, stream: true })
        const out: Array<{ choices: Array<ChatDelta> }> = []
        for await (const chunk of stream) out.push(chunk as never)
        return out
      })
      const content = chunks.map((c) => c.choices[0]!.delta.content ?? "").join("")
      assert.strictEqual(content.trim(), "Let me add.")
      assert.notInclude(content, "<tool_call")
      const calls = chunks.flatMap((c) => c.choices[0]!.delta.tool_calls ?? [])
      assert.strictEqual(calls.length, 1)
      assert.deepStrictEqual(JSON.parse(calls[0]!.function!.arguments!), { a: 2, b: 3 })
      // The same answer to the same prompt: the same id, streamed or not; the next turn's call another one (ids
      // were call_0 in every answer, so a history's tool results could not tell its calls apart).
      assert.strictEqual((calls[0] as { id?: string }).id, call.id)
      assert.match(call.id, /^call_[0-9a-f]{12}_0$/)
      const next = yield* Effect.promise(() =>
        client.chat.completions.create({
          model: "tiny-test",
          tools,
          messages: [...messages, choice.message, { role: "tool" as const, tool_call_id: call.id, content: "5" }]
        })
      )
      assert.notStrictEqual(next.choices[0]!.message.tool_calls![0]!.id, call.id)
      assert.strictEqual(chunks.at(-1)!.choices[0]!.finish_reason, "tool_calls")
      // Asked for, a streamed chat ends with its usage, as OpenAI's does (the SDK's final completion reads it).
      const final = yield* Effect.promise(() =>
        client.chat.completions.stream({ model: "tiny-test", messages, tools, stream_options: { include_usage: true } })
          .finalChatCompletion()
      )
      assert.deepStrictEqual(final.usage, plain.usage)

      // A policy trained without the tools' schemas is served without them; its calls are still parsed.
      const quiet = yield* OpenAiServer.make(folder, { renderTools: false }).pipe(
        Effect.provideService(PolicyEngine, scripted(folder, output))
      )
      const quietClient = new OpenAI({ baseURL: quiet.baseUrl, apiKey: "unused", maxRetries: 0 })
      const without = yield* Effect.promise(() =>
        quietClient.chat.completions.create({ model: "tiny-test", messages, tools })
      )
      const promptOf = (r: unknown) =>
        folder.tokenizer.decode((r as { prompt_token_ids: Array<number> }).prompt_token_ids)
      assert.include(promptOf(plain), "# Tools")
      assert.notInclude(promptOf(without), "# Tools")
      const quietCall = without.choices[0]!.message.tool_calls![0]! as { function: { name: string; arguments: string } }
      assert.strictEqual(quietCall.function.name, "add")
      assert.deepStrictEqual(JSON.parse(quietCall.function.arguments), { a: 2, b: 3 })
    })))

  it.live("bad requests get OpenAI-style 4xx error bodies and the server keeps serving", () =>
    live(Effect.gen(function*() {
      const { server, client } = yield* setup
      const url = server.baseUrl
      const cases: Array<[string, string, string, number, RegExp]> = [
        ["/completions", "{not json", "POST", 400, /not valid JSON/],
        ["/completions", JSON.stringify({ model: "tiny-test" }), "POST", 400, /prompt/],
        ["/completions", JSON.stringify({ prompt: [1, 2], max_tokens: "many" }), "POST", 400, /max_tokens/],
        ["/completions", JSON.stringify({ prompt: [1, 99999] }), "POST", 400, /outside the vocabulary/],
        ["/completions", JSON.stringify({ prompt: new Array(600).fill(5) }), "POST", 400, /context holds 512/],
        ["/completions", JSON.stringify({ prompt: "x", stop: ["never seen"] }), "POST", 400, /not a single token/],
        // "é" is two bytes: two tokens of the byte-level tokenizer (it once stopped on the one byte 0xE9 instead).
        ["/completions", JSON.stringify({ prompt: "x", stop: ["é"] }), "POST", 400, /"é" is 2 tokens/],
        ["/completions", JSON.stringify({ model: "gpt-4", prompt: "x" }), "POST", 404, /does not exist/],
        ["/chat/completions", JSON.stringify({ messages: [] }), "POST", 400, /messages/],
        [
          "/chat/completions",
          JSON.stringify({ messages: [{ role: "user", content: "hi" }, { role: "wizard", content: 1 }] }),
          "POST",
          400,
          /^messages\[1\]\.role: expected "system", "user", "assistant" or "tool", got "wizard"$/
        ],
        ["/completions", "", "GET", 405, /use POST/],
        ["/nothing", "{}", "POST", 404, /no route/]
      ]
      // "\n", the commonest stop string, is the text's own token.
      assert.strictEqual(
        (yield* post(`${url}/completions`, JSON.stringify({ prompt: "x", max_tokens: 2, stop: ["\n"] }))).status,
        200
      )
      // A Schema refusal names its field in `param`, as OpenAI's errors do.
      const typed = yield* post(`${url}/completions`, JSON.stringify({ prompt: "x", max_tokens: "5" }))
      assert.strictEqual(typed.status, 400)
      assert.strictEqual(typed.json.error!.param, "max_tokens")
      assert.match(typed.json.error!.message, /^max_tokens: Expected number \| null/)
      for (const [path, body, method, status, pattern] of cases) {
        const r = yield* post(`${url}${path}`, body, method)
        assert.strictEqual(r.status, status, `${method} ${path} ${body.slice(0, 40)}`)
        assert.match(r.json.error!.message, pattern)
        assert.strictEqual(r.json.error!.type, "invalid_request_error")
      }
      const { folder, engine } = yield* setup
      const strict = yield* OpenAiServer.make(folder, { maxBodyBytes: 200 }).pipe(
        Effect.provideService(PolicyEngine, engine)
      )
      const tooBig = yield* post(`${strict.baseUrl}/completions`, JSON.stringify({ prompt: "x".repeat(1000) }))
      assert.strictEqual(tooBig.status, 413)
      assert.match(tooBig.json.error!.message, /exceeds 200 bytes/)
      const error = yield* Effect.flip(Effect.tryPromise({
        try: () => client.completions.create({ model: "tiny-test", prompt: [], max_tokens: 0 }),
        catch: (e) => e as InstanceType<typeof OpenAI.APIError>
      }))
      assert.instanceOf(error, OpenAI.APIError)
      assert.strictEqual(error.status, 400)
      const ok = yield* Effect.promise(() =>
        client.completions.create({ model: "tiny-test", prompt: [1, 2], max_tokens: 2 })
      )
      assert.strictEqual(ok.choices.length, 1)
    })))

  it.live("a client that disconnects mid-stream cancels its sequence in the engine", () =>
    live(Effect.gen(function*() {
      const { engine, server } = yield* setup
      const firstChunk = yield* Effect.promise(async () => {
        const controller = new AbortController()
        const response = await fetch(`${server.baseUrl}/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            messages: [{ role: "user", content: "go" }],
            max_tokens: 400,
            stream: true,
            ignore_eos: true
          }),
          signal: controller.signal
        })
        const reader = response.body!.getReader()
        const { value } = await reader.read()
        controller.abort()
        return new TextDecoder().decode(value)
      })
      assert.match(firstChunk, /^data: /)
      let running = 1
      for (let i = 0; i < 200 && running > 0; i++) {
        yield* Effect.sleep("10 millis")
        running = Object.values((yield* engine.stats).running).reduce((a, b) => a + b, 0)
      }
      assert.strictEqual(running, 0)
      // ignore_eos: nothing but the cancellation could have ended the sequence before 400 tokens
      assert.isBelow((yield* engine.stats).generatedTokens, 400)
      const models = yield* post(`${server.baseUrl}/models`, "", "GET")
      assert.strictEqual(models.status, 200)
    })))

  it.live("the project's OpenAiCompatSampler (token and chat mode) works against the server", () =>
    live(Effect.gen(function*() {
      const { engine, server } = yield* setup
      const request: GenerateRequest = {
        promptTokenIds: [5, 6, 7, 8, 9],
        sampling: { temperature: 0.8, maxTokens: 10, seed: 42 }
      }
      const sampler = yield* OpenAiCompatSampler.make({ baseUrl: server.baseUrl, model: "tiny-test" })
      const viaHttp = yield* sampler.generate(request)
      const direct = yield* engine.generate({ ...request, sampling: { ...request.sampling, stopTokenIds: [] } })
      assert.strictEqual(viaHttp.policyVersion, 4)
      // Same seed, same ids; the server adds the model's stop ids, so the HTTP result may end earlier.
      assert.deepStrictEqual(viaHttp.tokenIds, direct.tokenIds.slice(0, viaHttp.tokenIds.length))
      assert.deepStrictEqual(viaHttp.logprobs, direct.logprobs.slice(0, viaHttp.logprobs.length))
      const chat = yield* OpenAiCompatSampler.makeChat({ baseUrl: server.baseUrl, model: "tiny-test" })
      const reply = yield* chat.complete({
        messages: [{ role: "user", content: "hello" }],
        sampling: { temperature: 0, maxTokens: 8 }
      })
      assert.isString(reply.content)
    }).pipe(Effect.provide(NodeHttpClient.layerNodeHttp))))
})
