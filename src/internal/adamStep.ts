/**
 * AdamW's update loop (`Optimizer.step`), apart from `Optimizer.ts` so that the learner's worker threads load it
 * without Effect: `Optimizer.Config` is a Schema, and the `effect` package entry costs each worker ≈ 6 MB of RSS.
 */
import * as AdamKernel from "./adamKernel.ts"

/** The hyper-parameters the update reads (a structural subset of `Optimizer.Config`). */
export interface Hyper {
  readonly beta1: number
  readonly beta2: number
  readonly eps: number
  readonly weightDecay: number
}

/** Optimiser state (`Optimizer.State`): the step count and first/second moments per parameter. */
export interface State {
  step: number
  readonly m: Map<string, Float32Array>
  readonly v: Map<string, Float32Array>
}

/** Norms and biases are not decayed. */
export const defaultNoDecay = (name: string): boolean => /norm|bias/.test(name)

/** One AdamW update of every parameter in place (`Optimizer.step`); returns the new step count. */
export const step = (
  params: ReadonlyMap<string, Float32Array>,
  grads: ReadonlyMap<string, Float32Array>,
  state: State,
  lr: number,
  config: Hyper,
  gradScale: number = 1,
  noDecay: (name: string) => boolean = defaultNoDecay
): number => {
  const t = state.step + 1
  const { beta1, beta2, eps } = config
  const c1 = 1 - beta1 ** t
  const c2 = 1 - beta2 ** t
  for (const [name, p] of params) {
    const g = grads.get(name)
    if (g === undefined) continue
    const m = state.m.get(name)!
    const v = state.v.get(name)!
    const decay = noDecay(name) ? 0 : lr * config.weightDecay
    if (kernel === undefined) updateTensor(p, g, m, v, gradScale, beta1, beta2, lr / c1, 1 / Math.sqrt(c2), eps, decay)
    else {
      kernel(p, g, m, v, {
        scale: gradScale,
        beta1,
        beta2,
        stepSize: lr / c1,
        invSqrtC2: 1 / Math.sqrt(c2),
        eps,
        keep: 1 - decay
      })
    }
  }
  state.step = t
  return t
}

/** The WebAssembly SIMD inner loop (bit-identical to {@link updateTensor}, ≈ 2× faster), one per thread. */
const kernel = AdamKernel.make()

/** The inner loop, kept monomorphic for speed; used where WebAssembly SIMD is unavailable. */
const updateTensor = (
  p: Float32Array,
  g: Float32Array,
  m: Float32Array,
  v: Float32Array,
  scale: number,
  beta1: number,
  beta2: number,
  stepSize: number,
  invSqrtC2: number,
  eps: number,
  decay: number
): void => {
  const b1c = 1 - beta1
  const b2c = 1 - beta2
  for (let i = 0; i < p.length; i++) {
    const gi = g[i]! * scale
    const mi = beta1 * m[i]! + b1c * gi
    const vi = beta2 * v[i]! + b2c * gi * gi
    m[i] = mi
    v[i] = vi
    const pi = p[i]! * (1 - decay)
    p[i] = pi - (stepSize * mi) / (Math.sqrt(vi) * invSqrtC2 + eps)
  }
}
