/**
 * The acquire waits of a resource pool: a ring buffer of the most recent ones and their nearest-rank quantiles,
 * which `PoolStats.acquireMillisP50`/`P99` report.
 */
/** How many of the most recent acquire waits the percentiles of {@link PoolStats} are computed over. */
export const waitWindowSize = 1024

/** A ring buffer of the most recent acquire waits, in milliseconds. */
export interface WaitWindow {
  readonly values: Float64Array
  size: number
  next: number
}

export const makeWaitWindow = (capacity: number = waitWindowSize): WaitWindow => ({
  values: new Float64Array(capacity),
  size: 0,
  next: 0
})

/** Records one wait, overwriting the oldest once the window is full. */
export const recordWait = (window: WaitWindow, millis: number): void => {
  window.values[window.next] = millis
  window.next = (window.next + 1) % window.values.length
  window.size = Math.min(window.size + 1, window.values.length)
}

/** The waits held by the window (oldest first is not guaranteed: order does not matter to a quantile). */
export const waits = (window: WaitWindow): Float64Array => window.values.subarray(0, window.size)

/**
 * The `q`-quantile of `values` by nearest rank: the smallest value such that at least `q · n` of the `n` values are
 * at or below it (`q = 0.5` is the lower median, `q = 1` the maximum); 0 when there are no values.
 *
 * Quickselect (Hoare partition, median-of-three pivot) on a copy: expected O(n), `values` is left untouched.
 */
export const quantile = (values: ArrayLike<number>, q: number): number => {
  const n = values.length
  if (n === 0) return 0
  // The tolerance keeps q · n that should be an integer (0.07 · 100 = 7.000000000000001) from rounding up a rank.
  const k = Math.min(n, Math.max(1, Math.ceil(q * n - 1e-9))) - 1
  const a = Float64Array.from(values)
  let lo = 0
  let hi = n - 1
  while (lo < hi) {
    const x = a[lo]!
    const y = a[(lo + hi) >>> 1]!
    const z = a[hi]!
    const pivot = x < y ? (y < z ? y : x < z ? z : x) : (x < z ? x : y < z ? z : y)
    let i = lo
    let j = hi
    while (i <= j) {
      while (a[i]! < pivot) i++
      while (a[j]! > pivot) j--
      if (i <= j) {
        const t = a[i]!
        a[i++] = a[j]!
        a[j--] = t
      }
    }
    // Now a[lo..j] <= pivot <= a[i..hi], and everything strictly between j and i equals the pivot.
    if (k <= j) hi = j
    else if (k >= i) lo = i
    else return a[k]!
  }
  return a[k]!
}
