/**
 * Global caps and leases on Redis (ioredis), shared by several processes or machines: the `Resource.Coordinator`
 * behind `ResourceManager.layerCoordinated`.
 *
 * A resource with cap `n` has `n` slots. A lease on slot `i` is the key `<prefix>:lease:<resource>:<i>`, holding
 * `<token>:<generation>:<holder>` with a TTL; the holder renews it by heartbeat while its scope is open and
 * deletes it when the scope closes. Acquire, renew, check, release and fenced writes are Lua scripts, atomic on
 * the server; each compares the whole value, so a holder can never renew, pass a check for, write under or
 * delete a key that another grant wrote.
 *
 * **What survives a restart.** Redis run as `.ci/setup-services` runs it (`--save '' --appendonly no`) forgets
 * everything when it restarts; an AOF with `appendfsync everysec` can lose the last writes it acknowledged; a
 * promoted replica lacks what it had not received. So nothing stored in Redis is trusted to order tokens across a
 * restart or failover, and two rules replace it:
 *
 * - **Fencing tokens are a hybrid logical clock on the server**: `max(last + 1, now)`, `now` the Redis server's
 *   own clock (`TIME`) in microseconds, `last` the slot's previous token (`<prefix>:fence:<resource>:<i>`, when
 *   it survived). A token is at most its grant's clock reading, so a token issued after a restart is greater
 *   than every token issued before it, whatever the persistence, as long as the clock of the server now serving
 *   reads later than the clock of the server that granted before (one machine whose clock is not stepped back
 *   across the restart; a failover target whose clock lags the old primary's by less than the failover takes).
 *   Tokens stay below 2^53 (exact JavaScript numbers) until the year 2255. A clock that jumps back while the
 *   server runs only slows the clock component: `last + 1` keeps tokens increasing.
 * - **A lease lives no longer than the redis-server process that granted it** (its generation: the server's
 *   `run_id`, new at every start and different on a replica). After a restart or failover the holder cannot know
 *   which of its writes the server kept, so every lease of an earlier generation is lost: `check` and fenced writes
 *   fail with `LeaseError(LeaseLost)`, the heartbeat calls `onLost`, and renewal stops. A surviving key of an
 *   earlier generation (with persistence) still holds its slot until its holder releases it or its TTL runs out,
 *   since that holder may still be acting until it notices.
 *
 * Anything guarded by the token (here {@link RedisCoordinator.fencedSet}; elsewhere, a store that keeps the
 * greatest token it has seen) refuses a stale holder: a crashed worker's lease expires after the TTL, a paused
 * one is overtaken, and the next holder's token is greater.
 *
 * A lost connection gives `LeaseError(CoordinatorUnavailable)`, retryable; clients made by {@link layer} fail fast
 * (no offline queue, a command timeout) instead of hanging, and reconnect in the background. A grant whose reply
 * was lost with the connection holds its slot until the TTL runs out.
 *
 * **Gotchas**
 *
 * The scripts build key names from their arguments, so every key of one resource must live on one Redis node
 * (true for a single server or a replicated primary; use one hash tag per resource on a cluster). They call
 * `TIME` before writing, which needs Redis 5 or later (effect replication).
 *
 * @since 0.1.0
 */
import { Clock, Context, Effect, Exit, Fiber, Layer, Schedule, Scope } from "effect"
import { Redis as IORedis } from "ioredis"
import type { RedisOptions } from "ioredis"
import * as Resource from "../../src/Resource.ts"

// ===== Scripts =====

/*
 * Every script starts with the generation check: `INFO server` gives the server's `run_id`, a random id that
 * changes whenever redis-server starts (a restart, with or without persistence) and differs between a primary and
 * the replica that replaces it. Scripts run atomically, so the run_id a script reads is the one that executes it.
 *
 * Tokens are written with `string.format("%d", …)`: Lua 5.1's `tostring` and `..` print numbers with 14
 * significant digits (`1.7000000000001e+15`), which would corrupt microsecond tokens.
 */
const RUN_ID = `local run = string.match(redis.call("INFO", "server"), "run_id:(%x+)")`

/**
 * Grants the first free slot of `resource`: returns `{slot, token, run_id}` or nil.
 *
 * The token is `max(last + 1, now)`, `now` the server's clock in microseconds (see the header): `last + 1` keeps it
 * strictly increasing while the server lives, whatever its clock does; `now` keeps it increasing across a restart
 * that forgot `last` (no persistence, or an AOF or replica missing the latest writes). `last + 1` wins only after
 * the clock stepped back, since grants of one slot are a release apart.
 */
const ACQUIRE = `
${RUN_ID}
local prefix, resource, cap, holder, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
for i = 0, cap - 1 do
  local key = prefix .. ":lease:" .. resource .. ":" .. i
  if redis.call("EXISTS", key) == 0 then
    local fence = prefix .. ":fence:" .. resource .. ":" .. i
    local token = string.format("%d", math.max(tonumber(redis.call("GET", fence) or "0") + 1, now))
    redis.call("SET", fence, token)
    redis.call("SET", key, token .. ":" .. run .. ":" .. holder, "PX", ttl)
    return {i, token, run}
  end
end
return false
`

/**
 * 1 if KEYS[1] holds exactly ARGV[1] (`<token>:<run_id>:<holder>`) and the server is still the one that granted it
 * (run_id ARGV[2]); then the lease is renewed for ARGV[3] ms, or kept when ARGV[3] is "check". A lease from an
 * earlier generation is never renewed: it expires with its TTL unless its holder releases it first.
 */
const RENEW_OR_CHECK = `
${RUN_ID}
if run ~= ARGV[2] or redis.call("GET", KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[3] ~= "check" then redis.call("PEXPIRE", KEYS[1], ARGV[3]) end
return 1
`

/**
 * Compare-and-delete: deletes KEYS[1] only if it holds exactly ARGV[1], whatever the generation (a holder may
 * always give back its own slot, even one a restart left behind with persistence); never a key written by
 * anybody else, even with the same token.
 */
const RELEASE = `
if redis.call("GET", KEYS[1]) ~= ARGV[1] then return 0 end
redis.call("DEL", KEYS[1])
return 1
`

/** Writes KEYS[2] = ARGV[3] only if the lease KEYS[1] holds exactly ARGV[1] and was granted by run_id ARGV[2]. */
const FENCED_SET = `
${RUN_ID}
if run ~= ARGV[2] or redis.call("GET", KEYS[1]) ~= ARGV[1] then return 0 end
redis.call("SET", KEYS[2], ARGV[3])
return 1
`

// ===== Models =====

/**
 * Tunables.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Key prefix (default `agentfly`). */
  readonly prefix?: string
  /** Who holds the leases (default `<pid>`); written next to the token, for operators. */
  readonly holder?: string
  /** Lease TTL: how long a crashed holder's slots stay taken (default 10 s). */
  readonly ttlMillis?: number
  /** Renewal period (default a third of the TTL). */
  readonly heartbeatMillis?: number
  /** How often a waiter polls for a free slot (default 50 ms). */
  readonly pollMillis?: number
}

/**
 * A global lease granted by Redis: the `Resource.GlobalLease` plus what identifies it on the server. Its key holds
 * `<token>:<generation>:<holder>`; `check`, renewal and fenced writes compare the whole value and the generation.
 *
 * @category models
 * @since 0.1.0
 */
export interface RedisLease extends Resource.GlobalLease {
  /**
   * The `run_id` of the redis-server process that granted the lease. A restart (with or without persistence) or a
   * failover to a replica changes it, and the lease is then lost: the holder cannot know which of its writes the
   * server kept, so it starts again from a fresh grant.
   */
  readonly generation: string
  readonly holder: string
}

/**
 * The Redis coordinator: the `Resource.Coordinator` plus fenced access for code that acts on a leased slot.
 *
 * @category models
 * @since 0.1.0
 */
export interface RedisCoordinator extends Resource.Coordinator {
  readonly acquire: (
    options: Parameters<Resource.Coordinator["acquire"]>[0]
  ) => Effect.Effect<RedisLease, Resource.LeaseError, Scope.Scope>
  /**
   * Writes `key` only if `lease` is still the current holder of its slot, granted by the server now running;
   * otherwise `LeaseError(LeaseLost)`.
   */
  readonly fencedSet: (lease: RedisLease, key: string, value: string) => Effect.Effect<void, Resource.LeaseError>
  readonly get: (key: string) => Effect.Effect<string | null, Resource.LeaseError>
  /** The key of a slot's lease. */
  readonly leaseKey: (resource: string, slot: number) => string
}

// ===== Constructors =====

const unavailable = (resource: string, cause: unknown) =>
  new Resource.LeaseError({
    resource,
    reason: new Resource.CoordinatorUnavailable({ message: cause instanceof Error ? cause.message : String(cause) })
  })

/** What the lease key holds while `lease` is current. */
const leaseValue = (lease: RedisLease) => `${lease.token}:${lease.generation}:${lease.holder}`

/**
 * A coordinator's settings and client: the state that its operations below share (nothing in it changes).
 */
interface State {
  readonly redis: IORedis
  readonly prefix: string
  readonly holder: string
  /** Lease TTL in ms. */
  readonly ttl: number
  /** Renewal period in ms. */
  readonly heartbeat: number
  /** Poll period in ms while waiting for a free slot. */
  readonly poll: number
}

const makeState = (redis: IORedis, options: Options): State => {
  const ttl = options.ttlMillis ?? 10_000
  return {
    redis,
    prefix: options.prefix ?? "agentfly",
    holder: options.holder ?? String(process.pid),
    ttl,
    heartbeat: options.heartbeatMillis ?? Math.max(1, Math.floor(ttl / 3)),
    poll: options.pollMillis ?? 50
  }
}

const leaseKeyOf = (state: State, resource: string, slot: number) => `${state.prefix}:lease:${resource}:${slot}`

/** Runs one Redis command; a failure (lost connection, timeout) is `LeaseError(CoordinatorUnavailable)`. */
const call = <A>(resource: string, f: () => Promise<unknown>) =>
  Effect.tryPromise({ try: () => f() as Promise<A>, catch: (e) => unavailable(resource, e) })

const tryAcquire = (state: State, resource: string, cap: number) =>
  call<[number, string, string] | null>(
    resource,
    () => state.redis.eval(ACQUIRE, 0, state.prefix, resource, cap, state.holder, state.ttl)
  )

/** True while the lease is current: renewed for `ttl` ms, or only checked. */
const renewOrCheck = (state: State, lease: RedisLease, what: "check" | number) =>
  Effect.map(
    call<number>(lease.resource, () => {
      const leased = leaseKeyOf(state, lease.resource, lease.slot)
      return state.redis.eval(RENEW_OR_CHECK, 1, leased, leaseValue(lease), lease.generation, what)
    }),
    (n) => n === 1
  )

const release = (state: State, lease: RedisLease) =>
  call<number>(
    lease.resource,
    () => state.redis.eval(RELEASE, 1, leaseKeyOf(state, lease.resource, lease.slot), leaseValue(lease))
  )

const lost = (lease: Resource.GlobalLease) =>
  new Resource.LeaseError({
    resource: lease.resource,
    reason: new Resource.LeaseLost({ slot: lease.slot, token: lease.token })
  })

const makeLease = (state: State, resource: string, [slot, token, generation]: [number, string, string]) => {
  const lease: RedisLease = {
    resource,
    slot,
    token: Number(token),
    generation,
    holder: state.holder,
    check: Effect.suspend(() =>
      Effect.flatMap(renewOrCheck(state, lease, "check"), (current) => current ? Effect.void : Effect.fail(lost(lease)))
    )
  }
  return lease
}

/** Renews until the lease is found lost (then `onLost`), or renewal has failed for a whole TTL. */
const keepAlive = (state: State, lease: RedisLease, onLost: (lease: Resource.GlobalLease) => Effect.Effect<void>) =>
  Effect.gen(function*() {
    let lastRenewed = yield* Clock.currentTimeMillis
    while (true) {
      yield* Effect.sleep(state.heartbeat)
      const exit = yield* Effect.exit(renewOrCheck(state, lease, state.ttl))
      const now = yield* Clock.currentTimeMillis
      if (Exit.isSuccess(exit) && exit.value) {
        lastRenewed = now
        continue
      }
      // Taken, expired or from an earlier generation, or unreachable past the TTL: another holder may have the
      // slot now.
      if (Exit.isSuccess(exit) || now - lastRenewed >= state.ttl) return yield* onLost(lease)
    }
  })

/** Polls for a free slot until one is granted, or `LeaseError(LeaseTimeout)` after `waitMillis`. */
const waitForSlot = (state: State, resource: string, cap: number, waitMillis: number) =>
  tryAcquire(state, resource, cap).pipe(
    Effect.repeat({ schedule: Schedule.spaced(state.poll), until: (r) => r !== null }),
    Effect.timeoutOrElse({
      duration: waitMillis,
      orElse: () =>
        Effect.fail(
          new Resource.LeaseError({
            resource,
            reason: new Resource.LeaseTimeout({ waitedMillis: waitMillis })
          })
        )
    })
  )

/**
 * Waits for a grant and registers its release in the scope; uninterruptible once granted, so a grant is never left
 * without its release.
 */
const grant = (state: State, resource: string, cap: number, waitMillis: number) =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function*() {
      const slot = yield* restore(waitForSlot(state, resource, cap, waitMillis))
      const lease = makeLease(state, resource, slot!)
      yield* Effect.addFinalizer(() => Effect.ignore(release(state, lease)))
      // Past 2^53 µs (the year 2255, or a wildly wrong server clock) a token loses precision as a JS number.
      if (!Number.isSafeInteger(lease.token)) {
        return yield* Effect.fail(unavailable(resource, `fencing token ${slot![1]} exceeds 2^53`))
      }
      return lease
    })
  )

const acquire = (
  state: State,
  { cap, onLost, resource, waitMillis }: Parameters<RedisCoordinator["acquire"]>[0]
) =>
  Effect.gen(function*() {
    const started = yield* Clock.currentTimeMillis
    const granted = yield* grant(state, resource, cap, waitMillis)
    const fiber = yield* Effect.forkScoped(keepAlive(state, granted, onLost))
    yield* Effect.addFinalizer(() => Fiber.interrupt(fiber))
    yield* Effect.annotateCurrentSpan({ waitedMillis: (yield* Clock.currentTimeMillis) - started })
    return granted
  })

const fencedSet = (state: State, lease: RedisLease, key: string, value: string) =>
  Effect.flatMap(
    call<number>(
      lease.resource,
      () => {
        const leased = leaseKeyOf(state, lease.resource, lease.slot)
        return state.redis.eval(FENCED_SET, 2, leased, key, leaseValue(lease), lease.generation, value)
      }
    ),
    (n) => (n === 1 ? Effect.void : Effect.fail(lost(lease)))
  )

/**
 * A coordinator over an ioredis client (not closed by it).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (redis: IORedis, options: Options = {}): RedisCoordinator => {
  const state = makeState(redis, options)
  return {
    acquire: (request) => acquire(state, request),
    fencedSet: (lease, key, value) => fencedSet(state, lease, key, value),
    get: (key) => call<string | null>("redis", () => redis.get(key)),
    leaseKey: (resource, slot) => leaseKeyOf(state, resource, slot)
  }
}

/**
 * ioredis options that fail fast on a lost connection (typed, retryable errors) instead of queueing commands.
 *
 * @category constructors
 * @since 0.1.0
 */
export const failFastOptions = {
  lazyConnect: true,
  enableOfflineQueue: false,
  maxRetriesPerRequest: 1,
  commandTimeout: 2_000,
  // Keep reconnecting in the background: a recovered server is used again without a restart.
  retryStrategy: (times: number) => Math.min(times * 100, 2_000)
} satisfies RedisOptions

/**
 * A connected client for `url` (e.g. `redis://127.0.0.1:6390`), closed with the scope. Fails with
 * `LeaseError(CoordinatorUnavailable)` if the server cannot be reached.
 *
 * @category constructors
 * @since 0.1.0
 */
export const connect = (url: string): Effect.Effect<IORedis, Resource.LeaseError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => {
        const redis = new IORedis(url, failFastOptions)
        redis.on("error", (_: unknown) => undefined) // surfaced per command as typed errors
        return redis.connect().then(() => redis, (e) => (redis.disconnect(), Promise.reject(e)))
      },
      catch: (e) => unavailable("redis", e)
    }),
    (redis) => Effect.sync(() => redis.disconnect())
  )

/**
 * The Redis coordinator service.
 *
 * @category services
 * @since 0.1.0
 */
export class Coordinator extends Context.Service<Coordinator, RedisCoordinator>()(
  "agentfly/actors/resources/RedisCoordinator"
) {}

/**
 * Provides both `Coordinator` (this module's, with fenced access) and `Resource.ResourceCoordinator` (what
 * `ResourceManager.layerCoordinated` needs), over one connection to `url`.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (
  url: string,
  options?: Options
): Layer.Layer<Coordinator | Resource.ResourceCoordinator, Resource.LeaseError> =>
  Layer.effectContext(
    Effect.map(connect(url), (redis) => {
      const coordinator = make(redis, options)
      return Context.make(Coordinator, coordinator).pipe(Context.add(Resource.ResourceCoordinator, coordinator))
    })
  )
