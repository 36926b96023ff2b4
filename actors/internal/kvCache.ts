/**
 * KV-cache reshuffling for continuous batching. Cache tensors are `[B, KV, T, hd]` with every sequence
 * right-aligned (left padding), so changing batch membership is a copy of each kept row's last slots into a new
 * right-aligned tensor: shrinking `T` drops leading padding, growing it adds some.
 *
 * @since 0.1.0
 */

/** One cache tensor and the rows of it to keep. */
export interface Part {
  readonly data: Float32Array
  /** Cache length `T` of `data`. */
  readonly length: number
  /** Rows to copy, in output order, each with how many trailing slots hold real tokens. */
  readonly rows: ReadonlyArray<{ readonly index: number; readonly filled: number }>
}

/**
 * Builds `[Σ rows, kvHeads, length, headDim]` from the given parts, copying each row's last `filled` slots to the
 * right end of its new row; the rest is zero (masked out by the attention mask anyway).
 */
export const rebatch = (parts: ReadonlyArray<Part>, kvHeads: number, headDim: number, length: number): Float32Array => {
  const rows = parts.reduce((n, p) => n + p.rows.length, 0)
  const out = new Float32Array(rows * kvHeads * length * headDim)
  let r = 0
  for (const part of parts) {
    for (const { index, filled } of part.rows) {
      const keep = Math.min(filled, length, part.length)
      for (let h = 0; h < kvHeads; h++) {
        const src = ((index * kvHeads + h) * part.length + (part.length - keep)) * headDim
        const dst = ((r * kvHeads + h) * length + (length - keep)) * headDim
        out.set(part.data.subarray(src, src + keep * headDim), dst)
      }
      r++
    }
  }
  return out
}
