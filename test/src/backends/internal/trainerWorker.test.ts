import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import * as TrainerWorker from "../../../../src/backends/internal/trainerWorker.ts"
import * as Optimizer from "../../../../src/Optimizer.ts"
import * as Sampling from "../../../../src/Sampling.ts"

/** Parameters of the given sizes laid out one after another, as the trainer lays them out in shared memory. */
const layoutOf = (sizes: ReadonlyArray<number>): TrainerWorker.Layout => ({
  names: sizes.map((_, i) => (i % 3 === 0 ? `layers.${i}.norm.weight` : `layers.${i}.proj.weight`)),
  offsets: sizes.map((_, i) => sizes.slice(0, i).reduce((a, b) => a + b, 0)),
  lengths: sizes,
  total: sizes.reduce((a, b) => a + b, 0)
})

const random = (n: number, seed: number, scale = 1) => {
  const r = Sampling.rng(seed)
  return Float32Array.from({ length: n }, () => Sampling.normal(r) * scale)
}

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("base64")

const slices = (total: number, workers: number) =>
  Array.from({ length: workers }, (_, j) => [Math.floor(total * j / workers), Math.floor(total * (j + 1) / workers)])

describe("trainerWorker", () => {
  it("AdamW over the workers' disjoint slices is bit-identical to Optimizer.step over every parameter", () => {
    fc.assert(fc.property(
      fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 6 }),
      fc.integer({ min: 2, max: 4 }),
      fc.integer({ min: 0, max: 5 }),
      fc.integer({ min: 0, max: 1000 }),
      (sizes, workers, step, seed) => {
        const layout = layoutOf(sizes)
        const config = { ...Optimizer.defaultConfig, weightDecay: 0.01 }
        const flat = { p: random(layout.total, seed), g: random(layout.total, seed + 1, 0.1) }
        const m = random(layout.total, seed + 2, 0.01)
        const v = Float32Array.from(random(layout.total, seed + 3, 0.01), (x) => x * x)
        // reference: one call over whole tensors (copies)
        const whole = (a: Float32Array) => TrainerWorker.sliceViews(Float32Array.from(a), layout, 0, layout.total)
        const params = whole(flat.p)
        const state = { step, m: whole(m), v: whole(v) }
        Optimizer.step(params, whole(flat.g), state, 1e-3, config, 0.5)
        // workers: one call per slice, in place over the flat arrays
        for (const [start, end] of slices(layout.total, workers)) {
          const view = (a: Float32Array) => TrainerWorker.sliceViews(a, layout, start!, end!)
          Optimizer.step(view(flat.p), view(flat.g), { step, m: view(m), v: view(v) }, 1e-3, config, 0.5)
        }
        layout.names.forEach((name, i) => {
          const at = layout.offsets[i]!
          const len = layout.lengths[i]!
          assert.strictEqual(bits(flat.p.subarray(at, at + len)), bits(params.get(name)!), name)
          assert.strictEqual(bits(m.subarray(at, at + len)), bits(state.m.get(name)!), name)
          assert.strictEqual(bits(v.subarray(at, at + len)), bits(state.v.get(name)!), name)
        })
      }
    ))
  })

  it("sumSlices adds the sources in order over the slice only; the slices' norms give the global norm", () => {
    const layout = layoutOf([7, 30, 5, 18])
    const sources = [random(layout.total, 1), random(layout.total, 2), random(layout.total, 3)]
    const dst = new Float32Array(layout.total).fill(99)
    const [start, end] = [10, 41]
    const [a, b, c] = sources as [Float32Array, Float32Array, Float32Array]
    for (const used of [[a], [a, b], [a, b, c]]) {
      const sq = TrainerWorker.sumSlices(dst, used, start, end)
      for (let i = 0; i < layout.total; i++) {
        const expected = i >= start && i < end ? used.slice(1).reduce((x, s) => Math.fround(x + s[i]!), a[i]!) : 99
        assert.strictEqual(dst[i], expected, `element ${i}`)
      }
      // The returned sum of squares is exactly the squared norm of the slice's views.
      assert.strictEqual(Math.sqrt(sq), Optimizer.globalNorm(TrainerWorker.sliceViews(dst, layout, start, end)))
    }
    assert.strictEqual(TrainerWorker.sumSlices(dst, [], start, end), 0)
    assert.isTrue(dst.subarray(start, end).every((x) => x === 0))
    const grads = random(layout.total, 4)
    const norms = slices(layout.total, 3).map(([s, e]) =>
      Optimizer.globalNorm(TrainerWorker.sliceViews(grads, layout, s!, e!))
    )
    const global = Optimizer.globalNorm(TrainerWorker.sliceViews(grads, layout, 0, layout.total))
    assert.approximately(Math.sqrt(norms.reduce((a, n) => a + n * n, 0)), global, 1e-12 * global)
  })
})
