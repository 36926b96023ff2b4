import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Autodiff from "../../../src/autodiff/Autodiff.ts"
import * as ChunkedHead from "../../../src/autodiff/ChunkedHead.ts"
import * as Loss from "../../../src/Loss.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import { check, runWith, session } from "../../utils/gradcheck.ts"
import * as PpoFeeds from "../../utils/ppoFeeds.ts"
import { tinyConfig } from "../../utils/tinyModel.ts"

const { B, T } = PpoFeeds
const c = tinyConfig({ vocabSize: 13, hiddenSize: 8, numAttentionHeads: 2, numKeyValueHeads: 1, intermediateSize: 12 })

const feedsFor = (tg: Autodiff.TrainingGraph, cfg: typeof c, config: Loss.Config, dtype: "float32" | "float64") =>
  PpoFeeds.feedsFor(tg, dtype, cfg, config)

const configs: ReadonlyArray<[string, Loss.Config]> = [
  ["sft", Loss.sft],
  ["ppo dual clip + k3 KL + entropy bonus at temperature 1.5", {
    ...Loss.ppo,
    klCoef: 0.1,
    entropyCoef: 0.01,
    temperature: 1.5
  }],
  ["grpo with truncated IS", { ...Loss.grpo, tisCap: 1.5 }]
]

describe("ChunkedHead", () => {
  it("the default chunk holds about 64 MiB of logits", () => {
    assert.strictEqual(ChunkedHead.defaultChunk(151936), 110)
    assert.strictEqual(ChunkedHead.defaultChunk(2 ** 30), 1)
  })

  it.effect("the plain head is kept when the micro-batch fits in one chunk, and for headChunk 0", () =>
    Effect.gen(function*() {
      const softmaxes = (tg: Autodiff.TrainingGraph) => tg.graph.nodes.filter((n) => n.op === "LogSoftmax").length
      const small = yield* Autodiff.trainingGraph(Qwen2.trainingGraph(c), { batch: B, length: T, loss: Loss.sft })
      assert.strictEqual(softmaxes(small), 1)
      const off = yield* Autodiff.trainingGraph(Qwen2.trainingGraph(c), {
        batch: B,
        length: T,
        loss: Loss.sft,
        headChunk: 0
      })
      assert.strictEqual(softmaxes(off), 1)
      const chunked = yield* Autodiff.trainingGraph(Qwen2.trainingGraph(c), {
        batch: B,
        length: T,
        loss: Loss.sft,
        headChunk: 3
      })
      // No LogSoftmax: one block of 10 tokens × 5 slices of the vocabulary (3 × 13 / 10 = 3 wide, the last 1), a
      // product each in the forward, and the recompute, ∂h and ∂W products each in the backward.
      assert.strictEqual(softmaxes(chunked), 0)
      assert.deepStrictEqual(ChunkedHead.tiles(10, 13, 3), {
        blocks: [[0, 10]],
        slices: [[0, 3], [3, 6], [6, 9], [9, 12], [12, 13]]
      })
      // A maximum per tile, and one across the tiles.
      assert.strictEqual(chunked.graph.nodes.filter((n) => n.op === "ReduceMax").length, 6)
    }))

  it("tiles: blocks of equal size up to the block, vocabulary slices holding about `chunk` tokens' logits", () => {
    // Qwen2.5's vocabulary at 2 × 512 tokens: one block, slices of 16,321 (110 × 151,936 / 1,024), the last shorter.
    const qwen = ChunkedHead.tiles(1024, 151936, 110)
    assert.deepStrictEqual(qwen.blocks, [[0, 1024]])
    assert.strictEqual(qwen.slices.length, 10)
    assert.deepStrictEqual(qwen.slices[0], [0, 16321])
    assert.deepStrictEqual(qwen.slices.at(-1), [146889, 151936])
    // 2,500 tokens: three blocks of 834 (the last 832); 10 tokens with blocks of 4: 4, 4, 2.
    assert.deepStrictEqual(ChunkedHead.tiles(2500, 151936, 110).blocks, [[0, 834], [834, 1668], [1668, 2500]])
    assert.deepStrictEqual(ChunkedHead.tiles(10, 13, 3, 4), {
      blocks: [[0, 4], [4, 8], [8, 10]],
      slices: [[0, 9], [9, 13]]
    })
    // At least one vocabulary entry a slice, at most the whole vocabulary.
    assert.deepStrictEqual(ChunkedHead.tiles(1000, 13, 1).slices.length, 13)
    assert.deepStrictEqual(ChunkedHead.tiles(2, 13, 5).slices, [[0, 13]])
  })

  for (const [name, config] of configs) {
    for (const tied of [true, false]) {
      it.effect(`${name}, ${tied ? "tied" : "untied"} head: tiles of 3 tokens' logits give the plain head's loss, logprobs,
        stats and gradients`.replace(/\s+/g, " "), () =>
        Effect.gen(function*() {
          const cfg = { ...c, tieWordEmbeddings: tied }
          const build = (headChunk: number, headBlock?: number) =>
            Autodiff.trainingGraph(Qwen2.trainingGraph(cfg), {
              batch: B,
              length: T,
              loss: config,
              headChunk,
              ...(headBlock === undefined ? {} : { headBlock })
            })
          const plain = yield* build(0)
          assert.deepStrictEqual(plain.views, [])
          const a = yield* runWith(yield* session(plain.graph), feedsFor(plain, cfg, config, "float32"))
          // One block × 5 slices, and 3 blocks (4, 4, 2 tokens) × 2 slices.
          for (const chunked of [yield* build(3), yield* build(3, 4)]) {
            // The head's vocabulary slices are inputs of their own (views of the weight), not Slice nodes of it.
            const head = tied ? "model.embed_tokens.weight" : "lm_head.weight"
            assert.isAbove(chunked.views.length, 1)
            assert.isTrue(chunked.views.every((v) => v.of === head))
            assert.isFalse(chunked.graph.nodes.some((n) => n.op === "Slice" && n.inputs[0] === head))
            const b = yield* runWith(
              yield* session(chunked.graph),
              feedsFor(chunked, cfg, config, "float32"),
              chunked.views
            )
            const close = (x: ArrayLike<number>, y: ArrayLike<number>, what: string) => {
              assert.strictEqual(x.length, y.length, what)
              let scale = 0
              for (let i = 0; i < x.length; i++) scale = Math.max(scale, Math.abs(x[i]!))
              for (let i = 0; i < x.length; i++) {
                assert.approximately(y[i]!, x[i]!, 1e-5 * (scale + 1e-3), `${what}[${i}]`)
              }
            }
            for (const out of ["loss", "token_logprobs", "stats"]) close(a[out]!, b[out]!, out)
            assert.strictEqual(chunked.gradients.size, plain.gradients.size)
            for (const [w, g] of plain.gradients) close(a[g]!, b[chunked.gradients.get(w)!]!, w)
          }
        }))
    }
  }

  it.effect("chunked whole-model gradients (PPO + KL + entropy, temperature 1.5) match central differences", () =>
    Effect.gen(function*() {
      const config = configs[1]![1]
      const cfg = { ...c, tieWordEmbeddings: true }
      const forward = Qwen2.trainingGraph(cfg)
      const tg = yield* Autodiff.trainingGraph(forward, {
        batch: B,
        length: T,
        loss: config,
        dtype: "float64",
        headChunk: 4,
        headBlock: 4
      })
      const { worst } = yield* check(yield* session(tg.graph), feedsFor(tg, cfg, config, "float64"),
        forward.weightInputs, { samples: 4, h: 1e-5, views: tg.views })
      for (const w of forward.weightInputs) assert.isBelow(worst[w]!, 1e-5, `${w}: ${worst[w]}`)
    }))
})
