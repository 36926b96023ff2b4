/**
 * The learner's trainer slot: the trainer in use (the SFT one during the warm-up, then the RL one, which starts from
 * the SFT weights with a fresh optimiser when the warm-up ends), each in a scope of its own that is closed when the
 * next trainer replaces it, so that its sessions and worker threads go with it.
 *
 * **The weights, taken once per change.** `trainer.weights` is a copy of every weight (over the network for a
 * remote trainer), and the summary (fingerprint and first non-finite value) hashes all of them. The slot keeps both
 * until the weights change ({@link mutating}): a step's finiteness check, its publication and its journaled
 * fingerprint take them once.
 */
import { Effect, Exit, Scope } from "effect"
import type { FileSystem } from "effect"
import * as Checkpoint from "../../src/Checkpoint.ts"
import { collectGarbage, worthCollecting } from "../../src/internal/collectGarbage.ts"
import * as Lora from "../../src/Lora.ts"
import * as Loss from "../../src/Loss.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as RemoteTrainer from "../../src/backends/RemoteTrainer.ts"
import type * as GradientBackend from "../../src/GradientBackend.ts"
import type { RunError } from "../RunError.ts"
import * as PeakRss from "./peakRss.ts"
import * as TinkerLearner from "./tinkerLearner.ts"
import { checkMemory, learnerError, learnerMemory, nonFinite, type Setup } from "./localSetup.ts"

export interface Slot {
  readonly setup: Setup
  phase: "sft" | "rl"
  trainer: GradientBackend.GradientBackend["Service"]
  /** The trainer's own scope, closed when the next one replaces it. */
  scope: Scope.Closeable
  /** A copy of the trainer's weights, taken since they last changed. */
  weights: GradientBackend.Weights | undefined
  /** Their summary, computed since they last changed. */
  summary: RemoteTrainer.Summary | undefined
}

/** What a trainer starts from: weights, or on a Tinker engine the `tinker://` path of a training state. */
type Start = GradientBackend.Weights | string

/** The slot with the RL trainer on `weights` (the folder's), once the run is known to fit in memory. */
export const make = Effect.fnUntraced(function*(setup: Setup, weights: GradientBackend.Weights) {
  yield* checkMemory(setup)
  if (setup.remote === undefined && setup.tinker === undefined) {
    const count = setup.model.parameters.reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0)
    yield* PeakRss.countParameters(count, setup.runScope)
  }
  const { scope, trainer } = yield* open(setup, weights, setup.rlLoss, setup.rlSchedule)
  const slot: Slot = { setup, phase: "rl", trainer, scope, weights: undefined, summary: undefined }
  return slot
})

/**
 * A trainer on `weights`: onnxruntime's here, or the policy's trainer on the trainer server; on a Tinker engine, one
 * from the training state `weights` names (a new model when none).
 */
const build = (
  setup: Setup,
  weights: Start,
  loss: Loss.Config,
  schedule: LrSchedule.Config
): Effect.Effect<
  GradientBackend.GradientBackend["Service"],
  GradientBackend.GradientBackendError | RunError,
  Scope.Scope | FileSystem.FileSystem
> => {
  const { config, model, optimizer, remote, tinker } = setup
  if (tinker !== undefined) {
    const from = typeof weights === "string" ? weights : undefined
    return TinkerLearner.trainer(tinker, { loss, schedule, optimizer, from })
  }
  if (typeof weights === "string") return Effect.die(`a training state (${weights}) outside a Tinker run`)
  if (remote !== undefined) {
    return RemoteTrainer.make({ ...remote.settings, weights, loss, optimizer, schedule }).pipe(
      Effect.tap((t) => Effect.sync(() => (remote.current = t)))
    )
  }
  return OnnxTrainer.make({
    model,
    weights,
    loss,
    optimizer,
    schedule,
    workers: config.learner.workers,
    ...learnerMemory(config),
    // One intra-op thread: onnxruntime's multi-threaded kernels do not sum in a fixed order, so with two threads the
    // same step on the same batch gave different weights from run to run (and a resumed run other weights than the
    // unbroken one). Parallelism comes from `learner.workers`, which split rows, not sums.
    intraOpThreads: setup.intraOpThreads
  }).pipe(Effect.map((t) => t.trainer))
}

/** A trainer on `weights` in a new scope of its own, forked from the run's. */
const open = Effect.fnUntraced(function*(
  setup: Setup,
  weights: Start,
  loss: Loss.Config,
  schedule: LrSchedule.Config
) {
  const scope = yield* Scope.fork(setup.runScope)
  const trainer = yield* build(setup, weights, loss, schedule).pipe(
    // The trainer's own scope inside `fsContext`, which carries the run's: provided outside, the run's scope won and
    // every replaced trainer kept its sessions and worker threads until the run ended (measured: the warm-up's two
    // workers and their sessions, 300–500 MB, held through RL).
    Effect.provideService(Scope.Scope, scope),
    Effect.mapError(learnerError),
    Effect.provide(setup.fsContext)
  )
  return { scope, trainer }
})

/** Closes the trainer in use, then puts one on `weights` in its place. */
const replace = Effect.fnUntraced(function*(
  slot: Slot,
  weights: Start,
  loss: Loss.Config,
  schedule: LrSchedule.Config
) {
  yield* Scope.close(slot.scope, Exit.void)
  // A large model's closed trainer (its weights, moments and accumulator) is collected before the new one's first
  // step: left to V8, the 0.5 B warm-up's first step ran with it still resident (BENCHMARKS.md, "0.5 B end to end").
  if (large(slot)) collectGarbage()
  const { scope, trainer } = yield* open(slot.setup, weights, loss, schedule)
  slot.scope = scope
  slot.trainer = trainer
})

/** Whether the slot's weights are worth a collection when it lets a copy go (as `OnnxTrainer.releaseOutputs`). */
const large = (slot: Slot): boolean =>
  4 * slot.setup.model.parameters.reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0) >= worthCollecting

/** The warm-up starts: the SFT trainer (NLL loss, the warm-up's learning rate) on the current weights. */
export const startSft = Effect.fnUntraced(function*(slot: Slot) {
  const warmup = slot.setup.config.warmup!
  const schedule = warmup.lrSchedule === "cosine"
    ? LrSchedule.cosine(warmup.lr, { warmupSteps: warmup.warmupSteps, totalSteps: warmup.steps, minLr: warmup.minLr })
    : LrSchedule.constant(warmup.lr, warmup.warmupSteps)
  // A Tinker warm-up starts a new model on the engine: the base model, as the folder's weights are here.
  const start = slot.setup.tinker !== undefined ? slot.setup.folder.weights : yield* weights(slot)
  yield* replace(slot, start, Loss.sft, schedule)
  slot.phase = "sft"
})

/** The warm-up ends (if it ran): the RL trainer starts from the SFT weights with a fresh optimiser. */
export const endWarmup = Effect.fnUntraced(function*(slot: Slot) {
  if (slot.phase !== "sft") return
  // On a Tinker engine the weights stay there: RL starts from the warm-up's saved state.
  const tinker = slot.setup.tinker
  const from = tinker !== undefined ? yield* TinkerLearner.saveState(tinker, "warmup") : yield* weights(slot)
  yield* replace(slot, from, slot.setup.rlLoss, slot.setup.rlSchedule)
  slot.phase = "rl"
})

/**
 * `effect` changes the trainer's weights (a step, a checkpoint load): the weights and summary taken before it, or
 * while it ran, are dropped when it ends, however it ends.
 */
export const mutating = <A, E, R>(slot: Slot, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> => {
  const drop = Effect.sync(() => {
    const held = slot.weights !== undefined
    slot.weights = undefined
    slot.summary = undefined
    return held
  })
  // A large copy let go before the step is collected before the step's activations come (unless a published version
  // still holds it).
  const before = Effect.tap(drop, (held) => Effect.sync(() => held && large(slot) && collectGarbage()))
  return Effect.andThen(before, effect).pipe(Effect.ensuring(drop))
}

/** A copy of the trainer's current weights, taken once per change; a remote trainer that cannot send them fails. */
export const weights = (slot: Slot): Effect.Effect<GradientBackend.Weights, RunError> =>
  Effect.suspend(() =>
    slot.weights !== undefined ? Effect.succeed(slot.weights) : slot.trainer.weights.pipe(
      Effect.mapError(learnerError),
      Effect.tap((w) => Effect.sync(() => (slot.weights = w)))
    )
  )

/**
 * The weights' fingerprint and first non-finite value, computed once per change. A remote trainer summarises its
 * weights where they are.
 */
export const summary = (slot: Slot): Effect.Effect<RemoteTrainer.Summary, RunError> =>
  Effect.suspend(() => {
    if (slot.summary !== undefined) return Effect.succeed(slot.summary)
    const current = slot.setup.remote?.current
    const tinker = slot.setup.tinker?.current
    // A Tinker engine keeps the weights: the fingerprint names the training lineage and step (all finite as far as
    // this side can tell; a non-finite loss fails the step).
    const computed = tinker !== undefined
      ? Effect.map(tinker.fingerprint, (fingerprint) => ({ fingerprint, nonFinite: undefined }))
      : current !== undefined
      ? Effect.mapError(current.summary, learnerError)
      : Effect.map(weights(slot), (all) => {
        // A LoRA learner's weights hold the frozen base too: what it trains, saves and journals is the adapter.
        const w = Lora.hasAdapter(all) ? Lora.adapterOf(all) : all
        return { fingerprint: Checkpoint.fingerprint(w), nonFinite: Checkpoint.firstNonFinite(w) }
      })
    return Effect.tap(computed, (s) => Effect.sync(() => (slot.summary = s)))
  })

/**
 * A step that left a weight NaN or infinite (a learning rate too large, an overflow) stops the run before the
 * weights are published, journaled or saved.
 */
export const finite = (slot: Slot, after: string): Effect.Effect<void, RunError> =>
  Effect.flatMap(summary(slot), ({ nonFinite: bad }) =>
    bad === undefined
      ? Effect.void
      : Effect.fail(nonFinite(`${after} made the weights non-finite (${bad}); nothing was published or saved`))
  )
