import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, FileSystem, Scope } from "effect"
import * as OnnxTrainer from "../../../src/backends/OnnxTrainer.ts"
import { collectGarbage } from "../../../src/internal/collectGarbage.ts"
import * as Loss from "../../../src/Loss.ts"
import * as LrSchedule from "../../../src/LrSchedule.ts"
import * as ModelConfig from "../../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import * as Optimizer from "../../../src/Optimizer.ts"
import * as Packing from "../../../src/Packing.ts"
import * as Safetensors from "../../../src/Safetensors.ts"
import * as Sampling from "../../../src/Sampling.ts"
import { tinyConfig } from "../../utils/tinyModel.ts"

// Plain Qwen2 (tied head, RoPE only): the equivalence checks below compare Adam's first step at 2e-6, where
// gradients near zero amplify summation-order differences; extra parameters would only add such elements.
const config = tinyConfig({
  vocabSize: 32,
  hiddenSize: 32,
  numHiddenLayers: 2,
  intermediateSize: 64,
  tieWordEmbeddings: true,
  learnedPositions: false
})

/** A fixed dataset: 6 random sequences of 10–16 tokens, loss on the second half (the "response"). */
const dataset = (): ReadonlyArray<Packing.Sequence> => {
  const r = Sampling.rng(42)
  return Array.from({ length: 6 }, (_, i) => {
    const n = 10 + i
    const tokenIds = Int32Array.from({ length: n }, () => Math.floor(r.next() * config.vocabSize))
    return { tokenIds, lossMask: Uint8Array.from({ length: n }, (_, t) => (t >= n / 2 ? 1 : 0)) }
  })
}

const options = (overrides: Partial<OnnxTrainer.Options> = {}): OnnxTrainer.Options => ({
  model: OnnxTrainer.qwen2(config),
  weights: Qwen2.initWeights(config, 7),
  loss: Loss.sft,
  optimizer: { ...Optimizer.defaultConfig, beta2: 0.98 },
  schedule: LrSchedule.constant(1e-2, 5),
  ...overrides
})

const trainSteps = (
  trainer: Effect.Success<ReturnType<typeof OnnxTrainer.make>>,
  batches: ReadonlyArray<Packing.MicroBatch>,
  steps: number
) =>
  Effect.gen(function*() {
    const losses: Array<number> = []
    for (let s = 0; s < steps; s++) {
      let loss = 0
      for (const mb of batches) loss += (yield* trainer.trainer.forwardBackward(mb)).loss
      yield* trainer.trainer.optimStep
      losses.push(loss)
    }
    return losses
  })

const packAll = (budget: number) => Packing.pack(
  dataset(),
  { tokenBudget: budget, lengthMultiple: 8, aggregation: "token-mean" }
)

const bits = (
  w: ReadonlyMap<string,
  Float32Array>
) => [...w].map(([k, v]) => `${k}:${Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("base64")}`).join("|")

describe("OnnxTrainer", () => {
  it.effect("masked NLL overfits a tiny fixed dataset (loss < 0.05 within 80 steps)", () =>
    Effect.gen(function*() {
      const trainer = yield* OnnxTrainer.make(options())
      const { microBatches } = yield* packAll(64)
      assert.isAbove(microBatches.length, 1) // gradient accumulation over several micro-batches
      const losses = yield* trainSteps(trainer, microBatches, 80)
      assert.isAbove(losses[0]!, 2.5) // ≈ ln 32 at initialisation
      assert.isBelow(losses.at(-1)!, 0.05, `losses: ${losses.filter((_, i) => i % 10 === 0).map((l) => l.toFixed(3))}`)
      assert.strictEqual(yield* trainer.trainer.step, 80)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.effect("micro-batching with gradient accumulation equals one big batch", () =>
    Effect.gen(function*() {
      // AdamW's first step moves each weight by ≈ lr · g / (|g| + eps): with the default eps (1e-8) a gradient that
      // cancels to ≈ 1e-9 moves its weight by a sizeable part of lr on rounding alone, and the two summation orders
      // (micro-batches added, or one batch) round differently on different CPUs. With eps 1e-4 the update is smooth
      // in g (slope ≤ lr / eps), so the weights compare the gradients, and a wrongly scaled or missing micro-batch
      // still moves them by far more than the tolerance.
      const smooth = { optimizer: { ...Optimizer.defaultConfig, beta2: 0.98, eps: 1e-4 } }
      const small = yield* OnnxTrainer.make(options(smooth))
      const big = yield* OnnxTrainer.make(options(smooth))
      const split = (yield* packAll(32)).microBatches
      const whole = (yield* packAll(1024)).microBatches
      assert.isAbove(split.length, 2)
      assert.strictEqual(whole.length, 1)
      const a = yield* trainSteps(small, split, 1)
      const b = yield* trainSteps(big, whole, 1)
      assert.approximately(a[0]!, b[0]!, 1e-5)
      // empty padding rows (padRows) change nothing either
      const padded = yield* OnnxTrainer.make(options(smooth))
      const withPadding = (yield* Packing.pack(
        dataset(),
        { tokenBudget: 64, lengthMultiple: 8, aggregation: "token-mean", padRows: true }
      ))
        .microBatches
      assert.isTrue(withPadding.some((mb) => mb.sequenceIndex.includes(-1)))
      const p = yield* trainSteps(padded, withPadding, 1)
      assert.approximately(p[0]!, b[0]!, 1e-5)
      const wa = yield* small.trainer.weights
      const wb = yield* big.trainer.weights
      const wp = yield* padded.trainer.weights
      for (const [name, x] of wa) {
        const y = wb.get(name)!
        const z = wp.get(name)!
        for (let i = 0; i < x.length; i++) {
          assert.approximately(x[i]!, y[i]!, 2e-6, name)
          assert.approximately(z[i]!, y[i]!, 2e-6, name)
        }
      }
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("is deterministic and resumes bit-for-bit from a checkpoint", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      const { microBatches } = yield* packAll(64)
      const first = yield* OnnxTrainer.make(options())
      yield* trainSteps(first, microBatches, 3)
      yield* first.trainer.save(`${dir}/ckpt`, { policyVersion: 3, rngState: [1, 2, 3] })
      yield* trainSteps(first, microBatches, 2)
      const straight = bits(yield* first.trainer.weights)

      const again = yield* OnnxTrainer.make(options())
      yield* trainSteps(again, microBatches, 5)
      assert.strictEqual(bits(yield* again.trainer.weights), straight, "same seed and data → identical weights")

      const resumed = yield* OnnxTrainer.make(options({ weights: Qwen2.initWeights(config, 99) }))
      const meta = yield* resumed.trainer.load(`${dir}/ckpt`)
      assert.deepStrictEqual(meta, { policyVersion: 3, rngState: [1, 2, 3] })
      assert.strictEqual(yield* resumed.trainer.step, 3)
      yield* trainSteps(resumed, microBatches, 2)
      assert.strictEqual(bits(yield* resumed.trainer.weights), straight, "resume → identical weights")
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.effect("bfloat16 moments: deterministic, resumed bit-for-bit from their BF16 checkpoint, close to float32", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      const { microBatches } = yield* packAll(64)
      const bf16 = options({ moments: "bfloat16" })
      const first = yield* OnnxTrainer.make(bf16)
      yield* trainSteps(first, microBatches, 3)
      yield* first.trainer.save(`${dir}/ckpt`, { policyVersion: 3, rngState: [] })
      const losses = yield* trainSteps(first, microBatches, 3)
      const straight = bits(yield* first.trainer.weights)
      const stored = (yield* Safetensors.readIndex(`${dir}/ckpt`, "optimizer")).tensors
      assert.deepStrictEqual(new Set([...stored.values()].map((t) => t.dtype)), new Set(["BF16"]))

      const again = yield* OnnxTrainer.make(bf16)
      yield* trainSteps(again, microBatches, 6)
      assert.strictEqual(bits(yield* again.trainer.weights), straight, "same data → identical weights")
      const resumed = yield* OnnxTrainer.make({ ...bf16, weights: Qwen2.initWeights(config, 99) })
      yield* resumed.trainer.load(`${dir}/ckpt`)
      yield* trainSteps(resumed, microBatches, 3)
      assert.strictEqual(bits(yield* resumed.trainer.weights), straight, "resume → identical weights")

      // The float32 run's losses, step by step: within 2 % (the moments differ by bfloat16's rounding only).
      const f32 = yield* OnnxTrainer.make(options())
      const f32Losses = yield* trainSteps(f32, microBatches, 6)
      f32Losses.slice(3).forEach((l, i) => assert.approximately(losses[i]! / l, 1, 0.02, `step ${i + 4}`))
      // A float32 checkpoint loads into a bfloat16 trainer (its moments narrowed) and the run goes on.
      yield* f32.trainer.save(`${dir}/f32`, { policyVersion: 6, rngState: [] })
      yield* resumed.trainer.load(`${dir}/f32`)
      assert.strictEqual(yield* resumed.trainer.step, 6)
      yield* trainSteps(resumed, microBatches, 1)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.effect("releaseOutputs (onnxruntime's gradient copies freed after each micro-batch) changes no bit", () =>
    Effect.gen(function*() {
      const { microBatches } = yield* packAll(32)
      assert.isAbove(microBatches.length, 2) // the first micro-batch writes the accumulators, the next ones add
      const plain = yield* OnnxTrainer.make(options({ releaseOutputs: false }))
      const freed = yield* OnnxTrainer.make(options({ releaseOutputs: true }))
      const a = yield* trainSteps(plain, microBatches, 3)
      const b = yield* trainSteps(freed, microBatches, 3)
      assert.deepStrictEqual(b, a)
      // A copy released before it was added (or an accumulator released) would change this update.
      assert.strictEqual(bits(yield* freed.trainer.weights), bits(yield* plain.trainer.weights))
      for (const mb of microBatches) {
        yield* plain.trainer.forwardBackward(mb)
        yield* freed.trainer.forwardBackward(mb)
      }
      assert.strictEqual(bits(yield* freed.gradients), bits(yield* plain.gradients))
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.effect("corrupt, incomplete and mismatched checkpoints are typed errors", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      const trainer = yield* OnnxTrainer.make(options())
      yield* trainer.trainer.save(`${dir}/a`, { policyVersion: 0, rngState: [] })
      const bytes = yield* fs.readFile(`${dir}/a/model.safetensors`)
      yield* fs.writeFile(`${dir}/a/model.safetensors`, bytes.slice(0, bytes.length / 2))
      const corrupt = yield* Effect.flip(trainer.trainer.load(`${dir}/a`))
      assert.strictEqual(corrupt.reason._tag, "Checkpoint")
      assert.match(corrupt.message, /model\.safetensors/)
      yield* trainer.trainer.save(`${dir}/b`, { policyVersion: 0, rngState: [] })
      yield* fs.remove(`${dir}/b/trainer_state.json`)
      assert.match((yield* Effect.flip(trainer.trainer.load(`${dir}/b`))).message, /trainer_state\.json is missing/)
      assert.strictEqual((yield* Effect.flip(trainer.trainer.load(`${dir}/nothing`))).reason._tag, "Checkpoint")
      const other = yield* OnnxTrainer.make(options({
        model: OnnxTrainer.qwen2({ ...config, intermediateSize: 16 }),
        weights: Qwen2.initWeights({ ...config, intermediateSize: 16 }, 1)
      }))
      yield* trainer.trainer.save(`${dir}/c`, { policyVersion: 0, rngState: [] })
      assert.match((yield* Effect.flip(other.trainer.load(`${dir}/c`))).message, /F32 \[/)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("the tiny and small presets build, take a step and lower the loss on a repeated batch", () =>
    Effect.gen(function*() {
      for (const preset of ["tiny", "small"] as const) {
        const c = ModelConfig.presets[preset]
        const trainer = yield* OnnxTrainer.make({
          ...options(),
          model: OnnxTrainer.qwen2(c),
          weights: Qwen2.initWeights(c, 1)
        })
        const seqs = Array.from({ length: 2 }, (_, b) => ({
          tokenIds: Int32Array.from({ length: 16 }, (_, i) => (i * 5 + b * 3) % c.vocabSize),
          lossMask: new Uint8Array(16).fill(1)
        }))
        const { microBatches } = yield* Packing.pack(seqs, { tokenBudget: 64, aggregation: "token-mean" })
        const losses = yield* trainSteps(trainer, microBatches, 3)
        assert.isBelow(losses[2]!, losses[0]!, `${preset}: ${losses}`)
      }
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.effect("sessions evicted from a full cache are released once, and the trainer still closes cleanly", () =>
    Effect.gen(function*() {
      const closed = yield* Effect.scoped(Effect.gen(function*() {
        const trainer = yield* OnnxTrainer.make(options({ maxSessions: 1 }))
        // three lengths → three shapes through a cache of one, twice over
        for (let round = 0; round < 2; round++) {
          for (const budget of [16, 32, 64]) {
            const { microBatches } = yield* Packing.pack(dataset(), {
              tokenBudget: budget,
              lengthMultiple: 16,
              aggregation: "token-mean"
            })
            yield* trainer.trainer.forwardBackward(microBatches[0]!)
          }
        }
        yield* trainer.trainer.optimStep
        return yield* trainer.trainer.step
      }))
      assert.strictEqual(closed, 1)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a non-finite gradient skips the update, leaves the weights untouched and clears the accumulators", () =>
    Effect.gen(function*() {
      const trainer = yield* OnnxTrainer.make(options({ loss: Loss.grpo }))
      const { microBatches } = yield* packAll(64)
      const mb = microBatches[0]!
      const at = mb.mask.indexOf(1)
      const poisoned = { ...mb, advantages: Float32Array.from(mb.advantages, (a, i) => (i === at ? Number.NaN : a)) }
      const before = bits(yield* trainer.trainer.weights)
      yield* trainer.trainer.forwardBackward(poisoned)
      const error = yield* Effect.flip(trainer.trainer.optimStep)
      assert.strictEqual(error.reason._tag, "NonFiniteGradient")
      assert.isTrue(error.isRetryable)
      assert.strictEqual(bits(yield* trainer.trainer.weights), before)
      assert.strictEqual(yield* trainer.trainer.step, 0)
      // the next, healthy step is unaffected by the poisoned one
      yield* trainer.trainer.forwardBackward(mb)
      const ok = yield* trainer.trainer.optimStep
      assert.isTrue(Number.isFinite(ok.gradNorm))
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("bad batches, a missing execution provider and an empty step are typed errors", () =>
    Effect.gen(function*() {
      const trainer = yield* OnnxTrainer.make(options())
      const { microBatches } = yield* packAll(64)
      const mb = microBatches[0]!
      const outside = { ...mb, inputIds: Int32Array.from(mb.inputIds, (v, i) => (i === 0 ? 999 : v)) }
      assert.strictEqual((yield* Effect.flip(trainer.trainer.forwardBackward(outside))).reason._tag, "BadBatch")
      assert.strictEqual(
        (yield* Effect.flip(trainer.trainer.forwardBackward({ ...mb, targets: Int32Array.of(1) }))).reason._tag,
        "BadBatch"
      )
      assert.strictEqual((yield* Effect.flip(trainer.trainer.optimStep)).reason._tag, "NothingAccumulated")
      const cuda = yield* OnnxTrainer.make(options({ executionProvider: "cuda" }))
      const noCuda = yield* Effect.flip(cuda.trainer.forwardBackward(mb))
      assert.strictEqual(noCuda.reason._tag, "Session")
      assert.match(noCuda.message, /cuda/)
      // What onnxruntime threw is the cause; the reason is caught by its tag.
      const cause = yield* cuda.trainer.forwardBackward(mb).pipe(
        Effect.as(undefined),
        Effect.catchReason("GradientBackendError", "Session", (reason) => Effect.succeed(reason.cause))
      )
      assert.instanceOf(cause, Error)
      const bad = yield* Effect.flip(OnnxTrainer.make(options({ weights: new Map() })))
      assert.strictEqual(bad.reason._tag, "BadBatch")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.live("keeps no reference to the weights it started from, and a closed trainer lets go of its own", () =>
    Effect.gen(function*() {
      let weights: Qwen2.Weights | undefined = Qwen2.initWeights(config, 7)
      const initial = new WeakRef(weights.get("model.embed_tokens.weight")!)
      const scope = yield* Scope.make()
      const made = yield* OnnxTrainer.make(options({ weights })).pipe(Scope.provide(scope))
      weights = undefined
      // A WeakRef's target lives to the end of the job that made it: collect from a later one.
      yield* Effect.sleep("20 millis")
      collectGarbage()
      assert.isUndefined(initial.deref(), "the caller's weights are garbage while the trainer lives")
      const own = new WeakRef((yield* made.trainer.weights).get("model.embed_tokens.weight")!)
      assert.isDefined(own.deref())
      yield* Scope.close(scope, Exit.void)
      const trained = (made as { trainer: unknown }).trainer // the service is still held here
      yield* Effect.sleep("20 millis")
      collectGarbage()
      assert.isDefined(trained)
      assert.isUndefined(own.deref())
    }).pipe(Effect.provide(NodeServices.layer)))
})
