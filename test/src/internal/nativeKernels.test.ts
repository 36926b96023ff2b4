import { assert, describe, it } from "@effect/vitest"
import { Worker } from "node:worker_threads"
import * as NativeKernels from "../../../src/internal/nativeKernels.ts"
import * as Optimizer from "../../../src/Optimizer.ts"
import { bfloat16, reference, reference16, wave, withSpecialValues } from "../../utils/adamReference.ts"

const c = { scale: 0.7, beta1: 0.9, beta2: 0.98, stepSize: 1e-3 / 0.19, invSqrtC2: 7.1, eps: 1e-8, keep: 1 - 1e-5 }
const coefficients = Float64Array.of(c.scale, c.beta1, 1 - c.beta1, c.beta2, 1 - c.beta2, c.stepSize, c.invSqrtC2,
  c.eps, c.keep)
const sameBits = (a: Float32Array, b: Float32Array) => a.every((x, i) => Object.is(x, b[i]))

// Lengths below and above the addon's threshold for threads (262,144 elements), split in 1 to 3 threads.
const cases = [[1, 1], [3, 2], [17, 3], [262143, 2], [262144, 2], [300001, 2], [300001, 3]] as const

describe("nativeKernels", () => {
  // The README's test command builds the addon at `npm ci` (`native/build.mjs`; the machines this runs on have a C
  // compiler): a missing addon fails here rather than passing silently on the WebAssembly kernel.
  const addon = NativeKernels.addon!
  it("is built and loaded", () => {
    assert.isDefined(NativeKernels.addon)
  })

  it("AdamW with float32 moments is bit-identical to the scalar loop, on any number of threads", () => {
    for (const [n, threads] of cases) {
      const p = wave(n, 1.1, 0.02), g = wave(n, 0.37, 0.01), m = wave(n, 0.7, 1e-3)
      const v = Float32Array.from(wave(n, 0.13, 1e-5), Math.abs)
      withSpecialValues(g)
      const [p2, m2, v2] = [p.slice(), m.slice(), v.slice()]
      for (let step = 0; step < 3; step++) {
        reference(p, g, m, v, c)
        addon.adam(p2, g, m2, v2, coefficients, threads)
      }
      for (const [name, a, b] of [["p", p, p2], ["m", m, m2], ["v", v, v2]] as const) {
        assert.isTrue(sameBits(a, b), `${name} differs for n = ${n}, ${threads} threads`)
      }
    }
  })

  it("AdamW with bfloat16 moments is bit-identical to widening, the scalar loop and stochastic narrowing", () => {
    const hashes = [0, -5, 2 ** 31 - 2, 12345, -1, 99, 7]
    for (const [[n, threads], hashAt] of cases.map((k, j) => [k, hashes[j]!] as const)) {
      const p = wave(n, 1.1, 0.02), g = wave(n, 0.37, 0.01)
      withSpecialValues(g)
      const m = bfloat16(wave(n, 0.7, 1e-3)), v = bfloat16(Float32Array.from(wave(n, 0.13, 1e-5), Math.abs))
      const [p2, m2, v2] = [p.slice(), m.slice(), v.slice()]
      for (let step = 0; step < 3; step++) {
        reference16(p, g, m, v, c, hashAt + step)
        addon.adam(p2, g, m2, v2, coefficients, threads, hashAt + step)
      }
      assert.isTrue(sameBits(p, p2), `p differs for n = ${n}`)
      assert.deepStrictEqual([...m2], [...m], `m differs for n = ${n}`)
      assert.deepStrictEqual([...v2], [...v], `v differs for n = ${n}`)
    }
  })

  it("adds into an accumulator and sums squares in the loops' order, to the bit", () => {
    for (const [n, threads] of cases) {
      const acc = wave(n, 0.9, 0.5), g = wave(n, 0.31, 1e-3)
      const expected = Float32Array.from(acc, (a, i) => a + g[i]!)
      addon.addInto(acc, g, threads)
      assert.isTrue(sameBits(acc, expected), `addInto differs for n = ${n}, ${threads} threads`)
      let sq = 0.25
      for (let i = 0; i < n; i++) sq += g[i]! * g[i]!
      assert.strictEqual(addon.sumSquares(g, 0.25), sq)
    }
    // `Optimizer.globalNorm` reads through it: the same number as the loop over several tensors in map order
    const grads = new Map([["a", wave(1001, 0.2, 3)], ["b", wave(77, 0.5, 1e-4)], ["c", new Float32Array(0)]])
    let sq = 0
    for (const g of grads.values()) for (let i = 0; i < g.length; i++) sq += g[i]! * g[i]!
    assert.strictEqual(Optimizer.globalNorm(grads), Math.sqrt(sq))
  })

  it("widens BF16 into float32 at an offset, on any number of threads, to the bit", () => {
    for (const [n, threads] of cases) {
      // every class of value: NaN, ±∞, denormals, zeros
      const bits = Uint16Array.from({ length: n }, (_, i) => (i * 40503 + 7) & 0xffff)
      const dst = new Float32Array(n + 5).fill(-3)
      addon.widenBf16(bits, dst, 3, threads)
      const expected = new Float32Array(Uint32Array.from(bits, (b) => b << 16).buffer)
      assert.isTrue(sameBits(dst.subarray(3, 3 + n), expected), `n = ${n}, ${threads} threads`)
      assert.deepStrictEqual([...dst.subarray(0, 3), ...dst.subarray(3 + n)], [-3, -3, -3, -3, -3])
    }
    assert.throws(() => addon.widenBf16(new Uint16Array(4), new Float32Array(4), 1, 1), RangeError, /does not fit/)
  })

  it("finds the first NaN or ±Infinity, wherever the threads' spans split", () => {
    const n = 300001
    assert.strictEqual(addon.firstNonFinite(wave(n, 0.3, 1e30), 2), -1)
    assert.strictEqual(addon.firstNonFinite(new Float32Array(0), 2), -1)
    for (const [at, x] of [[0, NaN], [150000, Infinity], [150001, -Infinity], [n - 1, NaN], [7, 3e38 * 10]] as const) {
      for (const threads of [1, 2, 3]) {
        const data = wave(n, 0.3, 1)
        data[at] = x
        if (at + 1000 < n) data[at + 1000] = NaN // a later one does not count
        assert.strictEqual(addon.firstNonFinite(data, threads), at, `at ${at}, ${threads} threads`)
      }
    }
  })

  it("works on shared memory, as the learner's worker threads hold it", () => {
    const n = 300001
    const shared = (x: Float32Array) => {
      const s = new Float32Array(new SharedArrayBuffer(x.byteLength))
      s.set(x)
      return s
    }
    const p = wave(n, 1.1, 0.02), g = wave(n, 0.37, 0.01), m = wave(n, 0.7, 1e-3), v = wave(n, 0.13, 1e-5).map(Math.abs)
    const [p2, g2, m2, v2] = [p, g, m, v].map(shared) as [Float32Array, Float32Array, Float32Array, Float32Array]
    reference(p, g, m, v, c)
    addon.adam(p2, g2, m2, v2, coefficients, 2)
    assert.isTrue(sameBits(p, p2) && sameBits(m, m2) && sameBits(v, v2))
  })

  it("refuses wrong arguments with a typed error, touching nothing", () => {
    const p = wave(8, 1, 1), before = p.slice()
    assert.throws(() => addon.adam(p, p, p, new Float32Array(7), coefficients, 1), RangeError, /one length/)
    assert.throws(() => addon.adam(p, p, p, p, new Float64Array(3), 1), RangeError, /9 coefficients/)
    assert.throws(() => addon.adam(p, new Float64Array(8) as never, p, p, coefficients, 1), TypeError, /Float32Array/)
    assert.throws(() => addon.adam(p, p, new Uint16Array(8), p, coefficients, 1, 0), TypeError, /Uint16Array/)
    assert.throws(() => addon.adam(p, p, new Uint16Array(8), new Uint16Array(8), coefficients, 1), TypeError, /number/)
    assert.throws(() => addon.sumSquares([1, 2] as never, 0), TypeError, /typed array/)
    assert.throws(() => addon.addInto(p, new Float32Array(3), 1), RangeError, /one length/)
    assert.isTrue(sameBits(p, before))
  })

  it("uses every core on the main thread and one in a worker thread", async () => {
    assert.isAtLeast(NativeKernels.threads, 1)
    const worker = new Worker(new URL("../../utils/nativeThreadsWorker.mjs", import.meta.url))
    const inWorker = await new Promise((resolve, reject) => {
      worker.once("message", resolve)
      worker.once("error", reject)
    })
    await worker.terminate()
    assert.strictEqual(inWorker, 1)
  })
})
