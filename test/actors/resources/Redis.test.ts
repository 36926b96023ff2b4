/**
 * Global leases on a real redis-server (spawned per test on a free port): caps across connections, heartbeat,
 * fencing tokens, a SIGKILLed holder process whose slots are reclaimed after the TTL, connection loss, and the
 * resource manager capped across two managers; then redis-server killed and restarted mid-lease without and with
 * persistence (AOF), restarted from persisted state that misses the latest grants, and replaced by a promoted
 * replica. Real time throughout: TTLs, heartbeats and restarts are the subject.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Ref, Schedule, Scope } from "effect"
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as Redis from "../../../actors/resources/Redis.ts"
import * as Resource from "../../../src/Resource.ts"
import { redisServer, redisServerWith } from "../../utils/redisServer.ts"

const holderScript = fileURLToPath(new URL("./fixtures/redisHolder.ts", import.meta.url))

/** Two independent "processes": two connections with their own coordinator. */
const twoCoordinators = (url: string, options: Redis.Options) =>
  Effect.gen(function*() {
    const a = Redis.make(yield* Redis.connect(url), { ...options, holder: "a" })
    const b = Redis.make(yield* Redis.connect(url), { ...options, holder: "b" })
    return [a, b] as const
  })

const noop = () => Effect.void

/** Waits until the coordinator's client has reconnected to a restarted server (ioredis retries in the background). */
const reconnected = (coordinator: Redis.RedisCoordinator) =>
  Effect.retry(coordinator.get("ping"), { schedule: Schedule.spaced("50 millis"), times: 100 })

/** Waits until `ref` (a count of `onLost` calls) is positive. */
const eventuallyLost = (ref: Ref.Ref<number>) =>
  Effect.retry(
    Effect.flatMap(Ref.get(ref), (n) => n > 0 ? Effect.void : Effect.fail("onLost was not called")),
    { schedule: Schedule.spaced("20 millis"), times: 150 }
  )

const countLost = (ref: Ref.Ref<number>) => () => Ref.update(ref, (n) => n + 1)

/** Fails the test unless `effect` fails with a `LeaseError` of reason `tag`. */
const failsWith = <A>(effect: Effect.Effect<A, Resource.LeaseError>, tag: Resource.LeaseErrorReason["_tag"]) =>
  Effect.match(effect, {
    onFailure: (error) => assert.strictEqual(error.reason._tag, tag, error.message),
    onSuccess: () => assert.fail(`succeeded; expected LeaseError(${tag})`)
  })

describe("Redis leases", () => {
  it.live("a cap is shared across connections; a waiter times out, then gets a released slot with a new token", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const [a, b] = yield* twoCoordinators(server.url, { ttlMillis: 5_000 })
      const scopeA = yield* Scope.make()
      const first = yield* a.acquire({ resource: "py", cap: 2, waitMillis: 100, onLost: noop }).pipe(
        Scope.provide(scopeA)
      )
      yield* a.acquire({ resource: "py", cap: 2, waitMillis: 100, onLost: noop })
      const timedOut = yield* Effect.flip(
        Effect.scoped(b.acquire({ resource: "py", cap: 2, waitMillis: 300, onLost: noop }))
      )
      assert.strictEqual(timedOut.reason._tag, "LeaseTimeout")
      yield* Scope.close(scopeA, Exit.void)
      const next = yield* b.acquire({ resource: "py", cap: 2, waitMillis: 1_000, onLost: noop })
      assert.strictEqual(next.slot, first.slot)
      assert.isAbove(next.token, first.token, "fencing tokens grow with each grant of a slot")
    }))

  it.live("the heartbeat keeps a lease past its TTL; a stale holder is fenced off once the lease is reassigned", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const [a, b] = yield* twoCoordinators(server.url, { ttlMillis: 400, heartbeatMillis: 100, pollMillis: 20 })
      const lostA = yield* Ref.make(0)
      const leaseA = yield* a.acquire({
        resource: "env",
        cap: 1,
        waitMillis: 100,
        onLost: () => Ref.update(lostA, (n) => n + 1)
      })
      // Three TTLs later the heartbeat still holds it.
      const blocked = yield* Effect.flip(
        Effect.scoped(b.acquire({ resource: "env", cap: 1, waitMillis: 1_200, onLost: noop }))
      )
      assert.strictEqual(blocked.reason._tag, "LeaseTimeout")
      yield* a.fencedSet(leaseA, "env:state", "written by a")

      // Simulate a paused holder: its lease key vanishes (as after a TTL with no heartbeat) and b takes the slot.
      const redis = yield* Redis.connect(server.url)
      yield* Effect.promise(() => redis.del(a.leaseKey("env", leaseA.slot)))
      const leaseB = yield* b.acquire({ resource: "env", cap: 1, waitMillis: 1_000, onLost: noop })
      assert.isAbove(leaseB.token, leaseA.token)

      const stale = yield* Effect.flip(a.fencedSet(leaseA, "env:state", "written by stale a"))
      assert.strictEqual(stale.reason._tag, "LeaseLost")
      assert.strictEqual((yield* Effect.flip(leaseA.check)).reason._tag, "LeaseLost")
      yield* b.fencedSet(leaseB, "env:state", "written by b")
      assert.strictEqual(yield* a.get("env:state"), "written by b")
      yield* Effect.sleep("300 millis")
      assert.strictEqual(yield* Ref.get(lostA), 1, "a's heartbeat found the lease taken and reported it")
    }))

  it.live("SIGKILL of a lease holder: another process acquires after the TTL; the dead holder's tokens are stale", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const ttl = 1_500
      // `node --import tsx`, not the tsx CLI: the CLI runs the script in a child, which SIGKILL would not reach.
      const child = spawn(process.execPath, ["--import", "tsx", holderScript, server.url, "gpu", "2", String(ttl)], {
        stdio: ["ignore", "pipe", "pipe"]
      })
      yield* Effect.addFinalizer(() => Effect.sync(() => child.kill("SIGKILL")))
      const line = yield* Effect.callback<string, Error>((resume) => {
        let out = ""
        child.stdout.on("data", (d: Buffer) => {
          out += d.toString()
          if (out.includes("\n")) resume(Effect.succeed(out.split("\n")[0]!))
        })
        child.on("exit", (code) => resume(Effect.fail(new Error(`holder exited ${code}`))))
      }).pipe(Effect.timeout("60 seconds"))
      const held = JSON.parse(line) as Array<{ slot: number; token: number }>
      assert.strictEqual(held.length, 2)

      const [b] = yield* twoCoordinators(server.url, { ttlMillis: ttl, pollMillis: 50 })
      // While the holder lives (heartbeat), its slots stay taken for well over a TTL.
      yield* Effect.sleep(ttl + 500)
      const blocked = yield* Effect.flip(
        Effect.scoped(b.acquire({ resource: "gpu", cap: 2, waitMillis: 200, onLost: noop }))
      )
      assert.strictEqual(blocked.reason._tag, "LeaseTimeout")

      child.kill("SIGKILL")
      const killedAt = Date.now()
      const leases = yield* Effect.forEach(
        [0, 1],
        () => b.acquire({ resource: "gpu", cap: 2, waitMillis: ttl * 20, onLost: noop })
      )
      const waited = Date.now() - killedAt
      // A bound that load cannot reach: the lease was reclaimed when its TTL ran out, not never.
      assert.isAtMost(waited, ttl * 20, "reclaimed once the TTL ran out")
      assert.deepStrictEqual(leases.map((l) => l.slot).sort(), [0, 1])
      for (const lease of leases) {
        const old = held.find((h) => h.slot === lease.slot)!
        assert.isAbove(lease.token, old.token)
        const stale: Redis.RedisLease = { ...lease, token: old.token }
        const refused = yield* Effect.flip(b.fencedSet(stale, "gpu:owner", "dead holder"))
        assert.strictEqual(refused.reason._tag, "LeaseLost")
      }
    }), { timeout: 300_000 })

  it.live("a lost connection gives a typed, retryable CoordinatorUnavailable", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const coordinator = Redis.make(yield* Redis.connect(server.url), { ttlMillis: 1_000 })
      yield* server.kill
      yield* Effect.sleep("100 millis")
      const error = yield* Effect.flip(
        Effect.scoped(coordinator.acquire({ resource: "x", cap: 1, waitMillis: 500, onLost: noop }))
      )
      assert.strictEqual(error.reason._tag, "CoordinatorUnavailable")
      assert.isTrue(error.isRetryable)
      const refused = yield* Effect.flip(Redis.connect(server.url))
      assert.strictEqual(refused.reason._tag, "CoordinatorUnavailable")
    }))

  it.live("two resource managers share a global cap through Redis; the lease exposes its fencing token", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const [a, b] = yield* twoCoordinators(server.url, { ttlMillis: 5_000, pollMillis: 20 })
      const managerA = yield* ResourceManager.make({ coordinator: a })
      const managerB = yield* ResourceManager.make({ coordinator: b })
      const launcher: Resource.Launcher<string> = {
        start: (_spec, id) => Effect.succeed(id),
        reset: () => Effect.void,
        health: () => Effect.void
      }
      const resource = Resource.resource(
        Resource.makeUnsafe({
          name: "licensed",
          kind: "in-process",
          pool: { max: 4, globalMax: 1 },
          timeouts: { acquireMillis: 300 }
        }),
        launcher
      )
      const scope = yield* Scope.make()
      const lease = yield* managerA.acquire(resource, { chainId: "a", groupId: "g" }).pipe(Scope.provide(scope))
      assert.isNumber(yield* lease.fencingToken)
      const refused = yield* Effect.flip(Effect.scoped(managerB.acquire(resource, { chainId: "b", groupId: "g" })))
      assert.strictEqual(refused.reason._tag, "LeaseTimeout")
      yield* Scope.close(scope, Exit.void)
      const other = yield* Effect.scoped(Effect.flatMap(
        managerB.acquire(resource, { chainId: "b", groupId: "g" }),
        (l) => l.fencingToken
      ))
      assert.isAbove(other!, (yield* lease.fencingToken)!)
    }))
})

/**
 * redis-server SIGKILLed mid-lease and started again on the same port (a new `run_id`). Before fencing tokens had
 * a clock component and leases a generation, each of these let two holders act on one slot.
 */
describe("Redis leases across a restart or failover", () => {
  it.live("no persistence: typed errors while down; then the lease is lost, tokens grow, its release is harmless", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const options = { ttlMillis: 3_000, heartbeatMillis: 100, pollMillis: 20 }
      const [a, b] = yield* twoCoordinators(server.url, options)
      const c = Redis.make(yield* Redis.connect(server.url), { ...options, holder: "c" })
      const lostA = yield* Ref.make(0)
      const scopeA = yield* Scope.make()
      const leaseA = yield* a.acquire({ resource: "env", cap: 1, waitMillis: 100, onLost: countLost(lostA) }).pipe(
        Scope.provide(scopeA)
      )
      yield* a.fencedSet(leaseA, "env:state", "a before the restart")

      yield* server.kill
      // While the server is down every call fails fast with a typed, retryable error; nothing hangs.
      const down = yield* Effect.flip(leaseA.check)
      assert.strictEqual(down.reason._tag, "CoordinatorUnavailable")
      assert.isTrue(down.isRetryable)
      yield* failsWith(a.fencedSet(leaseA, "env:state", "a while down"), "CoordinatorUnavailable")
      yield* failsWith(
        Effect.scoped(b.acquire({ resource: "env", cap: 1, waitMillis: 200, onLost: noop })),
        "CoordinatorUnavailable"
      )

      yield* server.start // empty: every lease and fence counter is gone
      yield* Effect.forEach([a, b, c], reconnected)
      const leaseB = yield* b.acquire({ resource: "env", cap: 1, waitMillis: 1_000, onLost: noop })
      assert.strictEqual(leaseB.slot, leaseA.slot)
      assert.isAbove(leaseB.token, leaseA.token, "a token issued after the restart exceeds every earlier one")
      yield* failsWith(leaseA.check, "LeaseLost")
      yield* failsWith(a.fencedSet(leaseA, "env:state", "stale a"), "LeaseLost")
      yield* eventuallyLost(lostA)

      // The old holder's release must not free the slot the new holder has.
      yield* Scope.close(scopeA, Exit.void)
      yield* leaseB.check
      yield* failsWith(
        Effect.scoped(c.acquire({ resource: "env", cap: 1, waitMillis: 300, onLost: noop })),
        "LeaseTimeout"
      )
      yield* b.fencedSet(leaseB, "env:state", "b after the restart")
      assert.strictEqual(yield* b.get("env:state"), "b after the restart")
    }), { timeout: 300_000 })

  it.live("AOF: the lease key survives but from an earlier generation: lost, and holding its slot until released", () =>
    Effect.gen(function*() {
      // `appendfsync always`: the lease key surely survives the SIGKILL. (With `everysec` Redis may postpone the AOF
      // write while a background fsync runs, and a SIGKILL loses acknowledged writes: 1 run in 6 here. The next
      // test is that case.)
      const server = yield* redisServerWith({ appendonly: true, appendfsync: "always" })
      // A long TTL: the lease key is still live when the server comes back.
      const [a, b] = yield* twoCoordinators(server.url, { ttlMillis: 10_000, heartbeatMillis: 100, pollMillis: 20 })
      const lostA = yield* Ref.make(0)
      const scopeA = yield* Scope.make()
      const leaseA = yield* a.acquire({ resource: "env", cap: 1, waitMillis: 100, onLost: countLost(lostA) }).pipe(
        Scope.provide(scopeA)
      )
      yield* a.fencedSet(leaseA, "env:state", "a before the restart")
      const stored = yield* a.get(a.leaseKey("env", leaseA.slot))

      yield* server.kill
      yield* failsWith(leaseA.check, "CoordinatorUnavailable")
      yield* server.start
      yield* Effect.forEach([a, b], reconnected)
      assert.strictEqual(yield* a.get(a.leaseKey("env", leaseA.slot)), stored, "the AOF kept the lease key")
      assert.strictEqual(yield* a.get("env:state"), "a before the restart", "and the fenced write")

      // The key survived, but the server that granted it did not: the lease is lost, never silently valid.
      yield* failsWith(leaseA.check, "LeaseLost")
      yield* failsWith(a.fencedSet(leaseA, "env:state", "a after the restart"), "LeaseLost")
      yield* eventuallyLost(lostA)
      assert.strictEqual(yield* a.get("env:state"), "a before the restart")
      // Its holder may still be acting on the slot until it lets go, so nobody else is granted it meanwhile...
      yield* failsWith(
        Effect.scoped(b.acquire({ resource: "env", cap: 1, waitMillis: 300, onLost: noop })),
        "LeaseTimeout"
      )
      // ...and once it does (well before the TTL), the next holder gets the slot with a greater token.
      yield* Scope.close(scopeA, Exit.void)
      const leaseB = yield* b.acquire({ resource: "env", cap: 1, waitMillis: 1_000, onLost: noop })
      assert.isAbove(leaseB.token, leaseA.token)
      yield* b.fencedSet(leaseB, "env:state", "b")
    }), { timeout: 300_000 })

  it.live("AOF missing the latest grant (a lost fsync window): tokens grow, the stale release deletes nothing", () =>
    Effect.gen(function*() {
      // `appendfsync always`: the snapshot holds exactly the writes acknowledged before it. With `everysec` a busy
      // disk can postpone the first lease's release past the copy, and the restored server then holds that lease.
      const server = yield* redisServerWith({ appendonly: true, appendfsync: "always" })
      const options = { ttlMillis: 10_000, heartbeatMillis: 100, pollMillis: 20 }
      const [a, b] = yield* twoCoordinators(server.url, options)
      const c = Redis.make(yield* Redis.connect(server.url), { ...options, holder: "c" })
      const first = yield* Effect.scoped(a.acquire({ resource: "env", cap: 1, waitMillis: 100, onLost: noop }))
      yield* server.snapshot // the persisted state knows the first grant only
      const scopeA = yield* Scope.make()
      const leaseA = yield* a.acquire({ resource: "env", cap: 1, waitMillis: 100, onLost: noop }).pipe(
        Scope.provide(scopeA)
      )
      assert.isAbove(leaseA.token, first.token)

      yield* server.kill
      yield* server.restoreSnapshot
      yield* server.start
      yield* Effect.forEach([a, b, c], reconnected)
      assert.isNull(yield* a.get(a.leaseKey("env", leaseA.slot)), "the second grant was lost with the writes")
      const leaseB = yield* b.acquire({ resource: "env", cap: 1, waitMillis: 1_000, onLost: noop })
      assert.isAbove(leaseB.token, leaseA.token, "greater than the token whose grant the server forgot")
      yield* failsWith(leaseA.check, "LeaseLost")
      yield* failsWith(a.fencedSet(leaseA, "env:state", "stale a"), "LeaseLost")
      yield* Scope.close(scopeA, Exit.void)
      yield* leaseB.check
      yield* failsWith(
        Effect.scoped(c.acquire({ resource: "env", cap: 1, waitMillis: 300, onLost: noop })),
        "LeaseTimeout"
      )
    }), { timeout: 300_000 })

  it.live("failover to a replica that missed the latest grant: a greater token; the old primary's lease refused", () =>
    Effect.gen(function*() {
      const primary = yield* redisServer
      const replica = yield* redisServerWith({ replicaOf: primary.port })
      const options = { ttlMillis: 10_000, heartbeatMillis: 100, pollMillis: 20 }
      const a = Redis.make(yield* Redis.connect(primary.url), { ...options, holder: "a" })
      const first = yield* Effect.scoped(a.acquire({ resource: "env", cap: 1, waitMillis: 100, onLost: noop }))
      yield* replica.synced // the replica knows the first grant...
      yield* replica.promote // ...and is promoted while the old primary still grants (a partition)
      const leaseA = yield* a.acquire({ resource: "env", cap: 1, waitMillis: 100, onLost: noop })
      assert.isAbove(leaseA.token, first.token)
      yield* primary.kill

      // Clients fail over to the promoted replica.
      const [aOnReplica, b] = yield* twoCoordinators(replica.url, options)
      const leaseB = yield* b.acquire({ resource: "env", cap: 1, waitMillis: 1_000, onLost: noop })
      assert.isAbove(leaseB.token, leaseA.token, "greater than a token the new primary never saw")
      yield* failsWith(aOnReplica.fencedSet(leaseA, "env:state", "a from the old primary"), "LeaseLost")
      yield* b.fencedSet(leaseB, "env:state", "b")
      assert.strictEqual(yield* b.get("env:state"), "b")
    }), { timeout: 300_000 })
})
