/**
 * What every piece of the local learner (`actors/LocalPolicy.ts`) shares: the model folder and the run's config,
 * the trainers' model and optimiser, the RL loss and schedule, the run's scope and file system, the remote trainer
 * (`learner.url`); and the errors those pieces fail with, each a `RunError` reason.
 */
import type { Context, FileSystem, Scope } from "effect"
import * as DiskFull from "../../src/internal/diskFull.ts"
import type * as Loss from "../../src/Loss.ts"
import type * as LrSchedule from "../../src/LrSchedule.ts"
import type * as ModelFolder from "../../src/ModelFolder.ts"
import type * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import type * as Optimizer from "../../src/Optimizer.ts"
import type * as TrainConfig from "../../src/TrainConfig.ts"
import { RunError, runError } from "../RunError.ts"
import type * as RemoteLearner from "./remoteLearner.ts"

export interface Setup {
  readonly folder: ModelFolder.ModelFolder
  readonly config: TrainConfig.TrainConfig
  /** The policy's model as the trainers build it. */
  readonly model: OnnxTrainer.Model
  readonly optimizer: Optimizer.Config
  readonly rlLoss: Loss.Config
  readonly rlSchedule: LrSchedule.Config
  /** onnxruntime's intra-op threads per session (1: see `LocalPolicy.make`). */
  readonly intraOpThreads: number
  /** The run's scope: trainers, engines and the critic fork theirs from it. */
  readonly runScope: Scope.Scope
  /**
   * The file system and the run's scope, provided to trainers built later (a trainer's own scope is provided inside
   * it: see `learnerSlot.replace`).
   */
  readonly fsContext: Context.Context<FileSystem.FileSystem | Scope.Scope>
  /** The trainer server of `learner.url`, if the run has one. */
  readonly remote: RemoteLearner.Remote | undefined
}

/** A learner step, a trainer or an engine failed. */
export const learnerError = (e: { readonly message: string }) => runError("Learner", e.message, e)

/** A step left the loss or the weights NaN or infinite. */
export const nonFinite = (message: string) => runError("NonFinite", message)

/** Saving or loading a checkpoint failed (a full disk says so), whatever failed underneath. */
export const checkpointError = (e: { readonly message: string }): RunError => {
  if (e instanceof RunError && (e.reason._tag === "Checkpoint" || e.reason._tag === "DiskFull")) return e
  return runError(DiskFull.isDiskFull(e) ? "DiskFull" : "Checkpoint", e.message, e)
}
