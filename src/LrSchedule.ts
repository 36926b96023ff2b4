/**
 * Learning-rate schedules: linear warm-up, then constant or cosine decay to a floor.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"

/**
 * A schedule. `step` counts optimiser updates from 0.
 * - warm-up: `lr·(step + 1)/warmupSteps` for `step < warmupSteps`;
 * - `constant`: `lr` afterwards;
 * - `cosine`: from `lr` down to `minLr` at `totalSteps`, then `minLr`.
 *
 * @category models
 * @since 0.1.0
 */
export const Config = Schema.Struct({
  kind: Schema.Literals(["constant", "cosine"]),
  lr: Schema.Number,
  warmupSteps: Schema.Int,
  /** Required for `cosine`. */
  totalSteps: Schema.optionalKey(Schema.Int),
  minLr: Schema.optionalKey(Schema.Number)
})
export type Config = typeof Config.Type

/**
 * A constant schedule with optional warm-up.
 *
 * @category constructors
 * @since 0.1.0
 */
export const constant = (lr: number, warmupSteps = 0): Config => ({ kind: "constant", lr, warmupSteps })

/**
 * Cosine decay after warm-up.
 *
 * @category constructors
 * @since 0.1.0
 */
export const cosine = (lr: number, options: { warmupSteps: number; totalSteps: number; minLr?: number }): Config => ({
  kind: "cosine",
  lr,
  warmupSteps: options.warmupSteps,
  totalSteps: options.totalSteps,
  minLr: options.minLr ?? 0
})

/**
 * The learning rate at `step`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const at = (config: Config, step: number): number => {
  if (step < config.warmupSteps) return (config.lr * (step + 1)) / config.warmupSteps
  if (config.kind === "constant") return config.lr
  const minLr = config.minLr ?? 0
  const total = config.totalSteps ?? config.warmupSteps
  const span = total - config.warmupSteps
  if (span <= 0 || step >= total) return minLr
  const progress = (step - config.warmupSteps) / span
  return minLr + 0.5 * (config.lr - minLr) * (1 + Math.cos(Math.PI * progress))
}

/**
 * A schedule written in learner steps for an optimiser that takes `updates` steps per learner step (RL's
 * `miniBatches × epochs`): the optimiser counts its own steps, so the warm-up and the cosine's length are scaled to
 * them. Without it a cosine over `algorithm.steps` reached its floor after `steps / updates` learner steps.
 *
 * @category combinators
 * @since 0.1.0
 */
export const inUpdates = (config: Config, updates: number): Config =>
  updates === 1 ? config : {
    ...config,
    warmupSteps: config.warmupSteps * updates,
    ...(config.totalSteps === undefined ? {} : { totalSteps: config.totalSteps * updates })
  }
