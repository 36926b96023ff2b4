/**
 * Rewards: a name, a Schema for the dataset-row fields the reward reads, and a scoring Effect.
 *
 * - The row fields are decoded before `score` runs; a missing or mistyped field is a {@link RewardError} with
 *   reason `InvalidRow` naming the field, never a crash.
 * - `score` receives the trajectory, the final response (`Trajectory.finalResponse`: the last assistant or tool
 *   text) and the decoded row; it may use environment services declared in `dependencies`, which the chain
 *   provides from the same lease its tools used (see `Environment.ts`), so a reward can re-check the agent's
 *   work in the same sandbox.
 * - It returns a {@link Score} `{ reward, metrics }` (a bare number is accepted) or {@link notApplicable}, which
 *   excludes the trajectory from its group's baseline.
 * - Metrics are namespaced `reward/<name>/<metric>`; `reward/<name>/reward` is always present when scored.
 * - {@link combine} makes a weighted sum whose parts keep their own metrics.
 *
 * Failures are typed; what to do with them (zero reward or drop) is the run's policy, applied by
 * `actors/RewardActor.ts`.
 *
 * @since 0.1.0
 */
import { Cause, Effect, Exit, Option, Schema } from "effect"
import type { Context } from "effect"
import * as Trajectory from "./Trajectory.ts"

// ===== Models =====

const TypeId = "~agentfly/Reward" as const

/**
 * What a scorer returns.
 *
 * @category models
 * @since 0.1.0
 */
export interface Score {
  readonly reward: number
  readonly metrics?: Readonly<Record<string, number>> | undefined
}

/**
 * The "not applicable" verdict: this trajectory cannot be scored by this reward (e.g. the row has no reference
 * answer); it is excluded from its group's baseline.
 *
 * @category models
 * @since 0.1.0
 */
export interface NotApplicable {
  readonly _tag: "NotApplicable"
  readonly reason: string
}

/**
 * Says "not applicable".
 *
 * @category constructors
 * @since 0.1.0
 */
export const notApplicable = (reason: string): NotApplicable => ({ _tag: "NotApplicable", reason })

/**
 * The result of evaluating a reward. Metrics are already namespaced (`reward/<name>/...`).
 *
 * @category models
 * @since 0.1.0
 */
export type Outcome =
  | { readonly _tag: "Scored"; readonly reward: number; readonly metrics: Record<string, number> }
  | { readonly _tag: "NotApplicable"; readonly reason: string; readonly metrics: Record<string, number> }

/**
 * What a scorer receives.
 *
 * @category models
 * @since 0.1.0
 */
export interface ScoreInput<Row> {
  readonly trajectory: Trajectory.Trajectory
  /** The final response: the text of the last assistant or tool message. */
  readonly response: string
  readonly row: Row
}

/**
 * What {@link Reward.evaluate} receives. `row` defaults to `trajectory.row`, `response` to
 * `Trajectory.finalResponse(trajectory)`.
 *
 * @category models
 * @since 0.1.0
 */
export interface EvaluateInput {
  readonly trajectory: Trajectory.Trajectory
  readonly response?: string | undefined
  readonly row?: unknown
}

/**
 * A reward. `R` is the environment services its scorer needs.
 *
 * @category models
 * @since 0.1.0
 */
export interface Reward<R = never> {
  readonly [TypeId]: typeof TypeId
  readonly name: string
  readonly dependencies: ReadonlyArray<Context.Key<any, any>>
  readonly evaluate: (input: EvaluateInput) => Effect.Effect<Outcome, RewardError, R>
  /**
   * The dataset-row fields it reads, by the reward (or combined part) that reads them: a run checks its datasets'
   * rows against them when it loads them, so that a field no row has stops it there rather than scoring every
   * trajectory 0 (`InvalidRow`) from its first rollout on.
   */
  readonly rows?: ReadonlyArray<{ readonly reward: string; readonly row: Schema.Codec<any, any> }> | undefined
}

/**
 * The services a reward needs.
 *
 * @category models
 * @since 0.1.0
 */
export type Requirements<T> = T extends Reward<infer R> ? R : never

// ===== Errors =====

/**
 * A row field the reward reads is missing or mistyped.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidRow extends Schema.TaggedError<InvalidRow>()("InvalidRow", {
  message: Schema.String,
  /** The row Schema's error. */
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The scorer failed (e.g. the sandbox it re-checks in crashed, the judge is down).
 *
 * @category errors
 * @since 0.1.0
 */
export class ScoreFailed extends Schema.TaggedError<ScoreFailed>()("ScoreFailed", {
  message: Schema.String,
  /** The scorer's failure. */
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The scorer returned a non-finite reward or metric, or not a score at all.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidScore extends Schema.TaggedError<InvalidScore>()("InvalidScore", { message: Schema.String }) {}

/**
 * The scorer did not finish in time.
 *
 * @category errors
 * @since 0.1.0
 */
export class Timeout extends Schema.TaggedError<Timeout>()("Timeout", {
  message: Schema.String,
  timeoutMs: Schema.optionalKey(Schema.Number)
}) {}

/**
 * The scorer threw or died (a bug in the reward).
 *
 * @category errors
 * @since 0.1.0
 */
export class Defect extends Schema.TaggedError<Defect>()("Defect", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Why a reward could not score a trajectory.
 *
 * @category errors
 * @since 0.1.0
 */
export const RewardErrorReason = Schema.Union([InvalidRow, ScoreFailed, InvalidScore, Timeout, Defect])
export type RewardErrorReason = typeof RewardErrorReason.Type

/**
 * A reward that could not score a trajectory. Handle reasons with `Effect.catchReason("RewardError", "Timeout", …)`;
 * `message` is the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class RewardError extends Schema.TaggedError<RewardError>()("RewardError", {
  reward: Schema.String,
  reason: RewardErrorReason
}) {
  get isRetryable(): boolean {
    return this.reason._tag === "Timeout" || this.reason._tag === "ScoreFailed"
  }
  override get message(): string {
    return this.reason.message
  }
  /** The same error, its reason's facts and cause kept, saying `message`. */
  withMessage(message: string): RewardError {
    const { cause } = this.reason
    return rewardError(this.reward, this.reason._tag, message, {
      ...(this.reason as RewardErrorFacts<RewardErrorReason["_tag"]>),
      ...(cause === undefined ? {} : { cause })
    })
  }
}

/** Each reason's class by its tag, for `rewardError`; a reason left out is a compile error. */
const reasons = { InvalidRow, ScoreFailed, InvalidScore, Timeout, Defect } satisfies Record<
  RewardErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message (`cause`, `timeoutMs` of `Timeout`).
 *
 * @category errors
 * @since 0.1.0
 */
export type RewardErrorFacts<Tag extends RewardErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `RewardError` of `reward` for the reason tagged `tag`: `rewardError(name, "ScoreFailed", text, { cause })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const rewardError = <Tag extends RewardErrorReason["_tag"]>(
  reward: string,
  tag: Tag,
  message: string,
  facts?: RewardErrorFacts<Tag>
): RewardError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => RewardErrorReason
  return new RewardError({ reward, reason: new Reason({ ...facts, message }) })
}

// ===== Constructors =====

/**
 * The options of {@link make}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options<Row extends Schema.Top, Deps extends ReadonlyArray<Context.Key<any, any>>, E> {
  /** The dataset-row fields this reward reads, decoded before `score` runs. */
  readonly row?: Row | undefined
  /** Environment services the scorer needs (the chain's lease). */
  readonly dependencies?: Deps | undefined
  readonly score: (
    input: ScoreInput<Row["Type"]>
  ) => Effect.Effect<Score | number | NotApplicable, E, Context.Service.Identifier<Deps[number]>>
}

const describeFailure = (error: unknown): string => {
  if (typeof error === "object" && error !== null) {
    const message = (error as { message?: unknown }).message
    if (typeof message === "string" && message.length > 0) return message
  }
  return String(error)
}

/** `Missing key\n  at ["answer"]` → `field ["answer"]: Missing key`. */
const formatSchemaIssues = (message: string): string =>
  message.replace(/([^\n]+)\n\s*at (\[[^\n]*\])/g, "field $2: $1").replace(/\n\s*/g, "; ")

/** A scorer's value as a message shows it: a string quoted, so that `"0"` does not read as the number 0. */
const shown = (u: unknown): string => (typeof u === "string" ? `${JSON.stringify(u)} (a string)` : String(u))

/**
 * Namespaces a scorer's metrics and checks that every number is finite. The value is checked as it came (a scorer
 * written in plain JavaScript, or cast, may return a string such as `"1"`).
 */
const finishScore = (name: string, raw: unknown): Outcome | string => {
  const prefix = `reward/${name}/`
  if (typeof raw !== "number" && (typeof raw !== "object" || raw === null)) {
    return `the score is ${shown(raw)}, not a number or { reward, metrics }`
  }
  if (typeof raw === "object" && "_tag" in raw) {
    const reason = (raw as NotApplicable).reason
    return { _tag: "NotApplicable", reason, metrics: { [prefix + "not_applicable"]: 1 } }
  }
  const score = (typeof raw === "number" ? { reward: raw } : raw) as {
    readonly reward: unknown
    readonly metrics?: unknown
  }
  if (typeof score.reward !== "number" || !Number.isFinite(score.reward)) {
    return `reward is ${shown(score.reward)}, not a finite number`
  }
  const metrics: Record<string, number> = {}
  for (const [key, value] of Object.entries(score.metrics ?? {})) {
    if (typeof value !== "number" || !Number.isFinite(value)) {
      return `metric "${key}" is ${shown(value)}, not a finite number`
    }
    metrics[key.startsWith("reward/") ? key : prefix + key] = value
  }
  metrics[prefix + "reward"] = score.reward
  return { _tag: "Scored", reward: score.reward, metrics }
}

/**
 * Defines a reward.
 *
 * **Example** (Exact match against the row's `answer`)
 *
 * ```ts
 * const Exact = Reward.make("exact", {
 *   row: Schema.Struct({ answer: Schema.String }),
 *   score: ({ response, row }) => Effect.succeed(response.trim() === row.answer ? 1 : 0)
 * })
 * ```
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <
  Row extends Schema.Top = Schema.Struct<{}>,
  const Deps extends ReadonlyArray<Context.Key<any, any>> = [],
  E = never
>(
  name: string,
  options: Options<Row, Deps, E>
): Reward<Context.Service.Identifier<Deps[number]>> => {
  const decodeRow = Schema.decodeUnknownExit((options.row ?? Schema.Struct({})) as Schema.Codec<unknown, unknown>)
  return {
    [TypeId]: TypeId,
    name,
    dependencies: options.dependencies ?? [],
    ...(options.row === undefined
      ? {}
      : { rows: [{ reward: name, row: options.row as unknown as Schema.Codec<any, any> }] }),
    evaluate: (input) =>
      Effect.suspend(() => {
        const row = decodeRow(input.row ?? input.trajectory.row ?? {})
        if (Exit.isFailure(row)) {
          const detail = Option.match(Cause.findErrorOption(row.cause), {
            onNone: () => "invalid row",
            onSome: (e) => formatSchemaIssues((e as Schema.SchemaError).message)
          })
          const facts = Option.match(Cause.findErrorOption(row.cause), {
            onNone: () => ({}),
            onSome: (cause) => ({ cause })
          })
          return Effect.fail(rewardError(name, "InvalidRow", `reward "${name}": dataset row ${detail}`, facts))
        }
        const response = input.response ?? Trajectory.finalResponse(input.trajectory)
        return options.score({ trajectory: input.trajectory, response, row: row.value as Row["Type"] }).pipe(
          Effect.mapError((error) =>
            error instanceof RewardError
              ? error
              : rewardError(name, "ScoreFailed", describeFailure(error), { cause: error })
          ),
          Effect.flatMap((raw) => {
            const outcome = finishScore(name, raw)
            return typeof outcome === "string"
              ? Effect.fail(rewardError(name, "InvalidScore", outcome))
              : Effect.succeed(outcome)
          })
        )
      })
  }
}

/**
 * One part of a weighted sum.
 *
 * @category models
 * @since 0.1.0
 */
export interface Part<R> {
  readonly reward: Reward<R>
  readonly weight: number
}

/**
 * A weighted sum of rewards: `Σ weightᵢ · rewardᵢ`. Parts are evaluated concurrently; each keeps its metrics
 * under `reward/<part>/...` and the sum is `reward/<name>/reward`.
 *
 * **Details**
 *
 * A part that says "not applicable" contributes nothing (weights are not renormalised); the sum is "not
 * applicable" only when every part is. A part that fails fails the sum with that part's error.
 *
 * @category combinators
 * @since 0.1.0
 */
export const combine = <const Parts extends ReadonlyArray<Part<any>>>(
  name: string,
  parts: Parts
): Reward<Parts[number] extends Part<infer R> ? R : never> => ({
  [TypeId]: TypeId,
  name,
  dependencies: parts.flatMap((p) => p.reward.dependencies),
  rows: parts.flatMap((p) => p.reward.rows ?? []),
  evaluate: (input) =>
    Effect.map(
      Effect.forEach(parts, (part) => part.reward.evaluate(input), { concurrency: "unbounded" }),
      (outcomes): Outcome => {
        let reward = 0
        let applicable = 0
        const metrics: Record<string, number> = {}
        outcomes.forEach((outcome, i) => {
          Object.assign(metrics, outcome.metrics)
          if (outcome._tag === "Scored") {
            reward += parts[i]!.weight * outcome.reward
            applicable++
          }
        })
        if (applicable === 0) {
          metrics[`reward/${name}/not_applicable`] = 1
          return { _tag: "NotApplicable", reason: "no part applies", metrics }
        }
        metrics[`reward/${name}/reward`] = reward
        return { _tag: "Scored", reward, metrics }
      }
    )
})
