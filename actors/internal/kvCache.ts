/**
 * The engine's KV cache for continuous batching. Each past input of the decode graph (`past.{l}.key|value`) is one
 * buffer `[maxRows, KV, capacity, hd]`; the running sequences are its first `rows` rows, and a sequence's tokens
 * fill the leading slots of its row (left-aligned, the attention mask covers the rest). So:
 *
 * - a decode step feeds a prefix of each buffer, without copying, and writes the new token's key/value into one
 *   slot per row (the graph returns only those);
 * - a finished sequence leaves by moving the last row into its place (one row copied, not the cache);
 * - joining sequences are copied in after the last row;
 * - the capacity grows (and shrinks) in chunks, so the whole cache is copied only once per chunk of length.
 *
 * @since 0.1.0
 */

const CHUNK = 32

/** @internal */
export interface KvCache {
  readonly names: ReadonlyArray<string>
  readonly kvHeads: number
  readonly headDim: number
  readonly maxRows: number
  /** Slots per row. */
  capacity: number
  rows: number
  buffers: Array<Float32Array>
}

/** @internal */
export const make = (names: ReadonlyArray<string>, kvHeads: number, headDim: number, maxRows: number): KvCache => ({
  names,
  kvHeads,
  headDim,
  maxRows,
  capacity: 0,
  rows: 0,
  buffers: names.map(() => new Float32Array(0))
})

const roundUp = (n: number) => Math.ceil(Math.max(n, 1) / CHUNK) * CHUNK

/**
 * Makes room for `slots` slots per row, keeping the first `filled[r]` slots of each row. Grows to the next chunk;
 * shrinks when two chunks or more would be unused, since every step attends over the whole capacity.
 */
export const fit = (cache: KvCache, slots: number, filled: ArrayLike<number>): void => {
  const target = roundUp(slots)
  if (target <= cache.capacity && cache.capacity - target < 2 * CHUNK) return
  const { kvHeads: KV, headDim: hd } = cache
  const old = cache.capacity
  cache.buffers = cache.buffers.map((src) => {
    const out = new Float32Array(cache.maxRows * KV * target * hd)
    for (let r = 0; r < cache.rows; r++) {
      const keep = Math.min(filled[r]!, target) * hd
      for (let h = 0; h < KV; h++) {
        const from = (r * KV + h) * old * hd
        out.set(src.subarray(from, from + keep), (r * KV + h) * target * hd)
      }
    }
    return out
  })
  cache.capacity = target
}

/**
 * Copies rows of a prefill's output (`[N, KV, length, hd]` per name, right-aligned: a row's tokens are its last
 * `filled` slots) after the cache's last row. The capacity must hold `filled`.
 */
export const append = (
  cache: KvCache,
  fresh: ReadonlyArray<Float32Array>,
  length: number,
  rows: ReadonlyArray<{ readonly index: number; readonly filled: number }>
): void => {
  const { kvHeads: KV, headDim: hd, capacity: T } = cache
  cache.buffers.forEach((dst, n) => {
    const src = fresh[n]!
    rows.forEach(({ index, filled }, j) => {
      const r = cache.rows + j
      for (let h = 0; h < KV; h++) {
        const from = ((index * KV + h) * length + (length - filled)) * hd
        dst.set(src.subarray(from, from + filled * hd), (r * KV + h) * T * hd)
      }
    })
  })
  cache.rows += rows.length
}

/** Writes each row's new key/value (`[rows, KV, 1, hd]` per name) into its slot `filled[r]`. */
export const write = (cache: KvCache, fresh: ReadonlyArray<Float32Array>, filled: ArrayLike<number>): void => {
  const { kvHeads: KV, headDim: hd, capacity: T } = cache
  cache.buffers.forEach((dst, n) => {
    const src = fresh[n]!
    for (let r = 0; r < cache.rows; r++) {
      for (let h = 0; h < KV; h++) {
        const from = (r * KV + h) * hd
        dst.set(src.subarray(from, from + hd), ((r * KV + h) * T + filled[r]!) * hd)
      }
    }
  })
}

/** Removes row `index` by moving the last row into it (the caller mirrors the move in its own row order). */
export const remove = (cache: KvCache, index: number): void => {
  const last = cache.rows - 1
  if (index !== last) {
    const size = cache.kvHeads * cache.capacity * cache.headDim
    for (const b of cache.buffers) b.copyWithin(index * size, last * size, (last + 1) * size)
  }
  cache.rows = last
}

/** The first `rows` rows of each buffer, as `[rows, KV, capacity, hd]` views (no copy). */
export const views = (cache: KvCache): Array<{ readonly data: Float32Array; readonly dims: Array<number> }> => {
  const size = cache.kvHeads * cache.capacity * cache.headDim
  return cache.buffers.map((b) => ({
    data: b.subarray(0, cache.rows * size),
    dims: [cache.rows, cache.kvHeads, cache.capacity, cache.headDim]
  }))
}
