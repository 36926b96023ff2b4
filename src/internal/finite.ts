/**
 * Finding NaN and ±Infinity in weights as they are loaded. Such weights only ever sample garbage and train to more
 * of it, and nothing downstream notices before a checkpoint is saved; so a model folder's weights are checked once,
 * where they are read, in one pass over each tensor and without a copy (the native kernel's, on every core, where
 * built).
 */
import * as NativeKernels from "./nativeKernels.ts"

/** The first non-finite value of a set of named tensors: its tensor, index and value, and how many it holds. */
export interface NonFinite {
  readonly tensor: string
  readonly index: number
  readonly value: number
  /** Non-finite values in that tensor (the ones after it are not counted). */
  readonly count: number
}

/** Non-finite values of `data` from `start` on. */
const countFrom = (data: Float32Array, start: number): number => {
  let count = 0
  for (let i = start; i < data.length; i++) if (!Number.isFinite(data[i]!)) count++
  return count
}

/**
 * The first tensor, in iteration order, that holds a NaN or ±Infinity, with the first such index and the count in
 * that tensor; undefined when every value is finite.
 */
export const firstNonFinite = (tensors: Iterable<readonly [string, Float32Array]>): NonFinite | undefined => {
  const native = NativeKernels.addon
  for (const [tensor, data] of tensors) {
    if (native !== undefined) {
      const i = native.firstNonFinite(data, NativeKernels.threads)
      if (i >= 0) return { tensor, index: i, value: data[i]!, count: countFrom(data, i) }
      continue
    }
    for (let i = 0; i < data.length; i++) {
      if (!Number.isFinite(data[i]!)) return { tensor, index: i, value: data[i]!, count: countFrom(data, i) }
    }
  }
  return undefined
}

/** One line: `tensor "NAME" holds N non-finite value(s), the first NAME[i] = NaN`. */
export const describe = (bad: NonFinite): string =>
  `tensor "${bad.tensor}" holds ${bad.count} non-finite value${bad.count === 1 ? "" : "s"} ` +
  `(the first: ${bad.tensor}[${bad.index}] = ${bad.value}); weights with NaN or ±Infinity cannot sample or train`
