/**
 * `--json`: a command's result as one JSON object on stdout, for scripts and CI (`agentfly train|eval|oracle
 * --json | jq .`). Messages meant for people go to stderr as they do without it; a failure prints
 * `{ "ok": false, "error": { "_tag", "reason"?, "message" } }` and exits 1.
 *
 * @since 0.1.0
 */
import { Console, Effect } from "effect"
import { Flag } from "effect/cli"
import * as Oracle from "../actors/Oracle.ts"
import type * as Train from "../actors/Train.ts"
import * as RolloutFigures from "../src/RolloutFigures.ts"
import type * as Trajectory from "../src/Trajectory.ts"

/**
 * The `--json` flag.
 *
 * @category constants
 * @since 0.1.0
 */
export const flag = Flag.Boolean("json").pipe(
  Flag.withDescription("Print the result as one JSON object on stdout (messages go to stderr)"),
  Flag.withDefault(false)
)

/**
 * A failure as JSON: its tag, its reason when it has one, and its message.
 *
 * @category getters
 * @since 0.1.0
 */
export const errorJson = (e: unknown): Record<string, unknown> => {
  if (typeof e !== "object" || e === null) return { message: String(e) }
  const { _tag, reason, message } = e as { _tag?: unknown; reason?: unknown; message?: unknown }
  const reasonTag = typeof reason === "string"
    ? reason
    : typeof reason === "object" && reason !== null && typeof (reason as { _tag?: unknown })._tag === "string"
    ? (reason as { _tag: string })._tag
    : undefined
  return {
    ...(typeof _tag === "string" ? { _tag } : {}),
    ...(reasonTag === undefined ? {} : { reason: reasonTag }),
    message: typeof message === "string" ? message : String(e)
  }
}

/**
 * With `enabled`, prints `{ "ok": true, ...toJson(result) }` when `self` succeeds, or `{ "ok": false, "error" }`
 * when it fails (the failure goes on, for the command's exit code); without, `self` as it is.
 *
 * @category combinators
 * @since 0.1.0
 */
export const printed = <A>(enabled: boolean, toJson: (a: A) => object) =>
<E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  enabled
    ? self.pipe(
      Effect.tap((a) => Console.log(JSON.stringify({ ok: true, ...toJson(a) }))),
      Effect.tapError((e) => Console.log(JSON.stringify({ ok: false, error: errorJson(e) })))
    )
    : self

/**
 * `agentfly train --json`: where the run is, what it trained, and its held-out figures before and after.
 *
 * @category getters
 * @since 0.1.0
 */
export const trainJson = (result: Train.Result): object => {
  const { summary } = result
  return {
    command: "train",
    output: result.config.output,
    report: result.report,
    fromStep: summary.fromStep,
    steps: summary.steps,
    trained: summary.trained,
    skipped: summary.skipped,
    criticOnly: summary.criticOnly,
    fingerprint: summary.fingerprint,
    heldOut: summary.evals.length === 0
      ? null
      : { first: summary.evals[0], last: summary.evals.at(-1) },
    evals: summary.evals
  }
}

/**
 * `agentfly oracle --json`: rows played, solve rate, mean reward, the infrastructure's failures, and each row's
 * outcome.
 *
 * @category getters
 * @since 0.1.0
 */
export const oracleJson = (trajectories: ReadonlyArray<Trajectory.Trajectory>): object => {
  const failures = RolloutFigures.infrastructureFailures(trajectories)
  return {
    command: "oracle",
    rows: trajectories.length,
    solveRate: Oracle.solveRate(trajectories),
    meanReward: trajectories.reduce((s, t) => s + t.reward, 0) / Math.max(1, trajectories.length),
    failures: failures.reason === undefined
      ? null
      : {
        count: Math.round(failures.share * failures.total),
        reason: failures.reason,
        first: RolloutFigures.firstFailure(trajectories, failures.reason) ?? null
      },
    episodes: trajectories.map((t) => ({
      reward: t.reward,
      termination: t.termination,
      ...(t.episodeEnd === undefined ? {} : { episodeEnd: t.episodeEnd }),
      ...(t.error === undefined ? {} : { error: t.error })
    }))
  }
}
