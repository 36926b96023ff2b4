/**
 * The engine's KV cache for continuous batching. Each past input of the decode graph (`past.{l}.key|value`) is one
 * buffer `[maxRows, KV, capacity, hd]`; the running sequences are its first `rows` rows, and a sequence's tokens
 * fill the leading slots of its row (left-aligned, the attention mask covers the rest). So:
 *
 * - a decode step feeds a prefix of each buffer, without copying, and writes the new token's key/value into one
 *   slot per row (the graph returns only those);
 * - a finished sequence leaves by moving the last row into its place (one row copied, not the cache);
 * - joining sequences are copied in after the last row;
 * - the capacity grows (and shrinks) in chunks, so the whole cache is copied only once per chunk of length;
 * - the memory of a layout left behind, and of a closed cache ({@link release}), goes to a pool on this thread that
 *   the next layouts take from: an engine per rollout batch, each allocating 8–30 MB per chunk of length, made V8
 *   run a full collection every few chunks (external memory pressure: ≈ 10 per RL step of the calculator config).
 *
 * @since 0.1.0
 */

const CHUNK = 32

/** @internal */
export interface KvCache {
  readonly kvHeads: number
  readonly headDim: number
  readonly maxRows: number
  /** Slots per row. */
  capacity: number
  rows: number
  buffers: Array<Float32Array>
}

/** A cache of `buffers` past inputs (2 per layer). */
export const make = (buffers: number, kvHeads: number, headDim: number, maxRows: number): KvCache => ({
  kvHeads,
  headDim,
  maxRows,
  capacity: 0,
  rows: 0,
  buffers: Array.from({ length: buffers }, () => new Float32Array(0))
})

const roundUp = (n: number) => Math.ceil(Math.max(n, 1) / CHUNK) * CHUNK

/**
 * Free layouts' memory, largest first. A relayout takes one piece and gives one back, so two engines' caches (an
 * async run's batch and the next one) are enough to keep: more only holds memory (≈ 7 MB a piece on the tiny preset).
 */
const pool: Array<ArrayBuffer> = []
const POOLED = 8

/** `floats` floats of pooled memory (the smallest piece that holds them, old values left in it) or new memory. */
const acquire = (floats: number): Float32Array => {
  let best = -1
  for (let i = 0; i < pool.length; i++) if (pool[i]!.byteLength >= floats * 4) best = i
  return new Float32Array(best < 0 ? new ArrayBuffer(floats * 4) : pool.splice(best, 1)[0]!, 0, floats)
}

const recycle = (b: Float32Array) => {
  if (b.buffer.byteLength === 0) return
  pool.push(b.buffer as ArrayBuffer)
  pool.sort((x, y) => y.byteLength - x.byteLength)
  pool.length = Math.min(pool.length, POOLED)
}

/** Gives the cache's memory back to the pool; the cache is empty afterwards. */
export const release = (cache: KvCache): void => {
  cache.buffers.forEach(recycle)
  cache.buffers = cache.buffers.map(() => new Float32Array(0))
  cache.rows = 0
  cache.capacity = 0
}

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
    // Slots past a row's tokens may hold old values, as those a removed row leaves behind do: they are masked.
    const out = acquire(cache.maxRows * KV * target * hd)
    for (let r = 0; r < cache.rows; r++) {
      const keep = Math.min(filled[r]!, target) * hd
      for (let h = 0; h < KV; h++) {
        const from = (r * KV + h) * old * hd
        out.set(src.subarray(from, from + keep), (r * KV + h) * target * hd)
      }
    }
    recycle(src)
    return out
  })
  cache.capacity = target
}

/**
 * A sequence's keys/values taken out of the cache (`[KV, length, hd]` per name), to continue it later without
 * recomputing them.
 */
export interface Prefix {
  readonly length: number
  readonly data: ReadonlyArray<Float32Array>
}

/**
 * Copies rows of a prefill's output (`[N, KV, length, hd]` per name, right-aligned: a row's new tokens are its
 * last slots) after the cache's last row. A row with a `prefix` starts with it, then its `filled − prefix.length`
 * new tokens. The capacity must hold `filled`.
 */
export const append = (
  cache: KvCache,
  fresh: ReadonlyArray<Float32Array>,
  length: number,
  rows: ReadonlyArray<{ readonly index: number; readonly filled: number; readonly prefix?: Prefix | undefined }>
): void => {
  const { kvHeads: KV, headDim: hd, capacity: T } = cache
  cache.buffers.forEach((dst, n) => {
    const src = fresh[n]!
    rows.forEach(({ index, filled, prefix }, j) => {
      const r = cache.rows + j, start = prefix?.length ?? 0, added = filled - start
      for (let h = 0; h < KV; h++) {
        const at = (r * KV + h) * T * hd
        if (prefix !== undefined) dst.set(prefix.data[n]!.subarray(h * start * hd, (h + 1) * start * hd), at)
        const from = ((index * KV + h) * length + (length - added)) * hd
        dst.set(src.subarray(from, from + added * hd), at + start * hd)
      }
    })
  })
  cache.rows += rows.length
}

/** The first `filled` slots of row `index`, copied out. */
export const take = (cache: KvCache, index: number, filled: number): Prefix => {
  const { kvHeads: KV, headDim: hd, capacity: T } = cache
  return {
    length: filled,
    data: cache.buffers.map((b) => {
      const out = new Float32Array(KV * filled * hd)
      for (let h = 0; h < KV; h++) {
        const at = (index * KV + h) * T * hd
        out.set(b.subarray(at, at + filled * hd), h * filled * hd)
      }
      return out
    })
  }
}

/** No tokens: what a request that continues nothing starts from. */
export const emptyPrefix = (buffers: number): Prefix => ({
  length: 0,
  data: Array.from({ length: buffers }, () => new Float32Array(0))
})

/**
 * Prefixes as a past input `[N, KV, width, hd]` per name (left-aligned, zeros after each), for prefilling their
 * continuations in one batch.
 */
export const stack = (prefixes: ReadonlyArray<Prefix>, width: number, kvHeads: number, headDim: number) =>
  prefixes[0]!.data.map((_, n) => {
    const out = new Float32Array(prefixes.length * kvHeads * width * headDim)
    prefixes.forEach((p, r) => {
      for (let h = 0; h < kvHeads; h++) {
        const len = p.length * headDim
        out.set(p.data[n]!.subarray(h * len, (h + 1) * len), (r * kvHeads + h) * width * headDim)
      }
    })
    return out
  })

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
