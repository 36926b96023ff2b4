import { assert, describe, it } from "@effect/vitest"
import { Effect, Ref, Schema } from "effect"
import * as Sampler from "../../src/Sampler.ts"

const params = (maxTokens: number, stopTokenIds?: ReadonlyArray<number>): Sampler.SamplingParams => ({
  temperature: 1,
  maxTokens,
  ...(stopTokenIds === undefined ? {} : { stopTokenIds })
})

describe("Sampler.SamplerError", () => {
  it.effect("its reason carries the facts; message, isRetryable and retryAfterMs are the reason's", () =>
    Effect.gen(function*() {
      const busy = Sampler.samplerError("Overloaded", "HTTP 429: slow down", { retryAfterMs: 1500 })
      assert.instanceOf(busy.reason, Sampler.Overloaded)
      assert.deepStrictEqual(
        busy.reason,
        new Sampler.Overloaded({ message: "HTTP 429: slow down", retryAfterMs: 1500 })
      )
      assert.strictEqual(busy.message, "HTTP 429: slow down")
      assert.strictEqual(busy.retryAfterMs, 1500)
      const tags = ["Timeout", "Overloaded", "ServerError", "BadRequest", "NoTokenIds", "Transport", "Closed"] as const
      const retryable = tags.filter((tag) => Sampler.samplerError(tag, "x").isRetryable)
      assert.deepStrictEqual(retryable, ["Timeout", "Overloaded", "ServerError", "Transport"])
      assert.isUndefined(Sampler.samplerError("Closed", "shut down").retryAfterMs)
      // One reason is handled; the others stay in the error channel.
      const handle = (error: Sampler.SamplerError) =>
        Effect.fail(error).pipe(
          Effect.catchReason("SamplerError", "Overloaded", (reason) => Effect.succeed(reason.retryAfterMs ?? 0))
        )
      assert.strictEqual(yield* handle(busy), 1500)
      const closed = yield* Effect.flip(handle(Sampler.samplerError("Closed", "shut down")))
      assert.strictEqual(closed.reason._tag, "Closed")
    }))

  it("keeps its reason through the schema (as it crosses a thread or a wire)", () => {
    const error = Sampler.samplerError("ServerError", "HTTP 503: down", { status: 503, retryAfterMs: 100 })
    const encoded = Schema.encodeSync(Sampler.SamplerError)(error)
    assert.deepStrictEqual(encoded, {
      _tag: "SamplerError",
      reason: { _tag: "ServerError", message: "HTTP 503: down", status: 503, retryAfterMs: 100 }
    })
    const decoded = Schema.decodeUnknownSync(Sampler.SamplerError)(structuredClone(encoded))
    assert.instanceOf(decoded.reason, Sampler.ServerError)
    assert.deepStrictEqual(decoded.reason, error.reason)
    assert.strictEqual(decoded.message, "HTTP 503: down")
  })
})

describe("Sampler.makeScripted", () => {
  it.effect("answers a list script in call order with deterministic logprobs", () =>
    Effect.gen(function*() {
      const sampler = yield* Sampler.makeScripted([[1, 2, 3], [4, 5]], { policyVersion: 7 })
      const a = yield* sampler.generate({ promptTokenIds: [9], sampling: params(10) })
      const b = yield* sampler.generate({ promptTokenIds: [9], sampling: params(10) })
      assert.deepStrictEqual(a.tokenIds, [1, 2, 3])
      assert.deepStrictEqual(b.tokenIds, [4, 5])
      assert.deepStrictEqual(a.logprobs, [1, 2, 3].map((id, i) => Sampler.scriptedLogprob(id, i)))
      assert.isTrue(a.logprobs.every((lp) => lp < 0 && lp >= -1))
      assert.strictEqual(a.policyVersion, 7)
      assert.strictEqual(a.finishReason, "stop")
      const exhausted = yield* Effect.flip(sampler.generate({ promptTokenIds: [9], sampling: params(10) }))
      assert.strictEqual(exhausted.reason._tag, "BadRequest")
    }))

  it.effect("cuts at the first stop token (kept) and at maxTokens (finish length)", () =>
    Effect.gen(function*() {
      const sampler = yield* Sampler.makeScripted(() => [5, 6, 99, 7, 8])
      const stopped = yield* sampler.generate({ promptTokenIds: [1], sampling: params(10, [99]) })
      assert.deepStrictEqual(stopped.tokenIds, [5, 6, 99])
      assert.strictEqual(stopped.finishReason, "stop")
      assert.strictEqual(stopped.logprobs.length, 3)
      const cut = yield* sampler.generate({ promptTokenIds: [1], sampling: params(2, [99]) })
      assert.deepStrictEqual(cut.tokenIds, [5, 6])
      assert.strictEqual(cut.finishReason, "length")
    }))

  it.effect("a function script sees the prompt and call index, and may fail", () =>
    Effect.gen(function*() {
      const sampler = yield* Sampler.makeScripted((request, call) =>
        call === 1
          ? Sampler.samplerError("Overloaded", "busy")
          : Effect.succeed({ tokenIds: [...request.promptTokenIds].reverse(), logprobs: [-0.5, -0.25] })
      )
      const first = yield* sampler.generate({ promptTokenIds: [1, 2], sampling: params(5) })
      assert.deepStrictEqual(first.tokenIds, [2, 1])
      assert.deepStrictEqual(first.logprobs, [-0.5, -0.25])
      const failed = yield* Effect.flip(sampler.generate({ promptTokenIds: [1, 2], sampling: params(5) }))
      assert.strictEqual(failed.reason._tag, "Overloaded")
      assert.isTrue(failed.isRetryable)
    }))

  it.effect("reads the policy version at every call", () =>
    Effect.gen(function*() {
      const version = yield* Ref.make(3)
      const sampler = yield* Sampler.makeScripted(() => [1], { policyVersion: Ref.get(version) })
      const before = yield* sampler.generate({ promptTokenIds: [], sampling: params(4) })
      yield* Ref.set(version, 4)
      const after = yield* sampler.generate({ promptTokenIds: [], sampling: params(4) })
      assert.deepStrictEqual([before.policyVersion, after.policyVersion], [3, 4])
      assert.strictEqual(yield* sampler.policyVersion, 4)
    }))
})

describe("Sampler.withScriptedSampler", () => {
  const program = Effect.gen(function*() {
    const sampler = yield* Sampler.Sampler
    return yield* sampler.generate({ promptTokenIds: [1], sampling: params(8) })
  })

  it.effect("is dual", () =>
    Effect.gen(function*() {
      const piped = yield* program.pipe(Sampler.withScriptedSampler([[4, 2]]))
      const direct = yield* Sampler.withScriptedSampler(program, [[4, 2]], { policyVersion: 1 })
      assert.deepStrictEqual(piped.tokenIds, [4, 2])
      assert.strictEqual(piped.policyVersion, 0)
      assert.strictEqual(direct.policyVersion, 1)
    }))
})
