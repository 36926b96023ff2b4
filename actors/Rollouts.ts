/**
 * Where a run's training batches roll out: the {@link Rollouts} service, one layer per way — in this process
 * ({@link inProcess}: chains, or agent functions through the gateway, on a sampler of the batch's policy version),
 * on HTTP rollout workers (`RolloutWorker.layer`) or through the Redis queue (`RolloutQueue.layer`) — so the training
 * loop asks for a batch without knowing where it runs. Evaluations and warm-up checks always roll out here
 * ({@link collectGroups}, {@link evaluation}).
 *
 * A batch's groups are ordered by row; chain `k` of row `i` samples with `seed + i·chains + k` and the episode of row
 * `i` starts from `seed + i·chains`, wherever it runs, so a batch is the same in process and on workers.
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer, Stream } from "effect"
import * as AgentTask from "../src/AgentTask.ts"
import type * as Dataset from "../src/Dataset.ts"
import * as RolloutFigures from "../src/RolloutFigures.ts"
import { Sampler } from "../src/Sampler.ts"
import * as Task from "../src/Task.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import * as AgentRollout from "./gateway/AgentRollout.ts"
import type { Figures } from "./Learner.ts"
import { PolicyVersions } from "./PolicyVersions.ts"
import * as Rollout from "./Rollout.ts"
import * as RolloutSetup from "./RolloutSetup.ts"
import * as RunError from "./RunError.ts"

// ===== The service =====

/**
 * A run's training batches.
 *
 * @category services
 * @since 0.1.0
 */
export class Rollouts extends Context.Service<Rollouts, {
  /**
   * The groups of `rows`, sampled by policy version `version` (a worker may sample with a newer one), in row order,
   * with the ids, seeds and row indices {@link collectGroups} gives them here. `setup` is the run's: a layer in this
   * process rolls out with it; workers elsewhere have their own, checked against the run's when they connect.
   */
  readonly collect: (
    setup: RolloutSetup.RolloutSetup,
    rows: ReadonlyArray<Dataset.Row>,
    sampling: RolloutSetup.BatchSampling,
    version: number
  ) => Effect.Effect<Array<Trajectory.Group>, RunError.RunError>
  /** Figures since the previous read, for a step's metrics (`workers/…`, `servers/…`), if any. */
  readonly figures?: Effect.Effect<Figures> | undefined
}>()("agentfly/actors/Rollouts") {}

/**
 * Batches rolled out elsewhere (HTTP rollout workers, the Redis queue's workers), which run their own setup: the
 * groups of `rows` sampled with policy version `version` or newer, with the ids, seeds and row indices
 * {@link collectGroups} gives them here.
 *
 * @category models
 * @since 0.1.0
 */
export interface Remote {
  readonly collect: (
    rows: ReadonlyArray<Dataset.Row>,
    sampling: RolloutSetup.BatchSampling,
    version: number
  ) => Effect.Effect<Array<Trajectory.Group>, RunError.RunError>
  /** Figures since the previous read, for a step's metrics (`workers/…`). */
  readonly figures?: Effect.Effect<Figures> | undefined
}

/**
 * The service over remote rollouts (`RolloutWorker.layer`, `RolloutQueue.layer`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromRemote = (remote: Remote): Rollouts["Service"] =>
  Rollouts.of({
    collect: (_setup, rows, sampling, version) => remote.collect(rows, sampling, version),
    figures: remote.figures
  })

/**
 * Rollouts on a sampler of their own, pinned to published version `version` and closed when they end.
 *
 * @category combinators
 * @since 0.1.0
 */
export const sampledBy = (versions: PolicyVersions["Service"], version: number) =>
<A, E>(rollouts: Effect.Effect<A, E, Sampler>): Effect.Effect<A, E | RunError.RunError> =>
  Effect.scoped(
    Effect.flatMap(versions.sampler(version), (sampler) => Effect.provideService(rollouts, Sampler, sampler))
  )

/**
 * Training batches in this process, each on a sampler of its own version (`PolicyVersions.sampler`).
 *
 * @category layers
 * @since 0.1.0
 */
export const inProcess: Layer.Layer<Rollouts, never, PolicyVersions> = Layer.effect(
  Rollouts,
  Effect.gen(function*() {
    const versions = yield* PolicyVersions
    return Rollouts.of({
      collect: (setup, rows, sampling, version) =>
        collectGroups(setup, rows, sampling).pipe(sampledBy(versions, version))
    })
  })
)

// ===== Rolling out here =====

/**
 * Rolls out one group of `chains` chains per row with a run's setup, on the `Sampler` in context; the groups in row
 * order. Chain `k` of row `i` samples with `seed + i·chains + k`; the environment's episode of row `i` starts from
 * `seed + i·chains`. An agent function's episodes run through the gateway, with the same ids, seeds and figures.
 *
 * @category constructors
 * @since 0.1.0
 */
export const collectGroups = (
  setup: RolloutSetup.RolloutSetup,
  rows: ReadonlyArray<Dataset.Row>,
  sampling: RolloutSetup.BatchSampling
): Effect.Effect<Array<Trajectory.Group>, RunError.RunError, Sampler> => {
  const { config, runtime } = setup
  const common = {
    numChains: sampling.chains,
    maxConcurrentChains: setup.maxConcurrentChains ?? 64,
    maxContextTokens: config.agent.maxContextTokens,
    sampling: RolloutSetup.samplingParams(setup, sampling),
    format: setup.format,
    reward: runtime.reward,
    policies: runtime.policies,
    runId: `s${sampling.firstSeq}`,
    rowOffset: sampling.rowOffset
  }
  if (AgentTask.isAgentTask(runtime.task)) {
    return AgentRollout.groups({
      ...common,
      task: runtime.task,
      rows,
      systemPrompt: config.agent.systemPrompt,
      renderTools: config.agent.renderTools
    }).pipe(Effect.mapError(RunError.wrap("Rollout")))
  }
  const task = runtime.task
  return Rollout.run({
    ...common,
    rows: rows.map((row) => ({ ...row.fields, messages: Task.conversation(task, row, config.agent.systemPrompt) })),
    maxTurns: config.agent.maxTurns,
    tools: runtime.tools,
    environment: runtime.environment,
    episode: runtime.episode,
    ...(config.agent.context === undefined ? {} : { context: config.agent.context })
  }).pipe(
    Stream.runFold(() => [] as Array<Trajectory.Group>, (acc, event) => {
      if (event._tag === "Group") acc.push(event.group)
      return acc
    }),
    Effect.map((groups) => groups.sort((a, b) => a.rowIndex - b.rowIndex)),
    Effect.mapError(RunError.wrap("Rollout"))
  )
}

/**
 * A held-out evaluation: the first `config.eval.size` rows (all when unset), `config.eval.samples` answers each at
 * `config.eval.temperature`, seeded by the run's seed, so that evaluating a run's checkpoint repeats the run's own
 * evaluation at that step. Figures under `eval/` (`RolloutFigures.rolloutFigures`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const evaluation = (
  setup: RolloutSetup.RolloutSetup,
  rows: ReadonlyArray<Dataset.Row>
): Effect.Effect<
  { readonly groups: Array<Trajectory.Group>; readonly figures: Figures },
  RunError.RunError,
  Sampler
> => {
  const { config } = setup
  const size = Math.min(config.eval.size ?? rows.length, rows.length)
  return Effect.map(
    collectGroups(setup, rows.slice(0, size), {
      firstSeq: 0,
      chains: config.eval.samples,
      temperature: config.eval.temperature,
      seed: 7_000_000 + config.seed
    }),
    (groups) => ({
      groups,
      figures: RolloutFigures.rolloutFigures(groups, {
        prefix: "eval",
        correct: setup.runtime.correct,
        tools: RolloutSetup.toolNames(setup)
      })
    })
  )
}
