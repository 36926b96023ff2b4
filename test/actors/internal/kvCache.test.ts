import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import * as KvCache from "../../../actors/internal/kvCache.ts"

// A reference model: each row is a list of tokens, each token one [H × D] vector per buffer name.
type Token = ReadonlyArray<Float32Array>

const Op = fc.oneof(
  fc.record({
    op: fc.constant("join" as const),
    fills: fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 3 })
  }),
  fc.record({ op: fc.constant("step" as const) }),
  fc.record({ op: fc.constant("leave" as const), pick: fc.nat() }),
  // The engine closes: its memory goes to the pool, stale values and all, and the next engine's cache takes it.
  fc.record({ op: fc.constant("release" as const) })
)

describe("kvCache", () => {
  it(
    "joins, decode steps, removals and caches made from pooled memory keep every row's tokens in its leading slots " +
      "(model-based property)",
    () => {
      fc.assert(fc.property(
        fc.integer({ min: 1, max: 3 }), // heads
        fc.integer({ min: 1, max: 3 }), // head dim
        fc.array(Op, { minLength: 1, maxLength: 40 }),
        (H, D, ops) => {
          const names = ["a", "b"], maxRows = 6
          let cache = KvCache.make(names.length, H, D, maxRows)
          let next = 1
          const token = (): Token => names.map(() => Float32Array.from({ length: H * D }, () => next++))
          const rows: Array<Array<Token>> = []
          for (const o of ops) {
            if (o.op === "join") {
              const fills = o.fills.slice(0, maxRows - rows.length)
              if (fills.length === 0) continue
              // A prefill's output: right-aligned rows of length max(fills), junk in the padding.
              const length = Math.max(...fills)
              const joined = fills.map((n) => Array.from({ length: n }, token))
              const fresh = names.map((_, k) => {
                const out = new Float32Array(fills.length * H * length * D).fill(-1)
                joined.forEach((tokens, i) =>
                  tokens.forEach((t, j) => {
                    for (let h = 0; h < H; h++) {
                      out.set(
                        t[k]!.subarray(h * D, (h + 1) * D),
                        ((i * H + h) * length + length - tokens.length + j) * D
                      )
                    }
                  })
                )
                return out
              })
              KvCache.fit(cache, Math.max(length, ...rows.map((r) => r.length)) + 1, rows.map((r) => r.length))
              KvCache.append(cache, fresh, length, joined.map((t, index) => ({ index, filled: t.length })))
              rows.push(...joined)
            } else if (o.op === "step") {
              if (rows.length === 0) continue
              KvCache.fit(cache, Math.max(...rows.map((r) => r.length)) + 1, rows.map((r) => r.length))
              const tokens = rows.map(() => token())
              const fresh = names.map((_, k) => {
                const out = new Float32Array(rows.length * H * D)
                tokens.forEach((t, r) => out.set(t[k]!, r * H * D))
                return out
              })
              KvCache.write(cache, fresh, rows.map((r) => r.length))
              rows.forEach((r, i) => r.push(tokens[i]!))
            } else if (o.op === "release") {
              KvCache.release(cache)
              assert.strictEqual(cache.rows, 0)
              cache = KvCache.make(names.length, H, D, maxRows)
              rows.length = 0
            } else {
              if (rows.length === 0) continue
              const i = o.pick % rows.length
              KvCache.remove(cache, i)
              rows[i] = rows[rows.length - 1]!
              rows.pop()
            }
            // Every row's tokens, in order, in the leading slots of the views the graph is fed.
            assert.strictEqual(cache.rows, rows.length)
            const T = cache.capacity
            assert.isTrue(T % 32 === 0 && rows.every((r) => r.length <= T), `capacity ${T} holds every row`)
            KvCache.views(cache).forEach((view, k) => {
              assert.deepStrictEqual(view.dims, [rows.length, H, T, D])
              assert.strictEqual(view.data.length, rows.length * H * T * D)
              rows.forEach((tokens, r) =>
                tokens.forEach((t, j) => {
                  for (let h = 0; h < H; h++) {
                    const at = ((r * H + h) * T + j) * D
                    assert.deepStrictEqual(view.data.subarray(at, at + D), t[k]!.subarray(h * D, (h + 1) * D))
                  }
                })
              )
            })
          }
        }
      ))
    }
  )

  it("the capacity grows and shrinks in chunks", () => {
    const cache = KvCache.make(1, 1, 1, 2)
    KvCache.fit(cache, 1, [])
    assert.strictEqual(cache.capacity, 32)
    KvCache.fit(cache, 33, [])
    assert.strictEqual(cache.capacity, 64)
    KvCache.fit(cache, 40, [])
    assert.strictEqual(cache.capacity, 64, "less than two unused chunks: kept")
    KvCache.fit(cache, 100, [])
    KvCache.fit(cache, 20, [])
    assert.strictEqual(cache.capacity, 32, "shrunk once two chunks or more are unused")
  })
})
