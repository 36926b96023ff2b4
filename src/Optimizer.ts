/**
 * AdamW (Loshchilov & Hutter, arXiv:1711.05101) with bias correction, and global gradient-norm clipping, over
 * named `Float32Array` parameters.
 *
 * The update runs in float64 per element and stores float32 (the moments optionally bfloat16: {@link Precision}), in
 * a fixed order, so it is deterministic: the same parameters, gradients and state give bit-identical results (needed
 * for exact resume). The inner loop runs as a
 * WebAssembly SIMD kernel (`internal/adamKernel.ts`), bit-identical to the scalar loop it replaces; the loop lives in
 * `internal/adamStep.ts`, which the learner's worker threads load without Effect. Parameters and state are updated
 * **in place**: the learner owns them and copies a snapshot when it publishes weights.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as AdamStep from "./internal/adamStep.ts"
import * as FloatCodec from "./internal/floatCodec.ts"
import * as NativeKernels from "./internal/nativeKernels.ts"

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
 * Optimiser state: the step count (number of updates applied) and first/second moments per parameter, all of one
 * {@link Precision}.
 *
 * @category models
 * @since 0.1.0
 */
export type State = AdamStep.State

/**
 * How AdamW's moments are stored. `float32` (the default): 8 bytes a parameter for the two. `bfloat16`: 4 bytes a
 * parameter, narrowed after each update with stochastic rounding keyed by (step, element), so a run stays
 * deterministic and its resume exact (`internal/adamStep.ts` says why round-to-nearest would not do).
 *
 * @category models
 * @since 0.1.0
 */
export type Precision = AdamStep.Precision

/**
 * One parameter's moment: float32 values, or bfloat16 bits (the upper half of a float32) in a `Uint16Array`.
 *
 * @category models
 * @since 0.1.0
 */
export type Moment = AdamStep.Moment

/**
 * A moment's storage precision.
 *
 * @category getters
 * @since 0.1.0
 */
export const precisionOf: (moment: Moment) => Precision = AdamStep.precisionOf

/**
 * Norms and biases are not decayed.
 *
 * @category constructors
 * @since 0.1.0
 */
export const defaultNoDecay: (name: string) => boolean = AdamStep.defaultNoDecay

// ===== Constructors =====

/**
 * Zero state for the given parameters, its moments in `precision` (default float32).
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeState = (params: ReadonlyMap<string, Float32Array>, precision: Precision = "float32"): State => {
  const m = new Map<string, Moment>()
  const v = new Map<string, Moment>()
  for (const [name, p] of params) {
    m.set(name, AdamStep.zeroMoment(p.length, precision))
    v.set(name, AdamStep.zeroMoment(p.length, precision))
  }
  return { step: 0, m, v }
}

/**
 * `moment` in `precision`: itself when it already is; widened exactly (bfloat16 → float32), or narrowed with
 * round-to-nearest-even (float32 → bfloat16: a run resumed with another `learner.optimizerState`).
 *
 * @category combinators
 * @since 0.1.0
 */
export const convertMoment = (moment: Moment, precision: Precision): Moment => {
  if (precisionOf(moment) === precision) return moment
  if (moment instanceof Uint16Array) {
    const out = new Float32Array(moment.length)
    const bits = new Uint32Array(out.buffer)
    for (let i = 0; i < moment.length; i++) bits[i] = moment[i]! << 16
    return out
  }
  const out = new Uint16Array(moment.length)
  FloatCodec.narrowBf16(moment, out)
  return out
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
  const native = NativeKernels.addon
  for (const g of grads.values()) {
    if (native !== undefined) sq = native.sumSquares(g, sq) // the same sum in the same order, ≈ 4× faster
    else for (let i = 0; i < g.length; i++) sq += g[i]! * g[i]!
  }
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
