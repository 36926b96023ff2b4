/**
 * The Tinker server's durable record: every request it accepted (sessions, and the calls that make futures) and
 * every future's outcome, one JSON line each, appended and fsync'ed before the server answers. It is what makes a
 * retried call return the same future and what a restarted server replays (`TinkerServer.ts`): the learner is
 * deterministic on the CPU, so running the accepted calls again in their order rebuilds each model's weights and
 * optimiser state exactly, and a future that was running when the process died runs once, in the new process.
 *
 * A torn last line (the process died inside a write) is dropped on reading: its request was never answered, so its
 * client sends it again.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Schema, Semaphore } from "effect"
import type { Scope } from "effect"
import { RequestErrorCategory } from "../../src/tinker/Types.ts"

// ===== Models =====

/**
 * An accepted request: `route` is the SDK's (`forward_backward`, …), `body` its JSON as the Schemas encode it.
 *
 * @category models
 * @since 0.1.0
 */
export const Accepted = Schema.Struct({
  t: Schema.Literal("request"),
  id: Schema.String,
  route: Schema.String,
  body: Schema.Unknown,
  /** The `X-Idempotency-Key` it came with. */
  key: Schema.optionalKey(Schema.String),
  /** The model it addresses (assigned here for `create_model`). */
  model: Schema.optionalKey(Schema.String),
  seq: Schema.optionalKey(Schema.Int)
})
export type Accepted = typeof Accepted.Type

/**
 * A future's outcome: the result's JSON, or a failure with the API's category.
 *
 * @category models
 * @since 0.1.0
 */
export const Outcome = Schema.Struct({
  t: Schema.Literal("outcome"),
  id: Schema.String,
  ok: Schema.optionalKey(Schema.Unknown),
  failed: Schema.optionalKey(Schema.Struct({ error: Schema.String, category: RequestErrorCategory }))
})
export type Outcome = typeof Outcome.Type

/**
 * A session created here.
 *
 * @category models
 * @since 0.1.0
 */
export const Session = Schema.Struct({ t: Schema.Literal("session"), id: Schema.String })
export type Session = typeof Session.Type

/**
 * A snapshot of a model's state (`Models.snapshot`) in `dir`, taken right after future `after`: a replay restores it
 * instead of running that model's calls up to `after` again.
 *
 * @category models
 * @since 0.1.0
 */
export const Snapshot = Schema.Struct({
  t: Schema.Literal("snapshot"),
  model: Schema.String,
  after: Schema.String,
  dir: Schema.String
})
export type Snapshot = typeof Snapshot.Type

/**
 * @category models
 * @since 0.1.0
 */
export const Entry = Schema.Union([Accepted, Outcome, Session, Snapshot])
export type Entry = typeof Entry.Type

/**
 * The log: its entries so far and a way to add one (written and fsync'ed when the effect ends).
 *
 * @category models
 * @since 0.1.0
 */
export interface FutureLog {
  readonly entries: ReadonlyArray<Entry>
  readonly append: (entry: Entry) => Effect.Effect<void>
}

// ===== Constructors =====

const decodeLine = Schema.decodeUnknownOption(Schema.fromJsonString(Entry))

/** The intact entries of `text` and the byte length they take (a torn or foreign tail is left out). */
const parse = (text: string): { readonly entries: Array<Entry>; readonly bytes: number } => {
  const entries: Array<Entry> = []
  let bytes = 0
  for (const line of text.split("\n").slice(0, -1)) {
    const decoded = decodeLine(line)
    if (decoded._tag === "None") break
    entries.push(decoded.value)
    bytes += Buffer.byteLength(line) + 1
  }
  return { entries, bytes }
}

/**
 * The intact entries of the log at `path` (none when there is no file), without opening it for writing: a look at
 * the log of a server that may be running.
 *
 * @category constructors
 * @since 0.1.0
 */
export const read = Effect.fn("FutureLog.read")(function*(path: string) {
  const fs = yield* FileSystem.FileSystem
  const exists = yield* fs.exists(path).pipe(Effect.orDie)
  return exists ? parse(yield* fs.readFileString(path).pipe(Effect.orDie)).entries : []
})

/**
 * Opens (or creates) the log at `path`, cut to its intact prefix. The file stays open for the scope.
 *
 * **Gotchas**: a failure to write is a defect here: a server that cannot record what it accepted must not answer.
 *
 * @category constructors
 * @since 0.1.0
 */
export const open = Effect.fn("FutureLog.open")(function*(
  path: string
): Effect.fn.Return<FutureLog, never, FileSystem.FileSystem | Scope.Scope> {
  const fs = yield* FileSystem.FileSystem
  const text = (yield* fs.exists(path).pipe(Effect.orDie)) ? yield* fs.readFileString(path).pipe(Effect.orDie) : ""
  const { entries, bytes } = parse(text)
  const file = yield* fs.open(path, { flag: "a+" }).pipe(Effect.orDie)
  yield* file.truncate(bytes).pipe(Effect.andThen(file.sync), Effect.orDie)
  const lock = yield* Semaphore.make(1)
  const encoder = new TextEncoder()
  const all: Array<Entry> = entries
  const append = (entry: Entry) =>
    lock.withPermits(1)(Effect.gen(function*() {
      yield* file.writeAll(encoder.encode(JSON.stringify(entry) + "\n")).pipe(Effect.orDie)
      yield* file.sync.pipe(Effect.orDie)
      all.push(entry)
    }))
  return { entries: all, append }
})

/**
 * A log kept in memory only (a server without a state directory: nothing survives it).
 *
 * @category constructors
 * @since 0.1.0
 */
export const inMemory = (): FutureLog => {
  const entries: Array<Entry> = []
  return { entries, append: (entry) => Effect.sync(() => void entries.push(entry)) }
}
