/**
 * A task's runtime: the actors and ports a rollout needs, built from a `Task` in the run's scope.
 *
 * - The tools run in one `ToolActor` (concurrency limits shared by every chain of the run), every call under its
 *   tool's `timeout` or the run's default (`toolTimeout`), so that a hung tool becomes a `Timeout` observation.
 * - The reward runs in a `RewardActor` (`onError: "zero"`: a failed reward scores 0 and is counted).
 * - The environment provider is built once (a per-group or shared provider, a resource-manager pool), with what
 *   it needs from the run provided.
 * - **The start check**: when the task has an environment, or its tools or reward declare services, a probe chain
 *   acquires its environment once, before any rollout. A service missing from what it got, or one that building
 *   the environment (the task's `layer`, its provider, the probe's lease) asked for and did not get, fails with
 *   `TaskError(MissingServices)` naming the task and the service (a task assembled from untyped parts: a module
 *   loaded by the CLI, a `withOptions` task without its `layer`); an environment that cannot be built or leased for
 *   another reason fails with `TaskError(Environment)`. Neither reaches a chain as a defect.
 * - **A failing episode start or step is logged**, as a tool's death and a reward's failure are: an environment
 *   whose reset with the row, or whose answer to a turn, fails ends its chain (`EnvFailed`, or `ChainDefect` when it
 *   throws or dies rather than failing with an `EnvError`; masked by default), which the progress line shows only
 *   as a failure share. The first failure of each is logged with its cause (a bug's stack), the task, where (the
 *   row, the turn) and the error; later ones are counted, one line per 30 s at most.
 *
 * These are the only adapters from the task's parts to the rollout chain's ports (`ToolActor.toPort`,
 * `RewardActor.toPort`): the trainer, the CLI and `Rollout.run` all go through here.
 *
 * @since 0.1.0
 */
import { Cause, Clock, Context, Duration, Effect, Exit, Layer, Scope } from "effect"
import * as Environment from "../src/Environment.ts"
import type * as RolloutError from "../src/RolloutError.ts"
import * as Task from "../src/Task.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import * as RewardActor from "./RewardActor.ts"
import type * as ChainPorts from "../src/ChainPorts.ts"
import * as ToolActor from "./ToolActor.ts"

// ===== Models =====

/**
 * What the rollout chains of a task run with.
 *
 * @category models
 * @since 0.1.0
 */
export interface TaskRuntime {
  readonly task: Task.Any
  readonly tools: ChainPorts.ToolRunner
  readonly reward: ChainPorts.Scorer | undefined
  readonly environment: Environment.Provider<any, any, never>
  readonly episode: Environment.Episode<any, any> | undefined
  readonly policies: RolloutError.Policies | undefined
  readonly correct: ((trajectory: Trajectory.Trajectory) => boolean) | undefined
  /** The environment's pool figures (`env/<resource>/...`), empty for in-process environments. */
  readonly environmentStats: Effect.Effect<Readonly<Record<string, number>>>
}

/**
 * Options of {@link make}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The timeout of tools that set none (default 30 seconds). */
  readonly toolTimeout?: Duration.Input | undefined
  /** Render the tools' schemas into the prompt (default true). */
  readonly renderTools?: boolean | undefined
}

// ===== Constructors =====

const taskError = (task: Task.Any, reason: "Module" | "Environment") => (e: unknown) => {
  const message = typeof e === "object" && e !== null && "message" in e ? String(e.message) : String(e)
  return Task.taskError(
    task.name,
    reason,
    reason === "Environment"
      ? `the environment of task "${task.name}" could not start: ${message}`
      : `task "${task.name}": ${message}`,
    { cause: e }
  )
}

/**
 * A failure or a defect of building or leasing the task's environment, as its typed error. A service that the
 * build asked for and did not get (Effect's `Service not found: <key>` defect) is `MissingServices`, naming it.
 */
const startError = (task: Task.Any, cause: Cause.Cause<unknown>): Task.TaskError => {
  const error = Cause.squash(cause)
  const missing = error instanceof Error ? /^Service not found: (.+)$/.exec(error.message)?.[1] : undefined
  return missing === undefined ? taskError(task, "Environment")(error) : Task.taskError(
    task.name,
    "MissingServices",
    `task "${task.name}": its environment needs ${missing}, but neither the task's layer nor the run provides it`,
    { services: [missing] }
  )
}

/** Any failure or defect of `effect` as the task's start error; interruption stays interruption. */
const atStart = <A, R>(task: Task.Any, effect: Effect.Effect<A, unknown, R>): Effect.Effect<A, Task.TaskError, R> =>
  Effect.catchCause(effect, (cause) =>
    Cause.hasInterruptsOnly(cause)
      ? Effect.failCause(cause as Cause.Cause<never>)
      : Effect.fail(startError(task, cause)))

/** The task's provider, built in the run's scope, with what it needs from the run provided to every acquire. */
const environmentOf = <RE>(
  task: Task.Task<RE>
): Effect.Effect<Environment.Provider<any, any, never>, Task.TaskError, RE | Scope.Scope> =>
  Effect.gen(function*() {
    const source = task.environment
    if (source === undefined) return Environment.none as unknown as Environment.Provider<any, any, never>
    // The task's own layer (a resource manager, a Docker engine) lives as long as the run.
    const own = task.layer === undefined
      ? Context.empty()
      : yield* atStart(task, Layer.build(task.layer))
    // Without the run's Scope: every acquire must register its release on the chain's own scope.
    const context = Context.omit(Scope.Scope)(Context.merge(yield* Effect.context<RE>(), own)) as Context.Context<any>
    const provider = Environment.isProvider(source)
      ? source
      : yield* atStart(
        task,
        Effect.provideContext(source as Effect.Effect<Environment.Provider<any, any, any>, unknown, any>, context)
      )
    return Environment.make<any, any, never>(
      provider.sharing,
      (chain) => Effect.provideContext(provider.acquire(chain), context) as Effect.Effect<any, any, Scope.Scope>,
      provider.stats
    )
  })

/** Acquires the environment for a probe chain and checks that it holds every service the task declared. */
const checkServices = (task: Task.Any, environment: Environment.Provider<any, any, never>) =>
  Effect.gen(function*() {
    if (task.needs.length === 0 && task.environment === undefined) return
    const scope = yield* Scope.make()
    const acquired = yield* Effect.exit(
      Scope.provide(environment.acquire({ chainId: "probe", groupId: "probe", rowIndex: -1, row: {}, seed: 0 }), scope)
    )
    yield* Scope.close(scope, Exit.void)
    // A failure or a defect (a layer that threw, a service it asked for) alike: the environment could not start.
    if (Exit.isFailure(acquired)) {
      return yield* Cause.hasInterruptsOnly(acquired.cause)
        ? Effect.failCause(acquired.cause as Cause.Cause<never>)
        : Effect.fail(startError(task, acquired.cause))
    }
    const missing = Task.missingServices(task, acquired.value as Context.Context<never>)
    if (missing.length > 0) {
      const what = task.environment === undefined ? "the task has no environment" : "its environment lacks them"
      const message = `task "${task.name}": its tools or reward need ${missing.join(", ")}, but ${what}`
      return yield* Task.taskError(task.name, "MissingServices", message, { services: missing })
    }
  })

/** How often the failures of an episode's start after its first are said. */
const repeatLogInterval = Duration.seconds(30)

const causeText = (cause: Cause.Cause<unknown>): string => {
  const error = Cause.squash(cause)
  return typeof error === "object" && error !== null && "message" in error ? String(error.message) : String(error)
}

/** A row as a log line shows it: its fields as JSON, cut to 200 characters. */
const rowText = (row: unknown): string => {
  const text = JSON.stringify(row) ?? String(row)
  return text.length > 200 ? `${text.slice(0, 200)}…` : text
}

/**
 * A logger of one episode method's failures: the first with its cause (a bug's stack) and `first`'s text; later
 * ones counted, one line per {@link repeatLogInterval} at most, the last one's place and error in it.
 */
const failureLog = (method: string, task: Task.Any) => {
  let logged = false
  let repeats = { count: 0, since: 0, last: "" }
  return Effect.fnUntraced(function*(where: string, cause: Cause.Cause<unknown>, first: string) {
    const now = yield* Clock.currentTimeMillis
    if (!logged) {
      logged = true
      repeats = { count: 0, since: now, last: "" }
      return yield* Effect.logWarning(first, cause)
    }
    repeats = { ...repeats, count: repeats.count + 1, last: `${where}: ${causeText(cause)}` }
    if (now - repeats.since < Duration.toMillis(repeatLogInterval)) return
    yield* Effect.logWarning(
      `the episode ${method} of task "${task.name}" failed ${repeats.count} more times in the last ` +
        `${Duration.format(Duration.millis(now - repeats.since))}; last: ${repeats.last}`
    )
    repeats = { count: 0, since: now, last: "" }
  })
}

/** How a chain classifies a failure of `start` or `step`: a typed one (an EnvError) is EnvFailed, else ChainDefect. */
const chainEnds = (cause: Cause.Cause<unknown>): string =>
  Cause.hasFails(cause)
    ? "failed: its chain ends, EnvFailed"
    : "died (a defect, not an EnvError): its chain ends, ChainDefect"

/**
 * The task's episode, its `start`'s and `step`'s failures and defects logged (interruption is not a failure): the
 * first of each with its cause, the task, where (the row for `start`, the turn for `step`) and the error; later ones
 * counted, one line per {@link repeatLogInterval} at most. A method that throws before returning its Effect is
 * logged (and classified) as one whose Effect died.
 */
const loggingEpisode = (
  task: Task.Any,
  episode: Environment.Episode<any, any> | undefined
): Environment.Episode<any, any> | undefined => {
  if (episode === undefined) return episode
  const { start, step } = episode
  const logStart = failureLog("start", task)
  const logStep = failureLog("step", task)
  const logged = <A, E, R>(self: Effect.Effect<A, E, R>, log: (cause: Cause.Cause<E>) => Effect.Effect<void>) =>
    Effect.tapCause(self, (cause) => (Cause.hasInterruptsOnly(cause) ? Effect.void : log(cause)))
  return {
    ...episode,
    ...(start === undefined ? {} : {
      start: (chain: Environment.EpisodeStart<any>) =>
        logged(Effect.suspend(() => start(chain)), (cause) => {
          const where = `row ${chain.rowIndex} (group ${chain.groupId}, chain ${chain.chainId})`
          return logStart(
            where,
            cause,
            `the episode start of task "${task.name}" failed for ${where}: ${causeText(cause)}\n` +
              `row: ${rowText(chain.row)}\n(the environment's reset with the row ${chainEnds(cause)}, ` +
              `masked by default, and counts in rollout/failures/<reason> and metrics.jsonl's firstFailure. Later ` +
              `failures of this start are counted, at most one line per ${Duration.format(repeatLogInterval)})`
          )
        })
    }),
    ...(step === undefined ? {} : {
      // Every turn of every chain passes here: the text is made only when the step failed.
      step: (turn: Environment.EpisodeTurn) =>
        logged(Effect.suspend(() => step(turn)), (cause) => {
          const where = `turn ${turn.turn}`
          return logStep(
            where,
            cause,
            `the episode step of task "${task.name}" failed after ${where}: ${causeText(cause)}\n` +
              `(the environment's answer to the turn ${chainEnds(cause)}, masked by default, and counts in ` +
              `rollout/failures/<reason> and metrics.jsonl's firstFailure. Later failures of this step are ` +
              `counted, at most one line per ${Duration.format(repeatLogInterval)})`
          )
        })
    })
  }
}

/**
 * Builds a task's runtime in the current scope and runs the start check.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <RE>(
  task: Task.Task<RE>,
  options: Options = {}
): Effect.Effect<TaskRuntime, Task.TaskError, RE | Scope.Scope> =>
  Effect.gen(function*() {
    const toolActor = yield* ToolActor.make(task.tools, {
      timeout: options.toolTimeout ?? Duration.seconds(30)
    }).pipe(Effect.mapError(taskError(task, "Module")))
    const tools = ToolActor.toPort(toolActor)
    const reward = task.reward === undefined
      ? undefined
      : RewardActor.toPort(yield* RewardActor.make(task.reward, { onError: "zero" }))
    const environment = yield* environmentOf(task)
    yield* checkServices(task, environment)
    return {
      task,
      tools: options.renderTools === false ? { ...tools, schemas: [] } : tools,
      reward,
      environment,
      episode: loggingEpisode(task, task.episode),
      policies: task.policies,
      correct: task.correct,
      environmentStats: environment.stats ?? Effect.succeed({})
    }
  })
