import { assert, describe, it } from "@effect/vitest"
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import * as OnnxTrainer from "../../../src/backends/OnnxTrainer.ts"
import * as Loss from "../../../src/Loss.ts"
import * as LrSchedule from "../../../src/LrSchedule.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import * as Optimizer from "../../../src/Optimizer.ts"
import * as Packing from "../../../src/Packing.ts"
import * as Sampling from "../../../src/Sampling.ts"
import { tinyConfig } from "../../utils/tinyModel.ts"

const config = tinyConfig({ vocabSize: 32, hiddenSize: 32, numHiddenLayers: 2, intermediateSize: 64 })

/**
 * GRPO-shaped data: `groups` prompts of 20–30 tokens, each continued by `members` chains of 7–16 tokens (a sampled
 * turn, a tool output, a sampled turn; signed advantages, sampler logprobs), plus one sequence whose prompt is its
 * own.
 */
const dataset = (seed: number, groups = 3, members = 4): Array<Packing.Sequence> => {
  const r = Sampling.rng(seed)
  const token = () => Math.floor(r.next() * config.vocabSize)
  const length = (lo: number, hi: number) => lo + Math.floor(r.next() * (hi - lo + 1))
  const out: Array<Packing.Sequence> = []
  const sequence = (prompt: ReadonlyArray<number>, advantage: number): Packing.Sequence => {
    const ids = [...prompt], loss = prompt.map(() => 0)
    for (const [lo, hi, l] of [[3, 7, 1], [2, 4, 0], [2, 5, 1]] as const) {
      for (let n = length(lo, hi); n > 0; n--) {
        ids.push(token())
        loss.push(l)
      }
    }
    return {
      tokenIds: Int32Array.from(ids),
      lossMask: Uint8Array.from(loss),
      samplerLogprobs: Float32Array.from(ids, () => -3.5 + r.next()),
      advantages: Float32Array.from(ids, () => advantage)
    }
  }
  for (let g = 0; g < groups; g++) {
    const prompt = Array.from({ length: length(20, 30) }, token)
    for (let m = 0; m < members; m++) out.push(sequence(prompt, m % 2 === 0 ? 1 - 0.1 * g : -0.7))
  }
  out.splice(5, 0, sequence(Array.from({ length: 14 }, token), 0.5))
  return out
}

const options = (loss: Loss.Config): OnnxTrainer.Options => ({
  model: OnnxTrainer.qwen2(config),
  weights: Qwen2.initWeights(config, 3),
  loss,
  optimizer: Optimizer.defaultConfig,
  schedule: LrSchedule.constant(1e-3)
})

/** max |a − b| over every tensor, and max |b|. */
const maxDiff = (a: ReadonlyMap<string, Float32Array>, b: ReadonlyMap<string, Float32Array>) => {
  let diff = 0
  let scale = 0
  for (const [name, x] of a) {
    const y = b.get(name)!
    for (let i = 0; i < x.length; i++) {
      diff = Math.max(diff, Math.abs(x[i]! - y[i]!))
      scale = Math.max(scale, Math.abs(y[i]!))
    }
  }
  return { diff, scale }
}

const cellsOf = (p: Packing.Packed) => p.microBatches.reduce((n, mb) => n + mb.batch * mb.length, 0)

describe("Packing with sharePrefix", () => {
  it.effect("lays a group's prompt once and each chain's rest after it, with continued positions", () =>
    Effect.gen(function*() {
      const data = dataset(1, 1, 3)
      const packed = yield* Packing.pack(data.slice(0, 3), {
        tokenBudget: 1024,
        aggregation: "seq-mean-token-mean",
        sharePrefix: { rowLength: 4 }
      })
      assert.strictEqual(packed.microBatches.length, 1)
      const mb = packed.microBatches[0]!
      assert.strictEqual(mb.batch, 1, "the three chains share one row")
      const firstLoss = data[0]!.lossMask.indexOf(1)
      const shared = firstLoss - 1
      const positions = mb.positionIds!
      // the common part: segment 1, positions 0…shared − 1, no loss
      for (let t = 0; t < shared; t++) {
        assert.strictEqual(mb.attentionMask[t], 1)
        assert.strictEqual(positions[t], t)
        assert.strictEqual(mb.inputIds[t], data[0]!.tokenIds[t])
        assert.strictEqual(mb.mask[t], 0)
      }
      // then each chain from token `shared` on, in segments 2, 3, 4, trained on its own next tokens
      let o = shared
      data.slice(0, 3).forEach((s, k) => {
        for (let t = shared; t < s.tokenIds.length; t++, o++) {
          assert.strictEqual(mb.attentionMask[o], k + 2)
          assert.strictEqual(positions[o], t)
          assert.strictEqual(mb.inputIds[o], s.tokenIds[t])
          assert.strictEqual(mb.mask[o], t + 1 < s.tokenIds.length ? s.lossMask[t + 1] : 0)
          if (mb.mask[o] === 1) {
            assert.strictEqual(mb.targets[o], s.tokenIds[t + 1])
            assert.strictEqual(mb.advantages[o], s.advantages![t + 1])
            // seq-mean-token-mean: each chain is a sequence of its own
            const tokens = s.lossMask.slice(1).reduce((a, v) => a + v, 0)
            assert.approximately(mb.weights[o]!, 1 / (tokens * 3), 1e-7)
          }
        }
      })
      for (; o < mb.length; o++) assert.strictEqual(mb.attentionMask[o], 0, "padding after the last chain")
      assert.strictEqual(mb.lossTokens, packed.totals.tokens)
    }))

  it.effect("keeps apart sequences with other prompts, short prompts and rows over the row length", () =>
    Effect.gen(function*() {
      const data = dataset(2)
      const shared = yield* Packing.pack(data, { tokenBudget: 4096, aggregation: "token-mean", sharePrefix: {} })
      const plain = yield* Packing.pack(data, { tokenBudget: 4096, aggregation: "token-mean" })
      const rows = shared.microBatches.flatMap((mb) =>
        Array.from({ length: mb.batch }, (_, b) => [...mb.attentionMask.subarray(b * mb.length, (b + 1) * mb.length)])
      ).filter((row) => row[0] !== 0)
      // the lone sequence keeps a row of segment 1; the 12 chains share rows, each at most 1.5× its longest chain
      assert.strictEqual(rows.filter((row) => !row.includes(2)).length, 1)
      assert.strictEqual(rows.reduce((n, row) => n + new Set(row.filter((x) => x > 1)).size, 0), 12)
      assert.isTrue(rows.every((row) => row.filter((x) => x > 0).length <= 1.5 * 46))
      assert.isAtLeast(rows.length, 5)
      assert.isBelow(cellsOf(shared), cellsOf(plain))
      assert.strictEqual(shared.totals.tokens, plain.totals.tokens)
      // a chain with more tokens of its own than the common ones keeps a row of its own
      const long = data.slice(0, 3)
      const tail = Int32Array.from({ length: 40 }, (_, i) => i % 30)
      long[2] = {
        tokenIds: Int32Array.from([...long[2]!.tokenIds, ...tail]),
        lossMask: Uint8Array.from([...long[2]!.lossMask, ...tail].map((_, i) => (i < long[2]!.lossMask.length ? long[2]!.lossMask[i]! : 1)))
      }
      const apart = yield* Packing.pack(long.map((s) => ({ tokenIds: s.tokenIds, lossMask: s.lossMask })), {
        tokenBudget: 4096,
        aggregation: "token-mean",
        sharePrefix: { rowLength: 4 }
      })
      assert.deepStrictEqual(apart.microBatches.map((mb) => mb.batch), [2])
      assert.strictEqual(apart.microBatches[0]!.sequenceIndex[0], 2, "the long chain, alone in the longer row")
      // a prompt of fewer than 8 tokens is copied, not shared
      const pair = dataset(3, 1, 2).slice(0, 2)
      const cut = pair[0]!.lossMask.indexOf(1) - 6 // 5 common tokens before the first loss token but one
      const short = pair.map((s) => ({ ...s, tokenIds: s.tokenIds.slice(cut), lossMask: s.lossMask.slice(cut) }))
      assert.isTrue(short.every((s) => s.lossMask.indexOf(1) - 1 < 8))
      const unshared = yield* Packing.pack(short.map((s) => ({ tokenIds: s.tokenIds, lossMask: s.lossMask })), {
        tokenBudget: 4096,
        aggregation: "token-mean",
        sharePrefix: { rowLength: 4 }
      })
      assert.strictEqual(unshared.microBatches[0]!.batch, 2)
    }))

  for (const [name, loss] of [["token-mean", Loss.grpo], ["seq-mean-token-mean", { ...Loss.grpo, aggregation: "seq-mean-token-mean" as const }]] as const) {
    it.effect(`gives a row each's loss, statistics, logprobs and gradients (${name})`, () =>
      Effect.gen(function*() {
        const data = dataset(4)
        const pack = (sharePrefix?: { readonly rowLength: number }) =>
          Packing.pack(data, { tokenBudget: 256, lengthMultiple: 16, aggregation: loss.aggregation, sharePrefix })
        const plain = yield* pack()
        const shared = yield* pack({ rowLength: 3 })
        assert.isBelow(cellsOf(shared), cellsOf(plain) * 0.8, "the prompts are computed once")
        const run = (packed: Packing.Packed) =>
          Effect.gen(function*() {
            const trainer = yield* OnnxTrainer.make(options(loss))
            const sums = { loss: 0, tokens: 0, clipped: 0, approxKl: 0, entropy: 0 }
            // each trained token's logprob, keyed by (sequence, position)
            const logprobs = new Map<string, number>()
            for (const mb of packed.microBatches) {
              const r = yield* trainer.trainer.forwardBackward(mb)
              for (const key of Object.keys(sums) as Array<keyof typeof sums>) sums[key] += r[key]
              for (let b = 0; b < mb.batch; b++) {
                let sequence = mb.sequenceIndex[b]!
                let segment = 1
                for (let t = 0; t < mb.length; t++) {
                  const i = b * mb.length + t
                  if (mb.attentionMask[i]! > 1 && mb.attentionMask[i] !== segment) {
                    // the next chain of a shared row: the one whose tokens these are
                    segment = mb.attentionMask[i]!
                    sequence = data.findIndex((s) =>
                      s.tokenIds.length > mb.positionIds![i]! &&
                      s.tokenIds.subarray(mb.positionIds![i]!).every((x, j) => mb.inputIds[i + j] === x)
                    )
                  }
                  const position = mb.positionIds?.[i] ?? t
                  if (mb.mask[i] === 1) logprobs.set(`${sequence}:${position + 1}`, r.tokenLogprobs[i]!)
                }
              }
            }
            return { sums, logprobs, gradients: yield* trainer.gradients }
          })
        const a = yield* run(plain)
        const b = yield* run(shared)
        for (const key of Object.keys(a.sums) as Array<keyof typeof a.sums>) {
          assert.approximately(b.sums[key], a.sums[key], 1e-5 * Math.max(1, Math.abs(a.sums[key])), key)
        }
        assert.isAbove(a.sums.tokens, 0)
        assert.strictEqual(b.logprobs.size, a.logprobs.size)
        for (const [key, x] of a.logprobs) assert.approximately(b.logprobs.get(key)!, x, 1e-5, key)
        const g = maxDiff(b.gradients, a.gradients)
        assert.isAbove(g.scale, 0)
        assert.isBelow(g.diff, 1e-5 * g.scale, `max |Δg| ${g.diff} of ${g.scale}`)
      }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
  }
})
