import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { createHash } from "node:crypto"
import * as EngineThread from "../../actors/EngineThread.ts"
import * as EngineModel from "../../actors/internal/engineModel.ts"
import type { Setup } from "../../actors/internal/localSetup.ts"
import * as LocalVersions from "../../actors/internal/localVersions.ts"
import { make } from "../../actors/PolicyEngine.ts"
import * as Lora from "../../src/Lora.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Graph from "../../src/onnx/Graph.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import * as Sampling from "../../src/Sampling.ts"
import { randomWeights } from "../utils/tinyModel.ts"

const c = ModelConfig.presets.tiny
const lora: Lora.Config = { rank: 4, alpha: 8, targets: [...Lora.moduleNames] }
const base = randomWeights(c, 1)

/** A non-zero adapter: `A` as PEFT initialises it, `B` random (a fresh one is zero). */
const adapter = (seed: number): Map<string, Float32Array> => {
  const out = Lora.init(c, { ...lora, seed })
  const r = Sampling.rng(seed + 100)
  for (const [name, data] of out) {
    if (name.endsWith("lora_B.weight")) for (let i = 0; i < data.length; i++) data[i] = Sampling.normal(r) * 0.2
  }
  return out
}

/** What the learner publishes: the base by reference, then the adapter. */
const learnerWeights = (a: ReadonlyMap<string, Float32Array>) => new Map([...base, ...a])

// Several lengths, decoded together (batch 5), then a continuation that reuses a finished sequence's cache.
const prompts = [
  [5],
  [1, 2, 3],
  [7, 8, 9, 10, 11, 12, 13, 14],
  [40, 41, 42, 43, 44],
  Array.from({ length: 23 }, (_, i) => (i * 37) % 288)
]
const greedy = (promptTokenIds: ReadonlyArray<number>): GenerateRequest => ({
  promptTokenIds,
  sampling: { temperature: 0, maxTokens: 12 }
})

const maxAbsDiff = (a: ReadonlyArray<number>, b: ReadonlyArray<number>) =>
  a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i]!)), 0)

/** Greedy results of every prompt at once, then of the first result continued by three more tokens. */
const decodeAll = (engine: Effect.Success<ReturnType<typeof make>>) =>
  Effect.gen(function*() {
    const first = yield* Effect.forEach(prompts, (p) => engine.generate(greedy(p)), { concurrency: "unbounded" })
    const next = yield* engine.generate(greedy([...prompts[2]!, ...first[2]!.tokenIds, 3, 4, 5]))
    return [...first, next]
  })

const sha = (bytes: Uint8Array) => createHash("sha256").update(bytes).digest("hex")

describe("PolicyEngine with an unmerged LoRA adapter", () => {
  it.effect("decodes the merged model's greedy tokens and logprobs, across versions and with a KV cache", () =>
    Effect.gen(function*() {
      const a1 = adapter(1), a2 = adapter(2)
      const merged = yield* make({ config: c, weights: Lora.merge(c, lora, base, a1), version: 1 })
      const unmerged = yield* make({ config: c, weights: learnerWeights(a1), version: 1, lora })
      for (const [version, a] of [[1, a1], [2, a2]] as const) {
        if (version === 2) {
          yield* merged.updateWeights(2, Lora.merge(c, lora, base, a))
          yield* unmerged.updateWeights(2, learnerWeights(a))
        }
        const want = yield* decodeAll(merged)
        const got = yield* decodeAll(unmerged)
        for (const [i, w] of want.entries()) {
          assert.deepStrictEqual(got[i]!.tokenIds, w.tokenIds, `version ${version}, request ${i}`)
          assert.isBelow(maxAbsDiff(got[i]!.logprobs, w.logprobs), 1e-4, `version ${version}, request ${i}`)
          assert.strictEqual(got[i]!.policyVersion, version)
        }
        // The adapter changes what is sampled: the comparison is not between two copies of the base.
        const plain = yield* make({ config: c, weights: base })
        const baseOnly = yield* plain.generate(greedy(prompts[4]!))
        assert.isAbove(maxAbsDiff(baseOnly.logprobs, want[4]!.logprobs), 1e-3)
      }
      const stats = yield* unmerged.stats
      assert.isAbove(stats.reusedTokens, 0) // the continuation decoded from the kept cache
      assert.strictEqual(stats.largestBatch, prompts.length)
    }), 120_000)

  it.effect("on the engine thread too (`engine.thread`): the merged model's greedy tokens", () =>
    Effect.gen(function*() {
      const a1 = adapter(1)
      const merged = yield* make({ config: c, weights: Lora.merge(c, lora, base, a1) })
      const thread = yield* EngineThread.make
      const there = yield* thread.make({ config: c, weights: learnerWeights(a1), lora })
      const want = yield* merged.generate(greedy(prompts[2]!))
      const got = yield* there.generate(greedy(prompts[2]!))
      assert.deepStrictEqual(got.tokenIds, want.tokenIds)
      assert.isBelow(maxAbsDiff(got.logprobs, want.logprobs), 1e-4)
    }), 120_000)

  it("two published versions' engines feed the same base arrays; only the adapter differs", () => {
    const folder = { config: c, weights: base, vision: undefined }
    const setup = { config: { model: { lora } }, folder } as unknown as Setup
    const versions = [base, learnerWeights(adapter(1)), learnerWeights(adapter(2))].map((w) =>
      EngineModel.weightFeeds(c, LocalVersions.forEngine(setup, w), lora)
    )
    const baseNames = Qwen2.parameters(c).map((s) => s.name)
    const adapterNames = Lora.parameters(c, lora).map((s) => s.name)
    const distinct = (names: ReadonlyArray<string>) => new Set(versions.flatMap((v) => names.map((n) => v[n]!.data)))
    // Every version feeds the folder's own arrays: one object per base weight, whatever the number of versions.
    assert.strictEqual(distinct(baseNames).size, baseNames.length)
    for (const name of baseNames) assert.strictEqual(versions[2]![name]!.data, base.get(name))
    // Each version its own adapter (the folder's weights get a fresh one: B = 0, the base's function).
    assert.strictEqual(distinct(adapterNames).size, 3 * adapterNames.length)
    const fresh = LocalVersions.forEngine(setup, base)
    const factorsB = adapterNames.filter((n) => n.endsWith("lora_B.weight"))
    assert.isTrue(factorsB.every((n) => fresh.get(n)!.every((x) => x === 0)))
    assert.strictEqual(LocalVersions.forEngine(setup, base).get(adapterNames[0]!), fresh.get(adapterNames[0]!))
  })

  it("the text engine's model without LoRA is byte for byte the one it was; fed as inputs, it is the fused graph", () => {
    // Hashes of `modelBytes` at 4c0b0bf (before LoRA engines): the demo's figures depend on this graph.
    assert.strictEqual(sha(EngineModel.modelBytes(c, "initializers")), PINNED_INITIALIZERS)
    // Fed as inputs (`engine.weights`), the LoRA engine's products without an adapter (issue 41 point 6).
    const inputs = EngineModel.modelBytes(c, "inputs")
    assert.strictEqual(sha(inputs), PINNED_INPUTS)
    assert.strictEqual(sha(Graph.toModelBytes(Qwen2.inferenceGraph(c, "inputs", undefined, true))), PINNED_INPUTS)
    assert.notStrictEqual(sha(inputs), PINNED_UNFUSED_INPUTS)
    // No `Transpose` of a weight runs per step: every product with one is a `FusedMatMul`.
    const fused = Qwen2.inferenceGraph(c, "inputs", undefined, true)
    const weightNames = new Set(Qwen2.parameters(c).map((p) => p.name))
    const transposed = fused.nodes.filter((n) => n.op === "Transpose" && weightNames.has(n.inputs[0]!))
    assert.deepStrictEqual(transposed, [])
    assert.isAbove(fused.nodes.filter((n) => n.op === "FusedMatMul").length, 6 * c.numHiddenLayers)
    assert.strictEqual(sha(Graph.toModelBytes(Qwen2.inferenceGraph(c, "inputs"))), PINNED_UNFUSED_INPUTS)
    const loraBytes = EngineModel.modelBytes(c, "inputs", lora)
    assert.notStrictEqual(sha(loraBytes), PINNED_INPUTS)
  })
})

const PINNED_INITIALIZERS = "58f25c8f9b6b613a95c98d909cbde1e417800d553e23d85b1ef65a314ad34258"
const PINNED_INPUTS = "7646a041508495474af3144bd4f2eb8a294415405c0625d71775f9fb02536a2a"
/** The engine's inputs model until issue 41 point 6 (`MatMul(x, Transpose(W))`), still `inferenceGraph`'s default. */
const PINNED_UNFUSED_INPUTS = "8c119205bfae1fcfa65b4cbf4d63d0728a1d43aaf8da0452469f9a70c5b55396"
