import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Ref, Schema, Scope } from "effect"
import { Environment } from "../../src/index.ts"

class Counter extends Context.Service<Counter, {
  readonly id: number
  readonly incr: Effect.Effect<number>
}>()("test/Counter") {}

/** Each build gets a new id and a counter; `events` records acquire/release. */
const counterLayer = (events: Array<string>) => {
  let built = 0
  return Layer.effect(
    Counter,
    Effect.gen(function*() {
      const id = ++built
      const state = yield* Ref.make(0)
      events.push(`acquire ${id}`)
      yield* Effect.addFinalizer(() => Effect.sync(() => events.push(`release ${id}`)))
      return Counter.of({ id, incr: Ref.updateAndGet(state, (n) => n + 1) })
    })
  )
}

const chain = (chainId: string, groupId = "g") => ({ chainId, groupId })

const useIn = <ROut, E>(provider: Environment.Provider<ROut, E>, info: { chainId: string; groupId: string }) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const context = yield* Scope.provide(provider.acquire(info), scope)
    return { context, close: Scope.close(scope, Exit.void) }
  })

describe("Environment", () => {
  it.effect("perChain: one instance per chain, shared by calls of that chain, released with the chain", () =>
    Effect.gen(function*() {
      const events: Array<string> = []
      const provider = Environment.perChain(counterLayer(events))
      const a = yield* useIn(provider, chain("a"))
      const b = yield* useIn(provider, chain("b"))
      const counterA = Context.get(a.context, Counter)
      const counterB = Context.get(b.context, Counter)
      assert.notStrictEqual(counterA.id, counterB.id)
      // two calls in chain a see the same state; chain b is untouched
      assert.strictEqual(yield* counterA.incr, 1)
      assert.strictEqual(yield* Context.get(a.context, Counter).incr, 2)
      assert.strictEqual(yield* counterB.incr, 1)
      yield* a.close
      assert.deepStrictEqual(events, ["acquire 1", "acquire 2", "release 1"])
      yield* b.close
      assert.deepStrictEqual(events.slice(3), ["release 2"])
      assert.strictEqual(provider.sharing, "perChain")
    }))

  it.effect("perGroup: chains of one group share an instance; other groups do not; released after the last", () =>
    Effect.gen(function*() {
      const events: Array<string> = []
      const provider = yield* Environment.perGroup(counterLayer(events))
      const a1 = yield* useIn(provider, chain("a1", "A"))
      const a2 = yield* useIn(provider, chain("a2", "A"))
      const b1 = yield* useIn(provider, chain("b1", "B"))
      assert.strictEqual(Context.get(a1.context, Counter).id, Context.get(a2.context, Counter).id)
      assert.notStrictEqual(Context.get(a1.context, Counter).id, Context.get(b1.context, Counter).id)
      yield* Context.get(a1.context, Counter).incr
      assert.strictEqual(yield* Context.get(a2.context, Counter).incr, 2)
      yield* a1.close
      assert.deepStrictEqual(events, ["acquire 1", "acquire 2"])
      yield* a2.close
      assert.deepStrictEqual(events, ["acquire 1", "acquire 2", "release 1"])
      yield* b1.close
    }))

  it.effect("shared: one instance for every chain, released with the run scope", () =>
    Effect.gen(function*() {
      const events: Array<string> = []
      const runScope = yield* Scope.make()
      const provider = yield* Scope.provide(Environment.shared(counterLayer(events)), runScope)
      const a = yield* useIn(provider, chain("a"))
      const b = yield* useIn(provider, chain("b", "other"))
      assert.strictEqual(Context.get(a.context, Counter).id, Context.get(b.context, Counter).id)
      yield* a.close
      yield* b.close
      assert.deepStrictEqual(events, ["acquire 1"])
      yield* Scope.close(runScope, Exit.void)
      assert.deepStrictEqual(events, ["acquire 1", "release 1"])
    }))

  it.effect("all merges the contexts of several providers", () =>
    Effect.gen(function*() {
      class Name extends Context.Service<Name, string>()("test/Name") {}
      const events: Array<string> = []
      const provider = Environment.all([
        Environment.perChain(counterLayer(events)),
        Environment.perChain(Layer.succeed(Name, "calc"))
      ])
      const a = yield* useIn(provider, chain("a"))
      assert.strictEqual(Context.get(a.context, Name), "calc")
      assert.strictEqual(Context.get(a.context, Counter).id, 1)
      assert.strictEqual(provider.sharing, "perChain")
      assert.isTrue(Environment.isProvider(provider))
      yield* a.close
      assert.deepStrictEqual(events, ["acquire 1", "release 1"])
    }))

  it("EnvError exposes its reason and whether it is retryable", () => {
    const crashed = Environment.envError("py", "exec", "Crashed", "exit 137")
    const invalid = Environment.envError("py", "exec", "InvalidAction", "no")
    assert.isTrue(crashed.isRetryable)
    assert.isFalse(invalid.isRetryable)
  })

  it.effect("an EnvError's reason is caught by its tag, and it round-trips through JSON with its cause", () =>
    Effect.gen(function*() {
      const down = Environment.envError("py", "run", "Unavailable", "no sandbox", { cause: new Error("pool closed") })
      const caught = yield* Effect.fail(down).pipe(
        Effect.catchReason("EnvError", "Unavailable", (reason, error) =>
          Effect.succeed(`${error.env}: ${reason.message}`))
      )
      assert.strictEqual(caught, "py: no sandbox")
      const timeout = Environment.envError("py", "exec", "Timeout", "no reply in 5 ms", { timeoutMs: 5 })
      assert.strictEqual(timeout.reason._tag === "Timeout" && timeout.reason.timeoutMs, 5)
      // A tool's failure Schema encodes it into the trajectory: the reason, its facts and its cause's message survive.
      const codec = Schema.toCodecJson(Environment.EnvError)
      const back = Schema.decodeUnknownSync(codec)(JSON.parse(JSON.stringify(Schema.encodeSync(codec)(down))))
      assert.instanceOf(back.reason, Environment.Unavailable)
      assert.strictEqual(back.message, "no sandbox")
      assert.strictEqual((back.reason.cause as Error).message, "pool closed")
      assert.isTrue(back.isRetryable)
    }))
})
