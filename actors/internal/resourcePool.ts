/**
 * The state machine of one resource pool (one spec). Every decision is a synchronous step over plain mutable state
 * (fibers are cooperative, so a step is atomic); the slow work (start, reset, health check, destroy) runs in
 * fibers owned by the pool, never by the chains that wait for it, so interrupting a chain cannot leave a
 * half-started instance behind. That state is one record (`PoolState`, in `poolState.ts` with the bookkeeping the
 * steps share) and each step a top-level function over it, as in effect's `Pool.ts`; `make` only builds the record
 * and opens the pool.
 *
 * A *binding* ties a sharing key (spec, scope, owner) to an instance while at least one holder uses it. Waiting
 * is per binding, not per holder: a second chain of the same group joins the first's wait.
 *
 * **Global leases.** With a coordinator and `pool.globalMax`, a binding holds a global lease (a slot and a fencing
 * token) for as long as its instance may act. When that lease is lost (its heartbeat found it taken, expired or
 * granted by a coordinator that has since restarted, or a holder's check did), the instance is destroyed first and
 * the binding then *relets*: it asks for a new lease, within `timeouts.acquireMillis`, and only under that new
 * lease (a greater token) is a fresh instance started and handed over. If none is granted in time the binding
 * fails with `LeaseError(LeaseLost)` for good. An instance is therefore never run under a lease that is known to
 * be lost, and no two holders ever share a slot longer than the lost holder takes to notice (a heartbeat, or its
 * next use, which checks the lease first).
 */
import { Cause, Clock, Deferred, Effect, Exit, FiberSet, Metric, Option, Schedule, Scope } from "effect"
import type { EnvError } from "../../src/Environment.ts"
import * as Resource from "../../src/Resource.ts"
import {
  count,
  crashed,
  envError,
  fork,
  forkAll,
  leaseError,
  makeMetrics,
  newBinding,
  newInstance,
  publishGauges,
  recordAcquire,
  snapshot
} from "./poolState.ts"
import type { Binding, Instance, PoolState, PoolStats } from "./poolState.ts"
import { makeWaitWindow } from "./waitWindow.ts"

export type { Binding, Instance, PoolState, PoolStats } from "./poolState.ts"

export interface Pool<A> {
  readonly resource: Resource.Resource<A>
  readonly join: (key: string) => Effect.Effect<Binding<A>, Resource.LeaseError>
  readonly leave: (binding: Binding<A>) => Effect.Effect<void>
  /** Replace a crashed instance of `binding` with a fresh one (no-op if it was already replaced). */
  readonly replace: (binding: Binding<A>, instance: Instance<A>) => Effect.Effect<void>
  /**
   * The binding's global lease `lease` is lost (a holder's check said so): destroy its instance and relet (no-op
   * if that lease was already replaced).
   */
  readonly leaseLost: (binding: Binding<A>, lease: Resource.GlobalLease) => Effect.Effect<void>
  readonly recordAcquire: (millis: number) => Effect.Effect<void>
  readonly stats: Effect.Effect<PoolStats>
  readonly close: Effect.Effect<void>
}

/** How long to wait before asking an unreachable coordinator again (within the acquire wait). */
const coordinatorRetryMillis = 100

// ----- constructors -----

/** Builds a pool in the current scope (the manager's); closing that scope destroys every instance. */
export const make = Effect.fnUntraced(function*<A>(
  resource: Resource.Resource<A>,
  options: { readonly coordinator: Resource.Coordinator | undefined }
) {
  const { spec } = resource
  const managerScope = yield* Effect.scope
  const fibers = yield* FiberSet.make<unknown, never>()
  const pool = makeState(resource, options.coordinator, managerScope, fibers)

  // ----- background: periodic health checks, idle TTL -----
  if (spec.timeouts.healthIntervalMillis !== undefined) {
    yield* fork(pool, Effect.repeat(healthSweep(pool), Schedule.spaced(spec.timeouts.healthIntervalMillis)))
  }
  if (spec.pool.idleTtlMillis !== undefined) {
    const every = Schedule.spaced(Math.max(1, Math.floor(spec.pool.idleTtlMillis / 2)))
    yield* fork(pool, Effect.repeat(reapIdle(pool), every))
  }

  // ----- open: prewarm -----
  const warm: Array<Effect.Effect<void>> = []
  for (let i = 0; i < Math.max(spec.pool.prewarm, spec.pool.min); i++) {
    warm.push(startIdle(pool, newInstance(pool, undefined)))
  }
  yield* forkAll(pool, warm)

  const closePool = close(pool)
  yield* Effect.addFinalizer(() => closePool)

  return {
    resource,
    join: (key) => join(pool, key),
    leave: (binding) => leave(pool, binding),
    replace: (binding, instance) => replaceCrashed(pool, binding, instance),
    leaseLost: (binding, lease) => onGlobalLost(pool, binding, lease),
    recordAcquire: (millis) => recordAcquire(pool, millis),
    stats: Effect.sync(() => snapshot(pool)),
    close: closePool
  } satisfies Pool<A>
})

/** A pool's state with nothing in it yet; `make` is what opens it (sweeps, prewarm, finalizer). */
export const makeState = <A>(
  resource: Resource.Resource<A>,
  coordinator: Resource.Coordinator | undefined,
  managerScope: Scope.Scope,
  fibers: FiberSet.FiberSet<unknown, never>
): PoolState<A> => {
  const pool: PoolState<A> = {
    resource,
    name: resource.spec.name,
    coordinator,
    managerScope,
    fibers,
    instances: new Map(),
    idle: [],
    waiting: [],
    bindings: new Map(),
    closed: false,
    nextId: 0,
    counters: {
      starts: 0,
      failures: 0,
      crashes: 0,
      resets: 0,
      recreations: 0,
      acquires: 0,
      acquireMillisTotal: 0,
      acquireMillisMax: 0
    },
    recentWaits: makeWaitWindow(),
    metrics: makeMetrics(resource.spec.name),
    dispatch: Effect.suspend(() => Effect.andThen(forkAll(pool, assignWaiters(pool)), pool.publish)),
    publish: Effect.suspend(() => publishGauges(pool)),
    replenish: Effect.suspend(() => forkAll(pool, startMinimum(pool)))
  }
  return pool
}


/** Removes the instance from the books at once (its slot frees) and tears it down in the background. */
const destroy = <A>(pool: PoolState<A>, instance: Instance<A>): Effect.Effect<void> =>
  Effect.suspend(() => {
    pool.instances.delete(instance.id)
    const i = pool.idle.indexOf(instance)
    if (i >= 0) pool.idle.splice(i, 1)
    return Effect.andThen(
      fork(pool, Effect.ignore(Scope.close(instance.scope, Exit.void))),
      Effect.andThen(pool.dispatch, pool.replenish)
    )
  })

const start = <A>(pool: PoolState<A>, instance: Instance<A>): Effect.Effect<Exit.Exit<A, EnvError>> =>
  Effect.gen(function*() {
    const { launcher, spec } = pool.resource
    pool.counters.starts++
    yield* Metric.update(pool.metrics.starts, 1)
    yield* pool.publish
    return yield* launcher.start(spec, instance.id).pipe(
      Scope.provide(instance.scope),
      Effect.timeoutOrElse({
        duration: spec.timeouts.startMillis,
        orElse: () =>
          Effect.fail(envError(pool.name, "start", "Timeout", `start exceeded ${spec.timeouts.startMillis} ms`))
      }),
      Effect.exit
    )
  })

/** Health check with the spec's timeout; a timeout counts as a failure. */
const check = <A>(pool: PoolState<A>, instance: Instance<A>) => {
  const { launcher, spec } = pool.resource
  return launcher.health(instance.value as A).pipe(
    Effect.timeoutOrElse({
      duration: spec.timeouts.healthMillis,
      orElse: () =>
        Effect.fail(envError(pool.name, "health", "Timeout", `exceeded ${spec.timeouts.healthMillis} ms`))
    }),
    Effect.exit
  )
}

/** Start a fresh instance into a binding (a new key, or a replacement after a crash). */
const startInto = <A>(pool: PoolState<A>, binding: Binding<A>, instance: Instance<A>): Effect.Effect<void> =>
  Effect.gen(function*() {
    const exit = yield* start(pool, instance)
    if (Exit.isFailure(exit)) {
      yield* count(pool, "failures")
      pool.instances.delete(instance.id)
      yield* fork(pool, Effect.ignore(Scope.close(instance.scope, Exit.void)))
      const message = Option.match(Cause.findErrorOption(exit.cause), {
        onNone: () => Cause.pretty(exit.cause),
        onSome: (e) => e.message
      })
      return yield* failBinding(pool, binding, leaseError(pool, new Resource.StartFailed({ message })))
    }
    instance.value = exit.value
    return yield* complete(pool, binding, instance)
  })

/** Hand an idle instance to a binding, checking its health first; a failed check replaces it. */
const handOver = <A>(pool: PoolState<A>, binding: Binding<A>, instance: Instance<A>): Effect.Effect<void> =>
  Effect.gen(function*() {
    if (pool.resource.spec.healthCheckOnAcquire) {
      const exit = yield* check(pool, instance)
      if (Exit.isFailure(exit)) {
        yield* crashed(pool)
        pool.instances.delete(instance.id)
        yield* fork(pool, Effect.ignore(Scope.close(instance.scope, Exit.void)))
        const fresh = newInstance(pool, binding)
        binding.instance = fresh
        return yield* startInto(pool, binding, fresh)
      }
    }
    return yield* complete(pool, binding, instance)
  })

const failBinding = <A>(pool: PoolState<A>, binding: Binding<A>, error: Resource.LeaseError): Effect.Effect<void> =>
  Effect.gen(function*() {
    binding.status = "done"
    binding.instance = undefined
    binding.failure = error
    if (pool.bindings.get(binding.key) === binding) pool.bindings.delete(binding.key)
    if (binding.scope) yield* Scope.close(binding.scope, Exit.void)
    yield* Deferred.fail(binding.ready, error)
    yield* pool.dispatch
  })

/** The instance is ready for the binding: give it to the holders, or recycle it if they all left. */
const complete = <A>(pool: PoolState<A>, binding: Binding<A>, instance: Instance<A>): Effect.Effect<void> =>
  Effect.gen(function*() {
    if (pool.closed) {
      yield* destroy(pool, instance)
      return yield* failBinding(pool, binding, leaseError(pool, new Resource.PoolClosed()))
    }
    if (binding.holders === 0) {
      binding.status = "done"
      if (pool.bindings.get(binding.key) === binding) pool.bindings.delete(binding.key)
      if (binding.scope) yield* Scope.close(binding.scope, Exit.void)
      return yield* recycle(pool, instance)
    }
    if (binding.leaseLost) {
      // It started under a lease that is gone meanwhile: never hand it over; start again under a new lease.
      binding.leaseLost = false
      instance.leaseLost = true
      pool.instances.delete(instance.id)
      return yield* relet(pool, binding, instance)
    }
    instance.state = "leased"
    instance.binding = binding
    binding.instance = instance
    binding.status = "ready"
    yield* Deferred.succeed(binding.ready, instance)
    yield* pool.publish
  })

/** The last holder left: reset and return to the idle pool, or destroy. */
const recycle = <A>(pool: PoolState<A>, instance: Instance<A>): Effect.Effect<void> =>
  Effect.gen(function*() {
    const { launcher, spec } = pool.resource
    instance.binding = undefined
    if (pool.closed) return yield* destroy(pool, instance)
    if (instance.state === "unhealthy" || spec.resetPolicy === "recreate") {
      yield* count(pool, "recreations")
      return yield* destroy(pool, instance)
    }
    const exit = yield* launcher.reset(instance.value as A).pipe(
      Effect.timeoutOrElse({
        duration: spec.timeouts.resetMillis,
        orElse: () =>
          Effect.fail(envError(pool.name, "reset", "Timeout", `exceeded ${spec.timeouts.resetMillis} ms`))
      }),
      Effect.exit
    )
    if (Exit.isFailure(exit) || pool.closed || !pool.instances.has(instance.id)) {
      if (Exit.isFailure(exit)) {
        yield* Effect.andThen(count(pool, "failures"), pool.closed ? Effect.void : count(pool, "recreations"))
      }
      return yield* destroy(pool, instance)
    }
    yield* count(pool, "resets")
    instance.state = "idle"
    instance.idleSince = yield* Clock.currentTimeMillis
    pool.idle.push(instance)
    yield* pool.dispatch
    yield* pool.publish
  })

/** The starts that bring the pool up to `min` instances (each to run in the background). */
const startMinimum = <A>(pool: PoolState<A>): Array<Effect.Effect<void>> => {
  const work: Array<Effect.Effect<void>> = []
  while (!pool.closed && pool.instances.size < pool.resource.spec.pool.min) {
    work.push(startIdle(pool, newInstance(pool, undefined)))
  }
  return work
}

const startIdle = <A>(pool: PoolState<A>, instance: Instance<A>): Effect.Effect<void> =>
  Effect.gen(function*() {
    const exit = yield* start(pool, instance)
    if (Exit.isFailure(exit) || pool.closed) {
      if (Exit.isFailure(exit)) yield* count(pool, "failures")
      pool.instances.delete(instance.id)
      yield* Scope.close(instance.scope, Exit.void)
      return yield* pool.publish
    }
    instance.value = exit.value
    instance.state = "idle"
    instance.idleSince = yield* Clock.currentTimeMillis
    pool.idle.push(instance)
    yield* pool.dispatch
    yield* pool.publish
  })

// ----- global leases -----

/**
 * Acquire the binding's global lease (if the spec has a global cap), then run `next`. The wait is bounded by
 * `timeouts.acquireMillis`, within which an unreachable coordinator is asked again (a short outage or a restart
 * does not fail the binding). When the binding is reletting after losing `lost`, failing to get a new lease is
 * `LeaseLost` (the reason it could not get one is logged).
 */
const withGlobal = <A>(
  pool: PoolState<A>,
  binding: Binding<A>,
  next: Effect.Effect<void>,
  lost?: Resource.GlobalLease
): Effect.Effect<void> => {
  const coordinator = pool.coordinator
  const cap = pool.resource.spec.pool.globalMax
  if (coordinator === undefined || cap === undefined) return next
  return Effect.gen(function*() {
    const scope = yield* Scope.fork(pool.managerScope)
    binding.scope = scope
    const exit = yield* acquireGlobal(pool, coordinator, cap, binding).pipe(Scope.provide(scope), Effect.exit)
    if (Exit.isFailure(exit)) {
      const cause = Option.getOrElse(
        Cause.findErrorOption(exit.cause),
        () => leaseError(pool, new Resource.CoordinatorUnavailable({ message: Cause.pretty(exit.cause) }))
      )
      const leaseErr = lost === undefined ? cause : leaseError(
        pool,
        new Resource.LeaseLost({ slot: lost.slot, token: lost.token })
      )
      if (lost !== undefined) {
        yield* Effect.logWarning(`${pool.name}: lost lease ${lost.token} not relet: ${cause.message}`)
      }
      const assigned = binding.instance
      binding.instance = undefined
      if (assigned) {
        if (assigned.value === undefined) {
          pool.instances.delete(assigned.id)
          yield* fork(pool, Effect.ignore(Scope.close(assigned.scope, Exit.void)))
        } else {
          yield* fork(pool, recycle(pool, assigned))
        }
      }
      return yield* failBinding(pool, binding, leaseErr)
    }
    binding.global = exit.value
    return yield* next
  })
}

/** One grant from the coordinator, asked again while it is unreachable, all within `timeouts.acquireMillis`. */
const acquireGlobal = <A>(
  pool: PoolState<A>,
  coordinator: Resource.Coordinator,
  cap: number,
  binding: Binding<A>
): Effect.Effect<Resource.GlobalLease, Resource.LeaseError, Scope.Scope> =>
  Effect.gen(function*() {
    const deadline = (yield* Clock.currentTimeMillis) + pool.resource.spec.timeouts.acquireMillis
    while (true) {
      const now = yield* Clock.currentTimeMillis
      const exit = yield* Effect.exit(coordinator.acquire({
        resource: pool.name,
        cap,
        waitMillis: Math.max(1, deadline - now),
        onLost: (lease) => onGlobalLost(pool, binding, lease)
      }))
      if (Exit.isSuccess(exit)) return exit.value
      const error = Cause.findErrorOption(exit.cause)
      const after = yield* Clock.currentTimeMillis
      if (
        Option.isNone(error) || error.value.reason._tag !== "CoordinatorUnavailable" ||
        after + coordinatorRetryMillis >= deadline
      ) return yield* Effect.failCause(exit.cause)
      yield* Effect.sleep(coordinatorRetryMillis)
    }
  })

/**
 * The binding's global lease `lease` is lost: another holder may have the slot now, so its instance must stop.
 * A ready binding relets at once (its holders learn of it on their next use, as after a crash); one still
 * starting its instance relets when the start completes.
 */
const onGlobalLost = <A>(pool: PoolState<A>, binding: Binding<A>, lease: Resource.GlobalLease): Effect.Effect<void> =>
  Effect.suspend(() => {
    if (binding.global !== lease || binding.status === "done") return Effect.void
    if (binding.status !== "ready" || binding.instance === undefined) {
      binding.leaseLost = true
      return Effect.void
    }
    const instance = binding.instance
    instance.leaseLost = true
    instance.state = "unhealthy"
    pool.instances.delete(instance.id)
    binding.generation++
    binding.status = "assigning"
    binding.ready = Deferred.makeUnsafe()
    return Effect.all([crashed(pool), fork(pool, relet(pool, binding, instance)), pool.publish], { discard: true })
  })

/**
 * Start over under a new global lease: destroy `old` (it ran under the lost lease), give the lost lease back
 * (a compare-and-delete: a no-op if the slot is someone else's now), then acquire a new one and only then start
 * a fresh instance. The binding lets go of the lost lease at once (before the first step), so that a second
 * report of the same loss is ignored.
 */
const relet = <A>(pool: PoolState<A>, binding: Binding<A>, old: Instance<A>): Effect.Effect<void> => {
  const lost = binding.global!
  const scope = binding.scope
  binding.global = undefined
  binding.scope = undefined
  const fresh = newInstance(pool, binding)
  binding.instance = fresh
  return Effect.gen(function*() {
    yield* Effect.ignore(Scope.close(old.scope, Exit.void))
    if (scope) yield* Scope.close(scope, Exit.void)
    if (binding.holders === 0 || pool.closed) {
      // Everybody left meanwhile (or the pool closed): nothing to start.
      pool.instances.delete(fresh.id)
      yield* Effect.ignore(Scope.close(fresh.scope, Exit.void))
      const reason = pool.closed
        ? new Resource.PoolClosed()
        : new Resource.LeaseLost({ slot: lost.slot, token: lost.token })
      return yield* failBinding(pool, binding, leaseError(pool, reason))
    }
    return yield* withGlobal(pool, binding, startInto(pool, binding, fresh), lost)
  })
}

// ----- dispatch: give waiting bindings an idle instance or a free slot -----

/**
 * Takes waiting bindings in arrival order and gives each the most recently idled instance (to be handed over) or,
 * with none idle and a slot free, a fresh instance (to be started); stops at the first that can get neither, so
 * that nobody overtakes it. The state changes happen here, at once; the work returned (hand-overs and starts) is
 * for the pool's fibers to run.
 */
export const assignWaiters = <A>(pool: PoolState<A>): Array<Effect.Effect<void>> => {
  const work: Array<Effect.Effect<void>> = []
  const { waiting, idle } = pool
  while (waiting.length > 0 && !pool.closed) {
    const binding = waiting[0]!
    const instance = idle.pop()
    if (instance !== undefined) {
      waiting.shift()
      binding.status = "assigning"
      instance.state = "leased"
      instance.binding = binding
      binding.instance = instance
      work.push(withGlobal(pool, binding, handOver(pool, binding, instance)))
    } else if (pool.instances.size < pool.resource.spec.pool.max) {
      waiting.shift()
      binding.status = "assigning"
      const fresh = newInstance(pool, binding)
      binding.instance = fresh
      work.push(withGlobal(pool, binding, startInto(pool, binding, fresh)))
    } else {
      break
    }
  }
  return work
}

// ----- the holder-facing steps -----


/** Joins the live binding of `key`, or opens one and queues it for an instance. */
const join = <A>(pool: PoolState<A>, key: string): Effect.Effect<Binding<A>, Resource.LeaseError> =>
  Effect.suspend(() => {
    if (pool.closed) return Effect.fail(leaseError(pool, new Resource.PoolClosed()))
    const existing = pool.bindings.get(key)
    if (existing !== undefined && existing.status !== "done") {
      existing.holders++
      return Effect.succeed(existing)
    }
    const binding = newBinding<A>(key)
    pool.bindings.set(key, binding)
    pool.waiting.push(binding)
    return Effect.as(pool.dispatch, binding)
  })

/** A holder lets go; the last one out gives the binding's instance back (reset or destroyed in the background). */
const leave = <A>(pool: PoolState<A>, binding: Binding<A>): Effect.Effect<void> =>
  Effect.suspend(() => {
    binding.holders--
    if (binding.holders > 0) return Effect.void
    if (binding.status === "waiting") {
      binding.status = "done"
      const i = pool.waiting.indexOf(binding)
      if (i >= 0) pool.waiting.splice(i, 1)
      if (pool.bindings.get(binding.key) === binding) pool.bindings.delete(binding.key)
      return pool.publish
    }
    if (binding.status !== "ready") {
      // Still assigning (starting, checking, waiting for a global slot): the assigning fiber sees holders === 0
      // and recycles the instance. Detach the binding now, so that a new holder of the key starts afresh
      // instead of joining a wait that nobody is part of any more (and inheriting its timeout).
      if (pool.bindings.get(binding.key) === binding) pool.bindings.delete(binding.key)
      return Effect.void
    }
    binding.status = "done"
    if (pool.bindings.get(binding.key) === binding) pool.bindings.delete(binding.key)
    const instance = binding.instance!
    if (instance.state === "leased") instance.state = "resetting"
    const closeGlobal = binding.scope ? Scope.close(binding.scope, Exit.void) : Effect.void
    return Effect.andThen(pool.publish, fork(pool, Effect.andThen(closeGlobal, recycle(pool, instance))))
  })

/** Replace a crashed instance of `binding` with a fresh one (no-op if it was already replaced). */
const replaceCrashed = <A>(pool: PoolState<A>, binding: Binding<A>, instance: Instance<A>): Effect.Effect<void> =>
  Effect.suspend(() => {
    if (binding.instance !== instance || binding.status !== "ready") return Effect.void
    instance.state = "unhealthy"
    pool.instances.delete(instance.id)
    binding.generation++
    binding.status = "assigning"
    binding.ready = Deferred.makeUnsafe()
    const fresh = newInstance(pool, binding)
    binding.instance = fresh
    return Effect.all([
      crashed(pool),
      fork(pool, Effect.ignore(Scope.close(instance.scope, Exit.void))),
      fork(pool, startInto(pool, binding, fresh)),
      pool.publish
    ], { discard: true })
  })

// ----- background: periodic health checks, idle TTL -----

/** Checks every idle or leased instance: a dead idle one is destroyed, a dead leased one replaced. */
const healthSweep = <A>(pool: PoolState<A>): Effect.Effect<void> =>
  Effect.gen(function*() {
    const candidates = [...pool.instances.values()].filter((i) => i.state === "idle" || i.state === "leased")
    yield* Effect.forEach(candidates, (instance) =>
      Effect.gen(function*() {
        const exit = yield* check(pool, instance)
        if (Exit.isSuccess(exit) || !pool.instances.has(instance.id)) return
        if (instance.state === "idle") {
          yield* crashed(pool)
          return yield* destroy(pool, instance)
        }
        // Leased: the holder learns on its next use (typed Crashed error) and gets a fresh instance.
        if (instance.binding !== undefined) yield* replaceCrashed(pool, instance.binding, instance)
      }), { concurrency: 4, discard: true })
  })

/** Destroys instances idle for `pool.idleTtlMillis` or longer, down to `pool.min` instances. */
const reapIdle = <A>(pool: PoolState<A>): Effect.Effect<void> =>
  Effect.gen(function*() {
    const { spec } = pool.resource
    const ttl = spec.pool.idleTtlMillis!
    const now = yield* Clock.currentTimeMillis
    const expired = pool.idle.filter((i) => now - i.idleSince >= ttl)
    const excess = Math.max(0, pool.instances.size - spec.pool.min)
    for (const instance of expired.slice(0, excess)) yield* destroy(pool, instance)
  })

// ----- close -----

/** Fails every waiting binding with `PoolClosed` and destroys the idle instances; the others go as they return. */
const close = <A>(pool: PoolState<A>): Effect.Effect<void> =>
  Effect.gen(function*() {
    if (pool.closed) return
    pool.closed = true
    const waiters = pool.waiting.splice(0)
    for (const binding of waiters) {
      binding.status = "done"
      pool.bindings.delete(binding.key)
      yield* Deferred.fail(binding.ready, leaseError(pool, new Resource.PoolClosed()))
    }
    for (const instance of [...pool.idle]) yield* destroy(pool, instance)
    yield* pool.publish
  })
