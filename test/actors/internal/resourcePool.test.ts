import { assert, describe, it } from "@effect/vitest"
import { Effect, FiberSet } from "effect"
import * as fc from "fast-check"
import * as PoolState from "../../../actors/internal/poolState.ts"
import * as ResourcePool from "../../../actors/internal/resourcePool.ts"
import * as WaitWindow from "../../../actors/internal/waitWindow.ts"
import * as Resource from "../../../src/Resource.ts"

/** The reference: sort, then take the value at nearest rank ceil(q · n). */
const reference = (values: ReadonlyArray<number>, q: number): number => {
  if (values.length === 0) return 0
  const sorted = [...values].sort((a, b) => a - b)
  const rank = Math.min(values.length, Math.max(1, Math.ceil(q * values.length - 1e-9)))
  return sorted[rank - 1]!
}

/** A pool's bare state (nothing started, no sweeps) whose backend is never called: for the synchronous steps. */
const bareState = (max: number) =>
  Effect.gen(function*() {
    const resource = Resource.resource<string>(
      Resource.makeUnsafe({ name: "r", kind: "in-process", pool: { max } }),
      { start: () => Effect.die("not started"), reset: () => Effect.void, health: () => Effect.void }
    )
    return ResourcePool.makeState(resource, undefined, yield* Effect.scope, yield* FiberSet.make<unknown, never>())
  })

describe("resourcePool", () => {
  it.effect("waiters go in arrival order to the latest idle instance, then new starts up to max; none overtakes", () =>
    Effect.gen(function*() {
      const pool = yield* bareState(3)
      const idle = (since: number) => {
        const instance = PoolState.newInstance(pool, undefined)
        instance.state = "idle"
        instance.idleSince = since
        pool.idle.push(instance)
        return instance
      }
      const older = idle(1)
      const newer = idle(2)
      const [a, b, c, d, e] = ["a", "b", "c", "d", "e"].map((key) => {
        const binding = PoolState.newBinding<string>(key)
        pool.waiting.push(binding)
        return binding
      })
      assert.strictEqual(ResourcePool.assignWaiters(pool).length, 3)
      assert.strictEqual(a!.instance, newer)
      assert.strictEqual(b!.instance, older)
      for (const [binding, instance] of [[a!, newer], [b!, older]] as const) {
        assert.strictEqual(binding.status, "assigning")
        assert.strictEqual(instance.state, "leased")
        assert.strictEqual(instance.binding, binding)
      }
      const fresh = c!.instance!
      assert.deepStrictEqual([fresh.state, fresh.binding === c, pool.instances.has(fresh.id)], ["starting", true, true])
      assert.deepStrictEqual(pool.waiting, [d!, e!])
      assert.deepStrictEqual([d!.status, d!.instance], ["waiting", undefined])

      // Full: nobody moves until a slot frees, and then only the head.
      assert.strictEqual(ResourcePool.assignWaiters(pool).length, 0)
      pool.instances.delete(older.id)
      assert.strictEqual(ResourcePool.assignWaiters(pool).length, 1)
      assert.strictEqual(d!.instance!.state, "starting")
      assert.deepStrictEqual(pool.waiting, [e!])

      // A closed pool assigns nothing, even with an instance idle.
      idle(3)
      pool.closed = true
      assert.strictEqual(ResourcePool.assignWaiters(pool).length, 0)
      assert.deepStrictEqual([pool.waiting.length, pool.idle.length], [1, 1])
    }))

  it("quantile equals the sort-based nearest rank, with many ties too, and leaves its input alone", () => {
    const waits = fc.oneof(
      fc.array(fc.double({ min: 0, max: 1e5, noNaN: true }), { maxLength: 300 }),
      fc.array(fc.integer({ min: 0, max: 4 }), { maxLength: 300 }) // mostly ties: the partition's hard case
    )
    const q = fc.oneof(fc.constantFrom(0, 0.5, 0.9, 0.99, 1), fc.double({ min: 0, max: 1, noNaN: true }))
    fc.assert(fc.property(waits, q, (values, q) => {
      const copy = [...values]
      assert.strictEqual(WaitWindow.quantile(Float64Array.from(values), q), reference(values, q))
      assert.deepStrictEqual(values, copy)
    }), { numRuns: 2_000 })
  })

  it("quantile by hand: the lower median, p99 of 100 values, none gives 0", () => {
    assert.strictEqual(WaitWindow.quantile([3, 1, 2, 4], 0.5), 2)
    assert.strictEqual(WaitWindow.quantile(Array.from({ length: 100 }, (_, i) => 100 - i), 0.99), 99)
    assert.strictEqual(WaitWindow.quantile(Array.from({ length: 100 }, (_, i) => i + 1), 0.07), 7)
    assert.strictEqual(WaitWindow.quantile([], 0.5), 0)
  })

  it("the wait window keeps the most recent waits only", () => {
    const window = WaitWindow.makeWaitWindow(4)
    assert.strictEqual(WaitWindow.waits(window).length, 0)
    for (const millis of [100, 100, 100, 100, 1, 2, 3]) WaitWindow.recordWait(window, millis)
    assert.deepStrictEqual([...WaitWindow.waits(window)].sort((a, b) => a - b), [1, 2, 3, 100])
    WaitWindow.recordWait(window, 4)
    assert.deepStrictEqual([...WaitWindow.waits(window)].sort((a, b) => a - b), [1, 2, 3, 4])
    assert.strictEqual(WaitWindow.waitWindowSize, 1024)
    assert.strictEqual(WaitWindow.makeWaitWindow().values.length, 1024)
  })
})
