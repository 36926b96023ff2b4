/**
 * The process's peak resident set size between two reads, for the `perf/peak_rss_mb` and `perf/rss_mb` figures of
 * `metrics.jsonl`.
 *
 * The kernel keeps one high-water mark per process (`getrusage` `maxrss`, `VmHWM`), which only grows: when it rose
 * since the previous read, the new peak was reached in between and is exact. Otherwise the interval stayed below an
 * earlier peak, and the largest RSS sampled in between (every `intervalMs`, from a fiber, so a peak reached while
 * the event loop is blocked can be missed) is a lower bound. The mark is never reset (`/proc/self/clear_refs` would
 * also reset what `/usr/bin/time` reports for the whole run).
 */
import { Effect, Schedule } from "effect"
import type { Scope } from "effect"

const MB = 1024 * 1024

/** @internal */
export interface PeakRss {
  /** Peak RSS (MB) since the previous `take` (or since `make`), and the RSS now. */
  readonly take: Effect.Effect<{ readonly peakMb: number; readonly rssMb: number }>
}

const rss = () => process.memoryUsage.rss()
// `maxRSS` is in kilobytes.
const highWater = () => process.resourceUsage().maxRSS * 1024

/** @internal */
export const make = (intervalMs = 50): Effect.Effect<PeakRss, never, Scope.Scope> =>
  Effect.gen(function*() {
    let mark = highWater()
    let sampled = rss()
    yield* Effect.sync(() => void (sampled = Math.max(sampled, rss()))).pipe(
      Effect.repeat(Schedule.spaced(intervalMs)),
      Effect.forkScoped
    )
    const take = Effect.sync(() => {
      const now = rss()
      const high = highWater()
      const peak = high > mark ? high : Math.max(sampled, now)
      mark = high
      sampled = now
      return { peakMb: Math.round(peak / MB), rssMb: Math.round(now / MB) }
    })
    return { take }
  })
