/**
 * The models a Tinker server trains: each is a learner (`OnnxTrainer`, full weights or a LoRA adapter on a base
 * model the server was started with) and, once weights were saved for sampling, a policy engine that samples them.
 * The operations here are the futures' work, one call at a time per model (`TinkerServer.ts` queues them); each
 * answers the result's JSON as the Schemas encode it, or a {@link Failed} with the API's error category.
 *
 * - **Losses.** Our training graph is built for one loss configuration (`Datums.lossConfig`). A `forward_backward`
 *   with another one moves the learner's state (weights and AdamW moments, through a checkpoint in a temporary
 *   directory) into a learner built for it; mixing two losses inside one optimiser step is refused.
 * - **Optimiser.** `optim_step`'s `AdamParams` apply to that step: the learner reads its AdamW settings and a constant
 *   learning rate from a record each step updates (`grad_clip_norm` 0 = no clipping). Our weight decay skips norms and
 *   biases (`Optimizer.defaultNoDecay`).
 * - **Checkpoints.** `save_weights` writes weights and optimiser state under `checkpoints/MODEL/NAME` of the state
 *   directory, named `tinker://MODEL/weights/NAME`; `load_weights` reads one (with or without its optimiser state).
 * - **Sampling.** `save_weights_for_sampler` publishes the weights (merged with the base for LoRA) to the model's
 *   engine as the next policy version, `tinker://MODEL/sampler_weights/NAME`; `asample` samples the newest one (an
 *   older path is refused: an engine holds one version for new requests).
 *
 * @since 0.1.0
 */
import { Effect, Exit, FileSystem, Schema, Scope } from "effect"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as GradientBackend from "../../src/GradientBackend.ts"
import * as Loss from "../../src/Loss.ts"
import * as Lora from "../../src/Lora.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import type * as ModelConfig from "../../src/model/ModelConfig.ts"
import type * as ModelFolder from "../../src/ModelFolder.ts"
import * as Optimizer from "../../src/Optimizer.ts"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as Datums from "../../src/tinker/Datums.ts"
import type { Sampler } from "../../src/Sampler.ts"
import * as Types from "../../src/tinker/Types.ts"
import * as LocalPolicy from "../LocalPolicy.ts"
import * as PolicyEngine from "../PolicyEngine.ts"

// ===== Models =====

/**
 * A base model the server offers, by the name `create_model` gives.
 *
 * @category models
 * @since 0.1.0
 */
export interface Base {
  readonly name: string
  readonly config: ModelConfig.ModelConfig
  readonly weights: GradientBackend.Weights
}

/**
 * A model folder as a base model, by its name.
 *
 * @category constructors
 * @since 0.1.0
 */
export const baseOf = (name: string, folder: ModelFolder.ModelFolder): Base => ({
  name,
  config: folder.config,
  weights: folder.weights
})

/**
 * A future that failed: the API's `RequestFailedResponse`.
 *
 * @category models
 * @since 0.1.0
 */
export type Failed = Types.RequestFailedResponse

/**
 * @category constructors
 * @since 0.1.0
 */
export const failed = (category: Types.RequestErrorCategory, error: string): Failed => ({ error, category })

/**
 * A model being trained.
 *
 * @category models
 * @since 0.1.0
 */
export interface Hosted {
  readonly id: string
  readonly base: Base
  /** Absent: full weights. */
  readonly lora: Lora.Config | undefined
  readonly model: OnnxTrainer.Model
  /** The model's life: its learners, engine and temporary directories. */
  readonly scope: Scope.Closeable
  readonly checkpoints: string
  /** The learner's data-parallel threads (`OnnxTrainer.Options.workers`). */
  readonly workers: number
  learner: { readonly trainer: GradientBackend.GradientBackend["Service"]; readonly scope: Scope.Closeable }
  /** The loss configuration the learner's graph was built for, as JSON. */
  lossKey: string
  /** `forward_backward`s since the last optimiser step. */
  pending: number
  /** What the learner reads at each optimiser step. */
  readonly live: { optimizer: Optimizer.Config; lr: number }
  engine: PolicyEngine.PolicyEngine["Service"] | undefined
  /** The engine behind `LocalPolicy.prefillAlone`: what `asample` samples depends on its own request only. */
  sampler: Sampler["Service"] | undefined
  /** Sampler paths by policy version (the newest one last). */
  readonly samplerPaths: Map<string, number>
  samplerVersion: number
}

/** `tinker://MODEL/KIND/NAME`. */
const pathPattern = /^tinker:\/\/([A-Za-z0-9._-]+)\/(weights|sampler_weights)\/([A-Za-z0-9._-]+)$/

/**
 * The parts of a `tinker://` path, or undefined.
 *
 * @category constructors
 * @since 0.1.0
 */
export const parsePath = (path: string) => {
  const m = pathPattern.exec(path)
  return m === null ? undefined : { model: m[1]!, kind: m[2] as "weights" | "sampler_weights", name: m[3]! }
}

const namePattern = /^[A-Za-z0-9._-]{1,128}$/

/** Tinker's LoRA (`lora_config`) as ours: alpha 32 (SkyRL's, after the Tinker blog), targets by layer kind. */
export const loraOf = (config: Types.LoraConfig | undefined): Lora.Config | Failed | undefined => {
  if (config === undefined || config.rank === 0) return undefined
  const targets = [
    ...(config.train_attn ? ["q_proj", "k_proj", "v_proj", "o_proj"] : []),
    ...(config.train_mlp ? ["gate_proj", "up_proj", "down_proj"] : [])
  ]
  if (config.rank < 0) return failed("user", `lora_config.rank must be at least 0, got ${config.rank}`)
  if (targets.length === 0) return failed("user", "lora_config trains neither attention nor MLP layers")
  return { rank: config.rank, alpha: 32, targets, ...(config.seed === undefined ? {} : { seed: config.seed }) }
}

const categoryOf = (e: GradientBackend.GradientBackendError): Types.RequestErrorCategory =>
  e.reason._tag === "BadBatch" || e.reason._tag === "NothingAccumulated" || e.reason._tag === "Checkpoint" ?
    "user" :
    "server"

const fromLearner = (e: GradientBackend.GradientBackendError): Failed => failed(categoryOf(e), e.message)

// ===== Learners =====

/** A learner for `h`'s model with loss `loss`, starting from `weights`, in a scope of its own. */
const makeLearner = (h: Omit<Hosted, "learner">, loss: Loss.Config, weights: GradientBackend.Weights) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const { live } = h
    const made = yield* OnnxTrainer.make({
      model: h.model,
      weights,
      loss,
      // Read by the learner at every optimiser step: optim_step's AdamParams are the step's settings.
      get optimizer() {
        return live.optimizer
      },
      get schedule() {
        return LrSchedule.constant(live.lr)
      },
      // As a local run: the same calls on the same threads give the same weights to the bit (a restart replays them).
      workers: h.workers,
      intraOpThreads: 1
    }).pipe(
      Scope.provide(scope),
      Effect.tapError(() => Scope.close(scope, Exit.void)),
      Effect.mapError(fromLearner)
    )
    return { trainer: made.trainer, scope }
  })

/**
 * Starts model `id` on `base` (a LoRA adapter when `lora` is given).
 *
 * @category constructors
 * @since 0.1.0
 */
export const create = Effect.fnUntraced(function*(
  id: string,
  base: Base,
  lora: Lora.Config | undefined,
  where: { readonly checkpoints: string; readonly workers: number }
) {
  const { config, weights } = base
  const bad = lora === undefined ? undefined : Lora.validate(lora, config)
  if (bad !== undefined) return yield* Effect.fail(failed("user", bad.message))
  const model = lora === undefined ? OnnxTrainer.qwen2(config) : OnnxTrainer.qwen2Lora(config, lora, weights, base.name)
  const loss = Datums.lossConfig("cross_entropy") as Loss.Config
  const partial = {
    id,
    base,
    lora,
    model,
    scope: yield* Scope.make(),
    checkpoints: where.checkpoints,
    workers: where.workers,
    lossKey: JSON.stringify(loss),
    pending: 0,
    live: { optimizer: { beta1: 0.9, beta2: 0.95, eps: 1e-12, weightDecay: 0 }, lr: 0 },
    engine: undefined,
    sampler: undefined,
    samplerPaths: new Map<string, number>(),
    samplerVersion: 0
  }
  const learner = yield* makeLearner(partial, loss, lora === undefined ? weights : new Map())
  return { ...partial, learner } satisfies Hosted as Hosted
})

/**
 * Closes a model's learner and engine.
 *
 * @category constructors
 * @since 0.1.0
 */
export const close = (h: Hosted) =>
  Scope.close(h.learner.scope, Exit.void).pipe(Effect.andThen(Scope.close(h.scope, Exit.void)))

/** Moves the learner's weights and optimiser state into a new learner with `loss` (through a checkpoint). */
const switchLoss = (h: Hosted, loss: Loss.Config) =>
  Effect.scoped(Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const dir = yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-tinker-" }).pipe(
      Effect.mapError((e) => failed("server", `no temporary directory: ${e.message}`))
    )
    const old = h.learner
    yield* old.trainer.save(dir, { policyVersion: h.samplerVersion, rngState: [] }).pipe(Effect.mapError(fromLearner))
    const next = yield* makeLearner(h, loss, yield* Effect.mapError(old.trainer.weights, fromLearner))
    yield* next.trainer.load(dir).pipe(Effect.mapError(fromLearner))
    h.learner = next
    h.lossKey = JSON.stringify(loss)
    yield* Scope.close(old.scope, Exit.void)
  }))

/** Makes `h`'s learner one for `loss`. */
const useLoss = (h: Hosted, loss: Loss.Config) => {
  const key = JSON.stringify(loss)
  if (key === h.lossKey) return Effect.void
  if (h.pending > 0) {
    return Effect.fail(
      failed("user", "one optimizer step cannot mix loss functions or loss_fn_config: call optim_step first")
    )
  }
  return switchLoss(h, loss)
}

// ===== Training =====

const batchOf = (h: Hosted, input: Types.ForwardBackwardInput) => {
  const loss = Datums.lossConfig(input.loss_fn, input.loss_fn_config)
  if (Datums.isRefusal(loss)) return Effect.fail(failed("user", loss.refused))
  const mb = Datums.toMicroBatch(input.data, input.loss_fn as Datums.Supported, { vocabSize: h.model.vocabSize })
  if (Datums.isRefusal(mb)) return Effect.fail(failed("user", mb.refused))
  return Effect.succeed({ loss, mb })
}

const output = (
  input: Types.ForwardBackwardInput,
  length: number,
  tokenLogprobs: Float32Array,
  metrics: Record<string, number>
) =>
  Types.encodeJson(Types.ForwardBackwardOutput, {
    loss_fn_output_type: "ArrayRecord",
    loss_fn_outputs: Datums.outputs(input.data, length, tokenLogprobs),
    metrics
  })

/**
 * `forward_backward`: gradients of the batch's loss accumulate until `optim_step`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const forwardBackward = (h: Hosted, input: Types.ForwardBackwardInput) =>
  Effect.gen(function*() {
    const { loss, mb } = yield* batchOf(h, input)
    yield* useLoss(h, loss)
    const r = yield* h.learner.trainer.forwardBackward(mb).pipe(Effect.mapError(fromLearner))
    h.pending++
    return output(input, mb.length, r.tokenLogprobs, {
      "loss:sum": r.loss,
      "tokens:sum": r.tokens,
      "clipped:sum": r.clipped,
      "entropy:sum": r.entropy
    })
  })

/**
 * `forward`: the targets' logprobs under the current weights; nothing accumulates.
 *
 * @category combinators
 * @since 0.1.0
 */
export const forward = (h: Hosted, input: Types.ForwardBackwardInput) =>
  Effect.gen(function*() {
    const { mb } = yield* batchOf(h, input)
    const logprobs = yield* h.learner.trainer.logprobs(mb).pipe(Effect.mapError(fromLearner))
    return output(input, mb.length, logprobs, {})
  })

/**
 * `optim_step`: AdamW with `params` over the gradients accumulated since the last step.
 *
 * @category combinators
 * @since 0.1.0
 */
export const optimStep = (h: Hosted, params: Types.AdamParams) =>
  Effect.gen(function*() {
    h.live.optimizer = {
      beta1: params.beta1,
      beta2: params.beta2,
      eps: params.eps,
      weightDecay: params.weight_decay,
      ...(params.grad_clip_norm > 0 ? { maxGradNorm: params.grad_clip_norm } : {})
    }
    h.live.lr = params.learning_rate
    const r = yield* h.learner.trainer.optimStep.pipe(
      Effect.ensuring(Effect.sync(() => void (h.pending = 0))),
      Effect.mapError(fromLearner)
    )
    return Types.encodeJson(Types.OptimStepResponse, {
      metrics: { grad_norm: r.gradNorm, learning_rate: r.lr, step: r.step }
    })
  })

// ===== Checkpoints =====

const checkpointDir = (h: Hosted, model: string, name: string) => `${h.checkpoints}/${model}/${name}`

/**
 * `save_weights`: weights and optimiser state under `tinker://MODEL/weights/NAME`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const saveWeights = (h: Hosted, request: Types.SaveWeightsRequest, fallbackName: string) =>
  Effect.gen(function*() {
    const name = request.path ?? fallbackName
    if (!namePattern.test(name)) return yield* Effect.fail(failed("user", `path ${JSON.stringify(name)} is not a name`))
    const fs = yield* FileSystem.FileSystem
    const dir = checkpointDir(h, h.id, name)
    const exists = yield* fs.exists(`${dir}/trainer_state.json`).pipe(Effect.orElseSucceed(() => false))
    if (exists && !request.overwrite) {
      return yield* Effect.fail(failed("user", `tinker://${h.id}/weights/${name} exists (overwrite: false)`))
    }
    yield* h.learner.trainer.save(dir, { policyVersion: h.samplerVersion, rngState: [] }).pipe(
      Effect.mapError(fromLearner)
    )
    const path = `tinker://${h.id}/weights/${name}`
    return Types.encodeJson(Types.SaveWeightsResponse, { path, type: "save_weights" })
  })

/**
 * `load_weights`: a checkpoint's weights, and its optimiser state when `optimizer` (else AdamW starts afresh).
 *
 * @category combinators
 * @since 0.1.0
 */
export const loadWeights = (h: Hosted, request: Types.LoadWeightsRequest) =>
  Effect.gen(function*() {
    const parsed = parsePath(request.path)
    if (parsed === undefined || parsed.kind !== "weights") {
      return yield* Effect.fail(failed("user", `${request.path} is not a tinker://MODEL/weights/NAME path`))
    }
    const dir = checkpointDir(h, parsed.model, parsed.name)
    const fs = yield* FileSystem.FileSystem
    if (!(yield* fs.exists(`${dir}/trainer_state.json`).pipe(Effect.orElseSucceed(() => false)))) {
      return yield* Effect.fail(failed("user", `no checkpoint ${request.path} on this server`))
    }
    if (request.optimizer) {
      yield* h.learner.trainer.load(dir).pipe(Effect.mapError(fromLearner))
    } else {
      const loaded = yield* Checkpoint.load(dir, h.model.parameters).pipe(
        Effect.mapError((e) => failed("user", `${request.path}: ${e.message}`))
      )
      const old = h.learner
      h.learner = yield* makeLearner(h, JSON.parse(h.lossKey) as Loss.Config, loaded.weights)
      yield* Scope.close(old.scope, Exit.void)
    }
    h.pending = 0
    return Types.encodeJson(Types.LoadWeightsResponse, { path: request.path, model_id: h.id, type: "load_weights" })
  })

// ===== Snapshots =====

/** What a snapshot keeps beside the learner's checkpoint. */
const SnapshotMeta = Schema.Struct({
  lossKey: Schema.String,
  optimizer: Optimizer.Config,
  lr: Schema.Number,
  samplerVersion: Schema.Int,
  samplerPaths: Schema.Array(Schema.Tuple([Schema.String, Schema.Int]))
})

/**
 * Writes `h`'s state to `dir`: the learner's weights and AdamW state, its loss and optimiser settings, and its
 * sampler versions. Taken right after a publication with no gradients pending, so the weights are the newest sampler
 * weights too.
 *
 * @category combinators
 * @since 0.1.0
 */
export const snapshot = (h: Hosted, dir: string) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const checkpointMeta = { policyVersion: h.samplerVersion, rngState: [] }
    yield* h.learner.trainer.save(dir, checkpointMeta).pipe(Effect.mapError(fromLearner))
    const meta: typeof SnapshotMeta.Type = {
      lossKey: h.lossKey,
      optimizer: h.live.optimizer,
      lr: h.live.lr,
      samplerVersion: h.samplerVersion,
      samplerPaths: [...h.samplerPaths]
    }
    yield* fs.writeFileString(`${dir}/tinker.json`, JSON.stringify(meta)).pipe(
      Effect.mapError((e) => failed("server", `snapshot: ${e.message}`))
    )
  })

/**
 * Brings a freshly created `h` to the state {@link snapshot} wrote in `dir`, its newest sampler weights published.
 *
 * @category combinators
 * @since 0.1.0
 */
export const restore = (h: Hosted, dir: string) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const meta = yield* fs.readFileString(`${dir}/tinker.json`).pipe(
      Effect.flatMap(Schema.decodeUnknownEffect(Schema.fromJsonString(SnapshotMeta))),
      Effect.mapError((e) => failed("server", `snapshot ${dir}: ${e.message}`))
    )
    if (meta.lossKey !== h.lossKey) yield* switchLoss(h, JSON.parse(meta.lossKey) as Loss.Config)
    yield* h.learner.trainer.load(dir).pipe(Effect.mapError(fromLearner))
    h.live.optimizer = meta.optimizer
    h.live.lr = meta.lr
    h.pending = 0
    for (const [path, version] of meta.samplerPaths) h.samplerPaths.set(path, version)
    if (meta.samplerVersion > 0) yield* publish(h, meta.samplerVersion)
  })

// ===== Sampling =====

/**
 * The sequences an engine decodes together: the local engine's (`LocalPolicy`'s default), so that a run through the
 * API batches its rollouts as an in-process run does (which sequences share a decode step moves logprobs' last bits).
 */
const engineBatch = 64

/** The learner's weights (merged with the base for LoRA) as the engine's policy `version`. */
const publish = (h: Hosted, version: number) =>
  Effect.gen(function*() {
    const weights = yield* Effect.mapError(h.learner.trainer.weights, fromLearner)
    const { config } = h.base
    const full = h.lora === undefined ? weights : Lora.merge(config, h.lora, weights, weights)
    if (h.engine === undefined) {
      h.engine = yield* PolicyEngine.make({ config, weights: full, version, maxBatchSize: engineBatch }).pipe(
        Scope.provide(h.scope),
        Effect.mapError((e) => failed("server", e.message))
      )
      h.sampler = LocalPolicy.prefillAlone(h.engine)
    } else {
      yield* h.engine.updateWeights(version, full).pipe(Effect.mapError((e) => failed("server", e.message)))
    }
    h.samplerVersion = version
  })

/**
 * Where a LoRA model's sampler weights `name` keep their adapter (PEFT files and an empty `checkpoint_complete`,
 * what the SDK's archive holds): `checkpoints/MODEL/sampler_weights/NAME`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const adapterDir = (checkpoints: string, model: string, name: string) =>
  `${checkpoints}/${model}/sampler_weights/${name}`

/** Writes the learner's adapter as sampler weights `name`, for the archive route. */
const saveAdapter = (h: Hosted, lora: Lora.Config, name: string) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const weights = yield* Effect.mapError(h.learner.trainer.weights, fromLearner)
    const dir = adapterDir(h.checkpoints, h.id, name)
    const fail = (e: { readonly message: string }) => failed("server", `cannot write ${dir}: ${e.message}`)
    yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(fail))
    yield* fs.remove(`${dir}/checkpoint_complete`, { force: true }).pipe(Effect.mapError(fail))
    yield* Lora.save(dir, h.base.config, lora, Lora.adapterOf(weights), h.base.name).pipe(Effect.mapError(fail))
    yield* fs.writeFileString(`${dir}/checkpoint_complete`, "").pipe(Effect.mapError(fail))
  })

/**
 * `save_weights_for_sampler`: the current weights become the model's engine's next policy version.
 *
 * @category combinators
 * @since 0.1.0
 */
export const saveForSampler = (h: Hosted, request: Types.SaveWeightsForSamplerRequest) =>
  Effect.gen(function*() {
    const version = h.samplerVersion + 1
    const name = request.path ?? `sampler-${version}`
    if (!namePattern.test(name)) return yield* Effect.fail(failed("user", `path ${JSON.stringify(name)} is not a name`))
    yield* publish(h, version)
    if (h.lora !== undefined) yield* saveAdapter(h, h.lora, name)
    const path = `tinker://${h.id}/sampler_weights/${name}`
    h.samplerPaths.set(path, version)
    return Types.encodeJson(Types.SaveWeightsForSamplerResponseInternal, {
      path,
      ...(request.sampling_session_seq_id === undefined ? {} : { sampling_session_id: path }),
      type: "save_weights_for_sampler"
    })
  })

/**
 * The sampler (the engine behind `prefillAlone`) and policy version a sample request names through its model path
 * (or sampling session, which is a sampler path here).
 *
 * @category combinators
 * @since 0.1.0
 */
export const samplerOf = (h: Hosted, path: string) => {
  const version = h.samplerPaths.get(path)
  if (version === undefined || h.sampler === undefined) return failed("user", `no sampler weights ${path} here`)
  if (version !== h.samplerVersion) {
    return failed("user", `${path} is not the newest sampler weights of ${h.id}; this server samples the newest only`)
  }
  return { sampler: h.sampler, version }
}

/**
 * `asample` on `sampler`: `num_samples` sequences of token ids and logprobs. The sampler admits one prompt at a time
 * into its engine's prefill (`LocalPolicy.prefillAlone`), so that what a request samples is a function of the request
 * and the weights, not of which other requests arrived with it (a client in another process, or a run resumed after
 * `kill -9`, then samples the same bits).
 *
 * @category combinators
 * @since 0.1.0
 */
export const sample = (sampler: Sampler["Service"], request: Types.SampleRequest) =>
  Effect.gen(function*() {
    const prompt = Datums.tokensOf(request.prompt)
    if (Datums.isRefusal(prompt)) return yield* Effect.fail(failed("user", prompt.refused))
    const p = request.sampling_params
    if (p.max_tokens === undefined) return yield* Effect.fail(failed("user", "sampling_params.max_tokens is required"))
    if (typeof p.stop === "string" || (p.stop?.some((s) => typeof s === "string") ?? false)) {
      return yield* Effect.fail(failed("user", "stop strings are not supported here: give stop token ids"))
    }
    if (request.prompt_logprobs === true || request.topk_prompt_logprobs > 0) {
      return yield* Effect.fail(failed("user", "prompt logprobs are not supported here"))
    }
    const stop = (p.stop ?? []) as ReadonlyArray<number>
    const one = (i: number) =>
      sampler.generate({
        promptTokenIds: prompt,
        sampling: {
          temperature: p.temperature,
          topP: p.top_p,
          ...(p.top_k > 0 ? { topK: p.top_k } : {}),
          maxTokens: p.max_tokens!,
          ...(stop.length > 0 ? { stopTokenIds: stop } : {}),
          ...(p.seed === undefined ? {} : { seed: p.seed + i })
        }
      })
    const results = yield* Effect.forEach(Array.from({ length: request.num_samples }, (_, i) => i), one, {
      concurrency: "unbounded"
    }).pipe(Effect.mapError((e) => failed(e.isRetryable ? "server" : "user", e.message)))
    return Types.encodeJson(Types.SampleResponse, {
      sequences: results.map((r) => ({ stop_reason: r.finishReason, tokens: r.tokenIds, logprobs: r.logprobs })),
      type: "sample"
    })
  })

/**
 * A sampler of a base model's own weights (policy version 0; an engine in `scope` behind `prefillAlone`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const baseSampler = (base: Base, scope: Scope.Scope) =>
  PolicyEngine.make({ config: base.config, weights: base.weights, version: 0, maxBatchSize: engineBatch }).pipe(
    Scope.provide(scope),
    Effect.map(LocalPolicy.prefillAlone),
    Effect.mapError((e) => failed("server", e.message))
  )

/**
 * `get_info`'s answer for `h`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const info = (id: string, base: Base, lora: Lora.Config | undefined) =>
  Types.encodeJson(Types.GetInfoResponse, {
    type: "get_info",
    model_data: { arch: base.config.modelType, model_name: base.name },
    model_id: id,
    is_lora: lora !== undefined,
    ...(lora === undefined ? {} : { lora_rank: lora.rank }),
    model_name: base.name
  })
