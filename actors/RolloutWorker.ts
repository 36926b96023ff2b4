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
 * - **Strangers.** With a token (`AGENTFLY_WORKER_TOKEN` or `--token-file`) every request must bear it
 *   (`Authorization: Bearer`, checked in constant time before anything is read or answered, `internal/auth.ts`);
 *   a worker that would listen beyond loopback without one refuses to start. A share names its run (`runId`) and
 *   carries an id; its groups come back with an HMAC keyed by the token the request bore and the run id, which the
 *   trainer checks before it uses them (`internal/remoteShares.ts`). A share's numbers are bounded and a share
 *   asking for a policy version the servers do not hold waits a bounded time (`versionWaitMs`).
 *
 * The wire: `GET /v1/worker` → `{ task, agentKey, agent, runId }`; `POST /v1/rollouts` with `{ runId, share,
 * agentKey, rows, firstSeq, rowOffset, chains, temperature, seed, version }` → 200 and NDJSON:
 * `{ "heartbeat": true }` lines, then one line `{ groups, env, servers, mac? }` (`Trajectory.Group`, JSON codec;
 * the worker's environment figures and its sampling counts) or `{ error: { message, code } }`. A request refused
 * before it runs (bad body, another config or run, a wrong token) is a plain 4xx.
 *
 * Each side is a state record (`Served`, `Client`) with top-level functions over it; a share's heartbeats, silence
 * and time limits are `Clock`'s (`TestClock` moves them). The wire, the shares and the figures are shared with the
 * Redis queue (`internal/remoteShares.ts`).
 *
 * @since 0.1.0
 */
import { Cause, Clock, Effect, Fiber, FiberSet, Layer, Option, Schema } from "effect"
import type { Scope } from "effect"
import { createHash } from "node:crypto"
import * as Http from "node:http"
import type * as Dataset from "../src/Dataset.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import type * as InferenceServers from "./InferenceServers.ts"
import * as Auth from "./internal/auth.ts"
import { fetchMessage, listen, readBody } from "./internal/http.ts"
import {
  decodeResponse,
  defaultVersionWaitMs,
  evenShares,
  gather,
  type Gathered,
  macOk,
  makeGathered,
  RolloutRequest,
  rollOut,
  runIdOf,
  signed,
  takeFigures,
  workersError
} from "./internal/remoteShares.ts"
import * as Rollouts from "./Rollouts.ts"
import type { BatchSampling, RolloutSetup } from "./RolloutSetup.ts"
import type { RunError } from "./RunError.ts"

export {
  /** @internal */
  resultMac,
  /** @internal */
  RolloutResponse
} from "./internal/remoteShares.ts"

// ===== Wire =====

const WorkerInfo = Schema.Struct({
  task: Schema.String,
  agentKey: Schema.String,
  /** The worker's `agent` section, so that a mismatch can name its keys (absent from older workers). */
  agent: Schema.optionalKey(Schema.Unknown),
  /** The run the worker serves (`runId`). */
  runId: Schema.optionalKey(Schema.String)
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

/**
 * A run's id, as its trainer and workers compute it from the run's config (`internal/remoteShares.ts#runIdOf`):
 * shares name it, queue keys include it, results' HMACs cover it.
 *
 * @category constructors
 * @since 0.1.0
 */
export const runId = (taskName: string, config: TrainConfig.TrainConfig): string => runIdOf(taskName, config)

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
   * on whatever rows it is sent, so one listening beyond loopback must have one (`AGENTFLY_WORKER_TOKEN`).
   */
  readonly token?: string | undefined
  /** More accepted tokens (`--token-file`'s lines). */
  readonly tokens?: ReadonlyArray<string> | undefined
  /** The run this worker serves (default: its config's, `runId`). */
  readonly runId?: string | undefined
  /** How long a share waits for the servers to hold its policy version before it fails (default 60 s). */
  readonly versionWaitMs?: number | undefined
  /** Requests answered at once; past it 503 (default 64). */
  readonly maxInFlight?: number | undefined
  /** How often a share's answer says the worker is alive while its chains run (default 5 s). */
  readonly heartbeatMs?: number | undefined
}

/** A serving worker: what it rolls out, on which servers, for which agent key, and how it answers. */
interface Served {
  readonly setup: RolloutSetup
  readonly servers: InferenceServers.InferenceServers
  readonly key: string
  readonly runId: string
  readonly tokens: Auth.Tokens
  readonly gate: Auth.Gate
  readonly options: WorkerOptions
}

type ErrorBody = ReturnType<typeof errorBody>

const send = (res: Http.ServerResponse, status: number, body: unknown) =>
  Effect.sync(() => {
    if (res.headersSent) return
    // A refusal before the body was read closes the connection rather than draining what the client still sends.
    res.writeHead(status, {
      "content-type": "application/json",
      ...(Auth.closesConnection(status) ? { connection: "close" } : {})
    })
    res.end(JSON.stringify(body))
  })

const errorBody = (message: string, code: string) => ({ error: { message, code } })

const readJson = (req: Http.IncomingMessage, maxBytes: number) =>
  Effect.flatMap(readBody(req, maxBytes), (bytes) =>
    Effect.try({
      try: () => JSON.parse(bytes.toString("utf8")) as unknown,
      catch: () => ({ status: 400, message: "the request body is not valid JSON" })
    }))

/** A share's request, or why it is refused before anything runs (a plain 4xx). */
const check = (served: Served, body: unknown) =>
  Effect.gen(function*() {
    const request = yield* Schema.decodeUnknownEffect(RolloutRequest)(body).pipe(
      Effect.mapError((e) => ({ status: 400, body: errorBody(e.message, "invalid_request") }))
    )
    if (request.agentKey !== served.key) {
      return yield* Effect.fail({
        status: 409,
        body: errorBody(
          `this worker runs task ${JSON.stringify(served.setup.runtime.task.name)} with another agent config ` +
            `(key ${served.key}, the run's ${request.agentKey}): start it with the run's config`,
          "agent_mismatch"
        )
      })
    }
    if (request.runId !== served.runId) {
      return yield* Effect.fail({
        status: 409,
        body: errorBody(
          `this worker serves run ${served.runId}, the share is run ${request.runId}'s: start it with the run's config`,
          "run_mismatch"
        )
      })
    }
    return request
  })

/** A share's groups, as the answer's last line, signed with the token the request bore. */
const rollouts = (
  served: Served,
  request: typeof RolloutRequest.Type,
  token: string | undefined
): Effect.Effect<string, ErrorBody> =>
  rollOut(served.setup, served.servers, request, served.options.versionWaitMs ?? defaultVersionWaitMs).pipe(
    Effect.map((answer) => JSON.stringify(signed(token, served.runId, request.share, answer))),
    Effect.mapError((e) => errorBody(e.message, e.code))
  )

/** The answer's last line for a share that did not end with its groups. */
const failureLine = (cause: Cause.Cause<ErrorBody>): string =>
  JSON.stringify(
    Cause.hasInterruptsOnly(cause)
      ? errorBody("the share was interrupted", "interrupted")
      : Cause.findErrorOption(cause).pipe(Option.getOrElse(() =>
        errorBody(`internal error: ${String(Cause.squash(cause))}`, "defect")
      ))
  )

/**
 * Answers at once and writes a heartbeat line every `heartbeatMs` while `work` runs, then its line: a client's
 * header and body timeouts (Node's fetch: 5 minutes) never cut a long share, and a silent worker is a dead one.
 */
const streamed = (served: Served, res: Http.ServerResponse, work: Effect.Effect<string, ErrorBody>) =>
  Effect.gen(function*() {
    yield* Effect.sync(() => {
      res.writeHead(200, { "content-type": "application/x-ndjson", "cache-control": "no-store" })
      res.write(heartbeat)
    })
    // On `Clock`; stopped before the last line is written.
    const beats = yield* Effect.sync(() => void res.write(heartbeat)).pipe(
      Effect.delay(served.options.heartbeatMs ?? 5_000),
      Effect.forever,
      Effect.forkChild
    )
    const exit = yield* Effect.exit(work)
    yield* Fiber.interrupt(beats)
    const line = exit._tag === "Success" ? exit.value : failureLine(exit.cause)
    yield* Effect.sync(() => res.end(`${line}\n`))
  })

const route = (served: Served, req: Http.IncomingMessage, res: Http.ServerResponse) => {
  const { setup, key, options } = served
  const path = (req.url ?? "/").split("?")[0]!.replace(/\/+$/, "")
  // Before anything is read or answered: nothing of the run (its agent key, its prompt) reaches a stranger.
  if (!Auth.authorize(served.tokens, req).ok) {
    return send(res, 401, errorBody("a valid bearer token is required (AGENTFLY_WORKER_TOKEN)", "unauthorized"))
  }
  const token = Auth.required(served.tokens) ? Auth.bearer(req) : undefined
  if (path === "/v1/worker" && req.method === "GET") {
    const info = { task: setup.runtime.task.name, agentKey: key, agent: setup.config.agent, runId: served.runId }
    return send(res, 200, info)
  }
  if (path === "/v1/rollouts" && req.method === "POST") {
    return readJson(req, options.maxBodyBytes ?? 64 * 1024 * 1024).pipe(
      Effect.mapError((e) => ({ status: e.status, body: errorBody(e.message, "invalid_request") })),
      Effect.flatMap((body) => check(served, body)),
      Effect.matchEffect({
        onSuccess: (request) => streamed(served, res, rollouts(served, request, token)),
        onFailure: (e) => send(res, e.status, e.body)
      })
    )
  }
  return send(res, 404, errorBody(`no route ${req.method} ${path}`, "not_found"))
}

/**
 * Serves `setup`'s rollouts over HTTP in the current scope, sampling on `servers`; refuses (`AuthConfigError`) to
 * listen beyond loopback without a token.
 *
 * @category constructors
 * @since 0.1.0
 */
export const serve = Effect.fn("RolloutWorker.serve")(function*(
  setup: RolloutSetup,
  servers: InferenceServers.InferenceServers,
  options: WorkerOptions = {}
): Effect.fn.Return<{ readonly port: number; readonly baseUrl: string }, Auth.AuthConfigError, Scope.Scope> {
  const host = options.host ?? "127.0.0.1"
  const tokens = Auth.tokens([options.token, ...options.tokens ?? []])
  const problem = Auth.bindProblem(host, tokens, "AGENTFLY_WORKER_TOKEN or --token-file")
  if (problem !== undefined) return yield* new Auth.AuthConfigError({ message: problem })
  const served: Served = {
    setup,
    servers,
    key: agentKey(setup.runtime.task.name, setup.config),
    runId: options.runId ?? runId(setup.runtime.task.name, setup.config),
    tokens,
    gate: Auth.gate(options.maxInFlight ?? 64),
    options
  }
  const run = yield* FiberSet.makeRuntime<never>()
  const server = Http.createServer((req, res) => {
    const overloaded = send(res, 503, errorBody("too many requests in flight; try again", "overloaded"))
    const fiber = run(Auth.within(served.gate, route(served, req, res), overloaded).pipe(
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

/** What became of one share on one worker. */
type ShareAnswer =
  | { readonly ok: true; readonly text: string }
  | { readonly ok: false; readonly fatal: boolean; readonly message: string }

type Failed = Extract<ShareAnswer, { readonly ok: false }>

const failedWith = (message: string, fatal = false): Failed => ({ ok: false, fatal, message })

/** A worker's `{ error: { message, code } }` line. */
const decodeErrorLine = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Struct({
  error: Schema.optionalKey(Schema.Struct({ message: Schema.optionalKey(Schema.Unknown) }))
})))

/** What the worker's answer says, from its lines: the groups' line, or why there is none. */
const lastLine = (text: string): ShareAnswer => {
  const lines = text.split("\n").filter((line) => line.trim() !== "")
  const last = lines.at(-1) ?? ""
  if (last.startsWith("{\"heartbeat\"") || last === "") {
    return failedWith("its answer ended before its groups (the worker stopped mid-share)")
  }
  if (!last.startsWith("{\"error\"")) return { ok: true, text: last }
  const error = Option.getOrUndefined(decodeErrorLine(last))?.error
  return failedWith(`failed the share: ${String(error?.message ?? last.slice(0, 500))}`)
}

/**
 * Posts a share and reads its NDJSON answer: heartbeat lines, then the groups (or an error) on the last line. The
 * share fails after `silenceMs` without a byte (headers included), or after `timeoutMs` in all (on `Clock`).
 */
const postShare = (
  url: string,
  headers: Record<string, string>,
  body: string,
  limits: { readonly timeoutMs: number; readonly silenceMs: number }
): Effect.Effect<ShareAnswer> => {
  const silent = failedWith(`no answer and no heartbeat for ${limits.silenceMs / 1000} s (hung, stopped, or cut off)`)
  const heard = <A>(promise: () => Promise<A>) =>
    Effect.tryPromise({ try: promise, catch: (e) => failedWith(fetchMessage(e)) }).pipe(
      Effect.timeoutOrElse({ duration: limits.silenceMs, orElse: () => Effect.fail(silent) })
    )
  // The request's own signal, aborted when the share ends however it ends: a worker given up stops being read.
  return Effect.acquireUseRelease(
    Effect.sync(() => new AbortController()),
    (request) =>
      Effect.gen(function*() {
        const response = yield* heard(() => fetch(url, { method: "POST", headers, body, signal: request.signal }))
        if (!response.ok) {
          const text = yield* heard(() => response.text())
          const fatal = response.status >= 400 && response.status < 500
          return failedWith(`HTTP ${response.status}: ${text.slice(0, 500)}`, fatal)
        }
        const reader = response.body?.getReader()
        const chunks: Array<Buffer> = []
        while (reader !== undefined) {
          const chunk = yield* heard(() => reader.read())
          if (chunk.done) break
          chunks.push(Buffer.from(chunk.value))
        }
        return lastLine(Buffer.concat(chunks).toString("utf8"))
      }).pipe(
        Effect.timeoutOrElse({
          duration: limits.timeoutMs,
          orElse: () =>
            Effect.fail(failedWith(`no groups within ${limits.timeoutMs / 1000} s (rollout.timeoutSeconds)`))
        }),
        Effect.catch((answer) => Effect.succeed<ShareAnswer>(answer))
      ),
    (request) => Effect.sync(() => request.abort())
  )
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
  /** The run's {@link runId}: shares name it, the workers' answers are signed with it. */
  readonly runId: string
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
  /**
   * The workers' shared secret, if they were started with one (`AGENTFLY_WORKER_TOKEN`): sent with every request,
   * and the key of the HMAC every answer must carry.
   */
  readonly token?: string | undefined
}

/** A worker of the run, and how it has fared. */
interface Worker {
  readonly url: string
  /** Until when (`Clock` milliseconds) it rests after a failure, unless no other worker is left to try. */
  restUntil: number
  healthy: boolean
  shares: number
  failures: number
}

/** The trainer's side: its workers, whose turn it is to take a batch's first share, what their answers brought. */
interface Client {
  readonly options: ClientOptions
  readonly workers: ReadonlyArray<Worker>
  /** The `authorization` header, if the workers want a token. */
  readonly auth: Record<string, string>
  readonly gathered: Gathered<"shares" | "failures">
  turn: number
}

/** Which keys of the `agent` section differ (this run's → the worker's), where the worker says what it runs. */
const mismatch = (options: ClientOptions, info: typeof WorkerInfo.Type): string => {
  if (info.agent === undefined || options.agent === undefined) return ""
  const keys = TrainConfig.changes({ agent: options.agent }, { agent: info.agent }).slice(0, 5)
  return keys.length === 0 ? "" : `; this run's → the worker's: ${keys.join("; ")}`
}

/** What the worker at `url` runs (`GET /worker`), or why it cannot be asked. */
const describe = (url: string, auth: Record<string, string>): Effect.Effect<typeof WorkerInfo.Type, RunError> => {
  const unanswered = (why: string) =>
    workersError(
      `rollout worker ${url} did not answer GET /worker (${why}); start it with ` +
        "`agentfly rollout-worker CONFIG --host HOST --port PORT` (the run's config) and list " +
        "http://HOST:PORT/v1 in rollout.workers"
    )
  const attempt = <A>(promise: () => Promise<A>) =>
    Effect.tryPromise({ try: promise, catch: (e) => unanswered(fetchMessage(e)) })
  return Effect.gen(function*() {
    const signal = AbortSignal.timeout(10_000)
    const response = yield* attempt(() => fetch(`${url}/worker`, { headers: auth, signal }))
    if (response.status === 401) {
      const text = yield* attempt(() => response.text())
      return yield* workersError(
        `rollout worker ${url} refuses this run's token (HTTP 401: ${text.slice(0, 300)}): set ` +
          "AGENTFLY_WORKER_TOKEN to the token the worker was started with"
      )
    }
    if (!response.ok) {
      const text = yield* attempt(() => response.text())
      return yield* unanswered(`HTTP ${response.status}: ${text.slice(0, 300)}`)
    }
    const json = yield* attempt(() => response.json())
    return yield* Schema.decodeUnknownEffect(WorkerInfo)(json).pipe(Effect.mapError((e) => unanswered(e.message)))
  })
}

/** The worker at `url`, if it answers for this run's agent key. */
const connect = (options: ClientOptions, auth: Record<string, string>, url: string): Effect.Effect<Worker, RunError> =>
  Effect.flatMap(describe(url, auth), (info) =>
    info.agentKey !== options.agentKey
      ? Effect.fail(workersError(
        `rollout worker ${url} runs task ${JSON.stringify(info.task)} with another config (agent key ` +
          `${info.agentKey}, this run's ${options.agentKey}${mismatch(options, info)}): start it with this run's config`
      ))
      : info.runId !== undefined && info.runId !== options.runId
      ? Effect.fail(workersError(
        `rollout worker ${url} serves another run (run id ${info.runId}, this run's ${options.runId}: its config ` +
          "differs in engine.servers, seed or the output folder's name): start it with this run's config"
      ))
      : Effect.succeed({ url, restUntil: 0, healthy: true, shares: 0, failures: 0 }))

/** One share on one worker: its groups, or why not (`fatal`: the worker refuses it, another would too). */
const post = (client: Client, worker: Worker, body: string) =>
  postShare(`${worker.url}/rollouts`, { ...client.auth, "content-type": "application/json" }, body, {
    timeoutMs: client.options.timeoutMs ?? 30 * 60_000,
    silenceMs: client.options.silenceMs ?? 60_000
  })

const decodeJson = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))

/** A worker's groups for a share: their HMAC checked, counted, its figures kept, decoded. */
const accepted = (client: Client, worker: Worker, shareId: string, text: string) =>
  Effect.gen(function*() {
    const answer = (Option.getOrUndefined(decodeJson(text)) ?? {}) as Record<string, unknown>
    const { groups, env, servers, mac } = answer
    if (!macOk(client.options.token, client.options.runId, shareId, { groups, env, servers }, mac)) {
      return yield* workersError(
        `rollout worker ${worker.url} answered a share with a result that fails its authentication (${
          mac === undefined ? "no" : "a wrong"
        } HMAC for this run and share, keyed by AGENTFLY_WORKER_TOKEN): nothing of it is trained on. A worker ` +
          "with another token, or something between this run and its worker, wrote it"
      )
    }
    worker.shares++
    if (!worker.healthy) {
      worker.healthy = true
      yield* Effect.logInfo(`rollout worker ${worker.url} is back`)
    }
    const decoded = yield* decodeResponse(JSON.stringify({ groups, env, servers })).pipe(
      Effect.mapError((e) =>
        workersError(`rollout worker ${worker.url} answered groups that do not decode: ${e.message}`)
      )
    )
    gather(client.gathered, worker.url, decoded)
    return decoded.groups
  })

/** A worker failed the share it was tried `k`-th for: it rests, and says so when it was healthy. */
const failed = (client: Client, worker: Worker, message: string, k: number) =>
  Effect.gen(function*() {
    const { workers } = client
    worker.failures++
    worker.restUntil = (yield* Clock.currentTimeMillis) + (client.options.restMs ?? 2_000)
    if (!worker.healthy) return
    worker.healthy = false
    yield* Effect.logWarning(
      `rollout worker ${worker.url} failed (${message}); ` +
        (workers.length === 1
          ? "it is the run's only worker"
          : k < workers.length - 1
          ? "its share goes to another worker"
          : "no other worker is left to take its share")
    )
  })

/** A share's groups: from the share's own worker, or else from the next ones in turn that answer. */
const share = (client: Client, rows: ReadonlyArray<Dataset.Row>, body: Record<string, unknown>, first: number) =>
  Effect.gen(function*() {
    const { workers } = client
    const shareId = Auth.randomId()
    const { agentKey, runId } = client.options
    const json = JSON.stringify({ ...body, runId, share: shareId, agentKey, rows })
    const failures: Array<string> = []
    // A resting worker waits for its turn to come, unless it is the last one left to try.
    for (let k = 0; k < workers.length; k++) {
      const worker = workers[(first + k) % workers.length]!
      const now = yield* Clock.currentTimeMillis
      if (now < worker.restUntil && k < workers.length - 1) {
        failures.push(`${worker.url} (resting after a failure)`)
        continue
      }
      const answer = yield* post(client, worker, json)
      if (answer.ok) return yield* accepted(client, worker, shareId, answer.text)
      if (answer.fatal) {
        return yield* workersError(`rollout worker ${worker.url} refused a share of the batch (${answer.message})`)
      }
      failures.push(`${worker.url} (${answer.message})`)
      yield* failed(client, worker, answer.message, k)
    }
    return yield* workersError(
      `every rollout worker failed a share of the batch: ${failures.join("; ")}. Start them again and resume the ` +
        "run (agentfly train CONFIG --resume): nothing of its finished steps is lost"
    )
  })

/** A batch in contiguous shares, as equal as possible, one per worker; the groups in row order. */
const collect = (
  client: Client,
  rows: ReadonlyArray<Dataset.Row>,
  sampling: BatchSampling,
  version: number
): Effect.Effect<Array<Trajectory.Group>, RunError> =>
  Effect.suspend(() => {
    const { workers } = client
    const start = client.turn++
    return Effect.forEach(
      evenShares(rows, workers.length),
      (s, i) => share(client, s.rows, { ...sampling, rowOffset: s.rowOffset, version }, (start + i) % workers.length),
      { concurrency: "unbounded" }
    )
  }).pipe(Effect.map((parts) => parts.flat().sort((a, b) => a.rowIndex - b.rowIndex)))

/** The figures since the previous read: the workers' environment figures and sampling counts, shares, failures. */
const figures = (client: Client) =>
  Effect.sync(() =>
    takeFigures(client.gathered, {
      shares: client.workers.reduce((n, w) => n + w.shares, 0),
      failures: client.workers.reduce((n, w) => n + w.failures, 0)
    })
  )

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
  const auth = Auth.headers(options.token)
  const workers = yield* Effect.forEach(
    options.urls.map((u) => u.replace(/\/+$/, "")),
    (url) => connect(options, auth, url),
    { concurrency: "unbounded" }
  )
  const state: Client = { options, workers, auth, gathered: makeGathered({ shares: 0, failures: 0 }), turn: 0 }
  return {
    collect: (rows, sampling, version) => collect(state, rows, sampling, version),
    figures: figures(state),
    shares: Effect.sync(() => workers.map((w) => w.shares))
  }
})

/**
 * The run's training batches on HTTP rollout workers ({@link client}), as the `Rollouts` service.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (options: ClientOptions): Layer.Layer<Rollouts.Rollouts, RunError> =>
  Layer.effect(Rollouts.Rollouts, Effect.map(client(options), Rollouts.fromRemote))
