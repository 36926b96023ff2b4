/**
 * What every piece of the local learner (`actors/LocalPolicy.ts`) shares: the model folder and the run's config,
 * the trainers' model and optimiser, the RL loss and schedule, the run's scope and file system, the remote trainer
 * (`learner.url`); the check that a run fits in the machine's memory; and the errors those pieces fail with, each a
 * `RunError` reason.
 */
import { Context, Effect, FileSystem } from "effect"
import type { Scope } from "effect"
import { totalmem } from "node:os"
import * as DiskFull from "../../src/internal/diskFull.ts"
import type * as Loss from "../../src/Loss.ts"
import type * as LrSchedule from "../../src/LrSchedule.ts"
import type * as ModelFolder from "../../src/ModelFolder.ts"
import type * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import type * as Optimizer from "../../src/Optimizer.ts"
import * as Lora from "../../src/Lora.ts"
import * as MemoryEstimate from "../../src/MemoryEstimate.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import { RunError, runError } from "../RunError.ts"
import type * as RemoteLearner from "./remoteLearner.ts"
import type * as TinkerLearner from "./tinkerLearner.ts"

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
  /** The Tinker engine of `learner.backend: "tinker"`, if the run has one. */
  readonly tinker: TinkerLearner.Tinker | undefined
  /** How the local engines hold a version's weights: `engine.weights` resolved ({@link engineWeightsOf}). */
  readonly engineWeights: "initializers" | "inputs"
  /**
   * The caller hands the folder's weights over (`agentfly train`): once the learner holds its own copy they are
   * released (`localVersions.releaseFolder`), where nothing else reads them (full fine-tuning of a text model here).
   */
  readonly releaseFolder: boolean
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

/**
 * The machine's memory in bytes for {@link checkMemory}; `undefined` (the default) reads it: the cgroup's limit
 * (v2 `memory.max`, v1 `memory.limit_in_bytes`) where one is set, else the physical memory. Tests set a small one.
 */
export const MachineMemory = Context.Reference<number | undefined>("agentfly/actors/MachineMemory", {
  defaultValue: () => undefined
})

const cgroupLimits = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]

/** The machine's memory: {@link MachineMemory}, the cgroup's limit, or the physical memory. */
export const machineMemory = Effect.fnUntraced(function*() {
  const fixed = yield* MachineMemory
  if (fixed !== undefined) return fixed
  const fs = yield* FileSystem.FileSystem
  const physical = totalmem()
  for (const path of cgroupLimits) {
    const text = yield* fs.readFileString(path).pipe(Effect.orElseSucceed(() => ""))
    const limit = Number(text.trim()) // "max" (no limit) and a missing file are NaN
    if (Number.isFinite(limit) && limit > 0) return Math.min(limit, physical)
  }
  return physical
})

/** The learner's memory settings as `OnnxTrainer.Options` (absent keys left out: the trainer's defaults). */
export const learnerMemory = (
  config: TrainConfig.TrainConfig
): Pick<OnnxTrainer.Options, "moments" | "recompute"> => ({
  ...(config.learner.moments === undefined ? {} : { moments: config.learner.moments }),
  ...(config.learner.recompute === undefined ? {} : { recompute: config.learner.recompute })
})

/** glibc's mmap threshold is fixed for this process (read once at its start), as activation recompute needs. */
export const mmapThresholdFixed = (): boolean => process.env["MALLOC_MMAP_THRESHOLD_"] !== undefined

/**
 * Refuses, before any trainer is built, a local learner whose estimated peak memory (`MemoryEstimate`) exceeds the
 * machine's: a `Learner` reason whose message gives the estimate by part and the settings that would fit, with the
 * `MemoryEstimate.OutOfMemory` as its cause, instead of the out-of-memory killer ending the run silently.
 */
export const checkMemory = Effect.fnUntraced(function*(setup: Setup) {
  if (setup.remote !== undefined || setup.tinker !== undefined) return
  const { learner } = setup.config
  const settings = memorySettings(setup, setup.engineWeights)
  if (learner.recompute === true && !mmapThresholdFixed()) {
    yield* Effect.logWarning(
      "learner.recompute: the activations' memory is returned to the system only with MALLOC_MMAP_THRESHOLD_=1048576 " +
        "in agentfly's environment (glibc reads it at start); without it the peak does not fall. Start the run as " +
        "`MALLOC_MMAP_THRESHOLD_=1048576 agentfly train …`"
    )
  }
  const available = yield* machineMemory().pipe(Effect.provideContext(setup.fsContext))
  const refused = MemoryEstimate.check(setup.folder.config, settings, available)
  if (refused !== undefined) return yield* runError("Learner", refused.message, refused)
})

/** The published versions a run's schedule may still sample: the newest in sync mode, `maxStaleness + 1` in async. */
export const keptVersions = (config: TrainConfig.TrainConfig): number =>
  (config.mode === "async" ? config.maxStaleness : 0) + 1

/** The folder's weights can be released once the learner copied them: a local full fine-tuning of a text model. */
export const folderReleasable = (setup: Omit<Setup, "engineWeights">): boolean =>
  setup.releaseFolder && setup.config.model.lora === undefined && setup.folder.vision === undefined &&
  setup.remote === undefined && setup.tinker === undefined

/** What `MemoryEstimate` reads of a run whose engines hold their weights as `engineWeights`. */
const memorySettings = (
  setup: Omit<Setup, "engineWeights">,
  engineWeights: "initializers" | "inputs"
): MemoryEstimate.Settings => {
  const { algorithm, learner } = setup.config
  return {
    microBatchSize: algorithm.microBatchSize,
    sequenceLength: TrainConfig.onModel(setup.config, setup.folder.config).agent.maxContextTokens!,
    workers: learner.workers,
    reference: algorithm.klCoef > 0,
    critic: algorithm.advantage === "gae",
    moments: learner.moments ?? "float32",
    // Recompute lowers the peak only where glibc returns freed blocks (`bin/agentfly.mjs`): counted only then.
    recompute: learner.recompute === true && mmapThresholdFixed(),
    // A LoRA run's gradients and moments are its adapters'.
    ...(setup.config.model.lora === undefined ? {} : {
      trainedParameters: Lora.parameters(setup.folder.config, setup.config.model.lora)
        .reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0)
    }),
    // A LoRA run's engines feed the base as it is: counted as before (the estimate of issue 41, conservative there).
    ...(engineWeights === "inputs" && setup.config.model.lora === undefined
      ? {
        engineWeights,
        // A sync run lets its published copies go while the learner steps, the peak (`localVersions.learnerChanges`).
        publishedVersions: setup.config.mode === "sync" ? 0 : keptVersions(setup.config),
        folderReleased: folderReleasable(setup)
      }
      : {})
  }
}

/**
 * `engine.weights` resolved: `"auto"` is `"inputs"` where the run fits the machine's memory only so (`MemoryEstimate`),
 * else `"initializers"`, whose pre-packed products decode faster (the embedded presets and the demo always fit).
 * Both sample the same tokens (`test/actors/TrainEngineWeights.test.ts`), so the choice changes memory and speed only.
 */
export const engineWeightsOf = Effect.fnUntraced(function*(setup: Omit<Setup, "engineWeights">) {
  const chosen = setup.config.engine.weights ?? "auto"
  if (chosen !== "auto") return chosen
  if (setup.remote !== undefined || setup.tinker !== undefined) return "initializers" as const
  const c = setup.folder.config
  const available = yield* machineMemory().pipe(Effect.provideContext(setup.fsContext))
  const fits = (w: "initializers" | "inputs") => MemoryEstimate.estimate(c, memorySettings(setup, w)).total <= available
  return !fits("initializers") && fits("inputs") ? "inputs" as const : "initializers" as const
})
