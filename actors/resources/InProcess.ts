/**
 * The in-process launcher: an environment written as an Effect layer (house-style sketch 3) becomes a pooled
 * resource with the same semantics as a container — sharing scopes, bounded waits, reset or recreate on release,
 * health checks. Each instance is one build of the layer, with a memo map of its own so instances never share
 * state; closing the instance's scope runs the layer's finalizers.
 *
 * @since 0.1.0
 */
import { Cause, Context, Effect, Layer } from "effect"
import type { Scope } from "effect"
import { EnvError, envError } from "../../src/Environment.ts"
import * as Resource from "../../src/Resource.ts"
import * as ResourceManager from "../ResourceManager.ts"

/**
 * How to reset and check an instance. Without `reset`, a released instance cannot be made fresh, so it is
 * destroyed and the next holder gets a new build (never a dirty one).
 *
 * @category models
 * @since 0.1.0
 */
export interface Options<ROut> {
  readonly reset?: (context: Context.Context<ROut>) => Effect.Effect<void, EnvError>
  readonly health?: (context: Context.Context<ROut>) => Effect.Effect<void, EnvError>
}

/**
 * A launcher building `layer` once per instance.
 *
 * @category constructors
 * @since 0.1.0
 */
export const launcher = <ROut, E>(
  layer: Layer.Layer<ROut, E>,
  options: Options<ROut> = {}
): Resource.Launcher<Context.Context<ROut>> => ({
  start: (spec: Resource.ResourceSpec): Effect.Effect<Context.Context<ROut>, EnvError, Scope.Scope> =>
    Effect.flatMap(Effect.scope, (scope) => Layer.buildWithMemoMap(layer, Layer.makeMemoMapUnsafe(), scope)).pipe(
      Effect.catchCause((cause) =>
        Effect.fail(
          envError(spec.name, "start", "Unavailable", Cause.pretty(cause), { cause: Cause.squash(cause) })
        )
      )
    ),
  reset: options.reset ??
    (() =>
      Effect.fail(
        envError("in-process", "reset", "ResetFailed", "no reset given")
      )),
  health: options.health ?? (() => Effect.void)
})

/**
 * A resource for `layer` under `spec` (whose `kind` must be `in-process`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const resource = <ROut, E>(
  spec: Resource.ResourceSpec,
  layer: Layer.Layer<ROut, E>,
  options?: Options<ROut>
): Resource.Resource<Context.Context<ROut>> => Resource.resource(spec, launcher(layer, options))

/**
 * The `Environment.Provider` for an in-process resource: each chain gets the context of its leased instance.
 *
 * **Gotchas**
 *
 * The context is the instance's at acquire time. If that instance is later replaced (a failed periodic health
 * check), the chain keeps the old services until its next acquire; container-backed environments route every
 * call through the lease instead.
 *
 * @category constructors
 * @since 0.1.0
 */
export const provider = <ROut>(
  resource: Resource.Resource<Context.Context<ROut>>
) => ResourceManager.provider(resource, (lease) => lease.use(Effect.succeed))
