import { assert, describe, it } from "@effect/vitest"
import * as AdamKernel from "../../../src/internal/adamKernel.ts"

/** The scalar AdamW loop the kernel replaces (as in `Optimizer.ts`), the reference for bit-identity. */
const reference = (p: Float32Array, g: Float32Array, m: Float32Array, v: Float32Array, c: AdamKernel.Coefficients) => {
  const b1c = 1 - c.beta1
  const b2c = 1 - c.beta2
  for (let i = 0; i < p.length; i++) {
    const gi = g[i]! * c.scale
    const mi = c.beta1 * m[i]! + b1c * gi
    const vi = c.beta2 * v[i]! + b2c * gi * gi
    m[i] = mi
    v[i] = vi
    p[i] = p[i]! * c.keep - (c.stepSize * mi) / (Math.sqrt(vi) * c.invSqrtC2 + c.eps)
  }
}

const wave = (n: number, f: number, amplitude: number) =>
  Float32Array.from({ length: n }, (_, i) => Math.sin(i * f + 0.3) * amplitude)

describe("adamKernel", () => {
  it("is bit-identical to the scalar loop, for odd lengths and lengths around its chunk size", () => {
    const kernel = AdamKernel.make()
    assert.isDefined(kernel) // Node 20 has WebAssembly SIMD
    const c = { scale: 0.7, beta1: 0.9, beta2: 0.98, stepSize: 1e-3 / 0.19, invSqrtC2: 7.1, eps: 1e-8, keep: 1 - 1e-5 }
    for (const n of [1, 2, 3, 17, 16383, 16384, 16385, 40001]) {
      const p = wave(n, 1.1, 0.02), g = wave(n, 0.37, 0.01), m = wave(n, 0.7, 1e-3)
      const v = Float32Array.from(wave(n, 0.13, 1e-5), Math.abs)
      const [p2, m2, v2] = [p.slice(), m.slice(), v.slice()]
      for (let step = 0; step < 3; step++) {
        reference(p, g, m, v, c)
        kernel!(p2, g, m2, v2, c)
      }
      for (const [name, a, b] of [["p", p, p2], ["m", m, m2], ["v", v, v2]] as const) {
        assert.isTrue(a.every((x, i) => Object.is(x, b[i])), `${name} differs for n = ${n}`)
      }
    }
  })
})
