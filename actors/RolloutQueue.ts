/**
 * Rollout workers fed through Redis streams (`rollout.queue`): instead of the trainer sending each worker its share
 * (`rollout.workers`, `actors/RolloutWorker.ts`), it puts a batch's shares on a stream and the workers
 * (`agentfly rollout-worker CONFIG --queue redis://…`) take them as they are free. Workers may join and leave
 * while a run goes on, and a fast worker takes more shares than a slow one.
 *
 * - **Keys.** Everything of a run's agent key (`RolloutWorker.agentKey`: the task and the `agent` section) lives
 *   under `agentfly:rollouts:<key>`: the shares stream (consumer group `workers`), and one results stream per
 *   trainer process, which the trainer keeps marked alive. Workers started with another config read another
 *   stream: a run that gets no results within `timeoutSeconds` says which workers it saw and with what config.
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
 * @since 0.1.0
 */
import { Effect, Layer, Schema } from "effect"
import type { Scope } from "effect"
import { Redis } from "ioredis"
import { randomUUID } from "node:crypto"
import type * as Dataset from "../src/Dataset.ts"
import { Sampler } from "../src/Sampler.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import type * as InferenceServers from "./InferenceServers.ts"
import {
  addCounts,
  decodeResponse,
  mergeEnvFigures,
  RolloutRequest,
  RolloutResponse,
  samplingCounts
} from "./RolloutWorker.ts"
import * as Rollouts from "./Rollouts.ts"
import type { RolloutSetup } from "./RolloutSetup.ts"
import { type RunError, runError } from "./RunError.ts"

const GROUP = "workers"
const WORKERS = "agentfly:rollouts:workers"
const keysOf = (agentKey: string) => {
  const prefix = `agentfly:rollouts:${agentKey}`
  return { shares: `${prefix}:shares`, results: (token: string) => `${prefix}:results:${token}` }
}

const workersError = (message: string) => runError("Workers", message)
const messageOf = (e: unknown) => String((e as Error).message ?? e)

/** One Redis command, its failure typed (`Workers`, naming the queue and the command). */
const call = (url: string) => <A>(what: string, f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (e) => workersError(`the rollout queue ${url}: ${what} failed (${messageOf(e)})`) })

/** Since when a connection has been down (undefined while up), and the last error it reported. */
interface Link {
  downSince: number | undefined
  lastError: string
}

const connect = (url: string, link?: Link) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => {
        // A command waits through 20 reconnection attempts, 0.5 s apart (≈ 10 s), for a lost connection, then fails.
        const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 20, retryStrategy: () => 500 })
        redis.on("error", (e: unknown) => {
          if (link !== undefined) link.lastError = messageOf(e)
        }) // reconnects in the background
        return redis.connect().then(() => {
          if (link !== undefined) {
            redis.on("close", () => void (link.downSince ??= Date.now()))
            redis.on("ready", () => void (link.downSince = undefined))
          }
          return redis
        }, (e) => (redis.disconnect(), Promise.reject(e)))
      },
      catch: (e) => workersError(`the rollout queue ${url} cannot be reached (${messageOf(e)})`)
    }),
    (redis) => Effect.sync(() => redis.disconnect())
  )

/** How long a run waits for a lost queue before it stops (workers wait for it as long as it takes). */
const giveUpMs = 10_000

/** The shares stream's consumer group, created with the stream unless it exists. */
const ensureGroup = (redis: Redis, stream: string) =>
  Effect.tryPromise({ try: () => redis.xgroup("CREATE", stream, GROUP, "$", "MKSTREAM"), catch: messageOf }).pipe(
    Effect.catch((why) => why.includes("BUSYGROUP") ? Effect.void : Effect.fail(workersError(`the rollout queue: ${why}`)))
  )

/** `[id, [field, value, …]]` entries → `{ id, payload }` (the one field is `p`); deleted entries are skipped. */
const entries = (raw: unknown): Array<{ readonly id: string; readonly payload: string }> =>
  ((raw ?? []) as Array<[string, Array<string> | null]>).flatMap(([id, fields]) =>
    fields === null ? [] : [{ id, payload: fields[fields.indexOf("p") + 1] ?? "" }]
  )

const parse = <A>(text: string): A | undefined => {
  try {
    return JSON.parse(text) as A
  } catch {
    return undefined
  }
}

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

/**
 * The trainer's side: batches put on the queue and their groups gathered.
 *
 * @category constructors
 * @since 0.1.0
 */
export const client = Effect.fn("RolloutQueue.client")(function*(
  options: ClientOptions
): Effect.fn.Return<Rollouts.Remote, RunError, Scope.Scope> {
  const link: Link = { downSince: undefined, lastError: "" }
  const redis = yield* connect(options.url, link)
  const reader = yield* connect(options.url, link)
  const lost = () =>
    workersError(
      `lost the rollout queue ${options.url} for ${((Date.now() - link.downSince!) / 1000).toFixed(0)} s ` +
        `(${link.lastError || "connection closed"}): the run stops. Start Redis again (its workers reconnect by ` +
        "themselves) and resume the run: agentfly train CONFIG --resume"
    )
  // Every command fails at once, with what to do, once the queue has been gone for `giveUpMs`; a command that failed
  // while it was gone says the same.
  const command = <A>(what: string, f: () => Promise<A>) =>
    Effect.suspend(() =>
      link.downSince !== undefined && Date.now() - link.downSince >= giveUpMs
        ? Effect.fail(lost())
        : call(options.url)(what, f).pipe(Effect.mapError((e) => (link.downSince === undefined ? e : lost())))
    )
  // Said as soon as the connection drops, and when it is back.
  yield* Effect.gen(function*() {
    let said = false
    while (true) {
      yield* Effect.sleep("1 second")
      if (link.downSince !== undefined && !said) {
        said = true
        yield* Effect.logWarning(
          `the rollout queue ${options.url} is unreachable (${link.lastError || "connection closed"}); the run waits ` +
            `${giveUpMs / 1000} s for it, then stops`
        )
      } else if (link.downSince === undefined && said) {
        said = false
        yield* Effect.logInfo(`the rollout queue ${options.url} is back`)
      }
    }
  }).pipe(Effect.forkScoped)
  const keys = keysOf(options.agentKey)
  const results = keys.results(randomUUID())
  const timeoutSeconds = options.timeoutSeconds ?? 1800
  yield* ensureGroup(redis, keys.shares)
  // Workers run a share only while its trainer is alive.
  const alive = command("SET", () => redis.set(`${results}:alive`, "1", "EX", 30))
  yield* alive
  yield* alive.pipe(Effect.delay("10 seconds"), Effect.forever, Effect.ignore, Effect.forkScoped)
  yield* Effect.addFinalizer(() => Effect.ignore(command("DEL", () => redis.del(results, `${results}:alive`))))

  let lastId = "0-0"
  // Each worker's latest environment figures.
  const env = new Map<string, Readonly<Record<string, number>>>()
  // The workers' sampling counts since the step's figures.
  let sampled: Record<string, number> = {}
  const totals = { shares: 0, duplicates: 0, resent: 0, reclaimed: 0 }
  let counted = { ...totals }

  const seenWorkers = Effect.map(
    Effect.orElseSucceed(command("HGETALL", () => redis.hgetall(WORKERS)), () => ({} as Record<string, string>)),
    (all) =>
      Object.entries(all).flatMap(([id, json]) => {
        const w = parse<{ agentKey: string; task: string; seen: number }>(json)
        return w !== undefined && Date.now() - w.seen < 30_000 ? [`${id} (task ${w.task}, agent key ${w.agentKey})`] : []
      })
  )

  const send = (shares: ReadonlyArray<Pending>) =>
    Effect.gen(function*() {
      const pipeline = redis.multi()
      for (const share of shares) pipeline.xadd(keys.shares, "*", "p", share.payload)
      const replies = (yield* command("XADD", () => pipeline.exec())) ?? []
      shares.forEach((share, i) => {
        const entry = replies[i]?.[1]
        if (typeof entry === "string") share.entry = entry
        share.lost = 0
      })
    })

  /** Shares neither answered nor on the stream at two checks in a row were lost with the queue's memory. */
  const resendLost = (batch: ReadonlyMap<string, Pending>) =>
    Effect.gen(function*() {
      const lost: Array<Pending> = []
      for (const share of batch.values()) {
        if (share.groups !== undefined) continue
        const there = yield* command("XRANGE", () => redis.xrange(keys.shares, share.entry, share.entry))
        share.lost = there.length === 0 ? share.lost + 1 : 0
        if (share.lost >= 2) lost.push(share)
      }
      if (lost.length === 0) return
      yield* Effect.logWarning(
        `the rollout queue ${options.url} lost ${lost.length} share(s) of a batch (restarted?): sending them again`
      )
      yield* ensureGroup(redis, keys.shares)
      yield* alive
      yield* send(lost)
      totals.resent += lost.length
    })

  /** Results that arrived (waiting up to a second); the count of shares answered for the first time. */
  const readResults = (batch: ReadonlyMap<string, Pending>) =>
    Effect.gen(function*() {
      const raw = yield* command("XREAD", () => reader.xread("COUNT", 100, "BLOCK", 1000, "STREAMS", results, lastId))
      const got = raw === null ? [] : entries(raw[0]![1])
      let answered = 0
      for (const { id, payload } of got) {
        lastId = id
        const reply = parse<
          {
            id: string
            worker?: string
            groups?: unknown
            env?: unknown
            servers?: unknown
            error?: string
            claimed?: boolean
          }
        >(payload)
        const share = reply === undefined ? undefined : batch.get(reply.id)
        if (reply === undefined || share === undefined) continue
        if (share.groups !== undefined) {
          totals.duplicates++
          continue
        }
        if (reply.error !== undefined) return yield* workersError(`a rollout worker failed a share: ${reply.error}`)
        const decoded = yield* decodeResponse(
          JSON.stringify({ groups: reply.groups, env: reply.env, servers: reply.servers })
        ).pipe(
          Effect.mapError((e) => workersError(`a rollout worker answered groups that do not decode: ${e.message}`))
        )
        share.groups = [...decoded.groups]
        if (decoded.env !== undefined) env.set(reply.worker ?? "", decoded.env)
        if (decoded.servers !== undefined) addCounts(sampled, decoded.servers)
        if (reply.claimed === true) {
          totals.reclaimed++
          yield* Effect.logInfo(
            `share ${reply.id} was run by ${reply.worker ?? "a worker"} after the worker that took it stopped (its claim ` +
              "expired)"
          )
        }
        totals.shares++
        answered++
      }
      if (got.length > 0) yield* command("XTRIM", () => redis.xtrim(results, "MINID", lastId))
      return answered
    })

  const collect: Rollouts.Remote["collect"] = (rows, sampling, version) =>
    Effect.gen(function*() {
      const size = Math.max(1, options.shareRows ?? Math.ceil(rows.length / 8))
      const id = randomUUID().slice(0, 8)
      const batch = new Map<string, Pending>()
      for (let r0 = 0; r0 < rows.length; r0 += size) {
        const request = { agentKey: options.agentKey, rows: rows.slice(r0, r0 + size), ...sampling, rowOffset: r0, version }
        const payload = JSON.stringify({ id: `${id}-${r0}`, replyTo: results, request })
        batch.set(`${id}-${r0}`, { payload, entry: "", lost: 0, groups: undefined })
      }
      yield* send([...batch.values()])
      const deadline = Date.now() + timeoutSeconds * 1000
      let missing = batch.size
      let checked = Date.now()
      // A batch nobody answers for 30 s says so (and again every minute), with the workers seen, long before its
      // deadline stops the run.
      const quiet = options.quietMillis ?? 30_000
      let progress = Date.now()
      let warned = 0
      while (missing > 0) {
        if (Date.now() - progress > quiet && Date.now() - warned > 2 * quiet) {
          warned = Date.now()
          const seen = yield* seenWorkers
          yield* Effect.logWarning(
            `no rollout worker answered a share of this batch in ${((Date.now() - progress) / 1000).toFixed(0)} s ` +
              `(${missing} of ${batch.size} waiting on ${options.url}); workers seen in the last 30 s: ` +
              `${seen.length === 0 ? "none" : seen.join(", ")}. Start \`agentfly rollout-worker CONFIG --queue ` +
              `${options.url}\` with this run's config; the run waits up to ${timeoutSeconds} s`
          )
        }
        if (Date.now() > deadline) {
          const seen = yield* seenWorkers
          return yield* workersError(
            `${missing} of ${batch.size} shares of a batch got no result from the rollout queue ${options.url} ` +
              `within ${timeoutSeconds} s (this run's agent key ${options.agentKey}); workers seen in the last 30 s: ` +
              `${seen.length === 0 ? "none" : seen.join(", ")}. Start ` +
              "`agentfly rollout-worker CONFIG --queue URL` with this run's config"
          )
        }
        if (Date.now() - checked > (options.checkMillis ?? 10_000)) {
          checked = Date.now()
          yield* resendLost(batch)
        }
        const answered = yield* readResults(batch)
        if (answered > 0) progress = Date.now()
        missing -= answered
      }
      return [...batch.values()].flatMap((s) => s.groups!).sort((a, b) => a.rowIndex - b.rowIndex)
    })

  const figures = Effect.sync(() => {
    const out = {
      ...mergeEnvFigures(env.values()),
      ...sampled,
      "workers/shares": totals.shares - counted.shares,
      "workers/duplicates": totals.duplicates - counted.duplicates,
      "workers/resent": totals.resent - counted.resent,
      "workers/reclaimed": totals.reclaimed - counted.reclaimed
    }
    counted = { ...totals }
    sampled = {}
    return out
  })
  return { collect, figures }
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
}

/**
 * Takes `agent`'s shares from the queue and rolls them out on `servers`, until interrupted. A lost connection or a
 * share that cannot be read is logged and the worker goes on.
 *
 * @category constructors
 * @since 0.1.0
 */
export const work = Effect.fn("RolloutQueue.work")(function*(
  agent: RolloutSetup,
  servers: InferenceServers.InferenceServers,
  agentKey: string,
  options: WorkerOptions
): Effect.fn.Return<never, RunError, Scope.Scope> {
  const keys = keysOf(agentKey)
  const command = call(options.url)
  const name = options.name ?? `${process.env["HOSTNAME"] ?? "worker"}-${process.pid}`
  const claimMs = (options.claimSeconds ?? 30) * 1000
  const control = yield* connect(options.url)
  yield* ensureGroup(control, keys.shares)
  const beat = command("HSET", () =>
    control.hset(WORKERS, name, JSON.stringify({ agentKey, task: agent.runtime.task.name, seen: Date.now() })))
  yield* beat.pipe(Effect.ignore, Effect.andThen(Effect.sleep("5 seconds")), Effect.forever, Effect.forkScoped)
  yield* Effect.addFinalizer(() => Effect.ignore(command("HDEL", () => control.hdel(WORKERS, name))))

  /** The share's groups (or why not), encoded for its trainer; touched while it runs, so nobody claims it. */
  const rollOut = (entry: string, id: string, request: typeof RolloutRequest.Type) => {
    const touch = command("XCLAIM", () => control.xclaim(keys.shares, GROUP, name, 0, entry, "JUSTID")).pipe(
      Effect.ignore,
      Effect.delay(claimMs / 3),
      Effect.forever
    )
    return Rollouts.collectGroups(agent, request.rows as ReadonlyArray<Dataset.Row>, request).pipe(
      Effect.provideService(Sampler, servers.sampler(request.version)),
      Effect.flatMap((groups) =>
        Effect.flatMap(
          Effect.all({ env: agent.runtime.environmentStats, sampled: samplingCounts(servers) }),
          ({ env, sampled }) => Schema.encodeEffect(RolloutResponse)({ groups, env, servers: sampled })
        )
      ),
      Effect.map((encoded) => {
        const { groups, env, servers: counts } = encoded as {
          readonly groups: unknown
          readonly env?: unknown
          readonly servers?: unknown
        }
        return { id, worker: name, groups, env, servers: counts }
      }),
      Effect.catch((e) => Effect.succeed({ id, error: e.message })),
      Effect.raceFirst(touch)
    )
  }

  const run = (entry: string, payload: string, claimed: boolean) =>
    Effect.gen(function*() {
      const done = command("XACK", () => control.multi().xack(keys.shares, GROUP, entry).xdel(keys.shares, entry).exec())
      const share = parse<{ id: string; replyTo: string; request: unknown }>(payload)
      if (share === undefined || typeof share.replyTo !== "string") {
        yield* Effect.logWarning(`rollout queue: entry ${entry} is not a share; dropped`)
        return yield* done
      }
      // A trainer that is gone: nobody reads the result.
      if ((yield* command("EXISTS", () => control.exists(`${share.replyTo}:alive`))) === 0) return yield* done
      const decoded = yield* Effect.result(Schema.decodeUnknownEffect(RolloutRequest)(share.request))
      if (decoded._tag === "Success" && options.onShare !== undefined) {
        yield* options.onShare(share.id, decoded.success.rows.length, claimed)
      }
      // A share this worker cannot read goes back to its trainer as a failure (another worker could not either).
      const reply = decoded._tag === "Success"
        ? { ...yield* rollOut(entry, share.id, decoded.success), ...(claimed ? { claimed: true } : {}) }
        : { id: share.id, error: `the share could not be read: ${decoded.failure.message}` }
      yield* command("XADD", () =>
        control.multi().xadd(share.replyTo, "*", "p", JSON.stringify(reply)).expire(share.replyTo, 3600).exec())
      yield* done
    })

  const slot = Effect.gen(function*() {
    const reader = yield* connect(options.url)
    const next = Effect.gen(function*() {
      // A dead worker's share first, then a new one.
      const claimed = entries(
        (yield* command("XAUTOCLAIM", () => reader.xautoclaim(keys.shares, GROUP, name, claimMs, "0-0", "COUNT", 1)))[1]
      )
      const taken = claimed.length > 0 ? claimed : yield* command("XREADGROUP", () =>
        reader.xreadgroup("GROUP", GROUP, name, "COUNT", 1, "BLOCK", 1000, "STREAMS", keys.shares, ">")).pipe(
          Effect.map((r) => r === null ? [] : entries((r as Array<[string, unknown]>)[0]![1]))
        )
      for (const { id, payload } of taken) yield* run(id, payload, claimed.length > 0)
    }).pipe(
      Effect.catch((e) =>
        Effect.logWarning(`${e.message}; going on in 1 s`).pipe(
          Effect.andThen(Effect.sleep("1 second")),
          // A Redis that restarted without persistence forgot the consumer group.
          Effect.andThen(e.message.includes("NOGROUP") ? Effect.ignore(ensureGroup(control, keys.shares)) : Effect.void)
        )
      )
    )
    return yield* Effect.forever(next)
  }).pipe(Effect.scoped)
  yield* Effect.all(Array.from({ length: options.concurrency ?? 2 }, () => slot), { concurrency: "unbounded" })
  return yield* Effect.never
})
