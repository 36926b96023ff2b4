import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import * as ResourcePool from "../../../actors/internal/resourcePool.ts"

/** The reference: sort, then take the value at nearest rank ceil(q · n). */
const reference = (values: ReadonlyArray<number>, q: number): number => {
  if (values.length === 0) return 0
  const sorted = [...values].sort((a, b) => a - b)
  const rank = Math.min(values.length, Math.max(1, Math.ceil(q * values.length - 1e-9)))
  return sorted[rank - 1]!
}

describe("resourcePool", () => {
  it("quantile equals the sort-based nearest rank, with many ties too, and leaves its input alone", () => {
    const waits = fc.oneof(
      fc.array(fc.double({ min: 0, max: 1e5, noNaN: true }), { maxLength: 300 }),
      fc.array(fc.integer({ min: 0, max: 4 }), { maxLength: 300 }) // mostly ties: the partition's hard case
    )
    const q = fc.oneof(fc.constantFrom(0, 0.5, 0.9, 0.99, 1), fc.double({ min: 0, max: 1, noNaN: true }))
    fc.assert(fc.property(waits, q, (values, q) => {
      const copy = [...values]
      assert.strictEqual(ResourcePool.quantile(Float64Array.from(values), q), reference(values, q))
      assert.deepStrictEqual(values, copy)
    }), { numRuns: 2_000 })
  })

  it("quantile by hand: the lower median, p99 of 100 values, none gives 0", () => {
    assert.strictEqual(ResourcePool.quantile([3, 1, 2, 4], 0.5), 2)
    assert.strictEqual(ResourcePool.quantile(Array.from({ length: 100 }, (_, i) => 100 - i), 0.99), 99)
    assert.strictEqual(ResourcePool.quantile(Array.from({ length: 100 }, (_, i) => i + 1), 0.07), 7)
    assert.strictEqual(ResourcePool.quantile([], 0.5), 0)
  })

  it("the wait window keeps the most recent waits only", () => {
    const window = ResourcePool.makeWaitWindow(4)
    assert.strictEqual(ResourcePool.waits(window).length, 0)
    for (const millis of [100, 100, 100, 100, 1, 2, 3]) ResourcePool.recordWait(window, millis)
    assert.deepStrictEqual([...ResourcePool.waits(window)].sort((a, b) => a - b), [1, 2, 3, 100])
    ResourcePool.recordWait(window, 4)
    assert.deepStrictEqual([...ResourcePool.waits(window)].sort((a, b) => a - b), [1, 2, 3, 4])
    assert.strictEqual(ResourcePool.waitWindowSize, 1024)
    assert.strictEqual(ResourcePool.makeWaitWindow().values.length, 1024)
  })
})
