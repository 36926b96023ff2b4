/**
 * The main job: a training run of a task. It composes rollouts (`Rollout.run` over the `Sampler`, with the task's
 * tools, reward, environment and episode protocol: `TaskRuntime`), learner steps and weight publication (the
 * `Policy` service), periodic held-out evaluation, checkpoints and the run journal.
 *
 * **Honest runs.** Every step's figures count failed trajectories by reason (`rollout/failures/<Reason>`) and
 * failed tool calls by reason (`rollout/tool_errors/<Reason>`). A step (or an evaluation) where more than
 * `maxFailureShare` of the trajectories failed for infrastructure reasons (environment, lease, reward, sampler,
 * chain defects) stops the run with `TrainerError(Failures)` naming the main reason, its count and its first
 * failure's message, after its figures are logged and before the learner trains on it. A record whose trajectories
 * failed carries the first one's error (`firstFailure`), so the message outlives the console.
 *
 * **One pipeline for both modes.** Learner step `s` trains on batch `s - 1`: the `groupsPerStep` rows at
 * positions `[(s - 1)·B, s·B)` of the run's row order (a seeded shuffle per epoch). Every token of batch `s - 1` is
 * sampled by one policy version, {@link samplingVersion}: `s - 1` in `sync` mode (generate, update, publish,
 * repeat); in `async` mode `s - 1 - maxStaleness`, so the next batches roll out while the learner trains (their
 * sampler logprobs and policy versions travel in the trajectories for the learner's importance-weight
 * correction), but never older than the last checkpoint before step `s`, so that a run resumed from that
 * checkpoint has the weights its next batches need (a pipeline bubble of one rollout per checkpoint).
 *
 * **Rollouts that depend on nothing else.** Each batch, each evaluation and each warm-up check samples from a
 * sampler of its own (`Policy.sampler`), pinned to its version, whose engine batches only its own requests: its
 * tokens and logprobs depend on its rows, seeds and weights, not on what else was running beside it (an
 * evaluation beside the next step's rollouts in an unbroken run, nothing in a resumed one). Groups within a batch
 * are ordered by row, so a run is deterministic in both modes and resumes bit for bit.
 *
 * **Warm-up.** SFT steps on demonstrations, then policy version 0. With `warmup.stopAt` the warm-up ends at the
 * first check where greedy accuracy on a validation split reaches a target; a check publishes the weights as a
 * negative version ({@link warmupVersion}) for its rollouts.
 *
 * **Exact resume.** Policy version `v` is the weights after step `v` (0 after the warm-up). Every finished group
 * and learner step is journaled (fsync'ed) and every `checkpoint.every` steps the policy (weights and optimiser
 * state) is saved to a fresh directory that is renamed into place, then journaled with its weights' fingerprint.
 * `resume` first checks that the run is the same (its recorded `config.json` against this config, naming every
 * key that changed; `forceResume` overrides), then loads the newest checkpoint that is intact (it loads, its
 * weights are finite and their fingerprint is the journal's), saying which newer ones it refused and why, rolls
 * the journal back to it and replays the following steps: the row order and every chain's sampling seed are
 * functions of the run seed and the row position, so the replayed steps are the ones lost.
 *
 * @since 0.1.0
 */
import { Clock, Context, Deferred, Duration, Effect, Fiber, FileSystem, Queue, Result, Schema, Stream } from "effect"
import type { Scope } from "effect"
import * as AgentTask from "../src/AgentTask.ts"
import * as Dataset from "../src/Dataset.ts"
import type * as Message from "../src/Message.ts"
import * as DiskFull from "../src/internal/diskFull.ts"
import * as Sampling from "../src/Sampling.ts"
import { Sampler } from "../src/Sampler.ts"
import * as Task from "../src/Task.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import * as Trajectory from "../src/Trajectory.ts"
import * as AgentRollout from "./gateway/AgentRollout.ts"
import * as PeakRss from "./internal/peakRss.ts"
import * as Journal from "./Journal.ts"
import * as Metrics from "./Metrics.ts"
import * as Rollout from "./Rollout.ts"
import type * as ChainPorts from "../src/ChainPorts.ts"
import * as TaskRuntime from "./TaskRuntime.ts"

// ===== Errors =====

/**
 * @category errors
 * @since 0.1.0
 */
export const TrainerErrorReason = Schema.Literals([
  "Rollout", // a rollout failed with an `abort_run` policy
  "Learner", // a learner or warm-up step failed
  "Checkpoint", // saving or loading a checkpoint failed
  "Journal", // the journal or metrics files could not be written
  "Resume", // the journal and the run do not agree
  "Warmup", // the warm-up reached its step cap short of its target (`warmup.stopAt.onMiss: "fail"`)
  "Failures", // more than `maxFailureShare` of a step's trajectories failed for infrastructure reasons
  "Task", // the task cannot run: missing environment services, an environment that cannot start
  "Data", // a dataset row does not match the task's row Schema
  "NonFinite", // a learner or warm-up step made the loss or the weights NaN or infinite (nothing is saved after it)
  "DiskFull", // a write found no space left on the device (ENOSPC)
  "Servers", // the inference servers of `engine.servers` cannot be reached, or refuse the learner's weights
  "Workers" // the rollout workers of `rollout.workers` cannot be reached, disagree with the run, or all failed
])
export type TrainerErrorReason = typeof TrainerErrorReason.Type

/**
 * @category errors
 * @since 0.1.0
 */
export class TrainerError extends Schema.TaggedError<TrainerError>()("TrainerError", {
  reason: TrainerErrorReason,
  message: Schema.String
}) {}

const fail = (reason: TrainerErrorReason) => (e: unknown) => {
  const message = typeof e === "object" && e !== null && "message" in e ? String(e.message) : String(e)
  if (!DiskFull.isDiskFull(e)) return new TrainerError({ reason, message })
  return new TrainerError({
    reason: "DiskFull",
    message: message.startsWith(DiskFull.marker)
      ? message
      : `${DiskFull.marker}: ${message}; free space on its filesystem, then resume`
  })
}


// ===== The policy service =====

/**
 * The learning side of a run, as the trainer drives it: RL and SFT steps on the learner's weights, publishing them
 * to the sampler, and checkpoints. The local implementation is the onnxruntime learner plus `PolicyEngine`; a
 * remote trainer can stand behind the same service.
 *
 * @category services
 * @since 0.1.0
 */
export class Policy extends Context.Service<Policy, {
  /** One RL update on these groups (advantages, loss, optimiser step); returns `learner/...` figures. */
  readonly learn: (step: number, groups: ReadonlyArray<Trajectory.Group>) => Effect.Effect<Figures, TrainerError>
  /** One SFT step (masked NLL on assistant tokens) on demonstration conversations; returns `warmup/...` figures. */
  readonly sft: (step: number, rows: ReadonlyArray<Dataset.Row>) => Effect.Effect<Figures, TrainerError>
  /** Makes the learner's current weights policy `version` (versions increase), for {@link Policy} `sampler`. */
  readonly publish: (version: number) => Effect.Effect<void, TrainerError>
  /**
   * A sampler of published version `version` for one rollout batch, evaluation or warm-up check, alive in the
   * scope: every token it samples comes from that version, and its engine batches its own requests only, so what it
   * samples does not depend on any other batch running beside it. The versions a run still asks for are the last
   * `maxStaleness + 2` published.
   */
  readonly sampler: (version: number) => Effect.Effect<Sampler["Service"], TrainerError, Scope.Scope>
  /** Saves weights and optimiser state into `dir` (which exists and is empty). */
  readonly save: (dir: string) => Effect.Effect<void, TrainerError>
  readonly load: (dir: string) => Effect.Effect<void, TrainerError>
  /** A fingerprint of the learner's weights (journaled after every step). */
  readonly fingerprint: Effect.Effect<string, TrainerError>
  /** Figures of the policy's own machinery for a step's metrics (inference servers: `servers/…`), if any. */
  readonly figures?: Effect.Effect<Figures> | undefined
}>()("agentfly/actors/Trainer/Policy") {}

/**
 * Named figures of one step.
 *
 * @category models
 * @since 0.1.0
 */
export type Figures = Readonly<Record<string, number>>

// ===== Options =====

/**
 * What a run needs besides its config: the task, the loaded datasets and the model's format (chat template and
 * tool-call parser: `ChainFormat.fromTemplate`). `RE` is what the task's environment needs from the run (e.g. a
 * `ResourceManager`).
 *
 * @category models
 * @since 0.1.0
 */
export interface Options<RE = never> {
  readonly task: Task.Task<RE>
  readonly config: TrainConfig.TrainConfig
  readonly train: Dataset.Dataset
  readonly eval?: Dataset.Dataset | undefined
  readonly demos?: Dataset.Dataset | undefined
  /** The validation split of `warmup.stopAt` (required with it). */
  readonly validation?: Dataset.Dataset | undefined
  readonly format: ChainPorts.Format
  readonly maxConcurrentChains?: number | undefined
  /**
   * Continue from the newest intact checkpoint in `config.output` (a fresh run when there is none). The run's
   * recorded config must equal this one (`output` aside) unless `forceResume` is set.
   */
  readonly resume?: boolean | undefined
  /** Resume although the config (seed included) differs from the one the run was started with. */
  readonly forceResume?: boolean | undefined
  /** Where the run says what the user should know: a checkpoint refused on resume, a forced resume (default: log). */
  readonly notice?: ((message: string) => Effect.Effect<void>) | undefined
  /** The text of a token, for the trajectory viewer (default: its id). */
  readonly tokenText?: ((id: number) => string) | undefined
  readonly display?: { readonly update: (status: Metrics.Status) => Effect.Effect<void> } | undefined
  /** Where training batches roll out when not in this process (`RolloutWorker.client`); evaluations stay here. */
  readonly rollouts?: RemoteRollouts | undefined
}

/**
 * Training batches rolled out elsewhere (rollout workers): the groups of `rows` sampled with policy version
 * `version` or newer, with the ids, seeds and row indices {@link collectGroups} gives them here.
 *
 * @category models
 * @since 0.1.0
 */
export interface RemoteRollouts {
  readonly collect: (
    rows: ReadonlyArray<Dataset.Row>,
    sampling: BatchSampling,
    version: number
  ) => Effect.Effect<Array<Trajectory.Group>, TrainerError>
  /** Figures since the previous read, for a step's metrics (`workers/…`). */
  readonly figures?: Effect.Effect<Figures> | undefined
}

/**
 * How a batch's rows are sampled: `chains` per row at `temperature`; row `r`'s chain `k` samples with seed
 * `seed + (rowOffset + r) · chains + k`, and its group's id is `s<firstSeq>-g<rowOffset + r>`.
 *
 * @category models
 * @since 0.1.0
 */
export interface BatchSampling {
  readonly firstSeq: number
  readonly chains: number
  readonly temperature: number
  readonly seed: number
  /** The first row's index in the batch when the rows are a part of it (a rollout worker's share); default 0. */
  readonly rowOffset?: number | undefined
}

const finiteOr0 = (x: number) => (Number.isFinite(x) ? x : 0)

/** A group of a training batch, with its seq (its place among everything the run sampled) and its dataset row. */
interface SampledGroup {
  readonly group: Trajectory.Group
  readonly seq: number
  readonly row: number
}

/**
 * Where the seqs of dynamic sampling's further batches start: past any seq of the run's row order (steps ×
 * `groupsPerStep` ≤ 10⁷ × 4,096 < 2³⁶), and small enough that seeds derived from them stay exact integers.
 */
const extraSeqs = 2 ** 36

/**
 * What a run did: its steps (`fromStep` + 1 … `steps`), how many of them trained and how many were skipped for lack
 * of signal (every group's rewards equal under a group-relative estimator).
 *
 * @category models
 * @since 0.1.0
 */
export interface Summary {
  readonly fromStep: number
  readonly steps: number
  readonly trained: number
  readonly skipped: number
  readonly evals: ReadonlyArray<{ readonly step: number; readonly figures: Figures }>
  readonly fingerprint: string
}

// ===== Pure helpers =====

/**
 * The run's seeded generator (`Sampling.mulberry32`): its only source of randomness besides the sampler's
 * per-request seeds.
 *
 * @category constructors
 * @since 0.1.0
 */
export const rng = Sampling.mulberry32

/**
 * The row order of epoch `epoch`: a Fisher–Yates shuffle of `0 … n-1` seeded by the run seed and the epoch.
 *
 * @category getters
 * @since 0.1.0
 */
export const epochOrder = (n: number, seed: number, epoch: number): Int32Array => {
  const order = Int32Array.from({ length: n }, (_, i) => i)
  const next = rng((seed * 0x9e3779b1 + epoch * 0x85ebca6b) >>> 0)
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1))
    const t = order[i]!
    order[i] = order[j]!
    order[j] = t
  }
  return order
}

/**
 * The dataset rows at run positions `[from, from + count)`, wrapping over epochs.
 *
 * @category getters
 * @since 0.1.0
 */
export const rowsAt = (n: number, seed: number, from: number, count: number): Array<number> => {
  const out: Array<number> = []
  let epoch = -1
  let order: Int32Array = new Int32Array(0)
  for (let seq = from; seq < from + count; seq++) {
    if (Math.floor(seq / n) !== epoch) {
      epoch = Math.floor(seq / n)
      order = epochOrder(n, seed, epoch)
    }
    out.push(order[seq % n]!)
  }
  return out
}

/**
 * The policy version of the weights after warm-up step `step` of `steps`, published only for a warm-up check:
 * negative (from `-steps` to `-1`), so versions keep increasing up to 0, the warm-up's result.
 *
 * @category getters
 * @since 0.1.0
 */
export const warmupVersion = (step: number, steps: number): number => step - steps - 1

/**
 * The policy version that samples the batch of learner step `step`: the one before it (`step - 1`) in sync mode
 * (`ahead = 0`), `ahead` versions older in async mode (`ahead = maxStaleness`), but never older than the last
 * checkpoint step before `step` (a multiple of `checkpointEvery`) nor than `from` (the step a run resumed from):
 * the versions a resumed run can rebuild. A function of the config alone, so that a resumed run samples every
 * replayed batch with the weights the unbroken run used.
 *
 * @category getters
 * @since 0.1.0
 */
export const samplingVersion = (
  step: number,
  options: { readonly ahead: number; readonly checkpointEvery: number; readonly from: number }
): number =>
  Math.max(
    options.from,
    step - 1 - options.ahead,
    Math.floor((step - 1) / options.checkpointEvery) * options.checkpointEvery
  )

/**
 * Whether warm-up step `step` of `steps` checks the validation accuracy: every `every` steps from `from` (default
 * `every`), never at the last step (the warm-up ends there anyway).
 *
 * @category getters
 * @since 0.1.0
 */
export const isCheckStep = (
  step: number,
  steps: number,
  stopAt: { readonly every: number; readonly from?: number | undefined }
): boolean => {
  const from = stopAt.from ?? stopAt.every
  return step >= from && (step - from) % stopAt.every === 0 && step < steps
}

/** What the warnings read of a task: its name and its defaults. */
type TaskDefaults = Pick<Task.Any, "name" | "defaults">

/**
 * How a warning names the turn budget: its value, said to be the task's default when it is (`agent.maxNewTokens (96,
 * task webshop's default)`), and where to raise it: a user who never wrote `agent.maxNewTokens` would otherwise look
 * for it in their config and not find it. Known by value (the config's origin is gone by here): a config that sets
 * the task's own value reads the same, and raising it in the config is the fix either way.
 */
const turnBudget = (maxNewTokens: number, task: TaskDefaults | undefined) =>
  task?.defaults.maxNewTokens === maxNewTokens
    ? {
      value: `${maxNewTokens}, task ${task.name}'s default`,
      raise: `raise agent.maxNewTokens in the config (it overrides the task's default)`
    }
    : { value: `${maxNewTokens}`, raise: `raise agent.maxNewTokens` }

/**
 * What a step's terminations say about the token budgets: half the chains or more ending with a turn cut at
 * `maxNewTokens` (termination `stop`), a quarter or more ending at `maxContextTokens` (`context_length`).
 *
 * @category getters
 * @since 0.1.0
 */
export const budgetWarnings = (
  step: number,
  rollout: Readonly<Record<string, number>>,
  agent: { readonly maxNewTokens: number; readonly maxContextTokens?: number | undefined },
  /** The caps of the cut turns that an agent function's own request (`max_tokens`) set, one per such chain. */
  requestCaps: ReadonlyArray<number> = [],
  /** The run's task: a budget that is its default is named so. */
  task?: TaskDefaults
): { readonly cut?: string; readonly full?: string } => {
  const budget = turnBudget(agent.maxNewTokens, task)
  const cut = rollout["rollout/termination/stop"] ?? 0
  const full = rollout["rollout/termination/context_length"] ?? 0
  const chains = rollout["rollout/trajectories"] ?? 0
  const byRequest = chains > 0 && requestCaps.length >= (cut * chains) / 2
  return {
    ...(cut >= 0.5 && byRequest
      ? {
        cut: `step ${step}: ${(cut * 100).toFixed(0)}% of the chains ended with a turn cut before its end-of-turn ` +
          `token (termination "stop"), most at their agent's own request max_tokens (${
            [...new Set(requestCaps)].sort((a, b) => a - b).join(", ")
          }, below agent.maxNewTokens ${budget.value}); if the policy's turns are longer than that, raise ` +
          `max_tokens in the agent's requests`
      }
      : cut >= 0.5
      ? {
        cut: `step ${step}: ${(cut * 100).toFixed(0)}% of the chains ended with a turn cut at agent.maxNewTokens ` +
          `(${budget.value}) before its end-of-turn token (termination "stop"); if the policy's turns ` +
          `are longer than that, ${budget.raise}`
      }
      : {}),
    ...(full >= 0.25
      ? {
        full: `step ${step}: ${(full * 100).toFixed(0)}% of the chains ended at agent.maxContextTokens ` +
          `(${agent.maxContextTokens ?? "the model's"} tokens) before their episode ended (termination "context_length"); ` +
          `if their conversations need more, raise agent.maxContextTokens (up to the model's positions; a model at ` +
          `its positions needs a larger preset, or shorter episodes: fewer turns, shorter observations)`
      }
      : {})
  }
}

/**
 * A trajectory made a tool call that failed to parse or to run (an `is_error` observation, or a `tool_errors/<Reason>`
 * count: an agent function's SDK reads a malformed call as text, and the gateway counts it; a turn cut by max tokens
 * inside a call counts it as `tool_errors/ParseFailed`), or errored.
 */
const hasInvalidCall = (t: Trajectory.Trajectory): boolean =>
  t.termination === "error" || t.messages.some((m) => m.role === "tool" && m.is_error === true) ||
  Object.entries(t.metrics).some(([key, n]) => key.startsWith("tool_errors/") && n > 0)

/** The task's tool names, to tell misspelt calls apart; none for an agent function, whose tools are its SDK's. */
const toolNames = (runtime: TaskRuntime.TaskRuntime): ReadonlyArray<string> | undefined =>
  AgentTask.isAgentTask(runtime.task) ? undefined : runtime.task.tools.map((t) => t.name)

const mean = (xs: ReadonlyArray<number>): number => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length)

/**
 * Failure reasons that are the infrastructure's, not the policy's: a step made mostly of them trains on noise.
 *
 * @category constants
 * @since 0.1.0
 */
export const infrastructureReasons: ReadonlySet<string> = new Set([
  "EnvFailed",
  "LeaseFailed",
  "RewardFailed",
  "SamplerTransient",
  "SamplerRejected",
  "SamplerUnusable",
  "ChainDefect"
])

/**
 * Why a trajectory failed, if it did: the rollout error that ended it (`EnvFailed`, `LeaseFailed`, ...), or
 * `RewardFailed` when its reward failed and was scored 0 (a `reward/<name>/error` metric).
 *
 * @category getters
 * @since 0.1.0
 */
export const failureOf = (t: Trajectory.Trajectory): string | undefined => {
  if (t.errorReason !== undefined) return t.errorReason
  for (const [key, value] of Object.entries(t.metrics)) {
    if (value > 0 && key.startsWith("reward/") && key.endsWith("/error")) return "RewardFailed"
  }
  return undefined
}

/**
 * The error of the first trajectory that failed (for `reason`, when given), e.g.
 * `RewardFailed: reward "buggy" threw: boom`; one whose failure left only a metric reads as its reason.
 *
 * @category getters
 * @since 0.1.0
 */
export const firstFailure = (
  trajectories: ReadonlyArray<Trajectory.Trajectory>,
  reason?: string
): string | undefined => {
  for (const t of trajectories) {
    const failure = failureOf(t)
    if (failure !== undefined && (reason === undefined || failure === reason)) {
      return t.error ?? `${failure} (no message recorded)`
    }
  }
  return undefined
}

/** A metrics record's `firstFailure`, when any of its trajectories failed: the message outlives the console. */
const failureNote = (groups: ReadonlyArray<Trajectory.Group>): { readonly firstFailure?: string } => {
  const first = firstFailure(groups.flatMap((g) => g.trajectories))
  return first === undefined ? {} : { firstFailure: first }
}

/**
 * The infrastructure failures of a set of trajectories: the share of them that failed for such a reason, and the
 * most frequent reason with its count.
 *
 * @category getters
 * @since 0.1.0
 */
export const infrastructureFailures = (
  trajectories: ReadonlyArray<Trajectory.Trajectory>
): { readonly share: number; readonly reason: string | undefined; readonly count: number; readonly total: number } => {
  const counts = new Map<string, number>()
  for (const t of trajectories) {
    const reason = failureOf(t)
    if (reason !== undefined && infrastructureReasons.has(reason)) counts.set(reason, (counts.get(reason) ?? 0) + 1)
  }
  const failed = [...counts.values()].reduce((a, b) => a + b, 0)
  const top = [...counts].sort((a, b) => b[1] - a[1])[0]
  return { share: trajectories.length === 0 ? 0 : failed / trajectories.length, reason: top?.[0], count: top?.[1] ?? 0, total: trajectories.length }
}

/**
 * The standard error of a mean over independent units (here: questions, each the mean of its samples), the
 * yardstick a held-out gain is read against.
 */
const standardError = (xs: ReadonlyArray<number>): number => {
  if (xs.length < 2) return 0
  const m = mean(xs)
  return Math.sqrt(xs.reduce((s, x) => s + (x - m) ** 2, 0) / (xs.length - 1) / xs.length)
}

/**
 * Rollout figures of a set of groups, under `prefix` (`rollout` or `eval`): `reward_mean`, `accuracy` and its
 * standard error over groups (`accuracy_se`: a group is one question's samples),
 * `invalid_tool_call_rate`, `turns_mean`, `tool_calls/<tool>` (calls per trajectory; with `tools`, only the task's
 * tools: a call of any other name, which a policy misspells in endless ways, is no series of its own but an error,
 * counted in `tool_errors/UnknownTool` as the tool actor recorded it in the trajectory), the reward's
 * metrics (`reward/<name>/<metric>`, each averaged over the trajectories that carry it), the reward's failed
 * evaluations by reason (`reward/<name>/errors/<Reason>`, counts) and its unscored ones
 * (`reward/<name>/not_applicable`, a count), `policy_tokens` and, with `policyVersion`,
 * `staleness_mean`.
 *
 * @category getters
 * @since 0.1.0
 */
export const rolloutFigures = (
  groups: ReadonlyArray<Trajectory.Group>,
  options: {
    readonly prefix: string
    readonly correct?: ((t: Trajectory.Trajectory) => boolean) | undefined
    readonly policyVersion?: number
    /** The task's tool names. */
    readonly tools?: ReadonlyArray<string> | undefined
  }
): Record<string, number> => {
  const trajectories = groups.flatMap((g) => g.trajectories)
  const p = options.prefix
  const correct = options.correct ?? Trajectory.isCorrect
  const out: Record<string, number> = {
    [`${p}/reward_mean`]: mean(trajectories.map((t) => t.reward)),
    [`${p}/accuracy`]: mean(trajectories.map((t) => (correct(t) ? 1 : 0))),
    [`${p}/accuracy_se`]: standardError(groups.map((g) => mean(g.trajectories.map((t) => (correct(t) ? 1 : 0))))),
    [`${p}/invalid_tool_call_rate`]: mean(trajectories.map((t) => (hasInvalidCall(t) ? 1 : 0))),
    [`${p}/turns_mean`]: mean(trajectories.map(Trajectory.turnCount)),
    [`${p}/policy_tokens`]: trajectories.reduce((n, t) => n + Trajectory.policyTokenCount(t), 0),
    [`${p}/trajectories`]: trajectories.length,
    [`${p}/failure_share`]: infrastructureFailures(trajectories).share
  }
  const bumpKey = (key: string, by = 1) => (out[key] = (out[key] ?? 0) + by)
  // Shares are counted, then divided: a sum of 1/n's gave 0.9999999999999999 for "all of them".
  const shares = new Map<string, number>()
  const bumpShare = (key: string) => shares.set(key, (shares.get(key) ?? 0) + 1)
  for (const t of trajectories) {
    const failure = failureOf(t)
    if (failure !== undefined) bumpKey(`${p}/failures/${failure}`)
    bumpShare(`${p}/termination/${t.termination}`)
    if (t.episodeEnd !== undefined) bumpShare(`${p}/episode_end/${t.episodeEnd}`)
    for (const [key, n] of Object.entries(t.metrics)) if (key.startsWith("tool_errors/")) bumpKey(`${p}/${key}`, n)
  }
  for (const [key, n] of shares) out[key] = n / trajectories.length
  const calls = new Map<string, number>()
  for (const t of trajectories) {
    for (const m of t.messages) {
      if (m.role !== "assistant") continue
      for (const call of m.tool_calls ?? []) {
        const name = call.function.name
        // Another name is an `UnknownTool` error, already among the `tool_errors/` counts above.
        if (options.tools === undefined || options.tools.includes(name)) calls.set(name, (calls.get(name) ?? 0) + 1)
      }
    }
  }
  // Every tool of the task has its figure, 0 when unused (so a task with tools is told from one without).
  for (const tool of options.tools ?? []) out[`${p}/tool_calls/${tool}`] = 0
  for (const [tool, n] of calls) out[`${p}/tool_calls/${tool}`] = n / Math.max(1, trajectories.length)
  // The reward's own metrics (components, counts: `reward/<name>/<metric>`), each the mean over the trajectories
  // that carry it; the `/error` flags are counted as failures above. Only failed evaluations carry the
  // `/errors/<Reason>` flags, and only unscored ones `/not_applicable`, so their mean would always be 1: they are
  // counted, as failures are.
  const rewardMetrics = new Map<string, Array<number>>()
  for (const t of trajectories) {
    for (const [key, x] of Object.entries(t.metrics)) {
      if (!key.startsWith("reward/") || key.endsWith("/error")) continue
      if (key.includes("/errors/") || key.endsWith("/not_applicable")) {
        bumpKey(`${p}/${key}`, x)
        continue
      }
      const xs = rewardMetrics.get(key) ?? []
      xs.push(x)
      rewardMetrics.set(key, xs)
    }
  }
  for (const [key, xs] of rewardMetrics) out[`${p}/${key}`] = mean(xs)
  if (options.policyVersion !== undefined) {
    const versions = trajectories.flatMap((t) => {
      const v = Trajectory.oldestPolicyVersion(t)
      return v === undefined ? [] : [options.policyVersion! - v]
    })
    out[`${p}/staleness_mean`] = mean(versions)
  }
  return out
}

/**
 * A trajectory as a viewer sample: its first segment's spans with each token's text.
 *
 * @category getters
 * @since 0.1.0
 */
export const sampleOf = (
  trajectory: Trajectory.Trajectory,
  phase: "train" | "eval",
  step: number,
  tokenText: (id: number) => string
): Metrics.SampleRecord => ({
  phase,
  step,
  groupId: trajectory.groupId,
  reward: trajectory.reward,
  termination: trajectory.termination,
  spans: trajectory.segments.flatMap((segment) =>
    segment.spans.map((span) => ({
      source: span.source,
      tokens: span.tokenIds.map(tokenText),
      ...(span.logprobs === undefined ? {} : { logprobs: span.logprobs })
    }))
  )
})

/**
 * The agent side of a run: its config, the model's format and the task's runtime (tools, reward, environment,
 * episode), as its rollouts use them.
 *
 * @category models
 * @since 0.1.0
 */
export interface Agent {
  readonly config: TrainConfig.TrainConfig
  readonly format: ChainPorts.Format
  readonly runtime: TaskRuntime.TaskRuntime
  readonly maxConcurrentChains?: number | undefined
}

/**
 * Builds a run's agent in the current scope: the task's runtime with the config's tool timeout and tool rendering
 * (`TaskRuntime.make`, which checks the task's environment services before any rollout).
 *
 * @category constructors
 * @since 0.1.0
 */
export const agent = <RE>(options: {
  readonly task: Task.Task<RE>
  readonly config: TrainConfig.TrainConfig
  readonly format: ChainPorts.Format
  readonly maxConcurrentChains?: number | undefined
}): Effect.Effect<Agent, TrainerError, RE | Scope.Scope> =>
  Effect.map(
    TaskRuntime.make(options.task, {
      toolTimeout: Duration.seconds(options.config.agent.toolTimeout),
      renderTools: options.config.agent.renderTools
    }).pipe(Effect.mapError(fail("Task"))),
    (runtime) => ({
      config: options.config,
      format: options.format,
      runtime,
      maxConcurrentChains: options.maxConcurrentChains
    })
  )

/**
 * Checks that the prompts of a run's first rows (system prompt, question, and the tools' schemas when rendered) leave
 * room to sample within `agent.maxContextTokens`: a prompt that fills the context ends its chain before a single
 * token, and a run of such chains would only report that its rewards were all equal. Fails with `TrainerError(Task)`
 * when none of the first `sample` rows fits, naming the sizes and the ways out; warns when only some do. An agent
 * function's prompts are its SDK's, built at run time: not checked here.
 *
 * @category constructors
 * @since 0.1.0
 */
export const checkPromptsFit = Effect.fnUntraced(function*(
  agent: Agent,
  rows: ReadonlyArray<Dataset.Row>,
  notice: (message: string) => Effect.Effect<void>,
  sample = 32
) {
  const { config, runtime } = agent
  const budget = config.agent.maxContextTokens
  if (AgentTask.isAgentTask(runtime.task) || rows.length === 0 || budget === undefined) return
  // A row the template cannot render is left to its chains' error policy (`TemplateFailed`), not judged here.
  const lengthOf = (row: Dataset.Row, tools: ReadonlyArray<unknown>) =>
    Effect.match(agent.format.start(Task.conversation(runtime.task, row, config.agent.systemPrompt), tools), {
      onFailure: () => undefined,
      onSuccess: (transcript) => transcript.length()
    })
  const rendered = yield* Effect.forEach(rows.slice(0, sample), (row) =>
    Effect.map(lengthOf(row, runtime.tools.schemas), (length) => ({ row, length })))
  const measured = rendered.flatMap((r) => (r.length === undefined ? [] : [{ row: r.row, length: r.length }]))
  if (measured.length === 0) return
  const checked = measured.map((r) => r.row)
  const lengths = measured.map((r) => r.length)
  const over = lengths.filter((n) => n >= budget).length
  if (over === 0) return
  const longest = Math.max(...lengths)
  const schemas = runtime.tools.schemas.length === 0
    ? ""
    : ` (the tools' schemas: ${longest - ((yield* lengthOf(checked[lengths.indexOf(longest)]!, [])) ?? 0)} of them)`
  const ways = `shorten the system prompt or the questions` +
    (schemas === "" ? "" : `, set agent.renderTools: false (the policy then learns the tools from demonstrations)`) +
    `, or raise agent.maxContextTokens with a model whose context holds more`
  if (over === checked.length) {
    return yield* new TrainerError({
      reason: "Task",
      message: `no prompt fits the context: the first ${checked.length} rows' prompts are up to ${longest} tokens` +
        `${schemas}, agent.maxContextTokens is ${budget}, so no chain could sample a token; ${ways}`
    })
  }
  yield* notice(
    `${over} of the first ${checked.length} rows' prompts fill agent.maxContextTokens (${budget}; the longest is ` +
      `${longest} tokens${schemas}): their chains end before sampling; ${ways}`
  )
})

/**
 * Says, before the warm-up, when demonstrations teach assistant turns longer than `agent.maxNewTokens`: a rollout
 * cuts such a turn before its end (termination `stop`), which otherwise shows only at the first RL step, after the
 * whole warm-up. Measures the first `sample` demonstrations' turns in the run's format; a format that cannot render a
 * turn it did not sample (no `appendAssistant`), or a demonstration that does not render, is not measured.
 *
 * @category constructors
 * @since 0.1.0
 */
export const checkDemosFit = Effect.fnUntraced(function*(
  agent: Agent,
  demos: ReadonlyArray<Dataset.Row>,
  notice: (message: string) => Effect.Effect<void>,
  sample = 32
) {
  const budget = agent.config.agent.maxNewTokens
  const named = turnBudget(budget, agent.runtime.task)
  const longestTurn = (messages: Message.Conversation) =>
    Effect.gen(function*() {
      const first = messages.findIndex((m) => m.role === "assistant")
      if (first === -1) return 0
      const transcript = yield* agent.format.start(messages.slice(0, first), [])
      if (transcript.appendAssistant === undefined) return 0
      let observations: Array<Message.Message> = []
      for (const m of messages.slice(first)) {
        if (m.role !== "assistant") {
          observations.push(m)
          continue
        }
        if (observations.length > 0) yield* transcript.appendObservations(observations)
        observations = []
        yield* transcript.appendAssistant(m)
      }
      const turns = transcript.segments().flatMap((s) => s.spans.filter((span) => span.source === "policy"))
      return Math.max(0, ...turns.map((span) => span.tokenIds.length))
    }).pipe(Effect.orElseSucceed(() => 0))
  const lengths = yield* Effect.forEach(demos.slice(0, sample), (row) => longestTurn(row.messages ?? []))
  const over = lengths.filter((n) => n > budget).length
  if (over === 0) return
  yield* notice(
    `${over} of the first ${lengths.length} demonstrations ${over === 1 ? "has" : "have"} an assistant turn longer ` +
      `than agent.maxNewTokens (${named.value}; the longest is ${Math.max(...lengths)} tokens): a rollout cuts ` +
      `such a turn before its end (termination "stop"), so the policy cannot finish what it learns there; ` +
      `${named.raise} or shorten the demonstrations' turns`
  )
})

/**
 * Rolls out one group of `chains` chains per row with a run's agent; the groups in row order. Chain `k` of row `i`
 * samples with `seed + i·chains + k`; the environment's episode of row `i` starts from `seed + i·chains`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const collectGroups = (
  agent: Agent,
  rows: ReadonlyArray<Dataset.Row>,
  sampling: BatchSampling
): Effect.Effect<Array<Trajectory.Group>, TrainerError, Sampler> => {
  const { config, runtime } = agent
  // An agent function's episodes run through the gateway, with the same ids, seeds and figures.
  if (AgentTask.isAgentTask(runtime.task)) {
    return AgentRollout.collectGroups(agent, rows, sampling).pipe(Effect.mapError(fail("Rollout")))
  }
  return Rollout.run({
    rows: rows.map((row) => ({
      ...row.fields,
      messages: Task.conversation(runtime.task, row, config.agent.systemPrompt)
    })),
    numChains: sampling.chains,
    maxTurns: config.agent.maxTurns,
    maxConcurrentChains: agent.maxConcurrentChains ?? 64,
    maxContextTokens: config.agent.maxContextTokens,
    sampling: {
      temperature: sampling.temperature,
      ...(config.agent.topP < 1 ? { topP: config.agent.topP } : {}),
      maxTokens: config.agent.maxNewTokens,
      seed: sampling.seed
    },
    format: agent.format,
    tools: runtime.tools,
    reward: runtime.reward,
    environment: runtime.environment,
    episode: runtime.episode,
    policies: runtime.policies,
    runId: `s${sampling.firstSeq}`,
    rowOffset: sampling.rowOffset
  }).pipe(
    Stream.runFold(() => [] as Array<Trajectory.Group>, (acc, event) => {
      if (event._tag === "Group") acc.push(event.group)
      return acc
    }),
    Effect.map((groups) => groups.sort((a, b) => a.rowIndex - b.rowIndex)),
    Effect.mapError(fail("Rollout"))
  )
}

/**
 * A held-out evaluation: the first `config.eval.size` rows (all when unset), `config.eval.samples` answers each at
 * `config.eval.temperature`, seeded by the run's seed, so that evaluating a run's checkpoint repeats the run's own
 * evaluation at that step. Figures under `eval/` ({@link rolloutFigures}).
 *
 * @category constructors
 * @since 0.1.0
 */
export const evaluation = (
  agent: Agent,
  rows: ReadonlyArray<Dataset.Row>
): Effect.Effect<{ readonly groups: Array<Trajectory.Group>; readonly figures: Figures }, TrainerError, Sampler> => {
  const { config } = agent
  const size = Math.min(config.eval.size ?? rows.length, rows.length)
  return Effect.map(
    collectGroups(agent, rows.slice(0, size), {
      firstSeq: 0,
      chains: config.eval.samples,
      temperature: config.eval.temperature,
      seed: 7_000_000 + config.seed
    }),
    (groups) => ({ groups, figures: rolloutFigures(groups, {
      prefix: "eval",
      correct: agent.runtime.correct,
      tools: toolNames(agent.runtime)
    }) })
  )
}

// ===== The run =====

/**
 * What differs between the config a run was started with and `config`: its recorded `config.json` (`output`
 * aside: a run may move), or for a run without one the seed and mode its journal's first start recorded.
 */
const changesSinceStart = Effect.fnUntraced(function*(
  fs: FileSystem.FileSystem,
  out: string,
  journal: Journal.Replay,
  config: TrainConfig.TrainConfig
) {
  const io = fail("Journal")
  const file = `${out}/config.json`
  const current = JSON.parse(JSON.stringify(config)) as unknown
  if (yield* fs.exists(file).pipe(Effect.mapError(io))) {
    const text = yield* fs.readFileString(file).pipe(Effect.mapError(io))
    const recorded = yield* Effect.try({
      try: () => JSON.parse(text) as unknown,
      catch: (e) => new TrainerError({ reason: "Resume", message: `${file} is not the run's config: ${String(e)}` })
    })
    // Decoded as this version decodes it, so that defaults written out since the run started are not changes.
    const normalized = yield* TrainConfig.decode(recorded).pipe(
      Effect.map((config) => JSON.parse(JSON.stringify(config)) as unknown),
      Effect.orElseSucceed(() => recorded)
    )
    const comparable = withRecordedPathOptions(withRecordedTask(normalized, current), current)
    return TrainConfig.changes(comparable, current, ["output"])
  }
  const start = journal.entries.map((e) => e.entry).find((e) => e.kind === "start")
  return start?.kind === "start"
    ? TrainConfig.changes({ seed: start.seed, mode: start.mode }, { seed: config.seed, mode: config.mode })
    : []
})

/**
 * A recorded config whose task module path is relative (written before such paths were resolved) names it from a
 * config file no longer known: the current config's absolute path to a module of the same file name is taken as it;
 * so is the current module when none was recorded (a module run directly, before it recorded itself).
 *
 * @category getters
 * @since 0.1.0
 */
export const withRecordedTask = (recorded: unknown, current: unknown): unknown => {
  const nameOf = (config: unknown) => {
    const task = typeof config === "object" && config !== null ? (config as { task?: unknown }).task : undefined
    return typeof task === "string" ? task : (task as { name?: unknown } | undefined)?.name
  }
  const [before, after] = [nameOf(recorded), nameOf(current)]
  // Unset: a module run directly, recorded before it named itself.
  if (before === undefined && typeof after === "string" && Task.isModulePath(after) && typeof recorded === "object") {
    return { ...(recorded as object), task: (current as { task: unknown }).task }
  }
  if (typeof before !== "string" || typeof after !== "string" || !Task.isModulePath(before)) return recorded
  if (before.startsWith("/") || !after.startsWith("/") || before.split("/").at(-1) !== after.split("/").at(-1)) {
    return recorded
  }
  const task = (recorded as { task: unknown }).task
  return { ...(recorded as object), task: typeof task === "string" ? after : { ...(task as object), name: after } }
}

/**
 * A recorded config whose task's path options are relative (written before a run recorded them absolute) names them
 * from a config file no longer known: the current absolute value of an option is taken as it when it ends with the
 * recorded path (`../data/folders` and `/work/data/folders`). Only a path option is relative before and absolute now.
 *
 * @category getters
 * @since 0.1.0
 */
export const withRecordedPathOptions = (recorded: unknown, current: unknown): unknown => {
  const optionsOf = (config: unknown): Record<string, unknown> | undefined => {
    const task = typeof config === "object" && config !== null ? (config as { task?: unknown }).task : undefined
    const options = typeof task === "object" && task !== null ? (task as { options?: unknown }).options : undefined
    return typeof options === "object" && options !== null ? options as Record<string, unknown> : undefined
  }
  const [before, after] = [optionsOf(recorded), optionsOf(current)]
  if (before === undefined || after === undefined) return recorded
  // `../data/folders/` ends `/work/data/folders` as `data/folders`.
  const tail = (path: string) => path.replace(/^(\.\.?\/)+/, "").replace(/\/+$/, "")
  const options = Object.fromEntries(Object.entries(before).map(([key, value]) => {
    const now = after[key]
    const same = typeof value === "string" && !value.startsWith("/") && tail(value) !== "" && typeof now === "string" &&
      now.startsWith("/") && now.endsWith(`/${tail(value)}`)
    return [key, same ? now : value]
  }))
  const task = (recorded as { task: object }).task
  return { ...(recorded as object), task: { ...task, options } }
}

/** Stops the run when a step's loss is not finite (whatever the policy behind it checks itself). */
const finiteLoss = (what: string, key: string) => (figures: Figures) => {
  const loss = figures[key]
  return loss === undefined || Number.isFinite(loss)
    ? Effect.void
    : Effect.fail(new TrainerError({ reason: "NonFinite", message: `${what}: ${key} is ${loss}; nothing was saved after it` }))
}

const checkpointName = (step: number) => `step-${String(step).padStart(6, "0")}`

/**
 * What a resume finds before it loads anything: the run's journal, and the changes of `config` from the config the
 * run was started with. A changed config is refused unless forced (more or fewer steps need no force). `run` does
 * this first; a caller that prints something of its own before the run (the CLI's header) can do it before that,
 * so that a refused resume says only why.
 *
 * @category constructors
 * @since 0.1.0
 */
export const checkResume = Effect.fnUntraced(function*(
  config: TrainConfig.TrainConfig,
  resume: { readonly resume?: boolean | undefined; readonly forceResume?: boolean | undefined }
): Effect.fn.Return<
  { readonly existing: Journal.Replay; readonly stepsChange?: string; readonly changed: ReadonlyArray<string> },
  TrainerError,
  FileSystem.FileSystem
> {
  const fs = yield* FileSystem.FileSystem
  const out = config.output
  const existing = resume.resume === true
    ? yield* Journal.read(`${out}/journal.jsonl`).pipe(Effect.mapError(fail("Journal")))
    : { entries: [], validBytes: 0, tornBytes: 0 }
  if (existing.entries.length === 0) return { existing, changed: [] }
  const all = yield* changesSinceStart(fs, out, existing, config)
  // More (or fewer) steps continue the same run: no need to force that.
  const stepsChange = all.find((c) => c.startsWith("algorithm.steps: "))
  const changed = all.filter((c) => c !== stepsChange)
  if (changed.length > 0 && resume.forceResume !== true) {
    return yield* new TrainerError({
      reason: "Resume",
      message: `${out} was started with another config: ${changed.join("; ")}. Resume it with its own config ` +
        `(${out}/config.json), or force the resume with this one (--force-resume)`
    })
  }
  return stepsChange === undefined ? { existing, changed } : { existing, stepsChange, changed }
})

/**
 * Where a run starts. A new run (not `--resume`): step 0. A resumed one: its journal read, the config compared with
 * the one it was started with (`checkResume`), and the newest intact checkpoint loaded into the policy; newer ones
 * that do not load, hold non-finite weights or weights other than the journal's are refused (and named), and the
 * run goes on from an older one.
 */
const resumeRun = Effect.fnUntraced(function*(
  policy: Policy["Service"],
  config: TrainConfig.TrainConfig,
  resume: { readonly resume?: boolean | undefined; readonly forceResume?: boolean | undefined },
  notice: (message: string) => Effect.Effect<void>
): Effect.fn.Return<ReturnType<typeof Journal.resumePoint>, TrainerError, FileSystem.FileSystem> {
  const fs = yield* FileSystem.FileSystem
  const out = config.output
  const checkpoints = `${out}/checkpoints`
  const io = fail("Journal")
  // A refused resume says only why (the steps' notice would announce a resume that does not happen).
  const { existing, stepsChange, changed } = yield* checkResume(config, resume)
  if (changed.length > 0) yield* notice(`resuming ${out} with a changed config (forced): ${changed.join("; ")}`)
  const present = new Set(yield* fs.readDirectory(checkpoints).pipe(Effect.mapError(io)))
  // The newest intact checkpoint, loaded: newer ones that do not load, hold non-finite weights or weights other than
  // the journal's are refused (and named), and the run goes on from an older one.
  const refused: Array<string> = []
  let resumeFrom: typeof Journal.CheckpointDone.Type | undefined
  for (const candidate of Journal.checkpoints(existing).filter((c) => present.has(c.entry.path))) {
    const loaded = yield* Effect.result(
      policy.load(`${checkpoints}/${candidate.entry.path}`).pipe(
        Effect.andThen(policy.fingerprint),
        Effect.flatMap((hash) =>
          candidate.weightsHash === undefined || hash === candidate.weightsHash
            ? Effect.void
            : Effect.fail(
              new TrainerError({
                reason: "Checkpoint",
                message: `its weights (fingerprint ${hash}) are not the ones the journal recorded ` +
                  `(${candidate.weightsHash})`
              })
            )
        )
      )
    )
    if (Result.isSuccess(loaded)) {
      resumeFrom = candidate.entry
      break
    }
    refused.push(`${candidate.entry.path}: ${loaded.failure.message}`)
  }
  if (resumeFrom === undefined && refused.length > 0) {
    return yield* new TrainerError({
      reason: "Checkpoint",
      message: `no intact checkpoint to resume ${out} from: ${refused.join("; ")}`
    })
  }
  const point = Journal.resumePoint(existing, (c) => c === resumeFrom)
  // A finished run resumed, or fewer steps than it has done: the loops below have nothing to do, which said nothing.
  const nothingLeft = point.checkpoint !== undefined && point.step >= config.algorithm.steps
  // Said only when those steps are still to train: fewer steps than the run has done is "nothing left", below.
  if (stepsChange !== undefined && !nothingLeft) {
    yield* notice(
      `resuming ${out} for ${config.algorithm.steps} steps (${stepsChange})` +
        (config.algorithm.lrSchedule === "cosine" ? `: the cosine learning-rate schedule now spans them` : "")
    )
  }
  if (resumeFrom !== undefined && refused.length > 0) {
    yield* notice(
      `resuming from ${resumeFrom.path} (step ${resumeFrom.step}), the newest intact checkpoint; refused: ` +
        refused.join("; ")
    )
  } else if (resumeFrom !== undefined) {
    yield* notice(`resuming ${out} from ${resumeFrom.path} (step ${resumeFrom.step})`)
  } else if (existing.entries.length > 0) {
    yield* notice(
      `${out} has no checkpoint yet (the first is written when the warm-up ends, or at step ` +
        `${config.checkpoint.every}): the run starts over`
    )
  }
  if (nothingLeft) {
    yield* notice(
      `${out} is at step ${point.step} and algorithm.steps is ${config.algorithm.steps}: nothing left to train ` +
        `(more steps continue it: --steps N, or algorithm.steps raised)`
    )
  }
  return point
})

/**
 * Runs (or resumes) a training run to `config.algorithm.steps` learner steps.
 *
 * @category constructors
 * @since 0.1.0
 */
export const run: <RE = never>(
  options: Options<RE>
) => Effect.Effect<Summary, TrainerError, Policy | FileSystem.FileSystem | Scope.Scope | RE> = Effect.fn(
  "Trainer.run"
)(function*(
  input: Options<any>
): Effect.fn.Return<Summary, TrainerError, Policy | FileSystem.FileSystem | Scope.Scope | any> {
  const { config } = input
  const fs = yield* FileSystem.FileSystem
  const policy = yield* Policy
  // The task's rows and its runtime first: a bad row or a task that cannot run stops before anything is written.
  const task = input.task
  const refine = (ds: Dataset.Dataset | undefined) =>
    ds === undefined || task.row === undefined
      ? Effect.succeed(ds)
      : Dataset.refine(ds, task.row, { onInvalid: config.data.onInvalidRow }).pipe(Effect.mapError(fail("Data")))
  const options = {
    ...input,
    train: (yield* refine(input.train))!,
    eval: yield* refine(input.eval),
    validation: yield* refine(input.validation)
  }
  const agentOf = yield* agent(options)
  const notice = options.notice ?? ((message: string) => Effect.logWarning(message))
  yield* checkPromptsFit(agentOf, options.train.rows, notice)
  const correct = agentOf.runtime.correct
  const checkFailures = (groups: ReadonlyArray<Trajectory.Group>, what: string) => {
    const failures = infrastructureFailures(groups.flatMap((g) => g.trajectories))
    return failures.share > config.maxFailureShare && failures.reason !== undefined
      ? Effect.fail(
        new TrainerError({
          reason: "Failures",
          message: `${what}: ${failures.count} of ${failures.total} trajectories failed with ${failures.reason} ` +
            `(${(failures.share * 100).toFixed(0)}% infrastructure failures, more than maxFailureShare ` +
            `${config.maxFailureShare}); first: ${firstFailure(groups.flatMap((g) => g.trajectories), failures.reason)}`
        })
      )
      : Effect.void
  }
  const out = config.output
  const checkpoints = `${out}/checkpoints`
  const io = fail("Journal")
  yield* fs.makeDirectory(checkpoints, { recursive: true }).pipe(Effect.mapError(io))
  // A run that starts over (not a resume: `--overwrite`) replaces an earlier run's checkpoints: kept, they would be
  // "newer" than this run's own, which the pruning below would then delete as they are written.
  if (options.resume !== true) {
    for (const name of yield* fs.readDirectory(checkpoints).pipe(Effect.mapError(io))) {
      if (/^\.?step-/.test(name)) {
        yield* fs.remove(`${checkpoints}/${name}`, { recursive: true, force: true }).pipe(Effect.mapError(io))
      }
    }
  }

  // ----- Resume point -----
  const point = yield* resumeRun(policy, config, options, notice)
  const journal = yield* Journal.open(`${out}/journal.jsonl`, { cutAt: point.cutAt }).pipe(Effect.mapError(io))
  // Metrics errors keep only their message: the annotated file system makes it say ENOSPC on a full disk.
  const files = yield* Metrics.open(out, point.checkpoint === undefined ? {} : { resumeFrom: point.step })
    .pipe(Effect.provideService(FileSystem.FileSystem, DiskFull.annotate(fs)), Effect.mapError(io))
  // Every record carries the process's peak RSS since the previous record (so per phase: warm-up step, RL step,
  // evaluation) and its RSS when written.
  const memory = yield* PeakRss.make()
  const metrics: Metrics.Metrics = {
    ...files,
    log: (record) =>
      Effect.flatMap(memory.take, ({ peakMb, rssMb }) =>
        files.log({ ...record, figures: { ...record.figures, "perf/peak_rss_mb": peakMb, "perf/rss_mb": rssMb } }))
  }
  yield* fs.writeFileString(`${out}/config.json`, JSON.stringify(config, null, 2)).pipe(Effect.mapError(io))
  yield* journal.append({ kind: "start", fromStep: point.step, seed: config.seed, mode: config.mode })
    .pipe(Effect.mapError(io))
  const startedAt = yield* Clock.currentTimeMillis
  const elapsed = Effect.map(Clock.currentTimeMillis, (now) => (now - startedAt) / 1000)
  const display = options.display ?? { update: () => Effect.void }
  const tokenText = options.tokenText ?? ((id: number) => String(id))

  const warmupRuns = config.warmup !== undefined && options.demos !== undefined && !point.warmupDone && point.step === 0
  // Published versions, awaited by the batches they sample (see `samplingVersion`).
  const published = new Map<number, Deferred.Deferred<void>>()
  const publishedDeferred = (version: number) => {
    const existing = published.get(version)
    if (existing !== undefined) return existing
    const made = Deferred.makeUnsafe<void>()
    published.set(version, made)
    return made
  }
  const publish = (version: number) =>
    Effect.andThen(policy.publish(version), Deferred.succeed(publishedDeferred(version), undefined))
  // A step's figures from the policy (its servers, its trainer server) and the rollout workers; a count both report
  // (`servers/requests`: this process's evaluations and the workers' batches) is the sum of the two.
  const stepCounts = Effect.gen(function*() {
    const own = policy.figures === undefined ? {} : yield* policy.figures
    const remote = options.rollouts?.figures === undefined ? {} : yield* options.rollouts.figures
    const out: Record<string, number> = { ...own, ...remote }
    for (const key of Object.keys(remote)) if (key in own) out[key] = own[key]! + remote[key]!
    return out
  })
  // Rollouts on a sampler of their own, pinned to `version`, closed when they end.
  const sampledBy = (version: number) => <A, E>(rollouts: Effect.Effect<A, E, Sampler>) =>
    Effect.scoped(Effect.flatMap(policy.sampler(version), (sampler) => Effect.provideService(rollouts, Sampler, sampler)))
  // Versions only increase: with a warm-up, version 0 is its result, published when it ends.
  if (!warmupRuns) yield* publish(point.step)

  // ----- Checkpoints -----
  const saveCheckpoint = Effect.fnUntraced(function*(step: number) {
    const name = checkpointName(step)
    const tmp = `${checkpoints}/.${name}.tmp`
    const ck = fail("Checkpoint")
    yield* fs.remove(tmp, { recursive: true, force: true }).pipe(Effect.mapError(ck))
    yield* fs.makeDirectory(tmp, { recursive: true }).pipe(Effect.mapError(ck))
    yield* policy.save(tmp)
    yield* fs.remove(`${checkpoints}/${name}`, { recursive: true, force: true }).pipe(Effect.mapError(ck))
    yield* fs.rename(tmp, `${checkpoints}/${name}`).pipe(Effect.mapError(ck))
    yield* journal.append({ kind: "checkpoint", step, path: name, weightsHash: yield* policy.fingerprint })
      .pipe(Effect.mapError(io))
    const all = (yield* fs.readDirectory(checkpoints).pipe(Effect.mapError(ck))).filter((n) => n.startsWith("step-"))
      .sort()
    for (const old of all.slice(0, Math.max(0, all.length - config.checkpoint.keep))) {
      yield* fs.remove(`${checkpoints}/${old}`, { recursive: true, force: true }).pipe(Effect.mapError(ck))
    }
  })

  // ----- Evaluation -----
  const evals: Array<{ step: number; figures: Figures }> = []
  const evaluate = Effect.fnUntraced(function*(step: number) {
    if (options.eval === undefined) return
    const { groups, figures } = yield* evaluation(agentOf, options.eval.rows).pipe(sampledBy(step))
    const record = { phase: "eval" as const, step, elapsed: yield* elapsed, figures, ...failureNote(groups) }
    evals.push({ step, figures })
    yield* metrics.log(record).pipe(Effect.mapError(io))
    yield* checkFailures(groups, `evaluation at step ${step}`)
    for (const g of groups.slice(0, Math.min(2, config.sampleTrajectories))) {
      yield* metrics.sample(sampleOf(g.trajectories[0]!, "eval", step, tokenText)).pipe(Effect.mapError(io))
    }
    yield* display.update({ ...record, total: config.algorithm.steps })
  })

  // A warm-up check: the current weights, published as a warm-up version, answer the validation rows greedily.
  const validate = Effect.fnUntraced(function*(
    step: number,
    steps: number,
    stopAt: TrainConfig.WarmupStopConfig
  ) {
    const version = warmupVersion(step, steps)
    yield* publish(version)
    const groups = yield* collectGroups(agentOf, options.validation!.rows.slice(0, stopAt.size), {
      firstSeq: 0,
      chains: 1,
      temperature: 0,
      seed: 8_000_000 + config.seed
    }).pipe(sampledBy(version))
    yield* checkFailures(groups, `warm-up check at step ${step}`)
    const figures = rolloutFigures(groups, { prefix: "validation", correct, tools: toolNames(agentOf.runtime) })
    return {
      "warmup/validation_accuracy": figures["validation/accuracy"]!,
      "warmup/validation_invalid_tool_call_rate": figures["validation/invalid_tool_call_rate"]!
    }
  })

  // ----- Rollouts -----
  const B = config.algorithm.groupsPerStep
  const numChains = config.agent.numChains
  const dynamic = config.algorithm.dynamicSampling
  const rolledOut = (indices: ReadonlyArray<number>, firstSeq: number, version: number) => {
    const rows = indices.map((i) => options.train.rows[i]!)
    const sampling = {
      firstSeq,
      chains: numChains,
      temperature: config.agent.temperature,
      seed: config.seed * 1_000_000 + firstSeq * numChains
    }
    const groups = options.rollouts === undefined
      ? collectGroups(agentOf, rows, sampling).pipe(sampledBy(version))
      : options.rollouts.collect(rows, sampling, version)
    return Effect.map(groups, (groups) =>
      groups.map((group): SampledGroup => ({
        group,
        seq: firstSeq + group.rowIndex,
        row: indices[group.rowIndex]!
      })))
  }
  // A training batch, sampled by `version`: here, or by the rollout workers when the run has them. Its first rows
  // are the run's row order at `(step − 1) · B`; dynamic sampling's further batches come from rows of a second order
  // and seqs of their own (`extraSeqs`), fixed by the step alone, so that batches sampled at once stay independent
  // and a resumed run samples each step's batch as the unbroken run did.
  const batchFor = (step: number, version: number) =>
    Effect.gen(function*() {
      const sampled = yield* rolledOut(rowsAt(options.train.rows.length, config.seed, (step - 1) * B, B), (step - 1) * B, version)
      if (dynamic === undefined) return { step, sampled, kept: sampled, batches: 1 }
      const kept = sampled.filter((s) => Trajectory.rewardsDiffer(s.group))
      let batches = 1
      while (batches < dynamic.maxBatches && kept.length < B) {
        const position = ((step - 1) * (dynamic.maxBatches - 1) + batches - 1) * B
        const indices = rowsAt(options.train.rows.length, config.seed ^ 0x5eed_d5, position, B)
        const more = yield* rolledOut(indices, extraSeqs + position, version)
        sampled.push(...more)
        kept.push(...more.filter((s) => Trajectory.rewardsDiffer(s.group)))
        batches++
      }
      return { step, sampled, kept: kept.slice(0, B), batches }
    })

  // ----- Warm-up (SFT) -----
  if (warmupRuns && config.warmup !== undefined && options.demos !== undefined) {
    const warmup = config.warmup
    const demos = options.demos.rows
    yield* checkDemosFit(agentOf, demos, notice)
    const stopAt = warmup.stopAt
    if (stopAt !== undefined && options.validation === undefined) {
      return yield* new TrainerError({ reason: "Learner", message: "warmup.stopAt needs its validation split" })
    }
    let done = warmup.steps
    let reached = false
    let best: { readonly step: number; readonly accuracy: number } | undefined
    for (let step = 1; step <= warmup.steps; step++) {
      const t0 = yield* Clock.currentTimeMillis
      const batch = rowsAt(demos.length, config.seed ^ 0x51f7, (step - 1) * warmup.batchSize, warmup.batchSize)
        .map((i) => demos[i]!)
      const figures = yield* policy.sft(step, batch).pipe(Effect.tap(finiteLoss(`warm-up step ${step}`, "warmup/loss")))
      const seconds = ((yield* Clock.currentTimeMillis) - t0) / 1000
      const tokensPerS = (figures["perf/row_tokens"] ?? 0) / Math.max(1e-3, seconds)
      const check = stopAt !== undefined && isCheckStep(step, warmup.steps, stopAt)
        ? yield* validate(step, warmup.steps, stopAt)
        : undefined
      const record = {
        phase: "warmup" as const,
        step,
        elapsed: yield* elapsed,
        figures: { ...figures, ...check, "time/step_s": seconds, "perf/tokens_per_s": tokensPerS }
      }
      yield* metrics.log(record).pipe(Effect.mapError(io))
      yield* display.update({ ...record, total: warmup.steps })
      const accuracy = check?.["warmup/validation_accuracy"]
      if (accuracy !== undefined && (best === undefined || accuracy > best.accuracy)) best = { step, accuracy }
      if (accuracy !== undefined && accuracy >= stopAt!.accuracy) {
        done = step
        reached = true
        break
      }
    }
    if (stopAt !== undefined && !reached && stopAt.onMiss === "fail") {
      return yield* new TrainerError({
        reason: "Warmup",
        message: `the warm-up ran its ${warmup.steps} steps short of its target validation accuracy ` +
          `${stopAt.accuracy}: ${
            best === undefined ? "no check ran" : `best ${best.accuracy} at step ${best.step}`
          } (warmup.stopAt.onMiss: "fail"; try more steps or another model.initSeed)`
      })
    }
    if (stopAt !== undefined && !reached) {
      yield* notice(
        `the warm-up ran its ${warmup.steps} steps short of its target validation accuracy ${stopAt.accuracy} (` +
          `${best === undefined ? "no check ran" : `best ${best.accuracy.toFixed(3)} at step ${best.step}`}); going ` +
          `on to RL from its last step (warmup.stopAt.onMiss: "fail" stops a run here instead)`
      )
    }
    yield* journal.append({ kind: "warmup", steps: done }).pipe(Effect.mapError(io))
    yield* publish(0)
  }

  // ----- The pipeline -----
  const lastStep = config.algorithm.steps
  const ahead = config.mode === "sync" ? 0 : config.maxStaleness
  const schedule = { ahead, checkpointEvery: config.checkpoint.every, from: point.step }
  const batches = yield* Queue.bounded<Fiber.Fiber<Effect.Success<ReturnType<typeof batchFor>>, TrainerError>>(
    ahead + 1
  )
  yield* Effect.gen(function*() {
    for (let step = point.step + 1; step <= lastStep; step++) {
      const version = samplingVersion(step, schedule)
      yield* Deferred.await(publishedDeferred(version))
      const fiber = yield* Effect.forkScoped(batchFor(step, version))
      yield* Queue.offer(batches, fiber)
    }
  }).pipe(Effect.forkScoped)

  // Every evaluation precedes its step's checkpoint, so a run resumed from a checkpoint kept that step's evaluation.
  if (point.checkpoint === undefined || !options.resume) yield* evaluate(point.step)
  if (warmupRuns) yield* saveCheckpoint(0)
  let lastSaved = point.step
  let trained = 0
  let skipped = 0
  let warnedCut = false
  let warnedFull = false
  let warnedUnfit = false
  let warnedShort = false
  let warnedDefect = false
  for (let step = point.step + 1; step <= lastStep; step++) {
    const t0 = yield* Clock.currentTimeMillis
    const batch = yield* Fiber.join(yield* Queue.take(batches))
    const t1 = yield* Clock.currentTimeMillis
    // Every group sampled is journaled (one fsync for the batch), the ones dynamic sampling left out too.
    yield* journal.appendAll(batch.sampled.map(({ group, row, seq }) => ({
      kind: "group" as const,
      seq,
      groupId: group.groupId,
      rowIndex: row,
      policyVersion: Math.min(...group.trajectories.map((t) => Trajectory.oldestPolicyVersion(t) ?? step - 1)),
      // Finite by construction (rewards are checked where they are made); a guard keeps the journal readable anyway.
      meanReward: finiteOr0(mean(group.trajectories.map((t) => t.reward)))
    }))).pipe(Effect.mapError(io))
    // The rollout figures are the policy's, over everything it sampled; the learner gets the kept groups.
    const sampledGroups = batch.sampled.map((s) => s.group)
    const rollout: Figures = {
      ...rolloutFigures(sampledGroups, {
        prefix: "rollout",
        correct,
        policyVersion: step - 1,
        tools: toolNames(agentOf.runtime)
      }),
      ...(dynamic === undefined ? {} : {
        "rollout/dynamic_batches": batch.batches,
        "rollout/groups_sampled": batch.sampled.length,
        "rollout/groups_kept": batch.kept.length
      })
    }
    if (dynamic !== undefined && batch.kept.length < B && !warnedShort) {
      warnedShort = true
      yield* notice(
        `step ${step}: dynamic sampling found ${batch.kept.length} of ${B} groups whose rewards differ in ` +
          `${batch.batches} batches (algorithm.dynamicSampling.maxBatches); the step trains on those (said once)`
      )
    }
    // Turns cut by a token budget look like a policy that cannot call tools or answer: say so once, with the setting.
    const requestCaps = sampledGroups.flatMap((g) =>
      g.trajectories.flatMap((t) => {
        const cap = t.termination === "stop" ? t.metrics["gateway/cut_at_request_max_tokens"] : undefined
        return cap === undefined ? [] : [cap]
      })
    )
    const budgets = budgetWarnings(step, rollout, config.agent, requestCaps, agentOf.runtime.task)
    if (budgets.cut !== undefined && !warnedCut) {
      warnedCut = true
      yield* notice(budgets.cut)
    }
    // A tool whose handler dies is a bug in the task, which the policy cannot learn around: say so once.
    const defects = rollout["rollout/tool_errors/Defect"] ?? 0
    if (defects > 0 && !warnedDefect) {
      warnedDefect = true
      yield* notice(
        `step ${step}: ${defects} tool call(s) died in the tool's own code (rollout/tool_errors/Defect): a bug in the ` +
          `task's tools, not the model's; the first one's stack is logged above (said once)`
      )
    }
    if (budgets.full !== undefined && !warnedFull) {
      warnedFull = true
      yield* notice(budgets.full)
    }
    // Prompts that fill the context end their chains before a token: an agent function's prompts (its SDK's) are
    // only known here, and a task's rows past the first ones `checkPromptsFit` read.
    const trajectories = sampledGroups.flatMap((g) => g.trajectories)
    const unfit = trajectories.filter((t) => t.termination === "context_length" && t.metrics["tokens_generated"] === 0)
    if (unfit.length > 0 && !warnedUnfit) {
      warnedUnfit = true
      yield* notice(
        `step ${step}: ${unfit.length} of ${trajectories.length} chains ended before sampling a token: their prompt ` +
          `(system prompt, messages, and the tools' schemas with agent.renderTools) fills agent.maxContextTokens ` +
          `(${config.agent.maxContextTokens})`
      )
    }
    const failures = infrastructureFailures(trajectories)
    if (failures.share > config.maxFailureShare) {
      const failed = { phase: "train" as const, step, elapsed: yield* elapsed, figures: rollout }
      yield* metrics.log({ ...failed, ...failureNote(sampledGroups) }).pipe(Effect.mapError(io))
      yield* checkFailures(sampledGroups, `step ${step}`)
    }
    const learned = yield* policy.learn(step, batch.kept.map((s) => s.group)).pipe(Effect.tap(finiteLoss(`step ${step}`, "learner/loss")))
    if (learned["learner/applied"] === 0) skipped++
    else trained++
    yield* publish(step)
    const t2 = yield* Clock.currentTimeMillis
    const figures: Record<string, number> = {
      ...rollout,
      ...learned,
      ...(yield* agentOf.runtime.environmentStats),
      ...(yield* stepCounts),
      "perf/tokens_per_s": rollout["rollout/policy_tokens"]! / Math.max(1e-3, (t2 - t0) / 1000),
      "time/step_s": (t2 - t0) / 1000,
      "time/wait_rollout_s": (t1 - t0) / 1000,
      "time/learn_s": (t2 - t1) / 1000
    }
    yield* journal.append({
      kind: "step",
      step,
      seqs: batch.kept.map((s) => s.seq),
      policyVersion: step,
      weightsHash: yield* policy.fingerprint
    }).pipe(Effect.mapError(io))
    const record = { phase: "train" as const, step, elapsed: yield* elapsed, figures, ...failureNote(sampledGroups) }
    yield* metrics.log(record).pipe(Effect.mapError(io))
    for (const g of sampledGroups.slice(0, config.sampleTrajectories)) {
      yield* metrics.sample(sampleOf(g.trajectories[0]!, "train", step, tokenText)).pipe(Effect.mapError(io))
    }
    yield* display.update({ ...record, total: lastStep })
    if (step % config.eval.every === 0 || step === lastStep) yield* evaluate(step)
    if (step % config.checkpoint.every === 0 || step === lastStep) {
      yield* saveCheckpoint(step)
      lastSaved = step
    }
  }
  if (lastSaved !== lastStep && lastStep > point.step) yield* saveCheckpoint(lastStep)
  yield* journal.append({ kind: "finished", step: lastStep }).pipe(Effect.mapError(io))
  return { fromStep: point.step, steps: lastStep, trained, skipped, evals, fingerprint: yield* policy.fingerprint }
})
