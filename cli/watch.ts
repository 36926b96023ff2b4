/**
 * `agentfly watch RUN_DIR [--port N] [--host H]`: serves a live view of a run (`src/LiveReport.ts`) while it goes on
 * — the report's charts from `metrics.jsonl`, the newest step's figures and sampled chains, the recent trajectories
 * token by token from `samples.jsonl` — and updates the open page in place whenever the run writes a record
 * (server-sent events). Started before the run, the page waits for its first record; after it, it shows the finished
 * run. Loopback only unless `--host` says otherwise (the page holds the run's prompts and samples).
 *
 * The run's files are tailed, not re-read: each poll reads only the bytes appended since the last one, so a long
 * run's large `samples.jsonl` costs nothing after its first read; a file that shrank (a resumed run rewrote it) is
 * read again from its start.
 *
 * @since 0.1.0
 */
import { Clock, Console, Effect, FileSystem, Option, Schema } from "effect"
import type { Scope } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as Image from "../src/Image.ts"
import * as LiveReport from "../src/LiveReport.ts"
import * as Report from "../src/Report.ts"
import { notAFile } from "./report.ts"
import { exitOnFailure } from "./train.ts"

// ===== Errors =====

/**
 * Why the live view could not be served: the address cannot be listened on (a port in use, a host not on this
 * machine).
 *
 * @category errors
 * @since 0.1.0
 */
export class WatchError extends Schema.TaggedError<WatchError>()("WatchError", { message: Schema.String }) {}

// ===== Tailing the run's files =====

/** A file read up to `offset`; `partial` is its last line while it has no newline yet. */
interface Tail {
  readonly path: string
  offset: number
  partial: string
  decoder: TextDecoder
}

const tailOf = (path: string): Tail => ({ path, offset: 0, partial: "", decoder: new TextDecoder() })

/**
 * The complete lines appended to a file since the last call; `reset` when the file shrank or went away (everything
 * read before is void, and the lines are the file's from its start).
 */
const readAppended = Effect.fnUntraced(function*(fs: FileSystem.FileSystem, tail: Tail) {
  const info = yield* Effect.option(fs.stat(tail.path))
  const size = info._tag === "Some" ? Number(info.value.size) : 0
  const reset = size < tail.offset
  if (reset) Object.assign(tail, tailOf(tail.path))
  if (size === tail.offset) return { reset, lines: [] as Array<string> }
  const chunks: Array<string> = []
  yield* Effect.scoped(Effect.gen(function*() {
    const file = yield* fs.open(tail.path, { flag: "r" })
    while (tail.offset < size) {
      const got = yield* file.readAlloc(Math.min(1 << 20, size - tail.offset), { position: BigInt(tail.offset) })
      if (got._tag === "None" || got.value.length === 0) break
      tail.offset += got.value.length
      chunks.push(tail.decoder.decode(got.value, { stream: true }))
    }
  }))
  const text = tail.partial + chunks.join("")
  const cut = text.lastIndexOf("\n")
  tail.partial = text.slice(cut + 1)
  return { reset, lines: cut < 0 ? [] : text.slice(0, cut).split("\n").filter((l) => l.trim() !== "") }
})

const decodeMetrics = Schema.decodeUnknownOption(Schema.fromJsonString(Report.MetricsRecord))
const decodeSample = Schema.decodeUnknownOption(Schema.fromJsonString(Report.SampleRecord))
const decodeConfig = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))

/** Samples kept in memory: those of this many of the newest steps with samples. */
const keptSampleSteps = 20

/**
 * A run's files as read so far: records, the newest steps' samples, config, whether the journal says it finished,
 * and when a file last grew.
 */
interface Watched {
  readonly dir: string
  readonly files: { readonly metrics: Tail; readonly samples: Tail; readonly journal: Tail }
  metrics: Array<Report.MetricsRecord>
  samples: Array<Report.SampleRecord>
  /** The kept samples' images (`images/<sha256>.png`) as `data:` URLs by hash. */
  images: Map<string, string>
  config: unknown
  finished: boolean
  changedAt: number
}

const watched = (dir: string, now: number): Watched => ({
  dir,
  files: {
    metrics: tailOf(`${dir}/metrics.jsonl`),
    samples: tailOf(`${dir}/samples.jsonl`),
    journal: tailOf(`${dir}/journal.jsonl`)
  },
  metrics: [],
  samples: [],
  images: new Map(),
  config: undefined,
  finished: false,
  changedAt: now
})

/** Keeps the samples of the newest {@link keptSampleSteps} steps. */
const trimSamples = (samples: Array<Report.SampleRecord>): Array<Report.SampleRecord> => {
  const keys = [...new Set(samples.map((s) => `${s.phase} ${s.step}`))]
  if (keys.length <= keptSampleSteps) return samples
  const keep = new Set(keys.slice(-keptSampleSteps))
  return samples.filter((s) => keep.has(`${s.phase} ${s.step}`))
}

/** Reads the sidecar image of each kept sample's image span not read yet; forgets those no sample keeps. */
const readImages = Effect.fnUntraced(function*(fs: FileSystem.FileSystem, run: Watched) {
  const refs = run.samples.flatMap((s) => s.spans.flatMap((span) => (span.image === undefined ? [] : [span.image])))
  const kept = new Set(refs.map((ref) => ref.sha256))
  for (const hash of [...run.images.keys()]) if (!kept.has(hash)) run.images.delete(hash)
  for (const ref of refs) {
    if (run.images.has(ref.sha256)) continue
    const bytes = yield* Effect.option(fs.readFile(`${run.dir}/${Image.sidecarPath(ref)}`))
    if (bytes._tag === "Some") run.images.set(ref.sha256, Image.toDataUrl({ ref, bytes: bytes.value }))
  }
})

/** Reads what the run appended since the last poll; true when anything changed. */
const poll = Effect.fnUntraced(function*(fs: FileSystem.FileSystem, run: Watched) {
  const metrics = yield* readAppended(fs, run.files.metrics)
  const samples = yield* readAppended(fs, run.files.samples)
  const journal = yield* readAppended(fs, run.files.journal)
  if (metrics.reset) run.metrics = []
  if (samples.reset) run.samples = []
  // A journal's `start` begins (or resumes) a run; its `finished` ends it.
  for (const line of journal.lines) {
    if (line.includes(`"kind":"finished"`)) run.finished = true
    else if (line.includes(`"kind":"start"`)) run.finished = false
  }
  run.metrics.push(...metrics.lines.flatMap((l) => Option.toArray(decodeMetrics(l))))
  run.samples = trimSamples([...run.samples, ...samples.lines.flatMap((l) => Option.toArray(decodeSample(l)))])
  yield* readImages(fs, run)
  const changed = metrics.reset || samples.reset || metrics.lines.length + samples.lines.length > 0 ||
    journal.lines.length > 0
  if (changed || run.config === undefined) {
    const text = yield* Effect.option(fs.readFileString(`${run.dir}/config.json`))
    const config = text._tag === "Some" ? decodeConfig(text.value) : Option.none()
    if (config._tag === "Some" && JSON.stringify(config.value) !== JSON.stringify(run.config)) {
      run.config = config.value
      return true
    }
  }
  return changed
})

// ===== The server =====

/**
 * A live view being served.
 *
 * @category models
 * @since 0.1.0
 */
export interface Served {
  /** The page's address (`http://127.0.0.1:8765/`). */
  readonly url: string
  readonly port: number
}

/**
 * @category models
 * @since 0.1.0
 */
export interface ServeOptions {
  /** Default 127.0.0.1. */
  readonly host?: string | undefined
  /** Default 8765; 0 picks a free port. */
  readonly port?: number | undefined
  /** How often the run's files are checked for new records (default 1,000 ms). */
  readonly pollMs?: number | undefined
}

/** Listens for the life of the scope; a port in use or a host not on this machine is a {@link WatchError}. */
const listen = (server: Http.Server, host: string, port: number): Effect.Effect<number, WatchError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.callback<number, WatchError>((resume) => {
      const failed = (e: NodeJS.ErrnoException) =>
        resume(Effect.fail(
          new WatchError({
            message: e.code === "EADDRINUSE"
              ? `port ${port} on ${host} is in use: give another with --port N (0 picks a free one)`
              : `cannot listen on ${host}:${port}: ${e.message}`
          })
        ))
      server.once("error", failed)
      server.listen(port, host, () => {
        server.off("error", failed)
        resume(Effect.succeed((server.address() as AddressInfo).port))
      })
    }),
    () =>
      Effect.callback<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  )

/** Whether a host name is this machine's loopback. */
const loopback = (host: string): boolean => host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host)

/** One server-sent event carrying the view's content. */
const event = (html: string): string => `event: update\ndata: ${JSON.stringify({ html })}\n\n`

/**
 * Serves the live view of the run in `dir` for the life of the scope: the page at `/`, its updates at `/events`.
 * Fails with `Report.ReportError` when `dir` does not exist, with {@link WatchError} when it cannot listen.
 *
 * @category constructors
 * @since 0.1.0
 */
export const serve = Effect.fn("Watch.serve")(function*(dir: string, options: ServeOptions = {}) {
  const fs = yield* FileSystem.FileSystem
  const trimmed = dir.replace(/\/+$/, "") || dir
  yield* notAFile(trimmed)
  if (!(yield* fs.exists(trimmed).pipe(Effect.orElseSucceed(() => false)))) {
    return yield* new Report.ReportError({
      dir,
      message: `${dir} does not exist: give a run's output directory (its config's output, or the --output it ran ` +
        `with; it may be watched before the run writes its first record)`
    })
  }
  const clock = yield* Clock.Clock
  const run = watched(trimmed, clock.currentTimeMillisUnsafe())
  const title = `agentfly run: ${trimmed.split("/").at(-1)} (live)`
  const render = () =>
    LiveReport.fragment({
      metrics: run.metrics,
      samples: run.samples,
      config: run.config,
      finished: run.finished,
      quietFor: (clock.currentTimeMillisUnsafe() - run.changedAt) / 1000,
      images: run.images
    })
  yield* poll(fs, run).pipe(Effect.orElseSucceed(() => false))
  let html = render()
  const clients = new Set<Http.ServerResponse>()
  const host = options.host ?? "127.0.0.1"
  const server = Http.createServer((req, res) => {
    const path = (req.url ?? "/").split("?")[0]
    if (req.method !== "GET") return void res.writeHead(405, { allow: "GET" }).end()
    // On loopback, a page of another site that renamed itself 127.0.0.1 (DNS rebinding) does not read the run.
    if (loopback(host) && !loopback((req.headers.host ?? "").replace(/:\d+$/, "").replace(/^\[|\]$/g, ""))) {
      return void res.writeHead(403, { "content-type": "text/plain" }).end("open the live view at 127.0.0.1\n")
    }
    if (path === "/") {
      return void res.writeHead(200, { "content-type": "text/html; charset=utf-8", "cache-control": "no-store" })
        .end(LiveReport.page(title, html))
    }
    if (path === "/events") {
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-store", connection: "keep-alive" })
      res.write(event(html))
      clients.add(res)
      return void res.on("close", () => clients.delete(res))
    }
    res.writeHead(404, { "content-type": "text/plain" }).end("not found: the live view is at /\n")
  })
  const port = yield* listen(server, host, options.port ?? 8765)
  // A re-render when a record arrives, and now and then anyway, so that "no record for N min" is said.
  let renderedAt = clock.currentTimeMillisUnsafe()
  yield* Effect.gen(function*() {
    const changed = yield* poll(fs, run).pipe(Effect.orElseSucceed(() => false))
    const now = clock.currentTimeMillisUnsafe()
    if (changed) run.changedAt = now
    if (!changed && now - renderedAt < 30_000) return
    renderedAt = now
    html = render()
    for (const client of clients) client.write(event(html))
  }).pipe(
    Effect.andThen(Effect.sleep(options.pollMs ?? 1_000)),
    Effect.forever,
    Effect.forkScoped
  )
  const shown = host.includes(":") ? `[${host}]` : host === "0.0.0.0" ? "127.0.0.1" : host
  return { url: `http://${shown}:${port}/`, port } satisfies Served
})

// ===== The command =====

/**
 * @category commands
 * @since 0.1.0
 */
export const watch = Command.make(
  "watch",
  {
    dir: Argument.String("run-dir").pipe(Argument.withDescription("The run's output directory")),
    port: Flag.Int("port").pipe(
      Flag.withDescription("The port to serve on (default 8765; 0 picks a free one)"),
      Flag.withDefault(8765),
      Flag.filter((n) => n >= 0 && n <= 65535, (n) => `--port must be within 0 and 65535, got ${n}`)
    ),
    host: Flag.String("host").pipe(
      Flag.withDescription("The address to serve on (default 127.0.0.1: this machine only)"),
      Flag.withDefault("127.0.0.1")
    )
  },
  Effect.fn("watch")(function*({ dir, port, host }) {
    yield* Effect.scoped(Effect.gen(function*() {
      const served = yield* serve(dir, { port, host })
      if (!loopback(host)) {
        yield* Console.error(`serving on ${host}: anyone who reaches it sees the run's prompts and samples`)
      }
      yield* Console.log(`watching ${dir} at ${served.url} (Ctrl-C to stop)`)
      return yield* Effect.never
    })).pipe(exitOnFailure)
  })
).pipe(Command.withDescription("Serve a live view of a run (charts, current step, recent trajectories) that updates"))
