/**
 * `run`: AgentFly's `agent.run(messages, max_turns, num_chains)` as a stream of supervised chain fibers.
 *
 * For every dataset row, `numChains` chains (one GRPO group) run the agent loop of `RolloutChain`. The returned
 * `Stream` emits each finished trajectory as it ends and, when the last chain of a row ends, the row's group.
 *
 * - **Concurrency**: at most `maxConcurrentChains` chains are in flight; rows start in order as chains finish.
 * - **Back-pressure**: finished results go through a bounded buffer (`bufferSize` events) to the consumer. A
 *   chain whose result does not fit waits, still holding its slot, so a slow consumer (the learner) bounds
 *   the chains in flight and no new chains start.
 * - **Supervision**: a chain that dies with a defect is restarted from scratch under `restart` (a `Schedule`);
 *   when restarts run out it yields a masked trajectory (`ChainDefect`). A defect never takes down the run.
 * - **Errors**: each `RolloutError` reason follows its policy (`src/RolloutError.ts`); `drop_group` drops the
 *   whole group (a `GroupDropped` event); `abort_run` fails the stream with the error.
 * - **Interruption**: ending or interrupting the stream interrupts every chain, which releases its environment
 *   lease and pending tool calls (each chain runs in its own scope).
 * - **Async training**: chains record the policy version of every sampled span, so a sampler whose version moves
 *   during the run (weights updated mid-rollout) yields trajectories that say which version sampled what.
 *
 * @since 0.1.0
 */
import { Cause, Effect, FiberSet, Queue, Random, Result, Schedule, Schema, Semaphore, Stream } from "effect"
import * as Dataset from "../src/Dataset.ts"
import * as Environment from "../src/Environment.ts"
import type * as ContextPolicy from "../src/ContextPolicy.ts"
import { Conversation } from "../src/Message.ts"
import * as Task from "../src/Task.ts"
import * as RolloutError from "../src/RolloutError.ts"
import { ChatSampler, Sampler } from "../src/Sampler.ts"
import type { SamplingParams } from "../src/Sampler.ts"
import type { Scope } from "effect"
import type { Group, Trajectory } from "../src/Trajectory.ts"
import * as Progress from "./Progress.ts"
import * as RolloutChain from "./RolloutChain.ts"
import * as ChainPorts from "../src/ChainPorts.ts"
import * as TaskRuntime from "./TaskRuntime.ts"

// ===== Models =====

/**
 * What a group's chains start from: a row's conversation so far (`messages`), plus its other fields (passed through
 * to the trajectory's `row` and to rewards). A dataset's row is `Dataset.Row`; a task's raw row is {@link TaskRow}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Prompt {
  readonly messages: Conversation
  readonly [field: string]: unknown
}

/**
 * A row of a task: a `question` or `messages`, plus the fields its row Schema reads.
 *
 * @category models
 * @since 0.1.0
 */
export interface TaskRow {
  readonly question?: string | undefined
  readonly messages?: Conversation | undefined
  readonly [field: string]: unknown
}

/**
 * What `run` emits.
 *
 * @category models
 * @since 0.1.0
 */
export type Event =
  | { readonly _tag: "Trajectory"; readonly rowIndex: number; readonly trajectory: Trajectory }
  | { readonly _tag: "Group"; readonly group: Group }
  | {
    readonly _tag: "GroupDropped"
    readonly groupId: string
    readonly rowIndex: number
    readonly reasons: ReadonlyArray<string>
  }

/**
 * Options of `run`.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The rows to roll out; or `messages` for a single row. */
  readonly rows?: ReadonlyArray<Prompt> | undefined
  readonly messages?: Conversation | undefined
  /** Chains per row (the GRPO group size). */
  readonly numChains: number
  readonly maxTurns: number
  /** Default 64. */
  readonly maxConcurrentChains?: number | undefined
  /** Token budget of one sequence; the remaining budget caps every request's `maxTokens`. */
  readonly maxContextTokens?: number | undefined
  /** What a chain does when its context nears `maxContextTokens` (`src/ContextPolicy.ts`; none: it ends there). */
  readonly context?: ContextPolicy.ContextPolicy | undefined
  /**
   * Sampling parameters of every request. With a `seed`, chain `k` of the run samples with `seed + k`, so that the
   * chains of a group differ and a run is reproducible.
   */
  readonly sampling: SamplingParams
  readonly format: ChainPorts.Format
  readonly tools?: ChainPorts.ToolRunner | undefined
  readonly reward?: ChainPorts.Scorer | undefined
  /** Where each chain gets its environment (default: none). */
  readonly environment?: Environment.Provider<any, any, never> | undefined
  /** The episode protocol each chain follows with its environment (see `Environment.Episode`). */
  readonly episode?: Environment.Episode<any> | undefined
  readonly policies?: RolloutError.Policies | undefined
  /** Delays of the `retry` policy. */
  readonly retry?: Schedule.Schedule<unknown, RolloutError.RolloutError> | undefined
  /** Restarts of a chain that died with a defect (default: 2 restarts, 100 ms apart). */
  readonly restart?: Schedule.Schedule<unknown, unknown> | undefined
  /** Finished events buffered for the consumer (default 2 × numChains). */
  readonly bufferSize?: number | undefined
  /** Live counters to observe the run (see `RolloutChain.metrics`); created when absent. */
  readonly stats?: RolloutChain.Stats | undefined
  /** Prefix of group, chain and trajectory ids (default: random). */
  readonly runId?: string | undefined
  /**
   * The index of the first row (default 0): rows are numbered from it in ids, `rowIndex`, and seeds, so that a
   * batch's rows split over several calls (rollout workers) get the ids and seeds one call would give them.
   */
  readonly rowOffset?: number | undefined
}

const Limits = Schema.Struct({
  numChains: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)),
  maxTurns: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)),
  maxConcurrentChains: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)),
  bufferSize: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)),
  maxContextTokens: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
  rows: Schema.Array(Schema.Struct({ messages: Conversation })).check(Schema.isMinLength(1))
})

// ===== Run =====

/**
 * The options of {@link runTask}: those of {@link run}, with the task in place of tools, reward, environment and
 * episode, and its rows.
 *
 * @category models
 * @since 0.1.0
 */
export interface TaskOptions<RE>
  extends Omit<Options, "rows" | "messages" | "tools" | "reward" | "environment" | "episode">
{
  readonly task: Task.Task<RE>
  readonly rows: ReadonlyArray<TaskRow>
  /** The system prompt of rows without `messages` (default: the task's). */
  readonly systemPrompt?: string | undefined
  /** The timeout of tools that set none (default 30 seconds). */
  readonly toolTimeout?: import("effect").Duration.Input | undefined
  /** Render the tools' schemas into the prompt (default: the task's `defaults.renderTools`, else true). */
  readonly renderTools?: boolean | undefined
}

/**
 * Rolls out a task's rows: the task's tools, reward, environment (built in the stream's scope, checked before any
 * chain starts) and episode protocol, as `TrainLoop.run` does. Rows are checked against the task's row Schema: a bad
 * one fails the stream with `DatasetError(InvalidRow)` naming it (`rows[3]: Expected number at ["secret"]`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const runTask = <RE = never>(
  options: TaskOptions<RE>
): Stream.Stream<
  Event,
  RolloutError.RolloutError | Schema.SchemaError | Dataset.DatasetError | Task.TaskError,
  Sampler | RE
> =>
  Stream.unwrap(Effect.map(taskOptions(options), run))

/**
 * Chat mode of {@link runTask}: the task's rows against the `ChatSampler` in context (a black-box API, or a
 * scripted policy such as an environment's oracle). The trajectories are not trainable (no logprobs); their
 * messages are SFT demonstrations.
 *
 * @category constructors
 * @since 0.1.0
 */
export const runTaskChat = <RE = never>(
  options: TaskOptions<RE>
): Stream.Stream<
  Event,
  RolloutError.RolloutError | Schema.SchemaError | Dataset.DatasetError | Task.TaskError,
  ChatSampler | RE
> =>
  Stream.unwrap(Effect.map(taskOptions(options), runChat))

/** A task's rows checked against its row Schema and rendered, and its runtime's ports, as the options of `run`. */
const taskOptions = <RE>(
  options: TaskOptions<RE>
): Effect.Effect<Options, Dataset.DatasetError | Task.TaskError, RE | Scope.Scope> =>
  Effect.gen(function*() {
    const { task } = options
    const runtime = yield* TaskRuntime.make(task, {
      toolTimeout: options.toolTimeout,
      renderTools: options.renderTools ?? task.defaults.renderTools
    })
    const decodeFields = task.row === undefined ? undefined : Schema.decodeUnknownResult(task.row)
    const rows: Array<Prompt> = []
    for (const [index, row] of options.rows.entries()) {
      const { question, messages, ...rest } = row
      const decoded = decodeFields?.(rest, { errors: "all" })
      if (decoded !== undefined && Result.isFailure(decoded)) {
        // As a dataset file's bad row is reported (`FILE:LINE: why`): which row, and why.
        const why = decoded.failure.message.replace(/\n\s*/g, " ")
        return yield* Dataset.datasetError("rows", "InvalidRow", `rows[${index}]: ${why}`, { line: index + 1 })
      }
      const fields = decoded === undefined ? rest : { ...rest, ...(decoded.success as Record<string, unknown>) }
      const prompt = Task.conversation(task, {
        index,
        line: index + 1,
        ...(question === undefined ? {} : { question }),
        ...(messages === undefined ? {} : { messages }),
        fields
      }, options.systemPrompt ?? task.defaults.systemPrompt)
      rows.push({ ...fields, messages: prompt })
    }
    return {
      ...options,
      rows,
      tools: runtime.tools,
      reward: runtime.reward,
      environment: runtime.environment,
      episode: runtime.episode,
      policies: options.policies ?? runtime.policies
    }
  })

/**
 * Rolls out every row `numChains` times and streams trajectories and groups as they finish.
 *
 * **Example** (GRPO groups from a local model, with tools and a reward)
 *
 * ```ts
 * const tools = ToolActor.toPort(yield* ToolActor.make([Calculator, Answer]))
 * const reward = RewardActor.toPort(yield* RewardActor.make(MathEqual, { onError: "zero" }))
 * const groups = yield* Rollout.groups({
 *   rows: [{ messages: [{ role: "user", content: "What is 17 * 23?" }], answer: "391" }],
 *   numChains: 8,
 *   maxTurns: 4,
 *   maxContextTokens: 4096,
 *   sampling: { temperature: 1, maxTokens: 512, seed: step },
 *   format: ChainFormat.fromTemplate({ tokenizer, template }),
 *   tools,
 *   reward
 * }).pipe(Stream.runCollect, Effect.provide(samplerLayer)) // any `Sampler`: PolicyEngine, OpenAiCompatSampler, ...
 * ```
 *
 * **Gotchas**
 *
 * Invalid options (no rows, `numChains < 1`, malformed messages) fail the stream with a `SchemaError` before
 * any chain starts. With a sampling `seed`, chain `k` uses `seed + k`: change the seed between training steps.
 *
 * @category constructors
 * @since 0.1.0
 */
export const run = (
  options: Options
): Stream.Stream<Event, RolloutError.RolloutError | Schema.SchemaError, Sampler> =>
  Stream.unwrap(Effect.map(Effect.service(Sampler), (sampler) => runWith(options, { _tag: "Tokens", sampler })))

/**
 * Chat mode: rolls out against a black-box chat API (the `ChatSampler` in context, e.g.
 * `OpenAiCompatSampler.layerChat`). The API's replies are rendered into the trajectory by the format's
 * `appendAssistant`; there are no logprobs, so every trajectory is marked `trainable: false` (evaluation and SFT
 * data only).
 *
 * @category constructors
 * @since 0.1.0
 */
export const runChat = (
  options: Options
): Stream.Stream<Event, RolloutError.RolloutError | Schema.SchemaError, ChatSampler> =>
  Stream.unwrap(Effect.map(Effect.service(ChatSampler), (chat) => runWith(options, { _tag: "Chat", chat })))

const runWith = (
  options: Options,
  turnSource: RolloutChain.TurnSource
): Stream.Stream<Event, RolloutError.RolloutError | Schema.SchemaError> => {
  const bufferSize = options.bufferSize ?? 2 * options.numChains
  return Stream.callback<Event, RolloutError.RolloutError | Schema.SchemaError>(
    (queue) =>
      Effect.gen(function*() {
        const rows = yield* checkedRows(options, bufferSize)
        const stats = options.stats ?? RolloutChain.makeStats()
        const run: Run = {
          options,
          runId: options.runId ?? (yield* Random.nextIntBetween(0, 0x7fffffff)).toString(16),
          config: chainConfig(options, turnSource, stats),
          restart: options.restart ?? Schedule.max([Schedule.spaced(100), Schedule.recurs(2)]),
          permits: yield* Semaphore.make(options.maxConcurrentChains ?? 64),
          chains: yield* FiberSet.make<void>(),
          queue,
          aborted: false
        }
        const rowOffset = options.rowOffset ?? 0
        for (let rowIndex = rowOffset; rowIndex < rowOffset + rows.length && !run.aborted; rowIndex++) {
          yield* startRow(run, rowIndex, rows[rowIndex - rowOffset]!)
        }
        yield* FiberSet.awaitEmpty(run.chains)
        yield* Queue.end(queue)
      }),
    { bufferSize, strategy: "suspend" }
  )
}

/** One call of `run`: what its rows' chains share, and whether a chain aborted it (no chain starts after that). */
interface Run {
  readonly options: Options
  readonly runId: string
  readonly config: RolloutChain.Config
  readonly restart: Schedule.Schedule<unknown, unknown>
  /** A chain in flight holds one permit. */
  readonly permits: Semaphore.Semaphore
  readonly chains: FiberSet.FiberSet<void>
  readonly queue: Queue.Queue<Event, RolloutError.RolloutError | Schema.SchemaError | Cause.Done>
  aborted: boolean
}

/** The rows of `options` (or its single `messages`), checked with the limits before any chain starts. */
const checkedRows = (
  options: Options,
  bufferSize: number
): Effect.Effect<ReadonlyArray<Prompt>, Schema.SchemaError> => {
  const rows = options.rows ?? (options.messages === undefined ? [] : [{ messages: options.messages }])
  return Effect.as(
    Schema.decodeUnknownEffect(Limits)({
      numChains: options.numChains,
      maxTurns: options.maxTurns,
      maxConcurrentChains: options.maxConcurrentChains ?? 64,
      bufferSize,
      rows,
      ...(options.maxContextTokens === undefined ? {} : { maxContextTokens: options.maxContextTokens })
    }),
    rows
  )
}

/** What every chain of a run shares. */
const chainConfig = (
  options: Options,
  turnSource: RolloutChain.TurnSource,
  stats: RolloutChain.Stats
): RolloutChain.Config => ({
  turnSource,
  format: options.format,
  tools: options.tools ?? ChainPorts.noTools,
  reward: options.reward,
  environment: options.environment ?? (Environment.none as unknown as Environment.Provider<any, any, never>),
  episode: options.episode,
  sampling: options.sampling,
  maxTurns: options.maxTurns,
  maxContextTokens: options.maxContextTokens,
  context: options.context,
  policies: options.policies,
  retry: options.retry,
  stats
})

/** Starts a row's chains (one group), each once a permit is free; stops when a chain aborted the run. */
const startRow = Effect.fnUntraced(function*(run: Run, rowIndex: number, row: Prompt) {
  const { numChains } = run.options
  const { messages, ...fields } = row
  const groupId = `${run.runId}-g${rowIndex}`
  const group = makeCollector(groupId, rowIndex, numChains, run.config.stats)
  for (let chainIndex = 0; chainIndex < numChains && !run.aborted; chainIndex++) {
    yield* Semaphore.take(run.permits, 1)
    const chainId = `${groupId}-c${chainIndex}`
    const seed = run.options.sampling.seed
    const spec: RolloutChain.Spec = {
      trajectoryId: chainId,
      groupId,
      chainId,
      messages,
      rowIndex,
      // One world per group: every chain of a row starts its episode from the same seed.
      episodeSeed: (seed ?? 0) + rowIndex * numChains,
      ...(Object.keys(fields).length === 0 ? {} : { row: fields })
    }
    const config = seed === undefined ? run.config : {
      ...run.config,
      sampling: { ...run.config.sampling, seed: seed + rowIndex * numChains + chainIndex }
    }
    yield* startChain(run, spec, config, (outcome) => group.deliver(chainIndex, outcome, run.queue))
  }
})

/**
 * Runs a chain in the run's fiber set under supervision: its outcome is delivered to its group; an `abort_run`
 * error fails the stream and stops the run; its permit is released however it ends.
 */
const startChain = (
  run: Run,
  spec: RolloutChain.Spec,
  config: RolloutChain.Config,
  deliver: (outcome: RolloutChain.Outcome) => Effect.Effect<void>
): Effect.Effect<unknown> => {
  const stats = config.stats
  stats.chainsStarted++
  stats.chainsInFlight++
  return FiberSet.run(
    run.chains,
    supervise(spec, config, run.restart).pipe(
      Effect.flatMap(deliver),
      Effect.catch((error) =>
        Effect.suspend(() => {
          run.aborted = true
          return Queue.fail(run.queue, error)
        })
      ),
      Effect.ensuring(Effect.suspend(() => {
        stats.chainsInFlight--
        stats.chainsFinished++
        return Semaphore.release(run.permits, 1)
      }))
    )
  )
}

/**
 * Only the groups of `run` (trajectories are still emitted inside their group).
 *
 * @category combinators
 * @since 0.1.0
 */
export const groups = (
  options: Options
): Stream.Stream<Group, RolloutError.RolloutError | Schema.SchemaError, Sampler> =>
  run(options).pipe(Stream.filterMap((event) => event._tag === "Group" ? Result.succeed(event.group) : Result.failVoid))

/**
 * Runs a chain, restarting it from scratch after a defect; when restarts run out, the chain yields a masked
 * trajectory that says so. Typed failures (`abort_run`) pass through.
 */
const supervise = (
  spec: RolloutChain.Spec,
  config: RolloutChain.Config,
  restart: Schedule.Schedule<unknown, unknown>
): Effect.Effect<RolloutChain.Outcome, RolloutError.RolloutError> => {
  const chain = RolloutChain.run(spec, config)
  // The restart schedule is only set up once the chain has died: the happy path pays for one `catchCause`. The
  // first death is replayed into `retry` so that the schedule's delays and count apply from the first restart on.
  return Effect.catchCause(chain, (first) => {
    if (!isDefect(first)) return Effect.failCause(first)
    let replayed = false
    const again = Effect.suspend(() => {
      if (replayed) return chain
      replayed = true
      return Effect.failCause(first)
    })
    return again.pipe(
      Effect.sandbox,
      Effect.retry({
        schedule: Schedule.tap(restart, () => Effect.sync(() => config.stats.restarts++)),
        while: isDefect
      }),
      Effect.catch((cause) =>
        isDefect(cause) ? Effect.sync(() => defectOutcome(spec, config, cause)) : Effect.failCause(cause)
      )
    )
  })
}

/** A death to restart after: a defect, and no typed failure (those follow their policy). */
const isDefect = (cause: Cause.Cause<RolloutError.RolloutError>): boolean =>
  !Cause.hasFails(cause) && Cause.hasDies(cause)

const defectOutcome = (
  spec: RolloutChain.Spec,
  config: RolloutChain.Config,
  cause: Cause.Cause<unknown>
): RolloutChain.Outcome => {
  config.stats.errors.set("ChainDefect", (config.stats.errors.get("ChainDefect") ?? 0) + 1)
  config.stats.terminations.set("error", (config.stats.terminations.get("error") ?? 0) + 1)
  const policy = RolloutError.policyFor("ChainDefect", config.policies)
  return {
    trajectory: {
      trajectoryId: spec.trajectoryId,
      groupId: spec.groupId,
      chainId: spec.chainId,
      messages: spec.messages,
      segments: [],
      termination: "error",
      reward: 0,
      rewardStatus: "failed",
      metrics: {},
      trainable: true,
      masked: true,
      ...(spec.row === undefined ? {} : { row: spec.row }),
      error: `ChainDefect: ${String(Cause.squash(cause))}`,
      errorReason: "ChainDefect"
    },
    dropGroup: policy === "drop_group"
  }
}

/** Collects the chains of one group; the last one to finish emits the group (or its drop). */
const makeCollector = (groupId: string, rowIndex: number, size: number, stats: RolloutChain.Stats) => {
  const outcomes: Array<RolloutChain.Outcome | undefined> = new Array(size)
  let remaining = size
  /** The group's event, once every chain delivered: the group, or its drop when a chain asked for one. */
  const groupEvent = (queue: Queue.Queue<Event, any>): Effect.Effect<void> => {
    const done = outcomes as Array<RolloutChain.Outcome>
    if (done.some((o) => o.dropGroup)) {
      const reasons = done.flatMap((o) => o.dropGroup && o.trajectory.error !== undefined ? [o.trajectory.error] : [])
      stats.groupsDropped++
      return Effect.asVoid(Queue.offer(queue, { _tag: "GroupDropped", groupId, rowIndex, reasons }))
    }
    stats.groupsEmitted++
    return Effect.asVoid(Queue.offer(queue, {
      _tag: "Group",
      group: { groupId, rowIndex, trajectories: done.map((o) => o.trajectory) }
    }))
  }
  return {
    deliver: (
      chainIndex: number,
      outcome: RolloutChain.Outcome,
      queue: Queue.Queue<Event, any>
    ): Effect.Effect<void> =>
      Effect.suspend(() => {
        outcomes[chainIndex] = outcome
        // Decide before offering: the offer may suspend while a sibling finishes.
        const last = --remaining === 0
        const offered = Queue.offer(queue, { _tag: "Trajectory", rowIndex, trajectory: outcome.trajectory })
        return last
          ? Effect.flatMap(offered, () => Effect.andThen(groupEvent(queue), Progress.groupDone))
          : Effect.asVoid(offered)
      })
  }
}
