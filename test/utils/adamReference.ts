/** The scalar AdamW loops the kernels replace, the references of their bit-identity tests. */
import type * as AdamKernel from "../../src/internal/adamKernel.ts"
import * as AdamStep from "../../src/internal/adamStep.ts"

/** The scalar AdamW loop (as in `adamStep.ts`). */
export const reference = (
  p: Float32Array,
  g: Float32Array,
  m: Float32Array,
  v: Float32Array,
  c: AdamKernel.Coefficients
) => {
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

/** bfloat16 moments the way `AdamStep` updates them without a kernel: widen, the scalar loop, narrow. */
export const reference16 = (
  p: Float32Array,
  g: Float32Array,
  m: Uint16Array,
  v: Uint16Array,
  c: AdamKernel.Coefficients,
  hashAt: number
) => {
  const widen = (bits: Uint16Array) => new Float32Array(Uint32Array.from(bits, (b) => b << 16).buffer)
  const mf = widen(m), vf = widen(v)
  reference(p, g, mf, vf, c)
  const mBits = new Int32Array(mf.buffer), vBits = new Int32Array(vf.buffer)
  for (let i = 0; i < p.length; i++) {
    const r = AdamStep.hash32((hashAt + i) | 0) | 0
    m[i] = AdamStep.roundStochastic(mBits[i]!, r & 0xffff)
    v[i] = AdamStep.roundStochastic(vBits[i]!, r >>> 16)
  }
}

/** float32 values as bfloat16 bits (truncated). */
export const bfloat16 = (x: Float32Array) => Uint16Array.from(new Uint32Array(x.buffer), (u) => u >>> 16)

/** A deterministic test signal. */
export const wave = (n: number, f: number, amplitude: number) =>
  Float32Array.from({ length: n }, (_, i) => Math.sin(i * f + 0.3) * amplitude)

/** `g` with the gradients a kernel must carry through like the loop: NaN, +∞, 0, a denormal, a huge value. */
export const withSpecialValues = (g: Float32Array): Float32Array => {
  for (const [i, x] of [[0, NaN], [2, Infinity], [9, 0], [11, 1e-41], [13, 3e38]] as const) if (i < g.length) g[i] = x
  return g
}
