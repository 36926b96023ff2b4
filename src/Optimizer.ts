/**
 * AdamW (Loshchilov & Hutter, arXiv:1711.05101) with bias correction, and global gradient-norm clipping, over
 * named `Float32Array` parameters.
 *
 * The update runs in float64 per element and stores float32, in a fixed order, so it is deterministic: the same
 * parameters, gradients and state give bit-identical results (needed for exact resume). The inner loop runs as a
 * WebAssembly SIMD kernel (`internal/adamKernel.ts`), bit-identical to the scalar loop it replaces; the loop lives in
 * `internal/adamStep.ts`, which the learner's worker threads load without Effect. Parameters and state are updated
 * **in place**: the learner owns them and copies a snapshot when it publishes weights.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as AdamStep from "./internal/adamStep.ts"

// ===== Models =====

/**
 * AdamW hyper-parameters. `weightDecay` is decoupled (`p ← p − lr·λ·p`) and skipped for parameters that
 * `noDecay` matches (by default norms and biases).
 *
 * @category models
 * @since 0.1.0
 */
export const Config = Schema.Struct({
  beta1: Schema.Number,
  beta2: Schema.Number,
  eps: Schema.Number,
  weightDecay: Schema.Number,
  /** Global L2 gradient-norm clip; absent = no clipping. */
  maxGradNorm: Schema.optionalKey(Schema.Number)
})
export type Config = typeof Config.Type

/**
 * The demo's settings (`reference/demo-feasibility.md`): β = (0.9, 0.98), ε = 1e-8, no decay, clip 1.
 *
 * @category constructors
 * @since 0.1.0
 */
export const defaultConfig: Config = { beta1: 0.9, beta2: 0.98, eps: 1e-8, weightDecay: 0, maxGradNorm: 1 }

/**
 * Optimiser state: the step count (number of updates applied) and first/second moments per parameter.
 *
 * @category models
 * @since 0.1.0
 */
export type State = AdamStep.State

/**
 * Norms and biases are not decayed.
 *
 * @category constructors
 * @since 0.1.0
 */
export const defaultNoDecay: (name: string) => boolean = AdamStep.defaultNoDecay

// ===== Constructors =====

/**
 * Zero state for the given parameters.
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeState = (params: ReadonlyMap<string, Float32Array>): State => {
  const m = new Map<string, Float32Array>()
  const v = new Map<string, Float32Array>()
  for (const [name, p] of params) {
    m.set(name, new Float32Array(p.length))
    v.set(name, new Float32Array(p.length))
  }
  return { step: 0, m, v }
}

// ===== Maths =====

/**
 * Global L2 norm of all gradients, accumulated in float64 in the map's order.
 *
 * @category combinators
 * @since 0.1.0
 */
export const globalNorm = (grads: ReadonlyMap<string, Float32Array>): number => {
  let sq = 0
  for (const g of grads.values()) for (let i = 0; i < g.length; i++) sq += g[i]! * g[i]!
  return Math.sqrt(sq)
}

/**
 * The factor that scales gradients of norm `norm` down to at most `maxNorm` (1 when already within; 0 when the norm
 * is not finite, so that a NaN step cannot destroy the weights).
 *
 * @category combinators
 * @since 0.1.0
 */
export const clipScale = (norm: number, maxNorm: number | undefined): number => {
  if (!Number.isFinite(norm)) return 0
  if (maxNorm === undefined || norm <= maxNorm) return 1
  return maxNorm / (norm + 1e-6)
}

/**
 * One AdamW update of every parameter in place, with gradients multiplied by `gradScale` first (the clip factor).
 * Returns the new step count.
 *
 * @category combinators
 * @since 0.1.0
 */
export const step: (
  params: ReadonlyMap<string, Float32Array>,
  grads: ReadonlyMap<string, Float32Array>,
  state: State,
  lr: number,
  config: Config,
  gradScale?: number,
  noDecay?: (name: string) => boolean
) => number = AdamStep.step
