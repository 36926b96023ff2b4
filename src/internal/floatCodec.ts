/**
 * Conversions between float32 and the 16-bit float formats of weight files, over typed-array views (one pass, no
 * per-element `DataView` call or object). They assume a little-endian host, as safetensors files are little-endian
 * (x86-64 and ARM64 both are).
 */
import * as NativeKernels from "./nativeKernels.ts"

/**
 * BF16 bits (`src`) widened into float32 (`dst` from `dstOffset`): BF16 is float32's upper half. Two values per
 * 32-bit load (a third faster than one at a time); `src` must start on a 4-byte boundary. The native kernel, where
 * built, does the same on every core.
 */
export const widenBf16 = (src: Uint16Array, dst: Float32Array, dstOffset = 0): void => {
  const native = NativeKernels.addon
  if (native !== undefined) return native.widenBf16(src, dst, dstOffset, NativeKernels.threads)
  const pairs = src.length >>> 1
  const words = new Uint32Array(src.buffer, src.byteOffset, pairs)
  const bits = new Uint32Array(dst.buffer, dst.byteOffset + dstOffset * 4, src.length)
  for (let j = 0, k = 0; j < pairs; j++, k += 2) {
    const w = words[j]!
    bits[k] = w << 16
    bits[k + 1] = w & 0xffff0000
  }
  if (src.length & 1) bits[src.length - 1] = src[src.length - 1]! << 16
}

let f16Table: Float32Array | undefined

/** Every F16 bit pattern's float32 value (256 KiB, built once): widening is then one load per element. */
const f16Values = (): Float32Array => {
  if (f16Table !== undefined) return f16Table
  const table = new Float32Array(65536)
  for (let h = 0; h < 65536; h++) {
    const sign = h & 0x8000 ? -1 : 1, exp = (h >> 10) & 0x1f, frac = h & 0x3ff
    table[h] = exp === 0
      ? sign * Math.pow(2, -14) * (frac / 1024)
      : exp === 31
      ? (frac ? NaN : sign * Infinity)
      : sign * Math.pow(2, exp - 15) * (1 + frac / 1024)
  }
  return (f16Table = table)
}

/** F16 bits (`src`) widened into float32 (`dst` from `dstOffset`). */
export const widenF16 = (src: Uint16Array, dst: Float32Array, dstOffset = 0): void => {
  const table = f16Values()
  for (let i = 0; i < src.length; i++) dst[dstOffset + i] = table[src[i]!]!
}

/**
 * Float32 values (`src`) narrowed to BF16 bits (`dst`) with round-to-nearest-even, as PyTorch's `.to(bfloat16)`
 * does; NaN stays a (quiet) NaN with its sign, ±Infinity stays infinite.
 */
export const narrowBf16 = (src: Float32Array, dst: Uint16Array): void => {
  const bits = new Uint32Array(src.buffer, src.byteOffset, src.length)
  for (let i = 0; i < src.length; i++) {
    const u = bits[i]!
    dst[i] = (u & 0x7fffffff) > 0x7f800000 ? ((u >>> 16) | 0x0040) : ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16)
  }
}
