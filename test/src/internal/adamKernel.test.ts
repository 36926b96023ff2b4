import { assert, describe, it } from "@effect/vitest"
import * as AdamKernel from "../../../src/internal/adamKernel.ts"
import { bfloat16, reference, reference16, wave, withSpecialValues } from "../../utils/adamReference.ts"

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
        kernel!.float32(p2, g, m2, v2, c)
      }
      for (const [name, a, b] of [["p", p, p2], ["m", m, m2], ["v", v, v2]] as const) {
        assert.isTrue(a.every((x, i) => Object.is(x, b[i])), `${name} differs for n = ${n}`)
      }
    }
  })

  it("with bfloat16 moments, is bit-identical to widening, the scalar loop and stochastic narrowing", () => {
    const kernel = AdamKernel.make()!
    const c = { scale: 0.7, beta1: 0.9, beta2: 0.98, stepSize: 1e-3 / 0.19, invSqrtC2: 7.1, eps: 1e-8, keep: 1 - 1e-5 }
    for (const [n, hashAt] of [[1, 0], [2, -5], [3, 2 ** 31 - 2], [17, 12345], [16383, 7], [16384, -1], [16385, 99],
      [40001, 0x7fff0000 | 0]] as const) {
      const p = wave(n, 1.1, 0.02), g = wave(n, 0.37, 0.01)
      withSpecialValues(g)
      const m = bfloat16(wave(n, 0.7, 1e-3)), v = bfloat16(Float32Array.from(wave(n, 0.13, 1e-5), Math.abs))
      const [p2, m2, v2] = [p.slice(), m.slice(), v.slice()]
      for (let step = 0; step < 3; step++) {
        reference16(p, g, m, v, c, hashAt + step)
        kernel.bfloat16(p2, g, m2, v2, c, hashAt + step)
      }
      assert.isTrue(p.every((x, i) => Object.is(x, p2[i])), `p differs for n = ${n}`)
      assert.deepStrictEqual([...m2], [...m], `m differs for n = ${n}`)
      assert.deepStrictEqual([...v2], [...v], `v differs for n = ${n}`)
    }
  })
})
