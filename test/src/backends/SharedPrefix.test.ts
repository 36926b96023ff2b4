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
import { maxDiff, tinyConfig } from "../../utils/tinyModel.ts"

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

const cellsOf = (p: Packing.Packed) =>
  p.microBatches.reduce((n, mb) => n + mb.batch * mb.length + (mb.prefix ? mb.prefix.batch * mb.prefix.length : 0), 0)

describe("Packing with sharePrefix", () => {
  it.effect("packs a group's prompt once and each chain's rest in a row of its own, positions continued", () =>
    Effect.gen(function*() {
      const data = dataset(1, 1, 3).slice(0, 3)
      const packed = yield* Packing.pack(data, {
        tokenBudget: 1024,
        aggregation: "seq-mean-token-mean",
        sharePrefix: true
      })
      assert.strictEqual(packed.microBatches.length, 1)
      const mb = packed.microBatches[0]!
      const shared = data[0]!.lossMask.indexOf(1) - 1
      const prefix = mb.prefix!
      assert.deepStrictEqual([prefix.batch, prefix.length], [1, 32])
      assert.deepStrictEqual([...prefix.inputIds.subarray(0, shared)], [...data[0]!.tokenIds.subarray(0, shared)])
      assert.deepStrictEqual([...prefix.attentionMask], [...Array(shared).fill(1), ...Array(32 - shared).fill(0)])
      assert.deepStrictEqual([...prefix.index], [0, 0, 0])
      assert.strictEqual(mb.batch, 3)
      // rows longest first
      assert.deepStrictEqual(
        [...mb.sequenceIndex],
        [0, 1, 2].sort((x, y) => data[y]!.tokenIds.length - data[x]!.tokenIds.length || x - y)
      )
      mb.sequenceIndex.forEach((index, b) => {
        const s = data[index]!
        for (let t = shared; t < s.tokenIds.length; t++) {
          const i = b * mb.length + t - shared
          assert.strictEqual(mb.inputIds[i], s.tokenIds[t])
          assert.strictEqual(mb.positionIds![i], t)
          assert.strictEqual(mb.attentionMask[i], 1)
          assert.strictEqual(mb.mask[i], t + 1 < s.tokenIds.length ? s.lossMask[t + 1] : 0)
          if (mb.mask[i] === 1) {
            assert.strictEqual(mb.targets[i], s.tokenIds[t + 1])
            assert.strictEqual(mb.advantages[i], s.advantages![t + 1])
            // seq-mean-token-mean: each chain is a sequence of its own
            const tokens = s.lossMask.slice(1).reduce((a, v) => a + v, 0)
            assert.approximately(mb.weights[i]!, 1 / (tokens * 3), 1e-7)
          }
        }
        const end = b * mb.length + s.tokenIds.length - shared
        assert.isTrue(mb.attentionMask.subarray(end, (b + 1) * mb.length).every((m) => m === 0), "padding")
      })
      assert.strictEqual(mb.lossTokens, packed.totals.tokens)
      // what the learner computes (learner/tokens_per_s): the prompt once, then each chain's own tokens
      assert.strictEqual(Packing.computedTokens(mb), shared + data.reduce((n, s) => n + s.tokenIds.length - shared, 0))
    }))

  it.effect("whole rows for sequences alone or with short prompts; groups split at the budget, prompt repeated", () =>
    Effect.gen(function*() {
      const data = dataset(2)
      const shared = yield* Packing.pack(data, { tokenBudget: 4096, aggregation: "token-mean", sharePrefix: true })
      const plain = yield* Packing.pack(data, { tokenBudget: 4096, aggregation: "token-mean" })
      // the lone sequence in a micro-batch of whole rows; the 3 groups' 12 chains with their 3 prompts
      const [whole, grouped] = shared.microBatches
      assert.strictEqual(shared.microBatches.length, 2)
      assert.deepStrictEqual([...whole!.sequenceIndex], [5])
      assert.isUndefined(whole!.prefix)
      assert.strictEqual(grouped!.batch, 12)
      assert.strictEqual(grouped!.prefix!.batch, 3)
      assert.isBelow(cellsOf(shared), cellsOf(plain))
      assert.strictEqual(shared.totals.tokens, plain.totals.tokens)
      // a small budget: each micro-batch within it, holding the prompt of every row it holds
      const budget = 32 + 2 * 16 // one prompt and two rests: a group of 4 cannot fit whole
      const small = yield* Packing.pack(data, {
        tokenBudget: budget,
        lengthMultiple: 16,
        aggregation: "token-mean",
        sharePrefix: true
      })
      const groupedBatches = small.microBatches.filter((mb) => mb.prefix !== undefined)
      assert.isAtLeast(groupedBatches.length, 6)
      for (const mb of groupedBatches) {
        const prefix = mb.prefix!
        assert.isAtMost(mb.batch * mb.length + prefix.batch * prefix.length, budget)
        mb.sequenceIndex.forEach((index, b) => {
          const shared = mb.positionIds![b * mb.length]!
          const k = prefix.index[b]!
          assert.deepStrictEqual(
            [...prefix.inputIds.subarray(k * prefix.length, k * prefix.length + shared)],
            [...data[index]!.tokenIds.subarray(0, shared)]
          )
          assert.strictEqual(prefix.attentionMask[k * prefix.length + shared - 1], 1)
          assert.strictEqual(prefix.attentionMask[k * prefix.length + shared] ?? 0, 0)
        })
      }
      assert.strictEqual(small.totals.tokens, plain.totals.tokens)
      assert.strictEqual(
        groupedBatches.reduce((n, mb) => n + mb.lossTokens, 0),
        plain.totals.tokens - whole!.lossTokens
      )
      // groups of unequal sizes (chains dropped from some), rows padded: every row's prompt is there
      const uneven = [...data.slice(0, 4), ...data.slice(6, 8), ...data.slice(9, 11)]
      for (const budget of [48, 64, 96, 128, 256]) {
        const p = yield* Packing.pack(uneven, {
          tokenBudget: budget,
          lengthMultiple: 16,
          aggregation: "token-mean",
          sharePrefix: true,
          padRows: true
        })
        for (const mb of p.microBatches) {
          assert.isAtMost(mb.batch * mb.length + (mb.prefix?.batch ?? 0) * (mb.prefix?.length ?? 0), budget)
          mb.sequenceIndex.forEach((index, b) => {
            if (index < 0 || mb.prefix === undefined) return
            const k = mb.prefix.index[b]!
            assert.isBelow(k, mb.prefix.batch)
            assert.strictEqual(mb.prefix.inputIds[k * mb.prefix.length], uneven[index]!.tokenIds[0])
          })
        }
        assert.strictEqual(p.totals.tokens, p.microBatches.reduce((n, mb) => n + mb.lossTokens, 0))
      }
      // fewer than 8 common tokens: copied, not shared
      const pair = dataset(3, 1, 2).slice(0, 2)
      const cut = pair[0]!.lossMask.indexOf(1) - 6 // 5 common tokens before the first loss token but one
      const short = pair.map((s) => ({ tokenIds: s.tokenIds.slice(cut), lossMask: s.lossMask.slice(cut) }))
      const unshared = yield* Packing.pack(short, { tokenBudget: 4096, aggregation: "token-mean", sharePrefix: true })
      assert.isUndefined(unshared.microBatches[0]!.prefix)
    }))

  it.effect(
    "rows naming a prompt the micro-batch does not hold are a BadBatch error; an empty prompt row changes nothing",
    () =>
      Effect.gen(function*() {
        const packed = yield* Packing.pack(dataset(5, 1, 2).slice(0, 2), {
          tokenBudget: 1024,
          aggregation: "token-mean",
          sharePrefix: true
        })
        const mb = packed.microBatches[0]!
        const trainer = yield* OnnxTrainer.make(options(Loss.grpo))
        const bad = { ...mb, prefix: { ...mb.prefix!, index: Int32Array.of(0, 1) } }
        const error = yield* Effect.flip(trainer.trainer.forwardBackward(bad))
        assert.strictEqual(error.reason._tag, "BadBatch")
        assert.include(error.message, "row 1 continues prompt 1 of 1")
        const short = { ...mb, prefix: { ...mb.prefix!, index: Int32Array.of(0) } }
        assert.strictEqual((yield* Effect.flip(trainer.trainer.forwardBackward(short))).reason._tag, "BadBatch")
        // nothing was accumulated: the next good micro-batch's loss is its own
        const good = yield* trainer.trainer.forwardBackward(mb)
        assert.isAbove(good.tokens, 0)
        // an empty prompt row (as a worker's shard may carry) changes nothing
        const prefix = mb.prefix!
        const padded = {
          ...mb,
          prefix: {
            ...prefix,
            batch: prefix.batch + 1,
            inputIds: Int32Array.from([...prefix.inputIds, ...new Array(prefix.length).fill(0)]),
            attentionMask: Uint8Array.from([...prefix.attentionMask, ...new Array(prefix.length).fill(0)])
          }
        }
        const same = yield* trainer.trainer.forwardBackward(padded)
        assert.approximately(same.loss, good.loss, 1e-6)
        same.tokenLogprobs.forEach((x, i) => assert.approximately(x, good.tokenLogprobs[i]!, 1e-6))
      }).pipe(Effect.scoped, Effect.provide(NodeServices.layer))
  )

  for (
    const [name, loss, workers] of [
      ["token-mean, one thread", Loss.grpo, 1],
      ["seq-mean-token-mean, 2 workers", { ...Loss.grpo, aggregation: "seq-mean-token-mean" as const }, 2]
    ] as const
  ) {
    it.effect(`gives whole rows' loss, statistics, logprobs and gradients (${name})`, () =>
      Effect.gen(function*() {
        const data = dataset(4)
        // with 2 workers, rows padded as `agentfly train` pads them: empty rows and empty prompt rows
        const padRows = workers === 2
        const pack = (sharePrefix: boolean) =>
          Packing.pack(data, {
            tokenBudget: 256,
            lengthMultiple: 16,
            aggregation: loss.aggregation,
            sharePrefix,
            padRows
          })
        const plain = yield* pack(false)
        const shared = yield* pack(true)
        if (!padRows) assert.isBelow(cellsOf(shared), cellsOf(plain) * 0.8, "the prompts are computed once")
        // 2 workers split a micro-batch's rows: a group's rows may land on both, each with its prompt
        assert.isTrue(shared.microBatches.some((mb) => mb.prefix !== undefined && mb.prefix.batch > 1))
        if (padRows) assert.isTrue(shared.microBatches.some((mb) => mb.sequenceIndex.includes(-1)), "padding rows")
        const run = (packed: Packing.Packed) =>
          Effect.gen(function*() {
            const trainer = yield* OnnxTrainer.make({ ...options(loss), workers })
            const sums = { loss: 0, tokens: 0, clipped: 0, approxKl: 0, entropy: 0 }
            const logprobs = new Map<string, number>() // each trained token's, by (sequence, position)
            for (const mb of packed.microBatches) {
              const r = yield* trainer.trainer.forwardBackward(mb)
              for (const key of Object.keys(sums) as Array<keyof typeof sums>) sums[key] += r[key]
              for (let i = 0; i < mb.batch * mb.length; i++) {
                const position = mb.positionIds?.[i] ?? i % mb.length
                if (mb.mask[i] === 1) {
                  logprobs.set(`${mb.sequenceIndex[Math.floor(i / mb.length)]}:${position}`, r.tokenLogprobs[i]!)
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
        assert.isAbove(a.sums.clipped + a.sums.entropy, 0)
        assert.strictEqual(b.logprobs.size, a.logprobs.size)
        for (const [key, x] of a.logprobs) assert.approximately(b.logprobs.get(key)!, x, 1e-5, key)
        const g = maxDiff(b.gradients, a.gradients)
        assert.isAbove(g.scale, 0)
        assert.isBelow(g.diff, 1e-5 * g.scale, `max |Δg| ${g.diff} of ${g.scale}`)
      }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
  }
})
