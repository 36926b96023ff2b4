/**
 * The full fine-tuning engine fed its weights as inputs (`engine.weights: "inputs"`, issue 41 point 6): the same
 * tokens and logprobs as the engine whose weights are pre-packed initializers, and the published versions' arrays fed
 * as they are (no copy per version, one session for every version).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as EngineModel from "../../actors/internal/engineModel.ts"
import type { Setup } from "../../actors/internal/localSetup.ts"
import * as LocalVersions from "../../actors/internal/localVersions.ts"
import { make } from "../../actors/PolicyEngine.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import { randomWeights, tinyConfig } from "../utils/tinyModel.ts"

// Several lengths, decoded together (batch 5), then a continuation that reuses a finished sequence's cache.
const prompts = [
  [5],
  [1, 2, 3],
  [7, 8, 9, 10, 11, 12, 13, 14],
  [40, 41, 42, 43, 44],
  Array.from({ length: 23 }, (_, i) => (i * 37) % 61)
]
const requestOf = (promptTokenIds: ReadonlyArray<number>, temperature: number, seed: number): GenerateRequest => ({
  promptTokenIds,
  sampling: { temperature, maxTokens: 12, seed }
})

const maxAbsDiff = (a: ReadonlyArray<number>, b: ReadonlyArray<number>) =>
  a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i]!)), 0)

/** Every prompt at once, then the third result continued by three more tokens. */
const decodeAll = (engine: Effect.Success<ReturnType<typeof make>>, temperature: number) =>
  Effect.gen(function*() {
    const first = yield* Effect.forEach(prompts, (p, i) => engine.generate(requestOf(p, temperature, i)), {
      concurrency: "unbounded"
    })
    const next = yield* engine.generate(requestOf([...prompts[2]!, ...first[2]!.tokenIds, 3, 4, 5], temperature, 9))
    return [...first, next]
  })

describe("PolicyEngine with its weights fed as inputs (full fine-tuning)", () => {
  for (const tied of [true, false]) {
    it.effect(`decodes the initializer engine's tokens and logprobs, across versions (tied head: ${tied})`, () =>
      Effect.gen(function*() {
        const c = tinyConfig({ tieWordEmbeddings: tied })
        const [w1, w2] = [randomWeights(c, 1), randomWeights(c, 2)]
        const packed = yield* make({ config: c, weights: w1, version: 1 })
        const fed = yield* make({ config: c, weights: w1, version: 1, weightsAs: "inputs" })
        for (const [version, w] of [[1, w1], [2, w2]] as const) {
          if (version === 2) {
            yield* packed.updateWeights(2, w)
            yield* fed.updateWeights(2, w)
          }
          // Greedy, then sampled at temperature 1 with the same seeds.
          for (const temperature of [0, 1]) {
            const want = yield* decodeAll(packed, temperature)
            const got = yield* decodeAll(fed, temperature)
            for (const [i, r] of want.entries()) {
              const at = `version ${version}, temperature ${temperature}, request ${i}`
              assert.deepStrictEqual(got[i]!.tokenIds, r.tokenIds, at)
              assert.isBelow(maxAbsDiff(got[i]!.logprobs, r.logprobs), 1e-4, at)
              assert.strictEqual(got[i]!.policyVersion, version)
            }
          }
        }
        const stats = yield* fed.stats
        assert.isAbove(stats.reusedTokens, 0) // the continuation decoded from the kept cache
        assert.strictEqual(stats.largestBatch, prompts.length)
      }), 120_000)
  }

  it("the engines of two published versions feed the versions' own arrays: no copy, one session key", () => {
    const c = ModelConfig.presets.tiny
    const setup = { config: { model: {} }, folder: { config: c, vision: undefined } } as unknown as Setup
    const versions = [randomWeights(c, 1), randomWeights(c, 2)]
    const feeds = versions.map((w) => EngineModel.weightFeeds(c, LocalVersions.forEngine(setup, w)))
    for (const [v, w] of versions.entries()) {
      for (const [name, data] of w) assert.strictEqual(feeds[v]![name]!.data, data, name)
    }
    // A session fed its weights holds none: every version's engines share it.
    assert.strictEqual(
      EngineModel.sessionWeightsKey("inputs", versions[0]!),
      EngineModel.sessionWeightsKey("inputs", versions[1]!)
    )
    assert.notStrictEqual(
      EngineModel.sessionWeightsKey("initializers", versions[0]!),
      EngineModel.sessionWeightsKey("initializers", versions[1]!)
    )
  })
})
