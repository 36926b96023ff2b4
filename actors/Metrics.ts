/**
 * What a training run reports as it goes: `metrics.jsonl` (one record per learner step, warm-up step or
 * evaluation, with CleanRL-style namespaced figures such as `rollout/reward_mean`, `learner/kl`,
 * `eval/accuracy`), `samples.jsonl` (a few sampled trajectories per step, token by token, for the report's viewer),
 * and the live display: a progress bar redrawn in place on a terminal, plain log lines otherwise.
 *
 * On resume, records after the resumed step are dropped first, so that each step appears once in the files.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Schema } from "effect"
import type { Scope } from "effect"
import * as MessageImages from "../src/MessageImages.ts"
import * as Report from "../src/Report.ts"
import type * as Trajectory from "../src/Trajectory.ts"

// ===== Records =====

/**
 * One line of `metrics.jsonl` (defined in `src/Report.ts`, which reads it back).
 *
 * @category models
 * @since 0.1.0
 */
export type MetricsRecord = Report.MetricsRecord

/**
 * One line of `samples.jsonl`: a sampled trajectory token by token (defined in `src/Report.ts`).
 *
 * @category models
 * @since 0.1.0
 */
export type SampleRecord = Report.SampleRecord

/**
 * @category errors
 * @since 0.1.0
 */
export class MetricsError extends Schema.TaggedError<MetricsError>()("MetricsError", {
  path: Schema.String,
  message: Schema.String
}) {}

// ===== Files =====

/**
 * The writer of a run's `metrics.jsonl` and `samples.jsonl`.
 *
 * @category models
 * @since 0.1.0
 */
export interface Metrics {
  readonly log: (record: MetricsRecord) => Effect.Effect<void, MetricsError>
  /** Writes the record; with its trajectory, also the images it holds, to `images/<sha256>.png` beside it. */
  readonly sample: (record: SampleRecord, trajectory?: Trajectory.Trajectory) => Effect.Effect<void, MetricsError>
}

const encoder = new TextEncoder()

/** Keeps the lines of a JSONL text whose `step` is at most `upTo` (unparseable lines, e.g. torn, are dropped). */
/**
 * The records a run resumed at learner step `upTo` keeps: those of steps up to it, and every warm-up record (a resume
 * point is a checkpoint, and checkpoints exist only once the warm-up is done; warm-up steps count from 1 on their
 * own). A torn last line is dropped.
 */
const keepUpTo = (text: string, upTo: number): string =>
  text.split("\n").filter((line) => {
    if (line.trim() === "" || !line.endsWith("}")) return false
    const step = /"step":(-?\d+)/.exec(line)?.[1]
    return step !== undefined && (Number(step) <= upTo || line.includes(`"phase":"warmup"`))
  }).map((line) => line + "\n").join("")

/**
 * Opens `metrics.jsonl` and `samples.jsonl` in `dir` for appending. With `resumeFrom`, records of later steps are
 * removed first (they belong to work the resumed run redoes); otherwise the files start empty.
 *
 * @category constructors
 * @since 0.1.0
 */
export const open = Effect.fn("Metrics.open")(function*(
  dir: string,
  options: { readonly resumeFrom?: number } = {}
): Effect.fn.Return<Metrics, MetricsError, FileSystem.FileSystem | Scope.Scope> {
  const fs = yield* FileSystem.FileSystem
  const fail = (path: string) => (e: { readonly message: string }) => new MetricsError({ path, message: e.message })
  const writer = Effect.fnUntraced(function*(name: string) {
    const path = `${dir}/${name}`
    const existing = (yield* fs.exists(path).pipe(Effect.mapError(fail(path))))
      ? yield* fs.readFileString(path).pipe(Effect.mapError(fail(path)))
      : ""
    const kept = options.resumeFrom === undefined ? "" : keepUpTo(existing, options.resumeFrom)
    yield* fs.writeFileString(path, kept).pipe(Effect.mapError(fail(path)))
    const file = yield* fs.open(path, { flag: "a" }).pipe(Effect.mapError(fail(path)))
    return (value: unknown) =>
      file.writeAll(encoder.encode(JSON.stringify(value) + "\n")).pipe(Effect.mapError(fail(path)))
  })
  yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(fail(dir)))
  const metrics = yield* writer("metrics.jsonl")
  const samples = yield* writer("samples.jsonl")
  const images = (trajectory: Trajectory.Trajectory | undefined) =>
    trajectory === undefined
      ? Effect.void
      : MessageImages.writeSidecars(trajectory.messages, dir).pipe(
        Effect.provideService(FileSystem.FileSystem, fs),
        Effect.mapError(fail(`${dir}/images`))
      )
  return {
    log: metrics,
    sample: (record, trajectory) => Effect.andThen(images(trajectory), samples(record))
  }
})

/**
 * Reads a run's records back (see `Report.read`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const read = Report.read

/**
 * A trajectory as a viewer sample: its first segment's spans with each token's text.
 *
 * @category getters
 * @since 0.1.0
 */
export const sampleOf = (
  trajectory: Trajectory.Trajectory,
  phase: "train" | "eval",
  step: number,
  tokenText: (id: number) => string
): SampleRecord => ({
  phase,
  step,
  groupId: trajectory.groupId,
  trajectoryId: trajectory.trajectoryId,
  reward: trajectory.reward,
  termination: trajectory.termination,
  spans: trajectory.segments.flatMap((segment, index) =>
    segment.spans.map((span) => ({
      source: span.source,
      tokens: span.tokenIds.map(tokenText),
      ids: span.tokenIds,
      segment: index,
      ...(span.logprobs === undefined ? {} : { logprobs: span.logprobs }),
      ...(span.image === undefined ? {} : { image: span.image })
    }))
  )
})

// ===== Live display =====

/**
 * What the live display shows.
 *
 * @category models
 * @since 0.1.0
 */
export interface Status {
  readonly phase: "warmup" | "train" | "eval"
  readonly step: number
  readonly total: number
  readonly elapsed: number
  readonly figures: Readonly<Record<string, number>>
}

const fixed = (x: number | undefined, digits: number): string => (x === undefined ? "–" : x.toFixed(digits))

const rate = (x: number | undefined): string =>
  x === undefined ? "–" : x >= 1000 ? `${(x / 1000).toFixed(1)}k` : x.toFixed(0)

/**
 * A duration in seconds as `1h02m`, `3m05s` or `42s`.
 *
 * @category formatting
 * @since 0.1.0
 */
export const formatDuration = (seconds: number): string => {
  const s = Math.max(0, Math.round(seconds))
  if (s >= 3600) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`
  if (s >= 60) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`
  return `${s}s`
}

/**
 * Whether a phase's figures come from a task with tools (a per-tool count, or an invalid call): a task without any
 * (the household's commands are its replies) has no tool-call rate to show.
 *
 * @category getters
 * @since 0.1.0
 */
export const usesTools = (figures: Readonly<Record<string, number>>, prefix: string): boolean =>
  (figures[`${prefix}/invalid_tool_call_rate`] ?? 0) > 0 ||
  Object.keys(figures).some((key) => key.startsWith(`${prefix}/tool_calls/`))

/** `  fail 12%` when some trajectories failed (`<prefix>/failure_share` above 0), else nothing. */
const failureShare = (share: number | undefined): string =>
  share === undefined || !(share > 0) ? "" : `  fail ${share < 0.01 ? "<1" : Math.round(share * 100)}%`

/**
 * The figures of a status as `key value` pairs (the ones a person watches), with the share of failed
 * trajectories (`fail 12%`) when it is above 0.
 *
 * @category formatting
 * @since 0.1.0
 */
export const formatFigures = (status: Status): string => {
  const f = status.figures
  if (status.phase === "warmup") {
    const check = f["warmup/validation_accuracy"] === undefined
      ? ""
      : `  validation accuracy ${fixed(f["warmup/validation_accuracy"], 3)}`
    return `loss ${fixed(f["warmup/loss"], 4)}  tok/s ${rate(f["perf/tokens_per_s"])}${check}`
  }
  if (status.phase === "eval") {
    return `accuracy ${fixed(f["eval/accuracy"], 3)}  reward ${fixed(f["eval/reward_mean"], 3)}` +
      (usesTools(f, "eval") ? `  invalid tool calls ${fixed(f["eval/invalid_tool_call_rate"], 3)}` : "") +
      failureShare(f["eval/failure_share"])
  }
  // A critic's value (PPO with GAE) against the return it learns: the pair that says whether it keeps up.
  const critic = f["critic/value_mean"] === undefined
    ? ""
    : `  value ${fixed(f["critic/value_mean"], 3)}/${fixed(f["critic/return_mean"], 3)}`
  return `reward ${fixed(f["rollout/reward_mean"], 3)}  acc ${fixed(f["rollout/accuracy"], 3)}  ` +
    `kl ${fixed(f["learner/kl"], 4)}${critic}  tok/s ${rate(f["perf/tokens_per_s"])}` +
    failureShare(f["rollout/failure_share"])
}

/**
 * One plain log line (for logs and pipes): `[train] step 12/150 reward 0.41 ... elapsed 1m05s`.
 *
 * @category formatting
 * @since 0.1.0
 */
export const formatLine = (status: Status): string =>
  `[${status.phase}] step ${status.step}/${status.total}  ${formatFigures(status)}  elapsed ${
    formatDuration(status.elapsed)
  }`

/**
 * The terminal progress bar, fitted to `columns`: `train ▕█████░░░░░▏ 12/150 reward 0.410 ... eta 2m10s`.
 *
 * @category formatting
 * @since 0.1.0
 */
export const formatBar = (status: Status, columns: number): string => {
  const fraction = status.total === 0 ? 1 : Math.min(1, status.step / status.total)
  const eta = status.step > 0 ? (status.elapsed / status.step) * (status.total - status.step) : undefined
  const tail = ` ${status.step}/${status.total}  ${formatFigures(status)}  ${
    eta === undefined ? "" : `eta ${formatDuration(eta)}`
  }`
  const head = `${status.phase.padEnd(6)}`
  const width = Math.max(10, Math.min(30, columns - head.length - tail.length - 2))
  const filled = Math.round(fraction * width)
  return (head + "▕" + "█".repeat(filled) + "░".repeat(width - filled) + "▏" + tail).slice(0, Math.max(columns - 1, 20))
}

/**
 * A live display writing to `write`: on a TTY the bar is redrawn in place (`\r`, clear to end of line) and
 * evaluations and phase changes are kept as lines above it; elsewhere every update is a plain line, at most one per
 * `everySteps` steps (evaluations and the last step always print; a phase of at most 20 steps prints each).
 *
 * @category constructors
 * @since 0.1.0
 */
export const display = (options: {
  readonly write: (text: string) => void
  readonly tty: boolean
  readonly columns?: number
  readonly everySteps?: number
}): { readonly update: (status: Status) => Effect.Effect<void>; readonly done: Effect.Effect<void> } => {
  let barShown = false
  let lastPhase: Status["phase"] | undefined
  const every = options.everySteps ?? 1
  const update = (status: Status) =>
    Effect.sync(() => {
      const keep = status.phase === "eval" || (lastPhase !== undefined && lastPhase !== status.phase)
      lastPhase = status.phase
      if (!options.tty) {
        // A short phase prints every step: one that skipped most of its few steps would look as if it lost them.
        const stride = status.total <= 20 ? 1 : every
        if (keep || status.step % stride === 0 || status.step === status.total) options.write(formatLine(status) + "\n")
        return
      }
      // A phase change keeps the finished bar on its line; evaluations print a line and the bar redraws below.
      if (keep && barShown && status.phase !== "eval") options.write("\n")
      if (status.phase === "eval") {
        options.write(`\r\x1b[2K${formatLine(status)}\n`)
        barShown = false
        return
      }
      options.write(`\r\x1b[2K${formatBar(status, options.columns ?? 100)}`)
      barShown = true
    })
  const done = Effect.sync(() => {
    if (barShown) options.write("\n")
    barShown = false
  })
  return { update, done }
}
