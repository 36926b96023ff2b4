/**
 * The error-policy engine of a rollout chain (`actors/RolloutChain.ts`): a failed step is retried, fed back to the
 * model, or ends the chain, as its reason's policy says (`src/RolloutError.ts`).
 *
 * An error whose policy ends the chain leaves the step as a `ChainEnded` failure, carried by the error channel past
 * every later step to the one place that catches it (`RolloutChain.run`), which turns it into the chain's `Ending`.
 * A step whose caller can use the error instead (a tool failure fed back as an observation) says so with a
 * `recover` function: the error then never leaves the step. A reward's failure ends nothing (the trajectory is
 * scored or masked by its policy): `withVerdict` hands every verdict to its step.
 *
 * @since 0.1.0
 */
import { Data, Effect, Schedule } from "effect"
import * as RolloutError from "../../src/RolloutError.ts"
import type { Termination } from "../../src/Trajectory.ts"

/**
 * A policy that applies once retries are over and the run goes on: the chain ends (`zero_reward`, `mask`,
 * `drop_group`) or, where its step can show the error to the model, continues (`feedback`).
 *
 * @category models
 * @since 0.1.0
 */
export type Verdict = Exclude<RolloutError.Policy, "retry" | "abort_run">

/**
 * A chain's error resolved by its policy into the chain's end (internal: never leaves `RolloutChain.run`).
 *
 * @category errors
 * @since 0.1.0
 */
export class ChainEnded extends Data.TaggedError("ChainEnded")<{
  readonly error: RolloutError.RolloutError
  readonly verdict: Verdict
}> {}

/**
 * What a step makes of an error its policy resolved: a value for the chain to go on with, or `undefined` when the
 * error ends the chain.
 *
 * @category models
 * @since 0.1.0
 */
export type Recover<B> = (error: RolloutError.RolloutError, verdict: Verdict) => B | undefined

/**
 * How a chain ended, for the code that builds its trajectory.
 *
 * @category models
 * @since 0.1.0
 */
export interface Ending {
  readonly termination: Termination
  /** The error that ended the chain, or (without a policy) the tool call a cut turn left unreadable. */
  readonly error?: RolloutError.RolloutError | undefined
  readonly policy?: RolloutError.Policy | undefined
  readonly episodeEnd?: string | undefined
}

/**
 * What the policy engine reads from a chain's configuration (`RolloutChain.Config` is one).
 *
 * @category models
 * @since 0.1.0
 */
export interface Settings {
  readonly policies?: RolloutError.Policies | undefined
  /** Delays of the `retry` policy (default: 5 retries, exponential from 100 ms, jittered). */
  readonly retry?: Schedule.Schedule<unknown, RolloutError.RolloutError> | undefined
  /** Where resolved errors are counted, by reason (`rollout/errors/<reason>`). */
  readonly stats: { readonly errors: Map<RolloutError.Reason, number> }
}

const defaultRetry = Schedule.max([Schedule.exponential(100).pipe(Schedule.jittered), Schedule.recurs(5)])

/**
 * Runs a step under its reason's policy: `retry` retries it (then applies `afterRetry`), `abort_run` fails the
 * chain with the error, and every other policy is settled by {@link settle}.
 *
 * @category combinators
 * @since 0.1.0
 */
export const withPolicy = <A, R, B = never>(
  settings: Settings,
  step: Effect.Effect<A, RolloutError.RolloutError, R>,
  recover?: Recover<B>
): Effect.Effect<A | B, RolloutError.RolloutError | ChainEnded, R> =>
  policed(settings, step, (error) => settle(settings, error, recover))

/** A step retried while its reason's policy is `retry`; `resolved` takes the error that is left. */
const policed = <A, R, B, E>(
  settings: Settings,
  step: Effect.Effect<A, RolloutError.RolloutError, R>,
  resolved: (error: RolloutError.RolloutError) => Effect.Effect<B, E>
): Effect.Effect<A | B, E, R> =>
  // The retry schedule is only set up once a step has failed: the happy path pays for one `catch`. That first
  // failure is replayed into the schedule, so its first delay comes before the first retry and `recurs(n)` means n
  // retries, as `retry`'s doc says.
  Effect.catch(step, (error) => {
    if (RolloutError.policyFor(error.reason, settings.policies) !== "retry") return resolved(error)
    let replayed = false
    const again = Effect.suspend(() => (replayed ? step : ((replayed = true), Effect.fail(error))))
    return again.pipe(
      Effect.retry({
        schedule: settings.retry ?? defaultRetry,
        while: (e: RolloutError.RolloutError) => RolloutError.policyFor(e.reason, settings.policies) === "retry"
      }),
      Effect.catch(resolved)
    )
  })

/**
 * Runs a step whose failure never ends the chain (a reward's): as {@link withPolicy}, but every policy other than
 * `abort_run` becomes `onVerdict(error, verdict)`, the step's value.
 *
 * @category combinators
 * @since 0.1.0
 */
export const withVerdict = <A, R, B>(
  settings: Settings,
  step: Effect.Effect<A, RolloutError.RolloutError, R>,
  onVerdict: (error: RolloutError.RolloutError, verdict: Verdict) => B
): Effect.Effect<A | B, RolloutError.RolloutError, R> =>
  policed(settings, step, (error) => {
    const verdict = verdictOf(settings, error)
    return verdict === "abort_run" ? Effect.fail(error) : Effect.succeed(onVerdict(error, verdict))
  })

/**
 * Applies the policy of an error now (after any retries) and counts it: `abort_run` fails with the error itself;
 * otherwise `recover` may turn it into a value, and an error it leaves fails as `ChainEnded`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const settle = <B = never>(
  settings: Settings,
  error: RolloutError.RolloutError,
  recover?: Recover<B>
): Effect.Effect<B, RolloutError.RolloutError | ChainEnded> => {
  const verdict = verdictOf(settings, error)
  if (verdict === "abort_run") return Effect.fail(error)
  const recovered = recover?.(error, verdict)
  return recovered === undefined ? Effect.fail(new ChainEnded({ error, verdict })) : Effect.succeed(recovered)
}

/** The policy that applies to an error now (a `retry` reason's retries are over), counted under its reason. */
const verdictOf = (settings: Settings, error: RolloutError.RolloutError): Exclude<RolloutError.Policy, "retry"> => {
  const errors = settings.stats.errors
  errors.set(error.reason, (errors.get(error.reason) ?? 0) + 1)
  const declared = RolloutError.policyFor(error.reason, settings.policies)
  return declared === "retry" ? RolloutError.afterRetry(settings.policies) : declared
}

/**
 * The `recover` of a step that can show its error to the model: with `feedback` (for a reason the model can read),
 * the error becomes `observe(error)`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const feedbackAs = <B>(observe: (error: RolloutError.RolloutError) => B): Recover<B> => (error, verdict) =>
  verdict === "feedback" && RolloutError.canFeedBack(error.reason) ? observe(error) : undefined

/**
 * The ending of a chain its error ended: `feedback`, where no observation could carry the error, masks.
 *
 * @category constructors
 * @since 0.1.0
 */
export const endingOf = (ended: ChainEnded): Ending => ({
  termination: "error",
  error: ended.error,
  policy: ended.verdict === "feedback" ? "mask" : ended.verdict
})
