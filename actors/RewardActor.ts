/**
 * The reward actor: evaluates a reward on a finished trajectory and applies the run's error policy, so that a
 * failing reward never crashes a batch.
 *
 * - Scored: `reward`, `rewardStatus: "scored"`, the reward's metrics merged into the trajectory's.
 * - Not applicable: `rewardStatus: "not_applicable"` (excluded from the group's baseline), reward 0.
 * - Failed (`Reward.RewardError`: invalid row, scorer failure, non-finite score, timeout, or a defect in the
 *   scorer), by policy:
 *   - `"zero"`: reward 0, `rewardStatus: "scored"` (the trajectory stays in its group's baseline);
 *   - `"drop"`: reward 0, `rewardStatus: "failed"`, `masked: true` (out of the baseline and the loss).
 *   Either way `reward/<name>/error` and `reward/<name>/errors/<Reason>` are set to 1 (a run's figures count them
 *   per step) and the error, whose message names the reward (`reward "buggy" threw: boom`), is returned.
 *
 * Logging: the first failure of each reason is logged with its cause (a defect's stack); later ones are counted and
 * reported in one line at most every 30 seconds, so a reward failing on every trajectory does not flood the console.
 *
 * Interruption is not a failure: it propagates.
 *
 * @since 0.1.0
 */
import { Cause, Clock, Context, Duration, Effect, Option, Semaphore } from "effect"
import type { Scorer } from "../src/ChainPorts.ts"
import { Reward, RolloutError, Trajectory } from "../src/index.ts"
import { mergeMetrics } from "./internal/mergeMetrics.ts"

// ===== Models =====

/**
 * What to do when a reward fails.
 *
 * @category models
 * @since 0.1.0
 */
export type ErrorPolicy = "zero" | "drop"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly onError: ErrorPolicy
  /** Limit on one evaluation (default: none). */
  readonly timeout?: Duration.Input | undefined
  /** Evaluations running at once across all chains (default: unbounded). */
  readonly concurrency?: number | undefined
}

/**
 * @category models
 * @since 0.1.0
 */
export interface ScoreOptions<R> {
  /** The chain's environment services (the same context its tools used). */
  readonly context?: Context.Context<R> | undefined
  /** The dataset row (default: `trajectory.row`). */
  readonly row?: unknown
}

/**
 * The outcome of scoring one trajectory: the updated trajectory and the error, when the reward failed.
 *
 * @category models
 * @since 0.1.0
 */
export interface Scored {
  readonly trajectory: Trajectory.Trajectory
  readonly error: Reward.RewardError | undefined
}

/**
 * A reward's verdict on a trajectory, before it is applied (see {@link applyVerdict}).
 *
 * @category models
 * @since 0.1.0
 */
export interface Verdict {
  readonly reward: number
  readonly rewardStatus: Trajectory.RewardStatus
  /** The reward's own metrics (`reward/<name>/...`), or its failure's (`reward/<name>/error`, `errors/<Reason>`). */
  readonly metrics: Readonly<Record<string, number>>
  /** The `drop` policy masks the trajectory of a failed reward. */
  readonly masked: boolean
  readonly error: Reward.RewardError | undefined
}

/**
 * A trajectory with a verdict applied: its reward and status, the verdict's metrics merged into its own, masked
 * when the verdict masks it.
 *
 * @category combinators
 * @since 0.1.0
 */
export const applyVerdict = (trajectory: Trajectory.Trajectory, verdict: Verdict): Trajectory.Trajectory => ({
  ...trajectory,
  reward: verdict.reward,
  rewardStatus: verdict.rewardStatus,
  masked: trajectory.masked || verdict.masked,
  metrics: mergeMetrics(trajectory.metrics, verdict.metrics)
})

/**
 * @category models
 * @since 0.1.0
 */
export interface RewardActor<R = never> {
  readonly reward: Reward.Reward<R>
  /** The verdict alone, for a caller that applies it itself (the rollout chain's reward port, `toPort`). */
  readonly evaluate: (trajectory: Trajectory.Trajectory, options?: ScoreOptions<R>) => Effect.Effect<Verdict>
  readonly score: (trajectory: Trajectory.Trajectory, options?: ScoreOptions<R>) => Effect.Effect<Scored>
}

// ===== Constructors =====

// Long enough that a run failing on every trajectory logs a line a minute or two, short enough to show it goes on.
const repeatLogInterval = Duration.seconds(30)

/** The failure with a message naming its reward, whichever part wrote it (`reward "judge": the judge is down`). */
const named = (failure: Reward.RewardError): Reward.RewardError =>
  failure.message.startsWith(`reward "${failure.reward}"`)
    ? failure
    : failure.withMessage(`reward "${failure.reward}": ${failure.message}`)

/** What a scorer threw or died with, as text. */
const defectText = (cause: Cause.Cause<unknown>): string => {
  const defect = Cause.squash(cause)
  return defect instanceof Error ? defect.message : String(defect)
}

/** One actor's state: its reward and options, and what its failure log has said so far. */
interface State<R> {
  readonly reward: Reward.Reward<R>
  readonly options: Options
  readonly semaphore: Semaphore.Semaphore | undefined
  readonly timeout: Duration.Duration | undefined
  /** Per reason, whether its first failure was logged. */
  readonly loggedReasons: Set<Reward.RewardErrorReason["_tag"]>
  /** The failures counted since the last line logged. */
  repeats: { count: number; since: number; last: string }
}

const error = <R, Tag extends Reward.RewardErrorReason["_tag"]>(
  state: State<R>,
  reason: Tag,
  message: string,
  facts?: Reward.RewardErrorFacts<Tag>
) => Reward.rewardError(state.reward.name, reason, message, facts)

const logFailure = Effect.fnUntraced(function*<R>(
  state: State<R>,
  failure: Reward.RewardError,
  cause: Cause.Cause<unknown>
) {
  const { options } = state
  const now = yield* Clock.currentTimeMillis
  if (!state.loggedReasons.has(failure.reason._tag)) {
    state.loggedReasons.add(failure.reason._tag)
    if (state.repeats.count === 0) state.repeats = { count: 0, since: now, last: "" }
    return yield* Effect.logWarning(
      `${failure.message} (${failure.reason._tag}; ${options.onError} policy: ` +
        `${options.onError === "zero" ? "scored 0" : "dropped"}). Later failures of this reward are counted, ` +
        `at most one line per ${Duration.format(repeatLogInterval)}`,
      // A bug's stack points at the scorer; a score, a row or a timeout refused by the runtime, only at it.
      failure.reason._tag === "Defect" || failure.reason._tag === "ScoreFailed" ? cause : Cause.empty
    )
  }
  state.repeats = { ...state.repeats, count: state.repeats.count + 1, last: failure.message }
  if (now - state.repeats.since < Duration.toMillis(repeatLogInterval)) return
  const window = Duration.format(Duration.millis(now - state.repeats.since))
  yield* Effect.logWarning(
    `reward "${state.reward.name}" failed ${state.repeats.count} more times in the last ${window} ` +
      `(${options.onError} policy); last: ${state.repeats.last}`
  )
  state.repeats = { count: 0, since: now, last: "" }
})

const failureVerdict = <R>(state: State<R>, failure: Reward.RewardError): Verdict => {
  const name = state.reward.name
  return {
    reward: 0,
    rewardStatus: state.options.onError === "zero" ? "scored" : "failed",
    metrics: { [`reward/${name}/error`]: 1, [`reward/${name}/errors/${failure.reason._tag}`]: 1 },
    masked: state.options.onError === "drop",
    error: failure
  }
}

const outcomeVerdict = (outcome: Reward.Outcome): Verdict => ({
  reward: outcome._tag === "Scored" ? outcome.reward : 0,
  rewardStatus: outcome._tag === "Scored" ? "scored" : "not_applicable",
  metrics: outcome.metrics ?? {},
  masked: false,
  error: undefined
})

const failed = <R>(state: State<R>, cause: Cause.Cause<Reward.RewardError>): Effect.Effect<Verdict> => {
  const failure = Cause.findErrorOption(cause)
  if (Option.isNone(failure) && !Cause.hasDies(cause)) {
    return Effect.failCause(cause as Cause.Cause<never>) // interrupted: cancellation propagates
  }
  const rewardError = named(
    Option.isSome(failure)
      ? failure.value
      : error(state, "Defect", `reward "${state.reward.name}" threw: ${defectText(cause)}`, {
        cause: Cause.squash(cause)
      })
  )
  return Effect.as(logFailure(state, rewardError, cause), failureVerdict(state, rewardError))
}

// Plain combinators rather than a generator: a trajectory is scored once per episode, on every chain.
const evaluate = <R>(
  state: State<R>,
  trajectory: Trajectory.Trajectory,
  scoreOptions?: ScoreOptions<R>
): Effect.Effect<Verdict> =>
  Effect.suspend(() => {
    const { semaphore, timeout } = state
    let evaluation: Effect.Effect<Reward.Outcome, Reward.RewardError> = state.reward.evaluate({
      trajectory,
      row: scoreOptions?.row
    }).pipe(Effect.provideContext(scoreOptions?.context ?? Context.empty() as Context.Context<R>))
    if (timeout !== undefined) {
      evaluation = Effect.timeoutOrElse(evaluation, {
        duration: timeout,
        orElse: () =>
          Effect.fail(
            error(state, "Timeout", `reward "${state.reward.name}" timed out after ${Duration.format(timeout)}`, {
              timeoutMs: Duration.toMillis(timeout)
            })
          )
      })
    }
    if (semaphore !== undefined) evaluation = Semaphore.withPermits(semaphore, 1)(evaluation)
    return Effect.matchCauseEffect(evaluation, {
      onSuccess: (outcome) => Effect.succeed(outcomeVerdict(outcome)),
      onFailure: (cause) => failed(state, cause)
    })
  })

/**
 * Makes a reward actor.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <R>(reward: Reward.Reward<R>, options: Options): Effect.Effect<RewardActor<R>> =>
  Effect.gen(function*() {
    const state: State<R> = {
      reward,
      options,
      semaphore: options.concurrency === undefined ? undefined : yield* Semaphore.make(options.concurrency),
      timeout: options.timeout === undefined ? undefined : Duration.fromInputUnsafe(options.timeout),
      loggedReasons: new Set(),
      repeats: { count: 0, since: 0, last: "" }
    }
    const evaluateOne = (trajectory: Trajectory.Trajectory, scoreOptions?: ScoreOptions<R>) =>
      evaluate(state, trajectory, scoreOptions)
    const score = (trajectory: Trajectory.Trajectory, scoreOptions?: ScoreOptions<R>): Effect.Effect<Scored> =>
      Effect.map(evaluateOne(trajectory, scoreOptions), (verdict) => ({
        trajectory: applyVerdict(trajectory, verdict),
        error: verdict.error
      }))
    return { reward, evaluate: evaluateOne, score }
  })

// ===== Adapters =====

/**
 * The rollout chain's reward port over a reward actor, which applies its own error policy (`zero` / `drop`) and
 * never fails.
 *
 * @category adapters
 * @since 0.1.0
 */
export const toPort = <R>(actor: RewardActor<R>): Scorer => (trajectory, context) =>
  // The verdict, not the scored trajectory: `RolloutChain.applyScore` merges its metrics into the trajectory's, once.
  Effect.map(actor.evaluate(trajectory, { context: context as Context.Context<R> }), (verdict) => ({
    reward: verdict.reward,
    status: verdict.rewardStatus,
    metrics: verdict.metrics,
    masked: verdict.masked,
    failure: verdict.error === undefined
      ? undefined
      : new RolloutError.RolloutError({ reason: "RewardFailed", message: verdict.error.message })
  }))
