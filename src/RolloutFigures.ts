/**
 * A set of rollouts in figures, as a run's metrics log them (`rollout/…`, `eval/…`, `validation/…`): rewards,
 * accuracy with its standard error over questions, tool calls and tool errors, terminations, the reward's own
 * metrics, failures by reason; and the warnings a step's figures call for (turns cut by a token budget). Pure
 * functions of the trajectories.
 *
 * @since 0.1.0
 */
import type * as Task from "./Task.ts"
import * as Trajectory from "./Trajectory.ts"

/** What the warnings read of a task: its name and its defaults. */
export type TaskDefaults = Pick<Task.Any, "name" | "defaults">

/**
 * How a warning names the turn budget: its value, said to be the task's default when it is (`agent.maxNewTokens (96,
 * task webshop's default)`), and where to raise it: a user who never wrote `agent.maxNewTokens` would otherwise look
 * for it in their config and not find it. Known by value (the config's origin is gone by here): a config that sets
 * the task's own value reads the same, and raising it in the config is the fix either way.
 */
export const turnBudget = (maxNewTokens: number, task: TaskDefaults | undefined) =>
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
  task?: TaskDefaults,
  /** How many of the cut chains' last turns repeat themselves to the cut ({@link runsOn}). */
  looping = 0
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
      : cut >= 0.5 && chains > 0 && looping >= (cut * chains) / 2
      ? {
        // Runaway output: a larger budget would only make these turns longer, so it is not what to change.
        cut: `step ${step}: ${(cut * 100).toFixed(0)}% of the chains ended with a turn cut at agent.maxNewTokens ` +
          `(${budget.value}) before its end-of-turn token (termination "stop"), most of them repeating themselves ` +
          `to the cut (${looping} of ${Math.round(cut * chains)}): a policy running on in a loop, which more ` +
          `tokens would not end (more warm-up on demonstrations, or a lower temperature, is the fix)`
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
          `(${agent.maxContextTokens ?? "the model's"} tokens) before their episode ended ` +
          `(termination "context_length"); ` +
          `if their conversations need more, raise agent.maxContextTokens (up to the model's positions; a model at ` +
          `its positions needs a larger preset, or shorter episodes: fewer turns, shorter observations)`
      }
      : {})
  }
}

/**
 * Whether a sampled turn runs on in a loop: the second half of its tokens (at least 16 of them) repeats itself with
 * a period of at most 16 tokens (`)))))`, `abcabc`), nine positions in ten or more. A call or an answer longer than
 * the budget does not; runaway output from an untrained or collapsed policy does.
 *
 * @category getters
 * @since 0.1.0
 */
export const runsOn = (tokenIds: ReadonlyArray<number>): boolean => {
  const n = tokenIds.length
  if (n < 32) return false
  const from = Math.floor(n / 2)
  for (let period = 1; period <= 16; period++) {
    let same = 0
    for (let i = from; i < n; i++) if (tokenIds[i] === tokenIds[i - period]) same++
    if (same >= 0.9 * (n - from)) return true
  }
  return false
}

/** The tokens of a trajectory's last sampled turn (its last `policy` span), or none. */
const lastTurnTokens = (t: Trajectory.Trajectory): ReadonlyArray<number> => {
  const spans = t.segments.at(-1)?.spans ?? []
  for (let i = spans.length - 1; i >= 0; i--) if (spans[i]!.source === "policy") return spans[i]!.tokenIds
  return []
}

/**
 * A trajectory made a tool call that failed to parse or to run (an `is_error` observation, or a `tool_errors/<Reason>`
 * count: an agent function's SDK reads a malformed call as text, and the gateway counts it; a turn cut by max tokens
 * inside a call counts it as `tool_errors/ParseFailed`), or errored.
 */
/**
 * An error that ended a chain is an invalid call only when it is the call's (unparseable, or a tool failing on it)
 * or says no reason: a crashed agent, a hung tool or an unknown episode says nothing of the calls made.
 */
const callReasons: ReadonlySet<string> = new Set(["ParseFailed", "ToolFailed"])

const hasInvalidCall = (t: Trajectory.Trajectory): boolean =>
  (t.termination === "error" && (t.errorReason === undefined || callReasons.has(t.errorReason))) ||
  t.messages.some((m) => m.role === "tool" && m.is_error === true) ||
  Object.entries(t.metrics).some(([key, n]) => key.startsWith("tool_errors/") && n > 0)

/**
 * The mean of `xs`, 0 for none.
 *
 * @category getters
 * @since 0.1.0
 */
export const mean = (xs: ReadonlyArray<number>): number =>
  xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length

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

/**
 * A metrics record's `firstFailure`, when any of its trajectories failed: the message outlives the console.
 *
 * @category getters
 * @since 0.1.0
 */
export const failureNote = (groups: ReadonlyArray<Trajectory.Group>): { readonly firstFailure?: string } => {
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
  return {
    share: trajectories.length === 0 ? 0 : failed / trajectories.length,
    reason: top?.[0],
    count: top?.[1] ?? 0,
    total: trajectories.length
  }
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
 * A notice a step's rollouts call for, said once a run (`key` tells them apart).
 *
 * @category models
 * @since 0.1.0
 */
export interface Notice {
  readonly key: "short" | "cut" | "defect" | "full" | "unfit"
  readonly text: string
}

/**
 * What a training step's rollouts say that the user should know, in the order a run says them: dynamic sampling that
 * found fewer groups with signal than a step trains on (`short`), turns cut by a token budget (`cut`, `full`: see
 * {@link budgetWarnings}), tools whose own code died (`defect`: a bug in the task, not the model's), and prompts that
 * fill the context before a token (`unfit`: an agent function's prompts are only known here).
 *
 * @category getters
 * @since 0.1.0
 */
export const stepNotices = (
  step: number,
  rollout: Readonly<Record<string, number>>,
  groups: ReadonlyArray<Trajectory.Group>,
  options: {
    readonly agent: { readonly maxNewTokens: number; readonly maxContextTokens?: number | undefined }
    readonly task?: TaskDefaults | undefined
    /** Dynamic sampling's outcome, when the run samples so. */
    readonly dynamic?: { readonly kept: number; readonly wanted: number; readonly batches: number } | undefined
  }
): Array<Notice> => {
  const out: Array<Notice> = []
  const { dynamic } = options
  if (dynamic !== undefined && dynamic.kept < dynamic.wanted) {
    out.push({
      key: "short",
      text: `step ${step}: dynamic sampling found ${dynamic.kept} of ${dynamic.wanted} groups whose rewards ` +
        `differ in ${dynamic.batches} batches (algorithm.dynamicSampling.maxBatches); the step trains on those ` +
        `(said once)`
    })
  }
  const trajectories = groups.flatMap((g) => g.trajectories)
  // The caps an agent function's own requests set on the turns they cut.
  const requestCaps = trajectories.flatMap((t) => {
    const cap = t.termination === "stop" ? t.metrics["gateway/cut_at_request_max_tokens"] : undefined
    return cap === undefined ? [] : [cap]
  })
  const looping = trajectories.filter((t) => t.termination === "stop" && runsOn(lastTurnTokens(t))).length
  const budgets = budgetWarnings(step, rollout, options.agent, requestCaps, options.task, looping)
  if (budgets.cut !== undefined) out.push({ key: "cut", text: budgets.cut })
  const defects = rollout["rollout/tool_errors/Defect"] ?? 0
  if (defects > 0) {
    out.push({
      key: "defect",
      text: `step ${step}: ${defects} tool call(s) died in the tool's own code (rollout/tool_errors/Defect): a bug ` +
        `in the task's tools, not the model's; the first one's stack is logged above (said once)`
    })
  }
  if (budgets.full !== undefined) out.push({ key: "full", text: budgets.full })
  const unfit = trajectories.filter((t) => t.termination === "context_length" && t.metrics["tokens_generated"] === 0)
  if (unfit.length > 0) {
    out.push({
      key: "unfit",
      text: `step ${step}: ${unfit.length} of ${trajectories.length} chains ended before sampling a token: their ` +
        `prompt (system prompt, messages, and the tools' schemas with agent.renderTools) fills ` +
        `agent.maxContextTokens (${options.agent.maxContextTokens})`
    })
  }
  return out
}
