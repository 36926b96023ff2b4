/**
 * The process's peak resident set size between two reads, for the `perf/peak_rss_mb` and `perf/rss_mb` figures of
 * `metrics.jsonl`.
 *
 * The kernel keeps one high-water mark per process (`getrusage` `maxrss`, `VmHWM`), which only grows: when it rose
 * since the previous read, the new peak was reached in between and is exact. Otherwise the interval stayed below an
 * earlier peak, and the largest RSS sampled in between (every `intervalMs`, from a fiber, so a peak reached while
 * the event loop is blocked can be missed) is a lower bound. The mark is never reset (`/proc/self/clear_refs` would
 * also reset what `/usr/bin/time` reports for the whole run).
 *
 * Beside them, `perf/peak_bytes_per_param`: the peak ÷ the parameters of the learners this process holds (the
 * policy's trainer and a GAE critic's, counted by {@link countParameters} while their run lasts), the figure that
 * says how memory scales with the model (≤ 18 bytes a parameter plus the activations is the aim of issue 41). The
 * count is the process's, as the RSS is: absent while no local learner runs (a remote trainer's run).
 */
import { Effect, Schedule, Scope } from "effect"

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

/** Parameters of the local learners in this process. */
let parameters = 0

/** @internal Counts `n` parameters of a local learner until `scope` closes. */
export const countParameters = (n: number, scope: Scope.Scope): Effect.Effect<void> =>
  Effect.suspend(() => {
    parameters += n
    return Scope.addFinalizer(scope, Effect.sync(() => void (parameters -= n)))
  })

/** @internal A reading as the figures of a `metrics.jsonl` record. */
export const figures = (read: { readonly peakMb: number; readonly rssMb: number }): Record<string, number> => ({
  "perf/peak_rss_mb": read.peakMb,
  "perf/rss_mb": read.rssMb,
  ...(parameters > 0 ? { "perf/peak_bytes_per_param": Math.round(read.peakMb * MB / parameters * 10) / 10 } : {})
})
