/**
 * A coordinated resource manager (a global cap through Redis) across a redis-server SIGKILL and restart, with and
 * without persistence, and across a lost connection (a partition, cut by a TCP proxy between the manager and a
 * server that keeps running). The invariant under test: two holders never act on one slot, and a holder that
 * lost its global lease acts again only under a new, greater fencing token. Real servers and real time throughout:
 * heartbeats, TTLs and reconnects are the subject.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Schedule, Scope } from "effect"
import { createServer, connect as tcpConnect } from "node:net"
import type { Socket } from "node:net"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as Redis from "../../actors/resources/Redis.ts"
import { EnvError } from "../../src/Environment.ts"
import * as Resource from "../../src/Resource.ts"
import { redisServer, redisServerWith } from "../utils/redisServer.ts"

/**
 * Instances are names, unique across the managers sharing the launcher (each manager numbers its instances from 0);
 * the log says what ran when (`start`, `destroy`, the steps' lines, and the test's own).
 */
const makeBackend = () => {
  const log: Array<string> = []
  const alive = new Set<string>()
  let serial = 0
  const launcher: Resource.Launcher<string> = {
    start: (_spec, instanceId) =>
      Effect.gen(function*() {
        const id = `${instanceId}#${serial++}`
        log.push(`start ${id}`)
        alive.add(id)
        yield* Effect.addFinalizer(() => Effect.sync(() => (alive.delete(id), log.push(`destroy ${id}`))))
        return id
      }),
    reset: () => Effect.void,
    health: () => Effect.void
  }
  return { log, alive, launcher }
}

const licensed = (launcher: Resource.Launcher<string>, options: { acquireMillis: number; globalMax?: number }) =>
  Resource.resource(
    Resource.makeUnsafe({
      name: "licensed",
      kind: "in-process",
      pool: { max: 4, globalMax: options.globalMax ?? 1 },
      timeouts: { acquireMillis: options.acquireMillis }
    }),
    launcher
  )

const chain = (chainId: string): Resource.Owner => ({ chainId, groupId: "g" })

/** One "process": its own connection (to `url`), coordinator and manager. */
const process_ = (url: string, holder: string, options: Redis.Options) =>
  Effect.gen(function*() {
    const coordinator = Redis.make(yield* Redis.connect(url), { ...options, holder })
    const manager = yield* ResourceManager.make({ coordinator })
    return { coordinator, manager }
  })

/** Waits until the coordinator's client has reconnected (ioredis retries in the background). */
const reconnected = (coordinator: Redis.RedisCoordinator) =>
  Effect.retry(coordinator.get("ping"), { schedule: Schedule.spaced("50 millis"), times: 200 })

/** A step on the lease that logs which instance ran it; returns the instance. */
const step = (lease: ResourceManager.Lease<string>, log: Array<string>, who: string) =>
  lease.use((id) => Effect.sync(() => (log.push(`${who} ran on ${id}`), id)))

/** The lease keys of `resource` on the server, with what they hold. */
const leaseKeys = (url: string) =>
  Effect.gen(function*() {
    const redis = yield* Redis.connect(url)
    const keys = (yield* Effect.promise(() => redis.keys("agentfly:lease:licensed:*"))).sort()
    return yield* Effect.forEach(keys, (key) => Effect.promise(() => redis.get(key)))
  })

const failsWithLease = <A, E>(effect: Effect.Effect<A, E>, tag: Resource.LeaseErrorReason["_tag"]) =>
  Effect.match(effect, {
    onFailure: (error) => {
      assert.instanceOf(error, Resource.LeaseError, String(error))
      assert.strictEqual((error as Resource.LeaseError).reason._tag, tag, String(error))
    },
    onSuccess: (value) => assert.fail(`succeeded with ${String(value)}; expected LeaseError(${tag})`)
  })

/**
 * A TCP proxy to a server on `port`: `cut` drops every connection and refuses new ones (the server keeps running,
 * as in a network partition), `heal` lets connections through again.
 */
const tcpProxy = (port: number) =>
  Effect.acquireRelease(
    Effect.callback<{ port: number; cut: Effect.Effect<void>; heal: Effect.Effect<void>; close: () => void }>(
      (resume) => {
        const sockets = new Set<Socket>()
        let cut = false
        const server = createServer((client) => {
          if (cut) return void client.destroy()
          const upstream = tcpConnect(port, "127.0.0.1")
          const drop = () => {
            client.destroy()
            upstream.destroy()
            sockets.delete(client)
            sockets.delete(upstream)
          }
          sockets.add(client)
          sockets.add(upstream)
          client.on("error", drop).on("close", drop)
          upstream.on("error", drop).on("close", drop)
          client.pipe(upstream)
          upstream.pipe(client)
        })
        const dropAll = () => {
          for (const socket of sockets) socket.destroy()
          sockets.clear()
        }
        server.listen(0, "127.0.0.1", () => {
          const address = server.address()
          resume(Effect.succeed({
            port: typeof address === "object" && address !== null ? address.port : 0,
            cut: Effect.sync(() => {
              cut = true
              dropAll()
            }),
            heal: Effect.sync(() => void (cut = false)),
            close: () => {
              dropAll()
              server.close()
            }
          }))
        })
      }
    ),
    (proxy) => Effect.sync(() => proxy.close())
  )

describe("a coordinated ResourceManager across a Redis restart", () => {
  it.live("no persistence: the holder's next step runs on a new instance with a greater token; it keeps the slot", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const options = { ttlMillis: 3_000, heartbeatMillis: 100, pollMillis: 20 }
      const a = yield* process_(server.url, "a", options)
      const b = yield* process_(server.url, "b", options)
      const { launcher, log, alive } = makeBackend()
      const resource = licensed(launcher, { acquireMillis: 5_000 })
      const lease = yield* a.manager.acquire(resource, chain("a"))
      const before = (yield* lease.fencingToken)!
      const first = yield* step(lease, log, "a")

      yield* server.kill
      yield* server.start // empty: the lease key is gone, so the slot looks free
      yield* Effect.forEach([a.coordinator, b.coordinator], reconnected)

      // The holder learns that its instance is gone (Crashed, once); the retried step runs on a replacement that was
      // handed over only after a new global lease was granted.
      const second = yield* ResourceManager.withRetryOnCrash(step(lease, log, "a"))
      assert.notStrictEqual(second, first)
      assert.isFalse(alive.has(first), "the instance that ran under the lost lease was destroyed")
      const after = (yield* lease.fencingToken)!
      assert.isAbove(after, before, "the replacement holds a new lease with a greater token")
      assert.deepStrictEqual((yield* leaseKeys(server.url)).map((v) => Number(v!.split(":")[0])), [after])

      // So the only slot is taken: a second manager waits and times out.
      yield* failsWithLease(Effect.scoped(b.manager.acquire(resource, chain("b"))), "LeaseTimeout")
      assert.strictEqual(yield* step(lease, log, "a"), second, "and the holder keeps working")
    }), { timeout: 300_000 })

  it.live("no persistence, a second manager takes the slot first: the holder runs nothing until it is given back", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      // A slow heartbeat: the first holder cannot have noticed the restart when the second manager is granted.
      const options = { ttlMillis: 60_000, pollMillis: 20 }
      const a = yield* process_(server.url, "a", options)
      const b = yield* process_(server.url, "b", options)
      const { launcher, log } = makeBackend()
      const resource = licensed(launcher, { acquireMillis: 20_000 })
      const lease = yield* a.manager.acquire(resource, chain("a"))
      const before = (yield* lease.fencingToken)!
      yield* step(lease, log, "a")

      yield* server.kill
      yield* server.start
      yield* Effect.forEach([a.coordinator, b.coordinator], reconnected)
      const scopeB = yield* Scope.make()
      const leaseB = yield* b.manager.acquire(resource, chain("b")).pipe(Scope.provide(scopeB))
      const tokenB = (yield* leaseB.fencingToken)!
      assert.isAbove(tokenB, before)
      yield* step(leaseB, log, "b")

      // The first holder's step must not run while the second holds the slot...
      const stepA = yield* Effect.forkChild(ResourceManager.withRetryOnCrash(step(lease, log, "a")))
      yield* Effect.sleep("1500 millis")
      yield* step(leaseB, log, "b")
      log.push("b released")
      yield* Scope.close(scopeB, Exit.void)
      // ...and runs once the slot is back, under a token greater than the second holder's.
      yield* Fiber.join(stepA)
      const ran = log.filter((line) => line.startsWith("a ran") || line.startsWith("b ran") || line === "b released")
      assert.deepStrictEqual(
        ran.map((line) => line.split(" on ")[0]),
        ["a ran", "b ran", "b ran", "b released", "a ran"]
      )
      assert.isAbove((yield* lease.fencingToken)!, tokenB)
    }), { timeout: 300_000 })

  it.live("no persistence, the slot is not given back in time: the holder's lease fails with LeaseLost, for good", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const options = { ttlMillis: 60_000, pollMillis: 20 }
      const a = yield* process_(server.url, "a", options)
      const b = yield* process_(server.url, "b", options)
      const { launcher, log, alive } = makeBackend()
      const resource = licensed(launcher, { acquireMillis: 1_000 })
      const lease = yield* a.manager.acquire(resource, chain("a"))
      const before = (yield* lease.fencingToken)!
      yield* step(lease, log, "a")

      yield* server.kill
      yield* server.start
      yield* Effect.forEach([a.coordinator, b.coordinator], reconnected)
      const scopeB = yield* Scope.make()
      const leaseB = yield* b.manager.acquire(resource, chain("b")).pipe(Scope.provide(scopeB))
      yield* step(leaseB, log, "b")

      // Told once that its instance is gone; the retried step waits for a new lease, and fails when none comes.
      const crash = yield* Effect.flip(step(lease, log, "a"))
      assert.instanceOf(crash, EnvError, String(crash))
      assert.isTrue(Resource.isCrash(crash))
      const error = yield* Effect.flip(step(lease, log, "a"))
      assert.instanceOf(error, Resource.LeaseError, String(error))
      assert.deepStrictEqual((error as Resource.LeaseError).reason, new Resource.LeaseLost({ slot: 0, token: before }))
      for (let i = 0; i < 3; i++) yield* failsWithLease(step(lease, log, "a"), "LeaseLost")
      assert.isUndefined(yield* lease.fencingToken, "no token: the holder has no lease")
      assert.strictEqual(log.filter((line) => line.startsWith("a ran")).length, 1, "only the step before the restart")
      const stats = (yield* a.manager.stats("licensed"))!
      assert.strictEqual(stats.leased + stats.starting + stats.idle, 0, "the first process keeps no instance")
      assert.strictEqual(alive.size, 1, "only the second holder's instance runs")

      // Once the slot is free, the chain's next lease is granted with a greater token.
      yield* Scope.close(scopeB, Exit.void)
      const again = yield* Effect.scoped(
        Effect.flatMap(a.manager.acquire(resource, chain("a2")), (l) => l.fencingToken)
      )
      assert.isAbove(again!, (yield* leaseB.fencingToken)!)
    }), { timeout: 300_000 })

  it.live("AOF: the lease key survives from the old server; the holder gives it back and takes a new token", () =>
    Effect.gen(function*() {
      const server = yield* redisServerWith({ appendonly: true, appendfsync: "always" })
      const options = { ttlMillis: 10_000, heartbeatMillis: 100, pollMillis: 20 }
      const a = yield* process_(server.url, "a", options)
      const b = yield* process_(server.url, "b", options)
      const { launcher, log } = makeBackend()
      const resource = licensed(launcher, { acquireMillis: 5_000 })
      const lease = yield* a.manager.acquire(resource, chain("a"))
      const before = (yield* lease.fencingToken)!
      const first = yield* step(lease, log, "a")
      const stored = yield* leaseKeys(server.url)

      yield* server.kill
      yield* server.start
      yield* Effect.forEach([a.coordinator, b.coordinator], reconnected)
      const second = yield* ResourceManager.withRetryOnCrash(step(lease, log, "a"))
      assert.notStrictEqual(second, first)
      const after = (yield* lease.fencingToken)!
      assert.isAbove(after, before)
      const now = yield* leaseKeys(server.url)
      assert.strictEqual(now.length, 1)
      assert.notDeepEqual(now, stored, "the old grant was released, the new one holds the slot")
      assert.strictEqual(Number(now[0]!.split(":")[0]), after)
      yield* failsWithLease(Effect.scoped(b.manager.acquire(resource, chain("b"))), "LeaseTimeout")
    }), { timeout: 300_000 })
})

describe("a coordinated ResourceManager across a lost connection", () => {
  it.live("shorter than the TTL: typed, retryable errors while cut, then the same instance and token", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const proxy = yield* tcpProxy(server.port)
      // The cut (two acquires that wait out their 6 s, and the rest) stays well inside the TTL.
      const options = { ttlMillis: 40_000, heartbeatMillis: 200, pollMillis: 20 }
      const a = yield* process_(`redis://127.0.0.1:${proxy.port}`, "a", options)
      const b = yield* process_(server.url, "b", options)
      const { launcher, log } = makeBackend()
      // 6 s: an acquire that must succeed took past 0.8 s once while CI ran every test file at once, and past 3 s
      // once more (2026-12-03, a CI run beside other jobs).
      const resource = licensed(launcher, { acquireMillis: 6_000, globalMax: 2 })
      const lease = yield* a.manager.acquire(resource, chain("a"))
      const token = (yield* lease.fencingToken)!
      const first = yield* step(lease, log, "a")

      yield* proxy.cut
      const down = yield* Effect.flip(step(lease, log, "a"))
      assert.instanceOf(down, Resource.LeaseError, String(down))
      assert.strictEqual((down as Resource.LeaseError).reason._tag, "CoordinatorUnavailable")
      assert.isTrue((down as Resource.LeaseError).isRetryable)
      // A new chain's acquire fails with a typed error within its wait, and leaves nothing behind.
      yield* failsWithLease(Effect.scoped(a.manager.acquire(resource, chain("a2"))), "CoordinatorUnavailable")
      const cutStats = (yield* a.manager.stats("licensed"))!
      assert.deepStrictEqual([cutStats.leased, cutStats.starting, cutStats.waiters], [1, 0, 0])
      // The other process can take the second slot, not the first: the cut holder's key is still alive.
      const scopeB = yield* Scope.make()
      yield* b.manager.acquire(resource, chain("b")).pipe(Scope.provide(scopeB))
      yield* failsWithLease(Effect.scoped(b.manager.acquire(resource, chain("b2"))), "LeaseTimeout")
      yield* Scope.close(scopeB, Exit.void)

      yield* proxy.heal
      yield* reconnected(a.coordinator)
      assert.strictEqual(yield* step(lease, log, "a"), first, "the same instance")
      assert.strictEqual(yield* lease.fencingToken, token, "under the same lease")
      assert.strictEqual((yield* a.manager.stats("licensed"))!.crashes, 0)
      const other = yield* Effect.scoped(
        Effect.flatMap(a.manager.acquire(resource, chain("a2")), (l) => step(l, log, "a2"))
      )
      assert.notStrictEqual(other, first, "and the pool serves new chains again")
    }), { timeout: 300_000 })

  it.live("longer than the TTL: the instance is given up; once reconnected the holder resumes under a new token", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const proxy = yield* tcpProxy(server.port)
      const options = { ttlMillis: 1_000, heartbeatMillis: 200, pollMillis: 20 }
      const a = yield* process_(`redis://127.0.0.1:${proxy.port}`, "a", options)
      const { launcher, log, alive } = makeBackend()
      const resource = licensed(launcher, { acquireMillis: 15_000 })
      const lease = yield* a.manager.acquire(resource, chain("a"))
      const token = (yield* lease.fencingToken)!
      const first = yield* step(lease, log, "a")

      yield* proxy.cut
      // Past the TTL the lease may be anybody's: the holder stops its instance without waiting for its next step.
      yield* Effect.retry(
        Effect.suspend(() => (alive.has(first) ? Effect.fail("still running") : Effect.void)),
        { schedule: Schedule.spaced("50 millis"), times: 200 }
      )
      assert.deepStrictEqual(yield* leaseKeys(server.url), [], "the old lease expired on the server")
      yield* proxy.heal
      const second = yield* ResourceManager.withRetryOnCrash(step(lease, log, "a"))
      assert.notStrictEqual(second, first)
      assert.isAbove((yield* lease.fencingToken)!, token)
      const stats = (yield* a.manager.stats("licensed"))!
      assert.deepStrictEqual([stats.leased, stats.starting, stats.idle, stats.waiters], [1, 0, 0, 0])
      assert.deepStrictEqual([...alive], [second], "nothing leaked: one instance, one lease")
      assert.strictEqual((yield* leaseKeys(server.url)).length, 1)
    }), { timeout: 300_000 })
})
