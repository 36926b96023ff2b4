/**
 * The books of one resource pool (`resourcePool.ts`): its state record, the instance and binding records it holds,
 * and what it counts and publishes (counters, metrics, the {@link PoolStats} snapshot). Every step of the pool is a
 * function over a {@link PoolState} in `resourcePool.ts`; this module holds no step, only the records, their
 * constructors and the bookkeeping the steps share.
 */
import { Deferred, Effect, FiberSet, Metric, Scope } from "effect"
import { envError as makeEnvError } from "../../src/Environment.ts"
import type { EnvError } from "../../src/Environment.ts"
import * as Resource from "../../src/Resource.ts"
import { quantile, recordWait, waits } from "./waitWindow.ts"
import type { WaitWindow } from "./waitWindow.ts"

export type InstanceState = "starting" | "idle" | "leased" | "resetting" | "unhealthy"

export interface Instance<A> {
  readonly id: string
  readonly scope: Scope.Closeable
  value: A | undefined
  state: InstanceState
  idleSince: number
  binding: Binding<A> | undefined
  /** Its binding's global lease was lost while it ran: a call in flight must not report success. */
  leaseLost: boolean
}

export interface Binding<A> {
  readonly key: string
  holders: number
  status: "waiting" | "assigning" | "ready" | "done"
  ready: Deferred.Deferred<Instance<A>, Resource.LeaseError>
  instance: Instance<A> | undefined
  /** Bumped each time the instance is replaced after a crash. */
  generation: number
  /** Holds the global (coordinator) lease while the binding lives. */
  scope: Scope.Closeable | undefined
  /** The global lease the instance runs under; `undefined` while none is held (before a grant, while reletting). */
  global: Resource.GlobalLease | undefined
  /** The global lease was lost while the instance was still starting: it must not be handed over. */
  leaseLost: boolean
  /** Why the binding ended, if it failed: every later use fails with it. */
  failure: Resource.LeaseError | undefined
}

/**
 * Instances by state (starting, idle, leased, resetting, unhealthy), waiters, starts, failures, crashes, what
 * releases did (reset or recreate), and acquire latency. Also published as metrics (`env/<name>/instances{state}`,
 * `env/<name>/waiters`, `env/<name>/starts`, `env/<name>/failures`, `env/<name>/crashes`, `env/<name>/resets`,
 * `env/<name>/recreations`, `env/<name>/acquire_ms`).
 */
export interface PoolStats {
  readonly starting: number
  readonly idle: number
  readonly leased: number
  /** Released by their last holder, being reset for reuse (or torn down). */
  readonly resetting: number
  readonly unhealthy: number
  readonly waiters: number
  readonly starts: number
  /** Starts, resets and health checks that failed, and crashes. */
  readonly failures: number
  /**
   * Instances found dead and replaced or destroyed: a crash in use, a failed health check (on acquire or
   * periodic), a holder's `invalidate`, or a lost global lease.
   */
  readonly crashes: number
  /** Releases whose instance was reset and went back to the idle pool for reuse. */
  readonly resets: number
  /**
   * Releases whose instance was destroyed instead of reused (policy `recreate`, found unhealthy, or its reset
   * failed); the next acquire starts a fresh one. Not counted when the pool is closing.
   */
  readonly recreations: number
  readonly acquires: number
  readonly acquireMillisTotal: number
  readonly acquireMillisMax: number
  /** Acquire-wait percentiles (nearest rank) over the last {@link waitWindowSize} acquires; 0 before the first. */
  readonly acquireMillisP50: number
  readonly acquireMillisP99: number
  readonly closed: boolean
}


/**
 * Everything one pool knows, as plain mutable fields: every step in `resourcePool.ts` is a function over it. Built
 * by its `makeState`; its `make` adds the background sweeps, the prewarm and the finalizer.
 */
export interface PoolState<A> {
  readonly resource: Resource.Resource<A>
  readonly name: string
  readonly coordinator: Resource.Coordinator | undefined
  /** The manager's scope: every instance's scope and every global lease's scope is forked from it. */
  readonly managerScope: Scope.Scope
  /** The pool's own fibers (starts, resets, health checks, teardown), never the waiting chains'. */
  readonly fibers: FiberSet.FiberSet<unknown, never>
  /** Every instance that holds a slot, by id. */
  readonly instances: Map<string, Instance<A>>
  /** Idle instances; the last one (the most recently idled) is handed out first. */
  readonly idle: Array<Instance<A>>
  /** Bindings waiting for an instance or a free slot, in arrival order. */
  readonly waiting: Array<Binding<A>>
  /** The live binding of each sharing key. */
  readonly bindings: Map<string, Binding<A>>
  /** Set once by `close`: from then on nothing is assigned or started, and what comes back is destroyed. */
  closed: boolean
  nextId: number
  readonly counters: Counters
  readonly recentWaits: WaitWindow
  readonly metrics: PoolMetrics
  /** `assignWaiters`, then the work forked: built once, as the lease path runs it at every step. */
  readonly dispatch: Effect.Effect<void>
  /** The gauges set from a {@link snapshot}: built once, as the lease path runs it several times per acquire. */
  readonly publish: Effect.Effect<void>
  /** Keep `min` instances (started idle, in the background). */
  readonly replenish: Effect.Effect<void>
}

/** The counting part of {@link PoolStats}. */
export interface Counters {
  starts: number
  failures: number
  crashes: number
  resets: number
  recreations: number
  acquires: number
  acquireMillisTotal: number
  acquireMillisMax: number
}

export type PoolEvent = "failures" | "crashes" | "resets" | "recreations"

export interface PoolMetrics {
  readonly gauges: Record<InstanceState | "waiters", Metric.Gauge<number>>
  readonly starts: Metric.Counter<number>
  readonly events: Record<PoolEvent, Metric.Counter<number>>
  readonly acquireMillis: Metric.Histogram<number>
}

export const envError = (env: string, method: string, reason: EnvError["reason"]["_tag"], message: string) =>
  makeEnvError(env, method, reason, message)

export const leaseError = <A>(pool: PoolState<A>, reason: Resource.LeaseErrorReason) =>
  new Resource.LeaseError({ resource: pool.name, reason })

/** Runs `effect` in one of the pool's own fibers. */
export const fork = <A, X>(pool: PoolState<A>, effect: Effect.Effect<X>) =>
  Effect.asVoid(FiberSet.run(pool.fibers, effect))

/** Forks each of `work`, in order. A loop rather than a closure per call: the lease path dispatches at every step. */
export const forkAll = <A>(pool: PoolState<A>, work: ReadonlyArray<Effect.Effect<void>>): Effect.Effect<void> => {
  let all: Effect.Effect<void> = Effect.void
  for (const effect of work) all = Effect.andThen(all, fork(pool, effect))
  return all
}


// ----- metrics -----

export const makeMetrics = (name: string): PoolMetrics => {
  const attributes = { resource: name }
  const instances = (state: InstanceState) =>
    Metric.gauge(`env/${name}/instances`, { attributes: { ...attributes, state } })
  const counter = (event: string) => Metric.counter(`env/${name}/${event}`, { attributes, incremental: true })
  return {
    gauges: {
      starting: instances("starting"),
      idle: instances("idle"),
      leased: instances("leased"),
      resetting: instances("resetting"),
      unhealthy: instances("unhealthy"),
      waiters: Metric.gauge(`env/${name}/waiters`, { attributes })
    },
    starts: counter("starts"),
    events: {
      failures: counter("failures"),
      crashes: counter("crashes"),
      resets: counter("resets"),
      recreations: counter("recreations")
    },
    acquireMillis: Metric.histogram(`env/${name}/acquire_ms`, {
      attributes,
      boundaries: Metric.exponentialBoundaries({ start: 0.5, factor: 2, count: 18 })
    })
  }
}

export const snapshot = <A>(pool: PoolState<A>): PoolStats => {
  const by = { starting: 0, idle: 0, leased: 0, resetting: 0, unhealthy: 0 }
  for (const instance of pool.instances.values()) by[instance.state]++
  const recent = waits(pool.recentWaits)
  return {
    ...by,
    waiters: pool.waiting.length,
    ...pool.counters,
    acquireMillisP50: quantile(recent, 0.5),
    acquireMillisP99: quantile(recent, 0.99),
    closed: pool.closed
  }
}

export const publishGauges = <A>(pool: PoolState<A>): Effect.Effect<void> => {
  const s = snapshot(pool)
  const { gauges } = pool.metrics
  return Effect.all([
    Metric.update(gauges.starting, s.starting),
    Metric.update(gauges.idle, s.idle),
    Metric.update(gauges.leased, s.leased),
    Metric.update(gauges.resetting, s.resetting),
    Metric.update(gauges.unhealthy, s.unhealthy),
    Metric.update(gauges.waiters, s.waiters)
  ], { discard: true })
}

export const count = <A>(pool: PoolState<A>, event: PoolEvent): Effect.Effect<void> =>
  Effect.suspend(() => {
    pool.counters[event]++
    return Metric.update(pool.metrics.events[event], 1)
  })

/** An instance found dead: a crash is also a failure. */
export const crashed = <A>(pool: PoolState<A>): Effect.Effect<void> =>
  Effect.andThen(count(pool, "crashes"), count(pool, "failures"))

export const recordAcquire = <A>(pool: PoolState<A>, millis: number): Effect.Effect<void> =>
  Effect.suspend(() => {
    const { counters } = pool
    counters.acquires++
    counters.acquireMillisTotal += millis
    counters.acquireMillisMax = Math.max(counters.acquireMillisMax, millis)
    recordWait(pool.recentWaits, millis)
    return Metric.update(pool.metrics.acquireMillis, millis)
  })

/** A new instance (state `starting`) holding a slot from now on; `binding` is whom it starts for, if anyone. */
export const newInstance = <A>(pool: PoolState<A>, binding: Binding<A> | undefined): Instance<A> => {
  const instance: Instance<A> = {
    id: `${pool.name}-${pool.nextId++}`,
    scope: Scope.forkUnsafe(pool.managerScope),
    value: undefined,
    state: "starting",
    idleSince: 0,
    binding,
    leaseLost: false
  }
  pool.instances.set(instance.id, instance)
  return instance
}

/** A new binding of `key`, waiting, with one holder. */
export const newBinding = <A>(key: string): Binding<A> => ({
  key,
  holders: 1,
  status: "waiting",
  ready: Deferred.makeUnsafe(),
  instance: undefined,
  generation: 0,
  scope: undefined,
  global: undefined,
  leaseLost: false,
  failure: undefined
})
