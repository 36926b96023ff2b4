/**
 * One rollout chain: the agent loop of one sample of one dataset row, as a fiber in its own scope.
 *
 * ```
 * acquire env (chain scope) → render prompt → [ sample → parse → tools → append observation ]* → reward
 * ```
 *
 * The loop ends with a `Trajectory.Termination`:
 * - `answer`: a terminal tool (e.g. `answer`) ran;
 * - `no_tool_call`: the assistant ended its turn without calling a tool;
 * - `max_turns`: `maxTurns` assistant turns were sampled;
 * - `context_length`: the context budget (`maxContextTokens`) ran out; the remaining budget caps `maxTokens`
 *   of every request, so a turn cut by it also ends here;
 * - `stop`: the sampler stopped (max tokens) without a complete turn;
 *
 * A turn cut by max tokens or the context budget inside a tool call (`<tool_call>{"name": "calc", "argu` and no
 * `</tool_call>`) made a failed call: each call its parser could not read counts as `tool_errors/ParseFailed` (an
 * invalid tool call in the run's figures), and the trajectory's `error` says so (`errorReason: "ParseFailed"`) while
 * its termination stays `stop` / `context_length`, the reason the chain ended.
 * - `episode_end`: the environment ended the episode (`Environment.Episode.step` returned an `end` reason);
 * - `error`: an error whose policy ends the chain (see `src/RolloutError.ts`).
 *
 * With an episode protocol (`Config.episode`), the chain resets its environment with its row and seed before the
 * first sample (`start`, whose messages join the prompt) and lets it speak after every turn (`step`: messages of
 * source `env`, appended after the tool observations, and an optional end of the episode).
 *
 * The chain speaks to three ports (`src/ChainPorts.ts`), so that any chat template, parser, tool runtime or reward
 * plugs in: a `Format` (messages ↔ tokens, token-in/token-out), a `ToolRunner` (runs one turn's tool calls against
 * the chain's environment) and a `Scorer`. The environment context comes from an `Environment.Provider`,
 * acquired in the chain's scope, so that interruption releases it.
 *
 * @since 0.1.0
 */
import { Clock, Context, Effect, Schedule } from "effect"
import type { Scope } from "effect"
import * as Environment from "../src/Environment.ts"
import type { AssistantTurn, Format, Score, Scorer, ToolRunner, Transcript } from "../src/ChainPorts.ts"
import type { Conversation, Message } from "../src/Message.ts"
import * as RolloutError from "../src/RolloutError.ts"
import type { ChatSampler, Sampler, SamplerError, SamplingParams } from "../src/Sampler.ts"
import { clipSegment } from "../src/Trajectory.ts"
import type { Segment, Termination, Trajectory } from "../src/Trajectory.ts"
import { mergeMetrics } from "./internal/mergeMetrics.ts"

/**
 * A trajectory with a reward's verdict applied: reward, status, metrics, mask and, when the reward failed, its
 * `error` (`RewardFailed: reward "buggy" threw: …`), so that the failure's message reaches the run's summary.
 *
 * @category combinators
 * @since 0.1.0
 */
export const applyScore = (trajectory: Trajectory, score: Score): Trajectory => ({
  ...trajectory,
  reward: score.reward,
  rewardStatus: score.status,
  metrics: mergeMetrics(trajectory.metrics, score.metrics),
  masked: trajectory.masked || score.masked === true,
  ...(score.failure === undefined
    ? {}
    : { error: `${score.failure.reason}: ${score.failure.message}`, errorReason: score.failure.reason })
})

// ===== Stats =====

/**
 * Live counters of a run, shared by its chains (single-threaded JS: plain mutation is safe).
 *
 * @category models
 * @since 0.1.0
 */
export interface Stats {
  chainsInFlight: number
  chainsStarted: number
  chainsFinished: number
  turns: number
  tokensGenerated: number
  samplerCalls: number
  samplerLatencyMs: number
  restarts: number
  groupsEmitted: number
  groupsDropped: number
  readonly toolCalls: Map<string, number>
  readonly terminations: Map<Termination, number>
  readonly errors: Map<RolloutError.Reason, number>
}

/**
 * Fresh counters.
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeStats = (): Stats => ({
  chainsInFlight: 0,
  chainsStarted: 0,
  chainsFinished: 0,
  turns: 0,
  tokensGenerated: 0,
  samplerCalls: 0,
  samplerLatencyMs: 0,
  restarts: 0,
  groupsEmitted: 0,
  groupsDropped: 0,
  toolCalls: new Map(),
  terminations: new Map(),
  errors: new Map()
})

const bump = <K>(map: Map<K, number>, key: K, by = 1) => map.set(key, (map.get(key) ?? 0) + by)

/**
 * The counters as CleanRL-style metrics: `rollout/turns`, `rollout/tool_calls/<tool>`,
 * `rollout/termination/<reason>`, `rollout/errors/<reason>`, `rollout/tokens_generated`,
 * `rollout/sampler_latency_ms` (mean per call), `rollout/chains_in_flight`, ...
 *
 * @category getters
 * @since 0.1.0
 */
export const metrics = (stats: Stats): Record<string, number> => {
  const out: Record<string, number> = {
    "rollout/chains_in_flight": stats.chainsInFlight,
    "rollout/chains_started": stats.chainsStarted,
    "rollout/chains_finished": stats.chainsFinished,
    "rollout/turns": stats.turns,
    "rollout/turns_per_chain": stats.chainsFinished === 0 ? 0 : stats.turns / stats.chainsFinished,
    "rollout/tokens_generated": stats.tokensGenerated,
    "rollout/sampler_calls": stats.samplerCalls,
    "rollout/sampler_latency_ms": stats.samplerCalls === 0 ? 0 : stats.samplerLatencyMs / stats.samplerCalls,
    "rollout/restarts": stats.restarts,
    "rollout/groups": stats.groupsEmitted,
    "rollout/groups_dropped": stats.groupsDropped
  }
  for (const [tool, n] of stats.toolCalls) out[`rollout/tool_calls/${tool}`] = n
  for (const [reason, n] of stats.terminations) out[`rollout/termination/${reason}`] = n
  for (const [reason, n] of stats.errors) out[`rollout/errors/${reason}`] = n
  return out
}

// ===== The chain =====

/**
 * Identity of one chain.
 *
 * @category models
 * @since 0.1.0
 */
export interface Spec {
  readonly trajectoryId: string
  readonly groupId: string
  readonly chainId: string
  readonly messages: Conversation
  readonly row?: Readonly<Record<string, unknown>> | undefined
  /** The row's position in the run (default 0). */
  readonly rowIndex?: number | undefined
  /** The seed the environment's episode starts from, the same for every chain of a group (default 0). */
  readonly episodeSeed?: number | undefined
}

/**
 * Everything a chain needs, shared by the chains of a run.
 *
 * @category models
 * @since 0.1.0
 */
export interface Config {
  /** Where assistant turns come from: a token-in/token-out `Sampler`, or a black-box chat API. */
  readonly turnSource: TurnSource
  readonly format: Format
  readonly tools: ToolRunner
  readonly reward?: Scorer | undefined
  readonly environment: Environment.Provider<any, any, never>
  /** The episode protocol, run with the chain's environment services (none: tools alone drive the episode). */
  readonly episode?: Environment.Episode<any> | undefined
  readonly sampling: SamplingParams
  readonly maxTurns: number
  /** Token budget of a sequence (prompt + completions + observations); undefined for none. */
  readonly maxContextTokens?: number | undefined
  readonly policies?: RolloutError.Policies | undefined
  /** Delays of the `retry` policy (default: 5 retries, exponential from 100 ms, jittered). */
  readonly retry?: Schedule.Schedule<unknown, RolloutError.RolloutError> | undefined
  readonly stats: Stats
}

/**
 * Where a chain's assistant turns come from. `Chat` trajectories are marked `trainable: false`.
 *
 * @category models
 * @since 0.1.0
 */
export type TurnSource =
  | { readonly _tag: "Tokens"; readonly sampler: Sampler["Service"] }
  | { readonly _tag: "Chat"; readonly chat: ChatSampler["Service"] }

/**
 * How a chain ended, for the group collector.
 *
 * @category models
 * @since 0.1.0
 */
export interface Outcome {
  readonly trajectory: Trajectory
  /** The chain hit a `drop_group` policy: its whole group must be dropped. */
  readonly dropGroup: boolean
}

/** A policy's verdict that ends the chain, carried to the finishing code. */
interface Ending {
  readonly termination: Termination
  /** The error that ended the chain, or (without a policy) the tool call a cut turn left unreadable. */
  readonly error?: RolloutError.RolloutError | undefined
  readonly policy?: RolloutError.Policy | undefined
  readonly episodeEnd?: string | undefined
}

const defaultRetry = Schedule.max([Schedule.exponential(100).pipe(Schedule.jittered), Schedule.recurs(5)])

/**
 * Runs a step under the reason's policy: `retry` retries it (then applies `afterRetry`), `abort_run` fails the
 * chain with the error; every other policy returns the error as a value for the loop to apply.
 */
const withPolicy = <A, R>(
  config: Config,
  step: Effect.Effect<A, RolloutError.RolloutError, R>
): Effect.Effect<A | ResolvedError, RolloutError.RolloutError, R> =>
  // The retry schedule is only set up once a step has failed: the happy path pays for one `catch`.
  Effect.catch(step, (error) =>
    RolloutError.policyFor(error.reason, config.policies) === "retry"
      ? step.pipe(
        Effect.retry({
          schedule: config.retry ?? defaultRetry,
          while: (e: RolloutError.RolloutError) => RolloutError.policyFor(e.reason, config.policies) === "retry"
        }),
        Effect.catch((e) => resolve(config, e))
      )
      : resolve(config, error))

/** The policy that applies to an error now (after any retries); fails the chain on `abort_run`. */
const resolve = (
  config: Config,
  error: RolloutError.RolloutError
): Effect.Effect<ResolvedError, RolloutError.RolloutError> => {
  bump(config.stats.errors, error.reason)
  const declared = RolloutError.policyFor(error.reason, config.policies)
  const policy = declared === "retry" ? RolloutError.afterRetry(config.policies) : declared
  return policy === "abort_run" ? Effect.fail(error) : Effect.succeed(new ResolvedError(error, policy))
}

class ResolvedError {
  readonly error: RolloutError.RolloutError
  readonly policy: Exclude<RolloutError.Policy, "retry" | "abort_run">
  constructor(error: RolloutError.RolloutError, policy: Exclude<RolloutError.Policy, "retry" | "abort_run">) {
    this.error = error
    this.policy = policy
  }
}

const feedbackMessage = (error: RolloutError.RolloutError, id: string): Message => ({
  role: "tool",
  content: error.message,
  tool_call_id: id,
  is_error: true
})

/**
 * Runs one chain to its end in a scope of its own and returns its trajectory. Fails only with an error whose
 * policy is `abort_run`. Interruption releases the chain's environment.
 *
 * @category constructors
 * @since 0.1.0
 */
export const run = (spec: Spec, config: Config): Effect.Effect<Outcome, RolloutError.RolloutError> =>
  Effect.scoped(runScoped(spec, config))

const runScoped = Effect.fnUntraced(function*(
  spec: Spec,
  config: Config
): Effect.fn.Return<Outcome, RolloutError.RolloutError, Scope.Scope> {
  const stats = config.stats
  const startedAt = yield* Clock.currentTimeMillis
  const local: Local = { turns: 0, toolCalls: 0, tokens: 0, samplerMs: 0, toolErrors: new Map() }
  const rowIndex = spec.rowIndex ?? 0
  const seed = spec.episodeSeed ?? 0
  const row = spec.row ?? {}

  const acquired = yield* withPolicy(
    config,
    config.environment.acquire({ chainId: spec.chainId, groupId: spec.groupId, rowIndex, row, seed }).pipe(
      Effect.map((context): Context.Context<never> => context),
      Effect.mapError((e) =>
        new RolloutError.RolloutError({ reason: "LeaseFailed", message: errorText(e), chainId: spec.chainId })
      )
    )
  )
  if (acquired instanceof ResolvedError) {
    return yield* finish(spec, config, undefined, Context.empty(), local, startedAt, toEnding(acquired))
  }
  const env = acquired
  let prompt = spec.messages
  const episodeStart = config.episode?.start
  if (episodeStart !== undefined) {
    const first = yield* withPolicy(
      config,
      inEnvironment(
        episodeStart({ chainId: spec.chainId, groupId: spec.groupId, rowIndex, row, seed, messages: spec.messages }),
        env,
        "start"
      )
    )
    if (first instanceof ResolvedError) {
      return yield* finish(spec, config, undefined, env, local, startedAt, toEnding(first))
    }
    if (first !== undefined && first.length > 0) prompt = [...prompt, ...Environment.toMessages(first)]
  }
  const started = yield* withPolicy(config, config.format.start(prompt, config.tools.schemas))
  if (started instanceof ResolvedError) {
    return yield* finish(spec, config, undefined, env, local, startedAt, toEnding(started))
  }
  const transcript = started
  const stopTokenIds = [...(config.sampling.stopTokenIds ?? []), ...config.format.stopTokenIds]
  // One request's parameters, rebuilt only when the context budget lowers `maxTokens`.
  let sampling: SamplingParams = { ...config.sampling, stopTokenIds }
  const clock = yield* Clock.Clock

  const ending: Ending = yield* Effect.gen(function*(): Effect.fn.Return<Ending, RolloutError.RolloutError> {
    while (true) {
      if (local.turns >= config.maxTurns) return { termination: "max_turns" }
      const remaining = config.maxContextTokens === undefined
        ? Number.POSITIVE_INFINITY
        : config.maxContextTokens - transcript.length()
      if (remaining <= 0) return { termination: "context_length" }
      const maxTokens = Math.min(config.sampling.maxTokens, remaining)
      if (maxTokens !== sampling.maxTokens) sampling = { ...config.sampling, maxTokens, stopTokenIds }
      const before = transcript.length()
      const turn = yield* sampleTurn(spec, config, transcript, sampling, local, clock)
      if (turn instanceof ResolvedError) return toEnding(turn)
      const generated = transcript.length() - before
      stats.tokensGenerated += generated
      local.tokens += generated
      local.turns++
      stats.turns++
      if (!turn.complete) return cutTurn(spec, config, turn, local, maxTokens < config.sampling.maxTokens)
      // Parse failures: with `feedback` the model reads what was wrong; valid calls of the same turn still run.
      const feedback: Array<Message> = []
      if (turn.parseErrors.length > 0) {
        const resolved = yield* resolve(
          config,
          new RolloutError.RolloutError({
            reason: "ParseFailed",
            message: `could not parse the tool call: ${turn.parseErrors.join("; ")}`,
            chainId: spec.chainId
          })
        )
        if (resolved.policy !== "feedback") return toEnding(resolved)
        feedback.push(feedbackMessage(resolved.error, `parse_error_${local.turns}`))
      } else if (turn.toolCalls.length === 0 && config.episode?.step === undefined) {
        return { termination: "no_tool_call" }
      }
      let observations: ReadonlyArray<Message> = feedback
      let terminal = false
      if (turn.toolCalls.length > 0) {
        local.toolCalls += turn.toolCalls.length
        for (const call of turn.toolCalls) bump(stats.toolCalls, call.function.name)
        const executed = yield* withPolicy(config, config.tools.executeTurn(turn.toolCalls, env))
        if (executed instanceof ResolvedError) {
          if (executed.policy !== "feedback" || !RolloutError.canFeedBack(executed.error.reason)) {
            return toEnding(executed)
          }
          observations = [...turn.toolCalls.map((call) => feedbackMessage(executed.error, call.id)), ...feedback]
        } else {
          observations = feedback.length === 0 ? executed.messages : [...executed.messages, ...feedback]
          terminal = executed.terminal
          for (const reason of executed.errors ?? []) bump(local.toolErrors, reason)
        }
      }
      // The environment speaks after the tools ran (not after a terminal tool: the chain ends with `answer`).
      let end: string | undefined
      const episodeStep = config.episode?.step
      if (episodeStep !== undefined && !terminal) {
        const said = yield* withPolicy(
          config,
          inEnvironment(episodeStep({ turn: local.turns, assistant: turn.message, observations }), env, "step")
        )
        if (said instanceof ResolvedError) return toEnding(said)
        if (said !== undefined) {
          const spoken = Environment.toMessages(said.messages ?? [])
          observations = observations.length === 0 ? spoken : [...observations, ...spoken]
          end = said.end
        }
        if (observations.length === 0 && end === undefined) return { termination: "no_tool_call" }
      }
      if (observations.length > 0) {
        const appended = yield* withPolicy(config, transcript.appendObservations(observations))
        if (appended instanceof ResolvedError) return toEnding(appended)
      }
      if (terminal) return { termination: "answer" }
      if (end !== undefined) return { termination: "episode_end", episodeEnd: end }
      // An observation can overrun the budget (a 1,000-digit result); `finish` cuts the excess.
      if (config.maxContextTokens !== undefined && transcript.length() >= config.maxContextTokens) {
        return { termination: "context_length" }
      }
    }
  })
  return yield* finish(spec, config, transcript, env, local, startedAt, ending)
})

/**
 * One assistant turn from the turn source: token mode samples ids and appends them verbatim; chat mode asks a
 * black-box API for a message and appends its rendering (no logprobs: the trajectory is not trainable).
 */
const sampleTurn = (
  spec: Spec,
  config: Config,
  transcript: Transcript,
  sampling: SamplingParams,
  local: Local,
  clock: Clock.Clock
): Effect.Effect<AssistantTurn | ResolvedError, RolloutError.RolloutError> => {
  const source = config.turnSource
  // Latency of the sampler call itself (retries included), without parsing and tokenizing; the chain's clock is
  // read directly (it is the fiber's, a `TestClock` in tests) instead of looked up twice a turn.
  const timed = <A, E>(call: Effect.Effect<A, E>): Effect.Effect<A, E> =>
    Effect.suspend(() => {
      // Read when the call starts, not when it is built.
      const t0 = clock.currentTimeMillisUnsafe()
      return Effect.ensuring(
        call,
        Effect.sync(() => {
          const ms = clock.currentTimeMillisUnsafe() - t0
          config.stats.samplerCalls++
          config.stats.samplerLatencyMs += ms
          local.samplerMs += ms
        })
      )
    })
  const fromSampler = (e: SamplerError) => RolloutError.fromSamplerError(e, spec.chainId)
  if (source._tag === "Tokens") {
    return Effect.flatMap(
      timed(withPolicy(
        config,
        Effect.mapError(
          source.sampler.generate({ promptTokenIds: transcript.promptTokenIds(), sampling }),
          fromSampler
        )
      )),
      (sampled) =>
        sampled instanceof ResolvedError
          ? Effect.succeed(sampled)
          : withPolicy(config, transcript.appendSampled(sampled))
    )
  }
  const appendAssistant = transcript.appendAssistant
  if (appendAssistant === undefined) {
    return resolve(
      config,
      new RolloutError.RolloutError({
        reason: "TemplateFailed",
        message: "this format cannot append a recorded assistant message (chat mode)",
        chainId: spec.chainId
      })
    )
  }
  return Effect.flatMap(
    timed(withPolicy(
      config,
      Effect.mapError(
        source.chat.complete({ messages: transcript.messages(), tools: config.tools.schemas, sampling }),
        fromSampler
      )
    )),
    (reply) =>
      reply instanceof ResolvedError ? Effect.succeed(reply) : withPolicy(
        config,
        Effect.map(
          appendAssistant({
            role: "assistant",
            content: reply.content,
            ...(reply.toolCalls.length === 0 ? {} : { tool_calls: reply.toolCalls })
          }),
          (turn) => {
            const complete = reply.finishReason !== "length"
            return turn.complete === complete ? turn : { ...turn, complete }
          }
        )
      )
  )
}

/** Mutable per-chain counters. */
interface Local {
  turns: number
  toolCalls: number
  tokens: number
  samplerMs: number
  readonly toolErrors: Map<string, number>
}

/**
 * The ending of a turn cut by max tokens (`stop`) or by the context budget (`context_length`). A tool call the cut
 * left unreadable (opened and never closed) is a failed call, counted as `tool_errors/ParseFailed`; no policy
 * applies (the chain ends either way), but the trajectory's `error` says what was cut.
 */
const cutTurn = (spec: Spec, config: Config, turn: AssistantTurn, local: Local, byContext: boolean): Ending => {
  const termination = byContext ? "context_length" : "stop"
  if (turn.parseErrors.length === 0) return { termination }
  bump(local.toolErrors, "ParseFailed", turn.parseErrors.length)
  bump(config.stats.errors, "ParseFailed")
  const limit = byContext ? "the context budget" : "max tokens"
  return {
    termination,
    error: new RolloutError.RolloutError({
      reason: "ParseFailed",
      message: `the turn was cut by ${limit} inside a tool call: ${turn.parseErrors.join("; ")}`,
      chainId: spec.chainId
    })
  }
}

/** An episode method run with the chain's environment services; its failures are the environment's. */
const inEnvironment = <A>(
  effect: Effect.Effect<A, Environment.EnvError, any>,
  env: Context.Context<never>,
  method: string
): Effect.Effect<A, RolloutError.RolloutError> =>
  effect.pipe(
    Effect.provideContext(env as Context.Context<any>),
    Effect.mapError((e) =>
      new RolloutError.RolloutError({
        reason: "EnvFailed",
        message: `episode ${method}: ${typeof e === "object" && e !== null && "message" in e ? e.message : String(e)}`
      })
    )
  ) as Effect.Effect<A, RolloutError.RolloutError>

const toEnding = (resolved: ResolvedError): Ending => ({
  termination: "error",
  error: resolved.error,
  policy: resolved.policy === "feedback" ? "mask" : resolved.policy
})

const errorText = (e: unknown): string =>
  typeof e === "object" && e !== null && "message" in e ? String((e as { message: unknown }).message) : String(e)

/** Segments cut to the context budget: what a tool returned past it is never trained on nor fed to the model. */
const clipped = (segments: ReadonlyArray<Segment>, maxTokens: number | undefined) =>
  maxTokens === undefined ? segments : segments.map((segment) => clipSegment(segment, maxTokens))

/**
 * Builds the trajectory, scores it (in the chain's scope, with its environment) and counts the ending. Plain
 * combinators rather than a generator: this runs once per episode on every chain.
 */
const finish = (
  spec: Spec,
  config: Config,
  transcript: Transcript | undefined,
  env: Context.Context<never>,
  local: Local,
  startedAt: number,
  ending: Ending
): Effect.Effect<Outcome, RolloutError.RolloutError> =>
  Effect.flatMap(Clock.currentTimeMillis, (endedAt) => {
    const masked = ending.policy === "mask" || ending.policy === "drop_group"
    const metrics: Record<string, number> = {
      turns: local.turns,
      tool_calls: local.toolCalls,
      tokens_generated: local.tokens,
      sampler_latency_ms: local.samplerMs,
      rollout_time_ms: endedAt - startedAt
    }
    for (const [reason, n] of local.toolErrors) metrics[`tool_errors/${reason}`] = n
    const trajectory: Trajectory = {
      trajectoryId: spec.trajectoryId,
      groupId: spec.groupId,
      chainId: spec.chainId,
      messages: transcript?.messages() ?? spec.messages,
      segments: clipped(transcript?.segments() ?? [], config.maxContextTokens),
      termination: ending.termination,
      reward: 0,
      rewardStatus: masked ? "failed" : "pending",
      metrics,
      trainable: config.turnSource._tag === "Tokens",
      masked,
      ...(spec.row === undefined ? {} : { row: spec.row }),
      ...(ending.error === undefined
        ? {}
        : { error: `${ending.error.reason}: ${ending.error.message}`, errorReason: ending.error.reason }),
      ...(ending.episodeEnd === undefined ? {} : { episodeEnd: ending.episodeEnd })
    }
    const outcome: Effect.Effect<Outcome, RolloutError.RolloutError> = ending.policy === "zero_reward"
      ? Effect.succeed({ trajectory: { ...trajectory, reward: 0, rewardStatus: "scored" }, dropGroup: false })
      : masked
      ? Effect.succeed({ trajectory, dropGroup: ending.policy === "drop_group" })
      : score(trajectory, config, env)
    return Effect.map(outcome, (done) => {
      bump(config.stats.terminations, done.trajectory.termination)
      return done
    })
  })

const score = (
  trajectory: Trajectory,
  config: Config,
  env: Context.Context<never>
): Effect.Effect<Outcome, RolloutError.RolloutError> => {
  if (config.reward === undefined) {
    return Effect.succeed({ trajectory: { ...trajectory, rewardStatus: "not_applicable" }, dropGroup: false })
  }
  return Effect.map(withPolicy(config, config.reward(trajectory, env)), (scored): Outcome => {
    if (!(scored instanceof ResolvedError)) return { trajectory: applyScore(trajectory, scored), dropGroup: false }
    const masked = scored.policy === "mask" || scored.policy === "drop_group"
    return {
      trajectory: {
        ...trajectory,
        reward: 0,
        rewardStatus: masked ? "failed" : "scored",
        masked: trajectory.masked || masked,
        error: `${scored.error.reason}: ${scored.error.message}`,
        errorReason: scored.error.reason
      },
      dropGroup: scored.policy === "drop_group"
    }
  })
}
