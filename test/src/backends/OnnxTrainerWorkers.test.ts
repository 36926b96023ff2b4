import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Fiber, FileSystem, Result } from "effect"
import * as fc from "fast-check"
import { spawn } from "node:child_process"
import { join } from "node:path"
import * as ort from "onnxruntime-node"
import * as OnnxTrainer from "../../../src/backends/OnnxTrainer.ts"
import * as Loss from "../../../src/Loss.ts"
import * as LrSchedule from "../../../src/LrSchedule.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import * as Optimizer from "../../../src/Optimizer.ts"
import * as Packing from "../../../src/Packing.ts"
import * as Sampling from "../../../src/Sampling.ts"
import { maxDiff, tinyConfig } from "../../utils/tinyModel.ts"
import { bigConfig, longMicroBatch } from "./fixtures/longShard.ts"

// GQA, untied head and learned positions: every kind of parameter the tiny preset has.
const config = tinyConfig({ vocabSize: 32, hiddenSize: 32, numHiddenLayers: 2, intermediateSize: 64 })

/** 6 sequences of 10–15 tokens with signed advantages and sampler logprobs (so the PPO statistics are non-zero). */
const dataset = (): ReadonlyArray<Packing.Sequence> => {
  const r = Sampling.rng(11)
  return Array.from({ length: 6 }, (_, i) => {
    const n = 10 + i
    return {
      tokenIds: Int32Array.from({ length: n }, () => Math.floor(r.next() * config.vocabSize)),
      lossMask: Uint8Array.from({ length: n }, (_, t) => (t >= n / 2 ? 1 : 0)),
      samplerLogprobs: Float32Array.from({ length: n }, () => -3.5 + r.next()),
      advantages: Float32Array.from({ length: n }, () => (i % 2 === 0 ? 1 : -0.5))
    }
  })
}

/** One micro-batch of 7 rows (6 sequences and 1 empty padding row): shards of 4 and 3 rows on 2 workers. */
const oddPaddedBatch = Effect.map(
  Packing.pack(dataset(), {
    tokenBudget: 7 * 16,
    lengthMultiple: 16,
    aggregation: "seq-mean-token-mean",
    padRows: true
  }),
  (p) => p.microBatches
)

const options = (overrides: Partial<OnnxTrainer.Options> = {}): OnnxTrainer.Options => ({
  model: OnnxTrainer.qwen2(config),
  weights: Qwen2.initWeights(config, 3),
  loss: Loss.grpo,
  optimizer: Optimizer.defaultConfig,
  schedule: LrSchedule.constant(1e-3),
  ...overrides
})

type Trainer = Effect.Success<ReturnType<typeof OnnxTrainer.make>>

const steps = (trainer: Trainer, batches: ReadonlyArray<Packing.MicroBatch>, n: number) =>
  Effect.gen(function*() {
    for (let s = 0; s < n; s++) {
      for (const mb of batches) yield* trainer.trainer.forwardBackward(mb)
      yield* trainer.trainer.optimStep
    }
  })

const bits = (w: ReadonlyMap<string, Float32Array>) =>
  [...w].map(([k, v]) => `${k}:${Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("base64")}`).join("|")

describe("OnnxTrainer with worker threads", () => {
  it("shardRanges: contiguous, covering, at most `workers` shards whose sizes differ by at most one", () => {
    fc.assert(fc.property(fc.integer({ min: 1, max: 200 }), fc.integer({ min: 1, max: 16 }), (rows, workers) => {
      const ranges = OnnxTrainer.shardRanges(rows, workers)
      assert.strictEqual(ranges.length, Math.min(rows, workers))
      assert.strictEqual(ranges[0]![0], 0)
      assert.strictEqual(ranges.at(-1)![1], rows)
      ranges.forEach(([s, e], i) => {
        if (i > 0) assert.strictEqual(s, ranges[i - 1]![1])
        assert.isAbove(e, s)
      })
      const sizes = ranges.map(([s, e]) => e - s)
      assert.isAtMost(Math.max(...sizes) - Math.min(...sizes), 1)
    }))
  })

  it.effect("the tiled head's slices fed as views of its weight: the plain head's loss and gradients", () =>
    Effect.gen(function*() {
      const mb = (yield* oddPaddedBatch)[0]!
      // 7 × 16 tokens, tiles of about 20 tokens' logits: 7 slices of 5 vocabulary rows, each a view at its offset.
      const plain = yield* OnnxTrainer.make(options({ headChunk: 0 }))
      const a = yield* plain.trainer.forwardBackward(mb)
      const ga = yield* plain.gradients
      for (const workers of [1, 2]) {
        const tiled = yield* OnnxTrainer.make(options({ headChunk: 20, workers }))
        const b = yield* tiled.trainer.forwardBackward(mb)
        assert.approximately(b.loss, a.loss, 1e-5 * Math.max(1, Math.abs(a.loss)), `loss, ${workers} worker(s)`)
        a.tokenLogprobs.forEach((x, i) => assert.approximately(b.tokenLogprobs[i]!, x, 1e-5))
        const g = maxDiff(yield* tiled.gradients, ga)
        assert.isAbove(g.scale, 0)
        assert.isBelow(g.diff, 1e-5 * g.scale, `${workers} worker(s): max |Δg| ${g.diff} of ${g.scale}`)
      }
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("2 workers give the single-thread trainer's loss, statistics, logprobs, gradients and weights", () =>
    Effect.gen(function*() {
      const mbs = yield* oddPaddedBatch
      assert.strictEqual(mbs.length, 1)
      const mb = mbs[0]!
      assert.strictEqual(mb.batch, 7)
      assert.isTrue(mb.sequenceIndex.includes(-1))
      // a 1-row micro-batch (fewer rows than workers) takes one shard
      const single = (yield* Packing.pack(dataset().slice(0, 1), {
        tokenBudget: 16,
        lengthMultiple: 16,
        aggregation: "seq-mean-token-mean"
      })).microBatches
      assert.strictEqual(single[0]!.batch, 1)
      const one = yield* OnnxTrainer.make(options())
      const two = yield* OnnxTrainer.make(options({ workers: 2 }))
      for (const batch of [mb, single[0]!]) {
        const a = yield* one.trainer.forwardBackward(batch)
        const b = yield* two.trainer.forwardBackward(batch)
        // Shard sums reorder float32 additions: relative 1e-5 on sums, absolute 1e-5 on per-token logprobs.
        for (const key of ["loss", "tokens", "clipped", "clippedLower", "approxKl", "entropy", "kl"] as const) {
          assert.approximately(b[key], a[key], 1e-5 * Math.max(1, Math.abs(a[key])), key)
        }
        assert.isAbove(a.tokens, 0)
        if (batch === mb) assert.isAbove(a.clipped, 0, "the PPO clip is exercised")
        assert.strictEqual(b.tokenLogprobs.length, batch.batch * batch.length)
        const forward = yield* two.logprobs(batch)
        a.tokenLogprobs.forEach((x, i) => {
          assert.approximately(b.tokenLogprobs[i]!, x, 1e-5)
          assert.approximately(forward.tokenLogprobs[i]!, x, 1e-5)
        })
      }
      // gradients accumulated over both micro-batches
      const g = maxDiff(yield* two.gradients, yield* one.gradients)
      assert.isAbove(g.scale, 0)
      assert.isBelow(g.diff, 1e-5 * g.scale, `max |Δg| ${g.diff} of ${g.scale}`)
      yield* one.trainer.optimStep
      yield* two.trainer.optimStep
      yield* steps(one, [mb, single[0]!], 3)
      yield* steps(two, [mb, single[0]!], 3)
      assert.strictEqual(yield* two.trainer.step, 4)
      const w = maxDiff(yield* two.trainer.weights, yield* one.trainer.weights)
      // 4 Adam steps of lr 1e-3: a sign flip of a near-zero gradient would move a weight by ~2e-3
      assert.isBelow(w.diff, 1e-5, `max |Δw| ${w.diff}`)
      assert.notStrictEqual(bits(yield* two.trainer.weights), bits(options().weights), "the weights moved")
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  const deterministicResume = (moments: "float32" | "bfloat16") =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      const mbs = yield* oddPaddedBatch
      const first = yield* OnnxTrainer.make(options({ workers: 2, moments }))
      yield* steps(first, mbs, 2)
      yield* first.trainer.save(`${dir}/ckpt`, { policyVersion: 2, rngState: [7] })
      yield* steps(first, mbs, 2)
      const again = yield* OnnxTrainer.make(options({ workers: 2, moments }))
      yield* steps(again, mbs, 4)
      assert.strictEqual(bits(yield* again.trainer.weights), bits(yield* first.trainer.weights))
      const resumed = yield* OnnxTrainer.make(options({ workers: 2, moments, weights: Qwen2.initWeights(config, 99) }))
      yield* steps(resumed, mbs, 1) // the workers have a stale copy of the weights when the checkpoint loads
      yield* resumed.trainer.load(`${dir}/ckpt`)
      assert.strictEqual(yield* resumed.trainer.step, 2)
      yield* steps(resumed, mbs, 2)
      assert.strictEqual(bits(yield* resumed.trainer.weights), bits(yield* first.trainer.weights))
      if (moments === "bfloat16") {
        // One worker's trainer updates the same moments: within rounding of the two-worker run (summation order).
        const one = yield* OnnxTrainer.make(options({ moments }))
        yield* steps(one, mbs, 4)
        assert.isBelow(maxDiff(yield* one.trainer.weights, yield* first.trainer.weights).diff, 1e-4)
      }
    })

  for (const moments of ["float32", "bfloat16"] as const) {
    it.effect(`is deterministic: two runs are bit-identical, resume from a checkpoint is bit-exact (${moments})`, () =>
      deterministicResume(moments).pipe(Effect.provide(NodeServices.layer)), 300_000)
  }

  it.effect("releaseOutputs in the workers (their gradient copies freed after each shard) changes no bit", () =>
    Effect.gen(function*() {
      const mbs = yield* oddPaddedBatch
      const plain = yield* OnnxTrainer.make(options({ workers: 2, releaseOutputs: false }))
      const freed = yield* OnnxTrainer.make(options({ workers: 2, releaseOutputs: true }))
      yield* steps(plain, [...mbs, ...mbs], 2) // two micro-batches a step: the second adds to the workers' buffers
      yield* steps(freed, [...mbs, ...mbs], 2)
      assert.strictEqual(bits(yield* freed.trainer.weights), bits(yield* plain.trainer.weights))
      assert.notStrictEqual(bits(yield* freed.trainer.weights), bits(options().weights), "the weights moved")
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.effect("closing the trainer's scope terminates its threads", () =>
    Effect.gen(function*() {
      const mbs = yield* oddPaddedBatch
      const threads = yield* Effect.scoped(Effect.gen(function*() {
        const trainer = yield* OnnxTrainer.make(options({ workers: 2 }))
        assert.strictEqual(yield* trainer.threads.live, 0, "started lazily")
        yield* trainer.trainer.forwardBackward(mbs[0]!)
        assert.strictEqual(yield* trainer.threads.live, 2)
        return trainer.threads
      }))
      assert.strictEqual(yield* threads.live, 0)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a non-finite gradient skips the update and leaves the weights untouched", () =>
    Effect.gen(function*() {
      const mb = (yield* oddPaddedBatch)[0]!
      const trainer = yield* OnnxTrainer.make(options({ workers: 2 }))
      const at = mb.mask.lastIndexOf(1) // in the second shard
      assert.isAtLeast(at, 4 * mb.length)
      const poisoned = { ...mb, advantages: Float32Array.from(mb.advantages, (a, i) => (i === at ? Number.NaN : a)) }
      const before = bits(yield* trainer.trainer.weights)
      yield* trainer.trainer.forwardBackward(poisoned)
      assert.strictEqual((yield* Effect.flip(trainer.trainer.optimStep)).reason._tag, "NonFiniteGradient")
      assert.strictEqual(bits(yield* trainer.trainer.weights), before)
      assert.strictEqual(yield* trainer.trainer.step, 0)
      yield* trainer.trainer.forwardBackward(mb)
      assert.isTrue(Number.isFinite((yield* trainer.trainer.optimStep).gradNorm))
    }).pipe(Effect.provide(NodeServices.layer)))

  it.live("an interrupted forwardBackward leaves no gradient behind", () =>
    Effect.gen(function*() {
      const mb = (yield* oddPaddedBatch)[0]!
      const trainer = yield* OnnxTrainer.make(options({ workers: 2 }))
      yield* trainer.trainer.forwardBackward(mb) // starts the workers and compiles
      const fiber = yield* Effect.forkChild(trainer.trainer.forwardBackward(mb))
      yield* Effect.yieldNow // the shards are sent; the workers finish them after the interruption
      yield* Fiber.interrupt(fiber)
      assert.strictEqual((yield* Effect.flip(trainer.trainer.optimStep)).reason._tag, "NothingAccumulated")
      yield* steps(trainer, [mb], 1)
      const clean = yield* OnnxTrainer.make(options({ workers: 2 }))
      yield* steps(clean, [mb], 1)
      assert.strictEqual(bits(yield* trainer.trainer.weights), bits(yield* clean.trainer.weights))
    }).pipe(Effect.provide(NodeServices.layer), Effect.scoped))

  it.live("a worker killed mid-step is a typed Run error; the next call starts fresh threads", () =>
    Effect.gen(function*() {
      const mb = (yield* oddPaddedBatch)[0]!
      const trainer = yield* OnnxTrainer.make(options({ workers: 2 }))
      yield* trainer.trainer.forwardBackward(mb)
      const fiber = yield* Effect.forkChild(trainer.trainer.forwardBackward(mb))
      yield* Effect.yieldNow // the shards are sent
      yield* trainer.threads.kill(1)
      // The kill lands while worker 1 runs its shard; should the shard have finished first, the next call reports it.
      const inFlight = yield* Effect.result(Fiber.join(fiber))
      const error = Result.isFailure(inFlight)
        ? inFlight.failure
        : yield* Effect.flip(trainer.trainer.forwardBackward(mb))
      assert.strictEqual(error.reason._tag, "Run")
      assert.match(error.message, /worker 1/)
      // both micro-batches' gradients were discarded
      assert.strictEqual((yield* Effect.flip(trainer.trainer.optimStep)).reason._tag, "NothingAccumulated")
      const retried = yield* trainer.trainer.forwardBackward(mb)
      assert.isTrue(Number.isFinite(retried.loss))
      assert.strictEqual(yield* trainer.threads.live, 2)
      assert.strictEqual((yield* trainer.trainer.optimStep).step, 1)
    }).pipe(Effect.provide(NodeServices.layer), Effect.scoped))

  it.live("closing the threads while they run a long shard neither waits for it nor takes the process down", () =>
    Effect.gen(function*() {
      // A shard that runs for a while (≈ 0.5 s here): closing must not terminate a thread inside onnxruntime's run,
      // which aborts the whole process (this test file would die).
      const big = bigConfig
      const mb = yield* longMicroBatch
      const trainer = yield* OnnxTrainer.make(options({
        workers: 2,
        model: OnnxTrainer.qwen2(big),
        weights: Qwen2.initWeights(big, 3)
      }))
      yield* trainer.trainer.forwardBackward(mb) // starts the threads and compiles
      const fiber = yield* Effect.forkChild(trainer.trainer.forwardBackward(mb))
      yield* Effect.sleep("50 millis") // the shards are running
      const [closed] = yield* Effect.timed(trainer.threads.close("1 millis"))
      assert.isBelow(Duration.toMillis(closed), 200, "close does not wait for the running shards")
      yield* Effect.result(Fiber.join(fiber)) // the shards end on threads that then end themselves
      for (let i = 0; i < 200 && (yield* trainer.threads.live) > 0; i++) yield* Effect.sleep("50 millis")
      assert.strictEqual(yield* trainer.threads.live, 0, "the closed threads ended by themselves")
      yield* Effect.ignore(trainer.trainer.optimStep)
      const again = yield* trainer.trainer.forwardBackward(mb)
      assert.isTrue(Number.isFinite(again.loss))
      assert.strictEqual(yield* trainer.threads.live, 2)
    }).pipe(Effect.provide(NodeServices.layer), Effect.scoped), 300_000)

  it.live("an interrupted call waits for the shards it started, so the process may exit at once after it", () =>
    Effect.gen(function*() {
      // In a child process: exiting while a thread runs inside onnxruntime aborts the process (`Napi::Error`), which
      // is what a SIGTERM during a warm-up did once the closing pool stopped waiting for a long shard.
      const fixture = join(import.meta.dirname, "fixtures", "interruptedShards.ts")
      const run = yield* Effect.callback<{ readonly code: number | null; readonly output: string }>((resume) => {
        const child = spawn(process.execPath, ["--import", "tsx", fixture], { stdio: ["ignore", "pipe", "pipe"] })
        let output = ""
        child.stdout.on("data", (d: Buffer) => (output += d.toString()))
        child.stderr.on("data", (d: Buffer) => (output += d.toString()))
        child.on("exit", (code) => resume(Effect.succeed({ code, output })))
        return Effect.sync(() => child.kill("SIGKILL"))
      })
      assert.include(run.output, "in flight after the interruption: 0", run.output)
      assert.notInclude(run.output, "Napi")
      assert.strictEqual(run.code, 130, run.output)
    }), 300_000)

  it.effect("an onnxruntime error in a worker, a missing provider and a bad worker count are typed errors", () =>
    Effect.gen(function*() {
      const mb = (yield* oddPaddedBatch)[0]!
      const model = OnnxTrainer.qwen2(config)
      // position_ids of the wrong shape: onnxruntime rejects the feed inside the worker
      const badFeed = yield* OnnxTrainer.make(options({
        workers: 2,
        model: {
          ...model,
          inputs: (b) => ({
            ...model.inputs(b),
            position_ids: new ort.Tensor("int64", new BigInt64Array(b.batch), [b.batch, 1])
          })
        }
      }))
      const run = yield* Effect.flip(badFeed.trainer.forwardBackward(mb))
      assert.strictEqual(run.reason._tag, "Run")
      assert.match(run.message, /^worker \d: /)
      assert.strictEqual(yield* badFeed.threads.live, 2, "an onnxruntime error does not cost the threads")
      const cuda = yield* OnnxTrainer.make(options({ workers: 2, executionProvider: "cuda" }))
      const session = yield* Effect.flip(cuda.trainer.forwardBackward(mb))
      assert.strictEqual(session.reason._tag, "Session")
      for (const workers of [0, 1.5]) {
        assert.strictEqual((yield* Effect.flip(OnnxTrainer.make(options({ workers })))).reason._tag, "Session")
      }
    }).pipe(Effect.provide(NodeServices.layer)))
})
