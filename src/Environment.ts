/**
 * The environment contract: how a stateful tool (or reward) gets the environment instance of **its** rollout
 * chain.
 *
 * **The contract** (read by the tool actor, the rollout chain and the resource manager)
 *
 * 1. An environment is an Effect service: a `Context.Service` class whose value holds the instance's state and
 *    methods. Its behaviour is a `Layer`.
 * 2. A stateful tool declares the services it needs as `dependencies: [MyEnv]` (as `effect/ai`'s `Tool.make`
 *    does); a reward declares them the same way. The handler `yield*`s the service.
 * 3. A rollout chain runs in its own `Scope`. When it starts, it asks a {@link Provider} for its
 *    `Context.Context<MyEnv>` (`provider.acquire({ chainId, groupId })`); every tool call of that chain
 *    (`ToolActor.executeTurn(calls, { context })`) and its reward (`RewardActor.score(trajectory, { context })`)
 *    get that same context. When the chain's scope closes — on success, failure or interruption — the provider
 *    releases the instance.
 * 4. Sharing rules: two calls of a stateful tool in one chain see the same state; two chains never share state
 *    unless the provider says so. The provider decides:
 *    - {@link perChain}: a fresh instance per chain (the default for RL: episodes are independent);
 *    - {@link perGroup}: one instance per group (`groupId`), shared by that group's chains, released when the
 *      group's last chain ends;
 *    - {@link shared}: one instance for the whole run (read-only resources such as a retrieval index).
 * 5. A resource manager (pools of containers, Redis-coordinated leases) implements the same {@link Provider}
 *    interface: `acquire` leases an instance from a pool and registers the release on the chain's scope
 *    (`Effect.acquireRelease`). Nothing else in the runtime changes.
 *
 * 6. The chain follows an {@link Episode} protocol with its environment (a task's `episode`): `start` resets it
 *    with the chain's row and seed (and may add a first observation), `step` may speak after each turn and end
 *    the episode.
 *
 * Failures of environment methods use {@link EnvError} with a `reason`; a tool that surfaces them declares
 * `failure: Environment.EnvError` so that the model observes them.
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer, RcMap, Schema } from "effect"
import type { Scope } from "effect"
import type * as Message from "./Message.ts"

// ===== Models =====

/**
 * Which chain is asking for its environment: its ids and, from a rollout, the dataset row it serves, the row's
 * position and the episode seed (the same for every chain of a group, so that a group's chains face one world).
 *
 * @category models
 * @since 0.1.0
 */
export interface ChainInfo {
  readonly chainId: string
  readonly groupId: string
  readonly rowIndex?: number | undefined
  readonly row?: Readonly<Record<string, unknown>> | undefined
  readonly seed?: number | undefined
}

/**
 * What an episode starts from: the chain (with its row and seed) and the prompt it was given. `Row` is the row's
 * fields as the task's `row` Schema decodes them (`Task.make` infers it; without a Schema, a record of unknowns).
 *
 * @category models
 * @since 0.1.0
 */
export interface EpisodeStart<Row = Readonly<Record<string, unknown>>> {
  readonly chainId: string
  readonly groupId: string
  readonly rowIndex: number
  readonly row: Row
  readonly seed: number
  readonly messages: Message.Conversation
}

/**
 * One finished assistant turn, as the environment sees it: the assistant message, its tool calls' observations
 * (in call order) and the number of turns so far (1 after the first).
 *
 * @category models
 * @since 0.1.0
 */
export interface EpisodeTurn {
  readonly turn: number
  readonly assistant: typeof Message.AssistantMessage.Type
  readonly observations: ReadonlyArray<Message.Message>
}

/**
 * What the environment says after a turn: messages of its own (appended after the tool observations, source
 * `env`, never trained on; plain strings are user messages) and, with `end`, the end of the episode for that
 * reason (`"solved"`, `"failed"`, `"out_of_moves"`, …), which becomes the trajectory's `termination:
 * "episode_end"` and `episodeEnd`.
 *
 * @category models
 * @since 0.1.0
 */
export interface EpisodeStep {
  readonly messages?: ReadonlyArray<Message.Message | string> | undefined
  readonly end?: string | undefined
}

/**
 * The episode protocol a rollout chain follows with its environment, run with the chain's environment services
 * (`R`) in context, for rows whose fields are `Row` (see {@link EpisodeStart}):
 * - `start` resets the environment for the chain's row and seed, before the first sample; its messages (plain
 *   strings are user messages) are appended to the prompt, e.g. the first observation of a text world;
 * - `step` runs after every assistant turn (after its tool calls ran; also after a turn without tool calls, which
 *   then ends the chain with `no_tool_call` only if the environment says nothing and does not end it).
 *
 * A failure (`EnvError`) follows the chain's `EnvFailed` policy (default: mask the trajectory).
 *
 * @category models
 * @since 0.1.0
 */
export interface Episode<R = never, Row = Readonly<Record<string, unknown>>> {
  readonly start?:
    | ((episode: EpisodeStart<Row>) => Effect.Effect<ReadonlyArray<Message.Message | string> | void, EnvError, R>)
    | undefined
  readonly step?: ((turn: EpisodeTurn) => Effect.Effect<EpisodeStep | void, EnvError, R>) | undefined
}

/**
 * Messages of an environment as conversation messages: strings become user messages.
 *
 * @category getters
 * @since 0.1.0
 */
export const toMessages = (messages: ReadonlyArray<Message.Message | string>): Array<Message.Message> =>
  messages.map((m) => (typeof m === "string" ? { role: "user" as const, content: m } : m))

/**
 * How instances are shared between chains.
 *
 * @category models
 * @since 0.1.0
 */
export type Sharing = "perChain" | "perGroup" | "shared"

const TypeId = "~agentfly/Environment/Provider" as const

/**
 * Hands each rollout chain the context of environment services its tools and rewards declared.
 *
 * `acquire` must be run in the chain's scope: the instance (or the chain's reference to a shared one) is
 * released when that scope closes.
 *
 * @category models
 * @since 0.1.0
 */
export interface Provider<in out ROut, out E = never, out R = never> {
  readonly [TypeId]: typeof TypeId
  readonly sharing: Sharing
  readonly acquire: (chain: ChainInfo) => Effect.Effect<Context.Context<ROut>, E, R | Scope.Scope>
  /**
   * Figures of the instances behind the provider, for a run's metrics (`env/<resource>/leases`,
   * `acquire_wait_p50_ms`, `creations`, `crashes`, `resets`, …); absent for in-process layers.
   */
  readonly stats?: Effect.Effect<Readonly<Record<string, number>>> | undefined
}

// ===== Errors =====

/**
 * The instance died (process exited, container gone); retryable on a fresh instance.
 *
 * @category errors
 * @since 0.1.0
 */
export class Crashed extends Schema.TaggedError<Crashed>()("Crashed", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The method did not answer in time.
 *
 * @category errors
 * @since 0.1.0
 */
export class Timeout extends Schema.TaggedError<Timeout>()("Timeout", {
  message: Schema.String,
  /** How long the method was given, when one limit applied. */
  timeoutMs: Schema.optionalKey(Schema.Number)
}) {}

/**
 * A new episode could not start.
 *
 * @category errors
 * @since 0.1.0
 */
export class ResetFailed extends Schema.TaggedError<ResetFailed>()("ResetFailed", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The action was refused by the environment (the model should see this).
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidAction extends Schema.TaggedError<InvalidAction>()("InvalidAction", { message: Schema.String }) {}

/**
 * No instance could be obtained (pool closed, lease lost, the container engine down).
 *
 * @category errors
 * @since 0.1.0
 */
export class Unavailable extends Schema.TaggedError<Unavailable>()("Unavailable", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Why an environment method failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const EnvErrorReason = Schema.Union([Crashed, Timeout, ResetFailed, InvalidAction, Unavailable])
export type EnvErrorReason = typeof EnvErrorReason.Type

/**
 * A failed environment method. Handle reasons with `Effect.catchReason("EnvError", "Crashed", …)`; `message` is
 * the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class EnvError extends Schema.TaggedError<EnvError>()("EnvError", {
  env: Schema.String,
  method: Schema.String,
  reason: EnvErrorReason
}) {
  get isRetryable(): boolean {
    const tag = this.reason._tag
    return tag === "Crashed" || tag === "Timeout" || tag === "Unavailable"
  }
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `envError`; a reason left out is a compile error. */
const reasons = { Crashed, Timeout, ResetFailed, InvalidAction, Unavailable } satisfies Record<
  EnvErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message (`cause`, `timeoutMs` of `Timeout`).
 *
 * @category errors
 * @since 0.1.0
 */
export type EnvErrorFacts<Tag extends EnvErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * An `EnvError` of `env`'s method `method` for the reason tagged `tag`:
 * `envError("python", "exec", "Timeout", text, { timeoutMs })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const envError = <Tag extends EnvErrorReason["_tag"]>(
  env: string,
  method: string,
  tag: Tag,
  message: string,
  facts?: EnvErrorFacts<Tag>
): EnvError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => EnvErrorReason
  return new EnvError({ env, method, reason: new Reason({ ...facts, message }) })
}

// ===== Constructors =====

/**
 * Whether a value is a {@link Provider}.
 *
 * @category guards
 * @since 0.1.0
 */
export const isProvider = (u: unknown): u is Provider<unknown, unknown, unknown> =>
  typeof u === "object" && u !== null && TypeId in u

/**
 * Makes a provider from an acquire function (how a resource manager plugs in its leases).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <ROut, E = never, R = never>(
  sharing: Sharing,
  acquire: (chain: ChainInfo) => Effect.Effect<Context.Context<ROut>, E, R | Scope.Scope>,
  stats?: Effect.Effect<Readonly<Record<string, number>>>
): Provider<ROut, E, R> => ({ [TypeId]: TypeId, sharing, acquire, ...(stats === undefined ? {} : { stats }) })

/**
 * Builds a layer with a memo map of its own, so that nothing it contains is shared with any other build.
 */
const buildFresh = <ROut, E, R>(layer: Layer.Layer<ROut, E, R>) =>
  Effect.flatMap(Effect.scope, (scope) => Layer.buildWithMemoMap(layer, Layer.makeMemoMapUnsafe(), scope))

/**
 * A fresh instance of the layer's services for every chain, built in the chain's scope and released when it
 * closes. Two chains never share state.
 *
 * **Gotchas**
 *
 * The whole layer is rebuilt per chain, including its sub-layers; provide run-wide dependencies (a Docker client,
 * a Redis connection) to `acquire`'s requirements `R` instead of composing them into `layer`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const perChain = <ROut, E, R>(layer: Layer.Layer<ROut, E, R>): Provider<ROut, E, R> =>
  make("perChain", () => buildFresh(layer))

/**
 * The provider with its instances counted in its `stats`: `started` (every acquire so far) and `open` (acquired and
 * not yet released), under the given metric names (e.g. `env/chess/boards`, `env/chess/open`). `open` at 0 after a
 * step says that no chain leaked its instance.
 *
 * @category combinators
 * @since 0.1.0
 */
export const counted = <ROut, E, R>(
  provider: Provider<ROut, E, R>,
  names: { readonly started: string; readonly open: string }
): Provider<ROut, E, R> => {
  let started = 0
  let open = 0
  const count = Effect.acquireRelease(
    Effect.sync(() => {
      started++
      open++
    }),
    () =>
      Effect.sync(() => {
        open--
      })
  )
  return make<ROut, E, R>(
    provider.sharing,
    (chain) => Effect.andThen(count, provider.acquire(chain)),
    Effect.map(provider.stats ?? Effect.succeed({}), (own) => ({
      ...own,
      [names.started]: started,
      [names.open]: open
    }))
  )
}

/**
 * One instance per group (`groupId`): the chains of one group share it; it is built when the group's first chain
 * asks and released when the group's last chain's scope closes. Must be created in the run's scope.
 *
 * @category constructors
 * @since 0.1.0
 */
export const perGroup = <ROut, E, R>(
  layer: Layer.Layer<ROut, E, R>
): Effect.Effect<Provider<ROut, E>, never, Scope.Scope | R> =>
  Effect.map(
    RcMap.make({ lookup: (_groupId: string) => buildFresh(layer) }),
    (map) => make<ROut, E>("perGroup", (chain) => RcMap.get(map, chain.groupId))
  )

/**
 * One instance for the whole run, built now in the current (run) scope and handed to every chain. Use for
 * read-only or internally synchronised resources only.
 *
 * @category constructors
 * @since 0.1.0
 */
export const shared = <ROut, E, R>(
  layer: Layer.Layer<ROut, E, R>
): Effect.Effect<Provider<ROut>, E, Scope.Scope | R> =>
  Effect.map(buildFresh(layer), (context) => make("shared", () => Effect.succeed(context)))

/**
 * The provider for chains whose tools need no environment.
 *
 * @category constructors
 * @since 0.1.0
 */
export const none: Provider<never> = make("shared", () => Effect.succeed(Context.empty()))

/**
 * The services a provider hands out.
 *
 * @category models
 * @since 0.1.0
 */
export type Services<P> = P extends Provider<infer ROut, infer _E, infer _R> ? ROut : never

/**
 * @category models
 * @since 0.1.0
 */
export type Errors<P> = P extends Provider<infer _ROut, infer E, infer _R> ? E : never

/**
 * @category models
 * @since 0.1.0
 */
export type Requirements<P> = P extends Provider<infer _ROut, infer _E, infer R> ? R : never

/**
 * Combines providers: a chain acquires from each (in order) and gets the merged context.
 *
 * @category combinators
 * @since 0.1.0
 */
export const all = <const Providers extends ReadonlyArray<Provider<any, any, any>>>(
  providers: Providers
): Provider<Services<Providers[number]>, Errors<Providers[number]>, Requirements<Providers[number]>> =>
  make(
    providers.every((p) => p.sharing === "shared") ? "shared" : providers.some((p) => p.sharing === "perChain")
      ? "perChain"
      : "perGroup",
    (chain) =>
      Effect.map(
        Effect.forEach(providers, (p) => p.acquire(chain)),
        (contexts) => contexts.reduce((acc, c) => Context.merge(acc, c), Context.empty() as Context.Context<any>)
      ),
    providers.some((p) => p.stats !== undefined)
      ? Effect.map(
        Effect.forEach(providers, (p) => p.stats ?? Effect.succeed({})),
        (all) => Object.assign({}, ...all) as Record<string, number>
      )
      : undefined
  )
