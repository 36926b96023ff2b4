/**
 * An agent-function task: a task whose rollout is a plain async function that the user already wrote with any SDK
 * (`openai`, the Vercel AI SDK, `@openai/agents`, ...), pointed at the gateway's base URL instead of a provider's.
 *
 * ```ts
 * export const task = AgentTask.make("calculator-openai", {
 *   row: Schema.Struct({ answer: Schema.String }),
 *   agent: async (input, client) => {
 *     const openai = new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey })
 *     // ... the agent's own loop: tools, retries, sub-agents ...
 *   },
 *   reward: MathEqual.mathEqual // scores the final transcript; or return a number, or POST it to client.rewardURL
 * })
 * ```
 *
 * **Why a variant of `Task.make`, not a new kind of thing.** An agent task *is* a `Task` (`Task.isTask` holds): its
 * row Schema, reward, error policies and defaults mean what they mean for every task, so config resolution (`"task":
 * "./task.ts"`), dataset checks, `Task.withDefaults`, `agentfly train` and `agentfly eval` take it unchanged. It adds
 * only what a black-box agent needs instead of tools and an episode protocol: the function, its time limit and an
 * optional group-relative reward. The runner recognises it with {@link isAgentTask}; the trainer runs it through
 * the gateway (`actors/gateway/AgentRollout.ts`), `numChains` times per row, concurrently, each call in an episode
 * of its own.
 *
 * **How an episode ends**, and what the trainer does with it (the reasons are `RolloutError`'s, so a task's
 * `policies` override them as for any task):
 * - the function resolves: its trajectory is scored by, in order, the number (or `{ reward, metrics }`) it returned,
 *   a reward posted to `POST /episodes/ID/reward`, the task's `reward` on the final transcript; with none of these
 *   the reward is missing (`RewardFailed`, by default scored 0 and counted as a failure);
 * - it rejects (a crash) or outlives `timeout`: `EnvFailed` (masked by default: never trained on), unless the gateway
 *   refused one of its requests first, whose reason is then the episode's (`SamplerRejected` for a prompt longer than
 *   the context, ...). A timed-out episode's `client.signal` is aborted and its later requests are refused.
 *
 * @since 0.1.0
 */
import { Duration, Effect, Schema } from "effect"
import type * as Message from "./Message.ts"
import type * as Reward from "./Reward.ts"
import type * as RolloutError from "./RolloutError.ts"
import * as Task from "./Task.ts"
import type * as Trajectory from "./Trajectory.ts"

// ===== Models =====

const TypeId = "~agentfly/AgentTask" as const

/**
 * What an agent function is told about where to send its requests. Every field is plain data, so it can be handed
 * to any SDK's constructor.
 *
 * @category models
 * @since 0.1.0
 */
export interface Client {
  /** The OpenAI-compatible API root of this episode, e.g. `http://127.0.0.1:4242/episodes/s0-g0-c1/v1`. */
  readonly baseURL: string
  /** Any non-empty string (SDKs insist on one); the gateway ignores it. */
  readonly apiKey: string
  /** The name the gateway serves (any name is accepted in requests). */
  readonly model: string
  readonly episodeId: string
  /** `POST { "reward": number, "metrics"?: { name: number } }` here to score the episode. */
  readonly rewardURL: string
  /** Aborted when the episode is abandoned (its timeout, or the run being interrupted): pass it to SDK calls. */
  readonly signal: AbortSignal
}

/**
 * What an agent function receives about its row.
 *
 * @category models
 * @since 0.1.0
 */
export interface Input<Fields> {
  readonly question: string | undefined
  /** The row's fields, decoded by the task's `row` Schema. */
  readonly fields: Fields
  /** The row's conversation as the task renders it: the system prompt, then the row's question (or its messages). */
  readonly messages: Message.Conversation
  readonly systemPrompt: string | undefined
}

/**
 * An explicit score an agent function may return.
 *
 * @category models
 * @since 0.1.0
 */
export type Score = Reward.Score

/**
 * A plain async function that runs one episode with any SDK. It may return the episode's reward.
 *
 * @category models
 * @since 0.1.0
 */
export type AgentFunction<Fields> = (input: Input<Fields>, client: Client) => Promise<void | number | Score>

/**
 * A reward that sees a whole group at once (a judge ranking the group's attempts against each other, as ART's
 * RULER does): one score per trajectory, in order; `undefined` keeps a trajectory's own score.
 *
 * @category models
 * @since 0.1.0
 */
export interface GroupReward {
  readonly name: string
  readonly score: (
    trajectories: ReadonlyArray<Trajectory.Trajectory>
  ) => Effect.Effect<ReadonlyArray<Score | undefined>, Reward.RewardError>
}

/**
 * An agent-function task: a `Task` (no tools, no environment) plus the function.
 *
 * @category models
 * @since 0.1.0
 */
export interface AgentTask extends Task.Task<never> {
  readonly [TypeId]: typeof TypeId
  readonly agent: AgentFunction<any>
  /** How long one episode may run (default 2 minutes). */
  readonly timeout: Duration.Duration
  readonly groupReward: GroupReward | undefined
  /** Type-level only: an agent task needs nothing from the run. */
  readonly "~requires"?: never
}

/**
 * The options of {@link make}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options<Fields> {
  readonly description?: string | undefined
  readonly row?: Schema.Codec<Fields, any> | undefined
  readonly prompt?:
    | ((row: Task.PromptRow<Fields>, systemPrompt: string | undefined) => Message.Conversation)
    | undefined
  readonly agent: AgentFunction<Fields>
  /** Scores the final transcript when the function returns no reward and none was posted. */
  readonly reward?: Reward.Reward<never> | undefined
  /** Rescores each group once all its episodes ended (masked ones left out). */
  readonly groupReward?: GroupReward | undefined
  readonly timeout?: Duration.Input | undefined
  readonly policies?: RolloutError.Policies | undefined
  readonly defaults?: Task.Defaults | undefined
  readonly correct?: ((trajectory: Trajectory.Trajectory) => boolean) | undefined
}

// ===== Constructors =====

/**
 * Defines an agent-function task.
 *
 * **Gotchas**
 *
 * - The function runs in this process, `numChains` copies at once: keep module-level state out of it.
 * - `defaults.maxTurns` does not apply: the SDK's own step limit does (`stopWhen`, `maxTurns`, a loop bound), and
 *   `timeout` bounds an episode.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <Fields = Readonly<Record<string, unknown>>>(name: string, options: Options<Fields>): AgentTask => {
  const base = Task.make<[], Fields>(name, {
    description: options.description,
    row: options.row,
    prompt: options.prompt,
    reward: options.reward,
    policies: options.policies,
    defaults: options.defaults,
    correct: options.correct
  })
  const { "~requires": _never, ...task } = base
  return {
    ...task,
    [TypeId]: TypeId,
    agent: options.agent as AgentFunction<any>,
    timeout: Duration.fromInputUnsafe(options.timeout ?? Duration.minutes(2)),
    groupReward: options.groupReward
  }
}

/**
 * Whether a task is an agent-function task.
 *
 * @category guards
 * @since 0.1.0
 */
export const isAgentTask = (u: unknown): u is AgentTask => Task.isTask(u) && TypeId in u

/**
 * The explicit score of a function's result, if it returned one (`void` and non-numbers give `undefined`).
 *
 * @category getters
 * @since 0.1.0
 */
export const scoreOf = (result: unknown): Score | undefined => {
  if (typeof result === "number") return { reward: result }
  if (typeof result === "object" && result !== null && typeof (result as Score).reward === "number") {
    const score = result as Score
    return score.metrics === undefined ? { reward: score.reward } : { reward: score.reward, metrics: score.metrics }
  }
  return undefined
}

/**
 * What is wrong with a function's result as a score, if anything: a number (or `{ reward }`) that is not finite, or
 * metrics that are not finite numbers. Results that are no score at all (`void`, its answer text) are not wrong:
 * the episode is then scored by a posted reward or the task's `reward`.
 *
 * @category getters
 * @since 0.1.0
 */
export const scoreProblem = (result: unknown): string | undefined => {
  const score = scoreOf(result)
  if (score === undefined) return undefined
  if (!Number.isFinite(score.reward)) return `returned ${score.reward} as its reward (expected a finite number)`
  const bad = Object.entries(score.metrics ?? {}).find(([, v]) => typeof v !== "number" || !Number.isFinite(v))
  return bad === undefined
    ? undefined
    : `returned metric ${JSON.stringify(bad[0])} = ${String(bad[1])} (expected a finite number)`
}

/**
 * Runs the function once, as an Effect: its resolution or its rejection (a crash, as a defect-free failure carrying
 * what it threw). Interruption aborts `client.signal`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const call = (
  task: AgentTask,
  input: Input<unknown>,
  client: Omit<Client, "signal">
): Effect.Effect<void | number | Score, AgentCrashed> =>
  Effect.tryPromise({
    try: (signal) => task.agent(input, { ...client, signal }),
    catch: (cause) =>
      new AgentCrashed({
        message: describe(cause),
        ...(cause instanceof Error && cause.stack !== undefined ? { stack: cause.stack } : {})
      })
  })

const describe = (cause: unknown): string =>
  cause instanceof Error ? `${cause.name}: ${cause.message}` : typeof cause === "string" ? cause : String(cause)

// ===== Errors =====

/**
 * The agent function rejected.
 *
 * @category errors
 * @since 0.1.0
 */
export class AgentCrashed extends Schema.TaggedError<AgentCrashed>()("AgentCrashed", {
  message: Schema.String,
  /** Where it threw (an `Error`'s stack), for the first crash's log line. */
  stack: Schema.optionalKey(Schema.String)
}) {}
