/**
 * The optimiser's native addon (`native/optim.c`, built at install by `native/build.mjs`): AdamW, gradient
 * accumulation and the norm's sum of squares in place, on several threads, bit-identical to the loops of
 * `adamStep.ts` and `Optimizer.globalNorm`. Optional: {@link addon} is undefined where it was not built (no C
 * compiler, Windows, `AGENTFLY_NATIVE=0`) and the callers keep the WebAssembly kernel and the loops.
 *
 * At Qwen2.5-0.5B's 494 M parameters on a 2-core machine the WebAssembly kernel's AdamW took 6–7 s a step (every
 * chunk copied in and out of its memory, one thread) and the norm's loop 2.3 s; in place on both cores they take
 * about 1.5 and 0.5 s (BENCHMARKS.md, "the optimiser in place").
 */
import { existsSync } from "node:fs"
import { createRequire } from "node:module"
import { availableParallelism } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { isMainThread } from "node:worker_threads"

/** The addon's functions (`native/optim.c`). */
export interface Addon {
  /**
   * AdamW in place: float32 moments, or bfloat16 bits (`Uint16Array`s, then `hashAt` keys the stochastic rounding
   * as `AdamKernel.Kernel16`'s does). `coefficients`: scale, β1, 1 − β1, β2, 1 − β2, step size, 1/√c2, eps, keep.
   */
  readonly adam: (
    p: Float32Array,
    g: Float32Array,
    m: Float32Array | Uint16Array,
    v: Float32Array | Uint16Array,
    coefficients: Float64Array,
    threads: number,
    hashAt?: number
  ) => void
  /** `acc += g`, element by element. */
  readonly addInto: (acc: Float32Array, g: Float32Array, threads: number) => void
  /** `sum + Σ g[i]²`, one float64 sum in index order. */
  readonly sumSquares: (g: Float32Array, sum: number) => number
}

/** `native/build/optim.node` from here: the source tree (`src/internal`) or the package's `dist/src/internal`. */
const locate = (): string | undefined => {
  const here = dirname(fileURLToPath(import.meta.url))
  return [join(here, "..", ".."), join(here, "..", "..", "..")]
    .map((root) => join(root, "native", "build", "optim.node"))
    .find((file) => existsSync(file))
}

const load = (): Addon | undefined => {
  if (process.env["AGENTFLY_NATIVE"] === "0") return undefined
  const file = locate()
  if (file === undefined) return undefined
  try {
    return createRequire(import.meta.url)(file) as Addon
  } catch {
    // Built for another Node ABI or platform (a copied node_modules): the WebAssembly kernel runs instead.
    return undefined
  }
}

/** The addon, or undefined where it is not built or `AGENTFLY_NATIVE=0`. */
export const addon: Addon | undefined = load()

/**
 * Threads for one pass: every core on the main thread (the single-thread learner's optimStep has the machine to
 * itself: its session is idle), one in a learner worker (`trainerWorker.ts`: the workers already split the
 * parameters between them).
 */
export const threads: number = isMainThread ? Math.min(availableParallelism(), 8) : 1

/** `acc += g`, element by element: the addon's, or the same loop here. */
export const addInto = (acc: Float32Array, g: Float32Array): void => {
  if (addon !== undefined) return addon.addInto(acc, g, threads)
  for (let i = 0; i < acc.length; i++) acc[i]! += g[i]!
}
