/**
 * A run's schedule, as pure functions of its config: which dataset rows each step's batch holds (a seeded shuffle
 * per epoch), which policy version samples it, when the warm-up checks its validation accuracy, and how checkpoints
 * are named. Everything here depends on the run seed and the step alone, so a resumed run repeats the unbroken one.
 *
 * @since 0.1.0
 */
import * as Sampling from "./Sampling.ts"

/**
 * The run's seeded generator (`Sampling.mulberry32`): its only source of randomness besides the sampler's
 * per-request seeds.
 *
 * @category constructors
 * @since 0.1.0
 */
export const rng = Sampling.mulberry32

/**
 * The row order of epoch `epoch`: a Fisher–Yates shuffle of `0 … n-1` seeded by the run seed and the epoch.
 *
 * @category getters
 * @since 0.1.0
 */
export const epochOrder = (n: number, seed: number, epoch: number): Int32Array => {
  const order = Int32Array.from({ length: n }, (_, i) => i)
  const next = rng((seed * 0x9e3779b1 + epoch * 0x85ebca6b) >>> 0)
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1))
    const t = order[i]!
    order[i] = order[j]!
    order[j] = t
  }
  return order
}

/**
 * The dataset rows at run positions `[from, from + count)`, wrapping over epochs.
 *
 * @category getters
 * @since 0.1.0
 */
export const rowsAt = (n: number, seed: number, from: number, count: number): Array<number> => {
  const out: Array<number> = []
  let epoch = -1
  let order: Int32Array = new Int32Array(0)
  for (let seq = from; seq < from + count; seq++) {
    if (Math.floor(seq / n) !== epoch) {
      epoch = Math.floor(seq / n)
      order = epochOrder(n, seed, epoch)
    }
    out.push(order[seq % n]!)
  }
  return out
}

/**
 * The policy version of the weights after warm-up step `step` of `steps`, published only for a warm-up check:
 * negative (from `-steps` to `-1`), so versions keep increasing up to 0, the warm-up's result.
 *
 * @category getters
 * @since 0.1.0
 */
export const warmupVersion = (step: number, steps: number): number => step - steps - 1

/**
 * The policy version that samples the batch of learner step `step`: the one before it (`step - 1`) in sync mode
 * (`ahead = 0`), `ahead` versions older in async mode (`ahead = maxStaleness`), but never older than the last
 * checkpoint step before `step` (a multiple of `checkpointEvery`) nor than `from` (the step a run resumed from):
 * the versions a resumed run can rebuild. A function of the config alone, so that a resumed run samples every
 * replayed batch with the weights the unbroken run used.
 *
 * @category getters
 * @since 0.1.0
 */
export const samplingVersion = (
  step: number,
  options: { readonly ahead: number; readonly checkpointEvery: number; readonly from: number }
): number =>
  Math.max(
    options.from,
    step - 1 - options.ahead,
    Math.floor((step - 1) / options.checkpointEvery) * options.checkpointEvery
  )

/**
 * Whether warm-up step `step` of `steps` checks the validation accuracy: every `every` steps from `from` (default
 * `every`), never at the last step (the warm-up ends there anyway).
 *
 * @category getters
 * @since 0.1.0
 */
export const isCheckStep = (
  step: number,
  steps: number,
  stopAt: { readonly every: number; readonly from?: number | undefined }
): boolean => {
  const from = stopAt.from ?? stopAt.every
  return step >= from && (step - from) % stopAt.every === 0 && step < steps
}


/**
 * Where the seqs of dynamic sampling's further batches start: past any seq of the run's row order (steps ×
 * `groupsPerStep` ≤ 10⁷ × 4,096 < 2³⁶), and small enough that seeds derived from them stay exact integers.
 *
 * @category constants
 * @since 0.1.0
 */
export const extraSeqs = 2 ** 36


/**
 * The run positions of step `step`'s batch: the rows at `[(step − 1) · groupsPerStep, step · groupsPerStep)` of the
 * run's row order; `firstSeq` is the first position.
 *
 * @category getters
 * @since 0.1.0
 */
export const batchRows = (
  step: number,
  options: { readonly rows: number; readonly seed: number; readonly groupsPerStep: number }
): { readonly firstSeq: number; readonly rows: Array<number> } => {
  const firstSeq = (step - 1) * options.groupsPerStep
  return { firstSeq, rows: rowsAt(options.rows, options.seed, firstSeq, options.groupsPerStep) }
}

/**
 * Dynamic sampling's further batch `batch` (1, 2, …) of step `step`: rows of a second order (seeded apart from the
 * run's) at positions fixed by the step alone, with seqs of their own past {@link extraSeqs}, so that batches
 * sampled at once stay independent and a resumed run samples each step's batches as the unbroken run did.
 *
 * @category getters
 * @since 0.1.0
 */
export const extraBatchRows = (
  step: number,
  batch: number,
  options: { readonly rows: number; readonly seed: number; readonly groupsPerStep: number; readonly maxBatches: number }
): { readonly firstSeq: number; readonly rows: Array<number> } => {
  const position = ((step - 1) * (options.maxBatches - 1) + batch - 1) * options.groupsPerStep
  return {
    firstSeq: extraSeqs + position,
    rows: rowsAt(options.rows, options.seed ^ 0x5eed_d5, position, options.groupsPerStep)
  }
}

/**
 * The rows of warm-up step `step`: `batchSize` demonstrations of their own seeded order.
 *
 * @category getters
 * @since 0.1.0
 */
export const warmupRows = (
  step: number,
  options: { readonly rows: number; readonly seed: number; readonly batchSize: number }
): Array<number> =>
  rowsAt(options.rows, options.seed ^ 0x51f7, (step - 1) * options.batchSize, options.batchSize)

/**
 * A checkpoint's directory name: `step-000012`.
 *
 * @category getters
 * @since 0.1.0
 */
export const checkpointName = (step: number): string => `step-${String(step).padStart(6, "0")}`

/**
 * Whether a periodic event (an evaluation, a checkpoint) is due after step `step`: every `every` steps, and at the
 * run's last step.
 *
 * @category getters
 * @since 0.1.0
 */
export const isDue = (step: number, every: number, lastStep: number): boolean => step % every === 0 || step === lastStep
