/**
 * A `GradientBackend` on a Tinker-API engine (`learner.backend: "tinker"`): hosted Tinker, SkyRL's Tinker backend,
 * Twinkle, or `agentfly trainer`. The learner packs, weighs and advantages its micro-batches as for a local step; each
 * micro-batch crosses as datums (`src/tinker/Datums.ts`: inputs, target tokens, the sampling — or recomputed old —
 * logprobs, per-token advantages, the aggregation weights as `weights`) to `forward_backward` with the loss of
 * `TinkerLoss.lossFnOf`, and `optimStep` is `optim_step` with the run's AdamW settings and the schedule's learning
 * rate. Every call goes through `TinkerClient` (retries, idempotency keys, futures).
 *
 * - **The weights stay on the engine.** `weights` fails (`Remote`): a policy version is `save_weights_for_sampler`
 *   ({@link TinkerTrainer} `saveForSampler`) and sampling goes through `asample` (`TinkerSampler`). The fingerprint
 *   journaled after each step names the training lineage and its optimiser step, not the weights' bytes.
 * - **Checkpoints** are `save_weights` (the engine's training state, weights and AdamW moments): `save(dir)` writes
 *   `tinker.json` into `dir` with the state's `tinker://` path, the lineage and the step; `load(dir)` starts a new
 *   model on the engine from that state (`load_weights` with the optimiser), so a run killed with `kill -9` resumes
 *   from the engine's state of its last checkpoint.
 * - **Statistics** (clip fractions, approximate KL) are computed here from the logprobs the engine returns for the
 *   targets, with `Loss`'s per-token functions, as a local step computes them; entropy is not available (0).
 * - `discard` has no counterpart in the API: gradients a failed step accumulated on the engine stay there until the
 *   next `optim_step` (said once, as a warning).
 *
 * @since 0.1.0
 */
import { Duration, Effect, FileSystem, Schema, Scope } from "effect"
import { createHash } from "node:crypto"
import * as GradientBackend from "../GradientBackend.ts"
import * as Loss from "../Loss.ts"
import * as LrSchedule from "../LrSchedule.ts"
import type * as Optimizer from "../Optimizer.ts"
import type * as Packing from "../Packing.ts"
import * as Datums from "../tinker/Datums.ts"
import * as Tinker from "../tinker/Types.ts"
import { TinkerClient as TinkerClientService } from "./TinkerClient.ts"
import type { TinkerClient, TinkerError } from "./TinkerClient.ts"
import * as TinkerLoss from "./TinkerLoss.ts"

// ===== Models =====

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The engine's base model name (`create_model`'s `base_model`). */
  readonly baseModel: string
  /** LoRA rank; absent: no `lora_config` (full weights, where the engine offers them). */
  readonly loraRank?: number | undefined
  /** Seed of the adapter's initialisation (`lora_config.seed`), for runs that repeat. */
  readonly seed?: number | undefined
  readonly loss: Loss.Config
  readonly optimizer: Optimizer.Config
  readonly schedule: LrSchedule.Config
  /** Free-form metadata for the engine's listing of runs. */
  readonly metadata?: Readonly<Record<string, string>> | undefined
}

/**
 * A `GradientBackend` on a Tinker engine, with what only it offers.
 *
 * @category models
 * @since 0.1.0
 */
export type TinkerTrainer = GradientBackend.GradientBackend["Service"] & {
  /** Saves the training state (weights and optimiser) under `name`: its `tinker://` path, for `from`. */
  readonly saveState: (name: string) => Effect.Effect<string, GradientBackend.GradientBackendError>
  /** Saves the current weights for sampling under `name`: the `tinker://` path `asample` takes. */
  readonly saveForSampler: (name: string) => Effect.Effect<string, GradientBackend.GradientBackendError>
  /** The training lineage and optimiser step, hashed: journaled after each step, restored by `load`. */
  readonly fingerprint: Effect.Effect<string>
  /** The engine's id of the model trained now. */
  readonly modelId: Effect.Effect<string>
}

/**
 * What a checkpoint directory holds for a Tinker learner (`tinker.json`).
 *
 * @category models
 * @since 0.1.0
 */
export const CheckpointFile = Schema.Struct({
  /** The engine's training state (`save_weights`' `tinker://` path). */
  statePath: Schema.String,
  baseModel: Schema.String,
  /** The model id that started the lineage (the run's first), for the fingerprint. */
  lineage: Schema.String,
  step: Schema.Int,
  policyVersion: Schema.Int,
  rngState: Schema.Array(Schema.Number)
})
export type CheckpointFile = typeof CheckpointFile.Type

/** The file of a checkpoint directory that names the engine's state. */
export const checkpointFileName = "tinker.json"

// ===== State =====

interface State {
  readonly client: TinkerClient["Service"]
  readonly fs: FileSystem.FileSystem
  readonly options: Options
  readonly mapping: { readonly lossFn: Datums.Supported; readonly lossFnConfig?: Record<string, number> | undefined }
  readonly sessionId: string
  /** Models made in this session (`model_seq_id`). */
  models: number
  modelId: string
  /** Requests to the current model (`seq_id`: 1 after `create_model`). */
  seq: number
  step: number
  lineage: string
  /** `forward_backward` calls since the last `optim_step`. */
  pending: number
  warned: boolean
}

const fail = (message: string) => GradientBackend.gradientBackendError("Remote", message)

/** A client failure as the learner's: unreachable engines are `Unavailable`, the rest `Remote`. */
const fromTinker = (e: TinkerError): GradientBackend.GradientBackendError => {
  const tag = e.reason._tag
  return tag === "ConnectionLost" || tag === "FutureTimedOut" || tag === "ServerError"
    ? GradientBackend.gradientBackendError("Unavailable", `Tinker ${e.message}`, { cause: e })
    : GradientBackend.gradientBackendError("Remote", `Tinker ${e.message}`)
}

const nextSeq = (s: State) => ++s.seq

// ===== Models on the engine =====

/** A new model on the engine (`create_model`): its id. */
const createModel = Effect.fnUntraced(function*(s: State) {
  const { options } = s
  const created = yield* s.client.submit("create_model", Tinker.CreateModelRequest, {
    session_id: s.sessionId,
    model_seq_id: s.models++,
    base_model: options.baseModel,
    ...(options.metadata === undefined ? {} : { user_metadata: options.metadata }),
    ...(options.loraRank === undefined ? {} : {
      lora_config: {
        rank: options.loraRank,
        ...(options.seed === undefined ? {} : { seed: options.seed }),
        train_unembed: true,
        train_mlp: true,
        train_attn: true
      }
    }),
    type: "create_model"
  }, Tinker.CreateModelResponse)
  s.modelId = created.model_id
  s.seq = 0
  s.step = 0
  s.pending = 0
})

/** A new model from a saved training state, with (`optimizer`) or without its AdamW moments. */
const modelFrom = Effect.fnUntraced(function*(s: State, path: string, optimizer: boolean) {
  yield* createModel(s)
  yield* s.client.submit("load_weights", Tinker.LoadWeightsRequest, {
    model_id: s.modelId,
    seq_id: nextSeq(s),
    path,
    optimizer,
    type: "load_weights"
  }, Tinker.LoadWeightsResponse)
})

// ===== Passes =====

/** The datums of `batch` for the mapped loss, or the mapping's refusal as `BadBatch`. */
const datumsOf = (batch: Packing.MicroBatch, lossFn: Datums.Supported) => {
  const data = Datums.fromMicroBatch(batch, lossFn)
  return Datums.isRefusal(data)
    ? Effect.fail(GradientBackend.gradientBackendError("BadBatch", `no Tinker datum form: ${data.refused}`))
    : Effect.succeed(data)
}

/** `[batch × length]` target logprobs from each datum's `loss_fn_outputs.logprobs`. */
const logprobsOf = (batch: Packing.MicroBatch, out: Tinker.ForwardBackwardOutput) => {
  const result = new Float32Array(batch.batch * batch.length)
  if (out.loss_fn_outputs.length !== batch.batch) {
    return Effect.fail(fail(`the engine answered ${out.loss_fn_outputs.length} outputs for ${batch.batch} datums`))
  }
  for (let r = 0; r < batch.batch; r++) {
    const lp = out.loss_fn_outputs[r]!["logprobs"]
    if (lp === undefined || lp.data.length > batch.length) {
      return Effect.fail(fail(`the engine's output ${r} has no logprobs for its tokens`))
    }
    result.set(lp.data, r * batch.length)
  }
  return Effect.succeed(result)
}

/** The micro-batch's loss and statistics from the targets' logprobs, as the local graph reports them. */
const resultOf = (
  s: State,
  batch: Packing.MicroBatch,
  tokenLogprobs: Float32Array,
  metrics: Readonly<Record<string, number>>
): GradientBackend.MicroBatchResult => {
  const config = s.options.loss
  let loss = 0, tokens = 0, clipped = 0, clippedLower = 0, approxKl = 0
  for (let i = 0; i < batch.batch * batch.length; i++) {
    if (batch.mask[i] === 0) continue
    const logprob = tokenLogprobs[i]!
    tokens++
    if (config.policyLoss === "nll") {
      loss += batch.weights[i]! * -logprob
      continue
    }
    const old = (batch.oldLogprobs ?? batch.samplerLogprobs)[i]!
    const token = config.policyLoss === "cispo"
      ? { ...Loss.cispoToken(logprob, old, batch.advantages[i]!, config), clippedLower: false }
      : Loss.ppoToken(logprob, old, batch.advantages[i]!, config)
    loss += batch.weights[i]! * token.loss
    clipped += token.clipped ? 1 : 0
    clippedLower += token.clippedLower ? 1 : 0
    approxKl += old - Math.min(Math.max(logprob, old - 20), old + 20)
  }
  // The engine's own sum where it reports one (SkyRL, ours: `loss:sum`).
  const reported = metrics["loss:sum"]
  return {
    loss: reported ?? loss,
    tokenLogprobs,
    tokens,
    clipped,
    clippedLower,
    approxKl,
    entropy: 0,
    kl: 0
  }
}

const forwardBackward = Effect.fnUntraced(function*(s: State, batch: Packing.MicroBatch) {
  const data = yield* datumsOf(batch, s.mapping.lossFn)
  const out = yield* s.client.submit("forward_backward", Tinker.ForwardBackwardRequest, {
    model_id: s.modelId,
    seq_id: nextSeq(s),
    forward_backward_input: {
      data,
      loss_fn: s.mapping.lossFn,
      ...(s.mapping.lossFnConfig === undefined ? {} : { loss_fn_config: s.mapping.lossFnConfig })
    }
  }, Tinker.ForwardBackwardOutput).pipe(Effect.mapError(fromTinker))
  s.pending++
  const tokenLogprobs = yield* logprobsOf(batch, out)
  // A non-finite loss is returned as a local pass returns it: the optimiser step that follows is the one skipped.
  return resultOf(s, batch, tokenLogprobs, out.metrics)
})

const logprobs = Effect.fnUntraced(function*(s: State, batch: Packing.MicroBatch) {
  // Forward only: the cross-entropy datums carry the targets, and nothing accumulates.
  const data = yield* datumsOf(batch, "cross_entropy")
  const out = yield* s.client.submit("forward", Tinker.ForwardRequest, {
    model_id: s.modelId,
    seq_id: nextSeq(s),
    forward_input: { data, loss_fn: "cross_entropy" }
  }, Tinker.ForwardBackwardOutput).pipe(Effect.mapError(fromTinker))
  return yield* logprobsOf(batch, out)
})

/** The gradient norm the engine reports, under the names SkyRL and ours use; NaN when it reports none. */
const gradNormOf = (metrics: Readonly<Record<string, number>> | undefined) =>
  metrics?.["grad_norm"] ?? metrics?.["grad_norm:mean"] ?? metrics?.["optimizer/grad_norm"] ?? Number.NaN

/**
 * An `optim_step` the engine refused because the gradients were not finite and it skipped the update (our server says
 * so as the local learner does): the learner goes on with the next mini-batch, as after a local skipped step.
 */
const skipped = (e: TinkerError) =>
  e.reason._tag === "FutureFailed" && /gradient norm is (NaN|-?Infinity)|non-finite gradient/i.test(e.reason.message)

const optimStep = Effect.fnUntraced(function*(s: State) {
  if (s.pending === 0) {
    return yield* GradientBackend.gradientBackendError("NothingAccumulated", "optim_step without forward_backward")
  }
  const { optimizer, schedule } = s.options
  const lr = LrSchedule.at(schedule, s.step)
  const out = yield* s.client.submit("optim_step", Tinker.OptimStepRequest, {
    model_id: s.modelId,
    seq_id: nextSeq(s),
    adam_params: {
      learning_rate: lr,
      beta1: optimizer.beta1,
      beta2: optimizer.beta2,
      eps: optimizer.eps,
      weight_decay: optimizer.weightDecay,
      grad_clip_norm: optimizer.maxGradNorm ?? 0
    },
    type: "optim_step"
  }, Tinker.OptimStepResponse).pipe(
    Effect.ensuring(Effect.sync(() => (s.pending = 0))),
    Effect.mapError((e) =>
      skipped(e) ? GradientBackend.gradientBackendError("NonFiniteGradient", e.message) : fromTinker(e)
    )
  )
  s.step++
  return { step: s.step, gradNorm: gradNormOf(out.metrics), lr }
})

const discard = (s: State) =>
  Effect.suspend(() => {
    if (s.pending === 0 || s.warned) return Effect.void
    s.warned = true
    return Effect.logWarning(
      "Tinker: the API cannot clear accumulated gradients; those of the abandoned step stay on the engine until " +
        "the next optim_step"
    )
  })

const fingerprint = (s: State) =>
  Effect.sync(() => createHash("sha256").update(`tinker:${s.lineage}:${s.step}`).digest("hex").slice(0, 16))

// ===== Checkpoints and versions =====

const saveForSampler = Effect.fnUntraced(function*(s: State, name: string) {
  const saved = yield* s.client.submit("save_weights_for_sampler", Tinker.SaveWeightsForSamplerRequest, {
    model_id: s.modelId,
    seq_id: nextSeq(s),
    path: name,
    type: "save_weights_for_sampler"
  }, Tinker.SaveWeightsForSamplerResponse).pipe(Effect.mapError(fromTinker))
  return saved.path
})

const encodeFile = Schema.encodeSync(Schema.fromJsonString(CheckpointFile))
const decodeFile = Schema.decodeUnknownEffect(Schema.fromJsonString(CheckpointFile))

const saveState = (s: State, name: string) =>
  s.client.submit("save_weights", Tinker.SaveWeightsRequest, {
    model_id: s.modelId,
    seq_id: nextSeq(s),
    path: name,
    // Saving the same name again (a retried checkpoint) replaces it.
    overwrite: true,
    type: "save_weights"
  }, Tinker.SaveWeightsResponse).pipe(Effect.map((saved) => saved.path), Effect.mapError(fromTinker))

const save = Effect.fnUntraced(function*(s: State, dir: string, meta: GradientBackend.CheckpointMeta) {
  const fs = s.fs
  // One name per lineage and step.
  const statePath = yield* saveState(s, `${s.lineage.replace(/[^A-Za-z0-9_-]/g, "_")}-step-${s.step}`)
  const file: CheckpointFile = {
    statePath,
    baseModel: s.options.baseModel,
    lineage: s.lineage,
    step: s.step,
    policyVersion: meta.policyVersion,
    rngState: [...meta.rngState]
  }
  const io = (e: { message: string }) => GradientBackend.gradientBackendError("Checkpoint", `${dir}: ${e.message}`)
  yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(io))
  yield* fs.writeFileString(`${dir}/${checkpointFileName}`, encodeFile(file)).pipe(Effect.mapError(io))
})

const load = Effect.fnUntraced(function*(s: State, dir: string) {
  const path = `${dir}/${checkpointFileName}`
  const text = yield* s.fs.readFileString(path).pipe(
    Effect.mapError((e) => GradientBackend.gradientBackendError("Checkpoint", `${path}: ${e.message}`))
  )
  const file = yield* decodeFile(text).pipe(
    Effect.mapError((e) => GradientBackend.gradientBackendError("Checkpoint", `${path}: ${e.message}`))
  )
  if (file.baseModel !== s.options.baseModel) {
    return yield* GradientBackend.gradientBackendError(
      "Checkpoint",
      `${path} trained ${file.baseModel}, not learner.tinker.baseModel ${s.options.baseModel}`
    )
  }
  yield* modelFrom(s, file.statePath, true).pipe(Effect.mapError(fromTinker))
  s.lineage = file.lineage
  s.step = file.step
  return { policyVersion: file.policyVersion, rngState: file.rngState }
})

// ===== Constructors =====

/** How often the session says it is alive (the SDK's heartbeat keeps an idle session from expiring). */
const heartbeatEvery = Duration.seconds(10)

/**
 * A trainer on a Tinker engine: a session, and a model on `options.baseModel` — new, or from the training state at
 * `from.path` (`from.optimizer`: with its AdamW moments; without them for a fresh optimiser, as the RL trainer
 * starts from the warm-up's weights). Closing the scope stops the session's heartbeat.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("TinkerTrainer.make")(function*(
  options: Options & { readonly from?: { readonly path: string; readonly optimizer: boolean } | undefined }
): Effect.fn.Return<
  TinkerTrainer,
  GradientBackend.GradientBackendError,
  TinkerClient | FileSystem.FileSystem | Scope.Scope
> {
  const mapping = TinkerLoss.lossFnOf(options.loss)
  if ("refused" in mapping) {
    return yield* GradientBackend.gradientBackendError("BadBatch", `no Tinker loss for this run: ${mapping.refused}`)
  }
  const client = yield* TinkerClientService
  const session = yield* client.call("create_session", Tinker.CreateSessionRequest, {
    tags: ["agentfly"],
    sdk_version: `agentfly-${Tinker.sdk.version}`,
    type: "create_session"
  }, Tinker.CreateSessionResponse).pipe(Effect.mapError(fromTinker))
  const s: State = {
    client,
    fs: yield* FileSystem.FileSystem,
    options,
    mapping,
    sessionId: session.session_id,
    models: 0,
    modelId: "",
    seq: 0,
    step: 0,
    lineage: "",
    pending: 0,
    warned: false
  }
  yield* (options.from === undefined ? createModel(s) : modelFrom(s, options.from.path, options.from.optimizer)).pipe(
    Effect.mapError(fromTinker)
  )
  s.lineage = s.modelId
  const heartbeat = client.call("session_heartbeat", Tinker.SessionHeartbeatRequest, {
    session_id: s.sessionId,
    type: "session_heartbeat"
  }, Tinker.SessionHeartbeatResponse)
  yield* Effect.forkScoped(Effect.ignore(heartbeat).pipe(Effect.delay(heartbeatEvery), Effect.forever))
  return {
    forwardBackward: (batch) => forwardBackward(s, batch),
    logprobs: (batch) => logprobs(s, batch),
    optimStep: optimStep(s),
    discard: discard(s),
    weights: Effect.fail(fail(
      "a Tinker engine keeps its weights: versions are published with save_weights_for_sampler and sampled there"
    )),
    step: Effect.sync(() => s.step),
    save: (dir, meta) => save(s, dir, meta),
    load: (dir) => load(s, dir),
    saveState: (name) => saveState(s, name),
    saveForSampler: (name) => saveForSampler(s, name),
    fingerprint: fingerprint(s),
    modelId: Effect.sync(() => s.modelId)
  }
})
