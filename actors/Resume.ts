/**
 * Resuming a run: {@link check} reads its journal once and compares the config with the one it was started with
 * (naming every key that changed; a changed config is refused unless forced, more or fewer steps need no force);
 * {@link load} then loads the newest intact checkpoint into the learner (it loads, its weights are finite and their
 * fingerprint is the journal's), saying which newer ones it refused and why. A fresh run is a resume from nothing
 * ({@link fresh}). The training loop calls both once; a caller that prints something of its own before the run (the
 * CLI's header) checks first and hands the result over, so that a refused resume says only why. When a run is
 * interrupted, {@link interruptedNote} says where it stopped and what a resume continues from.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Result, Schema } from "effect"
import * as Report from "../src/Report.ts"
import * as Task from "../src/Task.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import * as Journal from "./Journal.ts"
import type { Learner } from "./Learner.ts"
import * as RunError from "./RunError.ts"

/**
 * What a run was asked: to continue its output directory (`resume`), even with a changed config (`forceResume`).
 *
 * @category models
 * @since 0.1.0
 */
export interface Request {
  readonly resume?: boolean | undefined
  readonly forceResume?: boolean | undefined
}

/**
 * What {@link check} found before anything is loaded: the run's journal (empty for a fresh run), the changes of the
 * config from the one the run was started with, and the change of its steps, if any.
 *
 * @category models
 * @since 0.1.0
 */
export interface Checked {
  readonly existing: Journal.Replay
  readonly stepsChange?: string
  readonly changed: ReadonlyArray<string>
}

/**
 * A fresh run: no journal, nothing changed.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fresh: Checked = { existing: { entries: [], validBytes: 0, tornBytes: 0 }, changed: [] }

/**
 * Where a run starts: the step of the checkpoint it resumes from (0 for a fresh run), that checkpoint, where the
 * journal is cut, and the journal as read.
 *
 * @category models
 * @since 0.1.0
 */
export type Point = ReturnType<typeof Journal.resumePoint> & { readonly existing: Journal.Replay }

/**
 * What differs between the config a run was started with and `config`: its recorded `config.json` (`output`
 * aside: a run may move; `telemetry` too: where traces go changes nothing the run computes), or for a run without one the seed and mode its journal's first start recorded.
 */
const changesSinceStart = Effect.fnUntraced(function*(
  fs: FileSystem.FileSystem,
  out: string,
  journal: Journal.Replay,
  config: TrainConfig.TrainConfig
) {
  const io = RunError.wrap("Journal")
  const file = `${out}/config.json`
  const current = JSON.parse(JSON.stringify(config)) as unknown
  if (yield* fs.exists(file).pipe(Effect.mapError(io))) {
    const text = yield* fs.readFileString(file).pipe(Effect.mapError(io))
    const recorded = yield* Effect.try({
      try: () => JSON.parse(text) as unknown,
      catch: (e) => RunError.runError("Resume", `${file} is not the run's config: ${String(e)}`, e)
    })
    // Decoded as this version decodes it, so that defaults written out since the run started are not changes.
    const normalized = yield* TrainConfig.decode(recorded).pipe(
      Effect.map((config) => JSON.parse(JSON.stringify(config)) as unknown),
      Effect.orElseSucceed(() => recorded)
    )
    const comparable = withRecordedPathOptions(withRecordedTask(normalized, current), current)
    return TrainConfig.changes(comparable, current, ["output", "telemetry"])
  }
  const start = journal.entries.map((e) => e.entry).find((e) => e.kind === "start")
  return start?.kind === "start"
    ? TrainConfig.changes({ seed: start.seed, mode: start.mode }, { seed: config.seed, mode: config.mode })
    : []
})

/**
 * A recorded config whose task module path is relative (written before such paths were resolved) names it from a
 * config file no longer known: the current config's absolute path to a module of the same file name is taken as it;
 * so is the current module when none was recorded (a module run directly, before it recorded itself).
 *
 * @category getters
 * @since 0.1.0
 */
export const withRecordedTask = (recorded: unknown, current: unknown): unknown => {
  const nameOf = (config: unknown) => {
    const task = typeof config === "object" && config !== null ? (config as { task?: unknown }).task : undefined
    return typeof task === "string" ? task : (task as { name?: unknown } | undefined)?.name
  }
  const [before, after] = [nameOf(recorded), nameOf(current)]
  // Unset: a module run directly, recorded before it named itself.
  if (before === undefined && typeof after === "string" && Task.isModulePath(after) && typeof recorded === "object") {
    return { ...(recorded as object), task: (current as { task: unknown }).task }
  }
  if (typeof before !== "string" || typeof after !== "string" || !Task.isModulePath(before)) return recorded
  if (before.startsWith("/") || !after.startsWith("/") || before.split("/").at(-1) !== after.split("/").at(-1)) {
    return recorded
  }
  const task = (recorded as { task: unknown }).task
  return { ...(recorded as object), task: typeof task === "string" ? after : { ...(task as object), name: after } }
}

/**
 * A recorded config whose task's path options are relative (written before a run recorded them absolute) names them
 * from a config file no longer known: the current absolute value of an option is taken as it when it ends with the
 * recorded path (`../data/folders` and `/work/data/folders`). Only a path option is relative before and absolute now.
 *
 * @category getters
 * @since 0.1.0
 */
export const withRecordedPathOptions = (recorded: unknown, current: unknown): unknown => {
  const optionsOf = (config: unknown): Record<string, unknown> | undefined => {
    const task = typeof config === "object" && config !== null ? (config as { task?: unknown }).task : undefined
    const options = typeof task === "object" && task !== null ? (task as { options?: unknown }).options : undefined
    return typeof options === "object" && options !== null ? options as Record<string, unknown> : undefined
  }
  const [before, after] = [optionsOf(recorded), optionsOf(current)]
  if (before === undefined || after === undefined) return recorded
  // `../data/folders/` ends `/work/data/folders` as `data/folders`.
  const tail = (path: string) => path.replace(/^(\.\.?\/)+/, "").replace(/\/+$/, "")
  const options = Object.fromEntries(Object.entries(before).map(([key, value]) => {
    const now = after[key]
    const same = typeof value === "string" && !value.startsWith("/") && tail(value) !== "" && typeof now === "string" &&
      now.startsWith("/") && now.endsWith(`/${tail(value)}`)
    return [key, same ? now : value]
  }))
  const task = (recorded as { task: object }).task
  return { ...(recorded as object), task: { ...task, options } }
}

/**
 * What a resume finds before it loads anything: the run's journal, and the changes of `config` from the config the
 * run was started with. A changed config is refused unless forced (more or fewer steps need no force). `run` does
 * this first; a caller that prints something of its own before the run (the CLI's header) can do it before that,
 * so that a refused resume says only why.
 *
 * @category constructors
 * @since 0.1.0
 */
export const check = Effect.fnUntraced(function*(
  config: TrainConfig.TrainConfig,
  resume: Request
): Effect.fn.Return<Checked, RunError.RunError, FileSystem.FileSystem> {
  const fs = yield* FileSystem.FileSystem
  const out = config.output
  const existing = resume.resume === true
    ? yield* Journal.read(`${out}/journal.jsonl`).pipe(Effect.mapError(RunError.wrap("Journal")))
    : { entries: [], validBytes: 0, tornBytes: 0 }
  if (existing.entries.length === 0) return { existing, changed: [] }
  const all = yield* changesSinceStart(fs, out, existing, config)
  // More (or fewer) steps continue the same run: no need to force that.
  const stepsChange = all.find((c) => c.startsWith("algorithm.steps: "))
  const changed = all.filter((c) => c !== stepsChange)
  if (changed.length > 0 && resume.forceResume !== true) {
    return yield* RunError.runError(
      "Resume",
      `${out} was started with another config: ${changed.join("; ")}. Resume it with its own config ` +
        `(${out}/config.json), or force the resume with this one (--force-resume)`
    )
  }
  return stepsChange === undefined ? { existing, changed } : { existing, stepsChange, changed }
})

/**
 * Where a run starts, from what {@link check} found. A new run (not `--resume`): step 0. A resumed one: the newest
 * intact checkpoint loaded into the learner; newer ones that do not load, hold non-finite weights or weights other
 * than the journal's are refused (and named), and the run goes on from an older one. What the user should know (a
 * forced resume, a refused checkpoint, nothing left to train) is said through `notice`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fnUntraced(function*(
  learner: Learner["Service"],
  config: TrainConfig.TrainConfig,
  checked: Checked,
  notice: (message: string) => Effect.Effect<void>
): Effect.fn.Return<Point, RunError.RunError, FileSystem.FileSystem> {
  const fs = yield* FileSystem.FileSystem
  const out = config.output
  const checkpoints = `${out}/checkpoints`
  const io = RunError.wrap("Journal")
  const { existing, stepsChange, changed } = checked
  if (changed.length > 0) yield* notice(`resuming ${out} with a changed config (forced): ${changed.join("; ")}`)
  const present = new Set(yield* fs.readDirectory(checkpoints).pipe(Effect.mapError(io)))
  // The newest intact checkpoint, loaded: newer ones that do not load, hold non-finite weights or weights other than
  // the journal's are refused (and named), and the run goes on from an older one.
  const refused: Array<string> = []
  let resumeFrom: typeof Journal.CheckpointDone.Type | undefined
  for (const candidate of Journal.checkpoints(existing).filter((c) => present.has(c.entry.path))) {
    const loaded = yield* Effect.result(
      learner.load(`${checkpoints}/${candidate.entry.path}`).pipe(
        Effect.andThen(learner.fingerprint),
        Effect.flatMap((hash) =>
          candidate.weightsHash === undefined || hash === candidate.weightsHash
            ? Effect.void
            : Effect.fail(RunError.runError(
              "Checkpoint",
              `its weights (fingerprint ${hash}) are not the ones the journal recorded (${candidate.weightsHash})`
            ))
        )
      )
    )
    if (Result.isSuccess(loaded)) {
      resumeFrom = candidate.entry
      break
    }
    refused.push(`${candidate.entry.path}: ${loaded.failure.message}`)
  }
  if (resumeFrom === undefined && refused.length > 0) {
    return yield* RunError.runError("Checkpoint", `no intact checkpoint to resume ${out} from: ${refused.join("; ")}`)
  }
  const point = Journal.resumePoint(existing, (c) => c === resumeFrom)
  // A finished run resumed, or fewer steps than it has done: the loops below have nothing to do, which said nothing.
  const nothingLeft = point.checkpoint !== undefined && point.step >= config.algorithm.steps
  // Said only when those steps are still to train: fewer steps than the run has done is "nothing left", below.
  if (stepsChange !== undefined && !nothingLeft) {
    yield* notice(
      `resuming ${out} for ${config.algorithm.steps} steps (${stepsChange})` +
        (config.algorithm.lrSchedule === "cosine" ? `: the cosine learning-rate schedule now spans them` : "")
    )
  }
  if (resumeFrom !== undefined && refused.length > 0) {
    yield* notice(
      `resuming from ${resumeFrom.path} (step ${resumeFrom.step}), the newest intact checkpoint; refused: ` +
        refused.join("; ")
    )
  } else if (resumeFrom !== undefined) {
    yield* notice(`resuming ${out} from ${resumeFrom.path} (step ${resumeFrom.step})`)
  } else if (existing.entries.length > 0) {
    yield* notice(
      `${out} has no checkpoint yet (the first is written when the warm-up ends, or at step ` +
        `${config.checkpoint.every}): the run starts over`
    )
  }
  if (nothingLeft) {
    yield* notice(
      `${out} is at step ${point.step} and algorithm.steps is ${config.algorithm.steps}: nothing left to train ` +
        `(more steps continue it: --steps N, or algorithm.steps raised)`
    )
  }
  return { ...point, existing }
})

const decodeRecord = Schema.decodeUnknownResult(Schema.fromJsonString(Report.MetricsRecord))

/**
 * Where an interrupted run stopped and what a resume starts from, in words: the last record of its `metrics.jsonl`
 * and the newest checkpoint of its journal. Before the warm-up ends there is none, and a resume starts over.
 *
 * @category getters
 * @since 0.1.0
 */
export const interruptedNote = Effect.fn("Resume.interruptedNote")(function*(config: TrainConfig.TrainConfig) {
  const fs = yield* FileSystem.FileSystem
  const out = config.output
  const records = (yield* fs.readFileString(`${out}/metrics.jsonl`).pipe(Effect.orElseSucceed(() => "")))
    .split("\n").flatMap((line) => {
      const r = decodeRecord(line)
      return r._tag === "Success" ? [r.success] : []
    })
  const last = records.at(-1)
  const trained = records.filter((r) => r.phase === "train").at(-1)?.step ?? 0
  const journal = yield* Journal.read(`${out}/journal.jsonl`).pipe(
    Effect.orElseSucceed((): Journal.Replay => ({ entries: [], validBytes: 0, tornBytes: 0 }))
  )
  const checkpoint = Journal.checkpoints(journal)[0]?.entry
  const where = last === undefined
    ? "before its first step"
    : last.phase === "warmup"
    ? `during the warm-up, after its step ${last.step} of ${config.warmup?.steps ?? "?"}`
    : last.phase === "eval"
    ? `after the evaluation at step ${last.step}`
    : `after step ${last.step} of ${config.algorithm.steps}`
  const saved = checkpoint === undefined
    ? `no checkpoint yet (${
      config.warmup === undefined
        ? `the first is written at step ${config.checkpoint.every}`
        : "the first, step-000000, is written when the warm-up ends"
    }), so a resume starts the run over`
    : `its newest checkpoint is ${out}/checkpoints/${checkpoint.path} (step ${checkpoint.step}), which a resume ` +
      `continues from` +
      (trained <= checkpoint.step
        ? ""
        : trained === checkpoint.step + 1
        ? `, replaying step ${trained} exactly`
        : `, replaying steps ${checkpoint.step + 1}–${trained} exactly`)
  return `interrupted ${where}: ${saved}`
})
