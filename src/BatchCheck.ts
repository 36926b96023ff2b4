/**
 * Whether a batch's groups answer the request they were rolled out for, checked before the learner sees them: a
 * rollout worker (or anyone who can answer in its place) could return groups of rows nobody asked for, sampled by a
 * policy version nobody published, with token ids outside the model's vocabulary or logprobs that are not numbers.
 * Such a batch is refused whole (`RunError` `Mismatch`), never trained on. Pure: the request in, the problems out.
 *
 * @since 0.1.0
 */
import type * as Trajectory from "./Trajectory.ts"

/**
 * What a batch was asked for.
 *
 * @category models
 * @since 0.1.0
 */
export interface Request {
  /** The batch's rows: groups answer rows `0 … rows − 1`, each at most once (a dropped group answers none). */
  readonly rows: number
  /** Chains per row: a group holds at most this many trajectories. */
  readonly chains: number
  /** The batch's first seq: group `r`'s id is `s<firstSeq>-g<r>`. */
  readonly firstSeq: number
  /** The policy versions that may have sampled it: the one it was asked of, up to the newest published. */
  readonly versions: { readonly from: number; readonly to: number }
  /** The model's vocabulary size, when known. */
  readonly vocabSize?: number | undefined
}

const MaxShown = 5

/**
 * The ways `groups` do not answer `request`, at most five named (and how many more); empty when they do.
 *
 * @category getters
 * @since 0.1.0
 */
export const problems = (groups: ReadonlyArray<Trajectory.Group>, request: Request): Array<string> => {
  const found: Array<string> = []
  const seen = new Set<number>()
  for (const group of groups) {
    const at = `group ${JSON.stringify(group.groupId)}`
    if (!Number.isInteger(group.rowIndex) || group.rowIndex < 0 || group.rowIndex >= request.rows) {
      found.push(`${at} answers row ${group.rowIndex}, outside the batch's ${request.rows} rows`)
      continue
    }
    if (seen.has(group.rowIndex)) found.push(`${at} answers row ${group.rowIndex} a second time`)
    seen.add(group.rowIndex)
    const id = `s${request.firstSeq}-g${group.rowIndex}`
    if (group.groupId !== id) found.push(`${at} should be ${JSON.stringify(id)} (its row and the batch's seq)`)
    if (group.trajectories.length > request.chains) {
      found.push(`${at} holds ${group.trajectories.length} trajectories, more than the ${request.chains} chains asked`)
    }
    for (const t of group.trajectories) found.push(...trajectoryProblems(t, at, request))
  }
  return found.length <= MaxShown ? found : [...found.slice(0, MaxShown), `… and ${found.length - MaxShown} more`]
}

/** A trajectory's reward, and its policy spans' versions, token ids and logprobs. */
const trajectoryProblems = (t: Trajectory.Trajectory, at: string, request: Request): Array<string> => {
  const found: Array<string> = []
  if (!Number.isFinite(t.reward)) found.push(`${at}: a reward of ${t.reward}`)
  const { from, to } = request.versions
  for (const segment of t.segments) {
    for (const span of segment.spans) {
      if (span.source !== "policy") continue
      const v = span.policyVersion
      if (v !== undefined && (v < from || v > to)) {
        found.push(`${at}: tokens of policy version ${v}, not one of the versions ${from}–${to} it may be sampled by`)
      }
      const vocab = request.vocabSize
      const bad = span.tokenIds.find((id) => !Number.isInteger(id) || id < 0 || (vocab !== undefined && id >= vocab))
      if (bad !== undefined) {
        found.push(`${at}: token id ${bad}, outside the model's vocabulary (${vocab ?? "ids ≥ 0"})`)
      }
      const nan = span.logprobs?.find((x) => !Number.isFinite(x) || x > 0)
      if (nan !== undefined) found.push(`${at}: a sampled logprob of ${nan}`)
      if (span.logprobs !== undefined && span.logprobs.length !== span.tokenIds.length) {
        found.push(`${at}: ${span.logprobs.length} logprobs for ${span.tokenIds.length} tokens`)
      }
    }
  }
  return found
}
