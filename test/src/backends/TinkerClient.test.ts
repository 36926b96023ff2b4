/**
 * The Tinker client against a scripted server on loopback (`test/utils/scriptedTinker.ts`): retries and their waits
 * (on the TestClock), idempotency keys kept across retries, futures polled to their result, and a typed reason for
 * every refusal. The server is real I/O, so the tests let it answer in real time (`settle`) while virtual time stands
 * still, and move virtual time only where a wait is the subject.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Redacted, Schema } from "effect"
import { TestClock } from "effect/testing"
import * as TinkerClient from "../../../src/backends/TinkerClient.ts"
import { type Answer, type Handler, scriptedTinker, type ScriptedServer } from "../../utils/scriptedTinker.ts"
import * as Tinker from "../../../src/tinker/Types.ts"

const FB = "/api/v1/forward_backward"
const RETRIEVE = "/api/v1/retrieve_future"

const request: Tinker.ForwardBackwardRequest = {
  model_id: "m1",
  forward_backward_input: { data: [], loss_fn: "importance_sampling" }
}
const result = { loss_fn_output_type: "ArrayRecord", loss_fn_outputs: [], metrics: { "loss:sum": 1.5 } }
const future = (id: string): Answer => ({ status: 200, json: { request_id: id, model_id: "m1" } })
const done: Answer = { status: 200, json: result }

/** Lets the real server and sockets run for a moment of real time; virtual time does not move. */
const settle = Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 15)))

/** Waits (in real time, bounded) until `server` has seen `n` requests to `path`. */
const seenAt = (server: ScriptedServer, path: string, n: number) =>
  Effect.gen(function*() {
    for (let i = 0; i < 400 && server.count(path) < n; i++) yield* settle
    return server.count(path)
  })

/** Moves virtual time in `stepMs` steps, letting real I/O run between them, until `fiber` ends (bounded). */
const drive = <A, E>(fiber: Fiber.Fiber<A, E>, stepMs = 100) =>
  Effect.gen(function*() {
    for (let i = 0; i < 3000 && fiber.pollUnsafe() === undefined; i++) {
      yield* settle
      yield* TestClock.adjust(stepMs)
    }
    return yield* Effect.exit(Fiber.join(fiber))
  })

type Client = TinkerClient.TinkerClient["Service"]

/** A client of a scripted server, both in the test's scope. */
const withServer = <A, E>(
  handler: Handler,
  body: (server: ScriptedServer, client: Client) => Effect.Effect<A, E, any>,
  options: Partial<TinkerClient.Options> = {}
) =>
  Effect.gen(function*() {
    const server = yield* scriptedTinker(handler)
    const client = yield* TinkerClient.make({ baseUrl: server.baseUrl, ...options })
    return yield* body(server, client)
  }).pipe(Effect.provide(NodeHttpClient.layerNodeHttp), Effect.scoped) as Effect.Effect<A, E>

const fb = (client: Client) =>
  client.submit("forward_backward", Tinker.ForwardBackwardRequest, request, Tinker.ForwardBackwardOutput)

/** The failure of an exit (a `TinkerError`). */
const reasonOf = (exit: any) => exit._tag === "Failure" ? exit.cause.reasons?.[0]?.error ?? exit.cause : undefined

const tryAgain: Answer = { status: 200, json: { type: "try_again", request_id: "r1", queue_state: "active" } }

describe("TinkerClient", () => {
  it.effect("a 429 is retried after the Retry-After it asks, with the same idempotency key; the future is polled", () =>
    withServer((seen, i) => {
      if (seen.path === FB) return i === 0 ? { status: 429, headers: { "retry-after": "3" } } : future("r1")
      return seen.body.request_id === "r1" && i < 4 ? tryAgain : done
    }, (server, client) =>
      Effect.gen(function*() {
        const fiber = yield* Effect.forkChild(fb(client))
        assert.strictEqual(yield* seenAt(server, FB, 1), 1)
        yield* TestClock.adjust(2_900)
        yield* settle
        assert.strictEqual(server.count(FB), 1, "not retried before the 3 s the server asked for")
        yield* TestClock.adjust(200)
        assert.strictEqual(yield* seenAt(server, FB, 2), 2)
        const exit = yield* drive(fiber, 50)
        assert.strictEqual(exit._tag, "Success")
        assert.deepStrictEqual((exit as any).value.metrics, { "loss:sum": 1.5 })
        const keys = server.seen.filter((s) => s.path === FB).map((s) => s.headers["x-idempotency-key"])
        assert.strictEqual(keys[0], keys[1])
        assert.match(keys[0]!, /^agentfly-retry-/)
        const counts = server.seen.filter((s) => s.path === FB).map((s) => s.headers["x-stainless-retry-count"])
        assert.deepStrictEqual(counts, ["0", "1"])
        assert.isAtLeast(server.count(RETRIEVE), 2, "try_again was polled again")
        const sent = server.seen.find((s) => s.path === FB)!.body
        assert.deepStrictEqual(sent, request)
        assert.deepStrictEqual(server.seen.find((s) => s.path === RETRIEVE)!.body, {
          request_id: "r1",
          allow_metadata_only: false
        })
      })))

  it.effect("a dropped answer is sent again with its key; a server deduplicating by key applies it once", () => {
    let applied = 0
    const byKey = new Map<string, string>()
    return withServer((seen) => {
      if (seen.path === RETRIEVE) return done
      const key = seen.headers["x-idempotency-key"]!
      if (!byKey.has(key)) {
        applied++
        byKey.set(key, `r${applied}`)
        return "drop" // applied, but the answer is lost on the way
      }
      return future(byKey.get(key)!)
    }, (server, client) =>
      Effect.gen(function*() {
        const exit = yield* drive(yield* Effect.forkChild(fb(client)))
        assert.strictEqual(exit._tag, "Success")
        assert.strictEqual(server.count(FB), 2)
        assert.strictEqual(applied, 1, "the optimizer step is applied once")
        assert.strictEqual(client.traffic.retries, 1)
      }))
  })

  it.effect("5xx is retried with backoff until it succeeds; past maxRetries it is a ServerError", () =>
    Effect.gen(function*() {
      const flaky: Handler = (seen, i) => seen.path === FB ? (i < 2 ? { status: 500 } : future("r")) : done
      yield* withServer(flaky, (server, client) =>
        Effect.gen(function*() {
          const exit = yield* drive(yield* Effect.forkChild(fb(client)))
          assert.strictEqual(exit._tag, "Success")
          assert.strictEqual(server.count(FB), 3)
        }))
      yield* withServer(() => ({ status: 503 }), (server, client) =>
        Effect.gen(function*() {
          const error = reasonOf(yield* drive(yield* Effect.forkChild(fb(client))))
          assert.strictEqual(error._tag, "TinkerError")
          assert.strictEqual(error.reason._tag, "ServerError")
          assert.strictEqual(error.reason.status, 503)
          assert.strictEqual(error.op, "forward_backward")
          assert.strictEqual(server.count(FB), 3, "the first attempt and maxRetries = 2")
        }), { maxRetries: 2 })
    }))

  it.effect("a server that stays unreachable is ConnectionLost after the retries", () =>
    withServer(() => "drop", (server, client) =>
      Effect.gen(function*() {
        const error = reasonOf(yield* drive(yield* Effect.forkChild(fb(client))))
        assert.strictEqual(error.reason._tag, "ConnectionLost")
        assert.isTrue(error.isRetryable)
        assert.strictEqual(server.count(FB), 2)
      }), { maxRetries: 1 }))

  it.effect("auth, unknown model, quota and bad requests are typed and not retried (quota after its retries)", () =>
    Effect.gen(function*() {
      const cases: ReadonlyArray<readonly [number, string, number]> = [
        [401, "Unauthorized", 1],
        [403, "Unauthorized", 1],
        [404, "UnknownModel", 1],
        [400, "BadRequest", 1],
        [402, "QuotaExceeded", 1],
        [429, "QuotaExceeded", 3]
      ]
      for (const [status, tag, requests] of cases) {
        const headers = { "retry-after": "1" }
        const refuse: Handler = () => ({ status, json: { detail: `scripted ${status}` }, headers })
        yield* withServer(refuse, (server, client) =>
          Effect.gen(function*() {
            const error = reasonOf(yield* drive(yield* Effect.forkChild(fb(client))))
            assert.strictEqual(error.reason._tag, tag, `HTTP ${status}`)
            assert.include(error.message, `scripted ${status}`)
            assert.strictEqual(server.count(FB), requests, `HTTP ${status}`)
            if (status === 429) assert.strictEqual(error.reason.retryAfterMs, 1000)
          }), { maxRetries: 2 })
      }
    }))

  it.effect("the API key goes as X-API-Key", () =>
    withServer((seen) => seen.path === FB ? future("r") : done, (server, client) =>
      Effect.gen(function*() {
        yield* drive(yield* Effect.forkChild(fb(client)))
        assert.strictEqual(server.seen[0]!.headers["x-api-key"], "tml-secret")
        assert.isTrue(server.seen.every((s) => s.headers["x-api-key"] === "tml-secret"))
      }), { apiKey: Redacted.make("tml-secret") }))

  it.effect("a failed future is FutureFailed with its category", () =>
    withServer((seen) =>
      seen.path === FB ? future("r") : { status: 200, json: { error: "no such loss", category: "user" } },
    (_, client) =>
      Effect.gen(function*() {
        const error = reasonOf(yield* drive(yield* Effect.forkChild(fb(client))))
        assert.strictEqual(error.reason._tag, "FutureFailed")
        assert.strictEqual(error.reason.category, "user")
        assert.strictEqual(error.reason.requestId, "r")
        assert.isFalse(error.isRetryable)
      })))

  it.effect("a future that never completes times out after futureTimeoutMs; 408 counts as try again", () =>
    withServer((seen, i) =>
      seen.path === FB ? future("r") : i % 2 === 0 ? { status: 408, json: { type: "try_again" } } : tryAgain,
    (server, client) =>
      Effect.gen(function*() {
        const error = reasonOf(yield* drive(yield* Effect.forkChild(fb(client)), 250))
        assert.strictEqual(error.reason._tag, "FutureTimedOut")
        assert.isAtLeast(error.reason.waitedMs, 10_000)
        assert.isBelow(error.reason.waitedMs, 10_000 + 1_000)
        assert.isAtLeast(server.count(RETRIEVE), 3)
      }), { futureTimeoutMs: 10_000 }))

  it.effect("a future the server forgot (410) is submitted again with the original key", () => {
    let gone = false
    return withServer((seen) => {
      if (seen.path === FB) return future(`r${seen.headers["x-stainless-retry-count"]}`)
      if (gone) return done
      gone = true
      return { status: 410 }
    }, (server, client) =>
      Effect.gen(function*() {
        const exit = yield* drive(yield* Effect.forkChild(fb(client)))
        assert.strictEqual(exit._tag, "Success")
        const keys = server.seen.filter((s) => s.path === FB).map((s) => s.headers["x-idempotency-key"])
        assert.strictEqual(keys.length, 2)
        assert.strictEqual(keys[0], keys[1])
        assert.strictEqual(client.traffic.resubmits, 1)
      }))
  })

  it.effect("an answer that does not decode is BadResponse; a request that does not encode is not sent", () =>
    withServer((seen) => seen.path === FB ? { status: 200, json: { no_request_id: true } } : done, (server, client) =>
      Effect.gen(function*() {
        const error = reasonOf(yield* drive(yield* Effect.forkChild(fb(client))))
        assert.strictEqual(error.reason._tag, "BadResponse")
        const value = { model_id: 7 } as any
        const bad = yield* Effect.exit(
          client.submit("forward_backward", Tinker.ForwardBackwardRequest, value, Schema.Unknown)
        )
        assert.strictEqual(reasonOf(bad).reason._tag, "BadResponse")
        assert.strictEqual(server.count(FB), 1)
      })))

  it("retryDelayMs follows the SDK: doubling from 0.5 s to 10 s, jitter ≤ 25 %, an asked 0–60 s wins", () => {
    assert.strictEqual(TinkerClient.retryDelayMs(0, undefined, 0), 500)
    assert.strictEqual(TinkerClient.retryDelayMs(3, undefined, 0), 4_000)
    assert.strictEqual(TinkerClient.retryDelayMs(9, undefined, 0), 10_000)
    assert.strictEqual(TinkerClient.retryDelayMs(1, undefined, 0.999), 1_000 * (1 - 0.25 * 0.999))
    assert.strictEqual(TinkerClient.retryDelayMs(5, 3_000, 0.5), 3_000)
    assert.strictEqual(TinkerClient.retryDelayMs(0, 120_000, 0), 500, "over 60 s is not honoured")
    assert.strictEqual(TinkerClient.askedWaitMs({ "retry-after-ms": "250", "retry-after": "9" }, 0), 250)
    assert.strictEqual(TinkerClient.askedWaitMs({ "retry-after": "2.5" }, 0), 2_500)
    assert.strictEqual(TinkerClient.askedWaitMs({ "retry-after": new Date(10_000).toUTCString() }, 4_000), 6_000)
  })
})
