/**
 * The native kernels (`native/kernels.c`, built at install by `native/build.mjs`): the passes over every parameter,
 * in place and on several threads, bit-identical to the loops they replace. The optimiser's: AdamW (`adamStep.ts`),
 * gradient accumulation, the norm's sum of squares (`Optimizer.globalNorm`); loading's: BF16 widened to float32
 * (`floatCodec.ts`), the first non-finite weight (`finite.ts`). Optional: {@link addon} is undefined where it was not
 * built (no C compiler, Windows, `AGENTFLY_NATIVE=0`) and the callers keep the WebAssembly kernel and the loops.
 *
 * At Qwen2.5-0.5B's 494 M parameters on a 2-core machine the WebAssembly kernel's AdamW took 6–7 s a step (every
 * chunk copied in and out of its memory, one thread), the norm's loop 2.3 s, and reading the folder spent 2.2 s
 * widening and 2.3 s checking for NaN (BENCHMARKS.md, "The passes over every parameter in native code").
 */
import { existsSync } from "node:fs"
import { createRequire } from "node:module"
import { availableParallelism } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { isMainThread } from "node:worker_threads"

/** The addon's functions (`native/kernels.c`). */
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
  /** BF16 bits `src` as float32s into `dst` from `dstOffset`. */
  readonly widenBf16: (src: Uint16Array, dst: Float32Array, dstOffset: number, threads: number) => void
  /** The index of the first NaN or ±Infinity of `data`, or −1. */
  readonly firstNonFinite: (data: Float32Array, threads: number) => number
}

/** `native/build/kernels.node` from here: the source tree (`src/internal`) or the package's `dist/src/internal`. */
const locate = (): string | undefined => {
  const here = dirname(fileURLToPath(import.meta.url))
  return [join(here, "..", ".."), join(here, "..", "..", "..")]
    .map((root) => join(root, "native", "build", "kernels.node"))
    .find((file) => existsSync(file))
}

const load = (): Addon | undefined => {
  if (process.env["AGENTFLY_NATIVE"] === "0") return undefined
  const file = locate()
  if (file === undefined) return undefined
  try {
    return createRequire(import.meta.url)(file) as Addon
  } catch {
    // Built for another Node ABI or platform (a copied node_modules): the loops and the WebAssembly kernel run.
    return undefined
  }
}

/** The addon, or undefined where it is not built or `AGENTFLY_NATIVE=0`. */
export const addon: Addon | undefined = load()

/**
 * Threads for one pass: every core on the main thread (the single-thread learner's optimStep has the machine to
 * itself: its session is idle; loading runs before anything else), one in a worker thread (`trainerWorker.ts`: the
 * learner's workers already split the parameters between them).
 */
export const threads: number = isMainThread ? Math.min(availableParallelism(), 8) : 1

/** `acc += g`, element by element: the addon's, or the same loop here. */
export const addInto = (acc: Float32Array, g: Float32Array): void => {
  if (addon !== undefined) return addon.addInto(acc, g, threads)
  for (let i = 0; i < acc.length; i++) acc[i]! += g[i]!
}
