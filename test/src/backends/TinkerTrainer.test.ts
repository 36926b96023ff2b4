/**
 * The Tinker learner backend and sampler against a fake Tinker engine on loopback (`test/utils/fakeTinker.ts`): what
 * crosses the wire for a step (datums with weights, advantages and the ratio's denominator; the loss and its clip
 * thresholds; AdamW settings and the schedule's learning rate; increasing `seq_id`s), checkpoints as `save_weights`
 * states named in `tinker.json` and resumed with their optimiser, the sampler on `asample`, and the refusals of what
 * a Tinker engine cannot train, as config issues.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, Layer, Result } from "effect"
import * as Loss from "../../../src/Loss.ts"
import * as LrSchedule from "../../../src/LrSchedule.ts"
import * as Optimizer from "../../../src/Optimizer.ts"
import type * as Packing from "../../../src/Packing.ts"
import * as TrainConfig from "../../../src/TrainConfig.ts"
import * as TinkerClient from "../../../src/backends/TinkerClient.ts"
import * as TinkerLoss from "../../../src/backends/TinkerLoss.ts"
import * as TinkerSampler from "../../../src/backends/TinkerSampler.ts"
import * as TinkerTrainer from "../../../src/backends/TinkerTrainer.ts"
import { fakeTinker, type FakeEngine } from "../../utils/fakeTinker.ts"
import { scriptedTinker } from "../../utils/scriptedTinker.ts"

/** Two rows of length 4: three real tokens (two trained), then two (one trained). */
const batch: Packing.MicroBatch = {
  batch: 2,
  length: 4,
  inputIds: Int32Array.from([1, 2, 3, 0, 4, 5, 0, 0]),
  attentionMask: Uint8Array.from([1, 1, 1, 0, 1, 1, 0, 0]),
  targets: Int32Array.from([2, 3, 9, 0, 5, 8, 0, 0]),
  mask: Uint8Array.from([0, 1, 1, 0, 0, 1, 0, 0]),
  weights: Float32Array.from([0, 0.25, 0.25, 0, 0, 0.5, 0, 0]),
  advantages: Float32Array.from([0, 1, 1, 0, 0, -1, 0, 0]),
  samplerLogprobs: Float32Array.from([0, -0.5, -1.5, 0, 0, -2, 0, 0]),
  refLogprobs: new Float32Array(8),
  sequenceIndex: Int32Array.from([0, 1]),
  lossTokens: 3
}

const options: TinkerTrainer.Options = {
  baseModel: "tiny",
  loraRank: 8,
  seed: 7,
  loss: { ...Loss.grpo, clipLow: 0.2, clipHigh: 0.28 },
  optimizer: { ...Optimizer.defaultConfig, weightDecay: 0.01, maxGradNorm: 1 },
  schedule: LrSchedule.constant(1e-3, 2)
}

/** A fake engine, a client of it and the file system, in the test's scope. */
const withEngine = <A, E>(body: (engine: FakeEngine) => Effect.Effect<A, E, any>) =>
  Effect.gen(function*() {
    const engine = fakeTinker()
    const server = yield* scriptedTinker(engine.handler)
    const client = yield* TinkerClient.make({ baseUrl: server.baseUrl })
    return yield* body(engine).pipe(Effect.provideService(TinkerClient.TinkerClient, client))
  }).pipe(
    Effect.provide(Layer.merge(NodeHttpClient.layerNodeHttp, NodeFileSystem.layer)),
    Effect.scoped
  ) as Effect.Effect<A, E>

describe("TinkerTrainer", () => {
  it.live("a step crosses as datums with weights, advantages and logprobs, then optim_step with AdamW and the lr", () =>
    withEngine((engine) =>
      Effect.gen(function*() {
        const trainer = yield* TinkerTrainer.make(options)
        const created = engine.bodies("create_model")[0]
        assert.deepStrictEqual(created.lora_config, {
          rank: 8,
          seed: 7,
          train_unembed: true,
          train_mlp: true,
          train_attn: true
        })
        assert.strictEqual(created.base_model, "tiny")
        const result = yield* trainer.forwardBackward(batch)
        const sent = engine.bodies("forward_backward")[0]
        assert.strictEqual(sent.forward_backward_input.loss_fn, "ppo")
        const config = sent.forward_backward_input.loss_fn_config
        assert.closeTo(config.clip_low_threshold, 0.8, 1e-12)
        assert.closeTo(config.clip_high_threshold, 1.28, 1e-12)
        const [d0, d1] = sent.forward_backward_input.data
        assert.deepStrictEqual(d0.model_input.chunks[0].tokens, [1, 2, 3])
        assert.deepStrictEqual(d0.loss_fn_inputs.target_tokens.data, [2, 3, 9])
        assert.deepStrictEqual(d0.loss_fn_inputs.weights.data, [0, 0.25, 0.25])
        assert.deepStrictEqual(d0.loss_fn_inputs.advantages.data, [0, 1, 1])
        assert.deepStrictEqual(d0.loss_fn_inputs.logprobs.data, [0, -0.5, -1.5])
        assert.deepStrictEqual(d1.loss_fn_inputs.weights.data, [0, 0.5])
        // The engine answered ratio 1 everywhere: the loss is −Σ w·A, and the logprobs land in their rows.
        assert.closeTo(result.loss, -(0.25 + 0.25 - 0.5), 1e-9)
        assert.strictEqual(result.tokens, 3)
        assert.strictEqual(result.clipped, 0)
        assert.deepStrictEqual([...result.tokenLogprobs], [0, -0.5, -1.5, 0, 0, -2, 0, 0])
        const optim = yield* trainer.optimStep
        assert.deepStrictEqual(optim, { step: 1, gradNorm: 0.5, lr: LrSchedule.at(options.schedule, 0) })
        const adam = engine.bodies("optim_step")[0].adam_params
        assert.deepStrictEqual(adam, {
          learning_rate: LrSchedule.at(options.schedule, 0),
          beta1: 0.9,
          beta2: 0.98,
          eps: 1e-8,
          weight_decay: 0.01,
          grad_clip_norm: 1
        })
        yield* trainer.forwardBackward(batch)
        yield* trainer.optimStep
        assert.strictEqual(engine.bodies("optim_step")[1].adam_params.learning_rate, 1e-3, "warm-up over")
        const seqs = [...engine.bodies("forward_backward"), ...engine.bodies("optim_step")].map((b) => b.seq_id)
        assert.deepStrictEqual(seqs.sort((a, b) => a - b), [1, 2, 3, 4])
        assert.strictEqual(engine.steps.get("model-0"), 2)
        const nothing = yield* Effect.result(trainer.optimStep)
        assert.isTrue(Result.isFailure(nothing) && nothing.failure.reason._tag === "NothingAccumulated")
        const weights = yield* Effect.result(trainer.weights)
        assert.isTrue(Result.isFailure(weights) && weights.failure.reason._tag === "Remote")
      })))

  it.live("an optim_step skipped for non-finite gradients is NonFiniteGradient; another failure is Remote", () =>
    withEngine((engine) =>
      Effect.gen(function*() {
        const trainer = yield* TinkerTrainer.make(options)
        yield* trainer.forwardBackward(batch)
        engine.failOptim = "gradient norm is NaN; the update was skipped"
        const skipped = yield* Effect.result(trainer.optimStep)
        assert.isTrue(Result.isFailure(skipped) && skipped.failure.reason._tag === "NonFiniteGradient")
        assert.strictEqual(yield* trainer.step, 0)
        yield* trainer.forwardBackward(batch)
        engine.failOptim = "model is being unloaded"
        const other = yield* Effect.result(trainer.optimStep)
        assert.isTrue(Result.isFailure(other) && other.failure.reason._tag === "Remote")
        assert.include(Result.isFailure(other) ? other.failure.message : "", "model is being unloaded")
      })))

  it.live("logprobs is a forward pass with cross_entropy datums; nothing accumulates", () =>
    withEngine((engine) =>
      Effect.gen(function*() {
        const trainer = yield* TinkerTrainer.make(options)
        const lp = yield* trainer.logprobs(batch)
        assert.deepStrictEqual([...lp], [-1, -1, -1, 0, -1, -1, 0, 0])
        assert.strictEqual(engine.bodies("forward")[0].forward_input.loss_fn, "cross_entropy")
        assert.strictEqual(engine.bodies("forward_backward").length, 0)
        assert.isTrue(Result.isFailure(yield* Effect.result(trainer.optimStep)))
      })))

  it.live("a checkpoint is a save_weights state named in tinker.json; a load resumes it with its optimizer", () =>
    withEngine((engine) =>
      Effect.gen(function*() {
        const fs = yield* FileSystem.FileSystem
        const dir = yield* fs.makeTempDirectoryScoped()
        const first = yield* TinkerTrainer.make(options)
        yield* first.forwardBackward(batch)
        yield* first.optimStep
        yield* first.save(`${dir}/step-1`, { policyVersion: 1, rngState: [3, 4] })
        const file = JSON.parse(yield* fs.readFileString(`${dir}/step-1/tinker.json`))
        assert.strictEqual(file.statePath, "tinker://model-0/weights/model-0-step-1")
        assert.strictEqual(file.step, 1)
        const before = yield* first.fingerprint
        // A new process: a new trainer, then the checkpoint.
        const second = yield* TinkerTrainer.make(options)
        assert.notStrictEqual(yield* second.fingerprint, before)
        const meta = yield* second.load(`${dir}/step-1`)
        assert.deepStrictEqual(meta, { policyVersion: 1, rngState: [3, 4] })
        const load = engine.bodies("load_weights")[0]
        assert.strictEqual(load.path, file.statePath)
        assert.strictEqual(load.optimizer, true)
        assert.strictEqual(load.seq_id, 1, "the load is the new model's first request")
        assert.strictEqual(yield* second.fingerprint, before)
        assert.strictEqual(yield* second.step, 1)
        assert.strictEqual(yield* second.modelId, "model-2")
        const other = yield* Effect.result(TinkerTrainer.make({ ...options, baseModel: "other" }).pipe(
          Effect.flatMap((t) => t.load(`${dir}/step-1`))
        ))
        assert.isTrue(Result.isFailure(other) && other.failure.reason._tag === "Checkpoint")
      })))

  it.live("the sampler posts token ids and the version's path to asample and returns ids and logprobs", () =>
    withEngine((engine) =>
      Effect.gen(function*() {
        const trainer = yield* TinkerTrainer.make(options)
        const path = yield* trainer.saveForSampler("v3")
        const sampler = yield* TinkerSampler.make({ modelPath: path, baseModel: "tiny", policyVersion: 3 })
        const result = yield* sampler.generate({
          promptTokenIds: [1, 2, 3],
          sampling: { temperature: 1, maxTokens: 4, stopTokenIds: [2], seed: 11 }
        })
        assert.deepStrictEqual(result, {
          tokenIds: [5, 6, 2],
          logprobs: [-0.5, -0.25, -0.125],
          finishReason: "stop",
          policyVersion: 3
        })
        const sent = engine.bodies("asample")[0]
        assert.strictEqual(sent.model_path, "tinker://model-0/sampler_weights/v3")
        assert.deepStrictEqual(sent.prompt, { chunks: [{ tokens: [1, 2, 3], type: "encoded_text" }] })
        assert.deepStrictEqual(sent.sampling_params, {
          max_tokens: 4,
          seed: 11,
          stop: [2],
          temperature: 1,
          top_k: -1,
          top_p: 1
        })
        engine.sample = { tokens: [7], stop_reason: "length" }
        const sampling = { temperature: 1, maxTokens: 1 }
        const error = yield* Effect.result(sampler.generate({ promptTokenIds: [1], sampling }))
        assert.isTrue(Result.isFailure(error) && error.failure.reason._tag === "NoTokenIds")
      })))
})

describe("TinkerLoss", () => {
  it("maps nll, ppo and cispo, and refuses what the API cannot express, by name", () => {
    assert.deepStrictEqual(TinkerLoss.lossFnOf(Loss.sft), { lossFn: "cross_entropy" })
    assert.deepStrictEqual(TinkerLoss.lossFnOf(Loss.grpo), {
      lossFn: "ppo",
      lossFnConfig: { clip_low_threshold: 0.8, clip_high_threshold: 1.2 }
    })
    assert.strictEqual((TinkerLoss.lossFnOf(Loss.cispo) as any).lossFn, "cispo")
    assert.strictEqual((TinkerLoss.lossFnOf(Loss.ppo) as any).refused, TinkerLoss.reasons.dualClip)
    assert.strictEqual((TinkerLoss.lossFnOf(Loss.gspo) as any).refused, TinkerLoss.reasons.gspo)
    assert.strictEqual((TinkerLoss.lossFnOf(Loss.value) as any).refused, TinkerLoss.reasons.critic)
    assert.strictEqual((TinkerLoss.lossFnOf({ ...Loss.grpo, klCoef: 0.1 }) as any).refused, TinkerLoss.reasons.kl)
    const refused = (config: Loss.Config) => (TinkerLoss.lossFnOf(config) as { refused: string }).refused
    assert.strictEqual(refused({ ...Loss.grpo, entropyCoef: 0.01 }), TinkerLoss.reasons.entropy)
    assert.strictEqual(refused({ ...Loss.grpo, tisCap: 2 }), TinkerLoss.reasons.tis)
    assert.strictEqual(refused({ ...Loss.grpo, temperature: 0.7 }), TinkerLoss.reasons.temperature)
  })

  const minimal = {
    output: "runs/x",
    model: { path: "model", preset: "tiny" },
    data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
    task: "calculator",
    algorithm: { steps: 10 },
    learner: { backend: "tinker", tinker: { baseUrl: "http://127.0.0.1:9/", baseModel: "tiny", loraRank: 8 } }
  }
  const issuesOf = (input: unknown) =>
    Effect.map(Effect.result(TrainConfig.decode(input)), (r) => (Result.isFailure(r) ? r.failure.issues : []))

  it.effect("a Tinker run's config decodes; what the engine cannot train is an issue naming key and reason", () =>
    Effect.gen(function*() {
      const config = yield* TrainConfig.decode(minimal)
      assert.strictEqual(config.learner.tinker?.apiKeyEnv, "TINKER_API_KEY")
      const gae = yield* issuesOf({ ...minimal, algorithm: { steps: 10, advantage: "gae" } })
      const refusal = `algorithm.advantage: refused with learner.backend "tinker": ${TinkerLoss.reasons.critic}`
      assert.include(gae.join("\n"), refusal)
      const kl = yield* issuesOf({ ...minimal, algorithm: { steps: 10, klCoef: 0.05, policyLoss: "gspo" } })
      assert.strictEqual(kl.length, 2)
      assert.match(kl.join("\n"), /algorithm\.klCoef: .*KL term/)
      assert.match(kl.join("\n"), /algorithm\.policyLoss: .*per sequence/)
      // Async with stale samples turns PPO's dual clip on by default: refused until it is set off.
      const stale = yield* issuesOf({ ...minimal, mode: "async", maxStaleness: 1 })
      assert.match(stale.join("\n"), /algorithm\.dualClip: .*"off"/)
      const off = { ...minimal, mode: "async", maxStaleness: 1, algorithm: { steps: 10, dualClip: "off" } }
      assert.deepStrictEqual(yield* issuesOf(off), [])
      const noSection = yield* issuesOf({ ...minimal, learner: { backend: "tinker" } })
      assert.match(noSection.join("\n"), /learner\.tinker: .*baseUrl and baseModel/)
      const stray = yield* issuesOf({ ...minimal, learner: { tinker: minimal.learner.tinker } })
      assert.match(stray.join("\n"), /learner\.tinker: only read with learner\.backend "tinker"/)
      const tinker = { ...minimal.learner.tinker, apiKeyEnv: "tml-abc key" }
      const key = yield* issuesOf({ ...minimal, learner: { ...minimal.learner, tinker } })
      assert.match(key.join("\n"), /learner\.tinker\.apiKeyEnv/)
      // engine.servers: a LoRA model's adapters are loaded there; a full-weights model's weights are not pushed.
      const servers = { engine: { servers: ["http://127.0.0.1:8000/v1"] } }
      assert.deepStrictEqual(yield* issuesOf({ ...minimal, ...servers }), [])
      const { loraRank: _, ...full } = minimal.learner.tinker
      const refusedFull = yield* issuesOf({ ...minimal, ...servers, learner: { ...minimal.learner, tinker: full } })
      assert.deepStrictEqual(refusedFull, [
        `engine.servers: refused with learner.backend "tinker": ${TinkerLoss.reasons.servers}`
      ])
    }))
})
