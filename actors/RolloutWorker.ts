/**
 * Rollout workers: a run's training batches rolled out in other processes, here or on other machines. A worker
 * (`agentfly rollout-worker CONFIG`) loads the same config and task as the trainer and runs chains, tools, rewards
 * and environments (its own resource manager) for the rows it is sent, sampling on the run's inference servers
 * (`engine.servers`, `InferenceServers` without pushing: the trainer pushes); the trainer (`rollout.workers`) splits
 * each batch's rows into contiguous shares, one per worker, and gathers the groups.
 *
 * - **The same batch as at home.** A share carries its first row's index in the batch (`Rollout.Options.rowOffset`),
 *   so its groups get the ids, row indices and seeds one process would give them; the trainer orders them by row.
 * - **The same run.** Each request names the run's *agent key* (the task's name and the config's `agent` section,
 *   hashed): a worker started with another config answers 409 and the run stops with a `RunError` (`Workers`)
 *   naming the difference, instead of training on someone else's rollouts.
 * - **A dead worker.** A share whose worker fails (refused connection, reset, timeout, 5xx) goes to the next worker
 *   that answers, with a log line; the run stops (`Workers`) only when every worker failed the same share.
 * - **A long share, a hung worker.** A worker answers a share's headers at once and then writes a heartbeat line
 *   every few seconds until its groups are ready, so a share may last as long as `rollout.timeoutSeconds` (no HTTP
 *   client's header timeout cuts it) and a worker that stops writing (hung, stopped, its machine cut off) is given up
 *   after `silenceMs` instead of at the end of that limit.
 *
 * The wire: `GET /v1/worker` → `{ task, agentKey, agent }`; `POST /v1/rollouts` with `{ agentKey, rows, firstSeq,
 * rowOffset, chains, temperature, seed, version }` → 200 and NDJSON: `{ "heartbeat": true }` lines, then one line
 * `{ groups, env, servers }` (`Trajectory.Group`, JSON codec; the worker's environment figures and its sampling
 * counts) or `{ error: { message, code } }`. A request refused before
 * it runs (bad body, another config, a wrong token) is a plain 4xx.
 *
 * @since 0.1.0
 */
import { Cause, Clock, Effect, FiberSet, Layer, Option, Schema } from "effect"
import type { Scope } from "effect"
import { createHash } from "node:crypto"
import * as Http from "node:http"
import type * as Dataset from "../src/Dataset.ts"
import { Conversation } from "../src/Message.ts"
import { Sampler } from "../src/Sampler.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import * as Trajectory from "../src/Trajectory.ts"
import type * as InferenceServers from "./InferenceServers.ts"
import { fetchMessage, listen, readBody } from "./internal/http.ts"
import * as Rollouts from "./Rollouts.ts"
import type { RolloutSetup } from "./RolloutSetup.ts"
import { type RunError, runError } from "./RunError.ts"

// ===== Wire =====

/** @internal */
export const WireRow = Schema.Struct({
  index: Schema.Int,
  line: Schema.Int,
  question: Schema.optionalKey(Schema.String),
  messages: Schema.optionalKey(Conversation),
  fields: Schema.Record(Schema.String, Schema.Unknown)
})

/** @internal */
export const RolloutRequest = Schema.Struct({
  agentKey: Schema.String,
  rows: Schema.Array(WireRow),
  firstSeq: Schema.Int,
  rowOffset: Schema.Int,
  chains: Schema.Int,
  temperature: Schema.Number,
  seed: Schema.Int,
  version: Schema.Int
})

/** @internal */
export const RolloutResponse = Schema.toCodecJson(Schema.Struct({
  groups: Schema.Array(Trajectory.Group),
  /** The worker's environment figures after the share (`env/<resource>/…`, `TaskRuntime.environmentStats`). */
  env: Schema.optionalKey(Schema.Record(Schema.String, Schema.Number)),
  /** The worker's sampling requests since its previous answer (`servers/requests`, `servers/failures`). */
  servers: Schema.optionalKey(Schema.Record(Schema.String, Schema.Number))
}))
/** @internal */
export const decodeResponse = Schema.decodeUnknownEffect(Schema.fromJsonString(RolloutResponse))
const WorkerInfo = Schema.Struct({
  task: Schema.String,
  agentKey: Schema.String,
  /** The worker's `agent` section, so that a mismatch can name its keys (absent from older workers). */
  agent: Schema.optionalKey(Schema.Unknown)
})

/** A heartbeat line of a share's answer. */
const heartbeat = `${JSON.stringify({ heartbeat: true })}\n`

/**
 * What must agree between a trainer and its workers for a worker's rollouts to be the run's: the task's name and
 * the config's `agent` section (prompt, turns, chains, budgets, temperature, template, tools), hashed.
 *
 * @category constructors
 * @since 0.1.0
 */
export const agentKey = (taskName: string, config: TrainConfig.TrainConfig): string =>
  createHash("sha256").update(JSON.stringify([taskName, config.agent])).digest("hex").slice(0, 16)

/** The counts of a run's inference servers that a worker's sampling adds to. */
const serverCounts = ["servers/requests", "servers/failures"] as const

/**
 * A worker's sampling counts since its previous read (`InferenceServers.figures`), to send with a share's groups.
 *
 * @category getters
 * @since 0.1.0
 */
export const samplingCounts = (
  servers: InferenceServers.InferenceServers
): Effect.Effect<Record<string, number>> =>
  Effect.map(servers.figures, (figures) =>
    Object.fromEntries(serverCounts.map((key) => [key, figures[key] ?? 0]))
  )

/**
 * Adds `more`'s counts to `into` (missing keys count 0).
 *
 * @category getters
 * @since 0.1.0
 */
export const addCounts = (into: Record<string, number>, more: Readonly<Record<string, number>>): void => {
  for (const [key, value] of Object.entries(more)) into[key] = (into[key] ?? 0) + value
}

/**
 * The environment figures of several workers as one run's: the latest snapshot of each, counts and gauges summed,
 * wait-time percentiles and maxima the largest of them (the pools' own percentiles cannot be merged exactly).
 *
 * @category getters
 * @since 0.1.0
 */
export const mergeEnvFigures = (snapshots: Iterable<Readonly<Record<string, number>>>): Record<string, number> => {
  const out: Record<string, number> = {}
  for (const snapshot of snapshots) {
    for (const [key, value] of Object.entries(snapshot)) {
      out[key] = key.endsWith("_ms") ? Math.max(out[key] ?? 0, value) : (out[key] ?? 0) + value
    }
  }
  return out
}

// ===== Worker =====

/**
 * @category models
 * @since 0.1.0
 */
export interface WorkerOptions {
  /** Default `127.0.0.1`. */
  readonly host?: string | undefined
  /** Default 0: a free port. */
  readonly port?: number | undefined
  /** Largest request body, in bytes (default 64 MiB). */
  readonly maxBodyBytes?: number | undefined
  /**
   * A shared secret every request must bear (`Authorization: Bearer`); a worker runs the task's tools and sandboxes
   * on whatever rows it is sent, so one listening beyond loopback should have one (`AGENTFLY_WORKER_TOKEN`).
   */
  readonly token?: string | undefined
  /** How often a share's answer says the worker is alive while its chains run (default 5 s). */
  readonly heartbeatMs?: number | undefined
}

const send = (res: Http.ServerResponse, status: number, body: unknown) =>
  Effect.sync(() => {
    if (res.headersSent) return
    res.writeHead(status, { "content-type": "application/json" })
    res.end(JSON.stringify(body))
  })

const errorBody = (message: string, code: string) => ({ error: { message, code } })

const readJson = (req: Http.IncomingMessage, maxBytes: number) =>
  Effect.flatMap(readBody(req, maxBytes), (bytes) =>
    Effect.try({
      try: () => JSON.parse(bytes.toString("utf8")) as unknown,
      catch: () => ({ status: 400, message: "the request body is not valid JSON" })
    }))

/**
 * Serves `agent`'s rollouts over HTTP in the current scope, sampling on `servers`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const serve = Effect.fn("RolloutWorker.serve")(function*(
  agent: RolloutSetup,
  servers: InferenceServers.InferenceServers,
  options: WorkerOptions = {}
): Effect.fn.Return<{ readonly port: number; readonly baseUrl: string }, never, Scope.Scope> {
  const key = agentKey(agent.runtime.task.name, agent.config)
  const run = yield* FiberSet.makeRuntime<never>()
  const host = options.host ?? "127.0.0.1"

  /** A share's request, or why it is refused before anything runs (a plain 4xx). */
  const check = (body: unknown) =>
    Effect.gen(function*() {
      const request = yield* Schema.decodeUnknownEffect(RolloutRequest)(body).pipe(
        Effect.mapError((e) => ({ status: 400, body: errorBody(e.message, "invalid_request") }))
      )
      if (request.agentKey !== key) {
        return yield* Effect.fail({
          status: 409,
          body: errorBody(
            `this worker runs task ${JSON.stringify(agent.runtime.task.name)} with another agent config ` +
              `(key ${key}, the run's ${request.agentKey}): start it with the run's config`,
            "agent_mismatch"
          )
        })
      }
      return request
    })

  /** A share's groups, as the answer's last line. */
  const rollouts = (request: typeof RolloutRequest.Type) =>
    Effect.gen(function*() {
      const groups = yield* Rollouts.collectGroups(agent, request.rows as ReadonlyArray<Dataset.Row>, request).pipe(
        Effect.provideService(Sampler, servers.sampler(request.version)),
        Effect.mapError((e) => errorBody(e.message, e.reason._tag))
      )
      const env = yield* agent.runtime.environmentStats
      const sampled = yield* samplingCounts(servers)
      const answer = yield* Schema.encodeEffect(RolloutResponse)({ groups, env, servers: sampled }).pipe(
        Effect.mapError((e) => errorBody(e.message, "unencodable"))
      )
      return JSON.stringify(answer)
    })

  /**
   * Answers at once and writes a heartbeat line every `heartbeatMs` while `work` runs, then its line: a client's
   * header and body timeouts (Node's fetch: 5 minutes) never cut a long share, and a silent worker is a dead one.
   */
  const streamed = (res: Http.ServerResponse, work: Effect.Effect<string, ReturnType<typeof errorBody>>) =>
    Effect.acquireUseRelease(
      Effect.sync(() => {
        res.writeHead(200, { "content-type": "application/x-ndjson", "cache-control": "no-store" })
        res.write(heartbeat)
        return setInterval(() => res.write(heartbeat), options.heartbeatMs ?? 5_000)
      }),
      () =>
        Effect.exit(work).pipe(Effect.map((exit) =>
          exit._tag === "Success"
            ? exit.value
            : JSON.stringify(
              Cause.hasInterruptsOnly(exit.cause)
                ? errorBody("the share was interrupted", "interrupted")
                : Cause.findErrorOption(exit.cause).pipe(Option.getOrElse(() =>
                  errorBody(`internal error: ${String(Cause.squash(exit.cause))}`, "defect")
                ))
            )
        ), Effect.flatMap((line) => Effect.sync(() => res.end(`${line}\n`)))),
      (timer) => Effect.sync(() => clearInterval(timer))
    )

  const route = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
    const path = (req.url ?? "/").split("?")[0]!.replace(/\/+$/, "")
    if (options.token !== undefined && req.headers.authorization !== `Bearer ${options.token}`) {
      return send(res, 401, errorBody("a valid bearer token is required (AGENTFLY_WORKER_TOKEN)", "unauthorized"))
    }
    if (path === "/v1/worker" && req.method === "GET") {
      return send(res, 200, { task: agent.runtime.task.name, agentKey: key, agent: agent.config.agent })
    }
    if (path === "/v1/rollouts" && req.method === "POST") {
      return readJson(req, options.maxBodyBytes ?? 64 * 1024 * 1024).pipe(
        Effect.mapError((e) => ({ status: e.status, body: errorBody(e.message, "invalid_request") })),
        Effect.flatMap(check),
        Effect.matchEffect({
          onSuccess: (request) => streamed(res, rollouts(request)),
          onFailure: (e) => send(res, e.status, e.body)
        })
      )
    }
    return send(res, 404, errorBody(`no route ${req.method} ${path}`, "not_found"))
  }

  const server = Http.createServer((req, res) => {
    const fiber = run(route(req, res).pipe(
      Effect.catchDefect((defect) => send(res, 500, errorBody(`internal error: ${String(defect)}`, "defect")))
    ))
    // A trainer that gave up on the share (or died) stops its chains.
    res.on("close", () => {
      if (!res.writableFinished) fiber.interruptUnsafe()
    })
  })
  const port = yield* listen(server, { port: options.port ?? 0, host })
  return { port, baseUrl: `http://${host}:${port}/v1` }
})

// ===== Trainer side =====

const workersError = (message: string) => runError("Workers", message)

/** What became of one share on one worker. */
type ShareAnswer =
  | { readonly ok: true; readonly text: string }
  | { readonly ok: false; readonly fatal: boolean; readonly message: string }

/**
 * Posts a share and reads its NDJSON answer: heartbeat lines, then the groups (or an error) on the last line. The
 * share fails after `silenceMs` without a byte (headers included), or after `timeoutMs` in all.
 */
const postShare = async (
  url: string,
  headers: Record<string, string>,
  body: string,
  limits: { readonly timeoutMs: number; readonly silenceMs: number; readonly interrupted: AbortSignal }
): Promise<ShareAnswer> => {
  const silence = new AbortController()
  const total = AbortSignal.timeout(limits.timeoutMs)
  let timer: ReturnType<typeof setTimeout> | undefined
  const alive = () => {
    clearTimeout(timer)
    timer = setTimeout(() => silence.abort(), limits.silenceMs)
  }
  alive()
  try {
    const signal = AbortSignal.any([limits.interrupted, silence.signal, total])
    const response = await fetch(url, { method: "POST", headers, body, signal })
    if (!response.ok) {
      const text = await response.text()
      return {
        ok: false,
        fatal: response.status >= 400 && response.status < 500,
        message: `HTTP ${response.status}: ${text.slice(0, 500)}`
      }
    }
    const chunks: Array<Buffer> = []
    for await (const chunk of response.body ?? []) {
      alive()
      chunks.push(Buffer.from(chunk))
    }
    const lines = Buffer.concat(chunks).toString("utf8").split("\n").filter((line) => line.trim() !== "")
    const last = lines.at(-1) ?? ""
    if (last.startsWith("{\"heartbeat\"") || last === "") {
      return { ok: false, fatal: false, message: "its answer ended before its groups (the worker stopped mid-share)" }
    }
    if (last.startsWith("{\"error\"")) {
      const error = (JSON.parse(last) as { error?: { message?: unknown } }).error
      return { ok: false, fatal: false, message: `failed the share: ${String(error?.message ?? last.slice(0, 500))}` }
    }
    return { ok: true, text: last }
  } catch (e) {
    if (silence.signal.aborted) {
      return {
        ok: false,
        fatal: false,
        message: `no answer and no heartbeat for ${limits.silenceMs / 1000} s (hung, stopped, or cut off)`
      }
    }
    if (total.aborted) {
      return {
        ok: false,
        fatal: false,
        message: `no groups within ${limits.timeoutMs / 1000} s (rollout.timeoutSeconds)`
      }
    }
    return { ok: false, fatal: false, message: fetchMessage(e) }
  } finally {
    clearTimeout(timer)
  }
}

/**
 * @category models
 * @since 0.1.0
 */
export interface ClientOptions {
  /** The workers' API roots, e.g. `http://10.0.0.4:8300/v1`. */
  readonly urls: ReadonlyArray<string>
  /** The run's {@link agentKey}. */
  readonly agentKey: string
  /** Time limit of one share on one worker (default 30 minutes: `rollout.timeoutSeconds`). */
  readonly timeoutMs?: number | undefined
  /**
   * How long a share's answer may go without a line (a heartbeat) before its worker counts as dead: hung, stopped
   * or cut off (default 60 s; workers write one every 5 s).
   */
  readonly silenceMs?: number | undefined
  /** The run's `agent` section, so that a worker with another one is told which keys differ. */
  readonly agent?: unknown
  /** How long a failed worker rests before it gets a share again (default 2 s). */
  readonly restMs?: number | undefined
  /** The workers' shared secret, if they were started with one (`AGENTFLY_WORKER_TOKEN`). */
  readonly token?: string | undefined
}

/** A worker's answer that this run's token is not its own. */
class Unauthorized extends Error {}

interface Worker {
  readonly url: string
  restUntil: number
  healthy: boolean
  shares: number
  failures: number
}

/**
 * Connects to the workers (each must answer now, for this run's agent key) and rolls batches out on them.
 *
 * @category constructors
 * @since 0.1.0
 */
export const client = Effect.fn("RolloutWorker.client")(function*(
  options: ClientOptions
): Effect.fn.Return<Rollouts.Remote & { readonly shares: Effect.Effect<ReadonlyArray<number>> }, RunError> {
  if (options.urls.length === 0) return yield* workersError("rollout.workers lists no worker")
  /** Which keys of the `agent` section differ (this run's → the worker's), where the worker says what it runs. */
  const mismatch = (info: typeof WorkerInfo.Type): string => {
    if (info.agent === undefined || options.agent === undefined) return ""
    const keys = TrainConfig.changes({ agent: options.agent }, { agent: info.agent }).slice(0, 5)
    return keys.length === 0 ? "" : `; this run's → the worker's: ${keys.join("; ")}`
  }
  const restMs = options.restMs ?? 2_000
  const auth: Record<string, string> = options.token === undefined ? {} : { authorization: `Bearer ${options.token}` }
  const workers: Array<Worker> = yield* Effect.forEach(
    options.urls.map((u) => u.replace(/\/+$/, "")),
    (url) =>
      Effect.tryPromise({
        try: async () => {
          const response = await fetch(`${url}/worker`, { headers: auth, signal: AbortSignal.timeout(10_000) })
          if (response.status === 401) {
            throw new Unauthorized(`HTTP 401: ${(await response.text()).slice(0, 300)}`)
          }
          if (!response.ok) throw new Error(`HTTP ${response.status}: ${(await response.text()).slice(0, 300)}`)
          return Schema.decodeUnknownSync(WorkerInfo)(await response.json())
        },
        catch: (e) =>
          workersError(
            e instanceof Unauthorized
              ? `rollout worker ${url} refuses this run's token (${e.message}): set AGENTFLY_WORKER_TOKEN to the ` +
                "token the worker was started with"
              : `rollout worker ${url} did not answer GET /worker (${fetchMessage(e)}); start it with ` +
                "`agentfly rollout-worker CONFIG --host HOST --port PORT` (the run's config) and list " +
                "http://HOST:PORT/v1 in rollout.workers"
          )
      }).pipe(Effect.flatMap((info) =>
        info.agentKey === options.agentKey
          ? Effect.succeed({ url, restUntil: 0, healthy: true, shares: 0, failures: 0 })
          : Effect.fail(workersError(
            `rollout worker ${url} runs task ${JSON.stringify(info.task)} with another config (agent key ` +
              `${info.agentKey}, this run's ${options.agentKey}${mismatch(info)}): start it with this run's config`
          ))
      )),
    { concurrency: "unbounded" }
  )

  /** One share on one worker: its groups, or why not (`fatal`: the worker refuses it, another would too). */
  const post = (worker: Worker, body: string) =>
    Effect.promise((interrupted) =>
      postShare(`${worker.url}/rollouts`, { ...auth, "content-type": "application/json" }, body, {
        timeoutMs: options.timeoutMs ?? 30 * 60_000,
        silenceMs: options.silenceMs ?? 60_000,
        interrupted
      })
    )

  // Each worker's latest environment figures, and the workers' sampling counts since the step's figures.
  const env = new Map<string, Readonly<Record<string, number>>>()
  let sampled: Record<string, number> = {}
  let turn = 0
  const share = (rows: ReadonlyArray<Dataset.Row>, body: Record<string, unknown>, first: number) =>
    Effect.gen(function*() {
      const json = JSON.stringify({ ...body, agentKey: options.agentKey, rows })
      const failures: Array<string> = []
      // Start at the share's own worker, then the next ones in turn; a resting worker waits for its turn to come.
      for (let k = 0; k < workers.length; k++) {
        const worker = workers[(first + k) % workers.length]!
        const now = yield* Clock.currentTimeMillis
        if (now < worker.restUntil && k < workers.length - 1) {
          failures.push(`${worker.url} (resting after a failure)`)
          continue
        }
        const answer = yield* post(worker, json)
        if (answer.ok) {
          worker.shares++
          if (!worker.healthy) {
            worker.healthy = true
            yield* Effect.logInfo(`rollout worker ${worker.url} is back`)
          }
          const decoded = yield* decodeResponse(answer.text).pipe(
            Effect.mapError((e) =>
              workersError(`rollout worker ${worker.url} answered groups that do not decode: ${e.message}`)
            )
          )
          if (decoded.env !== undefined) env.set(worker.url, decoded.env)
          if (decoded.servers !== undefined) addCounts(sampled, decoded.servers)
          return decoded.groups
        }
        if (answer.fatal) {
          return yield* workersError(`rollout worker ${worker.url} refused a share of the batch (${answer.message})`)
        }
        failures.push(`${worker.url} (${answer.message})`)
        worker.failures++
        worker.restUntil = (yield* Clock.currentTimeMillis) + restMs
        if (worker.healthy) {
          worker.healthy = false
          yield* Effect.logWarning(
            `rollout worker ${worker.url} failed (${answer.message}); ` +
              (workers.length === 1
                ? "it is the run's only worker"
                : k < workers.length - 1
                ? "its share goes to another worker"
                : "no other worker is left to take its share")
          )
        }
      }
      return yield* workersError(
        `every rollout worker failed a share of the batch: ${failures.join("; ")}. Start them again and resume the ` +
          "run (agentfly train CONFIG --resume): nothing of its finished steps is lost"
      )
    })

  const collect: Rollouts.Remote["collect"] = (rows, sampling, version) =>
    Effect.gen(function*() {
      // Contiguous shares, as equal as possible, one per worker (fewer when the batch has fewer rows).
      const k = Math.max(1, Math.min(workers.length, rows.length))
      const start = turn++
      const shares = Array.from({ length: k }, (_, i) => {
        const r0 = Math.floor(rows.length * i / k), r1 = Math.floor(rows.length * (i + 1) / k)
        return { rows: rows.slice(r0, r1), rowOffset: r0, worker: (start + i) % workers.length }
      })
      const parts = yield* Effect.forEach(shares, (s) =>
        share(s.rows, { ...sampling, rowOffset: s.rowOffset, version }, s.worker), { concurrency: "unbounded" })
      return parts.flat().sort((a, b) => a.rowIndex - b.rowIndex)
    })

  let counted = { shares: 0, failures: 0 }
  const figures = Effect.sync(() => {
    const shares = workers.reduce((n, w) => n + w.shares, 0)
    const failures = workers.reduce((n, w) => n + w.failures, 0)
    const out = {
      ...mergeEnvFigures(env.values()),
      ...sampled,
      "workers/shares": shares - counted.shares,
      "workers/failures": failures - counted.failures
    }
    counted = { shares, failures }
    sampled = {}
    return out
  })
  return { collect, figures, shares: Effect.sync(() => workers.map((w) => w.shares)) }
})

/**
 * The run's training batches on HTTP rollout workers ({@link client}), as the `Rollouts` service.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (options: ClientOptions): Layer.Layer<Rollouts.Rollouts, RunError> =>
  Layer.effect(Rollouts.Rollouts, Effect.map(client(options), Rollouts.fromRemote))
