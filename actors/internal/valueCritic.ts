/**
 * The critic of `gae` (PPO with a value model): a trainer over the value model, started from the policy RL starts
 * from (version 0) in a scope of its own, saved into every checkpoint's `critic/` folder (before the policy's state
 * file, which marks a checkpoint complete), from which a resumed run loads it instead.
 */
import { Effect, Scope } from "effect"
import * as Loss from "../../src/Loss.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as Optimizer from "../../src/Optimizer.ts"
import * as RemoteTrainer from "../../src/backends/RemoteTrainer.ts"
import type * as GradientBackend from "../../src/GradientBackend.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import type { RunError } from "../RunError.ts"
import { checkpointError, learnerError, learnerMemory, type Setup } from "./localSetup.ts"

export type Critic = GradientBackend.GradientBackend["Service"]

/** A critic whose body is the policy's `policyWeights` and whose value head starts at zero. */
export const start = (setup: Setup, policyWeights: GradientBackend.Weights): Effect.Effect<Critic, RunError> => {
  const { folder, config, remote } = setup
  const criticSettings = TrainConfig.criticOf(config)
  const criticModel = OnnxTrainer.qwen2Value(folder.config)
  const settings = {
    weights: Qwen2.criticWeights(folder.config, policyWeights),
    loss: { ...Loss.value, clipLow: criticSettings.valueClip, clipHigh: criticSettings.valueClip },
    optimizer: {
      ...Optimizer.defaultConfig,
      weightDecay: criticSettings.weightDecay,
      maxGradNorm: criticSettings.gradClip
    },
    // The critic follows the policy's mini-batches and epochs: its warm-up is in learner steps too.
    schedule: LrSchedule.inUpdates(
      LrSchedule.constant(criticSettings.lr, criticSettings.lrWarmupSteps),
      config.algorithm.miniBatches * config.algorithm.epochs
    )
  }
  return Scope.fork(setup.runScope).pipe(
    Effect.flatMap((scope) =>
      (remote === undefined
        ? Effect.map(
          OnnxTrainer.make({
            model: criticModel,
            ...settings,
            workers: config.learner.workers,
            ...learnerMemory(config),
            intraOpThreads: setup.intraOpThreads
          }),
          (made) => made.trainer
        )
        : RemoteTrainer.make({
          ...remote.settings,
          name: `critic-${remote.runName}`,
          head: "value",
          parameters: criticModel.parameters,
          ...settings
        })).pipe(Effect.provideService(Scope.Scope, scope))
    ),
    Effect.mapError(learnerError),
    Effect.provide(setup.fsContext)
  )
}

const folderIn = (dir: string) => `${dir}/critic`

/** Saves the critic into checkpoint `dir`. */
export const save = (critic: Critic, dir: string, policyVersion: number): Effect.Effect<void, RunError> =>
  critic.save(folderIn(dir), { policyVersion, rngState: [] }).pipe(Effect.mapError(checkpointError))

/** Loads the critic saved in checkpoint `dir`. */
export const load = (critic: Critic, dir: string): Effect.Effect<void, RunError> =>
  critic.load(folderIn(dir)).pipe(Effect.asVoid, Effect.mapError(checkpointError))
