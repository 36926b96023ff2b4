/**
 * Global caps and leases on Redis (ioredis), shared by several processes or machines: the `Resource.Coordinator`
 * behind `ResourceManager.layerCoordinated`.
 *
 * A resource with cap `n` has `n` slots. A lease on slot `i` is the key `<prefix>:lease:<resource>:<i>`, holding
 * `<token>:<holder>` with a TTL; the holder renews it by heartbeat while its scope is open and deletes it when
 * the scope closes. The **fencing token** comes from `INCR <prefix>:fence:<resource>:<i>`, so it grows with every
 * grant of the slot: a crashed worker's lease expires after the TTL and the next holder gets a greater token, and
 * anything guarded by the token (here {@link fencedSet}, a Lua script that compares tokens atomically) refuses
 * the stale holder. Acquire, renew, release and fenced writes are Lua scripts, atomic on the server.
 *
 * A lost connection gives `LeaseError(CoordinatorUnavailable)`, retryable; clients made by {@link layer} fail fast
 * (no offline queue, a command timeout) instead of hanging.
 *
 * **Gotchas**
 *
 * The scripts build key names from their arguments, so every key of one resource must live on one Redis node
 * (true for a single server or a replicated primary; use one hash tag per resource on a cluster).
 *
 * @since 0.1.0
 */
import { Clock, Context, Effect, Exit, Fiber, Layer, Schedule, Scope } from "effect"
import { Redis as IORedis } from "ioredis"
import type { RedisOptions } from "ioredis"
import * as Resource from "../../src/Resource.ts"

// ===== Scripts =====

const ACQUIRE = `
local prefix, resource, cap, holder, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
for i = 0, cap - 1 do
  local key = prefix .. ":lease:" .. resource .. ":" .. i
  if redis.call("EXISTS", key) == 0 then
    local token = redis.call("INCR", prefix .. ":fence:" .. resource .. ":" .. i)
    redis.call("SET", key, token .. ":" .. holder, "PX", ttl)
    return {i, token}
  end
end
return false
`

/** 1 if KEYS[1] still holds token ARGV[1] (then renewed for ARGV[2] ms, or deleted when ARGV[2] is "release"). */
const RENEW_OR_RELEASE = `
local value = redis.call("GET", KEYS[1])
if not value then return 0 end
local token = string.match(value, "^(%d+):")
if token ~= ARGV[1] then return 0 end
if ARGV[2] == "release" then redis.call("DEL", KEYS[1]) else redis.call("PEXPIRE", KEYS[1], ARGV[2]) end
return 1
`

/** Writes KEYS[2] = ARGV[2] only if the lease KEYS[1] is held with token ARGV[1]. */
const FENCED_SET = `
local value = redis.call("GET", KEYS[1])
if not value or string.match(value, "^(%d+):") ~= ARGV[1] then return 0 end
redis.call("SET", KEYS[2], ARGV[2])
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
 * The Redis coordinator: the `Resource.Coordinator` plus fenced access for code that acts on a leased slot.
 *
 * @category models
 * @since 0.1.0
 */
export interface RedisCoordinator extends Resource.Coordinator {
  /** Writes `key` only if `lease` is still the current holder of its slot; otherwise `LeaseError(LeaseLost)`. */
  readonly fencedSet: (
    lease: Resource.GlobalLease,
    key: string,
    value: string
  ) => Effect.Effect<void, Resource.LeaseError>
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

/**
 * A coordinator over an ioredis client (not closed by it).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (redis: IORedis, options: Options = {}): RedisCoordinator => {
  const prefix = options.prefix ?? "agentfly"
  const holder = options.holder ?? String(process.pid)
  const ttl = options.ttlMillis ?? 10_000
  const heartbeat = options.heartbeatMillis ?? Math.max(1, Math.floor(ttl / 3))
  const poll = options.pollMillis ?? 50
  const leaseKey = (resource: string, slot: number) => `${prefix}:lease:${resource}:${slot}`

  const call = <A>(resource: string, f: () => Promise<unknown>) =>
    Effect.tryPromise({ try: () => f() as Promise<A>, catch: (e) => unavailable(resource, e) })

  const tryAcquire = (resource: string, cap: number) =>
    call<[number, number] | null>(resource, () => redis.eval(ACQUIRE, 0, prefix, resource, cap, holder, ttl))

  const renewOrRelease = (lease: Resource.GlobalLease, what: "release" | number) =>
    Effect.map(
      call<number>(
        lease.resource,
        () => redis.eval(RENEW_OR_RELEASE, 1, leaseKey(lease.resource, lease.slot), lease.token, what)
      ),
      (n) => n === 1
    )

  const lost = (lease: Resource.GlobalLease) =>
    new Resource.LeaseError({
      resource: lease.resource,
      reason: new Resource.LeaseLost({ slot: lease.slot, token: lease.token })
    })

  const makeLease = (resource: string, slot: number, token: number): Resource.GlobalLease => {
    const lease: Resource.GlobalLease = {
      resource,
      slot,
      token,
      check: Effect.suspend(() =>
        Effect.flatMap(
          call<string | null>(resource, () => redis.get(leaseKey(resource, slot))),
          (value) => value !== null && value.startsWith(`${token}:`) ? Effect.void : Effect.fail(lost(lease))
        )
      )
    }
    return lease
  }

  /** Renews until the lease is found taken (then `onLost`), or renewal has failed for a whole TTL. */
  const keepAlive = (lease: Resource.GlobalLease, onLost: (lease: Resource.GlobalLease) => Effect.Effect<void>) =>
    Effect.gen(function*() {
      let lastRenewed = yield* Clock.currentTimeMillis
      while (true) {
        yield* Effect.sleep(heartbeat)
        const exit = yield* Effect.exit(renewOrRelease(lease, ttl))
        const now = yield* Clock.currentTimeMillis
        if (Exit.isSuccess(exit) && exit.value) {
          lastRenewed = now
          continue
        }
        // Taken by someone else, or unreachable past the TTL: either way another holder may have the slot now.
        if (Exit.isSuccess(exit) || now - lastRenewed >= ttl) return yield* onLost(lease)
      }
    })

  const acquire: Resource.Coordinator["acquire"] = ({ cap, onLost, resource, waitMillis }) =>
    Effect.gen(function*() {
      const started = yield* Clock.currentTimeMillis
      const granted = yield* Effect.uninterruptibleMask((restore) =>
        Effect.gen(function*() {
          const slot = yield* restore(
            tryAcquire(resource, cap).pipe(
              Effect.repeat({ schedule: Schedule.spaced(poll), until: (r) => r !== null }),
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
          )
          const lease = makeLease(resource, slot![0], Number(slot![1]))
          yield* Effect.addFinalizer(() => Effect.ignore(renewOrRelease(lease, "release")))
          return lease
        })
      )
      const fiber = yield* Effect.forkScoped(keepAlive(granted, onLost))
      yield* Effect.addFinalizer(() => Fiber.interrupt(fiber))
      yield* Effect.annotateCurrentSpan({ waitedMillis: (yield* Clock.currentTimeMillis) - started })
      return granted
    })

  return {
    acquire,
    fencedSet: (lease, key, value) =>
      Effect.flatMap(
        call<number>(
          lease.resource,
          () => redis.eval(FENCED_SET, 2, leaseKey(lease.resource, lease.slot), key, lease.token, value)
        ),
        (n) => (n === 1 ? Effect.void : Effect.fail(lost(lease)))
      ),
    get: (key) => call<string | null>("redis", () => redis.get(key)),
    leaseKey
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
