/**
 * The calculator demo's recorded batch shape, for the benches that time one learner step each way (`trainer`,
 * `tinker`, `tinker-server`): the same sequences, so their figures compare.
 */
import type * as Packing from "../../src/Packing.ts"
import * as Sampling from "../../src/Sampling.ts"

/** The middle value (the upper one of an even count). */
export const median = (xs: ReadonlyArray<number>): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/** 8 groups of 8 chains: prompts of 79–88 tokens, chains' own tokens 93–153 (the demo's recorded shape). */
export const sequences = (): Array<Packing.Sequence> => {
  const r = Sampling.rng(1)
  const token = () => Math.floor(r.next() * 250)
  return Array.from({ length: 8 }, () => Array.from({ length: 79 + Math.floor(r.next() * 10) }, token)).flatMap((p) =>
    Array.from({ length: 8 }, (_, m) => {
      const ids = [...p, ...Array.from({ length: 93 + Math.floor(r.next() * 60) }, token)]
      return {
        tokenIds: Int32Array.from(ids),
        lossMask: Uint8Array.from(ids, (_, t) => (t >= p.length ? 1 : 0)),
        samplerLogprobs: Float32Array.from(ids, () => -1),
        advantages: Float32Array.from(ids, () => (m % 2 === 0 ? 1 : -1))
      }
    })
  )
}
