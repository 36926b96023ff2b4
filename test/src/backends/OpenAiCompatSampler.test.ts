/**
 * The OpenAI-compatible backend against a real HTTP server started by the test (node:http on 127.0.0.1, port 0),
 * through the Node HTTP client. The server plays vLLM: token-id prompts in, token ids and logprobs out.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import * as OpenAiCompatSampler from "../../../src/backends/OpenAiCompatSampler.ts"
import * as Sampler from "../../../src/Sampler.ts"

interface Seen {
  readonly path: string
  readonly body: any
  readonly authorization: string | undefined
}

type Handler = (
  seen: Seen,
  index: number
) => { readonly status: number; readonly json?: unknown; readonly headers?: Record<string, string> } | "hang"

/** A throwaway HTTP server in the test's scope; records every request it gets. */
const testServer = (handler: Handler) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly baseUrl: string; readonly seen: Array<Seen>; readonly close: () => void }>((resume) => {
      const seen: Array<Seen> = []
      const server = createServer((req, res) => {
        let raw = ""
        req.on("data", (chunk) => (raw += chunk))
        req.on("end", () => {
          const entry: Seen = { path: req.url ?? "", body: JSON.parse(raw), authorization: req.headers.authorization }
          seen.push(entry)
          const answer = handler(entry, seen.length - 1)
          if (answer === "hang") return
          res.writeHead(answer.status, { "content-type": "application/json", ...answer.headers })
          res.end(JSON.stringify(answer.json ?? { error: { message: "nope" } }))
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo
        resume(Effect.succeed({
          baseUrl: `http://127.0.0.1:${port}/v1`,
          seen,
          close: () => {
            server.closeAllConnections()
            server.close()
          }
        }))
      })
    }),
    (server) => Effect.sync(server.close)
  )

const request: Sampler.GenerateRequest = {
  promptTokenIds: [151644, 872, 198],
  sampling: { temperature: 0.7, topP: 0.9, topK: 20, maxTokens: 3, stopTokenIds: [151645], seed: 11 }
}

const vllmChoice = (ids: ReadonlyArray<number>, finish: string) => ({
  text: "ignored",
  finish_reason: finish,
  logprobs: { tokens: ids.map((id) => `token_id:${id}`), token_logprobs: ids.map((id) => -id / 1000) }
})

const live = <A, E>(effect: Effect.Effect<A, E, any>) =>
  effect.pipe(Effect.provide(NodeHttpClient.layerNodeHttp), Effect.scoped) as Effect.Effect<A, E>

describe("OpenAiCompatSampler (token mode)", () => {
  it.live("posts token ids and reads token ids and logprobs from a vLLM-style answer", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer(() => ({
        status: 200,
        json: { choices: [vllmChoice([7, 8, 9], "length")], policy_version: 5 }
      }))
      const sampler = yield* OpenAiCompatSampler.make({
        baseUrl: server.baseUrl,
        model: "tiny",
        apiKey: Redacted.make("sk-test")
      })
      const result = yield* sampler.generate(request)
      assert.deepStrictEqual(result.tokenIds, [7, 8, 9])
      assert.deepStrictEqual(result.logprobs, [-0.007, -0.008, -0.009])
      assert.strictEqual(result.finishReason, "length")
      assert.strictEqual(result.policyVersion, 5)
      const [seen] = server.seen
      assert.strictEqual(seen!.path, "/v1/completions")
      assert.strictEqual(seen!.authorization, "Bearer sk-test")
      assert.deepStrictEqual(seen!.body.prompt, [151644, 872, 198])
      assert.strictEqual(seen!.body.model, "tiny")
      assert.strictEqual(seen!.body.max_tokens, 3)
      assert.strictEqual(seen!.body.top_p, 0.9)
      assert.strictEqual(seen!.body.top_k, 20)
      assert.strictEqual(seen!.body.seed, 11)
      assert.deepStrictEqual(seen!.body.stop_token_ids, [151645])
      assert.strictEqual(seen!.body.logprobs, 1)
      assert.strictEqual(seen!.body.return_token_ids, true)
      // Only the request's stop ids end a sample, as in the local engine (not the server's own end-of-sequence ids).
      assert.strictEqual(seen!.body.ignore_eos, true)
    })))

  it.live("reads choices[0].token_ids, and the configured policy version when the server reports none", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer(() => ({
        status: 200,
        json: {
          choices: [{ finish_reason: "stop", token_ids: [4, 151645], logprobs: { token_logprobs: [-0.5, -0.25] } }]
        }
      }))
      const sampler = yield* OpenAiCompatSampler.make({
        baseUrl: server.baseUrl + "/",
        model: "tiny",
        policyVersion: Effect.succeed(3)
      })
      const result = yield* sampler.generate(request)
      assert.deepStrictEqual(result.tokenIds, [4, 151645])
      assert.deepStrictEqual(result.logprobs, [-0.5, -0.25])
      assert.strictEqual(result.finishReason, "stop")
      assert.strictEqual(result.policyVersion, 3)
    })))

  it.effect("an adapter's name carries its version and digest, and only such a name parses", () =>
    Effect.sync(() => {
      const name = OpenAiCompatSampler.adapterName("policy", 3, "0123456789abcdef")
      assert.strictEqual(name, "policy-v3-0123456789abcdef")
      assert.deepStrictEqual(OpenAiCompatSampler.parseAdapterName(name), {
        base: "policy",
        version: 3,
        digest: "0123456789abcdef"
      })
      // The warm-up's checks have negative versions.
      assert.strictEqual(OpenAiCompatSampler.parseAdapterName("my-policy-v-2-0123456789abcdef")?.version, -2)
      for (const other of ["policy", "policy-v3", "policy-v3-0123", "policy-v3-0123456789ABCDEF", "Qwen2.5-0.5B"]) {
        assert.isUndefined(OpenAiCompatSampler.parseAdapterName(other), other)
      }
    }))

  it.live("a vLLM answer echoing the adapter name asked for says that adapter and its version; another does not", () =>
    live(Effect.gen(function*() {
      const name = OpenAiCompatSampler.adapterName("policy", 4, "00000000000000aa")
      const server = yield* testServer((seen, index) => ({
        status: 200,
        json: {
          // The first answer echoes the model asked for (as vLLM does); the second names the base.
          model: index === 0 ? seen.body.model : "base",
          choices: [{ finish_reason: "length", token_ids: [4], logprobs: { token_logprobs: [-0.5] } }]
        }
      }))
      const sampler = yield* OpenAiCompatSampler.make({ baseUrl: server.baseUrl, model: name })
      const echoed = yield* sampler.generate(request)
      assert.strictEqual(server.seen[0]!.body.model, name)
      assert.strictEqual(echoed.policyVersion, 4)
      assert.deepStrictEqual(echoed.adapter, { name, digest: "00000000000000aa", policyVersion: 4 })
      const base = yield* sampler.generate(request)
      assert.isUndefined(base.adapter)
      assert.strictEqual(base.policyVersion, 0)
    })))

  it.live("a server that cannot return token ids fails with NoTokenIds, without retrying", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer(() => ({
        status: 200,
        json: { choices: [{ text: "hello", finish_reason: "stop", logprobs: null }] }
      }))
      const sampler = yield* OpenAiCompatSampler.make({ baseUrl: server.baseUrl, model: "m", retryBaseMs: 1 })
      const error = yield* Effect.flip(sampler.generate(request))
      assert.strictEqual(error.reason._tag, "NoTokenIds")
      assert.isFalse(error.isRetryable)
      assert.strictEqual(server.seen.length, 1)
    })))

  it.live("retries 429 and 5xx with backoff, then succeeds", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer((_, i) =>
        i === 0
          ? { status: 429 }
          : i === 1
          ? { status: 503 }
          : { status: 200, json: { choices: [vllmChoice([1], "stop")] } }
      )
      const sampler = yield* OpenAiCompatSampler.make({ baseUrl: server.baseUrl, model: "m", retryBaseMs: 5 })
      const result = yield* sampler.generate(request)
      assert.deepStrictEqual(result.tokenIds, [1])
      assert.strictEqual(server.seen.length, 3)
    })))

  it.live("waits as long as Retry-After asks, capped by maxRetryAfterMs", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer((_, i) =>
        i % 2 === 0
          ? { status: 429, headers: { "retry-after": i === 0 ? "1" : "3600" } }
          : { status: 200, json: { choices: [vllmChoice([1], "stop")] } }
      )
      const sampler = yield* OpenAiCompatSampler.make({
        baseUrl: server.baseUrl,
        model: "m",
        retryBaseMs: 1,
        maxRetryAfterMs: 1500
      })
      const t0 = performance.now()
      yield* sampler.generate(request)
      const waited = performance.now() - t0
      assert.isAtLeast(waited, 950, "Retry-After: 1 is honoured")
      const t1 = performance.now()
      yield* sampler.generate(request)
      const capped = performance.now() - t1
      assert.isAtLeast(capped, 1400)
      assert.isBelow(capped, 60_000, "Retry-After: 3600 is capped (a bound load cannot reach)")
    })))

  it.effect("reads Retry-After as seconds or as an HTTP date", () =>
    Effect.sync(() => {
      const now = Date.parse("Sun, 29 Nov 2026 10:00:00 GMT")
      assert.strictEqual(OpenAiCompatSampler.retryAfterMs("2", now), 2000)
      assert.strictEqual(OpenAiCompatSampler.retryAfterMs("0.5", now), 500)
      assert.strictEqual(OpenAiCompatSampler.retryAfterMs("Sun, 29 Nov 2026 10:00:07 GMT", now), 7000)
      assert.strictEqual(OpenAiCompatSampler.retryAfterMs("Sun, 29 Nov 2026 09:00:00 GMT", now), 0)
      assert.isUndefined(OpenAiCompatSampler.retryAfterMs("soon", now))
      assert.isUndefined(OpenAiCompatSampler.retryAfterMs(undefined, now))
    }))

  it.live("gives up after the configured retries with a typed error", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer(() => ({ status: 500 }))
      const sampler = yield* OpenAiCompatSampler.make({
        baseUrl: server.baseUrl,
        model: "m",
        retries: 2,
        retryBaseMs: 1
      })
      const error = yield* Effect.flip(sampler.generate(request))
      assert.strictEqual(error.reason._tag, "ServerError")
      assert.strictEqual(server.seen.length, 3)
    })))

  it.live("a 400 is a BadRequest and is not retried", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer(() => ({ status: 400, json: { error: { message: "prompt too long" } } }))
      const sampler = yield* OpenAiCompatSampler.make({ baseUrl: server.baseUrl, model: "m", retryBaseMs: 1 })
      const error = yield* Effect.flip(sampler.generate(request))
      assert.strictEqual(error.reason._tag, "BadRequest")
      assert.strictEqual(error.reason._tag === "BadRequest" && error.reason.status, 400)
      assert.include(error.message, "prompt too long")
      assert.strictEqual(server.seen.length, 1)
    })))

  it.live("an HTTP status becomes a reason with its facts: the wait a 429 or a 503 asks for, the status", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer((_, i) =>
        i === 0
          ? { status: 429, headers: { "retry-after": "2" } }
          : i === 1
          ? { status: 503, headers: { "retry-after": "3" } }
          : { status: 408 }
      )
      const sampler = yield* OpenAiCompatSampler.make({ baseUrl: server.baseUrl, model: "m", retries: 0 })
      const busy = yield* Effect.flip(sampler.generate(request))
      assert.deepStrictEqual(
        busy.reason,
        new Sampler.Overloaded({ message: `HTTP 429: {"error":{"message":"nope"}}`, retryAfterMs: 2000 })
      )
      assert.strictEqual(busy.retryAfterMs, 2000)
      assert.strictEqual(busy.message, `HTTP 429: {"error":{"message":"nope"}}`)
      const down = yield* Effect.flip(sampler.generate(request))
      assert.strictEqual(down.reason._tag, "ServerError")
      assert.deepStrictEqual([down.reason._tag === "ServerError" && down.reason.status, down.retryAfterMs], [503, 3000])
      const slow = yield* Effect.flip(sampler.generate(request))
      assert.strictEqual(slow.reason._tag, "Timeout")
      assert.isUndefined(slow.retryAfterMs)
      assert.isTrue(busy.isRetryable && down.isRetryable && slow.isRetryable)
    })))

  it.live("times out a server that does not answer, retrying each attempt", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer(() => "hang")
      const sampler = yield* OpenAiCompatSampler.make({
        baseUrl: server.baseUrl,
        model: "m",
        timeoutMs: 100,
        retries: 1,
        retryBaseMs: 1
      })
      const error = yield* Effect.flip(sampler.generate(request))
      assert.strictEqual(error.reason._tag, "Timeout")
      assert.strictEqual(server.seen.length, 2)
    })))

  it.live("a refused connection is a Transport error", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer(() => ({ status: 200 }))
      server.close()
      const sampler = yield* OpenAiCompatSampler.make({ baseUrl: server.baseUrl, model: "m", retries: 0 })
      const error = yield* Effect.flip(sampler.generate(request))
      assert.strictEqual(error.reason._tag, "Transport")
      // The cause a user must fix, not only that the transport failed.
      assert.include(error.message, "ECONNREFUSED")
    })))
})

describe("OpenAiCompatSampler (chat mode)", () => {
  it.live("posts messages with JSON-string arguments and decodes tool calls back to values", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer(() => ({
        status: 200,
        json: {
          choices: [{
            finish_reason: "tool_calls",
            message: {
              content: null,
              tool_calls: [{ id: "c2", type: "function", function: { name: "calc", arguments: "{\"x\":2}" } }]
            }
          }]
        }
      }))
      const chat = yield* OpenAiCompatSampler.makeChat({ baseUrl: server.baseUrl, model: "gpt-x" })
      const result = yield* chat.complete({
        messages: [
          { role: "user", content: "2+2?" },
          {
            role: "assistant",
            content: "",
            tool_calls: [{ id: "c1", type: "function", function: { name: "calc", arguments: { x: 1 } } }]
          },
          { role: "tool", content: "1", tool_call_id: "c1", is_error: false }
        ],
        tools: [{ type: "function", function: { name: "calc", parameters: { type: "object" } } }],
        sampling: { temperature: 0, maxTokens: 16, stopTokenIds: [1] }
      })
      assert.strictEqual(result.content, "")
      assert.deepStrictEqual(result.toolCalls, [
        { id: "c2", type: "function", function: { name: "calc", arguments: { x: 2 } } }
      ])
      const [seen] = server.seen
      assert.strictEqual(seen!.path, "/v1/chat/completions")
      assert.strictEqual(seen!.body.messages[1].tool_calls[0].function.arguments, "{\"x\":1}")
      assert.isUndefined(seen!.body.messages[2].is_error)
      assert.isUndefined(seen!.body.stop_token_ids)
      assert.strictEqual(seen!.body.tools.length, 1)
    })))

  it.live("sends image parts as vLLM's multimodal chat API takes them: image_url with the data: URL, no more", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer(() => ({
        status: 200,
        json: { choices: [{ finish_reason: "stop", message: { content: "two" } }] }
      }))
      const chat = yield* OpenAiCompatSampler.makeChat({ baseUrl: server.baseUrl, model: "qwen2.5-vl" })
      const url = "data:image/png;base64,iVBORw0KGgo="
      const image = { sha256: "ab".repeat(32), width: 4, height: 2, mediaType: "image/png" as const }
      const result = yield* chat.complete({
        messages: [
          {
            role: "user",
            content: [{ type: "text", text: "How many?" }, { type: "image_url", image_url: { url }, image }]
          },
          { role: "tool", tool_call_id: "c0", content: [{ type: "image_url", image_url: { url }, image }] }
        ],
        sampling: { temperature: 0, maxTokens: 16 }
      })
      assert.strictEqual(result.content, "two")
      const [seen] = server.seen
      assert.deepStrictEqual(seen!.body.messages[0].content, [
        { type: "text", text: "How many?" },
        { type: "image_url", image_url: { url } }
      ])
      assert.deepStrictEqual(seen!.body.messages[1].content, [{ type: "image_url", image_url: { url } }])
    })))
})
