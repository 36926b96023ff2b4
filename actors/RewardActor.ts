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
 *   Either way `reward/<name>/error` and `reward/<name>/errors/<Reason>` are set to 1 and the error is logged.
 *
 * Interruption is not a failure: it propagates.
 *
 * @since 0.1.0
 */
import { Cause, Context, Duration, Effect, Exit, Option, Semaphore } from "effect"
import { Reward, Trajectory } from "../src/index.ts"

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
 * @category models
 * @since 0.1.0
 */
export interface RewardActor<R = never> {
  readonly reward: Reward.Reward<R>
  readonly score: (trajectory: Trajectory.Trajectory, options?: ScoreOptions<R>) => Effect.Effect<Scored>
}

// ===== Constructors =====

/**
 * Makes a reward actor.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <R>(reward: Reward.Reward<R>, options: Options): Effect.Effect<RewardActor<R>> =>
  Effect.gen(function*() {
    const semaphore = options.concurrency === undefined ? undefined : yield* Semaphore.make(options.concurrency)
    const timeout = options.timeout === undefined ? undefined : Duration.fromInputUnsafe(options.timeout)
    const name = reward.name
    const error = (reason: Reward.RewardErrorReason, message: string) =>
      new Reward.RewardError({ reward: name, reason, message })

    const applyFailure = (trajectory: Trajectory.Trajectory, failure: Reward.RewardError): Scored => ({
      trajectory: {
        ...trajectory,
        reward: 0,
        rewardStatus: options.onError === "zero" ? "scored" : "failed",
        masked: options.onError === "drop" ? true : trajectory.masked,
        metrics: {
          ...trajectory.metrics,
          [`reward/${name}/error`]: 1,
          [`reward/${name}/errors/${failure.reason}`]: 1
        }
      },
      error: failure
    })

    const score = Effect.fnUntraced(function*(trajectory: Trajectory.Trajectory, scoreOptions?: ScoreOptions<R>) {
      let evaluation: Effect.Effect<Reward.Outcome, Reward.RewardError> = reward.evaluate({
        trajectory,
        row: scoreOptions?.row
      }).pipe(Effect.provideContext(scoreOptions?.context ?? Context.empty() as Context.Context<R>))
      if (timeout !== undefined) {
        evaluation = Effect.timeoutOrElse(evaluation, {
          duration: timeout,
          orElse: () => Effect.fail(error("Timeout", `reward "${name}" timed out after ${Duration.format(timeout)}`))
        })
      }
      if (semaphore !== undefined) evaluation = Semaphore.withPermits(semaphore, 1)(evaluation)
      const exit = yield* Effect.exit(evaluation)
      if (Exit.isSuccess(exit)) {
        const outcome = exit.value
        return {
          trajectory: {
            ...trajectory,
            reward: outcome._tag === "Scored" ? outcome.reward : 0,
            rewardStatus: outcome._tag === "Scored" ? "scored" : "not_applicable",
            metrics: { ...trajectory.metrics, ...outcome.metrics }
          },
          error: undefined
        } satisfies Scored
      }
      const failure = Cause.findErrorOption(exit.cause)
      if (Option.isNone(failure) && !Cause.hasDies(exit.cause)) {
        return yield* Effect.failCause(exit.cause as Cause.Cause<never>) // interrupted: cancellation propagates
      }
      const rewardError = Option.isSome(failure)
        ? failure.value
        : error("Defect", `reward "${name}" failed with an internal error`)
      yield* Effect.logWarning(`reward ${name} failed (${options.onError} policy)`, exit.cause)
      return applyFailure(trajectory, rewardError)
    })

    return { reward, score }
  })
