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
 *
 * @since 0.1.0
 */
import { Cause, Effect, Schema } from "effect"
import type { Scope } from "effect"
import { Redis } from "ioredis"
import { randomUUID } from "node:crypto"
import type * as Dataset from "../src/Dataset.ts"
import { Sampler } from "../src/Sampler.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import type * as InferenceServers from "./InferenceServers.ts"
import { decodeResponse, RolloutRequest, RolloutResponse } from "./RolloutWorker.ts"
import { collectGroups, TrainerError } from "./Trainer.ts"
import type { Agent, RemoteRollouts } from "./Trainer.ts"

const GROUP = "workers"
const WORKERS = "agentfly:rollouts:workers"
const keysOf = (agentKey: string) => {
  const prefix = `agentfly:rollouts:${agentKey}`
  return { shares: `${prefix}:shares`, results: (token: string) => `${prefix}:results:${token}` }
}

const workersError = (message: string) => new TrainerError({ reason: "Workers", message })

const connect = (url: string) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => {
        // A command waits through 20 reconnection attempts (≈ 10 s) for a lost connection, then fails.
        const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 20 })
        redis.on("error", (_: unknown) => undefined) // reconnects in the background
        return redis.connect().then(() => redis, (e) => (redis.disconnect(), Promise.reject(e)))
      },
      catch: (e) => workersError(`the rollout queue ${url} cannot be reached (${String((e as Error).message ?? e)})`)
    }),
    (redis) => Effect.sync(() => redis.disconnect())
  )

const ensureGroup = (redis: Redis, stream: string) =>
  Effect.tryPromise({
    try: () => redis.xgroup("CREATE", stream, GROUP, "$", "MKSTREAM"),
    catch: (e) => e
  }).pipe(Effect.catch((e) =>
    String((e as Error).message ?? e).includes("BUSYGROUP")
      ? Effect.void
      : Effect.fail(workersError(`the rollout queue: ${String((e as Error).message ?? e)}`))
  ))

/** `[id, [field, value, …]]` entries → `{ id, payload }` (the one field is `p`). */
const entries = (raw: unknown): Array<{ readonly id: string; readonly payload: string }> =>
  ((raw ?? []) as Array<[string, Array<string> | null]>).flatMap(([id, fields]) =>
    fields === null ? [] : [{ id, payload: fields[fields.indexOf("p") + 1] ?? "" }]
  )

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
}

/**
 * The trainer's side: batches put on the queue and their groups gathered.
 *
 * @category constructors
 * @since 0.1.0
 */
export const client = Effect.fn("RolloutQueue.client")(function*(
  options: ClientOptions
): Effect.fn.Return<RemoteRollouts, TrainerError, Scope.Scope> {
  const redis = yield* connect(options.url)
  const reader = yield* connect(options.url)
  const keys = keysOf(options.agentKey)
  const token = randomUUID()
  const results = keys.results(token)
  yield* ensureGroup(redis, keys.shares)
  const command = <A>(what: string, f: () => Promise<A>) =>
    Effect.tryPromise({
      try: f,
      catch: (e) => workersError(`the rollout queue ${options.url}: ${what} failed (${String((e as Error).message ?? e)})`)
    })
  // Workers run a share only while its trainer is alive.
  const alive = () => redis.set(`${results}:alive`, "1", "EX", 30)
  yield* command("SET", alive)
  yield* command("SET", alive).pipe(Effect.delay("10 seconds"), Effect.forever, Effect.ignore, Effect.forkScoped)
  yield* Effect.addFinalizer(() => Effect.promise(() => redis.del(results, `${results}:alive`)).pipe(Effect.ignore))

  let lastId = "0-0"
  let counted = { shares: 0, duplicates: 0, resent: 0 }
  const totals = { shares: 0, duplicates: 0, resent: 0 }

  const seenWorkers = Effect.promise(() => redis.hgetall(WORKERS).catch(() => ({}))).pipe(
    Effect.map((all) =>
      Object.entries(all).flatMap(([id, json]) => {
        try {
          const w = JSON.parse(json) as { agentKey: string; task: string; seen: number }
          return Date.now() - w.seen < 30_000 ? [`${id} (task ${w.task}, agent key ${w.agentKey})`] : []
        } catch {
          return []
        }
      })
    )
  )

  const collect: RemoteRollouts["collect"] = (rows, sampling, version) =>
    Effect.gen(function*() {
      const size = Math.max(1, options.shareRows ?? Math.ceil(rows.length / 8))
      const batch = randomUUID().slice(0, 8)
      const shares = new Map<string, Array<Trajectory.Group> | undefined>()
      // Each share's payload and stream entry, to send it again if the queue loses it (Redis restarted).
      const sent = new Map<string, { payload: string; entry: string; lost: number }>()
      const send = (ids: ReadonlyArray<string>) =>
        Effect.gen(function*() {
          const pipeline = redis.multi()
          for (const id of ids) pipeline.xadd(keys.shares, "*", "p", sent.get(id)!.payload)
          const replies = (yield* command("XADD", () => pipeline.exec())) ?? []
          ids.forEach((id, i) => {
            const entry = replies[i]?.[1]
            if (typeof entry === "string") sent.set(id, { ...sent.get(id)!, entry, lost: 0 })
          })
        })
      for (let r0 = 0; r0 < rows.length; r0 += size) {
        const id = `${batch}-${r0}`
        shares.set(id, undefined)
        const request = {
          agentKey: options.agentKey,
          rows: rows.slice(r0, r0 + size),
          ...sampling,
          rowOffset: r0,
          version
        }
        sent.set(id, { payload: JSON.stringify({ id, replyTo: results, request }), entry: "", lost: 0 })
      }
      yield* send([...shares.keys()])
      const deadline = Date.now() + (options.timeoutSeconds ?? 1800) * 1000
      let missing = shares.size
      let checked = Date.now()
      while (missing > 0) {
        if (Date.now() > deadline) {
          const seen = yield* seenWorkers
          return yield* workersError(
            `${missing} of ${shares.size} shares of a batch got no result from the rollout queue ${options.url} ` +
              `within ${options.timeoutSeconds ?? 1800} s (this run's agent key ${options.agentKey}); workers seen in ` +
              `the last 30 s: ${seen.length === 0 ? "none" : seen.join(", ")}. Start ` +
              "`agentfly rollout-worker CONFIG --queue URL` with this run's config"
          )
        }
        if (Date.now() - checked > 10_000) {
          // A share neither answered nor on the stream at two checks in a row was lost with the queue's memory.
          checked = Date.now()
          const lost: Array<string> = []
          for (const [id, s] of sent) {
            if (shares.get(id) !== undefined) continue
            const there = yield* command("XRANGE", () => redis.xrange(keys.shares, s.entry, s.entry))
            s.lost = there.length === 0 ? s.lost + 1 : 0
            if (s.lost >= 2) lost.push(id)
          }
          if (lost.length > 0) {
            yield* Effect.logWarning(
              `the rollout queue ${options.url} lost ${lost.length} share(s) of a batch (restarted?): sending them again`
            )
            yield* ensureGroup(redis, keys.shares)
            yield* command("SET", alive)
            yield* send(lost)
            totals.resent += lost.length
          }
        }
        const raw = yield* command("XREAD", () => reader.xread("COUNT", 100, "BLOCK", 1000, "STREAMS", results, lastId))
        const got = raw === null ? [] : entries(raw[0]![1])
        for (const { id, payload } of got) {
          lastId = id
          const reply = JSON.parse(payload) as { id: string; groups?: unknown; error?: string }
          if (!shares.has(reply.id)) continue
          if (shares.get(reply.id) !== undefined) {
            totals.duplicates++
            continue
          }
          if (reply.error !== undefined) return yield* workersError(`a rollout worker failed a share: ${reply.error}`)
          const decoded = yield* decodeResponse(JSON.stringify({ groups: reply.groups })).pipe(
            Effect.mapError((e) => workersError(`a rollout worker answered groups that do not decode: ${e.message}`))
          )
          shares.set(reply.id, [...decoded.groups])
          totals.shares++
          missing--
        }
        if (got.length > 0) yield* command("XTRIM", () => redis.xtrim(results, "MINID", lastId))
      }
      return [...shares.values()].flatMap((g) => g!).sort((a, b) => a.rowIndex - b.rowIndex)
    })

  const figures = Effect.sync(() => {
    const out = {
      "workers/shares": totals.shares - counted.shares,
      "workers/duplicates": totals.duplicates - counted.duplicates,
      "workers/resent": totals.resent - counted.resent
    }
    counted = { ...totals }
    return out
  })
  return { collect, figures }
})

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
 * Takes `agent`'s shares from the queue and rolls them out on `servers`, until interrupted.
 *
 * @category constructors
 * @since 0.1.0
 */
export const work = Effect.fn("RolloutQueue.work")(function*(
  agent: Agent,
  servers: InferenceServers.InferenceServers,
  agentKey: string,
  options: WorkerOptions
): Effect.fn.Return<never, TrainerError, Scope.Scope> {
  const keys = keysOf(agentKey)
  const name = options.name ?? `${process.env["HOSTNAME"] ?? "worker"}-${process.pid}`
  const claimMs = (options.claimSeconds ?? 30) * 1000
  const control = yield* connect(options.url)
  yield* ensureGroup(control, keys.shares)
  const beat = () =>
    control.hset(WORKERS, name, JSON.stringify({ agentKey, task: agent.runtime.task.name, seen: Date.now() }))
  yield* Effect.tryPromise(beat).pipe(Effect.ignore, Effect.andThen(Effect.sleep("5 seconds")), Effect.forever, Effect.forkScoped)
  yield* Effect.addFinalizer(() => Effect.promise(() => control.hdel(WORKERS, name)).pipe(Effect.ignore))

  const run = (id: string, raw: string, claimed: boolean) =>
    Effect.gen(function*() {
      const share = JSON.parse(raw) as { id: string; replyTo: string; request: unknown }
      const done = Effect.promise(() => control.multi().xack(keys.shares, GROUP, id).xdel(keys.shares, id).exec())
      if ((yield* Effect.promise(() => control.exists(`${share.replyTo}:alive`))) === 0) return yield* done
      const request = yield* Schema.decodeUnknownEffect(RolloutRequest)(share.request).pipe(
        Effect.mapError((e) => workersError(`share ${share.id}: ${e.message}`))
      )
      if (options.onShare !== undefined) yield* options.onShare(share.id, request.rows.length, claimed)
      // Touched while it runs, so that nobody claims it from a live worker.
      const touch = Effect.promise(() => control.xclaim(keys.shares, GROUP, name, 0, id, "JUSTID")).pipe(
        Effect.delay(claimMs / 3),
        Effect.forever
      )
      const reply = yield* collectGroups(agent, request.rows as ReadonlyArray<Dataset.Row>, request).pipe(
        Effect.provideService(Sampler, servers.sampler(request.version)),
        Effect.flatMap((groups) => Schema.encodeEffect(RolloutResponse)({ groups })),
        Effect.map((encoded) => ({ id: share.id, groups: (encoded as { readonly groups: unknown }).groups })),
        Effect.catch((e) => Effect.succeed({ id: share.id, error: e.message })),
        Effect.raceFirst(Effect.andThen(touch, Effect.never))
      )
      yield* Effect.promise(() =>
        control.multi().xadd(share.replyTo, "*", "p", JSON.stringify(reply)).expire(share.replyTo, 3600).exec()
      )
      yield* done
    })

  const slot = Effect.gen(function*() {
    const reader = yield* connect(options.url)
    // One share at a time; a lost Redis connection or a share that failed here is logged and the loop goes on.
    const next = Effect.gen(function*() {
      // A dead worker's share first, then a new one.
      const claimed = yield* Effect.promise(() =>
        reader.xautoclaim(keys.shares, GROUP, name, claimMs, "0-0", "COUNT", 1)
      ).pipe(Effect.map((r) => entries((r as [string, unknown])[1])))
      const taken = claimed.length > 0 ? claimed : yield* Effect.promise(() =>
        reader.xreadgroup("GROUP", GROUP, name, "COUNT", 1, "BLOCK", 1000, "STREAMS", keys.shares, ">")
      ).pipe(Effect.map((r) => r === null ? [] : entries((r as Array<[string, unknown]>)[0]![1])))
      for (const { id, payload } of taken) yield* run(id, payload, claimed.length > 0)
    }).pipe(
      Effect.catchCause((cause) => {
        const why = Cause.pretty(cause).split("\n")[0]!
        return Effect.logWarning(`rollout queue: ${why}; going on in 1 s`).pipe(
          Effect.andThen(Effect.sleep("1 second")),
          // A Redis that restarted without persistence forgot the consumer group.
          Effect.andThen(why.includes("NOGROUP") ? Effect.ignore(ensureGroup(control, keys.shares)) : Effect.void)
        )
      })
    )
    return yield* Effect.forever(next)
  }).pipe(Effect.scoped)
  yield* Effect.all(Array.from({ length: options.concurrency ?? 2 }, () => slot), { concurrency: "unbounded" })
  return yield* Effect.never
})
