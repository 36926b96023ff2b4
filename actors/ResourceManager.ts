/**
 * The resource-manager actor: pools of environment instances (in-process, Docker, bubblewrap) leased to rollout
 * chains. It fixes what AgentFly's `ResourceEngine` got wrong:
 *
 * - **Keys are (spec, scope, owner)**, not an id: the same chain asking twice for one spec gets the same
 *   instance; two chains are isolated unless the spec's scope (`group`, `global`) shares.
 * - **Leases are scoped**: released when the holder's scope closes, on success, failure or interruption.
 * - **Waits are bounded**: a full pool fails the waiter with `LeaseError(LeaseTimeout)` after
 *   `timeouts.acquireMillis`; a closed pool fails waiters at once with `PoolClosed`.
 * - **Instances are checked** on acquire and periodically; one that crashes or fails its check is replaced, and
 *   its holder gets `EnvError(Crashed)` once, whose default policy is {@link withRetryOnCrash}: re-run the
 *   chain's current step on the fresh instance.
 * - **Reset on release** (or recreate, by policy); instances are destroyed when the manager's scope closes.
 * - **Global caps** across processes through a `Resource.Coordinator` (Redis leases with TTL, heartbeat and
 *   fencing tokens: `actors/resources/Redis.ts`). An instance acts only under a live global lease: each use checks
 *   it first, and a lost one (expired, taken, or granted by a Redis that has restarted since) destroys the
 *   instance; the holder gets `EnvError(Crashed)` once and its retried step runs on a replacement started under a
 *   new lease with a greater fencing token. If no slot frees within `timeouts.acquireMillis` the lease fails with
 *   `LeaseError(LeaseLost)` for good (the chain's error policy ends the chain, which releases it).
 *
 * @since 0.1.0
 */
import { Clock, Context, Deferred, Effect, Exit, Layer, Semaphore } from "effect"
import { Scope } from "effect"
import { dual } from "effect/Function"
import * as Environment from "../src/Environment.ts"
import * as Resource from "../src/Resource.ts"
import * as ResourcePool from "./internal/resourcePool.ts"

/**
 * Per-pool figures: instances by state, waiters, starts, failures, crashes, resets and recreations, and acquire
 * latency (total, maximum, and p50/p99 over the last 1,024 acquires).
 *
 * @category models
 * @since 0.1.0
 */
export type PoolStats = ResourcePool.PoolStats

/**
 * A chain's hold on an instance. The instance behind a lease can change (after a crash it is replaced), so
 * always go through {@link Lease.use} rather than keeping the value.
 *
 * @category models
 * @since 0.1.0
 */
export interface Lease<A> {
  readonly resource: string
  /** The sharing key, `<spec>/<scope>/<owner>`. */
  readonly key: string
  /**
   * Runs `f` on the current instance. If the instance crashed (`f` failed with `EnvError(Crashed)`, or a health
   * check found it dead) it is replaced for every holder of the key and this holder gets `EnvError(Crashed)`
   * once: its state is lost.
   *
   * With a global cap, the global lease is checked first (one coordinator round trip): while the coordinator is
   * unreachable `use` fails with `LeaseError(CoordinatorUnavailable)` (retryable; the instance is kept); a lost
   * lease replaces the instance as a crash does, the replacement holding a new lease, and a call that was running
   * when the loss was found gives `EnvError(Crashed)` instead of its result. When no new lease could be had,
   * every call fails with `LeaseError(LeaseLost)`.
   */
  readonly use: <X, E, R>(
    f: (instance: A) => Effect.Effect<X, E, R>
  ) => Effect.Effect<X, E | Environment.EnvError | Resource.LeaseError, R>
  /** The current instance's id (it changes when the instance is replaced). */
  readonly instanceId: Effect.Effect<string, Resource.LeaseError>
  /**
   * The fencing token of the global lease the current instance runs under, when the spec has a global cap and a
   * coordinator is configured. While a lost lease is being replaced it waits for the new one; `undefined` once
   * none could be had. After the lease is released, the last token.
   */
  readonly fencingToken: Effect.Effect<number | undefined>
  /** Declare the current instance dead: it is replaced, as after a crash. */
  readonly invalidate: Effect.Effect<void>
}

/**
 * The resource manager.
 *
 * @category services
 * @since 0.1.0
 */
export class ResourceManager extends Context.Service<ResourceManager, {
  /** Lease the instance for `owner` (waiting at most `timeouts.acquireMillis`), released with the scope. */
  readonly acquire: <A>(
    resource: Resource.Resource<A>,
    owner: Resource.Owner
  ) => Effect.Effect<Lease<A>, Resource.LeaseError, Scope.Scope>
  /** Open the pool now (starting `prewarm` instances) instead of at the first acquire. */
  readonly open: <A>(resource: Resource.Resource<A>) => Effect.Effect<void>
  readonly stats: (resource: string) => Effect.Effect<PoolStats | undefined>
  /** Close a pool: waiters fail with `PoolClosed`, idle instances are destroyed, leased ones on release. */
  readonly close: (resource: string) => Effect.Effect<void>
}>()("agentfly/actors/ResourceManager") {
  /**
   * A manager whose pools are bounded per process only.
   *
   * @category layers
   * @since 0.1.0
   */
  static readonly layer: Layer.Layer<ResourceManager> = Layer.effect(ResourceManager, Effect.suspend(() => make()))

  /**
   * A manager whose specs with `pool.globalMax` also hold a global lease from the `ResourceCoordinator` (Redis)
   * while leased, capping instances across processes and machines.
   *
   * @category layers
   * @since 0.1.0
   */
  static readonly layerCoordinated: Layer.Layer<ResourceManager, never, Resource.ResourceCoordinator> = Layer.effect(
    ResourceManager,
    Effect.flatMap(Resource.ResourceCoordinator, (coordinator) => make({ coordinator }))
  )
}

/**
 * Builds a manager in the current scope; closing the scope closes every pool and destroys every instance.
 * With a `coordinator`, specs with `pool.globalMax` also hold a global lease while leased.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fnUntraced(function*(options?: { readonly coordinator?: Resource.Coordinator }) {
  const scope = yield* Effect.scope
  const pools = new Map<string, ResourcePool.Pool<any>>()
  const lock = yield* Semaphore.make(1)

  const poolFor = <A>(resource: Resource.Resource<A>): Effect.Effect<ResourcePool.Pool<A>> =>
    Semaphore.withPermits(lock, 1)(Effect.gen(function*() {
      const existing = pools.get(resource.spec.name)
      if (existing !== undefined) {
        // The same spec may be rebuilt (e.g. a provider made per run); the first launcher keeps serving it.
        if (
          existing.resource.launcher !== resource.launcher &&
          JSON.stringify(existing.resource.spec) !== JSON.stringify(resource.spec)
        ) {
          return yield* Effect.die(
            new Error(`ResourceManager: two different specs are named "${resource.spec.name}"`)
          )
        }
        return existing as ResourcePool.Pool<A>
      }
      const pool = yield* ResourcePool.make(resource, { coordinator: options?.coordinator }).pipe(
        Scope.provide(scope)
      )
      pools.set(resource.spec.name, pool)
      return pool
    }))

  const acquire = <A>(
    resource: Resource.Resource<A>,
    owner: Resource.Owner
  ): Effect.Effect<Lease<A>, Resource.LeaseError, Scope.Scope> =>
    Effect.gen(function*() {
      const pool = yield* poolFor(resource)
      const key = Resource.ownerKey(resource.spec, owner)
      const started = yield* Clock.currentTimeMillis
      return yield* Effect.uninterruptibleMask((restore) =>
        Effect.gen(function*() {
          const binding = yield* pool.join(key)
          const exit = yield* Effect.exit(restore(awaitReady(resource.spec, binding, started)))
          if (Exit.isFailure(exit)) {
            yield* pool.leave(binding)
            return yield* Effect.failCause(exit.cause)
          }
          yield* Effect.addFinalizer(() => pool.leave(binding))
          const now = yield* Clock.currentTimeMillis
          yield* pool.recordAcquire(now - started)
          return makeLease(pool, binding)
        })
      )
    }).pipe(Effect.withSpan("ResourceManager.acquire", { attributes: { resource: resource.spec.name } }))

  return ResourceManager.of({
    acquire,
    open: (resource) => Effect.asVoid(poolFor(resource)),
    stats: (name) => Effect.suspend(() => pools.get(name)?.stats ?? Effect.undefined),
    close: (name) => Effect.suspend(() => pools.get(name)?.close ?? Effect.void)
  })
})

/** Waits for the binding's instance, within what is left of the acquire timeout. */
const awaitReady = <A>(
  spec: Resource.ResourceSpec,
  binding: ResourcePool.Binding<A>,
  started: number
): Effect.Effect<ResourcePool.Instance<A>, Resource.LeaseError> =>
  Effect.gen(function*() {
    const now = yield* Clock.currentTimeMillis
    const left = Math.max(0, spec.timeouts.acquireMillis - (now - started))
    return yield* Deferred.await(binding.ready).pipe(
      Effect.timeoutOrElse({
        duration: left,
        orElse: () =>
          Effect.fail(
            new Resource.LeaseError({
              resource: spec.name,
              reason: new Resource.LeaseTimeout({ waitedMillis: spec.timeouts.acquireMillis })
            })
          )
      })
    )
  })

const makeLease = <A>(pool: ResourcePool.Pool<A>, binding: ResourcePool.Binding<A>): Lease<A> => {
  const name = pool.resource.spec.name
  let seen = binding.generation
  const crashed = (message: string) =>
    Environment.envError(name, "use", "Crashed", message)
  const current: Effect.Effect<ResourcePool.Instance<A>, Resource.LeaseError> = Effect.suspend(() =>
    binding.status === "done"
      ? Effect.fail(binding.failure ?? new Resource.LeaseError({ resource: name, reason: new Resource.PoolClosed() }))
      : Deferred.await(binding.ready)
  )
  /** Fails unless the global lease is still this binding's; a lost one is replaced (the holder is told Crashed). */
  const checkGlobal = (
    instance: ResourcePool.Instance<A>
  ): Effect.Effect<void, Environment.EnvError | Resource.LeaseError> => {
    const global = binding.global
    if (global === undefined) return Effect.void
    return Effect.catchIf(
      global.check,
      (error) => error.reason._tag === "LeaseLost",
      () =>
        Effect.andThen(
          pool.leaseLost(binding, global),
          Effect.suspend(() => {
            seen = binding.generation
            return Effect.fail(crashed(
              `instance ${instance.id} lost its global lease (token ${global.token}); its replacement gets a new one`
            ))
          })
        )
    )
  }
  return {
    resource: name,
    key: binding.key,
    use: (f) =>
      Effect.gen(function*() {
        const instance = yield* current
        if (instance.state === "unhealthy") {
          yield* pool.replace(binding, instance)
          seen = binding.generation
          return yield* crashed(`instance ${instance.id} failed its health check; its state is lost`)
        }
        if (seen !== binding.generation) {
          seen = binding.generation
          return yield* crashed(`instance ${instance.id} replaces one that crashed; the previous state is lost`)
        }
        yield* checkGlobal(instance)
        const result = yield* Effect.tapError(f(instance.value as A), (error) =>
          Resource.isCrash(error)
            ? Effect.andThen(pool.replace(binding, instance), Effect.sync(() => void (seen = binding.generation)))
            : Effect.void)
        if (instance.leaseLost) {
          // The lease was lost while `f` ran: another holder may have acted on the slot meanwhile.
          seen = binding.generation
          return yield* crashed(`instance ${instance.id} lost its global lease during the call; its result is dropped`)
        }
        return result
      }),
    instanceId: Effect.map(current, (instance) => instance.id),
    fencingToken: Effect.suspend(() =>
      binding.status === "assigning"
        ? Effect.map(Effect.exit(Deferred.await(binding.ready)), () => binding.global?.token)
        : Effect.sync(() => binding.global?.token)
    ),
    invalidate: Effect.suspend(() =>
      binding.instance !== undefined ? pool.replace(binding, binding.instance) : Effect.void
    )
  }
}

/**
 * The default policy for `EnvError(Crashed)`: re-run `effect` (the chain's current step), which goes through
 * its lease again and so runs on the fresh instance. Other errors pass through. At most `times` retries
 * (default 2).
 *
 * @category combinators
 * @since 0.1.0
 */
export const withRetryOnCrash: {
  (options?: { readonly times?: number }): <A, E, R>(self: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  <A, E, R>(self: Effect.Effect<A, E, R>, options?: { readonly times?: number }): Effect.Effect<A, E, R>
} = dual(
  (args) => Effect.isEffect(args[0]),
  <A, E, R>(self: Effect.Effect<A, E, R>, options?: { readonly times?: number }): Effect.Effect<A, E, R> =>
    Effect.retry(self, { while: Resource.isCrash, times: options?.times ?? 2 })
)

/**
 * A pool's figures as a run logs them, under `env/<resource>/`: `leases` (acquires), `acquire_wait_p50_ms`,
 * `acquire_wait_p99_ms` (over the last 1,024 acquires), `acquire_wait_max_ms`, `creations` (instances started),
 * `crashes`, `resets`, `recreations` (counts since the pool opened), and `in_use`, `idle`, `waiters` (now).
 *
 * @category getters
 * @since 0.1.0
 */
export const poolFigures = (resource: string, stats: PoolStats): Record<string, number> => {
  const p = `env/${resource}`
  return {
    [`${p}/leases`]: stats.acquires,
    [`${p}/acquire_wait_p50_ms`]: stats.acquireMillisP50,
    [`${p}/acquire_wait_p99_ms`]: stats.acquireMillisP99,
    [`${p}/acquire_wait_max_ms`]: stats.acquireMillisMax,
    [`${p}/creations`]: stats.starts,
    [`${p}/crashes`]: stats.crashes,
    [`${p}/resets`]: stats.resets,
    [`${p}/recreations`]: stats.recreations,
    [`${p}/in_use`]: stats.leased,
    [`${p}/idle`]: stats.idle,
    [`${p}/waiters`]: stats.waiters
  }
}

/**
 * An `Environment.Provider` backed by the manager: each chain leases its instance (shared as the spec's scope
 * says) for the chain's scope, and `toContext` turns the lease into the services its tools declare. Its `stats`
 * are the pool's {@link poolFigures} (none before the pool opens, at the first acquire).
 *
 * **Gotchas**
 *
 * Build the services' methods on `lease.use` (not on a captured instance) so that a crashed instance is replaced
 * under the chain.
 *
 * @category constructors
 * @since 0.1.0
 */
export const provider = <A, ROut, E = never>(
  resource: Resource.Resource<A>,
  toContext: (lease: Lease<A>) => Effect.Effect<Context.Context<ROut>, E>
): Effect.Effect<Environment.Provider<ROut, Resource.LeaseError | E>, never, ResourceManager> =>
  Effect.map(ResourceManager, (manager) =>
    Environment.make<ROut, Resource.LeaseError | E>(
      resource.spec.scope === "chain" ? "perChain" : resource.spec.scope === "group" ? "perGroup" : "shared",
      (chain: Environment.ChainInfo) => Effect.flatMap(manager.acquire(resource, chain), toContext),
      Effect.map(
        manager.stats(resource.spec.name),
        (stats) => (stats === undefined ? {} : poolFigures(resource.spec.name, stats))
      )
    ))
