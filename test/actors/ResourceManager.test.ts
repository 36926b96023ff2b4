import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Fiber, Layer, Metric, Ref, Schedule, Schema, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as InProcess from "../../actors/resources/InProcess.ts"
import { EnvError, envError } from "../../src/Environment.ts"
import * as Resource from "../../src/Resource.ts"

/** A fake launcher whose instances are counters that can be killed; it records what the manager asked of it. */
const makeFake = () => {
  const log: Array<string> = []
  const alive = new Set<string>()
  interface Counter {
    readonly id: string
    readonly value: Ref.Ref<number>
  }
  const dead = (id: string, method: string) =>
    envError("fake", method, "Crashed", `${id} is dead`)
  const launcher: Resource.Launcher<Counter> = {
    start: (_spec, id) =>
      Effect.gen(function*() {
        log.push(`start ${id}`)
        alive.add(id)
        yield* Effect.addFinalizer(() => Effect.sync(() => (alive.delete(id), log.push(`destroy ${id}`))))
        return { id, value: yield* Ref.make(0) }
      }),
    reset: (c) => Effect.andThen(Effect.sync(() => log.push(`reset ${c.id}`)), Ref.set(c.value, 0)),
    health: (c) => (alive.has(c.id) ? Effect.void : Effect.fail(dead(c.id, "health")))
  }
  const incr = (c: Counter) =>
    alive.has(c.id) ? Ref.updateAndGet(c.value, (n) => n + 1) : Effect.fail(dead(c.id, "incr"))
  return { log, alive, launcher, incr, kill: (id: string) => alive.delete(id) }
}

const spec = (input: Partial<Resource.SpecInput> = {}) =>
  Resource.makeUnsafe({ name: "counter", kind: "in-process", ...input })

const chain = (chainId: string, groupId = "g0"): Resource.Owner => ({ chainId, groupId })

const withManager = <A, E>(effect: Effect.Effect<A, E, ResourceManager.ResourceManager | Scope.Scope>) =>
  Effect.provide(Effect.scoped(effect), ResourceManager.ResourceManager.layer)

/**
 * An in-memory coordinator with `cap` slots per resource, logging grants to `log`. `forget` loses every lease at
 * once (as a coordinator restart without persistence does: their checks fail with `LeaseLost`, their slots are
 * free) without telling the holders; `notify` tells them, as their heartbeat would. `take` grants a slot to
 * another process; `down` makes every call fail with `CoordinatorUnavailable`.
 */
const makeFakeCoordinator = (log: Array<string>) => {
  const held = new Map<string, number>()
  const live = new Set<{ readonly lease: Resource.GlobalLease; readonly onLost: () => Effect.Effect<void> }>()
  let nextToken = 1
  let down = false
  const slotKey = (resource: string, slot: number) => `${resource}/${slot}`
  const error = (resource: string, reason: Resource.LeaseErrorReason) => new Resource.LeaseError({ resource, reason })
  const unavailable = (resource: string) => error(resource, new Resource.CoordinatorUnavailable({ message: "down" }))
  const grant = (resource: string, cap: number) =>
    Effect.suspend(() => {
      if (down) return Effect.fail(unavailable(resource))
      for (let slot = 0; slot < cap; slot++) {
        if (held.has(slotKey(resource, slot))) continue
        const token = nextToken++
        held.set(slotKey(resource, slot), token)
        log.push(`grant ${token}`)
        return Effect.succeed({ slot, token })
      }
      return Effect.succeed(undefined)
    })
  const coordinator: Resource.Coordinator = {
    acquire: ({ cap, onLost, resource, waitMillis }) =>
      Effect.gen(function*() {
        const granted = yield* grant(resource, cap).pipe(
          Effect.repeat({ schedule: Schedule.spaced("10 millis"), until: (g) => g !== undefined }),
          Effect.timeoutOrElse({
            duration: waitMillis,
            orElse: () => Effect.fail(error(resource, new Resource.LeaseTimeout({ waitedMillis: waitMillis })))
          })
        )
        const { slot, token } = granted!
        const key = slotKey(resource, slot)
        const lease: Resource.GlobalLease = {
          resource,
          slot,
          token,
          check: Effect.suspend(() =>
            down
              ? Effect.fail(unavailable(resource))
              : held.get(key) === token
              ? Effect.void
              : Effect.fail(error(resource, new Resource.LeaseLost({ slot, token })))
          )
        }
        const entry = { lease, onLost: () => onLost(lease) }
        live.add(entry)
        yield* Effect.addFinalizer(() =>
          Effect.sync(() => {
            live.delete(entry)
            if (held.get(key) === token) held.delete(key)
          })
        )
        return lease
      })
  }
  return {
    coordinator,
    held,
    forget: Effect.sync(() => held.clear()),
    notify: Effect.suspend(() =>
      Effect.forEach(
        [...live].filter(({ lease }) => held.get(slotKey(lease.resource, lease.slot)) !== lease.token),
        ({ onLost }) => onLost(),
        { discard: true }
      )
    ),
    take: (resource: string, slot: number) =>
      Effect.sync(() => {
        const token = nextToken++
        held.set(slotKey(resource, slot), token)
        log.push(`grant ${token} to another process`)
        const key = slotKey(resource, slot)
        return Effect.sync(() => void (held.get(key) === token && held.delete(key)))
      }),
    setDown: (value: boolean) => Effect.sync(() => void (down = value))
  }
}

describe("ResourceManager", () => {
  describe("sharing and isolation", () => {
    it.effect("chain scope: one instance per chain, the same one for the same chain", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ scope: "chain" }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        const a1 = yield* manager.acquire(resource, chain("a"))
        const a2 = yield* manager.acquire(resource, chain("a"))
        const b = yield* manager.acquire(resource, chain("b"))
        assert.strictEqual(yield* a1.instanceId, yield* a2.instanceId)
        assert.notStrictEqual(yield* a1.instanceId, yield* b.instanceId)
        yield* a1.use(fake.incr)
        assert.strictEqual(yield* a2.use(fake.incr), 2, "the same chain sees its own state")
        assert.strictEqual(yield* b.use(fake.incr), 1, "another chain is isolated")
      })))

    it.effect("group scope: chains of one group share, groups are isolated", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ scope: "group" }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        const a = yield* manager.acquire(resource, chain("a", "g1"))
        const b = yield* manager.acquire(resource, chain("b", "g1"))
        const c = yield* manager.acquire(resource, chain("c", "g2"))
        assert.strictEqual(yield* a.instanceId, yield* b.instanceId)
        assert.notStrictEqual(yield* a.instanceId, yield* c.instanceId)
        assert.deepStrictEqual(fake.log.filter((l) => l.startsWith("start")).length, 2)
      })))

    it.effect("global scope: everybody shares one instance", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ scope: "global" }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        const ids = yield* Effect.forEach(
          ["a", "b", "c"],
          (id, i) => Effect.flatMap(manager.acquire(resource, chain(id, `g${i}`)), (l) => l.instanceId)
        )
        assert.deepStrictEqual(new Set(ids).size, 1)
      })))

    it.effect("the sharing key includes the spec: one chain gets one instance per spec", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const manager = yield* ResourceManager.ResourceManager
        const x = yield* manager.acquire(Resource.resource(spec({ name: "x" }), fake.launcher), chain("a"))
        const y = yield* manager.acquire(Resource.resource(spec({ name: "y" }), fake.launcher), chain("a"))
        assert.notStrictEqual(yield* x.instanceId, yield* y.instanceId)
      })))
  })

  describe("bounded waits", () => {
    it.effect("a full pool fails the waiter with LeaseTimeout after acquireMillis", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ pool: { max: 1 }, timeouts: { acquireMillis: 5_000 } }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        yield* manager.acquire(resource, chain("holder"))
        const waiter = yield* Effect.forkChild(Effect.scoped(manager.acquire(resource, chain("waiter"))))
        yield* TestClock.adjust("4999 millis")
        assert.strictEqual((yield* manager.stats("counter"))?.waiters, 1)
        assert.isUndefined(waiter.pollUnsafe(), "still waiting before the deadline")
        yield* TestClock.adjust("1 millis")
        const exit = yield* Fiber.await(waiter)
        assert.isTrue(Exit.isFailure(exit))
        const error = yield* Effect.flip(Fiber.join(waiter))
        assert.instanceOf(error, Resource.LeaseError)
        assert.strictEqual(error.reason._tag, "LeaseTimeout")
        assert.isTrue(error.isRetryable)
        assert.strictEqual((yield* manager.stats("counter"))?.waiters, 0, "the timed-out waiter is gone")
      })))

    it.effect("a waiter gets the instance as soon as the holder releases it", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ pool: { max: 1 } }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        const holder = yield* Effect.forkChild(Effect.scoped(Effect.andThen(
          manager.acquire(resource, chain("holder")),
          Effect.sleep("1 second")
        )))
        yield* Effect.yieldNow
        const waiter = yield* Effect.forkChild(
          Effect.scoped(Effect.flatMap(manager.acquire(resource, chain("waiter")), (l) => l.instanceId))
        )
        yield* TestClock.adjust("1 second")
        yield* Fiber.join(holder)
        assert.strictEqual(yield* Fiber.join(waiter), "counter-0")
        assert.include(fake.log, "reset counter-0")
      })))

    it.effect("closing a pool fails waiters at once and refuses new acquires", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ pool: { max: 1 } }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        yield* manager.acquire(resource, chain("holder"))
        const waiter = yield* Effect.forkChild(Effect.scoped(manager.acquire(resource, chain("waiter"))))
        yield* Effect.yieldNow
        yield* manager.close("counter")
        const error = yield* Effect.flip(Fiber.join(waiter))
        assert.strictEqual(error.reason._tag, "PoolClosed")
        const again = yield* Effect.flip(Effect.scoped(manager.acquire(resource, chain("late"))))
        assert.strictEqual(again.reason._tag, "PoolClosed")
        assert.isFalse(again.isRetryable)
      })))
  })

  describe("release and reuse", () => {
    it.effect("an instance is reset before reuse; `recreate` gives a new one", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const manager = yield* ResourceManager.ResourceManager
        const reset = Resource.resource(spec({ name: "reset", pool: { max: 1 } }), fake.launcher)
        yield* Effect.scoped(Effect.flatMap(manager.acquire(reset, chain("a")), (l) => l.use(fake.incr)))
        const [id, n] = yield* Effect.scoped(Effect.flatMap(
          manager.acquire(reset, chain("b")),
          (l) => Effect.all([l.instanceId, l.use(fake.incr)])
        ))
        assert.strictEqual(id, "reset-0", "reused")
        assert.strictEqual(n, 1, "the previous chain's state is gone")

        const recreate = Resource.resource(spec({ name: "recreate", resetPolicy: "recreate" }), fake.launcher)
        const first = yield* Effect.scoped(Effect.flatMap(manager.acquire(recreate, chain("a")), (l) => l.instanceId))
        yield* Effect.yieldNow
        const second = yield* Effect.scoped(Effect.flatMap(manager.acquire(recreate, chain("b")), (l) => l.instanceId))
        assert.notStrictEqual(first, second)
        assert.include(fake.log, `destroy ${first}`)
      })))

    it.effect("a released instance is counted as resetting until its reset ends, then idle", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const slow: Resource.Launcher<{ readonly id: string; readonly value: Ref.Ref<number> }> = {
          ...fake.launcher,
          reset: (c) => Effect.andThen(Effect.sleep("2 seconds"), fake.launcher.reset(c))
        }
        const resource = Resource.resource(spec({ timeouts: { resetMillis: 5_000 } }), slow)
        const manager = yield* ResourceManager.ResourceManager
        yield* Effect.scoped(manager.acquire(resource, chain("a")))
        assert.deepInclude(yield* manager.stats("counter"), { leased: 0, resetting: 1, idle: 0 })
        yield* TestClock.adjust("2 seconds")
        assert.deepInclude(yield* manager.stats("counter"), { leased: 0, resetting: 0, idle: 1 })
      })))

    it.effect("a lease is released when its holder fails or is interrupted", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ pool: { max: 1 } }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        const failing = yield* Effect.exit(Effect.scoped(Effect.andThen(
          manager.acquire(resource, chain("a")),
          Effect.fail("boom")
        )))
        assert.isTrue(Exit.isFailure(failing))
        const hanging = yield* Effect.forkChild(Effect.scoped(Effect.andThen(
          manager.acquire(resource, chain("b")),
          Effect.never
        )))
        yield* Effect.yieldNow
        assert.strictEqual((yield* manager.stats("counter"))?.leased, 1)
        yield* Fiber.interrupt(hanging)
        yield* Effect.yieldNow
        const stats = yield* manager.stats("counter")
        assert.strictEqual(stats?.leased, 0)
        assert.strictEqual(stats?.idle, 1)
      })))

    it.effect("an interrupted waiter leaves no trace", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ pool: { max: 1 } }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        yield* manager.acquire(resource, chain("holder"))
        const waiter = yield* Effect.forkChild(Effect.scoped(manager.acquire(resource, chain("waiter"))))
        yield* Effect.yieldNow
        yield* Fiber.interrupt(waiter)
        assert.strictEqual((yield* manager.stats("counter"))?.waiters, 0)
      })))

    it.effect("idle instances above min are destroyed after the idle TTL", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ pool: { min: 1, max: 3, idleTtlMillis: 10_000 } }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        yield* Effect.scoped(Effect.all([
          manager.acquire(resource, chain("a")),
          manager.acquire(resource, chain("b")),
          manager.acquire(resource, chain("c"))
        ]))
        yield* Effect.yieldNow
        assert.strictEqual((yield* manager.stats("counter"))?.idle, 3)
        yield* TestClock.adjust("15 seconds")
        assert.strictEqual((yield* manager.stats("counter"))?.idle, 1, "min is kept")
      })))

    it.effect("prewarm starts instances when the pool opens", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const manager = yield* ResourceManager.ResourceManager
        yield* manager.open(Resource.resource(spec({ pool: { prewarm: 2 } }), fake.launcher))
        yield* Effect.yieldNow
        const stats = yield* manager.stats("counter")
        assert.strictEqual(stats?.idle, 2)
        assert.strictEqual(stats?.starts, 2)
      })))
  })

  describe("health and crashes", () => {
    it.effect("a crash mid-lease gives EnvError(Crashed); withRetryOnCrash re-runs the step on a fresh instance", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec(), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        const lease = yield* manager.acquire(resource, chain("a"))
        yield* lease.use(fake.incr)
        const before = yield* lease.instanceId
        fake.kill(before)
        const error = yield* Effect.flip(lease.use(fake.incr))
        assert.instanceOf(error, EnvError)
        assert.isTrue(Resource.isCrash(error))
        const attempts = yield* Ref.make(0)
        const step = Effect.andThen(Ref.update(attempts, (n) => n + 1), lease.use(fake.incr))
        fake.kill(yield* lease.instanceId)
        const n = yield* ResourceManager.withRetryOnCrash(step)
        assert.strictEqual(n, 1, "the retried step ran on a fresh instance")
        assert.strictEqual(yield* Ref.get(attempts), 2)
        assert.notStrictEqual(yield* lease.instanceId, before)
        assert.isAtLeast((yield* manager.stats("counter"))!.failures, 2)
      })))

    it.effect("the periodic health check replaces a dead leased instance; the holder is told once", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ timeouts: { healthIntervalMillis: 1_000 } }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        const lease = yield* manager.acquire(resource, chain("a"))
        yield* lease.use(fake.incr)
        const before = yield* lease.instanceId
        fake.kill(before)
        yield* TestClock.adjust("1 second")
        yield* Effect.yieldNow
        assert.include(fake.log, `destroy ${before}`)
        const error = yield* Effect.flip(lease.use(fake.incr))
        assert.isTrue(Resource.isCrash(error))
        assert.strictEqual(yield* lease.use(fake.incr), 1, "next call works on the fresh instance")
      })))

    it.effect("an idle instance that fails its check on acquire is replaced before it is handed out", () =>
      withManager(Effect.gen(function*() {
        const fake = makeFake()
        const resource = Resource.resource(spec({ pool: { max: 1 } }), fake.launcher)
        const manager = yield* ResourceManager.ResourceManager
        const first = yield* Effect.scoped(Effect.flatMap(manager.acquire(resource, chain("a")), (l) => l.instanceId))
        yield* Effect.yieldNow
        fake.kill(first)
        const second = yield* Effect.scoped(Effect.flatMap(manager.acquire(resource, chain("b")), (l) => l.instanceId))
        assert.notStrictEqual(first, second)
        const n = yield* Effect.scoped(Effect.flatMap(manager.acquire(resource, chain("c")), (l) => l.use(fake.incr)))
        assert.strictEqual(n, 1)
      })))

    it.effect("a start that fails gives LeaseError(StartFailed) and frees the slot", () =>
      withManager(Effect.gen(function*() {
        let fail = true
        const launcher: Resource.Launcher<string> = {
          start: (_s, id) =>
            fail
              ? Effect.fail(envError("x", "start", "Unavailable", "no engine"))
              : Effect.succeed(id),
          reset: () => Effect.void,
          health: () => Effect.void
        }
        const resource = Resource.resource(spec({ pool: { max: 1 } }), launcher)
        const manager = yield* ResourceManager.ResourceManager
        const error = yield* Effect.flip(Effect.scoped(manager.acquire(resource, chain("a"))))
        assert.strictEqual(error.reason._tag, "StartFailed")
        assert.include(error.reason._tag === "StartFailed" ? error.reason.message : "", "no engine")
        fail = false
        const id = yield* Effect.scoped(Effect.flatMap(manager.acquire(resource, chain("a")), (l) => l.instanceId))
        assert.strictEqual(id, "counter-1")
      })))

    it.effect("a holder that gave up does not leave its key bound to a doomed start", () =>
      withManager(Effect.gen(function*() {
        let starts = 0
        const launcher: Resource.Launcher<string> = {
          start: (_s, id) =>
            ++starts === 1
              ? Effect.andThen(
                Effect.sleep("2 seconds"),
                Effect.fail(envError("x", "start", "Unavailable", "slow failure"))
              )
              : Effect.succeed(id),
          reset: () => Effect.void,
          health: () => Effect.void
        }
        const resource = Resource.resource(spec({ pool: { max: 1 }, timeouts: { acquireMillis: 1_500 } }), launcher)
        const manager = yield* ResourceManager.ResourceManager
        const first = yield* Effect.forkChild(Effect.scoped(manager.acquire(resource, chain("a"))))
        yield* TestClock.adjust("1500 millis")
        assert.strictEqual((yield* Effect.flip(Fiber.join(first))).reason._tag, "LeaseTimeout")
        // The same chain asks again: it must wait for a slot and get a fresh start, not the doomed one's failure.
        const second = yield* Effect.forkChild(
          Effect.scoped(Effect.flatMap(manager.acquire(resource, chain("a")), (l) => l.instanceId))
        )
        yield* TestClock.adjust("1 second")
        assert.strictEqual(yield* Fiber.join(second), "counter-1")
      })))

    it.effect("a start that hangs is cut at startMillis", () =>
      withManager(Effect.gen(function*() {
        const launcher: Resource.Launcher<string> = {
          start: () => Effect.never,
          reset: () => Effect.void,
          health: () => Effect.void
        }
        const resource = Resource.resource(
          spec({ timeouts: { startMillis: 1_000, acquireMillis: 60_000 } }),
          launcher
        )
        const manager = yield* ResourceManager.ResourceManager
        const fiber = yield* Effect.forkChild(Effect.scoped(manager.acquire(resource, chain("a"))))
        yield* TestClock.adjust("1 second")
        const error = yield* Effect.flip(Fiber.join(fiber))
        assert.strictEqual(error.reason._tag, "StartFailed")
        assert.strictEqual((yield* manager.stats("counter"))?.starting, 0)
      })))
  })

  describe("global leases (a coordinator that loses them)", () => {
    const coordinated = <A, E>(
      log: Array<string>,
      body: (
        fake: ReturnType<typeof makeFakeCoordinator>,
        manager: ResourceManager.ResourceManager["Service"]
      ) => Effect.Effect<A, E, Scope.Scope>
    ) =>
      Effect.scoped(Effect.gen(function*() {
        const fake = makeFakeCoordinator(log)
        const manager = yield* ResourceManager.make({ coordinator: fake.coordinator })
        return yield* body(fake, manager)
      }))
    const capped = (launcher: Resource.Launcher<any>, acquireMillis = 5_000) =>
      Resource.resource(spec({ pool: { max: 4, globalMax: 1 }, timeouts: { acquireMillis } }), launcher)

    it.effect("use checks the lease first: a lost one is Crashed once, then the step runs with a greater token", () => {
      const fake = makeFake()
      return coordinated(fake.log, (coordinator, manager) =>
        Effect.gen(function*() {
          const lease = yield* manager.acquire(capped(fake.launcher), chain("a"))
          assert.strictEqual(yield* lease.use(fake.incr), 1)
          const before = (yield* lease.fencingToken)!
          yield* coordinator.forget // nobody is told: only the check on the next use can find out
          const ran = yield* Ref.make(0)
          const counted = (c: Parameters<typeof fake.incr>[0]) =>
            Effect.andThen(Ref.update(ran, (n) => n + 1), fake.incr(c))
          const error = yield* Effect.flip(lease.use(counted))
          assert.isTrue(Resource.isCrash(error), String(error))
          assert.strictEqual(yield* Ref.get(ran), 0, "the step did not run under the lost lease")
          assert.include(fake.log, "destroy counter-0")
          assert.strictEqual(yield* lease.use(fake.incr), 1, "the next step runs on a fresh instance")
          assert.strictEqual(yield* lease.instanceId, "counter-1")
          assert.isAbove((yield* lease.fencingToken)!, before)
          assert.deepStrictEqual(
            fake.log.filter((line) => line !== "start counter-0"),
            ["grant 1", "destroy counter-0", "grant 2", "start counter-1"],
            "the old instance is gone before the new lease is asked for, the new one starts under it"
          )
        }))
    })

    it.effect("a lease lost while a call runs: its result is dropped (Crashed), never reported as a success", () => {
      const fake = makeFake()
      return coordinated(fake.log, (coordinator, manager) =>
        Effect.gen(function*() {
          const lease = yield* manager.acquire(capped(fake.launcher), chain("a"))
          const latch = yield* Deferred.make<void>()
          const call = yield* Effect.forkChild(lease.use((c) => Effect.as(Deferred.await(latch), c.id)))
          yield* Effect.yieldNow
          yield* coordinator.forget
          yield* coordinator.notify // the heartbeat finds the lease gone
          yield* Effect.yieldNow
          assert.include(fake.log, "destroy counter-0", "stopped without waiting for the holder")
          yield* Deferred.succeed(latch, undefined)
          const error = yield* Effect.flip(Fiber.join(call))
          assert.isTrue(Resource.isCrash(error), String(error))
          assert.strictEqual(yield* lease.use((c) => Effect.succeed(c.id)), "counter-1", "told once")
          assert.strictEqual(yield* lease.fencingToken, 2)
        }))
    })

    it.effect("a loss reported twice (the heartbeat, then a holder's check) is one relet", () => {
      const fake = makeFake()
      return coordinated(fake.log, (coordinator, manager) =>
        Effect.gen(function*() {
          const lease = yield* manager.acquire(capped(fake.launcher), chain("a"))
          yield* coordinator.forget
          yield* coordinator.notify
          yield* coordinator.notify
          assert.isTrue(Resource.isCrash(yield* Effect.flip(lease.use(fake.incr))))
          assert.strictEqual(yield* lease.use(fake.incr), 1)
          assert.deepStrictEqual(fake.log, [
            "grant 1",
            "start counter-0",
            "destroy counter-0",
            "grant 2",
            "start counter-1"
          ])
          assert.deepInclude(yield* manager.stats("counter"), { crashes: 1, leased: 1, starting: 0 })
        }))
    })

    it.effect("lost while its instance starts: that one is never handed over; the next starts with a new lease", () => {
      const log: Array<string> = []
      const gate = Deferred.makeUnsafe<void>()
      const launcher: Resource.Launcher<string> = {
        start: (_spec, id) =>
          Effect.gen(function*() {
            log.push(`start ${id}`)
            yield* Effect.addFinalizer(() => Effect.sync(() => log.push(`destroy ${id}`)))
            if (id === "counter-0") yield* Deferred.await(gate)
            return id
          }),
        reset: () => Effect.void,
        health: () => Effect.void
      }
      return coordinated(log, (coordinator, manager) =>
        Effect.gen(function*() {
          const acquiring = yield* Effect.forkChild(
            Effect.scoped(Effect.flatMap(manager.acquire(capped(launcher), chain("a")), (lease) =>
              Effect.all([lease.use(Effect.succeed), lease.fencingToken])))
          )
          yield* Effect.yieldNow
          assert.deepStrictEqual(log, ["grant 1", "start counter-0"])
          yield* coordinator.forget
          yield* coordinator.notify
          yield* Deferred.succeed(gate, undefined)
          assert.deepStrictEqual(yield* Fiber.join(acquiring), ["counter-1", 2])
          assert.deepStrictEqual(log.slice(0, 5), [
            "grant 1",
            "start counter-0",
            "destroy counter-0",
            "grant 2",
            "start counter-1"
          ])
        }))
    })

    it.effect("slot taken elsewhere past acquireMillis: LeaseLost for good; a holder that left leaks nothing", () => {
      const fake = makeFake()
      return coordinated(fake.log, (coordinator, manager) =>
        Effect.gen(function*() {
          const resource = capped(fake.launcher, 1_000)
          const lease = yield* manager.acquire(resource, chain("a"))
          yield* coordinator.forget
          const giveBack = yield* coordinator.take("counter", 0)
          assert.isTrue(Resource.isCrash(yield* Effect.flip(lease.use(fake.incr))))
          const waiting = yield* Effect.forkChild(Effect.flip(lease.use(fake.incr)))
          yield* TestClock.adjust("999 millis")
          assert.isUndefined(waiting.pollUnsafe(), "waits for the slot within acquireMillis")
          yield* TestClock.adjust("1 millis")
          const error = yield* Fiber.join(waiting)
          assert.instanceOf(error, Resource.LeaseError)
          assert.deepStrictEqual((error as Resource.LeaseError).reason, new Resource.LeaseLost({ slot: 0, token: 1 }))
          yield* giveBack
          const again = yield* Effect.flip(lease.use(fake.incr))
          assert.strictEqual((again as Resource.LeaseError).reason._tag, "LeaseLost", "never again on this lease")
          assert.isUndefined(yield* lease.fencingToken)
          assert.deepInclude(yield* manager.stats("counter"), { leased: 0, starting: 0, idle: 0 })

          // Another holder loses its lease and leaves while its binding waits for a new one: nothing is left.
          const scope = yield* Scope.make()
          const other = yield* manager.acquire(resource, chain("b")).pipe(Scope.provide(scope))
          assert.strictEqual(yield* other.fencingToken, 3)
          yield* coordinator.forget
          yield* coordinator.take("counter", 0)
          yield* coordinator.notify
          yield* Effect.yieldNow
          yield* Scope.close(scope, Exit.void)
          yield* TestClock.adjust("1 second")
          assert.deepInclude(yield* manager.stats("counter"), { leased: 0, starting: 0, idle: 0, waiters: 0 })
          assert.deepStrictEqual([...coordinator.held.values()], [4], "only the other process's slot is held")
          assert.deepStrictEqual([...fake.alive], [])
        }))
    })

    it.effect("coordinator unreachable: use fails typed, the instance kept; acquires retry within their wait", () => {
      const fake = makeFake()
      return coordinated(fake.log, (coordinator, manager) =>
        Effect.gen(function*() {
          const resource = Resource.resource(
            spec({ pool: { max: 4, globalMax: 2 }, timeouts: { acquireMillis: 1_000 } }),
            fake.launcher
          )
          const lease = yield* manager.acquire(resource, chain("a"))
          yield* lease.use(fake.incr)
          yield* coordinator.setDown(true)
          const down = yield* Effect.flip(lease.use(fake.incr))
          assert.instanceOf(down, Resource.LeaseError)
          assert.strictEqual((down as Resource.LeaseError).reason._tag, "CoordinatorUnavailable")
          assert.isTrue((down as Resource.LeaseError).isRetryable)

          // A new chain's acquire keeps asking within its wait: an outage shorter than that is not seen...
          const waiter = yield* Effect.forkChild(
            Effect.scoped(Effect.flatMap(manager.acquire(resource, chain("b")), (l) => l.fencingToken))
          )
          yield* TestClock.adjust("500 millis")
          yield* coordinator.setDown(false)
          yield* TestClock.adjust("200 millis")
          assert.strictEqual(yield* Fiber.join(waiter), 2)
          assert.strictEqual(yield* lease.use(fake.incr), 2, "the same instance, its state kept")
          assert.strictEqual(yield* lease.fencingToken, 1)
          // ...a longer one fails it with a typed error, leaving nothing behind.
          yield* coordinator.setDown(true)
          const failing = yield* Effect.forkChild(Effect.flip(Effect.scoped(manager.acquire(resource, chain("c")))))
          yield* TestClock.adjust("1 second")
          const error = yield* Fiber.join(failing)
          assert.strictEqual(error.reason._tag, "CoordinatorUnavailable")
          assert.deepInclude(yield* manager.stats("counter"), { leased: 1, starting: 0, waiters: 0, crashes: 0 })
        }))
    })
  })

  it.effect("stats count instances by state, starts, failures and acquires", () =>
    withManager(Effect.gen(function*() {
      const fake = makeFake()
      const resource = Resource.resource(spec({ pool: { max: 2 } }), fake.launcher)
      const manager = yield* ResourceManager.ResourceManager
      yield* manager.acquire(resource, chain("a"))
      yield* manager.acquire(resource, chain("b"))
      const stats = yield* manager.stats("counter")
      assert.deepInclude(stats, { starting: 0, idle: 0, leased: 2, unhealthy: 0, waiters: 0, starts: 2, acquires: 2 })
    })))

  it.effect("stats count crashes found by checks, resets and recreations on release", () =>
    withManager(Effect.gen(function*() {
      const fake = makeFake()
      const manager = yield* ResourceManager.ResourceManager
      const reused = Resource.resource(spec({ name: "reused", pool: { max: 1 } }), fake.launcher)
      const id = yield* Effect.scoped(Effect.flatMap(manager.acquire(reused, chain("a")), (l) => l.instanceId))
      yield* Effect.yieldNow
      fake.kill(id)
      yield* Effect.scoped(manager.acquire(reused, chain("b"))) // the check on acquire finds it dead
      yield* Effect.yieldNow
      assert.deepInclude(yield* manager.stats("reused"), { crashes: 1, failures: 1, resets: 2, recreations: 0 })

      const recreated = Resource.resource(spec({ name: "recreated", resetPolicy: "recreate" }), fake.launcher)
      yield* Effect.scoped(manager.acquire(recreated, chain("a")))
      yield* Effect.yieldNow
      yield* Effect.scoped(manager.acquire(recreated, chain("b")))
      yield* Effect.yieldNow
      assert.deepInclude(yield* manager.stats("recreated"), { crashes: 0, resets: 0, recreations: 2, starts: 2 })
      const snapshot = yield* Metric.snapshot
      const counted = (id: string) => snapshot.find((m) => m.id === id)?.state as { readonly count?: number }
      assert.strictEqual(counted("env/reused/crashes").count, 1, "published as metrics too")
      assert.strictEqual(counted("env/reused/resets").count, 2)
      assert.strictEqual(counted("env/recreated/recreations").count, 2)
    })))

  it.effect("a provider's stats are the pool's figures under env/<name>/: a crash and resets show up", () =>
    withManager(Effect.gen(function*() {
      class CounterEnv extends Context.Service<CounterEnv, {
        readonly incr: Effect.Effect<number, EnvError | Resource.LeaseError>
      }>()("test/CounterEnv") {}
      const fake = makeFake()
      const resource = Resource.resource(spec({ pool: { max: 1 } }), fake.launcher)
      const provider = yield* ResourceManager.provider(
        resource,
        (lease) => Effect.succeed(Context.make(CounterEnv, { incr: lease.use(fake.incr) }))
      )
      assert.deepStrictEqual(yield* provider.stats!, {}, "nothing before the pool opens")
      const use = (chainId: string, hold: Effect.Effect<void> = Effect.void) =>
        Effect.scoped(Effect.gen(function*() {
          const env = Context.get(yield* provider.acquire({ chainId, groupId: "g" }), CounterEnv)
          yield* hold
          return yield* env.incr
        }))
      // Chain a: its instance crashes mid-episode and is replaced; on release the fresh one is reset.
      yield* Effect.scoped(Effect.gen(function*() {
        const env = Context.get(yield* provider.acquire({ chainId: "a", groupId: "g" }), CounterEnv)
        yield* env.incr
        for (const id of [...fake.alive]) fake.kill(id)
        assert.isTrue(Resource.isCrash(yield* Effect.flip(env.incr)))
        assert.strictEqual(yield* env.incr, 1)
      }))
      yield* Effect.yieldNow
      // Chain c holds the only instance for 2 s; chain b waits for it.
      const c = yield* Effect.forkChild(use("c", Effect.sleep("2 seconds")))
      yield* Effect.yieldNow
      const b = yield* Effect.forkChild(use("b"))
      yield* TestClock.adjust("2 seconds")
      assert.strictEqual(yield* Fiber.join(c), 1)
      assert.strictEqual(yield* Fiber.join(b), 1)
      yield* Effect.yieldNow
      assert.deepStrictEqual(yield* provider.stats!, {
        "env/counter/leases": 3,
        "env/counter/acquire_wait_p50_ms": 0,
        "env/counter/acquire_wait_p99_ms": 2_000,
        "env/counter/acquire_wait_max_ms": 2_000,
        "env/counter/creations": 2,
        "env/counter/crashes": 1,
        "env/counter/resets": 3,
        "env/counter/recreations": 0,
        "env/counter/in_use": 0,
        "env/counter/idle": 1,
        "env/counter/waiters": 0
      })
    })))

  it.effect("metrics: instances by state, waiters, starts and acquire latency are published", () =>
    withManager(Effect.gen(function*() {
      const fake = makeFake()
      const resource = Resource.resource(spec({ name: "metered", pool: { max: 1 } }), fake.launcher)
      const manager = yield* ResourceManager.ResourceManager
      yield* manager.acquire(resource, chain("a"))
      const waiter = yield* Effect.forkChild(Effect.scoped(manager.acquire(resource, chain("b"))))
      yield* Effect.yieldNow
      const snapshot = yield* Metric.snapshot
      const value = (id: string, state?: string) =>
        snapshot.find((m) =>
          m.id === id && (m.attributes as Record<string, string> | undefined)?.resource === "metered" &&
          (state === undefined || (m.attributes as Record<string, string>).state === state)
        )?.state as { readonly value?: number; readonly count?: number } | undefined
      assert.strictEqual(value("env/metered/instances", "leased")?.value, 1)
      assert.strictEqual(value("env/metered/instances", "idle")?.value, 0)
      assert.strictEqual(value("env/metered/waiters")?.value, 1)
      assert.strictEqual(value("env/metered/starts")?.count, 1)
      assert.strictEqual(value("env/metered/acquire_ms")?.count, 1)
      yield* Fiber.interrupt(waiter)
    })))

  it.effect("invalid specs fail with a SchemaError naming the problem", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Resource.make({ name: "x", kind: "in-process", pool: { min: 3, max: 2 } }))
      assert.instanceOf(error, Schema.SchemaError)
      assert.include(error.message, "pool.min (3) exceeds pool.max (2)")
      const docker = yield* Effect.flip(Resource.make({ name: "x", kind: "docker" }))
      assert.include(docker.message, "needs an image")
    }))

  describe("in-process environments", () => {
    class Notebook extends Context.Service<Notebook, {
      readonly write: (line: string) => Effect.Effect<void>
      readonly lines: Effect.Effect<ReadonlyArray<string>>
      readonly clear: Effect.Effect<void>
    }>()("test/Notebook") {
      static readonly layer = Layer.effect(Notebook, Effect.gen(function*() {
        const lines = yield* Ref.make<ReadonlyArray<string>>([])
        return Notebook.of({
          write: (line) => Ref.update(lines, (ls) => [...ls, line]),
          lines: Ref.get(lines),
          clear: Ref.set(lines, [])
        })
      }))
    }

    it.effect("a layer is pooled: per-chain contexts through the Environment.Provider contract", () =>
      withManager(Effect.gen(function*() {
        const resource = InProcess.resource(
          spec({ name: "notebook", pool: { max: 1 } }),
          Notebook.layer,
          { reset: (context) => Context.get(context, Notebook).clear }
        )
        const provider = yield* InProcess.provider(resource)
        assert.strictEqual(provider.sharing, "perChain")
        const write = (chainId: string, line: string) =>
          Effect.scoped(Effect.gen(function*() {
            const context = yield* provider.acquire({ chainId, groupId: "g" })
            const notebook = Context.get(context, Notebook)
            yield* notebook.write(line)
            return yield* notebook.lines
          }))
        assert.deepStrictEqual(yield* write("a", "one"), ["one"])
        assert.deepStrictEqual(yield* write("b", "two"), ["two"], "reused after a reset: no trace of chain a")
      })))

    it.effect("without a reset function a released in-process instance is rebuilt, never reused dirty", () =>
      withManager(Effect.gen(function*() {
        const resource = InProcess.resource(spec({ name: "notebook" }), Notebook.layer)
        const manager = yield* ResourceManager.ResourceManager
        const use = (chainId: string) =>
          Effect.scoped(Effect.flatMap(manager.acquire(resource, chain(chainId)), (lease) =>
            lease.use((context) => {
              const notebook = Context.get(context, Notebook)
              return Effect.andThen(notebook.write(chainId), notebook.lines)
            })))
        assert.deepStrictEqual(yield* use("a"), ["a"])
        yield* Effect.yieldNow
        assert.deepStrictEqual(yield* use("b"), ["b"])
      })))
  })
})
