import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as EngineThread from "../../actors/EngineThread.ts"
import { make } from "../../actors/PolicyEngine.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import type * as VisionTower from "../../src/model/VisionTower.ts"
import * as Sampling from "../../src/Sampling.ts"
import { tinyConfig } from "../utils/tinyModel.ts"
import { image, makeVlReference, smallVl, vlWeights } from "../utils/visionModel.ts"

const c = tinyConfig()
const vl = smallVl(c)
const PAD = 60
const weights = vlWeights(vl, 5)
const vision = { config: vl, imageTokenId: PAD }
const textWeights = new Map([...weights].filter(([n]) => !n.startsWith("visual.")))

const greedy = (promptTokenIds: ReadonlyArray<number>, maxTokens = 12): GenerateRequest => ({
  promptTokenIds,
  sampling: { temperature: 0, maxTokens }
})

// Two images: 8×4 (2 merged tokens) and 4×4 (1), their pads inside the prompt's text.
const pictures = [image(8, 4, 3), image(4, 4, 4)]
const withImages = [1, 2, PAD, PAD, 7, 8, PAD, 9, 10]
const text = [5, 6, 7, 8, 9, 11, 13]

/** Greedy tokens of a full (no-cache) forward at each step. */
const greedyReference = (
  reference: Effect.Success<ReturnType<typeof makeVlReference>>,
  prompt: ReadonlyArray<number>,
  images: ReadonlyArray<VisionTower.Pixels>,
  steps: number
) =>
  Effect.gen(function*() {
    const seq = [...prompt]
    for (let step = 0; step < steps; step++) {
      const logits = yield* reference(weights, seq, images, prompt.length)
      seq.push(Sampling.argmax(logits.subarray((seq.length - 1) * c.vocabSize, seq.length * c.vocabSize)))
    }
    return seq.slice(prompt.length)
  })

describe("PolicyEngine with a vision tower", () => {
  it.effect("greedy KV-cache decoding of a prompt with images equals a full forward's argmax at each step", () =>
    Effect.gen(function*() {
      const engine = yield* make({ config: c, weights, vision })
      const reference = yield* makeVlReference(vl, PAD)
      const r = yield* engine.generate(greedy(withImages), { images: pictures })
      const seq = [...withImages]
      const lps: Array<number> = []
      for (let step = 0; step < 12; step++) {
        const logits = yield* reference(weights, seq, pictures, withImages.length)
        const row = logits.subarray((seq.length - 1) * c.vocabSize, seq.length * c.vocabSize)
        const next = Sampling.argmax(row)
        lps.push(Sampling.logSoftmax(row)[next]!)
        seq.push(next)
      }
      assert.deepStrictEqual(r.tokenIds, seq.slice(withImages.length))
      r.logprobs.forEach((lp, i) => assert.approximately(lp, lps[i]!, 1e-4))
      // The images decide the answer: other pixels, other tokens.
      const other = yield* engine.generate(greedy(withImages), { images: [image(8, 4, 30), image(4, 4, 40)] })
      assert.notDeepEqual(other.tokenIds, r.tokenIds)
    }))

  it.effect("a conversation's next turn reuses its keys and values only when its first images are the same", () =>
    Effect.gen(function*() {
      const engine = yield* make({ config: c, weights, vision })
      const reference = yield* makeVlReference(vl, PAD)
      const first = yield* engine.generate(greedy(withImages, 6), { images: pictures })
      assert.notInclude(first.tokenIds, PAD)
      // The next turn: the first turn's tokens, then a new 4×4 image's pad and some text.
      const next = [...withImages, ...first.tokenIds, 3, PAD, 4]
      const more = [...pictures, image(4, 4, 5)]
      const before = yield* engine.stats
      const second = yield* engine.generate(greedy(next, 8), { images: more })
      const reused = (yield* engine.stats).reusedTokens - before.reusedTokens
      assert.strictEqual(reused, withImages.length + first.tokenIds.length - 1) // the last sampled one was not fed
      const expected = yield* greedyReference(reference, next, more, 8)
      assert.deepStrictEqual(second.tokenIds, expected)
      // The same tokens with another first image: nothing reused, and the answer is that image's.
      const other = [image(8, 4, 31), ...more.slice(1)]
      const mark = (yield* engine.stats).reusedTokens
      const third = yield* engine.generate(greedy(next, 8), { images: other })
      assert.strictEqual((yield* engine.stats).reusedTokens, mark)
      assert.deepStrictEqual(third.tokenIds, yield* greedyReference(reference, next, other, 8))
    }))

  it.effect("a text request decoded beside image requests gives the tokens and logprobs it gives alone", () =>
    Effect.gen(function*() {
      const alone = yield* Effect.scoped(Effect.gen(function*() {
        const engine = yield* make({ config: c, weights, vision })
        return yield* engine.generate(greedy(text, 16))
      }))
      // The text-only engine (no tower) agrees too: the text path is the same graph and the same feeds.
      const plain = yield* Effect.scoped(Effect.gen(function*() {
        const engine = yield* make({ config: c, weights: textWeights })
        return yield* engine.generate(greedy(text, 16))
      }))
      const engine = yield* make({ config: c, weights, vision })
      const [mixed, a, b] = yield* Effect.all([
        engine.generate(greedy(text, 16)),
        engine.generate(greedy(withImages), { images: pictures }),
        engine.generate(greedy(withImages), { images: pictures })
      ], { concurrency: "unbounded" })
      const stats = yield* engine.stats
      assert.strictEqual(stats.largestBatch, 3) // decoded together
      // One text prefill and one image prefill; the two identical image prompts computed once.
      assert.strictEqual(stats.prefills, 2)
      assert.strictEqual(stats.prefillTokens, text.length + withImages.length)
      assert.deepStrictEqual(mixed.tokenIds, alone.tokenIds)
      assert.deepStrictEqual(mixed.logprobs, alone.logprobs)
      assert.deepStrictEqual(plain.tokenIds, alone.tokenIds)
      assert.deepStrictEqual(plain.logprobs, alone.logprobs)
      assert.deepStrictEqual(a.tokenIds, b.tokenIds)
    }))

  it.effect("a vision engine on the engine thread answers an image prompt as one on this thread", () =>
    Effect.gen(function*() {
      const here = yield* make({ config: c, weights, vision })
      const thread = yield* EngineThread.make
      const there = yield* thread.make({ config: c, weights, vision })
      const request = { promptTokenIds: withImages, sampling: { temperature: 0.8, maxTokens: 10, seed: 4 } }
      const a = yield* here.generate(request, { images: pictures })
      const b = yield* there.generate(request, { images: pictures })
      assert.deepStrictEqual(b, a)
      const plain = yield* there.generate(request)
      assert.notDeepEqual(plain.tokenIds, a.tokenIds) // without images the pads are text: another answer
    }))

  it.effect("images are refused by an engine without a tower, and pads that do not match the images", () =>
    Effect.gen(function*() {
      const text = yield* make({ config: c, weights: textWeights })
      const noTower = yield* Effect.flip(text.generate(greedy(withImages), { images: pictures }))
      assert.strictEqual(noTower.reason._tag, "BadRequest")
      assert.include(noTower.message, "no vision tower")
      const engine = yield* make({ config: c, weights, vision })
      const fewer = yield* Effect.flip(engine.generate(greedy(withImages), { images: [pictures[0]!] }))
      assert.include(fewer.message, "3 image pad tokens; its images make 2")
      const odd = yield* Effect.flip(engine.generate(greedy(withImages), { images: [image(6, 4, 1), pictures[1]!] }))
      assert.include(odd.message, "multiples of 4")
      // A tower's weights given to an engine without one are unknown weights.
      const unknown = yield* Effect.flip(make({ config: c, weights }))
      assert.strictEqual(unknown.reason._tag, "UnknownWeight")
    }))
})
