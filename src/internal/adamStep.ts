/**
 * AdamW's update loop (`Optimizer.step`), apart from `Optimizer.ts` so that the learner's worker threads load it
 * without Effect: `Optimizer.Config` is a Schema, and the `effect` package entry costs each worker ≈ 6 MB of RSS.
 *
 * Moments are float32, or bfloat16 (`Optimizer.Precision`: 2 bytes each instead of 4). A bfloat16 moment is widened,
 * updated by the same float64 maths, rounded to float32 as before, then narrowed with **stochastic rounding**: with
 * round-to-nearest, v's increments `(1 − β2)·g²` (relative 2e-2 at β2 0.98, 1e-3 at 0.999) fall below bfloat16's
 * resolution (2^-8 relative) and are lost, so v stalls. Stochastic rounding rounds up with the probability of the
 * discarded fraction, so the stored moment is unbiased. Its random bits come from a stateless hash of (step, the
 * element's index over all parameters): the same update gives the same bits on any thread split, in a resumed run and
 * in the uninterrupted one, so runs stay deterministic and resume stays exact.
 */
import * as AdamKernel from "./adamKernel.ts"
import * as NativeKernels from "./nativeKernels.ts"

/** The hyper-parameters the update reads (a structural subset of `Optimizer.Config`). */
export interface Hyper {
  readonly beta1: number
  readonly beta2: number
  readonly eps: number
  readonly weightDecay: number
}

/** How moments are stored: float32, or bfloat16 bits (a float32's upper half) in a `Uint16Array`. */
export type Precision = "float32" | "bfloat16"

/** One parameter's moment: float32 values, or bfloat16 bits (`Uint16Array`). */
export type Moment = Float32Array | Uint16Array

/** Optimiser state (`Optimizer.State`): the step count and first/second moments per parameter. */
export interface State {
  step: number
  readonly m: Map<string, Moment>
  readonly v: Map<string, Moment>
}

/** A moment's storage precision. */
export const precisionOf = (moment: Moment): Precision => (moment instanceof Uint16Array ? "bfloat16" : "float32")

/** A zero moment of `length` elements in `precision`. */
export const zeroMoment = (length: number, precision: Precision): Moment =>
  precision === "bfloat16" ? new Uint16Array(length) : new Float32Array(length)

/** Norms and biases are not decayed. */
export const defaultNoDecay = (name: string): boolean => /norm|bias/.test(name)

/** One AdamW update of every parameter in place (`Optimizer.step`); returns the new step count. */
export const step = (
  params: ReadonlyMap<string, Float32Array>,
  grads: ReadonlyMap<string, Float32Array>,
  state: State,
  lr: number,
  config: Hyper,
  gradScale: number = 1,
  noDecay: (name: string) => boolean = defaultNoDecay,
  offsets?: ReadonlyMap<string, number>
): number => {
  const t = state.step + 1
  const { beta1, beta2, eps } = config
  const c1 = 1 - beta1 ** t
  const c2 = 1 - beta2 ** t
  let offset = 0
  for (const [name, p] of params) {
    const at = offsets?.get(name) ?? offset
    offset += p.length
    const g = grads.get(name)
    if (g === undefined) continue
    const m = state.m.get(name)!
    const v = state.v.get(name)!
    const decay = noDecay(name) ? 0 : lr * config.weightDecay
    const c: AdamKernel.Coefficients = {
      scale: gradScale,
      beta1,
      beta2,
      stepSize: lr / c1,
      invSqrtC2: 1 / Math.sqrt(c2),
      eps,
      keep: 1 - decay
    }
    if (m instanceof Float32Array && v instanceof Float32Array) updateFloat32(p, g, m, v, c)
    else if (m instanceof Uint16Array && v instanceof Uint16Array) updateBfloat16(p, g, m, v, c, t, at)
    else throw new Error(`AdamW: the moments of ${name} are of two precisions`)
  }
  state.step = t
  return t
}

/**
 * One tensor with float32 moments: the native kernel in place (`nativeKernels.ts`), else the WebAssembly kernel,
 * else the scalar loop; all three give the same bits.
 */
const updateFloat32 = (
  p: Float32Array,
  g: Float32Array,
  m: Float32Array,
  v: Float32Array,
  c: AdamKernel.Coefficients
): void => {
  const native = NativeKernels.addon
  if (native !== undefined) return native.adam(p, g, m, v, nativeCoefficients(c), NativeKernels.threads)
  if (kernels !== undefined) return kernels.float32(p, g, m, v, c)
  const { scale, beta1, beta2, stepSize, invSqrtC2, eps, keep } = c
  updateTensor(p, g, m, v, scale, beta1, beta2, stepSize, invSqrtC2, eps, keep)
}

/** Elements widened and narrowed at a time (two float32 scratch arrays of this size per thread). */
const CHUNK = 16384
const mScratch = new Float32Array(CHUNK)
const vScratch = new Float32Array(CHUNK)

/**
 * One tensor with bfloat16 moments: widen, the float32 update (bit-identical to it), narrow with stochastic rounding
 * keyed by step `t` and the element's index over all parameters (`at` + its index here). The native kernel and the
 * WebAssembly one do all three in one pass; without either, the loops below go chunk by chunk.
 */
const updateBfloat16 = (
  p: Float32Array,
  g: Float32Array,
  m: Uint16Array,
  v: Uint16Array,
  c: AdamKernel.Coefficients,
  t: number,
  at: number
) => {
  const hashAt = (seedOf(t) + at) | 0
  const native = NativeKernels.addon
  if (native !== undefined) return native.adam(p, g, m, v, nativeCoefficients(c), NativeKernels.threads, hashAt)
  if (kernels !== undefined) return kernels.bfloat16(p, g, m, v, c, hashAt)
  for (let start = 0; start < p.length; start += CHUNK) {
    const end = Math.min(start + CHUNK, p.length)
    const mf = mScratch.subarray(0, end - start), vf = vScratch.subarray(0, end - start)
    widen(m, start, mf)
    widen(v, start, vf)
    updateFloat32(p.subarray(start, end), g.subarray(start, end), mf, vf, c)
    narrowStochastic(mf, vf, m, v, start, t, at + start)
  }
}

/** bfloat16 bits `src[from, from + dst.length)` into float32 `dst`: the bits are the float's upper half. */
const widen = (src: Uint16Array, from: number, dst: Float32Array) => {
  const bits = new Int32Array(dst.buffer, dst.byteOffset, dst.length)
  for (let i = 0; i < bits.length; i++) bits[i] = src[from + i]! << 16
}

/**
 * Wellons' `lowbias32` (a bijection of 32-bit integers with good avalanche) as a signed 32-bit result: the loops
 * below keep to int32 arithmetic, which V8 runs without boxing.
 */
const mix = (x: number): number => {
  x ^= x >>> 16
  x = Math.imul(x, 0x7feb352d)
  x ^= x >>> 15
  x = Math.imul(x, 0x846ca68b)
  return x ^ (x >>> 16)
}

/**
 * The stateless random stream: 32 bits for element `index` (modulo 2^32) at a step's `seed`.
 *
 * @internal exported for tests
 */
export const hash32 = (x: number): number => mix(x | 0) >>> 0

/**
 * One float32's bits (as a signed 32-bit integer) narrowed to bfloat16 with stochastic rounding: `r` (16 random
 * bits) added below the kept half, so the value rounds away from zero with the probability of the discarded
 * fraction (unbiased). NaN stays NaN; ±Infinity stays infinite (nothing carries out of its zero low half).
 *
 * @internal exported for tests
 */
export const roundStochastic = (u: number, r: number): number =>
  (u & 0x7fffffff) > 0x7f800000 ? ((u >>> 16) | 0x0040) : ((u + r) | 0) >>> 16

/** Step `t`'s offset of the random stream: element `i`'s bits are `mix(seedOf(t) + i)`. */
const seedOf = (t: number): number => mix(Math.imul(t, 0x9e3779b9) ^ 0x5bd1e995)

/**
 * Float32 moments `mf`, `vf` narrowed into `m`, `v` from `from`. One hash a step and element gives both roundings'
 * bits (its low half for m, its high half for v).
 */
const narrowStochastic = (
  mf: Float32Array,
  vf: Float32Array,
  m: Uint16Array,
  v: Uint16Array,
  from: number,
  t: number,
  index: number
) => {
  const mBits = new Int32Array(mf.buffer, mf.byteOffset, mf.length)
  const vBits = new Int32Array(vf.buffer, vf.byteOffset, vf.length)
  const base = (seedOf(t) + index) | 0
  for (let i = 0; i < mBits.length; i++) {
    const r = mix((base + i) | 0)
    m[from + i] = roundStochastic(mBits[i]!, r & 0xffff)
    v[from + i] = roundStochastic(vBits[i]!, r >>> 16)
  }
}

/** The coefficients in the order the native kernel reads them (`NativeKernels.Addon.adam`). */
const nativeCoefficients = (c: AdamKernel.Coefficients): Float64Array =>
  Float64Array.of(c.scale, c.beta1, 1 - c.beta1, c.beta2, 1 - c.beta2, c.stepSize, c.invSqrtC2, c.eps, c.keep)

/** The WebAssembly SIMD kernels (bit-identical to the loops here, several times faster), one instance per thread. */
const kernels = AdamKernel.make()

/** The inner loop, kept monomorphic for speed; used where WebAssembly SIMD is unavailable. */
const updateTensor = (
  p: Float32Array,
  g: Float32Array,
  m: Float32Array,
  v: Float32Array,
  scale: number,
  beta1: number,
  beta2: number,
  stepSize: number,
  invSqrtC2: number,
  eps: number,
  keep: number
): void => {
  const b1c = 1 - beta1
  const b2c = 1 - beta2
  for (let i = 0; i < p.length; i++) {
    const gi = g[i]! * scale
    const mi = beta1 * m[i]! + b1c * gi
    const vi = beta2 * v[i]! + b2c * gi * gi
    m[i] = mi
    v[i] = vi
    const pi = p[i]! * keep // `1 − lr·λ`, computed once as the kernel's is
    p[i] = pi - (stepSize * mi) / (Math.sqrt(vi) * invSqrtC2 + eps)
  }
}
