/**
 * Resources: the environment instances that tools and rewards run against (an in-process environment, a Docker
 * sandbox, a bubblewrap sandbox), described by a serializable {@link ResourceSpec}, started by a {@link Launcher}
 * and leased to rollout chains by the resource-manager actor (`actors/ResourceManager.ts`).
 *
 * This module holds only the contracts: the spec schema, the sharing rule ({@link ownerKey}), the two error
 * lease error with its reasons ({@link LeaseError}; failures of a leased instance are `Environment.EnvError`), the
 * launcher interface and the cross-process {@link Coordinator} interface (implemented on Redis in
 * `actors/resources/Redis.ts`).
 *
 * @since 0.1.0
 */
import { Context, Schema } from "effect"
import type { Effect, Scope } from "effect"
import { EnvError } from "./Environment.ts"

// ===== Specs =====

/**
 * Who shares an instance. `chain`: one instance per rollout chain; `group`: one per group (the chains sampled from
 * one prompt); `global`: one for everybody. The same (spec, scope, owner) always resolves to the same instance.
 *
 * @category models
 * @since 0.1.0
 */
export const SharingScope = Schema.Literals(["chain", "group", "global"])
export type SharingScope = typeof SharingScope.Type

/**
 * What happens when the last holder releases an instance: `reset` it and return it to the idle pool, or
 * `recreate` (destroy it; a fresh one is started when needed).
 *
 * @category models
 * @since 0.1.0
 */
export const ResetPolicy = Schema.Literals(["reset", "recreate"])
export type ResetPolicy = typeof ResetPolicy.Type

/**
 * The launcher that starts instances (`process`: a local child process, such as an MCP server over stdio).
 *
 * @category models
 * @since 0.1.0
 */
export const ResourceKind = Schema.Literals(["in-process", "docker", "bubblewrap", "process"])
export type ResourceKind = typeof ResourceKind.Type

const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
const Millis = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

/**
 * Sandbox limits, enforced by the engine (Docker's cgroups and mount options; cgroups, namespaces and rlimits for
 * bubblewrap). Ignored by in-process resources.
 *
 * @category models
 * @since 0.1.0
 */
export const Limits = Schema.Struct({
  /** Memory cap in bytes (swap is capped at the same value, so nothing spills to swap). */
  memoryBytes: Schema.optionalKey(PositiveInt),
  /** CPU share, in cores (0.5 = half a core). */
  cpus: Schema.optionalKey(Schema.Finite.check(Schema.isGreaterThan(0))),
  /** Maximum number of processes and threads. */
  pids: Schema.optionalKey(PositiveInt),
  /** `none`: only a loopback interface inside the sandbox. */
  network: Schema.Literals(["none", "host"]),
  readOnlyRoot: Schema.Boolean,
  /** Writable tmpfs mounts: path → size in bytes. */
  tmpfs: Schema.Record(Schema.String, PositiveInt),
  /** The user the sandbox runs as (`uid:gid`). */
  user: Schema.String
})
export type Limits = typeof Limits.Type

/**
 * Pool sizing. `max` bounds the instances of this spec in this process; `min` instances are kept even when idle;
 * `prewarm` are started when the pool opens; idle instances above `min` are destroyed after `idleTtlMillis`.
 * `globalMax` bounds the instances leased at once across every process sharing a {@link Coordinator}.
 *
 * @category models
 * @since 0.1.0
 */
export const PoolSize = Schema.Struct({
  min: NonNegativeInt,
  max: PositiveInt,
  prewarm: NonNegativeInt,
  idleTtlMillis: Schema.optionalKey(Millis),
  globalMax: Schema.optionalKey(PositiveInt)
})
export type PoolSize = typeof PoolSize.Type

/**
 * Time limits. Waiting for a full pool is bounded by `acquireMillis` (then `LeaseTimeout`). `healthIntervalMillis`
 * enables the periodic health check of idle and leased instances.
 *
 * @category models
 * @since 0.1.0
 */
export const Timeouts = Schema.Struct({
  acquireMillis: Millis,
  startMillis: Millis,
  resetMillis: Millis,
  healthMillis: Millis,
  healthIntervalMillis: Schema.optionalKey(Millis)
})
export type Timeouts = typeof Timeouts.Type

/**
 * A resource specification. `image` names the container image (Docker), `factory` the environment (in-process;
 * informative, the layer itself is given to the launcher).
 *
 * @category models
 * @since 0.1.0
 */
export const ResourceSpec = Schema.Struct({
  name: Schema.NonEmptyString,
  kind: ResourceKind,
  image: Schema.optionalKey(Schema.NonEmptyString),
  factory: Schema.optionalKey(Schema.NonEmptyString),
  limits: Limits,
  pool: PoolSize,
  timeouts: Timeouts,
  resetPolicy: ResetPolicy,
  scope: SharingScope,
  healthCheckOnAcquire: Schema.Boolean
}).check(
  Schema.makeFilter((spec) => {
    const issues: Array<string> = []
    if (spec.pool.min > spec.pool.max) issues.push(`pool.min (${spec.pool.min}) exceeds pool.max (${spec.pool.max})`)
    if (spec.pool.prewarm > spec.pool.max) {
      issues.push(`pool.prewarm (${spec.pool.prewarm}) exceeds pool.max (${spec.pool.max})`)
    }
    if (spec.kind === "docker" && spec.image === undefined) issues.push("a docker resource needs an image")
    return issues
  })
)
export type ResourceSpec = typeof ResourceSpec.Type

/**
 * Defaults for {@link make}: a hardened sandbox (no network, read-only root, a 64 MiB work dir, user nobody),
 * a pool of at most 4, a 30 s acquire wait.
 *
 * @category constructors
 * @since 0.1.0
 */
export const defaults = {
  limits: {
    network: "none",
    readOnlyRoot: true,
    tmpfs: { "/work": 64 * 1024 * 1024 },
    user: "65534:65534"
  },
  pool: { min: 0, max: 4, prewarm: 0 },
  timeouts: { acquireMillis: 30_000, startMillis: 30_000, resetMillis: 10_000, healthMillis: 5_000 },
  resetPolicy: "reset",
  scope: "chain",
  healthCheckOnAcquire: true
} as const satisfies Omit<ResourceSpec, "name" | "kind">

/**
 * The input of {@link make}: a name and a kind; everything else has a default and nested fields merge.
 *
 * @category models
 * @since 0.1.0
 */
export interface SpecInput {
  readonly name: string
  readonly kind: ResourceKind
  readonly image?: string
  readonly factory?: string
  readonly limits?: Partial<Limits>
  readonly pool?: Partial<PoolSize>
  readonly timeouts?: Partial<Timeouts>
  readonly resetPolicy?: ResetPolicy
  readonly scope?: SharingScope
  readonly healthCheckOnAcquire?: boolean
}

/**
 * Builds and validates a spec from partial input. Invalid input (e.g. `min > max`, a docker spec without an
 * image) fails with a `SchemaError` listing every issue.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (input: SpecInput): Effect.Effect<ResourceSpec, Schema.SchemaError> =>
  Schema.decodeUnknownEffect(ResourceSpec)({
    ...defaults,
    ...input,
    limits: { ...defaults.limits, ...input.limits },
    pool: { ...defaults.pool, ...input.pool },
    timeouts: { ...defaults.timeouts, ...input.timeouts }
  })

/**
 * {@link make} for specs written in code, where invalid input is a bug: throws the `SchemaError`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeUnsafe = (input: SpecInput): ResourceSpec =>
  Schema.decodeUnknownSync(ResourceSpec)({
    ...defaults,
    ...input,
    limits: { ...defaults.limits, ...input.limits },
    pool: { ...defaults.pool, ...input.pool },
    timeouts: { ...defaults.timeouts, ...input.timeouts }
  })

// ===== Owners =====

/**
 * The chain asking for an instance, and its group.
 *
 * @category models
 * @since 0.1.0
 */
export const Owner = Schema.Struct({ chainId: Schema.String, groupId: Schema.String })
export type Owner = typeof Owner.Type

/**
 * The sharing key: equal keys share one instance. Chains are isolated under `chain`, chains of one group share
 * under `group`, everybody shares under `global`.
 *
 * @category models
 * @since 0.1.0
 */
export const ownerKey = (spec: ResourceSpec, owner: Owner): string =>
  spec.scope === "chain"
    ? `${spec.name}/chain/${owner.chainId}`
    : spec.scope === "group"
    ? `${spec.name}/group/${owner.groupId}`
    : `${spec.name}/global`

// ===== Errors =====

/**
 * The pool stayed full for the whole acquire wait.
 *
 * @category errors
 * @since 0.1.0
 */
export class LeaseTimeout extends Schema.TaggedError<LeaseTimeout>()("LeaseTimeout", {
  waitedMillis: Schema.Number
}) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * The pool was shut down (waiters fail at once).
 *
 * @category errors
 * @since 0.1.0
 */
export class PoolClosed extends Schema.TaggedError<PoolClosed>()("PoolClosed", {}) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * Starting an instance failed or exceeded `startMillis`.
 *
 * @category errors
 * @since 0.1.0
 */
export class StartFailed extends Schema.TaggedError<StartFailed>()("StartFailed", { message: Schema.String }) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * A global lease was lost (its TTL expired and another holder was given the slot, it was released, or the
 * coordinator restarted or failed over since the grant); the holder's fencing token is stale and must not act
 * any more.
 *
 * @category errors
 * @since 0.1.0
 */
export class LeaseLost extends Schema.TaggedError<LeaseLost>()("LeaseLost", {
  slot: Schema.Int,
  token: Schema.Int
}) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * The coordinator (Redis) is unreachable or answered with an error.
 *
 * @category errors
 * @since 0.1.0
 */
export class CoordinatorUnavailable extends Schema.TaggedError<CoordinatorUnavailable>()("CoordinatorUnavailable", {
  message: Schema.String
}) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * Why a lease could not be obtained or kept.
 *
 * @category errors
 * @since 0.1.0
 */
export const LeaseErrorReason = Schema.Union([LeaseTimeout, PoolClosed, StartFailed, LeaseLost, CoordinatorUnavailable])
export type LeaseErrorReason = typeof LeaseErrorReason.Type

/**
 * Getting (or keeping) a lease on an instance of `resource` failed. Handle reasons with `Effect.catchReason`.
 *
 * @category errors
 * @since 0.1.0
 */
export class LeaseError extends Schema.TaggedError<LeaseError>()("LeaseError", {
  resource: Schema.String,
  reason: LeaseErrorReason
}) {
  get isRetryable(): boolean {
    return this.reason.isRetryable
  }
  override get message(): string {
    const detail = this.reason.message === "" ? "" : `: ${this.reason.message}`
    return `${this.resource}: ${this.reason._tag}${detail}`
  }
}

/**
 * True for environment errors that mean the instance is lost (`Crashed`: container killed, process gone, failed
 * health check): the manager replaces the instance and the chain's current step should be retried on the fresh
 * one (`ResourceManager.withRetryOnCrash`).
 *
 * @category guards
 * @since 0.1.0
 */
export const isCrash = (u: unknown): u is EnvError => u instanceof EnvError && u.reason._tag === "Crashed"

// ===== Backends =====

/**
 * Starts, resets and checks instances of one kind. `start` is scoped: closing its scope destroys the instance
 * (container removed, process killed), whatever happened to it.
 *
 * **Gotchas**
 *
 * `start` runs in the manager's own fiber, never in the holder's: interrupting a waiting chain does not leave a
 * half-started container behind.
 *
 * @category models
 * @since 0.1.0
 */
export interface Launcher<A> {
  readonly start: (spec: ResourceSpec, instanceId: string) => Effect.Effect<A, EnvError, Scope.Scope>
  /** Restore a fresh state for the next holder. */
  readonly reset: (instance: A) => Effect.Effect<void, EnvError>
  /** Succeeds when the instance is usable. */
  readonly health: (instance: A) => Effect.Effect<void, EnvError>
}

/**
 * A spec together with the launcher that realises it; what chains lease.
 *
 * @category models
 * @since 0.1.0
 */
export interface Resource<A> {
  readonly spec: ResourceSpec
  readonly launcher: Launcher<A>
}

/**
 * @category constructors
 * @since 0.1.0
 */
export const resource = <A>(spec: ResourceSpec, launcher: Launcher<A>): Resource<A> => ({ spec, launcher })

// ===== Coordination across processes =====

/**
 * A global lease on one of `cap` slots of a resource, held by this process. `token` is a fencing token: strictly
 * greater than every token issued before for the slot, so a store that remembers the greatest token it has seen
 * can reject a stale holder. That holds across a restart or failover of the coordinator too, under the
 * coordinator's stated assumptions (Redis: the server's clock, `actors/resources/Redis.ts`); a lease granted
 * before such a restart is lost (`check` fails with `LeaseLost`), never silently valid.
 *
 * @category models
 * @since 0.1.0
 */
export interface GlobalLease {
  readonly resource: string
  readonly slot: number
  readonly token: number
  /** Fails with `LeaseLost` if the lease is no longer this holder's. */
  readonly check: Effect.Effect<void, LeaseError>
}

/**
 * Global caps shared by several processes (Redis in `actors/resources/Redis.ts`). `acquire` waits up to
 * `waitMillis` for a free slot, keeps the lease alive while its scope is open (heartbeat renewal) and releases
 * it when the scope closes; `onLost` runs if renewal finds the lease taken.
 *
 * @category models
 * @since 0.1.0
 */
export interface Coordinator {
  readonly acquire: (options: {
    readonly resource: string
    readonly cap: number
    readonly waitMillis: number
    readonly onLost: (lease: GlobalLease) => Effect.Effect<void>
  }) => Effect.Effect<GlobalLease, LeaseError, Scope.Scope>
}

/**
 * The coordinator a resource manager uses for global caps (`ResourceManager.layerCoordinated`); the Redis
 * implementation is `actors/resources/Redis.ts`.
 *
 * @category services
 * @since 0.1.0
 */
export class ResourceCoordinator extends Context.Service<ResourceCoordinator, Coordinator>()(
  "agentfly/src/Resource/ResourceCoordinator"
) {}
