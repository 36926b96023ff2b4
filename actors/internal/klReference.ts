/**
 * The frozen reference policy of the KL term (`algorithm.klCoef > 0`) or of KL in the reward (`klInReward > 0`):
 * the policy RL starts from (policy version 0: the warm-up's result, or the folder's weights). It is frozen when
 * version 0 is first published and saved into every checkpoint (`reference.safetensors`, or its shards and index), so that a resumed run
 * penalises against the same reference.
 */
import { Effect, FileSystem, Scope } from "effect"
import * as Loss from "../../src/Loss.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as RemoteTrainer from "../../src/backends/RemoteTrainer.ts"
import type * as GradientBackend from "../../src/GradientBackend.ts"
import * as Safetensors from "../../src/Safetensors.ts"
import type * as TrainConfig from "../../src/TrainConfig.ts"
import type * as Learner from "../Learner.ts"
import { RunError, runError } from "../RunError.ts"
import { checkpointError, learnerError, type Setup } from "./localSetup.ts"

export interface Reference {
  readonly weights: GradientBackend.Weights
  readonly logprobs: NonNullable<Learner.Options["reference"]>
}

/** Whether the run's loss or rewards need a reference policy. */
export const needed = (algorithm: TrainConfig.TrainConfig["algorithm"]): boolean =>
  algorithm.klCoef > 0 || (algorithm.klInReward ?? 0) > 0

/** The reference on `weights`: a forward-only graph here, or a trainer of its own on the trainer server. */
export const make = (setup: Setup, weights: GradientBackend.Weights): Effect.Effect<Reference, RunError> => {
  const { remote, model } = setup
  const logprobs = remote === undefined
    ? OnnxTrainer.makeReference(model, weights, { intraOpThreads: setup.intraOpThreads })
    : Effect.map(
      RemoteTrainer.make({
        ...remote.settings,
        name: `reference-${remote.runName}`,
        weights,
        loss: Loss.sft,
        optimizer: setup.optimizer,
        schedule: LrSchedule.constant(0)
      }).pipe(Effect.provideService(Scope.Scope, setup.runScope)),
      (frozen) => frozen.logprobs
    )
  return logprobs.pipe(
    Effect.map((logprobs): Reference => ({ weights, logprobs })),
    Effect.mapError(learnerError),
    Effect.provide(setup.fsContext)
  )
}

const file = (dir: string) => `${dir}/reference.safetensors`

/** Writes the reference's weights into checkpoint `dir`. */
export const save = (setup: Setup, reference: Reference, dir: string): Effect.Effect<void, RunError> =>
  Effect.gen(function*() {
    const { weights } = reference
    const tensors = setup.model.parameters.map((p) => ({ name: p.name, shape: p.shape, data: weights.get(p.name)! }))
    // Sharded past 2 GB as the checkpoint's own tensors are, so a real model's reference reads back.
    yield* Safetensors.writeSharded(dir, "reference", tensors)
  }).pipe(Effect.mapError(checkpointError), Effect.provide(setup.fsContext))

/** The reference saved in checkpoint `dir`; a checkpoint without one cannot resume a run with a KL term. */
export const load = (setup: Setup, dir: string): Effect.Effect<Reference, RunError> =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const path = file(dir)
    if (!(yield* fs.exists(path)) && !(yield* fs.exists(`${path}.index.json`))) {
      return yield* runError(
        "Checkpoint",
        `${path} is missing: a KL term (algorithm.klCoef or klInReward > 0) needs the reference policy ` +
          `the run started with`
      )
    }
    return yield* Safetensors.readFloat32Files(dir, setup.model.parameters, "reference")
  }).pipe(
    Effect.mapError((e) => (e instanceof RunError ? e : checkpointError(e))),
    Effect.flatMap((weights) => make(setup, weights)),
    Effect.provide(setup.fsContext)
  )
