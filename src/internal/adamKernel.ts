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

/**
 * The same update with bfloat16 moments (`Uint16Array` bits): widened, updated, narrowed with `AdamStep`'s
 * stochastic rounding, element `i` drawing `AdamStep.hash32`'s mix of `hashAt + i`.
 */
export type Kernel16 = (
  p: Float32Array,
  g: Float32Array,
  m: Uint16Array,
  v: Uint16Array,
  c: Coefficients,
  hashAt: number
) => void

/** Both kernels over one instance's memory. */
export interface Kernels {
  readonly float32: Kernel
  readonly bfloat16: Kernel16
}

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
  div: simd(0xf3),
  load32Zero: [...simd(0x5c), 2, 0],
  store32Lane0: [...simd(0x5a), 2, 0, 0],
  extendLowU16: simd(0xa9),
  narrowU: simd(0x86),
  i32splat: simd(0x11),
  shl: simd(0xab),
  shrU: simd(0xad),
  i32add: simd(0xae),
  i32mul: simd(0xb5),
  gtS: simd(0x3b),
  and: simd(0x4e),
  or: simd(0x50),
  xor: simd(0x51),
  bitselect: simd(0x52)
}

/** A signed LEB128 (`i32.const`'s immediate). */
const sleb = (n: number): Array<number> => {
  const out: Array<number> = []
  for (;;) {
    const byte = n & 0x7f
    n >>= 7
    if ((n === 0 && (byte & 0x40) === 0) || (n === -1 && (byte & 0x40) !== 0)) return [...out, byte]
    out.push(byte | 0x80)
  }
}
const i32const = (n: number) => [0x41, ...sleb(n | 0)]
const splatI32 = (n: number) => [...i32const(n), ...op.i32splat]
const v128 = (...lanes: Array<number>) => [
  ...simd(0x0c),
  ...lanes.flatMap((x) => [x & 0xff, (x >>> 8) & 0xff, (x >>> 16) & 0xff, (x >>> 24) & 0xff])
]
const xorShift = (local: number, by: number) => [
  ...get(local), ...get(local), ...i32const(by), ...op.shrU, ...op.xor, ...set(local)
]

// Both functions take 0 p, 1 g, 2 m, 3 v (byte offsets), 4 n (floats, even), 5–13 scale, beta1, b1c, beta2, b2c,
// stepSize, invSqrtC2, eps, keep; `adam16` also 14 the hash input of its first element. Locals (after the
// parameters): I, END (byte offsets of float32s), J (of bfloat16s), H (hash input), then nine splatted coefficients,
// gi, mi, vi and the pair's random bits.
const P = 0, G = 1, M = 2, Vv = 3, N = 4
const splat = (k: number) => [...get(5 + k), ...op.splat] // k: 0 scale, 1 beta1, … 8 keep (see above)

/** The loop over pairs of elements; `bf16`: moments are bfloat16 bits, widened and narrowed stochastically. */
const body = (bf16: boolean) => {
  const first = bf16 ? 15 : 14
  const I = first, END = first + 1, J = first + 2, H = first + 3, S = first + 4
  const GI = S + 9, MI = S + 10, VI = S + 11, R = S + 12
  const splatted = (k: number) => get(S + k)
  const float32s = (base: number) => [...get(base), ...get(I), 0x6a]
  const lanes = (base: number) => [...float32s(base), ...op.load64Zero, ...op.promote]
  // A bfloat16 pair: two 16-bit loads, zero-extended to 32 bits, shifted up (the float's upper half), widened.
  const moment = (base: number) =>
    bf16
      ? [...get(base), ...get(J), 0x6a, ...op.load32Zero, ...op.extendLowU16, ...i32const(16), ...op.shl, ...op.promote]
      : lanes(base)
  const storeTo = (base: number, value: Array<number>) => [
    ...float32s(base), ...value, ...op.demote, ...op.store64Lane0
  ]
  // `AdamStep.roundStochastic` on each lane: NaN keeps its quiet bit, anything else rounds up with random bits below.
  const narrow = (value: number, random: Array<number>) => [
    ...get(value), ...op.demote, ...set(GI), // GI is free once mi, vi are known: it holds the float32 bits here
    ...get(GI), ...i32const(16), ...op.shrU, ...splatI32(0x40), ...op.or,
    ...get(GI), ...random, ...op.i32add, ...i32const(16), ...op.shrU,
    ...get(GI), ...splatI32(0x7fffffff), ...op.and, ...splatI32(0x7f800000), ...op.gtS,
    ...op.bitselect
  ]
  const storeMoment = (base: number, value: number, random: Array<number>) =>
    bf16
      ? [
        ...get(base), ...get(J), 0x6a, ...narrow(value, random),
        ...v128(0, 0, 0, 0), ...op.narrowU, ...op.store32Lane0 // the lanes' low halves: two bfloat16s
      ]
      : storeTo(base, get(value))
  // `AdamStep.hash32`'s mix on lanes H, H + 1.
  const mix = [
    ...get(H), ...op.i32splat, ...v128(0, 1, 0, 0), ...op.i32add, ...set(R),
    ...xorShift(R, 16), ...get(R), ...splatI32(0x7feb352d), ...op.i32mul, ...set(R),
    ...xorShift(R, 15), ...get(R), ...splatI32(0x846ca68b | 0), ...op.i32mul, ...set(R),
    ...xorShift(R, 16)
  ]
  return [
    ...Array.from({ length: 9 }, (_, k) => [...splat(k), ...set(S + k)]).flat(),
    ...get(N), 0x41, 4, 0x6c, ...set(END), // end = n · 4
    0x41, 0, ...set(I),
    0x41, 0, ...set(J),
    ...(bf16 ? [...get(14), ...set(H)] : []),
    0x02, 0x40, 0x03, 0x40, // block, loop
    ...get(I), ...get(END), 0x4f, 0x0d, 1, // i ≥ end: break
    // gi = g · scale
    ...lanes(G), ...splatted(0), ...op.mul, ...set(GI),
    // mi = beta1 · m + b1c · gi
    ...splatted(1), ...moment(M), ...op.mul, ...splatted(2), ...get(GI), ...op.mul, ...op.add, ...set(MI),
    // vi = beta2 · v + (b2c · gi) · gi
    ...splatted(3), ...moment(Vv), ...op.mul, ...splatted(4), ...get(GI), ...op.mul, ...get(GI), ...op.mul, ...op.add,
    ...set(VI),
    // p = p · keep − (stepSize · mi) / (√vi · invSqrtC2 + eps)
    ...storeTo(P, [
      ...lanes(P), ...splatted(8), ...op.mul,
      ...splatted(5), ...get(MI), ...op.mul,
      ...get(VI), ...op.sqrt, ...splatted(6), ...op.mul, ...splatted(7), ...op.add,
      ...op.div, ...op.sub
    ]),
    ...(bf16 ? mix : []),
    // m's bits from the low half of each lane's random word, v's from its high half
    ...storeMoment(M, MI, [...get(R), ...splatI32(0xffff), ...op.and]),
    ...storeMoment(Vv, VI, [...get(R), ...i32const(16), ...op.shrU]),
    ...get(I), 0x41, 8, 0x6a, ...set(I), // two floats per iteration
    ...(bf16 ? [...get(J), 0x41, 4, 0x6a, ...set(J), ...get(H), 0x41, 2, 0x6a, ...set(H)] : []),
    0x0c, 0, 0x0b, 0x0b, // br loop; end loop; end block
    0x0b
  ]
}

const type = (params: Array<number>) => [0x60, ...vec(params.map((t) => [t])), 0]

const moduleBytes = (): Uint8Array<ArrayBuffer> => {
  const params = [I32, I32, I32, I32, I32, ...Array.from({ length: 9 }, () => F64)]
  const locals = vec([[4, I32], [13, V128]])
  const code = (bf16: boolean) => {
    const c = [...locals, ...body(bf16)]
    return [...leb(c.length), ...c]
  }
  return Uint8Array.from([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, vec([type(params), type([...params, I32])])),
    ...section(3, vec([[0], [1]])),
    ...section(5, vec([[0x00, (CHUNK * 16) / 65536 + 1]])),
    ...section(7, vec([[...name("adam"), 0x00, 0], [...name("adam16"), 0x00, 1], [...name("memory"), 0x02, 0]])),
    ...section(10, vec([code(false), code(true)]))
  ])
}

// ===== Constructors =====

/**
 * A kernel instance (its own memory; one per thread), or undefined where WebAssembly SIMD is unavailable.
 */
export const make = (): Kernels | undefined => {
  const bytes = moduleBytes()
  if (typeof WebAssembly === "undefined" || !WebAssembly.validate(bytes)) return undefined
  const instance = new WebAssembly.Instance(new WebAssembly.Module(bytes))
  const adam = instance.exports["adam"] as (...args: Array<number>) => void
  const adam16 = instance.exports["adam16"] as (...args: Array<number>) => void
  const memory = instance.exports["memory"] as WebAssembly.Memory
  const floats = new Float32Array(memory.buffer, 0, CHUNK * 4)
  const halves = new Uint16Array(memory.buffer, 0, CHUNK * 8)
  const [pAt, gAt, mAt, vAt] = [0, 1, 2, 3].map((k) => k * CHUNK) as [number, number, number, number]
  // bfloat16 moments: two halves of the third float32 chunk, in 16-bit units
  const [m16At, v16At] = [mAt * 2, mAt * 2 + CHUNK]
  const coefficients = (c: Coefficients) =>
    [c.scale, c.beta1, 1 - c.beta1, c.beta2, 1 - c.beta2, c.stepSize, c.invSqrtC2, c.eps, c.keep] as const
  // Chunk by chunk through the kernel's memory: p and g as float32s, the moments in `stage` at `mAt`, `vAt`; `run`
  // takes the chunk's count (rounded up to even: an odd chunk's last lane reads and writes past the data, which is
  // not copied back) and its start.
  const chunked = (
    p: Float32Array,
    g: Float32Array,
    m: Float32Array | Uint16Array,
    v: Float32Array | Uint16Array,
    stage: Float32Array | Uint16Array,
    [mAt, vAt]: readonly [number, number],
    run: (even: number, start: number) => void
  ) => {
    for (let start = 0; start < p.length; start += CHUNK) {
      const end = Math.min(start + CHUNK, p.length)
      const n = end - start
      floats.set(p.subarray(start, end), pAt)
      floats.set(g.subarray(start, end), gAt)
      stage.set(m.subarray(start, end), mAt)
      stage.set(v.subarray(start, end), vAt)
      run(n + (n & 1), start)
      p.set(floats.subarray(pAt, pAt + n), start)
      m.set(stage.subarray(mAt, mAt + n), start)
      v.set(stage.subarray(vAt, vAt + n), start)
    }
  }
  const float32: Kernel = (p, g, m, v, c) =>
    chunked(p, g, m, v, floats, [mAt, vAt], (n) => adam(pAt * 4, gAt * 4, mAt * 4, vAt * 4, n, ...coefficients(c)))
  const bfloat16: Kernel16 = (p, g, m, v, c, hashAt) =>
    chunked(p, g, m, v, halves, [m16At, v16At], (n, start) =>
      adam16(pAt * 4, gAt * 4, m16At * 2, v16At * 2, n, ...coefficients(c), (hashAt + start) | 0))
  return { float32, bfloat16 }
}
