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
 * - `error`: an error whose policy ends the chain (see `src/RolloutError.ts`). It leaves the failing step as a
 *   `ChainEnded` failure (`actors/internal/chainPolicy.ts`) and reaches, through the error channel, the one place
 *   that turns it into the chain's ending (`runScoped`).
 *
 * With a context policy (`Config.context`, `src/ContextPolicy.ts`), the chain folds its context before a turn once
 * the open segment holds `at × maxContextTokens` tokens (dropping the oldest turns, or folding them into a summary
 * the policy writes in a folding turn or a tool writes), starting a new segment, and goes on; the trajectory's
 * reward is then split over its segments. Without one (the default) nothing of this runs.
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
import * as ContextPolicy from "../src/ContextPolicy.ts"
import * as Environment from "../src/Environment.ts"
import type { AssistantTurn, Format, RewardResult, Scorer, ToolRunner, ToolTurn } from "../src/ChainPorts.ts"
import { promptRequest, type Transcript } from "../src/ChainPorts.ts"
import type { Conversation, Message } from "../src/Message.ts"
import * as RolloutError from "../src/RolloutError.ts"
import type { ChatSampler, Sampler, SamplingParams } from "../src/Sampler.ts"
import { clipSegment, hasSegmentRewards } from "../src/Trajectory.ts"
import type { Segment, Termination, Trajectory } from "../src/Trajectory.ts"
import * as ContextFold from "./internal/contextFold.ts"
import { ChainEnded, endingOf, feedbackAs, settle, withPolicy, withVerdict } from "./internal/chainPolicy.ts"
import type { Ending, Verdict } from "./internal/chainPolicy.ts"
import { mergeMetrics } from "./internal/mergeMetrics.ts"
import * as Telemetry from "./Telemetry.ts"

/**
 * A trajectory with a reward's verdict applied: reward, status, metrics, mask and, when the reward failed, its
 * `error` (`RewardFailed: reward "buggy" threw: …`), so that the failure's message reaches the run's summary.
 *
 * @category combinators
 * @since 0.1.0
 */
export const applyScore = (trajectory: Trajectory, score: RewardResult): Trajectory => {
  const scored = applyVerdict(trajectory, score)
  const rewards = score.segmentRewards
  if (rewards === undefined) return scored
  if (rewards.length !== trajectory.segments.length || rewards.some((r) => !Number.isFinite(r))) {
    const error = `RewardFailed: the reward scored the segments [${rewards.join(", ")}] of a trajectory of ` +
      `${trajectory.segments.length} (one finite number per segment expected)`
    return { ...scored, masked: true, rewardStatus: "failed", error, errorReason: "RewardFailed" }
  }
  return { ...scored, segments: scored.segments.map((segment, k) => ({ ...segment, reward: rewards[k]! })) }
}

const applyVerdict = (trajectory: Trajectory, score: RewardResult): Trajectory => ({
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
  /** What to do when the context nears `maxContextTokens` (none: the chain ends there). */
  readonly context?: ContextPolicy.ContextPolicy | undefined
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


/**
 * Runs one chain to its end in a scope of its own and returns its trajectory. Fails only with an error whose
 * policy is `abort_run`. Interruption releases the chain's environment.
 *
 * @category constructors
 * @since 0.1.0
 */
export const run = (spec: Spec, config: Config): Effect.Effect<Outcome, RolloutError.RolloutError> =>
  Effect.scoped(runScoped(spec, config)).pipe(Telemetry.span("RolloutChain.run", {
    "chain.id": spec.chainId,
    "group.id": spec.groupId,
    "row.index": spec.rowIndex ?? 0
  }, (outcome: Outcome) => Telemetry.chainSaid(outcome.trajectory)))

// ===== The loop =====

/**
 * One chain's state, shared by its steps: what it holds so far (read by `finish`, however the chain ends) and its
 * own counters.
 */
interface Chain {
  readonly spec: Spec
  readonly config: Config
  /** The fiber's clock (a `TestClock` in tests), read directly rather than looked up twice a turn. */
  readonly clock: Clock.Clock
  readonly startedAt: number
  /** The environment's services: empty until acquired. */
  env: Context.Context<never>
  /** Undefined until the prompt is rendered. */
  transcript: Transcript | undefined
  readonly stopTokenIds: ReadonlyArray<number>
  /** One request's parameters, rebuilt only when the context budget lowers `maxTokens`. */
  sampling: SamplingParams
  turns: number
  toolCalls: number
  tokens: number
  samplerMs: number
  readonly toolErrors: Map<string, number>
  /** How many messages of the prompt every folded context keeps (set when the prompt is rendered). */
  head: number
  folds: number
}

const runScoped = Effect.fnUntraced(function*(
  spec: Spec,
  config: Config
): Effect.fn.Return<Outcome, RolloutError.RolloutError, Scope.Scope> {
  const startedAt = yield* Clock.currentTimeMillis
  const stopTokenIds = [...(config.sampling.stopTokenIds ?? []), ...config.format.stopTokenIds]
  const chain: Chain = {
    spec,
    config,
    clock: yield* Clock.Clock,
    startedAt,
    env: Context.empty(),
    transcript: undefined,
    stopTokenIds,
    sampling: { ...config.sampling, stopTokenIds },
    turns: 0,
    toolCalls: 0,
    tokens: 0,
    samplerMs: 0,
    toolErrors: new Map(),
    head: 0,
    folds: 0
  }
  // Every ending meets here: the loop's own, or that of an error whose policy ended the chain at any step.
  const ending = yield* Effect.catchTag(play(chain), "ChainEnded", (ended) => Effect.succeed(endingOf(ended)))
  return yield* finish(chain, ending)
})

/** The chain from its environment to its last turn. */
const play = Effect.fnUntraced(function*(
  chain: Chain
): Effect.fn.Return<Ending, RolloutError.RolloutError | ChainEnded, Scope.Scope> {
  const transcript = yield* open(chain)
  while (true) {
    const [turns, tokens] = [chain.turns, chain.tokens]
    const ending = yield* playTurn(chain, transcript).pipe(Telemetry.turnSpan(chain, turns, tokens))
    if (ending !== undefined) return ending
  }
})

/** Acquires the chain's environment (in the chain's scope), starts its episode and renders the prompt. */
const open = Effect.fnUntraced(function*(
  chain: Chain
): Effect.fn.Return<Transcript, RolloutError.RolloutError | ChainEnded, Scope.Scope> {
  const { config, spec } = chain
  const episode = { chainId: spec.chainId, groupId: spec.groupId, rowIndex: spec.rowIndex ?? 0, row: spec.row ?? {} }
  const seed = spec.episodeSeed ?? 0
  chain.env = yield* withPolicy(
    config,
    config.environment.acquire({ ...episode, seed }).pipe(
      Telemetry.span("RolloutChain.lease", {}),
      Effect.map((context): Context.Context<never> => context),
      Effect.mapError((e) =>
        new RolloutError.RolloutError({ reason: "LeaseFailed", message: errorText(e), chainId: spec.chainId })
      )
    )
  )
  let prompt = spec.messages
  const episodeStart = config.episode?.start
  if (episodeStart !== undefined) {
    const first = yield* withPolicy(
      config,
      inEnvironment(episodeStart({ ...episode, seed, messages: spec.messages }), chain.env, "start")
    )
    if (first !== undefined && first.length > 0) prompt = [...prompt, ...Environment.toMessages(first)]
  }
  chain.transcript = yield* withPolicy(config, config.format.start(prompt, config.tools.schemas))
  chain.head = prompt.length
  return chain.transcript
})

/**
 * One turn: sample, run its tool calls, let the environment speak, append what they said. Its ending, when the
 * turn ends the chain.
 */
const playTurn = Effect.fnUntraced(function*(
  chain: Chain,
  transcript: Transcript
): Effect.fn.Return<Ending | undefined, RolloutError.RolloutError | ChainEnded> {
  const { config } = chain
  if (chain.turns >= config.maxTurns) return { termination: "max_turns" }
  if (config.context !== undefined && ContextFold.due(chain, config.context, transcript)) {
    const sample = (maxTokens: number) => sampleFoldingTurn(chain, transcript, maxTokens)
    const ended = yield* ContextFold.fold(chain, config.context, transcript, sample)
    if (ended !== undefined) return ended
  }
  const remaining = config.maxContextTokens === undefined
    ? Number.POSITIVE_INFINITY
    : config.maxContextTokens - transcript.length()
  if (remaining <= 0) return { termination: "context_length" }
  const maxTokens = Math.min(config.sampling.maxTokens, remaining)
  if (maxTokens !== chain.sampling.maxTokens) {
    chain.sampling = { ...config.sampling, maxTokens, stopTokenIds: chain.stopTokenIds }
  }
  const before = transcript.length()
  const turn = yield* sampleTurn(chain, transcript)
  const generated = transcript.length() - before
  config.stats.tokensGenerated += generated
  chain.tokens += generated
  chain.turns++
  config.stats.turns++
  if (!turn.complete) return cutTurn(chain, turn, maxTokens < config.sampling.maxTokens)
  // Parse failures: with `feedback` the model reads what was wrong; valid calls of the same turn still run.
  const parseFailed = turn.parseErrors.length > 0
  if (!parseFailed && turn.toolCalls.length === 0 && config.episode?.step === undefined) {
    return { termination: "no_tool_call" }
  }
  const feedback = parseFailed ? yield* parseFeedback(chain, turn) : []
  const ran = turn.toolCalls.length === 0
    ? { messages: feedback, terminal: false }
    : yield* runTools(chain, turn, feedback)
  let observations = ran.messages
  // The environment speaks after the tools ran (not after a terminal tool: the chain ends with `answer`).
  let end: string | undefined
  const episodeStep = config.episode?.step
  if (episodeStep !== undefined && !ran.terminal) {
    const said = yield* environmentStep(chain, episodeStep, turn, observations)
    observations = said.observations
    end = said.end
    if (observations.length === 0 && end === undefined) return { termination: "no_tool_call" }
  }
  if (observations.length > 0) yield* withPolicy(config, transcript.appendObservations(observations))
  if (ran.terminal) return { termination: "answer" }
  if (end !== undefined) return { termination: "episode_end", episodeEnd: end }
  // An observation can overrun the budget (a 1,000-digit result); `finish` cuts the excess.
  if (config.maxContextTokens !== undefined && transcript.length() >= config.maxContextTokens) {
    return { termination: "context_length" }
  }
  return undefined
})

/** A folding turn: the policy's summary, sampled with at most `maxTokens`; counted as generated tokens. */
const sampleFoldingTurn = (chain: Chain, transcript: Transcript, maxTokens: number) =>
  Effect.suspend(() => {
    chain.sampling = { ...chain.config.sampling, maxTokens, stopTokenIds: chain.stopTokenIds }
    const length = transcript.length()
    return Effect.map(sampleTurn(chain, transcript), (turn) => {
      const generated = transcript.length() - length
      chain.config.stats.tokensGenerated += generated
      chain.tokens += generated
      return turn
    })
  })

const feedbackMessage = (error: RolloutError.RolloutError, id: string): Message => ({
  role: "tool",
  content: error.message,
  tool_call_id: id,
  is_error: true
})

/** A turn's unreadable tool calls as one `ParseFailed` error; with `feedback`, a message the model reads. */
const parseFeedback = (
  chain: Chain,
  turn: AssistantTurn
): Effect.Effect<ReadonlyArray<Message>, RolloutError.RolloutError | ChainEnded> =>
  settle(
    chain.config,
    new RolloutError.RolloutError({
      reason: "ParseFailed",
      message: `could not parse the tool call: ${turn.parseErrors.join("; ")}`,
      chainId: chain.spec.chainId
    }),
    feedbackAs((error) => [feedbackMessage(error, `parse_error_${chain.turns}`)])
  )

/**
 * Runs a turn's tool calls; their messages come before the parse feedback. With `feedback`, a failed turn's error
 * becomes one observation per call.
 */
const runTools = (
  chain: Chain,
  turn: AssistantTurn,
  feedback: ReadonlyArray<Message>
): Effect.Effect<ToolTurn, RolloutError.RolloutError | ChainEnded> => {
  const { config } = chain
  chain.toolCalls += turn.toolCalls.length
  for (const call of turn.toolCalls) bump(config.stats.toolCalls, call.function.name)
  const failed = feedbackAs((error): ToolTurn => ({
    messages: turn.toolCalls.map((call) => feedbackMessage(error, call.id)),
    terminal: false
  }))
  return Effect.map(withPolicy(config, config.tools.executeTurn(turn.toolCalls, chain.env), failed), (executed) => {
    for (const reason of executed.errors ?? []) bump(chain.toolErrors, reason)
    return feedback.length === 0 ? executed : { ...executed, messages: [...executed.messages, ...feedback] }
  })
}

/** A turn's observations, the environment's messages after them, and the end of the episode when it said so. */
interface Said {
  readonly observations: ReadonlyArray<Message>
  readonly end?: string | undefined
}

/** What the environment says after a turn (`Episode.step`), after the turn's observations; and its episode's end. */
const environmentStep = (
  chain: Chain,
  step: NonNullable<Environment.Episode<any>["step"]>,
  turn: AssistantTurn,
  observations: ReadonlyArray<Message>
): Effect.Effect<Said, RolloutError.RolloutError | ChainEnded> =>
  Effect.map(
    withPolicy(
      chain.config,
      inEnvironment(step({ turn: chain.turns, assistant: turn.message, observations }), chain.env, "step")
    ),
    (said) => {
      if (said === undefined) return { observations }
      const spoken = Environment.toMessages(said.messages ?? [])
      return { observations: observations.length === 0 ? spoken : [...observations, ...spoken], end: said.end }
    }
  )

/**
 * One assistant turn from the turn source: token mode samples ids and appends them verbatim; chat mode asks a
 * black-box API for a message and appends its rendering (no logprobs: the trajectory is not trainable).
 */
const sampleTurn = (
  chain: Chain,
  transcript: Transcript
): Effect.Effect<AssistantTurn, RolloutError.RolloutError | ChainEnded> => {
  const { config } = chain
  const source = config.turnSource
  if (source._tag === "Chat") return chatTurn(chain, source.chat, transcript)
  const sampled = Effect.mapError(
    Effect.flatMap(promptRequest(transcript, chain.sampling), (request) => source.sampler.generate(request)),
    (e) => RolloutError.fromSamplerError(e, chain.spec.chainId)
  )
  return Effect.flatMap(
    timed(chain, withPolicy(config, sampled)),
    (result) => withPolicy(config, transcript.appendSampled(result))
  )
}

/** Chat mode's turn: the API's message, rendered by the format's `appendAssistant`. */
const chatTurn = (
  chain: Chain,
  chat: ChatSampler["Service"],
  transcript: Transcript
): Effect.Effect<AssistantTurn, RolloutError.RolloutError | ChainEnded> => {
  const { config, spec } = chain
  const appendAssistant = transcript.appendAssistant
  if (appendAssistant === undefined) {
    return settle(
      config,
      new RolloutError.RolloutError({
        reason: "TemplateFailed",
        message: "this format cannot append a recorded assistant message (chat mode)",
        chainId: spec.chainId
      })
    )
  }
  const completed = Effect.mapError(
    chat.complete({ messages: transcript.messages(), tools: config.tools.schemas, sampling: chain.sampling }),
    (e) => RolloutError.fromSamplerError(e, spec.chainId)
  )
  return Effect.flatMap(timed(chain, withPolicy(config, completed)), (reply) =>
    withPolicy(
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
    ))
}

/** Latency of a sampler call itself (retries included), without parsing and tokenizing: per chain and per run. */
const timed = <A, E>(chain: Chain, call: Effect.Effect<A, E>): Effect.Effect<A, E> =>
  Effect.suspend(() => {
    // Read when the call starts, not when it is built.
    const t0 = chain.clock.currentTimeMillisUnsafe()
    return Effect.ensuring(
      call,
      Effect.sync(() => {
        const ms = chain.clock.currentTimeMillisUnsafe() - t0
        chain.config.stats.samplerCalls++
        chain.config.stats.samplerLatencyMs += ms
        chain.samplerMs += ms
      })
    )
  })

/**
 * The ending of a turn cut by max tokens (`stop`) or by the context budget (`context_length`). A tool call the cut
 * left unreadable (opened and never closed) is a failed call, counted as `tool_errors/ParseFailed`; no policy
 * applies (the chain ends either way), but the trajectory's `error` says what was cut.
 */
const cutTurn = (chain: Chain, turn: AssistantTurn, byContext: boolean): Ending => {
  const termination = byContext ? "context_length" : "stop"
  if (turn.parseErrors.length === 0) return { termination }
  bump(chain.toolErrors, "ParseFailed", turn.parseErrors.length)
  bump(chain.config.stats.errors, "ParseFailed")
  const limit = byContext ? "the context budget" : "max tokens"
  return {
    termination,
    error: new RolloutError.RolloutError({
      reason: "ParseFailed",
      message: `the turn was cut by ${limit} inside a tool call: ${turn.parseErrors.join("; ")}`,
      chainId: chain.spec.chainId
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

const errorText = (e: unknown): string =>
  typeof e === "object" && e !== null && "message" in e ? String((e as { message: unknown }).message) : String(e)

// ===== The ending =====

/** Segments cut to the context budget: what a tool returned past it is never trained on nor fed to the model. */
const clipped = (segments: ReadonlyArray<Segment>, maxTokens: number | undefined) =>
  maxTokens === undefined ? segments : segments.map((segment) => clipSegment(segment, maxTokens))

/**
 * Builds the trajectory, scores it (in the chain's scope, with its environment) and counts the ending. Plain
 * combinators rather than a generator: this runs once per episode on every chain.
 */
const finish = (chain: Chain, ending: Ending): Effect.Effect<Outcome, RolloutError.RolloutError> =>
  Effect.flatMap(Clock.currentTimeMillis, (endedAt) => {
    const { config, spec, transcript } = chain
    const masked = ending.policy === "mask" || ending.policy === "drop_group"
    const metrics: Record<string, number> = {
      turns: chain.turns,
      tool_calls: chain.toolCalls,
      tokens_generated: chain.tokens,
      sampler_latency_ms: chain.samplerMs,
      rollout_time_ms: endedAt - chain.startedAt
    }
    for (const [reason, n] of chain.toolErrors) metrics[`tool_errors/${reason}`] = n
    const context = config.context !== undefined && config.context.policy !== "none" ? config.context : undefined
    if (context !== undefined) metrics["folds"] = chain.folds
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
      : score(trajectory, config, chain.env)
    return Effect.map(outcome, (done) => {
      bump(config.stats.terminations, done.trajectory.termination)
      return context === undefined ? done : { ...done, trajectory: segmentRewarded(done.trajectory, context) }
    })
  })

/** A folded trajectory's reward split over its segments, unless its reward scored them itself. */
const segmentRewarded = (trajectory: Trajectory, policy: ContextPolicy.ContextPolicy): Trajectory =>
  hasSegmentRewards(trajectory) ? trajectory : ContextPolicy.withSegmentRewards(trajectory, policy)

/** The reward's verdict on a trajectory (a failed reward ends nothing: its policy scores or masks it). */
const score = (
  trajectory: Trajectory,
  config: Config,
  env: Context.Context<never>
): Effect.Effect<Outcome, RolloutError.RolloutError> => {
  if (config.reward === undefined) {
    return Effect.succeed({ trajectory: { ...trajectory, rewardStatus: "not_applicable" }, dropGroup: false })
  }
  const scored = Effect.map(
    config.reward(trajectory, env).pipe(Telemetry.span("RolloutChain.reward", {}, Telemetry.rewardSaid)),
    (score): Outcome => ({ trajectory: applyScore(trajectory, score), dropGroup: false })
  )
  return withVerdict(config, scored, (error, verdict): Outcome => rewardFailed(trajectory, error, verdict))
}

/** A trajectory whose reward failed: scored 0 (`zero_reward`, `feedback`) or masked (`mask`, `drop_group`). */
const rewardFailed = (trajectory: Trajectory, error: RolloutError.RolloutError, verdict: Verdict): Outcome => {
  const masked = verdict === "mask" || verdict === "drop_group"
  return {
    trajectory: {
      ...trajectory,
      reward: 0,
      rewardStatus: masked ? "failed" : "scored",
      masked: trajectory.masked || masked,
      error: `${error.reason}: ${error.message}`,
      errorReason: error.reason
    },
    dropGroup: verdict === "drop_group"
  }
}
