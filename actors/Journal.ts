/**
 * The run journal: an append-only JSONL file of what a training run has finished — groups collected, learner
 * steps applied, checkpoints written — that makes `agentfly train CONFIG --resume` exact after any stop,
 * `kill -9` included.
 *
 * Every append is one line written whole and fsync'ed before the call returns, so a line is either fully on disk or
 * (after a crash mid-write) a torn tail, which `open` cuts off. On resume the journal is rolled back to its last
 * checkpoint whose files still exist: the entries after it describe work whose weights were lost, so they are cut
 * from the file (and replayed by the resumed run). The journal then lists every learner step exactly once.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Path, Schema, Semaphore } from "effect"
import type { Scope } from "effect"
import * as Checkpoint from "../src/Checkpoint.ts"
import * as DiskFullCheck from "../src/internal/diskFull.ts"
import * as SchemaIssues from "../src/internal/schemaIssues.ts"

// ===== Entries =====

/**
 * A run (re)started; `fromStep` is the learner step it continues from (0 for a fresh run).
 *
 * @category models
 * @since 0.1.0
 */
export const Start = Schema.Struct({
  kind: Schema.Literal("start"),
  fromStep: Schema.Int,
  seed: Schema.Int,
  mode: Schema.String
})

/**
 * A group finished rolling out. `seq` is its position in the run's row order; `policyVersion` the oldest version
 * that sampled it.
 *
 * @category models
 * @since 0.1.0
 */
export const GroupDone = Schema.Struct({
  kind: Schema.Literal("group"),
  seq: Schema.Int,
  groupId: Schema.String,
  rowIndex: Schema.Int,
  policyVersion: Schema.Int,
  meanReward: Schema.Number
})

/**
 * A learner step was applied to the groups with these `seqs`, producing policy version `policyVersion`.
 *
 * @category models
 * @since 0.1.0
 */
export const StepDone = Schema.Struct({
  kind: Schema.Literal("step"),
  step: Schema.Int,
  seqs: Schema.Array(Schema.Int),
  policyVersion: Schema.Int,
  /** A fingerprint of the weights after the step (cheap, for checking that a replay is exact). */
  weightsHash: Schema.optionalKey(Schema.String),
  /** What the learner did (`Learner.Outcome`); journals written before it was recorded read as `applied`. */
  outcome: Schema.optionalKey(Schema.Literals(["applied", "skipped", "critic_only"]))
})

/**
 * The SFT warm-up finished after `steps` steps.
 *
 * @category models
 * @since 0.1.0
 */
export const WarmupDone = Schema.Struct({
  kind: Schema.Literal("warmup"),
  steps: Schema.Int
})

/**
 * A checkpoint of the state after learner step `step` was written (completely) to `path`.
 *
 * @category models
 * @since 0.1.0
 */
export const CheckpointDone = Schema.Struct({
  kind: Schema.Literal("checkpoint"),
  step: Schema.Int,
  path: Schema.String,
  /** The fingerprint of the weights saved (a resume checks the checkpoint it loads against it). */
  weightsHash: Schema.optionalKey(Schema.String)
})

/**
 * A held-out evaluation's figures (`eval/…`) at a step, so that a run's summary holds every evaluation of the run,
 * a resumed run's included.
 *
 * @category models
 * @since 0.1.0
 */
export const EvalDone = Schema.Struct({
  kind: Schema.Literal("eval"),
  step: Schema.Int,
  figures: Schema.Record(Schema.String, Schema.Number)
})

/**
 * The run stopped after its last step.
 *
 * @category models
 * @since 0.1.0
 */
export const Finished = Schema.Struct({
  kind: Schema.Literal("finished"),
  step: Schema.Int
})

/**
 * @category models
 * @since 0.1.0
 */
export const Entry = Schema.Union([Start, GroupDone, StepDone, WarmupDone, CheckpointDone, EvalDone, Finished])
export type Entry = typeof Entry.Type

/**
 * Reading or writing the journal failed.
 *
 * @category errors
 * @since 0.1.0
 */
export class Io extends Schema.TaggedError<Io>()("Io", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * A line before the last is not an entry (a torn last line is not corrupt: it is cut).
 *
 * @category errors
 * @since 0.1.0
 */
export class Corrupt extends Schema.TaggedError<Corrupt>()("Corrupt", {
  message: Schema.String,
  /** The line's number (1-based). */
  line: Schema.Int,
  /** The line's byte offset. */
  byte: Schema.Int
}) {}

/**
 * A write found no space left (ENOSPC); free space and resume (a torn last line is cut then).
 *
 * @category errors
 * @since 0.1.0
 */
export class DiskFull extends Schema.TaggedError<DiskFull>()("DiskFull", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Why the journal could not be read or written.
 *
 * @category errors
 * @since 0.1.0
 */
export const JournalErrorReason = Schema.Union([Io, Corrupt, DiskFull])
export type JournalErrorReason = typeof JournalErrorReason.Type

/**
 * The journal at `path` could not be read or written. Handle reasons with
 * `Effect.catchReason("JournalError", "DiskFull", …)`; `message` is the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class JournalError extends Schema.TaggedError<JournalError>()("JournalError", {
  path: Schema.String,
  reason: JournalErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

// ===== Replay (pure) =====

/**
 * The parsed journal: entries with the byte offset just past each line, and how many bytes of torn tail follow.
 *
 * @category models
 * @since 0.1.0
 */
export interface Replay {
  readonly entries: ReadonlyArray<{ readonly entry: Entry; readonly end: number }>
  /** Byte length of the intact prefix (what the file is cut to). */
  readonly validBytes: number
  readonly tornBytes: number
}

const decodeEntry = Schema.decodeUnknownResult(Schema.fromJsonString(Entry))
const encoder = new TextEncoder()

/**
 * Parses journal bytes. Only the last line may be torn (no newline, or not a valid entry): anything invalid
 * before it means the file was edited or corrupted, and is an error rather than something to guess about.
 *
 * @category constructors
 * @since 0.1.0
 */
export const replay = (bytes: Uint8Array, path = "journal"): Effect.Effect<Replay, JournalError> =>
  Effect.gen(function*() {
    const entries: Array<{ entry: Entry; end: number }> = []
    const decoder = new TextDecoder()
    let start = 0
    while (start < bytes.length) {
      const newline = bytes.indexOf(10, start)
      const end = newline === -1 ? bytes.length : newline + 1
      const decoded = newline === -1 ? undefined : decodeEntry(decoder.decode(bytes.subarray(start, newline)))
      if (decoded === undefined || decoded._tag === "Failure") {
        if (end < bytes.length) {
          const line = decoder.decode(bytes.subarray(start, newline))
          const why = decoded === undefined ? [] : SchemaIssues.formatIssues(Entry, decoded.failure.issue)
          return yield* new JournalError({
            path,
            reason: new Corrupt({
              message: `${path}:${entries.length + 1}: invalid entry at byte ${start}` +
                `${why.length === 0 ? "" : ` (${why.join("; ")})`}: ` +
                (line.length > 160 ? `${line.slice(0, 160)}…` : line),
              line: entries.length + 1,
              byte: start
            })
          })
        }
        return { entries, validBytes: start, tornBytes: bytes.length - start }
      }
      entries.push({ entry: decoded.success, end })
      start = end
    }
    return { entries, validBytes: bytes.length, tornBytes: 0 }
  })

/**
 * The journal's checkpoints, newest first, each with the fingerprint its weights must have: the one journaled
 * with it or, in journals written before checkpoints carried one, that of the learner step it followed (none for a
 * warm-up's checkpoint 0 there).
 *
 * @category getters
 * @since 0.1.0
 */
export const checkpoints = (
  journal: Replay
): Array<{ readonly entry: typeof CheckpointDone.Type; readonly weightsHash: string | undefined }> => {
  const stepHash = new Map<number, string | undefined>()
  const out: Array<{ entry: typeof CheckpointDone.Type; weightsHash: string | undefined }> = []
  for (const { entry } of journal.entries) {
    if (entry.kind === "step") stepHash.set(entry.step, entry.weightsHash)
    if (entry.kind === "checkpoint") out.push({ entry, weightsHash: entry.weightsHash ?? stepHash.get(entry.step) })
  }
  return out.reverse()
}

/**
 * Where a resumed run starts: after the last checkpoint accepted by `usable` (e.g. its files exist), with the
 * byte offset the journal is cut to and the group seqs the kept learner steps consumed. Without a usable
 * checkpoint the run starts over: step 0, cut at byte 0.
 *
 * @category getters
 * @since 0.1.0
 */
export const resumePoint = (
  journal: Replay,
  usable: (checkpoint: typeof CheckpointDone.Type) => boolean
): {
  readonly step: number
  readonly checkpoint: string | undefined
  readonly cutAt: number
  readonly consumed: ReadonlySet<number>
  readonly warmupDone: boolean
} => {
  let index = -1
  for (let i = journal.entries.length - 1; i >= 0 && index === -1; i--) {
    const entry = journal.entries[i]!.entry
    if (entry.kind === "checkpoint" && usable(entry)) index = i
  }
  const kept = journal.entries.slice(0, index + 1).map((e) => e.entry)
  const consumed = new Set(kept.flatMap((e) => (e.kind === "step" ? e.seqs : [])))
  const last = index === -1 ? undefined : journal.entries[index]!
  return {
    step: last?.entry.kind === "checkpoint" ? last.entry.step : 0,
    checkpoint: last?.entry.kind === "checkpoint" ? last.entry.path : undefined,
    cutAt: last?.end ?? 0,
    consumed,
    warmupDone: kept.some((e) => e.kind === "warmup")
  }
}

// ===== The journal =====

/**
 * An open journal.
 *
 * @category models
 * @since 0.1.0
 */
export interface Journal {
  readonly path: string
  /** Appends one entry and fsyncs it. Appends are serialised. */
  readonly append: (entry: Entry) => Effect.Effect<void, JournalError>
  /** Appends entries with one write and one fsync (a torn write loses a suffix of them, never reorders). */
  readonly appendAll: (entries: ReadonlyArray<Entry>) => Effect.Effect<void, JournalError>
  /** All entries on disk, in order (including those appended through this handle). */
  readonly entries: Effect.Effect<ReadonlyArray<Entry>>
}

const io = (path: string) => (e: { readonly message: string }) =>
  DiskFullCheck.isDiskFull(e)
    ? new JournalError({
      path,
      reason: new DiskFull({
        message: `${DiskFullCheck.marker}: could not write ${path}; free space on its filesystem, then resume`,
        cause: e
      })
    })
    : new JournalError({ path, reason: new Io({ message: e.message, cause: e }) })

/**
 * Reads the journal bytes at `path` (empty when the file does not exist).
 *
 * @category constructors
 * @since 0.1.0
 */
export const read = Effect.fn("Journal.read")(function*(path: string) {
  const fs = yield* FileSystem.FileSystem
  const exists = yield* fs.exists(path).pipe(Effect.mapError(io(path)))
  const bytes = exists ? yield* fs.readFile(path).pipe(Effect.mapError(io(path))) : new Uint8Array(0)
  return yield* replay(bytes, path)
})

/**
 * Opens the journal at `path` for appending, first cutting the file to `cutAt` bytes when given (a resume rolls
 * back to its checkpoint) or else to its intact prefix (dropping a torn tail). The file handle closes with the
 * scope.
 *
 * @category constructors
 * @since 0.1.0
 */
export const open = Effect.fn("Journal.open")(function*(
  path: string,
  options: { readonly cutAt?: number } = {}
): Effect.fn.Return<Journal, JournalError, FileSystem.FileSystem | Scope.Scope> {
  const fs = yield* FileSystem.FileSystem
  // A run that starts over keeps nothing, so what the file held (even a damaged journal) is not read.
  const existing: Replay = options.cutAt === 0 ? { entries: [], validBytes: 0, tornBytes: 0 } : yield* read(path)
  const keepBytes = Math.min(options.cutAt ?? existing.validBytes, existing.validBytes)
  const kept = existing.entries.filter((e) => e.end <= keepBytes).map((e) => e.entry)
  const file = yield* fs.open(path, { flag: "a+" }).pipe(Effect.mapError(io(path)))
  yield* file.truncate(keepBytes).pipe(Effect.andThen(file.sync), Effect.mapError(io(path)))
  const all: Array<Entry> = [...kept]
  const lock = yield* Semaphore.make(1)
  const appendAll = (entries: ReadonlyArray<Entry>) =>
    Semaphore.withPermits(lock, 1)(
      Effect.gen(function*() {
        const text = entries.map((entry) => JSON.stringify(entry) + "\n").join("")
        yield* file.writeAll(encoder.encode(text)).pipe(Effect.mapError(io(path)))
        yield* file.sync.pipe(Effect.mapError(io(path)))
        all.push(...entries)
      })
    )
  return { path, append: (entry) => appendAll([entry]), appendAll, entries: Effect.sync(() => [...all]) }
})

/**
 * A run's checkpoint, loaded (its tensors, finite values and saved fingerprint checked by `Checkpoint.load`) and, when
 * it sits in a run (`RUN/checkpoints/NAME` beside `RUN/journal.jsonl`), checked against the journal's fingerprint:
 * its weights and the policy version they are (what a server serving them answers as `policy_version`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const verifiedCheckpoint = Effect.fnUntraced(function*(
  dir: string,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  // A run's folder, or a path that is not there: say which checkpoints there are rather than a missing file's name.
  const inRun = path.join(dir, "checkpoints")
  const isRun = yield* fs.exists(inRun)
  if (isRun || !(yield* fs.exists(dir))) {
    const stepsIn = (folder: string) =>
      Effect.map(fs.readDirectory(folder), (all) => all.filter((n) => n.startsWith("step-")).sort())
    const names = isRun ? yield* stepsIn(inRun) : []
    // A step that is not there in a run's checkpoints (pruned, or never written): the ones that are.
    const siblings = path.basename(path.dirname(path.resolve(dir))) === "checkpoints" &&
        (yield* fs.exists(path.dirname(dir)))
      ? yield* stepsIn(path.dirname(dir))
      : []
    return yield* Checkpoint.checkpointError(
      dir,
      "NotFound",
      names.length > 0
        ? `${dir} is a run's output directory: give one of its checkpoints, e.g. ` + path.join(inRun, names.at(-1)!)
        : siblings.length > 0
        ? `${dir}: no such checkpoint; the run has ${siblings.join(", ")} (it keeps the newest checkpoint.keep ` +
          `of them, 2 by default)`
        : `${dir}: no such checkpoint`
    )
  }
  const loaded = yield* Checkpoint.load(dir, expected)
  const journalPath = path.join(path.dirname(path.dirname(path.resolve(dir))), "journal.jsonl")
  if (!(yield* fs.exists(journalPath))) return loaded
  const recorded = checkpoints(yield* read(journalPath))
    .find((c) => c.entry.path === path.basename(path.resolve(dir)))?.weightsHash
  if (recorded !== undefined && recorded !== loaded.weightsHash) {
    return yield* Checkpoint.checkpointError(
      dir,
      "Corrupt",
      `${dir}: its weights (fingerprint ${loaded.weightsHash}) are not the ones the run's journal ` +
        `recorded (${recorded})`
    )
  }
  return loaded
})
