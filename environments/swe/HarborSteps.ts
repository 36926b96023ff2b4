/**
 * Multi-step Harbor tasks (`[[steps]]`, https://www.harborframework.com/docs/tasks/multi-step): the steps run in
 * order against one container, each with its own instruction and verifier, and their rewards roll up into the
 * trial's. Pure functions over the steps' results; `Workspace` runs the steps (a `submit` verifies the current step
 * and, unless the trial stops there, answers with the next step's instruction).
 *
 * - A step **stops the trial** when its reward is below its `min_reward`: a number (the step's training reward), or a
 *   number per reward key (a key the verifier did not write counts 0).
 * - The **trial reward** (`multi_step_reward_strategy`): `mean` over the steps that contribute to it
 *   (`contributes_to_mean`, default true; a step never reached counts 0), or `final`: the last step's reward (0 when
 *   the trial stopped before it).
 *
 * @since 0.1.0
 */
import type * as HarborTask from "./HarborTask.ts"

/**
 * What a verified step said.
 *
 * @category models
 * @since 0.1.0
 */
export interface StepResult {
  readonly name: string
  /** The step's training reward. */
  readonly reward: number
  /** Every key its verifier wrote. */
  readonly rewards: Readonly<Record<string, number>>
}

/**
 * Whether a step's result stops the trial (its reward below the step's `min_reward`).
 *
 * @category getters
 * @since 0.1.0
 */
export const stops = (step: HarborTask.Step, result: StepResult): boolean => {
  const min = step.minReward
  if (min === undefined) return false
  if (typeof min === "number") return result.reward < min
  return Object.entries(min).some(([key, floor]) => (result.rewards[key] ?? 0) < floor)
}

/**
 * The trial reward of a task's step results (in order; steps never reached are absent).
 *
 * @category getters
 * @since 0.1.0
 */
export const trialReward = (task: HarborTask.HarborTask, results: ReadonlyArray<StepResult>): number => {
  const byName = new Map(results.map((r) => [r.name, r.reward]))
  if (task.stepStrategy === "final") return byName.get(task.steps.at(-1)!.name) ?? 0
  const counted = task.steps.filter((s) => s.contributesToMean)
  if (counted.length === 0) return 0
  return counted.reduce((sum, s) => sum + (byName.get(s.name) ?? 0), 0) / counted.length
}

/**
 * Every step's figures: `steps/<name>` (its reward) and `steps/<name>/<key>` (each key its verifier wrote).
 *
 * @category getters
 * @since 0.1.0
 */
export const figures = (results: ReadonlyArray<StepResult>): Record<string, number> => {
  const out: Record<string, number> = {}
  for (const r of results) {
    out[`steps/${r.name}`] = r.reward
    for (const [key, value] of Object.entries(r.rewards)) out[`steps/${r.name}/${key}`] = value
  }
  return out
}
