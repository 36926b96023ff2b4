/**
 * Rollout workers fed through Redis streams (`rollout.queue`): instead of the trainer sending each worker its share
 * (`rollout.workers`, `actors/RolloutWorker.ts`), it puts a batch's shares on a stream and the workers
 * (`agentfly rollout-worker CONFIG --queue redis://…`) take them as they are free. Workers may join and leave
 * while a run goes on, and a fast worker takes more shares than a slow one.
 *
 * - **Keys.** Everything of a run (`RolloutWorker.runId`: the task, the `agent` section, the inference servers, the
 *   seed and the output folder's name, which its workers read from the same config) lives under
 *   `agentfly:rollouts:<run id>`: the shares stream (consumer group `workers`), and one results stream per trainer
 *   process, which the trainer keeps marked alive. Workers started with another config, or for another run whose
 *   task and agent match, read another stream: a run that gets no results within `timeoutSeconds` says which
 *   workers it saw and with what config.
 * - **Strangers.** With `AGENTFLY_WORKER_TOKEN` (given to the trainer and its workers out of band; required for a
 *   queue beyond loopback) every reply carries an HMAC over (run id, share id, groups, figures, error) keyed by it
 *   and the run id: a reply that fails it (anyone else who can write to Redis) stops the run (`Workers`) before
 *   anything of it is used. A worker replies only to its own run's results streams (`replyTo` checked), and runs
 *   only shares of its run and agent key.
 * - **At least once, used once.** A worker that takes a share keeps it claimed while it runs; one that dies leaves
 *   it pending, and after `claimSeconds` without a touch another worker claims it (`XAUTOCLAIM`). A share may so be
 *   rolled out twice; the trainer keeps the first result of each share (by its id) and drops the rest. Shares of a
 *   trainer that is gone (its results stream no longer marked alive) are dropped unrun.
 * - **The same batch as at home.** A share carries its first row's index in the batch, so its groups get the ids,
 *   seeds and row indices the trainer's own process would give them, as with HTTP workers.
 * - **A Redis that restarts** (no persistence) forgets the queue: the trainer sends again a share that is neither
 *   answered nor on the stream at two checks in a row, and workers re-create their consumer group. Every command is
 *   typed (`RunError` `Workers`); a worker logs a failed one and goes on.
 *
 * Each side is a state record (`Client`, `QueueWorker`) with top-level functions over it. Times are `Clock`'s, so
 * that a test moves a batch's deadline with `TestClock`; the wire and the figures are the HTTP workers' own
 * (`internal/remoteShares.ts`).
 *
 * @since 0.1.0
 */
import { Clock, Effect, Layer, Option, Schema } from "effect"
import type { Scope } from "effect"
import { Redis } from "ioredis"
import { randomUUID } from "node:crypto"
import type * as Dataset from "../src/Dataset.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import type * as InferenceServers from "./InferenceServers.ts"
import * as Auth from "./internal/auth.ts"
import {
  decodeResponse,
  defaultVersionWaitMs,
  gather,
  type Gathered,
  macOk,
  makeGathered,
  RolloutRequest,
  rollOut,
  runIdOf,
  sharesOf,
  signed,
  takeFigures,
  workersError
} from "./internal/remoteShares.ts"
import * as Rollouts from "./Rollouts.ts"
import type { BatchSampling, RolloutSetup } from "./RolloutSetup.ts"
import type { RunError } from "./RunError.ts"

const GROUP = "workers"
const WORKERS = "agentfly:rollouts:workers"
const keysOf = (runId: string) => {
  const prefix = `agentfly:rollouts:${runId}`
  return { prefix, shares: `${prefix}:shares`, results: (token: string) => `${prefix}:results:${token}` }
}

const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

/** Whether `replyTo` is one of this run's results streams (`<prefix>:results:<uuid>`), and nothing else's. */
const isResultsKey = (keys: ReturnType<typeof keysOf>, replyTo: unknown): replyTo is string =>
  typeof replyTo === "string" && replyTo.startsWith(`${keys.prefix}:results:`) &&
  uuid.test(replyTo.slice(keys.prefix.length + ":results:".length))

/**
 * Why the queue at `url` must not be used: beyond loopback without a token, anyone who reaches it could answer the
 * run's shares. Undefined when it may.
 */
const queueProblem = (url: string, token: string | undefined): string | undefined => {
  const host = URL.canParse(url) ? new URL(url).hostname : url
  return Auth.isLoopback(host) || (token !== undefined && token !== "") ? undefined :
    `refusing the rollout queue ${url} without a token: anyone who can write to it could answer this run's ` +
      "shares. Set AGENTFLY_WORKER_TOKEN (the same on the trainer and its workers), or use a queue on 127.0.0.1"
}

const messageOf = (e: unknown) => String((e as Error).message ?? e)

/** One Redis command, its failure typed (`Workers`, naming the queue and the command). */
const call = <A>(url: string, what: string, f: () => Promise<A>) =>
  Effect.tryPromise({
    try: f,
    catch: (e) => workersError(`the rollout queue ${url}: ${what} failed (${messageOf(e)})`)
  })

/** Since when (`Clock` milliseconds) a connection has been down (undefined while up), and its last error. */
interface Link {
  downSince: number | undefined
  lastError: string
}

const connect = (url: string, link?: Link) =>
  Effect.flatMap(Effect.clockWith(Effect.succeed), (clock) =>
    Effect.acquireRelease(
      Effect.tryPromise({
        try: () => {
          // A command waits through 20 reconnection attempts, 0.5 s apart (≈ 10 s), for a lost connection, then
          // fails.
          const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 20, retryStrategy: () => 500 })
          redis.on("error", (e: unknown) => {
            if (link !== undefined) link.lastError = messageOf(e)
          }) // reconnects in the background
          return redis.connect().then(() => {
            if (link !== undefined) {
              redis.on("close", () => void (link.downSince ??= clock.currentTimeMillisUnsafe()))
              redis.on("ready", () => void (link.downSince = undefined))
            }
            return redis
          }, (e) => (redis.disconnect(), Promise.reject(e)))
        },
        catch: (e) => workersError(`the rollout queue ${url} cannot be reached (${messageOf(e)})`)
      }),
      (redis) => Effect.sync(() => redis.disconnect())
    ))

/** How long a run waits for a lost queue before it stops (workers wait for it as long as it takes). */
const giveUpMs = 10_000

/** The shares stream's consumer group, created with the stream unless it exists. */
const ensureGroup = (redis: Redis, stream: string) =>
  Effect.tryPromise({ try: () => redis.xgroup("CREATE", stream, GROUP, "$", "MKSTREAM"), catch: messageOf }).pipe(
    Effect.catch((why) =>
      why.includes("BUSYGROUP") ? Effect.void : Effect.fail(workersError(`the rollout queue: ${why}`))
    )
  )

/** `[id, [field, value, …]]` entries → `{ id, payload }` (the one field is `p`); deleted entries are skipped. */
const entries = (raw: unknown): Array<{ readonly id: string; readonly payload: string }> =>
  ((raw ?? []) as Array<[string, Array<string> | null]>).flatMap(([id, fields]) =>
    fields === null ? [] : [{ id, payload: fields[fields.indexOf("p") + 1] ?? "" }]
  )

const decodeJson = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))

/** A JSON payload as `A` (unchecked), or undefined when it is not JSON. */
const parse = <A>(text: string): A | undefined => Option.getOrUndefined(decodeJson(text)) as A | undefined

// ===== Trainer side =====

/**
 * @category models
 * @since 0.1.0
 */
export interface ClientOptions {
  /** `redis://HOST:PORT`. */
  readonly url: string
  /** The run's `RolloutWorker.agentKey`. */
  readonly agentKey: string
  /** The run's `RolloutWorker.runId`: the queue's keys include it (default: the agent key alone). */
  readonly runId?: string | undefined
  /** The workers' token (`AGENTFLY_WORKER_TOKEN`): every reply must carry an HMAC keyed by it. */
  readonly token?: string | undefined
  /** Rows a share (default: a batch in 8 shares). */
  readonly shareRows?: number | undefined
  /** How long a batch may wait for its results (default 30 minutes). */
  readonly timeoutSeconds?: number | undefined
  /** How often a waiting batch looks for shares the queue lost (default 10 s). */
  readonly checkMillis?: number | undefined
  /** How long a batch waits without any answer before it says so (default 30 s; again every twice that). */
  readonly quietMillis?: number | undefined
}

/** A share on its way: what was sent (to send it again), where it sits on the stream, its groups once back. */
interface Pending {
  readonly payload: string
  entry: string
  /** Checks in a row that found it neither answered nor on the stream. */
  lost: number
  groups: Array<Trajectory.Group> | undefined
}

/** A batch's shares by id. */
type Batch = ReadonlyMap<string, Pending>

/** The trainer's counts of the workers' answers, reported as `workers/<count>`. */
interface Totals {
  shares: number
  duplicates: number
  resent: number
  reclaimed: number
}

/** The trainer's side: its connections, its results stream, and what the workers' answers brought so far. */
interface Client {
  readonly options: ClientOptions
  /** Commands, and the blocking reads of the results stream on a connection of their own. */
  readonly redis: Redis
  readonly reader: Redis
  readonly link: Link
  readonly keys: ReturnType<typeof keysOf>
  /** This trainer process's results stream. */
  readonly results: string
  readonly timeoutSeconds: number
  readonly totals: Totals
  readonly gathered: Gathered<keyof Totals>
  /** The last entry read from the results stream. */
  lastId: string
}

/** The run stops: the queue has been gone since `link.downSince`. */
const lost = (client: Client): Effect.Effect<never, RunError> =>
  Effect.flatMap(Clock.currentTimeMillis, (now) =>
    Effect.fail(workersError(
      `lost the rollout queue ${client.options.url} for ${((now - client.link.downSince!) / 1000).toFixed(0)} s ` +
        `(${client.link.lastError || "connection closed"}): the run stops. Start Redis again (its workers reconnect ` +
        "by themselves) and resume the run: agentfly train CONFIG --resume"
    )))

/**
 * One command. Every command fails at once, with what to do, once the queue has been gone for `giveUpMs`; a command
 * that failed while it was gone says the same.
 */
const command = <A>(client: Client, what: string, f: () => Promise<A>): Effect.Effect<A, RunError> =>
  Effect.flatMap(Clock.currentTimeMillis, (now) =>
    client.link.downSince !== undefined && now - client.link.downSince >= giveUpMs
      ? lost(client)
      : call(client.options.url, what, f).pipe(
        Effect.catch((e) => (client.link.downSince === undefined ? Effect.fail(e) : lost(client)))
      ))

/** Says as soon as the connection drops, and when it is back (checked every second, forever). */
const watchLink = (client: Client) =>
  Effect.gen(function*() {
    let said = false
    while (true) {
      yield* Effect.sleep("1 second")
      if (client.link.downSince !== undefined && !said) {
        said = true
        yield* Effect.logWarning(
          `the rollout queue ${client.options.url} is unreachable (${client.link.lastError || "connection closed"}); ` +
            `the run waits ${giveUpMs / 1000} s for it, then stops`
        )
      } else if (client.link.downSince === undefined && said) {
        said = false
        yield* Effect.logInfo(`the rollout queue ${client.options.url} is back`)
      }
    }
  })

/** Marks this trainer alive: workers run a share only while its trainer is. */
const alive = (client: Client) =>
  command(client, "SET", () => client.redis.set(`${client.results}:alive`, "1", "EX", 30))

/** The workers that said they were alive in the last 30 s, with their task and agent key. */
const seenWorkers = (client: Client) =>
  Effect.gen(function*() {
    const all = yield* Effect.orElseSucceed(
      command(client, "HGETALL", () => client.redis.hgetall(WORKERS)),
      () => ({} as Record<string, string>)
    )
    const now = yield* Clock.currentTimeMillis
    return Object.entries(all).flatMap(([id, json]) => {
      const w = parse<{ agentKey: string; runId?: string; task: string; seen: number }>(json)
      const run = w?.runId === undefined ? "" : `, run ${w.runId}`
      return w !== undefined && now - w.seen < 30_000 ? [`${id} (task ${w.task}, agent key ${w.agentKey}${run})`] : []
    })
  })

/** Puts shares on the stream (again, for lost ones), noting where each sits. */
const send = (client: Client, shares: ReadonlyArray<Pending>) =>
  Effect.gen(function*() {
    const pipeline = client.redis.multi()
    for (const share of shares) pipeline.xadd(client.keys.shares, "*", "p", share.payload)
    const replies = (yield* command(client, "XADD", () => pipeline.exec())) ?? []
    shares.forEach((share, i) => {
      const entry = replies[i]?.[1]
      if (typeof entry === "string") share.entry = entry
      share.lost = 0
    })
  })

/** Shares neither answered nor on the stream at two checks in a row were lost with the queue's memory. */
const resendLost = (client: Client, batch: Batch) =>
  Effect.gen(function*() {
    const lost: Array<Pending> = []
    for (const share of batch.values()) {
      if (share.groups !== undefined) continue
      const there = yield* command(client, "XRANGE", () =>
        client.redis.xrange(client.keys.shares, share.entry, share.entry))
      share.lost = there.length === 0 ? share.lost + 1 : 0
      if (share.lost >= 2) lost.push(share)
    }
    if (lost.length === 0) return
    yield* Effect.logWarning(
      `the rollout queue ${client.options.url} lost ${lost.length} share(s) of a batch (restarted?): sending them again`
    )
    yield* ensureGroup(client.redis, client.keys.shares)
    yield* alive(client)
    yield* send(client, lost)
    client.totals.resent += lost.length
  })

/** A worker's reply on the results stream. */
interface Reply {
  readonly id: string
  readonly worker?: string
  readonly groups?: unknown
  readonly env?: unknown
  readonly servers?: unknown
  readonly error?: string
  readonly claimed?: boolean
  readonly mac?: unknown
}

/** Takes one reply: whether it answered one of `batch`'s shares for the first time. */
const takeReply = (client: Client, batch: Batch, payload: string) =>
  Effect.gen(function*() {
    const reply = parse<Reply>(payload)
    const share = reply === undefined ? undefined : batch.get(reply.id)
    if (reply === undefined || share === undefined) return false
    if (share.groups !== undefined) {
      client.totals.duplicates++
      return false
    }
    const { groups, env, servers, error } = reply
    const runId = client.options.runId ?? client.options.agentKey
    if (!macOk(client.options.token, runId, reply.id, { groups, env, servers, error }, reply.mac)) {
      return yield* workersError(
        `a reply to share ${reply.id} on the rollout queue ${client.options.url} fails its authentication (${
          reply.mac === undefined ? "no" : "a wrong"
        } HMAC for this run, keyed by AGENTFLY_WORKER_TOKEN): nothing of it is trained on. A worker with another ` +
          "token, or someone else who can write to the queue, wrote it"
      )
    }
    if (error !== undefined) return yield* workersError(`a rollout worker failed a share: ${error}`)
    const decoded = yield* decodeResponse(JSON.stringify({ groups, env, servers })).pipe(
      Effect.mapError((e) => workersError(`a rollout worker answered groups that do not decode: ${e.message}`))
    )
    share.groups = [...decoded.groups]
    gather(client.gathered, reply.worker ?? "", decoded)
    if (reply.claimed === true) {
      client.totals.reclaimed++
      yield* Effect.logInfo(
        `share ${reply.id} was run by ${reply.worker ?? "a worker"} after the worker that took it stopped (its claim ` +
          "expired)"
      )
    }
    client.totals.shares++
    return true
  })

/** Results that arrived (waiting up to a second); the count of shares answered for the first time. */
const readResults = (client: Client, batch: Batch) =>
  Effect.gen(function*() {
    const raw = yield* command(client, "XREAD", () =>
      client.reader.xread("COUNT", 100, "BLOCK", 1000, "STREAMS", client.results, client.lastId))
    const got = raw === null ? [] : entries(raw[0]![1])
    let answered = 0
    for (const { id, payload } of got) {
      client.lastId = id
      if (yield* takeReply(client, batch, payload)) answered++
    }
    if (got.length > 0) {
      yield* command(client, "XTRIM", () => client.redis.xtrim(client.results, "MINID", client.lastId))
    }
    return answered
  })

/** A batch's wait for its results (`Clock` milliseconds). */
interface Wait {
  readonly deadline: number
  missing: number
  /** When lost shares were last looked for. */
  checked: number
  /** When a share was last answered (or the batch sent). */
  progress: number
  /** When the batch last said nobody answers. */
  warned: number
}

/** A batch nobody answers for `quietMillis` says so, with the workers seen, long before its deadline stops the run. */
const warnQuiet = (client: Client, batch: Batch, wait: Wait, now: number) =>
  Effect.gen(function*() {
    wait.warned = now
    const seen = yield* seenWorkers(client)
    const { url } = client.options
    yield* Effect.logWarning(
      `no rollout worker answered a share of this batch in ${((now - wait.progress) / 1000).toFixed(0)} s ` +
        `(${wait.missing} of ${batch.size} waiting on ${url}); workers seen in the last 30 s: ` +
        `${seen.length === 0 ? "none" : seen.join(", ")}. Start \`agentfly rollout-worker CONFIG --queue ` +
        `${url}\` with this run's config; the run waits up to ${client.timeoutSeconds} s`
    )
  })

/** The run stops: a batch's shares got no result by its deadline. */
const timedOut = (client: Client, batch: Batch, wait: Wait) =>
  Effect.gen(function*() {
    const seen = yield* seenWorkers(client)
    return yield* workersError(
      `${wait.missing} of ${batch.size} shares of a batch got no result from the rollout queue ${client.options.url} ` +
        `within ${client.timeoutSeconds} s (this run's agent key ${client.options.agentKey}, run ` +
        `${client.options.runId ?? client.options.agentKey}); workers seen in the ` +
        `last 30 s: ${seen.length === 0 ? "none" : seen.join(", ")}. Start ` +
        "`agentfly rollout-worker CONFIG --queue URL` with this run's config"
    )
  })

/** Waits for every share of a sent batch to be answered, sending again those the queue lost. */
const awaitBatch = (client: Client, batch: Batch) =>
  Effect.gen(function*() {
    const quiet = client.options.quietMillis ?? 30_000
    const start = yield* Clock.currentTimeMillis
    const wait: Wait = {
      deadline: start + client.timeoutSeconds * 1000,
      missing: batch.size,
      checked: start,
      progress: start,
      // Never yet: the first warning comes after `quiet`, whatever the clock's origin (`TestClock` starts at 0).
      warned: Number.NEGATIVE_INFINITY
    }
    while (wait.missing > 0) {
      const now = yield* Clock.currentTimeMillis
      if (now - wait.progress > quiet && now - wait.warned > 2 * quiet) yield* warnQuiet(client, batch, wait, now)
      if (now > wait.deadline) return yield* timedOut(client, batch, wait)
      if (now - wait.checked > (client.options.checkMillis ?? 10_000)) {
        wait.checked = now
        yield* resendLost(client, batch)
      }
      const answered = yield* readResults(client, batch)
      if (answered > 0) wait.progress = yield* Clock.currentTimeMillis
      wait.missing -= answered
    }
  })

/** A batch in shares of `shareRows` rows (default: 8 shares) on the queue; its groups in row order. */
const collect = (client: Client, rows: ReadonlyArray<Dataset.Row>, sampling: BatchSampling, version: number) =>
  Effect.gen(function*() {
    const { options } = client
    const id = Auth.randomId()
    const batch = new Map<string, Pending>()
    for (const share of sharesOf(rows, Math.max(1, options.shareRows ?? Math.ceil(rows.length / 8)))) {
      const shareId = `${id}-${share.rowOffset}`
      const request = {
        runId: options.runId ?? options.agentKey,
        share: shareId,
        agentKey: options.agentKey,
        rows: share.rows,
        ...sampling,
        rowOffset: share.rowOffset,
        version
      }
      const payload = JSON.stringify({ id: shareId, replyTo: client.results, request })
      batch.set(shareId, { payload, entry: "", lost: 0, groups: undefined })
    }
    yield* send(client, [...batch.values()])
    yield* awaitBatch(client, batch)
    return [...batch.values()].flatMap((s) => s.groups!).sort((a, b) => a.rowIndex - b.rowIndex)
  })

/**
 * The trainer's side: batches put on the queue and their groups gathered.
 *
 * @category constructors
 * @since 0.1.0
 */
export const client = Effect.fn("RolloutQueue.client")(function*(
  options: ClientOptions
): Effect.fn.Return<Rollouts.Remote, RunError, Scope.Scope> {
  const problem = queueProblem(options.url, options.token)
  if (problem !== undefined) return yield* workersError(problem)
  const link: Link = { downSince: undefined, lastError: "" }
  const redis = yield* connect(options.url, link)
  const reader = yield* connect(options.url, link)
  const runId = options.runId ?? options.agentKey
  const keys = keysOf(runId)
  const totals: Totals = { shares: 0, duplicates: 0, resent: 0, reclaimed: 0 }
  const state: Client = {
    options,
    redis,
    reader,
    link,
    keys,
    results: keys.results(randomUUID()),
    timeoutSeconds: options.timeoutSeconds ?? 1800,
    totals,
    gathered: makeGathered(totals),
    lastId: "0-0"
  }
  yield* watchLink(state).pipe(Effect.forkScoped)
  yield* ensureGroup(redis, keys.shares)
  yield* alive(state)
  yield* alive(state).pipe(Effect.delay("10 seconds"), Effect.forever, Effect.ignore, Effect.forkScoped)
  yield* Effect.addFinalizer(() =>
    Effect.ignore(command(state, "DEL", () => redis.del(state.results, `${state.results}:alive`)))
  )
  return {
    collect: (rows, sampling, version) => collect(state, rows, sampling, version),
    figures: Effect.sync(() => takeFigures(state.gathered, totals))
  }
})

/**
 * The run's training batches on the Redis queue's workers ({@link client}), as the `Rollouts` service.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (options: ClientOptions): Layer.Layer<Rollouts.Rollouts, RunError> =>
  Layer.effect(Rollouts.Rollouts, Effect.map(client(options), Rollouts.fromRemote))

// ===== Worker side =====

/**
 * @category models
 * @since 0.1.0
 */
export interface WorkerOptions {
  readonly url: string
  /** Shares run at once (default 2). */
  readonly concurrency?: number | undefined
  /** A share not touched for this long is claimed by another worker (default 30 s). */
  readonly claimSeconds?: number | undefined
  /** This worker's name in the consumer group (default: host name and pid). */
  readonly name?: string | undefined
  /** Told of every share taken (the CLI logs it). */
  readonly onShare?: ((id: string, rows: number, claimed: boolean) => Effect.Effect<void>) | undefined
  /** The run this worker serves (default: its config's, `RolloutWorker.runId`). */
  readonly runId?: string | undefined
  /** The run's token (`AGENTFLY_WORKER_TOKEN`), the key of every reply's HMAC. */
  readonly token?: string | undefined
  /** How long a share waits for the servers to hold its policy version before it fails (default 60 s). */
  readonly versionWaitMs?: number | undefined
}

/** A worker's side: what it rolls out, on which servers, its name in the consumer group, its control connection. */
interface QueueWorker {
  readonly setup: RolloutSetup
  readonly servers: InferenceServers.InferenceServers
  readonly agentKey: string
  readonly runId: string
  readonly options: WorkerOptions
  readonly keys: ReturnType<typeof keysOf>
  readonly name: string
  readonly claimMs: number
  /** Claims, acknowledgements, replies and heartbeats (each share slot reads on a connection of its own). */
  readonly control: Redis
}

const workerCommand = <A>(worker: QueueWorker, what: string, f: () => Promise<A>) => call(worker.options.url, what, f)

/** Says this worker is alive, with its task and agent key, for a trainer that waits in vain to name. */
const beat = (worker: QueueWorker) =>
  Effect.flatMap(Clock.currentTimeMillis, (now) =>
    workerCommand(worker, "HSET", () =>
      worker.control.hset(
        WORKERS,
        worker.name,
        JSON.stringify({
          agentKey: worker.agentKey,
          runId: worker.runId,
          task: worker.setup.runtime.task.name,
          seen: now
        })
      )))

/** The share's groups (or why not), encoded for its trainer; touched while it runs, so nobody claims it. */
const rollOutShare = (worker: QueueWorker, entry: string, id: string, request: typeof RolloutRequest.Type) => {
  const { keys, name, control } = worker
  const touch = workerCommand(worker, "XCLAIM", () => control.xclaim(keys.shares, GROUP, name, 0, entry, "JUSTID"))
    .pipe(Effect.ignore, Effect.delay(worker.claimMs / 3), Effect.forever)
  return rollOut(worker.setup, worker.servers, request, worker.options.versionWaitMs ?? defaultVersionWaitMs).pipe(
    Effect.map((encoded) => ({ id, worker: name, groups: encoded.groups, env: encoded.env, servers: encoded.servers })),
    Effect.catch((e) => Effect.succeed({ id, error: e.message })),
    Effect.raceFirst(touch)
  )
}

/** Runs one share taken from the stream (or drops it), replies to its trainer and acknowledges it. */
const runShare = (worker: QueueWorker, entry: string, payload: string, claimed: boolean) =>
  Effect.gen(function*() {
    const { keys, control } = worker
    const done = workerCommand(worker, "XACK", () =>
      control.multi().xack(keys.shares, GROUP, entry).xdel(keys.shares, entry).exec())
    const share = parse<{ id: unknown; replyTo: unknown; request: unknown }>(payload)
    if (share === undefined || typeof share.id !== "string" || share.id.length > 128) {
      yield* Effect.logWarning(`rollout queue: entry ${entry} is not a share; dropped`)
      return yield* done
    }
    // Replies go only to this run's results streams: a share naming any other key (to put an expiry on it, or
    // anything in it) is dropped unrun.
    if (!isResultsKey(keys, share.replyTo)) {
      yield* Effect.logWarning(
        `rollout queue: share ${share.id} replies to ${String(share.replyTo).slice(0, 200)}, not a results stream ` +
          "of this run; dropped"
      )
      return yield* done
    }
    const replyTo = share.replyTo
    const id = share.id
    // A trainer that is gone: nobody reads the result.
    if ((yield* workerCommand(worker, "EXISTS", () => control.exists(`${replyTo}:alive`))) === 0) {
      return yield* done
    }
    const decoded = yield* Effect.result(Schema.decodeUnknownEffect(RolloutRequest)(share.request))
    if (decoded._tag === "Success" && worker.options.onShare !== undefined) {
      yield* worker.options.onShare(id, decoded.success.rows.length, claimed)
    }
    // A share this worker cannot read goes back to its trainer as a failure (another worker could not either).
    const request = decoded._tag === "Success" ? decoded.success : undefined
    const refused = decoded._tag === "Failure"
      ? `the share could not be read: ${decoded.failure.message}`
      : request!.runId !== worker.runId || request!.share !== id
      ? `the share names run ${request!.runId} (share ${request!.share}), this worker's run is ${worker.runId}`
      : request!.agentKey !== worker.agentKey
      ? `the share is for agent key ${request!.agentKey}, this worker runs ${worker.agentKey}: start it with ` +
        "the run's config"
      : undefined
    const answer = refused === undefined
      ? { ...yield* rollOutShare(worker, entry, id, request!), ...(claimed ? { claimed: true } : {}) }
      : { id, error: refused }
    const reply = signed(worker.options.token, worker.runId, id, answer)
    yield* workerCommand(worker, "XADD", () =>
      control.multi().xadd(replyTo, "*", "p", JSON.stringify(reply)).expire(replyTo, 3600).exec())
    yield* done
  })

/** Takes the next share (a dead worker's first, then a new one, waiting up to a second) and runs it. */
const next = (worker: QueueWorker, reader: Redis) =>
  Effect.gen(function*() {
    const { keys, name, claimMs } = worker
    const claimed = entries(
      (yield* workerCommand(worker, "XAUTOCLAIM", () =>
        reader.xautoclaim(keys.shares, GROUP, name, claimMs, "0-0", "COUNT", 1)))[1]
    )
    const taken = claimed.length > 0 ? claimed : yield* workerCommand(worker, "XREADGROUP", () =>
      reader.xreadgroup("GROUP", GROUP, name, "COUNT", 1, "BLOCK", 1000, "STREAMS", keys.shares, ">")).pipe(
        Effect.map((r) => r === null ? [] : entries((r as Array<[string, unknown]>)[0]![1]))
      )
    for (const { id, payload } of taken) yield* runShare(worker, id, payload, claimed.length > 0)
  }).pipe(
    Effect.catch((e) =>
      Effect.logWarning(`${e.message}; going on in 1 s`).pipe(
        Effect.andThen(Effect.sleep("1 second")),
        // A Redis that restarted without persistence forgot the consumer group.
        Effect.andThen(
          e.message.includes("NOGROUP") ? Effect.ignore(ensureGroup(worker.control, worker.keys.shares)) : Effect.void
        )
      )
    )
  )

/** One share at a time, forever, on a connection of its own. */
const slot = (worker: QueueWorker) =>
  Effect.scoped(Effect.flatMap(connect(worker.options.url), (reader) => Effect.forever(next(worker, reader))))

/**
 * Takes `agent`'s shares from the queue and rolls them out on `servers`, until interrupted. A lost connection or a
 * share that cannot be read is logged and the worker goes on.
 *
 * @category constructors
 * @since 0.1.0
 */
export const work = Effect.fn("RolloutQueue.work")(function*(
  setup: RolloutSetup,
  servers: InferenceServers.InferenceServers,
  agentKey: string,
  options: WorkerOptions
): Effect.fn.Return<never, RunError, Scope.Scope> {
  const problem = queueProblem(options.url, options.token)
  if (problem !== undefined) return yield* workersError(problem)
  const runId = options.runId ?? runIdOf(setup.runtime.task.name, setup.config)
  const worker: QueueWorker = {
    setup,
    servers,
    agentKey,
    runId,
    options,
    keys: keysOf(runId),
    name: options.name ?? `${process.env["HOSTNAME"] ?? "worker"}-${process.pid}`,
    claimMs: (options.claimSeconds ?? 30) * 1000,
    control: yield* connect(options.url)
  }
  yield* ensureGroup(worker.control, worker.keys.shares)
  yield* beat(worker).pipe(Effect.ignore, Effect.andThen(Effect.sleep("5 seconds")), Effect.forever, Effect.forkScoped)
  yield* Effect.addFinalizer(() =>
    Effect.ignore(workerCommand(worker, "HDEL", () => worker.control.hdel(WORKERS, worker.name)))
  )
  yield* Effect.all(Array.from({ length: options.concurrency ?? 2 }, () => slot(worker)), { concurrency: "unbounded" })
  return yield* Effect.never
})
