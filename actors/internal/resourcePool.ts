/**
 * The state machine of one resource pool (one spec). Every decision is a synchronous step over plain mutable state
 * (fibers are cooperative, so a step is atomic); the slow work (start, reset, health check, destroy) runs in
 * fibers owned by the pool, never by the chains that wait for it, so interrupting a chain cannot leave a
 * half-started instance behind.
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
import { EnvError } from "../../src/Environment.ts"
import * as Resource from "../../src/Resource.ts"

type InstanceState = "starting" | "idle" | "leased" | "resetting" | "unhealthy"

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

// ----- acquire-wait window -----

/** How many of the most recent acquire waits the percentiles of {@link PoolStats} are computed over. */
export const waitWindowSize = 1024

/** A ring buffer of the most recent acquire waits, in milliseconds. */
export interface WaitWindow {
  readonly values: Float64Array
  size: number
  next: number
}

export const makeWaitWindow = (capacity: number = waitWindowSize): WaitWindow => ({
  values: new Float64Array(capacity),
  size: 0,
  next: 0
})

/** Records one wait, overwriting the oldest once the window is full. */
export const recordWait = (window: WaitWindow, millis: number): void => {
  window.values[window.next] = millis
  window.next = (window.next + 1) % window.values.length
  window.size = Math.min(window.size + 1, window.values.length)
}

/** The waits held by the window (oldest first is not guaranteed: order does not matter to a quantile). */
export const waits = (window: WaitWindow): Float64Array => window.values.subarray(0, window.size)

/**
 * The `q`-quantile of `values` by nearest rank: the smallest value such that at least `q · n` of the `n` values are
 * at or below it (`q = 0.5` is the lower median, `q = 1` the maximum); 0 when there are no values.
 *
 * Quickselect (Hoare partition, median-of-three pivot) on a copy: expected O(n), `values` is left untouched.
 */
export const quantile = (values: ArrayLike<number>, q: number): number => {
  const n = values.length
  if (n === 0) return 0
  // The tolerance keeps q · n that should be an integer (0.07 · 100 = 7.000000000000001) from rounding up a rank.
  const k = Math.min(n, Math.max(1, Math.ceil(q * n - 1e-9))) - 1
  const a = Float64Array.from(values)
  let lo = 0
  let hi = n - 1
  while (lo < hi) {
    const x = a[lo]!
    const y = a[(lo + hi) >>> 1]!
    const z = a[hi]!
    const pivot = x < y ? (y < z ? y : x < z ? z : x) : (x < z ? x : y < z ? z : y)
    let i = lo
    let j = hi
    while (i <= j) {
      while (a[i]! < pivot) i++
      while (a[j]! > pivot) j--
      if (i <= j) {
        const t = a[i]!
        a[i++] = a[j]!
        a[j--] = t
      }
    }
    // Now a[lo..j] <= pivot <= a[i..hi], and everything strictly between j and i equals the pivot.
    if (k <= j) hi = j
    else if (k >= i) lo = i
    else return a[k]!
  }
  return a[k]!
}

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

const envError = (env: string, method: string, reason: EnvError["reason"], message: string) =>
  new EnvError({ env, method, reason, message })

/** Builds a pool in the current scope (the manager's); closing that scope destroys every instance. */
export const make = Effect.fnUntraced(function*<A>(
  resource: Resource.Resource<A>,
  options: { readonly coordinator: Resource.Coordinator | undefined }
) {
  const { backend, spec } = resource
  const name = spec.name
  const managerScope = yield* Effect.scope
  const fibers = yield* FiberSet.make<unknown, never>()
  const instances = new Map<string, Instance<A>>()
  const idle: Array<Instance<A>> = []
  const waiting: Array<Binding<A>> = []
  const bindings = new Map<string, Binding<A>>()
  let closed = false
  let nextId = 0
  const counters = {
    starts: 0,
    failures: 0,
    crashes: 0,
    resets: 0,
    recreations: 0,
    acquires: 0,
    acquireMillisTotal: 0,
    acquireMillisMax: 0
  }
  const recentWaits = makeWaitWindow()

  const leaseError = (reason: Resource.LeaseErrorReason) => new Resource.LeaseError({ resource: name, reason })
  const fork = <X>(effect: Effect.Effect<X>) => Effect.asVoid(FiberSet.run(fibers, effect))
  const forkAll = (work: ReadonlyArray<Effect.Effect<void>>) => Effect.forEach(work, fork, { discard: true })

  // ----- metrics -----
  const attributes = { resource: name }
  const gauges = {
    starting: Metric.gauge(`env/${name}/instances`, { attributes: { ...attributes, state: "starting" } }),
    idle: Metric.gauge(`env/${name}/instances`, { attributes: { ...attributes, state: "idle" } }),
    leased: Metric.gauge(`env/${name}/instances`, { attributes: { ...attributes, state: "leased" } }),
    resetting: Metric.gauge(`env/${name}/instances`, { attributes: { ...attributes, state: "resetting" } }),
    unhealthy: Metric.gauge(`env/${name}/instances`, { attributes: { ...attributes, state: "unhealthy" } }),
    waiters: Metric.gauge(`env/${name}/waiters`, { attributes })
  }
  const startsCounter = Metric.counter(`env/${name}/starts`, { attributes, incremental: true })
  const eventCounters = {
    failures: Metric.counter(`env/${name}/failures`, { attributes, incremental: true }),
    crashes: Metric.counter(`env/${name}/crashes`, { attributes, incremental: true }),
    resets: Metric.counter(`env/${name}/resets`, { attributes, incremental: true }),
    recreations: Metric.counter(`env/${name}/recreations`, { attributes, incremental: true })
  }
  const acquireHistogram = Metric.histogram(`env/${name}/acquire_ms`, {
    attributes,
    boundaries: Metric.exponentialBoundaries({ start: 0.5, factor: 2, count: 18 })
  })

  const snapshot = (): PoolStats => {
    const by = { starting: 0, idle: 0, leased: 0, resetting: 0, unhealthy: 0 }
    for (const instance of instances.values()) by[instance.state]++
    const recent = waits(recentWaits)
    return {
      ...by,
      waiters: waiting.length,
      ...counters,
      acquireMillisP50: quantile(recent, 0.5),
      acquireMillisP99: quantile(recent, 0.99),
      closed
    }
  }
  const publish = Effect.suspend(() => {
    const s = snapshot()
    return Effect.all([
      Metric.update(gauges.starting, s.starting),
      Metric.update(gauges.idle, s.idle),
      Metric.update(gauges.leased, s.leased),
      Metric.update(gauges.resetting, s.resetting),
      Metric.update(gauges.unhealthy, s.unhealthy),
      Metric.update(gauges.waiters, s.waiters)
    ], { discard: true })
  })
  const count = (event: keyof typeof eventCounters): Effect.Effect<void> =>
    Effect.suspend(() => {
      counters[event]++
      return Metric.update(eventCounters[event], 1)
    })
  const failed = count("failures")
  /** An instance found dead: a crash is also a failure. */
  const crashed = Effect.andThen(count("crashes"), failed)

  // ----- instance lifecycle -----
  const newInstance = (binding: Binding<A> | undefined): Instance<A> => {
    const instance: Instance<A> = {
      id: `${name}-${nextId++}`,
      scope: Scope.forkUnsafe(managerScope),
      value: undefined,
      state: "starting",
      idleSince: 0,
      binding,
      leaseLost: false
    }
    instances.set(instance.id, instance)
    return instance
  }

  /** Removes the instance from the books at once (its slot frees) and tears it down in the background. */
  const destroy = (instance: Instance<A>): Effect.Effect<void> =>
    Effect.suspend(() => {
      instances.delete(instance.id)
      const i = idle.indexOf(instance)
      if (i >= 0) idle.splice(i, 1)
      return Effect.andThen(
        fork(Effect.ignore(Scope.close(instance.scope, Exit.void))),
        Effect.andThen(dispatch, replenish)
      )
    })

  const start = (instance: Instance<A>): Effect.Effect<Exit.Exit<A, EnvError>> =>
    Effect.gen(function*() {
      counters.starts++
      yield* Metric.update(startsCounter, 1)
      yield* publish
      return yield* backend.start(spec, instance.id).pipe(
        Scope.provide(instance.scope),
        Effect.timeoutOrElse({
          duration: spec.timeouts.startMillis,
          orElse: () =>
            Effect.fail(envError(name, "start", "Timeout", `start exceeded ${spec.timeouts.startMillis} ms`))
        }),
        Effect.exit
      )
    })

  /** Health check with the spec's timeout; a timeout counts as a failure. */
  const check = (instance: Instance<A>) =>
    backend.health(instance.value as A).pipe(
      Effect.timeoutOrElse({
        duration: spec.timeouts.healthMillis,
        orElse: () =>
          Effect.fail(envError(name, "health", "Timeout", `exceeded ${spec.timeouts.healthMillis} ms`))
      }),
      Effect.exit
    )

  /** Start a fresh instance into a binding (a new key, or a replacement after a crash). */
  const startInto = (binding: Binding<A>, instance: Instance<A>): Effect.Effect<void> =>
    Effect.gen(function*() {
      const exit = yield* start(instance)
      if (Exit.isFailure(exit)) {
        yield* failed
        instances.delete(instance.id)
        yield* fork(Effect.ignore(Scope.close(instance.scope, Exit.void)))
        const message = Option.match(Cause.findErrorOption(exit.cause), {
          onNone: () => Cause.pretty(exit.cause),
          onSome: (e) => e.message
        })
        return yield* failBinding(binding, leaseError(new Resource.StartFailed({ message })))
      }
      instance.value = exit.value
      return yield* complete(binding, instance)
    })

  /** Hand an idle instance to a binding, checking its health first; a failed check replaces it. */
  const handOver = (binding: Binding<A>, instance: Instance<A>): Effect.Effect<void> =>
    Effect.gen(function*() {
      if (spec.healthCheckOnAcquire) {
        const exit = yield* check(instance)
        if (Exit.isFailure(exit)) {
          yield* crashed
          instances.delete(instance.id)
          yield* fork(Effect.ignore(Scope.close(instance.scope, Exit.void)))
          const fresh = newInstance(binding)
          binding.instance = fresh
          return yield* startInto(binding, fresh)
        }
      }
      return yield* complete(binding, instance)
    })

  const failBinding = (binding: Binding<A>, error: Resource.LeaseError): Effect.Effect<void> =>
    Effect.gen(function*() {
      binding.status = "done"
      binding.instance = undefined
      binding.failure = error
      if (bindings.get(binding.key) === binding) bindings.delete(binding.key)
      if (binding.scope) yield* Scope.close(binding.scope, Exit.void)
      yield* Deferred.fail(binding.ready, error)
      yield* dispatch
    })

  /** The instance is ready for the binding: give it to the holders, or recycle it if they all left. */
  const complete = (binding: Binding<A>, instance: Instance<A>): Effect.Effect<void> =>
    Effect.gen(function*() {
      if (closed) {
        yield* destroy(instance)
        return yield* failBinding(binding, leaseError(new Resource.PoolClosed()))
      }
      if (binding.holders === 0) {
        binding.status = "done"
        if (bindings.get(binding.key) === binding) bindings.delete(binding.key)
        if (binding.scope) yield* Scope.close(binding.scope, Exit.void)
        return yield* recycle(instance)
      }
      if (binding.leaseLost) {
        // It started under a lease that is gone meanwhile: never hand it over; start again under a new lease.
        binding.leaseLost = false
        instance.leaseLost = true
        instances.delete(instance.id)
        return yield* relet(binding, instance)
      }
      instance.state = "leased"
      instance.binding = binding
      binding.instance = instance
      binding.status = "ready"
      yield* Deferred.succeed(binding.ready, instance)
      yield* publish
    })

  /** The last holder left: reset and return to the idle pool, or destroy. */
  const recycle = (instance: Instance<A>): Effect.Effect<void> =>
    Effect.gen(function*() {
      instance.binding = undefined
      if (closed) return yield* destroy(instance)
      if (instance.state === "unhealthy" || spec.resetPolicy === "recreate") {
        yield* count("recreations")
        return yield* destroy(instance)
      }
      const exit = yield* backend.reset(instance.value as A).pipe(
        Effect.timeoutOrElse({
          duration: spec.timeouts.resetMillis,
          orElse: () =>
            Effect.fail(envError(name, "reset", "Timeout", `exceeded ${spec.timeouts.resetMillis} ms`))
        }),
        Effect.exit
      )
      if (Exit.isFailure(exit) || closed || !instances.has(instance.id)) {
        if (Exit.isFailure(exit)) yield* Effect.andThen(failed, closed ? Effect.void : count("recreations"))
        return yield* destroy(instance)
      }
      yield* count("resets")
      instance.state = "idle"
      instance.idleSince = yield* Clock.currentTimeMillis
      idle.push(instance)
      yield* dispatch
      yield* publish
    })

  /** Keep `min` instances (started idle, in the background). */
  const replenish: Effect.Effect<void> = Effect.suspend(() => {
    const work: Array<Effect.Effect<void>> = []
    while (!closed && instances.size < spec.pool.min) work.push(startIdle(newInstance(undefined)))
    return forkAll(work)
  })

  const startIdle = (instance: Instance<A>): Effect.Effect<void> =>
    Effect.gen(function*() {
      const exit = yield* start(instance)
      if (Exit.isFailure(exit) || closed) {
        if (Exit.isFailure(exit)) yield* failed
        instances.delete(instance.id)
        yield* Scope.close(instance.scope, Exit.void)
        return yield* publish
      }
      instance.value = exit.value
      instance.state = "idle"
      instance.idleSince = yield* Clock.currentTimeMillis
      idle.push(instance)
      yield* dispatch
      yield* publish
    })

  /**
   * Acquire the binding's global lease (if the spec has a global cap), then run `next`. The wait is bounded by
   * `timeouts.acquireMillis`, within which an unreachable coordinator is asked again (a short outage or a restart
   * does not fail the binding). When the binding is reletting after losing `lost`, failing to get a new lease is
   * `LeaseLost` (the reason it could not get one is logged).
   */
  const withGlobal = (
    binding: Binding<A>,
    next: Effect.Effect<void>,
    lost?: Resource.GlobalLease
  ): Effect.Effect<void> => {
    const coordinator = options.coordinator
    const cap = spec.pool.globalMax
    if (coordinator === undefined || cap === undefined) return next
    return Effect.gen(function*() {
      const scope = yield* Scope.fork(managerScope)
      binding.scope = scope
      const exit = yield* acquireGlobal(coordinator, cap, binding).pipe(Scope.provide(scope), Effect.exit)
      if (Exit.isFailure(exit)) {
        const cause = Option.getOrElse(
          Cause.findErrorOption(exit.cause),
          () => leaseError(new Resource.CoordinatorUnavailable({ message: Cause.pretty(exit.cause) }))
        )
        const leaseErr = lost === undefined ? cause : leaseError(
          new Resource.LeaseLost({ slot: lost.slot, token: lost.token })
        )
        if (lost !== undefined) {
          yield* Effect.logWarning(`${name}: lost lease ${lost.token} not relet: ${cause.message}`)
        }
        const assigned = binding.instance
        binding.instance = undefined
        if (assigned) {
          if (assigned.value === undefined) {
            instances.delete(assigned.id)
            yield* fork(Effect.ignore(Scope.close(assigned.scope, Exit.void)))
          } else {
            yield* fork(recycle(assigned))
          }
        }
        return yield* failBinding(binding, leaseErr)
      }
      binding.global = exit.value
      return yield* next
    })
  }

  /** One grant from the coordinator, asked again while it is unreachable, all within `timeouts.acquireMillis`. */
  const acquireGlobal = (
    coordinator: Resource.Coordinator,
    cap: number,
    binding: Binding<A>
  ): Effect.Effect<Resource.GlobalLease, Resource.LeaseError, Scope.Scope> =>
    Effect.gen(function*() {
      const deadline = (yield* Clock.currentTimeMillis) + spec.timeouts.acquireMillis
      while (true) {
        const now = yield* Clock.currentTimeMillis
        const exit = yield* Effect.exit(coordinator.acquire({
          resource: name,
          cap,
          waitMillis: Math.max(1, deadline - now),
          onLost: (lease) => onGlobalLost(binding, lease)
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
  const onGlobalLost = (binding: Binding<A>, lease: Resource.GlobalLease): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (binding.global !== lease || binding.status === "done") return Effect.void
      if (binding.status !== "ready" || binding.instance === undefined) {
        binding.leaseLost = true
        return Effect.void
      }
      const instance = binding.instance
      instance.leaseLost = true
      instance.state = "unhealthy"
      instances.delete(instance.id)
      binding.generation++
      binding.status = "assigning"
      binding.ready = Deferred.makeUnsafe()
      return Effect.all([crashed, fork(relet(binding, instance)), publish], { discard: true })
    })

  /**
   * Start over under a new global lease: destroy `old` (it ran under the lost lease), give the lost lease back
   * (a compare-and-delete: a no-op if the slot is someone else's now), then acquire a new one and only then start
   * a fresh instance. The binding lets go of the lost lease at once (before the first step), so that a second
   * report of the same loss is ignored.
   */
  const relet = (binding: Binding<A>, old: Instance<A>): Effect.Effect<void> => {
    const lost = binding.global!
    const scope = binding.scope
    binding.global = undefined
    binding.scope = undefined
    const fresh = newInstance(binding)
    binding.instance = fresh
    return Effect.gen(function*() {
      yield* Effect.ignore(Scope.close(old.scope, Exit.void))
      if (scope) yield* Scope.close(scope, Exit.void)
      if (binding.holders === 0 || closed) {
        // Everybody left meanwhile (or the pool closed): nothing to start.
        instances.delete(fresh.id)
        yield* Effect.ignore(Scope.close(fresh.scope, Exit.void))
        const reason = closed
          ? new Resource.PoolClosed()
          : new Resource.LeaseLost({ slot: lost.slot, token: lost.token })
        return yield* failBinding(binding, leaseError(reason))
      }
      return yield* withGlobal(binding, startInto(binding, fresh), lost)
    })
  }

  // ----- dispatch: give waiting bindings an idle instance or a free slot -----
  const dispatch: Effect.Effect<void> = Effect.suspend(() => {
    const work: Array<Effect.Effect<void>> = []
    while (waiting.length > 0 && !closed) {
      const binding = waiting[0]!
      const instance = idle.pop()
      if (instance !== undefined) {
        waiting.shift()
        binding.status = "assigning"
        instance.state = "leased"
        instance.binding = binding
        binding.instance = instance
        work.push(withGlobal(binding, handOver(binding, instance)))
      } else if (instances.size < spec.pool.max) {
        waiting.shift()
        binding.status = "assigning"
        const fresh = newInstance(binding)
        binding.instance = fresh
        work.push(withGlobal(binding, startInto(binding, fresh)))
      } else {
        break
      }
    }
    return Effect.andThen(forkAll(work), publish)
  })

  // ----- the holder-facing steps -----
  const join = (key: string): Effect.Effect<Binding<A>, Resource.LeaseError> =>
    Effect.suspend(() => {
      if (closed) return Effect.fail(leaseError(new Resource.PoolClosed()))
      const existing = bindings.get(key)
      if (existing !== undefined && existing.status !== "done") {
        existing.holders++
        return Effect.succeed(existing)
      }
      const binding: Binding<A> = {
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
      }
      bindings.set(key, binding)
      waiting.push(binding)
      return Effect.as(dispatch, binding)
    })

  const leave = (binding: Binding<A>): Effect.Effect<void> =>
    Effect.suspend(() => {
      binding.holders--
      if (binding.holders > 0) return Effect.void
      if (binding.status === "waiting") {
        binding.status = "done"
        const i = waiting.indexOf(binding)
        if (i >= 0) waiting.splice(i, 1)
        if (bindings.get(binding.key) === binding) bindings.delete(binding.key)
        return publish
      }
      if (binding.status !== "ready") {
        // Still assigning (starting, checking, waiting for a global slot): the assigning fiber sees holders === 0
        // and recycles the instance. Detach the binding now, so that a new holder of the key starts afresh
        // instead of joining a wait that nobody is part of any more (and inheriting its timeout).
        if (bindings.get(binding.key) === binding) bindings.delete(binding.key)
        return Effect.void
      }
      binding.status = "done"
      if (bindings.get(binding.key) === binding) bindings.delete(binding.key)
      const instance = binding.instance!
      if (instance.state === "leased") instance.state = "resetting"
      const closeGlobal = binding.scope ? Scope.close(binding.scope, Exit.void) : Effect.void
      return Effect.andThen(publish, fork(Effect.andThen(closeGlobal, recycle(instance))))
    })

  const replace = (binding: Binding<A>, instance: Instance<A>): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (binding.instance !== instance || binding.status !== "ready") return Effect.void
      instance.state = "unhealthy"
      instances.delete(instance.id)
      binding.generation++
      binding.status = "assigning"
      binding.ready = Deferred.makeUnsafe()
      const fresh = newInstance(binding)
      binding.instance = fresh
      return Effect.all([
        crashed,
        fork(Effect.ignore(Scope.close(instance.scope, Exit.void))),
        fork(startInto(binding, fresh)),
        publish
      ], { discard: true })
    })

  // ----- background: periodic health checks, idle TTL -----
  const healthSweep = Effect.gen(function*() {
    const candidates = [...instances.values()].filter((i) => i.state === "idle" || i.state === "leased")
    yield* Effect.forEach(candidates, (instance) =>
      Effect.gen(function*() {
        const exit = yield* check(instance)
        if (Exit.isSuccess(exit) || !instances.has(instance.id)) return
        if (instance.state === "idle") {
          yield* crashed
          return yield* destroy(instance)
        }
        // Leased: the holder learns on its next use (typed Crashed error) and gets a fresh instance.
        if (instance.binding !== undefined) yield* replace(instance.binding, instance)
      }), { concurrency: 4, discard: true })
  })

  const idleSweep = Effect.gen(function*() {
    const ttl = spec.pool.idleTtlMillis!
    const now = yield* Clock.currentTimeMillis
    const expired = idle.filter((i) => now - i.idleSince >= ttl)
    const excess = Math.max(0, instances.size - spec.pool.min)
    for (const instance of expired.slice(0, excess)) yield* destroy(instance)
  })

  if (spec.timeouts.healthIntervalMillis !== undefined) {
    yield* fork(Effect.repeat(healthSweep, Schedule.spaced(spec.timeouts.healthIntervalMillis)))
  }
  if (spec.pool.idleTtlMillis !== undefined) {
    yield* fork(Effect.repeat(idleSweep, Schedule.spaced(Math.max(1, Math.floor(spec.pool.idleTtlMillis / 2)))))
  }

  // ----- open: prewarm -----
  const warm: Array<Effect.Effect<void>> = []
  for (let i = 0; i < Math.max(spec.pool.prewarm, spec.pool.min); i++) warm.push(startIdle(newInstance(undefined)))
  yield* forkAll(warm)

  const close: Effect.Effect<void> = Effect.gen(function*() {
    if (closed) return
    closed = true
    const waiters = waiting.splice(0)
    for (const binding of waiters) {
      binding.status = "done"
      bindings.delete(binding.key)
      yield* Deferred.fail(binding.ready, leaseError(new Resource.PoolClosed()))
    }
    for (const instance of [...idle]) yield* destroy(instance)
    yield* publish
  })
  yield* Effect.addFinalizer(() => close)

  return {
    resource,
    join,
    leave,
    replace,
    leaseLost: onGlobalLost,
    recordAcquire: (millis: number) =>
      Effect.suspend(() => {
        counters.acquires++
        counters.acquireMillisTotal += millis
        counters.acquireMillisMax = Math.max(counters.acquireMillisMax, millis)
        recordWait(recentWaits, millis)
        return Metric.update(acquireHistogram, millis)
      }),
    stats: Effect.sync(snapshot),
    close
  } satisfies Pool<A>
})
