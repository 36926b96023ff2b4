/**
 * Rollouts of agent-function tasks (`src/AgentTask.ts`): every row's agent function runs `numChains` times,
 * concurrently, each call in an episode of its own on a gateway started for the batch; the episodes' trajectories
 * (token-in / token-out, see `Recorder`) are scored and gathered into one group per row, as `Rollout.run` gathers
 * chains.
 *
 * - **Seeds**: episode `k` of row `i` samples every request with `seed + i·numChains + k`, as chain `k` of row `i`
 *   does in `Rollout.run`, so the same agent rolled out both ways samples the same tokens.
 * - **Scores**: the number (or `{ reward, metrics }`) the function returned, else a reward posted to the episode,
 *   else the task's reward on the final transcript, else the reward is missing (`RewardFailed`'s policy). The
 *   task's `groupReward` then rescores each group's scored trajectories together.
 * - **Failures** follow the task's error policies: a crash or a timeout is `EnvFailed` (masked by default) unless a
 *   request of the episode failed first (its `SamplerRejected`, `TemplateFailed`, ... then decides); a request
 *   refused for the context budget ends the episode as `context_length` and it is scored, as a chain would be. An
 *   episode that never called the model is masked (`EnvFailed`: nothing to train on). `drop_group` drops the row's
 *   group; `abort_run` fails the rollout.
 * - **Abandoned episodes** (timeout, interruption): the function's `client.signal` is aborted, the episode is
 *   closed (its requests in flight are interrupted and answered 410, later ones 404) and freed.
 *
 * @since 0.1.0
 */
import { Context, Duration, Effect, Option, Random, Result, Schema, Stream } from "effect"
import type { Scope } from "effect"
import * as AgentTask from "../../src/AgentTask.ts"
import type * as Dataset from "../../src/Dataset.ts"
import type { Conversation } from "../../src/Message.ts"
import * as RolloutError from "../../src/RolloutError.ts"
import { Sampler } from "../../src/Sampler.ts"
import type { SamplingParams } from "../../src/Sampler.ts"
import * as Task from "../../src/Task.ts"
import type * as Trajectory from "../../src/Trajectory.ts"
import * as Gateway from "../Gateway.ts"
import * as RolloutChain from "../RolloutChain.ts"
import type * as ChainPorts from "../../src/ChainPorts.ts"
import * as TaskRuntime from "../TaskRuntime.ts"
import * as Recorder from "./Recorder.ts"

// ===== Models =====

/**
 * Options of {@link groups}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly task: AgentTask.AgentTask
  /** Rows with their fields decoded (`Dataset.refine` by the task's `row`). */
  readonly rows: ReadonlyArray<Dataset.Row>
  readonly systemPrompt?: string | undefined
  /** Episodes per row (the group size). */
  readonly numChains: number
  /** Episodes in flight at once (default 64). */
  readonly maxConcurrentChains?: number | undefined
  /** Every request's sampling; with a seed, episode `k` of row `i` uses `seed + i·numChains + k`. */
  readonly sampling: SamplingParams
  readonly format: ChainPorts.Format
  readonly maxContextTokens?: number | undefined
  readonly renderTools?: boolean | undefined
  /** The task's reward as a port (`TaskRuntime`); scores episodes that returned and posted none. */
  readonly reward?: ChainPorts.Scorer | undefined
  readonly policies?: RolloutError.Policies | undefined
  /** Prefix of group and episode ids (default: random). */
  readonly runId?: string | undefined
  /**
   * The first row's index in a larger batch (a rollout worker's share of it): row `i` is row `rowOffset + i` in its
   * group's id, its `rowIndex` and its episodes' seeds, as the whole batch rolled out at once would number it.
   */
  readonly rowOffset?: number | undefined
}

interface Spec {
  readonly rowIndex: number
  readonly chainIndex: number
  readonly groupId: string
  readonly id: string
  readonly row: Dataset.Row
}

interface Outcome {
  readonly trajectory: Trajectory.Trajectory
  readonly dropGroup: boolean
}

// ===== Episodes =====

/** A failure's ending under the task's policies, or the error itself for `abort_run`. */
const failed = (
  options: Options,
  recorder: Recorder.Recorder,
  error: RolloutError.RolloutError
): Effect.Effect<Outcome, RolloutError.RolloutError> =>
  Effect.gen(function*() {
    const declared = RolloutError.policyFor(error.reason, options.policies)
    const policy = declared === "retry" ? RolloutError.afterRetry(options.policies) : declared
    if (policy === "abort_run") return yield* error
    const masked = policy !== "zero_reward"
    const trajectory = yield* Recorder.trajectory(recorder, { _tag: "Failed", error, masked })
    return {
      trajectory: masked ? trajectory : { ...trajectory, reward: 0, rewardStatus: "scored" as const },
      dropGroup: policy === "drop_group"
    }
  })

const scored = (
  trajectory: Trajectory.Trajectory,
  score: AgentTask.Score,
  source: "returned" | "posted"
): Trajectory.Trajectory => ({
  ...trajectory,
  reward: score.reward,
  rewardStatus: "scored",
  metrics: { ...trajectory.metrics, ...score.metrics, [`reward/agent/${source}`]: 1 }
})

/** Scores a trajectory whose episode ended normally. */
const score = (
  options: Options,
  recorder: Recorder.Recorder,
  trajectory: Trajectory.Trajectory,
  /** What the function threw after its context ran out, if it did not return. */
  thrown: string | undefined,
  explicit: { readonly score: AgentTask.Score; readonly source: "returned" | "posted" } | undefined
): Effect.Effect<Outcome, RolloutError.RolloutError> => {
  if (explicit !== undefined) {
    return Effect.succeed({ trajectory: scored(trajectory, explicit.score, explicit.source), dropGroup: false })
  }
  if (options.reward === undefined) {
    const ended = thrown === undefined
      ? "the agent function returned none"
      : `the agent function failed after its context ran out (${thrown}) and returned none`
    return failed(
      options,
      recorder,
      new RolloutError.RolloutError({
        reason: "RewardFailed",
        message: `no reward: ${ended}, none was posted, and the task has no reward`,
        chainId: recorder.config.id
      })
    )
  }
  return Effect.map(options.reward(trajectory, Context.empty()), (s) => ({
    trajectory: RolloutChain.applyScore(trajectory, s),
    dropGroup: false
  }))
}

/** Tasks whose function's first crash was logged (once per task and process). */
const crashLogged = new WeakSet<AgentTask.AgentTask>()

/**
 * Runs one episode: opens it, calls the function under the task's timeout, and turns what happened into a
 * trajectory.
 */
const episode = (
  options: Options,
  gateway: Gateway.Gateway["Service"],
  sampler: Sampler["Service"],
  spec: Spec
): Effect.Effect<Outcome, RolloutError.RolloutError> =>
  Effect.scoped(Effect.gen(function*() {
    const opened = yield* openEpisode(options, gateway, sampler, spec)
    const result = yield* callAgent(options, gateway, opened, spec)
    // The episode is over: later requests of a function that did not stop are refused.
    yield* opened.close
    const failure = yield* episodeFailure(options, spec, opened.recorder, result)
    if (failure !== undefined) return yield* failed(options, opened.recorder, failure)
    const value = returnedValue(result)
    const returned = AgentTask.scoreOf(value)
    const posted = opened.posted()
    const trajectory = yield* Recorder.trajectory(opened.recorder, { _tag: "Returned" })
    return yield* score(
      options,
      opened.recorder,
      trajectory,
      result._tag === "Failure" ? result.failure.message : undefined,
      returned !== undefined
        ? { score: returned, source: "returned" }
        : posted !== undefined
        ? { score: posted, source: "posted" }
        : undefined
    )
  }))

/** What the agent function did: returned (a value, or none when it ran past the task's timeout) or threw. */
type Called = Result.Result<Option.Option<void | number | AgentTask.Score>, AgentTask.AgentCrashed>

/** Opens the episode on the gateway, with the sampling seed of its row and chain. */
const openEpisode = (
  options: Options,
  gateway: Gateway.Gateway["Service"],
  sampler: Sampler["Service"],
  spec: Spec
): Effect.Effect<Gateway.Episode, never, Scope.Scope> => {
  const seed = options.sampling.seed
  return gateway.open({
    id: spec.id,
    groupId: spec.groupId,
    format: options.format,
    sampler,
    sampling: seed === undefined
      ? options.sampling
      : { ...options.sampling, seed: seed + spec.rowIndex * options.numChains + spec.chainIndex },
    requestSampling: "cap",
    maxContextTokens: options.maxContextTokens,
    renderTools: options.renderTools,
    ...(Object.keys(spec.row.fields).length === 0 ? {} : { row: spec.row.fields })
  }).pipe(Effect.orDie)
}

/** Calls the task's agent function against the episode's endpoints, under the task's timeout. */
const callAgent = (
  options: Options,
  gateway: Gateway.Gateway["Service"],
  opened: Gateway.Episode,
  spec: Spec
): Effect.Effect<Called> => {
  const { task } = options
  const input: AgentTask.Input<unknown> = {
    question: spec.row.question,
    fields: spec.row.fields,
    messages: Task.conversation(task, spec.row, options.systemPrompt),
    systemPrompt: options.systemPrompt
  }
  return AgentTask.call(task, input, {
    baseURL: opened.baseURL,
    apiKey: "agentfly",
    model: gateway.model,
    episodeId: opened.id,
    rewardURL: opened.rewardURL
  }).pipe(Effect.timeoutOption(task.timeout), Effect.result)
}

/** The value the agent function returned, if it returned in time. */
const returnedValue = (result: Called): void | number | AgentTask.Score | undefined =>
  result._tag === "Success" && Option.isSome(result.success) ? result.success.value : undefined

/**
 * Why an episode that is over did not end normally, if it did not: a timeout, a crash (unless its context had run
 * out; the first crash of a task is logged), no request to the gateway, or a returned score that is no score.
 */
const episodeFailure = (
  options: Options,
  spec: Spec,
  recorder: Recorder.Recorder,
  result: Called
): Effect.Effect<RolloutError.RolloutError | undefined> =>
  Effect.gen(function*() {
    const { task } = options
    const envFailed = (message: string) =>
      new RolloutError.RolloutError({ reason: "EnvFailed", message, chainId: spec.id })
    const known = recorder.failures.at(-1)
    const contextEnded = recorder.threads.some((t) => t.contextEnded)
    const sampled = recorder.threads.some((t) => t.turns > 0)
    if (result._tag === "Success" && Option.isNone(result.success)) {
      return envFailed(`the agent function ran past its timeout (${Duration.format(task.timeout)})`)
    }
    if (result._tag === "Failure" && !contextEnded) {
      if (known === undefined && !crashLogged.has(task)) {
        // Its first crash with where it threw (as a reward's); the later ones are counted
        // (rollout/failures/EnvFailed).
        crashLogged.add(task)
        yield* Effect.logWarning(
          `the agent function of task "${task.name}" failed: ${result.failure.stack ?? result.failure.message}\n` +
            `(EnvFailed: its trajectory is masked; later crashes are counted in rollout/failures/EnvFailed, ` +
            `the first of each step in metrics.jsonl's firstFailure)`
        )
      }
      return known ?? envFailed(`the agent function failed: ${result.failure.message}`)
    }
    // Nothing to train on: a function that never reached the model is broken, whatever it returned.
    if (!sampled && !contextEnded) return known ?? envFailed("the agent function made no request to the gateway")
    const problem = AgentTask.scoreProblem(returnedValue(result))
    if (problem === undefined) return undefined
    return new RolloutError.RolloutError({
      reason: "RewardFailed",
      message: `the agent function of task "${task.name}" ${problem}`,
      chainId: spec.id
    })
  })

// ===== Groups =====

/** Rescores a group's scored trajectories with the task's group reward (a failure keeps their own scores). */
const rescore = (
  groupReward: AgentTask.GroupReward | undefined,
  trajectories: ReadonlyArray<Trajectory.Trajectory>
): Effect.Effect<ReadonlyArray<Trajectory.Trajectory>> => {
  if (groupReward === undefined) return Effect.succeed(trajectories)
  const eligible = trajectories.flatMap((t, i) => (!t.masked && t.rewardStatus === "scored" ? [i] : []))
  if (eligible.length === 0) return Effect.succeed(trajectories)
  const prefix = `reward/${groupReward.name}/`
  return groupReward.score(eligible.map((i) => trajectories[i]!)).pipe(
    Effect.map((scores) => {
      const out = [...trajectories]
      eligible.forEach((i, j) => {
        const s = scores[j]
        if (s === undefined) return
        // A score that is not a finite number keeps the trajectory's own, flagged like a failed group reward.
        if (!Number.isFinite(s.reward)) {
          out[i] = { ...out[i]!, metrics: { ...out[i]!.metrics, [`${prefix}error`]: 1 } }
          return
        }
        const metrics = Object.fromEntries(
          Object.entries(s.metrics ?? {}).map(([k, v]) => [k.startsWith("reward/") ? k : prefix + k, v])
        )
        out[i] = {
          ...out[i]!,
          reward: s.reward,
          metrics: { ...out[i]!.metrics, ...metrics, [`${prefix}reward`]: s.reward }
        }
      })
      return out
    }),
    Effect.catch(() =>
      Effect.succeed(trajectories.map((t) => ({ ...t, metrics: { ...t.metrics, [`${prefix}error`]: 1 } })))
    )
  )
}

/**
 * Rolls out every row `numChains` times through a gateway started for the call; the groups in row order (dropped
 * groups left out). Fails only with an error whose policy is `abort_run`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const groups = (
  options: Options
): Effect.Effect<Array<Trajectory.Group>, RolloutError.RolloutError, Sampler> =>
  Effect.scoped(Effect.gen(function*() {
    const sampler = yield* Sampler
    // Its agents get their episode's URLs; nobody else can reach an episode whose id they could guess.
    const gateway = yield* Gateway.make({ privateEpisodes: true })
    const runId = options.runId ?? (yield* Random.nextIntBetween(0, 0x7fffffff)).toString(16)
    const offset = options.rowOffset ?? 0
    const specs: Array<Spec> = options.rows.flatMap((row, i) =>
      Array.from({ length: options.numChains }, (_, chainIndex) => ({
        rowIndex: offset + i,
        chainIndex,
        groupId: `${runId}-g${offset + i}`,
        id: `${runId}-g${offset + i}-c${chainIndex}`,
        row
      }))
    )
    const outcomes = yield* Effect.forEach(specs, (spec) => episode(options, gateway, sampler, spec), {
      concurrency: options.maxConcurrentChains ?? 64
    })
    const out: Array<Trajectory.Group> = []
    for (let i = 0; i < options.rows.length; i++) {
      const own = outcomes.slice(i * options.numChains, (i + 1) * options.numChains)
      if (own.some((o) => o.dropGroup)) continue
      out.push({
        groupId: `${runId}-g${offset + i}`,
        rowIndex: offset + i,
        trajectories: yield* rescore(options.task.groupReward, own.map((o) => o.trajectory))
      })
    }
    return out
  }))

// ===== Tasks' rows =====

/**
 * The options of {@link runTask}: those of {@link groups}, with raw rows checked against the task's row Schema, and
 * its reward and policies taken from the task.
 *
 * @category models
 * @since 0.1.0
 */
export interface TaskOptions extends Omit<Options, "rows" | "reward" | "policies"> {
  readonly rows: ReadonlyArray<
    {
      readonly question?: string | undefined
      readonly messages?: Conversation | undefined
      readonly [field: string]: unknown
    }
  >
}

/**
 * Rolls out an agent task's rows, as `Rollout.runTask` does for a task with tools: its rows decoded by its row
 * Schema, its reward (a `RewardActor`, failures scored 0) and policies. Emits the groups.
 *
 * @category constructors
 * @since 0.1.0
 */
export const runTask = (
  options: TaskOptions
): Stream.Stream<Trajectory.Group, RolloutError.RolloutError | Schema.SchemaError | Task.TaskError, Sampler> =>
  Stream.unwrap(
    Effect.gen(
      function*(): Effect.fn.Return<
        Stream.Stream<Trajectory.Group, RolloutError.RolloutError, Sampler>,
        Schema.SchemaError | Task.TaskError,
        Scope.Scope
      > {
        const { task } = options
        const runtime = yield* TaskRuntime.make<never>(task)
        const decode = task.row === undefined ? undefined : Schema.decodeUnknownEffect(task.row)
        const rows: Array<Dataset.Row> = []
        for (const [index, raw] of options.rows.entries()) {
          const { question, messages, ...rest } = raw
          const fields = decode === undefined
            ? rest
            : { ...rest, ...(yield* decode(rest) as Effect.Effect<Record<string, unknown>, Schema.SchemaError>) }
          rows.push({
            index,
            line: index + 1,
            ...(question === undefined ? {} : { question }),
            ...(messages === undefined ? {} : { messages }),
            fields
          })
        }
        return Stream.fromIterableEffect(groups({
          ...options,
          rows,
          systemPrompt: options.systemPrompt ?? task.defaults.systemPrompt,
          reward: runtime.reward,
          policies: task.policies
        }))
      }
    )
  )
