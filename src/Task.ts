/**
 * A task: what a user writes to train an agent, and what every entry point consumes (`TrainLoop.run`, `agentfly
 * train` and `eval`, `Rollout.run`, and later rollout workers elsewhere and the gateway).
 *
 * A task is data plus Effect values:
 * - `row`: the Schema of a dataset row's fields (everything but `question` / `messages`), decoded when the data
 *   is loaded, so that a bad row is reported with its line before anything runs;
 * - `prompt`: how a row becomes the conversation (default: the system prompt, then `messages` or `question`);
 * - `tools` and `reward` (a weighted sum is `Reward.combine`);
 * - `environment`: the provider of the services the tools, the reward and the episode need, per chain, per group
 *   or shared (`Environment.perChain(layer)`, a resource-manager pool, ...), and `layer`: what building it needs
 *   (a `ResourceManager`, a Docker engine), built once per run;
 * - `episode`: the protocol the chain follows with its environment: reset with the row and a seed, speak after
 *   each turn, end the episode (see `Environment.Episode`);
 * - `policies`: error-policy overrides; `defaults`: agent settings (turns, token budgets, the system prompt) that a
 *   run's config may override.
 *
 * **Typed wiring.** {@link make} does not type-check when a tool, the reward or the episode needs a service the
 * environment does not provide (the error names the missing services). What building the environment needs beyond
 * the task's own `layer` stays in the task's type (`Task<RE>`): a task reached by name or path gets nothing from its
 * runner, so {@link withOptions} and {@link resolve} deal in `Task<never>` only, and a task whose `layer` is missing
 * does not type-check there (nor in `Oracle.rollout`, `Train.run`). A task assembled from untyped parts (a module
 * loaded by the CLI) is checked when a run starts: {@link missingServices} against the services its environment
 * handed a probe chain, and a service its environment's build asked for and did not get, are a
 * `TaskError(MissingServices)` naming the task and the service.
 *
 * **By name or by path.** A run's config names its task: a built-in name (`"calculator"`), or a module path
 * (`"./task.ts"`, exporting `task`), with options for tasks that take some ({@link withOptions}). The same
 * reference resolves in another process ({@link resolve}), so that a batch of work is plain data.
 *
 * @since 0.1.0
 */
import { Context, Effect, Option, Schema } from "effect"
import type { Layer } from "effect"
import type { Scope } from "effect"
import type * as Dataset from "./Dataset.ts"
import type * as Environment from "./Environment.ts"
import type * as Message from "./Message.ts"
import type * as Reward from "./Reward.ts"
import type * as ContextPolicy from "./ContextPolicy.ts"
import type * as RolloutError from "./RolloutError.ts"
import type * as Tool from "./Tool.ts"
import * as SchemaIssues from "./internal/schemaIssues.ts"
import { fromSources, importUserModule } from "./internal/userModule.ts"
import type * as Trajectory from "./Trajectory.ts"

// ===== Models =====

const TypeId = "~agentfly/Task" as const

/**
 * Agent settings a task suggests; a run's `agent` config overrides each one (the keys of `TrainConfig`'s
 * `agent`).
 *
 * @category models
 * @since 0.1.0
 */
export interface Defaults {
  readonly systemPrompt?: string | undefined
  readonly renderTools?: boolean | undefined
  readonly maxTurns?: number | undefined
  readonly numChains?: number | undefined
  readonly maxNewTokens?: number | undefined
  readonly maxContextTokens?: number | undefined
  readonly temperature?: number | undefined
  /** Seconds a tool call may run when its tool sets no `timeout`. */
  readonly toolTimeout?: number | undefined
  /** The context policy the task suggests (`src/ContextPolicy.ts`), as a config writes it. */
  readonly context?: ContextPolicy.Encoded | undefined
}

/**
 * Where the environment comes from: a provider, or an effect that builds one in the run's scope (a per-group or
 * shared provider, a resource-manager pool). `RE` is what building it needs (e.g. `ResourceManager`).
 *
 * @category models
 * @since 0.1.0
 */
export type EnvironmentOf<ROut, RE> =
  | Environment.Provider<ROut, any, RE>
  | Effect.Effect<Environment.Provider<ROut, any, RE>, any, RE | Scope.Scope>

/**
 * A row as the prompt sees it: the dataset row and its decoded fields.
 *
 * @category models
 * @since 0.1.0
 */
export interface PromptRow<Fields> {
  readonly question?: string | undefined
  readonly messages?: Message.Conversation | undefined
  readonly fields: Fields
}

/**
 * A task. `RE` is what building its environment needs from the run; `Services`, what its environment provides,
 * which its tools, reward and episode may use (so that another task can reuse them, checked against its own
 * environment; `any` for a task whose parts are untyped).
 *
 * @category models
 * @since 0.1.0
 */
export interface Task<RE = never, Services = any> {
  readonly [TypeId]: typeof TypeId
  readonly name: string
  readonly description: string | undefined
  readonly row: Schema.Codec<any, any> | undefined
  readonly prompt: ((row: PromptRow<any>, systemPrompt: string | undefined) => Message.Conversation) | undefined
  readonly tools: ReadonlyArray<Tool.Tool<string, any, any, any, Services>>
  readonly reward: Reward.Reward<Services> | undefined
  readonly environment: EnvironmentOf<any, any> | undefined
  /** Services the environment needs, built once in the run's scope (what it still needs is `RE`). */
  readonly layer: Layer.Layer<any, any, never> | undefined
  readonly episode: Environment.Episode<Services, any> | undefined
  readonly policies: RolloutError.Policies | undefined
  readonly defaults: Defaults
  /** Is a trajectory correct (the `accuracy` figures)? Default: its `acc`/`accuracy` metric, else `reward >= 1`. */
  readonly correct: ((trajectory: Trajectory.Trajectory) => boolean) | undefined
  /** The services the tools and the reward declared (`dependencies`), checked when a run starts. */
  readonly needs: ReadonlyArray<Context.Key<any, any>>
  /** The keys of its options that are paths ({@link PathOption}): a run records them absolute. */
  readonly pathOptions: ReadonlyArray<string>
  /** Type-level only: the services the runner must provide (never set at run time). */
  readonly "~requires"?: RE | undefined
}

/**
 * Any task.
 *
 * @category models
 * @since 0.1.0
 */
export type Any = Task<any>

/**
 * What a config may name: a task, or a function from the config's `task.options` to a task ({@link withOptions}).
 *
 * @category models
 * @since 0.1.0
 */
export type Definition = Task | ((options: unknown) => Effect.Effect<Task, TaskError>)

/**
 * A built-in task: loads its module when a config names it.
 *
 * @category models
 * @since 0.1.0
 */
export type Builtin = () => Promise<Definition>

/**
 * A config's reference to its task: a built-in name or a module path, with options.
 *
 * @category models
 * @since 0.1.0
 */
export const Ref = Schema.Union([
  Schema.String,
  Schema.Struct({ name: Schema.String, options: Schema.optionalKey(Schema.Record(Schema.String, Schema.Unknown)) })
])
export type Ref = typeof Ref.Type

// ===== Errors =====

/**
 * No built-in task has that name (`known` lists them).
 *
 * @category errors
 * @since 0.1.0
 */
export class Unknown extends Schema.TaggedError<Unknown>()("Unknown", {
  message: Schema.String,
  /** The names of the built-in tasks. */
  known: Schema.Array(Schema.String)
}) {}

/**
 * The module could not be loaded or exports no task.
 *
 * @category errors
 * @since 0.1.0
 */
export class Module extends Schema.TaggedError<Module>()("Module", {
  message: Schema.String,
  /** What the import threw. */
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The task's options do not decode, or its `make` refused them (tag `Options`).
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidOptions extends Schema.TaggedError<InvalidOptions>()("Options", {
  message: Schema.String,
  /** What `make` threw. */
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * A tool, the reward or the episode needs a service the environment does not provide.
 *
 * @category errors
 * @since 0.1.0
 */
export class MissingServices extends Schema.TaggedError<MissingServices>()("MissingServices", {
  message: Schema.String,
  /** The keys of the services not provided. */
  services: Schema.Array(Schema.String)
}) {}

/**
 * The environment could not be built or leased for the start check (tag `Environment`).
 *
 * @category errors
 * @since 0.1.0
 */
export class EnvironmentFailed extends Schema.TaggedError<EnvironmentFailed>()("Environment", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Why a task cannot be used.
 *
 * @category errors
 * @since 0.1.0
 */
export const TaskErrorReason = Schema.Union([Unknown, Module, InvalidOptions, MissingServices, EnvironmentFailed])
export type TaskErrorReason = typeof TaskErrorReason.Type

/**
 * A task cannot be used. Handle reasons with `Effect.catchReason("TaskError", "MissingServices", …)`; `message` is
 * the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class TaskError extends Schema.TaggedError<TaskError>()("TaskError", {
  task: Schema.String,
  reason: TaskErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `taskError`; a reason left out is a compile error. */
const reasons = {
  Unknown,
  Module,
  Options: InvalidOptions,
  MissingServices,
  Environment: EnvironmentFailed
} satisfies Record<TaskErrorReason["_tag"], unknown>

/**
 * The facts a reason carries besides its message (`services` of `MissingServices`, `known` of `Unknown`, `cause`).
 *
 * @category errors
 * @since 0.1.0
 */
export type TaskErrorFacts<Tag extends TaskErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `TaskError` of `task` for the reason tagged `tag`: `taskError(name, "MissingServices", text, { services })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const taskError = <Tag extends TaskErrorReason["_tag"]>(
  task: string,
  tag: Tag,
  message: string,
  ...[facts]: {} extends TaskErrorFacts<Tag> ? [facts?: TaskErrorFacts<Tag>] : [facts: TaskErrorFacts<Tag>]
): TaskError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => TaskErrorReason
  return new TaskError({ task, reason: new Reason({ ...facts, message }) })
}

// ===== Constructors =====

/** The services of a list of tools, a reward and an episode that the environment must provide. */
type Needed<Tools extends ReadonlyArray<Tool.Any>, RW, RP> = Tool.Requirements<Tools[number]> | RW | RP

type IsAny<T> = 0 extends 1 & T ? true : false

/**
 * The parts whose services are `any`, which no environment can be checked against (a tool typed `Tool.Any`, the
 * parts of a task typed `Task`).
 */
type Untyped<Tools extends ReadonlyArray<Tool.Any>, RW, RP> =
  | (IsAny<Tool.Requirements<Tools[number]>> extends true ? "tools" : never)
  | (IsAny<RW> extends true ? "reward" : never)
  | (IsAny<RP> extends true ? "episode" : never)

/**
 * Fails to type-check, naming the services, when the environment provides fewer than the task needs; or naming
 * the parts (`Untyped`: `"tools"`, `"reward"`, `"episode"`) whose services are `any`, which cannot be checked.
 *
 * @category models
 * @since 0.1.0
 */
export type Wiring<Needs, Provided, Untyped = never> = IsAny<Provided> extends true ? unknown
  : [Untyped] extends [never] ? [Exclude<Needs, Provided>] extends [never] ? unknown
    : { readonly environment: { readonly "missing environment services": Exclude<Needs, Provided> } }
  : {
    readonly environment: {
      readonly "cannot check the services of these parts, typed any (give them their types)": Untyped
    }
  }

/**
 * The options of {@link make}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options<Fields, Tools extends ReadonlyArray<Tool.Any>, RW, ROut, RE, RP, RL> {
  readonly description?: string | undefined
  /** The Schema of a row's fields (all but `question` / `messages`); rows failing it are reported by line. */
  readonly row?: Schema.Codec<Fields, any> | undefined
  /** The conversation of a row (default: the system prompt, then the row's `messages` or `question`). */
  readonly prompt?: ((row: PromptRow<Fields>, systemPrompt: string | undefined) => Message.Conversation) | undefined
  readonly tools?: Tools | undefined
  readonly reward?: Reward.Reward<RW> | undefined
  readonly environment?: EnvironmentOf<ROut, RE> | undefined
  /**
   * What building the environment needs, built once in the run's scope (e.g. `ResourceManager.layer` and
   * `Docker.DockerEngine.layer` for a sandbox pool); what it leaves out, the runner must provide.
   */
  readonly layer?: Layer.Layer<RL, any, never> | undefined
  /** The episode protocol; `start` gets the row's fields as `row` decodes them. */
  readonly episode?: Environment.Episode<RP, Fields> | undefined
  readonly policies?: RolloutError.Policies | undefined
  readonly defaults?: Defaults | undefined
  readonly correct?: ((trajectory: Trajectory.Trajectory) => boolean) | undefined
}

/**
 * Defines a task.
 *
 * **Example** (A game whose environment answers each guess and ends the episode when solved)
 *
 * ```ts
 * const task = Task.make("guess", {
 *   row: Schema.Struct({ secret: Schema.Int }),
 *   tools: [guess],                               // dependencies: [Game]
 *   reward: solved,                               // dependencies: [Game]
 *   environment: Environment.perChain(Game.layer),
 *   episode: {
 *     start: ({ row }) => Effect.flatMap(Game, (g) => g.reset(row.secret)), // row: { readonly secret: number }
 *     step: () => Effect.map(Game, (g) => (g.solved ? { end: "solved" } : {}))
 *   },
 *   defaults: { maxTurns: 6, systemPrompt: "Find the number." }
 * })
 * ```
 *
 * **Gotchas**
 *
 * Leaving out `environment` (or giving one that lacks a service) is a type error at `make`, listing the missing
 * services under `environment`. Another task's tools, reward or episode can be reused: they may use its
 * environment's services, which this task's environment must then provide. Parts whose services are `any` (a task
 * typed `Task`, a tool typed `Tool.Any`) cannot be checked and are a type error naming them, unless the
 * environment is untyped too.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <
  const Tools extends ReadonlyArray<Tool.Any> = [],
  Fields = Readonly<Record<string, unknown>>,
  RW = never,
  ROut = never,
  RE = never,
  RP = never,
  RL = never
>(
  name: string,
  options: Options<Fields, Tools, RW, ROut, RE, RP, RL> & Wiring<Needed<Tools, RW, RP>, ROut, Untyped<Tools, RW, RP>>
): Task<Exclude<RE, RL>, ROut> => {
  const tools = options.tools ?? []
  const needs = [...tools.flatMap((t) => t.dependencies), ...(options.reward?.dependencies ?? [])]
  return {
    [TypeId]: TypeId,
    name,
    description: options.description,
    row: options.row,
    prompt: options.prompt as Task["prompt"],
    // Their services are among the environment's (`Wiring` checked it).
    tools: tools as ReadonlyArray<Tool.Tool<string, any, any, any, ROut>>,
    reward: options.reward as Reward.Reward<ROut> | undefined,
    environment: options.environment,
    layer: options.layer,
    episode: options.episode as Environment.Episode<ROut, any> | undefined,
    policies: options.policies,
    defaults: options.defaults ?? {},
    correct: options.correct,
    needs: [...new Map(needs.map((key) => [key.key, key])).values()],
    pathOptions: []
  }
}

/**
 * Whether a value is a task.
 *
 * @category guards
 * @since 0.1.0
 */
export const isTask = (u: unknown): u is Any => typeof u === "object" && u !== null && TypeId in u

/**
 * Where a task's options come from: `resolvePath` makes a path option relative to the config file that holds it
 * (identity for options given in code). A top-level {@link PathOption} is resolved before `make` runs; a path
 * nested deeper is `make`'s to resolve, and a run records it as written (relative to the config, not the run).
 *
 * @category models
 * @since 0.1.0
 */
export interface OptionsContext {
  readonly resolvePath: (path: string) => string
}

const inCode: OptionsContext = { resolvePath: (path) => path }

const pathAnnotation = "agentfly/Task/PathOption"

/**
 * A task option that is a path (a folder, a data file): {@link withOptions} resolves it against the config file's
 * directory before the task is made, and a run's recorded `config.json` holds it absolute, so that the recorded
 * config works from any directory (`agentfly eval RUN/config.json`, a resume).
 *
 * **Example** (an option struct)
 *
 * ```ts
 * const Options = Schema.Struct({ root: Schema.optionalKey(Task.PathOption), pool: Schema.optionalKey(Schema.Int) })
 * ```
 *
 * @category models
 * @since 0.1.0
 */
export const PathOption = Schema.String.annotate({ [pathAnnotation]: true })

/** The keys of an option struct's fields that are {@link PathOption}s (none for a schema that is not a struct). */
const pathOptionKeys = (schema: Schema.Top): ReadonlyArray<string> => {
  const fields = (schema as { readonly fields?: Readonly<Record<string, Schema.Top>> }).fields ?? {}
  return Object.keys(fields).filter((key) => Schema.resolveAnnotations(fields[key]!)?.[pathAnnotation] === true)
}

/**
 * A task reference with its path options ({@link PathOption}, the `task`'s `pathOptions`) resolved by `resolvePath`;
 * a name, the other options and a value that is not a string are kept.
 *
 * @category combinators
 * @since 0.1.0
 */
export const resolvePathOptions = (ref: Ref, task: Any, resolvePath: (path: string) => string): Ref =>
  typeof ref === "string" || ref.options === undefined
    ? ref
    : { ...ref, options: withResolvedPaths(ref.options, task.pathOptions, resolvePath) }

const withResolvedPaths = (
  options: Readonly<Record<string, unknown>>,
  keys: ReadonlyArray<string>,
  resolvePath: (path: string) => string
): Record<string, unknown> => ({
  ...options,
  ...Object.fromEntries(keys.flatMap((key) => {
    const value = options[key]
    return typeof value === "string" ? [[key, resolvePath(value)]] : []
  }))
})

/**
 * A task that takes options (a config's `task: { name, options }`): they are decoded strictly with `schema`
 * (unknown keys are errors) before `make` builds the task; its {@link PathOption}s are resolved by
 * `context.resolvePath` first (against the config file's directory).
 *
 * **Gotchas**
 *
 * `make` returns a `Task<never>`: a config's task runs with nothing from its runner, so its `layer` provides
 * everything its environment needs. One whose `layer` is missing (`Task<Catalog>`) does not type-check here.
 *
 * @category constructors
 * @since 0.1.0
 */
export const withOptions = <S extends Schema.Top>(
  name: string,
  schema: S,
  make: (options: S["Type"], context: OptionsContext) => Task
): (options: unknown, context?: OptionsContext) => Effect.Effect<Task, TaskError> => {
  const pathOptions = pathOptionKeys(schema)
  return (options, context = inCode) =>
    Schema.decodeUnknownEffect(schema as unknown as Schema.Codec<S["Type"], unknown>)(options ?? {}, {
      ...SchemaIssues.decodeOptions,
      onExcessProperty: "error"
    }).pipe(
      // As a config's keys are reported: `task options: redis: unknown key`, with a suggestion when one is near.
      Effect.mapError((e) =>
        taskError(name, "Options", `task options: ${SchemaIssues.formatIssues(schema, e.issue).join("; ")}`)
      ),
      // A `make` that throws (a path option's file that is missing, an option it refuses itself) is the options'
      // error, named with the task, not a defect with a stack trace.
      Effect.flatMap((decoded) =>
        Effect.try({
          try: () => ({
            ...make(withResolvedPaths(decoded as Record<string, unknown>, pathOptions, context.resolvePath), context),
            pathOptions
          }),
          catch: (cause) =>
            taskError(
              name,
              "Options",
              `task options: task "${name}" could not be made from its options: ${
                cause instanceof Error ? cause.message : String(cause)
              }`,
              { cause }
            )
        })
      )
    )
}

// ===== Getters =====

/**
 * A row's conversation under the task: its `prompt`, or the system prompt then the row's `messages` (when
 * present) or `question`.
 *
 * @category getters
 * @since 0.1.0
 */
export const conversation = (task: Any, row: Dataset.Row, systemPrompt: string | undefined): Message.Conversation => {
  if (task.prompt !== undefined) {
    return task.prompt({ question: row.question, messages: row.messages, fields: row.fields }, systemPrompt)
  }
  if (row.messages !== undefined && row.messages.length > 0) return row.messages
  const user: Message.Message = { role: "user", content: row.question ?? "" }
  return systemPrompt === undefined ? [user] : [{ role: "system", content: systemPrompt }, user]
}

/**
 * The ids of the services the task needs that `context` lacks.
 *
 * @category getters
 * @since 0.1.0
 */
export const missingServices = (task: Any, context: Context.Context<never>): Array<string> =>
  task.needs.filter((key) => Option.isNone(Context.getOption(context as Context.Context<any>, key))).map((key) =>
    key.key
  )

/**
 * A raw run config with the task's defaults under its `agent` keys (the config's own values win).
 *
 * @category combinators
 * @since 0.1.0
 */
export const withDefaults = (task: Any, raw: unknown): unknown => {
  if (typeof raw !== "object" || raw === null) return raw
  const config = raw as Record<string, unknown>
  const agent = typeof config["agent"] === "object" && config["agent"] !== null ? config["agent"] : {}
  const defaults = Object.fromEntries(Object.entries(task.defaults).filter(([, v]) => v !== undefined))
  return { ...config, agent: { ...defaults, ...agent } }
}

// ===== Resolution =====

/**
 * The name of a reference.
 *
 * @category getters
 * @since 0.1.0
 */
export const refName = (ref: Ref): string => (typeof ref === "string" ? ref : ref.name)

/**
 * Module paths are relative or absolute and end in a script extension; anything else is a built-in name.
 *
 * @category predicates
 * @since 0.1.0
 */
export const isModulePath = (name: string): boolean =>
  /\.(m?[jt]s)$/.test(name) || name.startsWith(".") || name.startsWith("/")

/**
 * The task of a definition: a task as is (it takes no options), or a {@link withOptions} function applied to them.
 * A definition from a module is untyped: it is taken as a `Task<never>` (what a config's task must be), and what
 * its environment needs and does not get is the start check's `TaskError(MissingServices)`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const instantiate = (
  name: string,
  definition: unknown,
  options: unknown,
  context: OptionsContext = inCode
): Effect.Effect<Task, TaskError> => {
  if (isTask(definition)) {
    return options === undefined
      ? Effect.succeed(definition as Task)
      : Effect.fail(
        taskError(
          name,
          "Options",
          `${name}: task "${(definition as Task).name}" takes no options (made by Task.make, not ` +
            `Task.withOptions), got ${optionKeys(options)}: leave out task.options, or make it with Task.withOptions`
        )
      )
  }
  if (typeof definition === "function") {
    return (definition as (o: unknown, c: OptionsContext) => Effect.Effect<Task, TaskError>)(options, context)
  }
  return Effect.fail(
    taskError(
      name,
      "Module",
      `${name}: expected a task (Task.make) or a Task.withOptions function, got ${shapeOf(definition)}`
    )
  )
}

/** The keys of options a task does not take, as its refusal names them. */
const optionKeys = (options: unknown): string =>
  typeof options === "object" && options !== null && !Array.isArray(options)
    ? Object.keys(options).join(", ") || "{}"
    : JSON.stringify(options)

/** What a value that should have been a task is, for the error that refuses it (its keys say what it was meant as). */
const shapeOf = (u: unknown): string =>
  u === null ? "null" : Array.isArray(u) ? "an array" : typeof u !== "object" ? `a ${typeof u}` :
  Object.keys(u).length === 0 ? "an empty object" : `an object with keys ${Object.keys(u).slice(0, 6).join(", ")}`

/**
 * Loads the task a module exports as `task` (or as its default export), from an absolute path or `file:` URL.
 *
 * @category constructors
 * @since 0.1.0
 */
export const importModule = (path: string): Effect.Effect<Record<string, unknown>, TaskError> =>
  Effect.tryPromise({
    try: () => importUserModule(path),
    catch: (e) =>
      taskError(path, "Module", `cannot load ${path}: ${loadProblem(e, path)}`, { cause: e })
  })

/**
 * Why a module (a task's, or a config's run directly) could not be loaded, in words: the module itself is missing
 * ("no such file"), a package it imports cannot be found from its folder (a project without agentfly-ts installed:
 * the command that installs it), it was loaded as CommonJS (how to make it ESM), or
 * else the error itself (a syntax error, a throw at load).
 *
 * @category getters
 * @since 0.1.0
 */
export const loadProblem = (e: unknown, path: string): string =>
  missingText(e, path) ?? `${String(e)}${commonJsHint(e)}`

/**
 * Whether a module's load failed because something was not found (the module, or a package it imports).
 *
 * @category getters
 * @since 0.1.0
 */
export const isNotFound = (e: unknown): boolean =>
  typeof e === "object" && e !== null && (e as { readonly code?: unknown }).code === "ERR_MODULE_NOT_FOUND"

/** This package's own `node_modules`, where a module outside a clone may find `effect` (the runtime's copy). */
const ownModules = decodeURIComponent(new URL("../node_modules", import.meta.url).pathname)

/**
 * What a module that could not be found means (`ERR_MODULE_NOT_FOUND`): the task's module itself (a misspelt path:
 * "no such file"), or a package it imports that its folder cannot see (a project without agentfly-ts installed, or
 * outside a clone without its `node_modules` link); undefined for any other error.
 */
const missingText = (e: unknown, path: string): string | undefined => {
  if (!isNotFound(e)) return undefined
  const message = e instanceof Error ? e.message : String(e)
  if (message.includes(`'${path}'`)) return "no such file"
  const found = /Cannot find package '([^']+)' imported from (\S+)/.exec(message)
  if (found === null) return undefined
  const [, name, from] = found
  const dir = from!.replace(/\/[^/]*$/, "")
  const install = `${from} imports the package "${name}", which its folder cannot find: install agentfly-ts in ` +
    `the task's project (npm install agentfly-ts, which brings the effect the runtime uses: docs/install.md)`
  // Run from a clone's sources, the clone's own node_modules can serve a module elsewhere instead.
  return fromSources
    ? `${install}, or link this clone's node_modules beside it: ln -s ${ownModules} ${dir}/node_modules`
    : install
}

/**
 * What to do when Node refused to `require` an ES module for the task's module (`ERR_REQUIRE_ESM`,
 * `ERR_REQUIRE_CYCLE_MODULE`, `ERR_REQUIRE_ASYNC_MODULE`): the module was loaded as CommonJS, a `.ts` file in a
 * folder whose `package.json` does not say `"type": "module"`.
 */
const commonJsHint = (e: unknown): string => {
  const code = typeof e === "object" && e !== null ? (e as { readonly code?: unknown }).code : undefined
  return typeof code === "string" && code.startsWith("ERR_REQUIRE")
    ? `; it was loaded as CommonJS: a task module must be ESM (name it .mts, or keep it in a folder whose ` +
      `package.json says "type": "module")`
    : ""
}

/**
 * Resolves a reference: a built-in name from `builtins`, or a module path (resolved with `resolvePath`) whose
 * module exports `task`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const resolve = (
  ref: Ref,
  options: {
    readonly builtins: Readonly<Record<string, Builtin>>
    readonly resolvePath: (path: string) => string
  }
): Effect.Effect<Task, TaskError> => {
  const name = refName(ref)
  const taskOptions = typeof ref === "string" ? undefined : ref.options
  if (isModulePath(name)) {
    const path = options.resolvePath(name)
    return Effect.flatMap(importModule(path), (module) => {
      const definition = module["task"] ?? module["default"]
      if (definition === undefined) {
        return Effect.fail(taskError(name, "Module", `${path} exports no \`task\``))
      }
      return isTask(definition) || typeof definition === "function"
        ? instantiate(name, definition, taskOptions, { resolvePath: options.resolvePath })
        : Effect.fail(
          taskError(
            name,
            "Module",
            `${path}: its \`${module["task"] === undefined ? "default" : "task"}\` export is not a task ` +
              `(Task.make) or a Task.withOptions function but ${shapeOf(definition)}`
          )
        )
    })
  }
  const load = options.builtins[name]
  if (load === undefined) {
    return Effect.fail(
      taskError(
        name,
        "Unknown",
        `unknown task "${name}"${SchemaIssues.suggestion(name, Object.keys(options.builtins))} (built-in: ` +
          `${Object.keys(options.builtins).join(", ")}; or a module path such as ./task.ts)`,
        { known: Object.keys(options.builtins) }
      )
    )
  }
  return Effect.tryPromise({
    try: load,
    catch: (e) => taskError(name, "Module", `cannot load ${name}: ${String(e)}`, { cause: e })
  }).pipe(
    Effect.flatMap((definition) => instantiate(name, definition, taskOptions, { resolvePath: options.resolvePath }))
  )
}
