import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import { rebatch } from "../../../actors/internal/kvCache.ts"

/** Reference: the value of row `r`, head `h`, slot `t`, dim `d` of a right-aligned cache, by explicit indexing. */
const at = (data: Float32Array, H: number, T: number, D: number, r: number, h: number, t: number, d: number) =>
  data[((r * H + h) * T + t) * D + d]!

describe("kvCache.rebatch", () => {
  it("copies each kept row's filled slots right-aligned and zero-fills the padding (property)", () => {
    fc.assert(fc.property(
      fc.integer({ min: 1, max: 3 }), // heads
      fc.integer({ min: 1, max: 3 }), // head dim
      fc.array(
        fc.record({ batch: fc.integer({ min: 1, max: 4 }), length: fc.integer({ min: 0, max: 6 }) }),
        { minLength: 1, maxLength: 3 }
      ),
      fc.integer(),
      (H, D, shapes, seed) => {
        let x = seed
        const parts = shapes.map(({ batch, length }) => {
          const data = Float32Array.from(
            { length: batch * H * length * D },
            () => (x = (x * 1103515245 + 12345) | 0) % 1000
          )
          const rows = Array.from({ length: batch }, (_, i) => ({
            index: i,
            filled: Math.max(0, length - ((i * 7 + seed) & 3))
          }))
            .filter((_, i) => (i + seed) % 3 !== 0)
          return { data, length, rows }
        })
        const length = parts.flatMap((p) => p.rows).reduce((m, r) => Math.max(m, r.filled), 0)
        const out = rebatch(parts, H, D, length)
        let r = 0
        for (const part of parts) {
          for (const row of part.rows) {
            for (let h = 0; h < H; h++) {
              for (let t = 0; t < length; t++) {
                for (let d = 0; d < D; d++) {
                  const pad = length - row.filled
                  const source = part.length - row.filled + (t - pad)
                  const expected = t < pad ? 0 : at(part.data, H, part.length, D, row.index, h, source, d)
                  assert.strictEqual(at(out, H, length, D, r, h, t, d), expected)
                }
              }
            }
            r++
          }
        }
        assert.strictEqual(out.length, r * H * length * D)
      }
    ))
  })
})
