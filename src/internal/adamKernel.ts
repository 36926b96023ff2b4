/**
 * The AdamW inner loop (`Optimizer.step`) as a small WebAssembly SIMD kernel: two lanes of float64 per instruction,
 * the same operations in the same order as the scalar loop, so the results are bit-identical to it (no fused
 * multiply-add; float32 ↔ float64 conversions round to nearest like typed-array stores). V8 runs the scalar loop at
 * ≈ 10 ns per parameter (four loads, three stores, a square root and a division in float64); the kernel processes
 * the tensors in chunks copied through its own memory.
 *
 * The module is assembled here from its bytes (no build step); where WebAssembly SIMD is unavailable,
 * {@link make} returns undefined and the caller keeps the scalar loop.
 */

/** Floats per chunk: four arrays of this size live in the kernel's memory (256 KiB, within a core's L2). */
const CHUNK = 16384

/** The hyper-parameters of one update, as `Optimizer.step` derives them. */
export interface Coefficients {
  readonly scale: number
  readonly beta1: number
  readonly beta2: number
  readonly stepSize: number
  readonly invSqrtC2: number
  readonly eps: number
  /** `1 − lr·λ` (1 without decay). */
  readonly keep: number
}

/** Updates `p`, `m`, `v` in place from `g` (all of one length). */
export type Kernel = (
  p: Float32Array,
  g: Float32Array,
  m: Float32Array,
  v: Float32Array,
  c: Coefficients
) => void

// ===== Assembly =====

const leb = (n: number): Array<number> => {
  const out: Array<number> = []
  do {
    let byte = n & 0x7f
    n >>>= 7
    if (n !== 0) byte |= 0x80
    out.push(byte)
  } while (n !== 0)
  return out
}

const section = (id: number, body: Array<number>) => [id, ...leb(body.length), ...body]
const vec = (items: Array<Array<number>>) => [...leb(items.length), ...items.flat()]
const name = (s: string) => [...leb(s.length), ...Array.from(s, (ch) => ch.charCodeAt(0))]

const I32 = 0x7f, F64 = 0x7c, V128 = 0x7b
const get = (i: number) => [0x20, ...leb(i)]
const set = (i: number) => [0x21, ...leb(i)]
const simd = (op: number) => [0xfd, ...leb(op)]
const memarg = [3, 0] // 8-byte alignment, no offset
const op = {
  load64Zero: [...simd(0x5d), ...memarg],
  store64Lane0: [...simd(0x5b), ...memarg, 0],
  promote: simd(0x5f),
  demote: simd(0x5e),
  splat: simd(0x14),
  sqrt: simd(0xef),
  add: simd(0xf0),
  sub: simd(0xf1),
  mul: simd(0xf2),
  div: simd(0xf3)
}

// Parameters: 0 p, 1 g, 2 m, 3 v (byte offsets), 4 n (floats, even), 5–13 scale, beta1, b1c, beta2, b2c,
// stepSize, invSqrtC2, eps, keep. Locals: 14 i, 15 end (byte offsets), 16–24 the splatted coefficients, 25 gi,
// 26 mi, 27 vi.
const P = 0, G = 1, M = 2, Vv = 3, N = 4, I = 14, END = 15, S = 16, GI = 25, MI = 26, VI = 27
const splatted = (k: number) => get(S + k) // k: 0 scale, 1 beta1, 2 b1c, 3 beta2, 4 b2c, 5 step, 6 inv, 7 eps, 8 keep
const lanes = (base: number) => [...get(base), ...get(I), 0x6a, ...op.load64Zero, ...op.promote]
const storeTo = (base: number, value: Array<number>) => [
  ...get(base), ...get(I), 0x6a, ...value, ...op.demote, ...op.store64Lane0
]

const body = [
  ...Array.from({ length: 9 }, (_, k) => [...get(5 + k), ...op.splat, ...set(S + k)]).flat(),
  ...get(N), 0x41, 4, 0x6c, ...set(END), // end = n · 4
  0x41, 0, ...set(I),
  0x02, 0x40, 0x03, 0x40, // block, loop
  ...get(I), ...get(END), 0x4f, 0x0d, 1, // i ≥ end: break
  // gi = g · scale
  ...lanes(G), ...splatted(0), ...op.mul, ...set(GI),
  // mi = beta1 · m + b1c · gi
  ...splatted(1), ...lanes(M), ...op.mul, ...splatted(2), ...get(GI), ...op.mul, ...op.add, ...set(MI),
  // vi = beta2 · v + (b2c · gi) · gi
  ...splatted(3), ...lanes(Vv), ...op.mul, ...splatted(4), ...get(GI), ...op.mul, ...get(GI), ...op.mul, ...op.add,
  ...set(VI),
  ...storeTo(M, get(MI)),
  ...storeTo(Vv, get(VI)),
  // p = p · keep − (stepSize · mi) / (√vi · invSqrtC2 + eps)
  ...storeTo(P, [
    ...lanes(P), ...splatted(8), ...op.mul,
    ...splatted(5), ...get(MI), ...op.mul,
    ...get(VI), ...op.sqrt, ...splatted(6), ...op.mul, ...splatted(7), ...op.add,
    ...op.div, ...op.sub
  ]),
  ...get(I), 0x41, 8, 0x6a, ...set(I), // two floats per iteration
  0x0c, 0, 0x0b, 0x0b, // br loop; end loop; end block
  0x0b
]

const moduleBytes = (): Uint8Array<ArrayBuffer> => {
  const params = [I32, I32, I32, I32, I32, ...Array.from({ length: 9 }, () => F64)]
  const locals = vec([[2, I32], [12, V128]])
  const code = [...locals, ...body]
  return Uint8Array.from([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, vec([[0x60, ...vec(params.map((t) => [t])), 0]])),
    ...section(3, vec([[0]])),
    ...section(5, vec([[0x00, (CHUNK * 16) / 65536 + 1]])),
    ...section(7, vec([[...name("adam"), 0x00, 0], [...name("memory"), 0x02, 0]])),
    ...section(10, vec([[...leb(code.length), ...code]]))
  ])
}

// ===== Constructors =====

/**
 * A kernel instance (its own memory; one per thread), or undefined where WebAssembly SIMD is unavailable.
 */
export const make = (): Kernel | undefined => {
  const bytes = moduleBytes()
  if (typeof WebAssembly === "undefined" || !WebAssembly.validate(bytes)) return undefined
  const instance = new WebAssembly.Instance(new WebAssembly.Module(bytes))
  const adam = instance.exports["adam"] as (...args: Array<number>) => void
  const memory = instance.exports["memory"] as WebAssembly.Memory
  const view = new Float32Array(memory.buffer, 0, CHUNK * 4)
  const [pAt, gAt, mAt, vAt] = [0, 1, 2, 3].map((k) => k * CHUNK)
  return (p, g, m, v, c) => {
    for (let start = 0; start < p.length; start += CHUNK) {
      const end = Math.min(start + CHUNK, p.length)
      const n = end - start
      view.set(p.subarray(start, end), pAt!)
      view.set(g.subarray(start, end), gAt!)
      view.set(m.subarray(start, end), mAt!)
      view.set(v.subarray(start, end), vAt!)
      // An odd count: the last pair's second lane reads and writes past the data, which is not copied back.
      adam(pAt! * 4, gAt! * 4, mAt! * 4, vAt! * 4, n + (n & 1), c.scale, c.beta1, 1 - c.beta1, c.beta2, 1 - c.beta2,
        c.stepSize, c.invSqrtC2, c.eps, c.keep)
      p.set(view.subarray(pAt!, pAt! + n), start)
      m.set(view.subarray(mAt!, mAt! + n), start)
      v.set(view.subarray(vAt!, vAt! + n), start)
    }
  }
}
