/**
 * Progress of long work on a terminal: a bar redrawn in place on stderr while an evaluation or an oracle plays its
 * rows (`agentfly eval`, `agentfly oracle`; training has its own per-step bar, `Metrics.display`).
 *
 * The rollout runtime says when a group (a row's chains) is done through the {@link Progress} reference; nothing
 * listens unless a command provides a bar, and a bar is made only when both stdout and stderr are terminals, so
 * piped or captured output is exactly what it was.
 *
 * @since 0.1.0
 */
import { Context, Effect } from "effect"

// ===== The reference =====

/**
 * What hears that a group finished; `undefined` (the default): nothing does.
 *
 * @category models
 * @since 0.1.0
 */
export interface Listener {
  readonly groupDone: () => void
}

/**
 * The listener of the running work, provided by a command around it (forked chains inherit it).
 *
 * @category services
 * @since 0.1.0
 */
export const Progress = Context.Reference<Listener | undefined>("agentfly/actors/Progress", {
  defaultValue: () => undefined
})

/**
 * Says that a group finished, to the listener if there is one.
 *
 * @category constructors
 * @since 0.1.0
 */
export const groupDone: Effect.Effect<void> = Effect.flatMap(
  Effect.service(Progress),
  (listener) => (listener === undefined ? Effect.void : Effect.sync(listener.groupDone))
)

// ===== The bar =====

/**
 * `label ▕██████░░░░▏ 12/50 rows  0m12s  eta 0m38s`, fitted to `columns`.
 *
 * @category formatting
 * @since 0.1.0
 */
export const formatBar = (
  options: { readonly label: string; readonly unit: string; readonly done: number; readonly total: number },
  seconds: number,
  columns: number
): string => {
  const { done, total } = options
  const fraction = total <= 0 ? 1 : Math.min(1, done / total)
  const clock = (s: number) => `${Math.floor(s / 60)}m${String(Math.round(s % 60)).padStart(2, "0")}s`
  const eta = done > 0 && done < total ? `  eta ${clock((seconds / done) * (total - done))}` : ""
  const tail = ` ${done}/${total} ${options.unit}  ${clock(seconds)}${eta}`
  const width = Math.max(10, Math.min(30, columns - options.label.length - tail.length - 3))
  const filled = Math.round(fraction * width)
  const line = `${options.label} ▕${"█".repeat(filled)}${"░".repeat(width - filled)}▏${tail}`
  return line.slice(0, Math.max(20, columns - 1))
}

/**
 * A bar over `total` groups written with `write`: redrawn in place at most every 100 ms of `now` (and at the last
 * group); `done` clears its line.
 *
 * @category constructors
 * @since 0.1.0
 */
export const bar = (options: {
  readonly label: string
  readonly unit: string
  readonly total: number
  readonly write: (text: string) => void
  readonly now: () => number
  readonly columns?: number | undefined
}): Listener & { readonly done: () => void } => {
  const started = options.now()
  let done = 0
  let drawnAt = Number.NEGATIVE_INFINITY
  let shown = false
  const draw = () => {
    const at = options.now()
    if (at - drawnAt < 100 && done < options.total) return
    drawnAt = at
    shown = true
    options.write(`\r\x1b[2K${formatBar({ ...options, done }, (at - started) / 1000, options.columns ?? 100)}`)
  }
  return {
    groupDone: () => {
      done++
      draw()
    },
    done: () => {
      if (shown) options.write("\r\x1b[2K")
      shown = false
    }
  }
}

/**
 * Runs `self` with a bar over `total` groups on stderr when stdout and stderr are both terminals (`tty`), and as it
 * is otherwise.
 *
 * @category combinators
 * @since 0.1.0
 */
export const withBar = (
  options: { readonly label: string; readonly unit: string; readonly total: number; readonly tty?: boolean }
) =>
<A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> => {
  const tty = options.tty ?? (process.stdout.isTTY === true && process.stderr.isTTY === true)
  if (!tty || options.total <= 0) return self
  return Effect.clockWith((clock) => {
    const shown = bar({
      ...options,
      write: (text) => void process.stderr.write(text),
      now: () => clock.currentTimeMillisUnsafe(),
      // A terminal that does not say its width (0) gets a common one.
      columns: process.stderr.columns || 80
    })
    return self.pipe(Effect.provideService(Progress, shown), Effect.ensuring(Effect.sync(shown.done)))
  })
}
