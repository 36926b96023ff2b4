/**
 * Policy versions: the learner's weights published under increasing numbers, and samplers pinned to one of them. The
 * training loop publishes version `v` after learner step `v` (0 after the warm-up; negative versions are the
 * warm-up's checks) and rolls out every batch on a sampler of the version its schedule names
 * (`RunSchedule.samplingVersion`). The local implementation builds an engine per sampler from the published weights,
 * or pushes every version to inference servers (`LocalPolicy.layer`).
 *
 * @since 0.1.0
 */
import { Context } from "effect"
import type { Effect, Scope } from "effect"
import type { Sampler } from "../src/Sampler.ts"
import type { Figures } from "./Learner.ts"
import type { RunError } from "./RunError.ts"

/**
 * @category services
 * @since 0.1.0
 */
export class PolicyVersions extends Context.Service<PolicyVersions, {
  /** Makes the learner's current weights policy `version` (versions increase), for {@link PolicyVersions} `sampler`. */
  readonly publish: (version: number) => Effect.Effect<void, RunError>
  /**
   * A sampler of published version `version` for one rollout batch, evaluation or warm-up check, alive in the
   * scope: every token it samples comes from that version, and its engine batches its own requests only, so what it
   * samples does not depend on any other batch running beside it. The versions a run still asks for are the last
   * `maxStaleness + 1` published (the newest in sync mode): what the schedule may still sample.
   */
  readonly sampler: (version: number) => Effect.Effect<Sampler["Service"], RunError, Scope.Scope>
  /** Figures of the versions' machinery for a step's metrics (inference servers: `servers/…`), if any. */
  readonly figures?: Effect.Effect<Figures> | undefined
}>()("agentfly/actors/PolicyVersions") {}
