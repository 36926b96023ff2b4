/**
 * The local learner and policy versions of a run (`Learner`, `PolicyVersions`) and its ambient `Sampler`: everything
 * in this process, on onnxruntime-node. Sampling runs on `PolicyEngine`s (KV cache, continuous batching):
 * `PolicyVersions.sampler(version)` builds one per rollout batch, evaluation or warm-up check from that published
 * version's weights, so that no two of them ever share an engine batch (what a batch samples then depends on its own
 * requests only; `internal/localVersions.ts`). RL steps are `Learner.update` over an `OnnxTrainer` built with the
 * run's loss and optimiser; the SFT warm-up uses its own `OnnxTrainer` with the NLL loss and the warm-up's learning
 * rate, whose weights seed the RL trainer (with a fresh optimiser) when the warm-up ends (`internal/learnerSlot.ts`).
 * With `engine.servers`, rollouts are sampled by those inference servers instead, and every published version is
 * pushed to them (`InferenceServers`); with `learner.url` the trainers run on a trainer server
 * (`internal/remoteLearner.ts`).
 *
 * The pieces are state records with top-level functions over them, each in its module: the published versions
 * (`localVersions`), the trainer slot and its weights taken once per change (`learnerSlot`), the KL term's reference
 * (`klReference`), the critic of `gae` (`valueCritic`). This module ties them into the two services.
 *
 * @since 0.1.0
 */
import { Context, Effect, FileSystem, Layer, Path, Scope } from "effect"
import * as Dataset from "../src/Dataset.ts"
import * as Lora from "../src/Lora.ts"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import type * as ModelFolder from "../src/ModelFolder.ts"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as OnnxTrainerVision from "../src/backends/OnnxTrainerVision.ts"
import type * as VisionTower from "../src/model/VisionTower.ts"
import * as Optimizer from "../src/Optimizer.ts"
import * as Packing from "../src/Packing.ts"
import * as GradientBackend from "../src/GradientBackend.ts"
import { Sampler } from "../src/Sampler.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import * as Trajectory from "../src/Trajectory.ts"
import * as TrajectoryBuilder from "../src/TrajectoryBuilder.ts"
import type * as PolicyEngine from "./PolicyEngine.ts"
import * as KlReference from "./internal/klReference.ts"
import * as LearnerSlot from "./internal/learnerSlot.ts"
import {
  checkpointError,
  engineWeightsOf,
  folderReleasable,
  learnerError,
  nonFinite,
  type Setup
} from "./internal/localSetup.ts"
import * as LocalVersions from "./internal/localVersions.ts"
import * as Teacher from "./internal/teacher.ts"
import * as RemoteLearner from "./internal/remoteLearner.ts"
import * as TinkerLearner from "./internal/tinkerLearner.ts"
import * as SequenceImages from "./internal/sequenceImages.ts"
import * as ValueCritic from "./internal/valueCritic.ts"
import * as Learner from "./Learner.ts"
import { PolicyVersions } from "./PolicyVersions.ts"
import { runError, type RunError } from "./RunError.ts"

/**
 * The dual clip of a run: the configured one, or in async mode with stale samples (`maxStaleness > 0`) and a `ppo`
 * loss, 3 (verl's default): the importance ratio of a stale sample is unbounded above, and for a negative advantage
 * PPO's clip does not bound it (tinker-cookbook PR #822 saw unclipped weights destabilise a run at staleness 3).
 * GSPO and CISPO bound their ratios themselves.
 */
const dualClipOf = (
  algorithm: TrainConfig.TrainConfig["algorithm"],
  run: { readonly mode: "sync" | "async"; readonly maxStaleness: number } | undefined
): number | undefined => {
  if (algorithm.dualClip === "off") return undefined
  if (algorithm.dualClip !== undefined) return algorithm.dualClip
  const stale = run !== undefined && run.mode === "async" && run.maxStaleness > 0
  return stale && (algorithm.policyLoss ?? "ppo") === "ppo" ? 3 : undefined
}

/**
 * The RL loss of a config (`run`: its mode and staleness, which choose the default dual clip).
 *
 * @category constructors
 * @since 0.1.0
 */
export const lossConfig = (
  algorithm: TrainConfig.TrainConfig["algorithm"],
  temperature = 1,
  run?: { readonly mode: "sync" | "async"; readonly maxStaleness: number }
): Loss.Config => ({
  ...Loss.grpo,
  ...(algorithm.policyLoss === undefined ? {} : { policyLoss: algorithm.policyLoss }),
  ...(dualClipOf(algorithm, run) === undefined ? {} : { dualClip: dualClipOf(algorithm, run)! }),
  aggregation: algorithm.aggregation,
  clipLow: algorithm.clipLow,
  clipHigh: algorithm.clipHigh,
  klCoef: algorithm.klCoef,
  entropyCoef: algorithm.entropyCoef,
  ...(algorithm.tisCap === undefined ? {} : { tisCap: algorithm.tisCap }),
  // The learner's logprobs must be those of the distribution the rollouts sampled from (greedy counts as 1).
  ...(temperature > 0 && temperature !== 1 ? { temperature } : {})
})

// ===== The local learner's state =====

/** The learner's state besides its trainer slot. */
interface Local {
  readonly setup: Setup
  readonly slot: LearnerSlot.Slot
  /** The local engines' or servers' versions; a Tinker run's are its engine's (`setup.tinker`). */
  readonly versions: LocalVersions.Versions | undefined
  readonly learnerOptions: Learner.Options
  /** Most token positions in one micro-batch: `algorithm.microBatchSize` rows of the context budget. */
  readonly tokenBudget: number
  /** The policy version of the learner's weights: the last published, or the loaded checkpoint's. */
  version: number
  /** Whether the learner's weights differ from the newest published version's (after any step, or a load). */
  dirty: boolean
  reference: KlReference.Reference | undefined
  critic: ValueCritic.Critic | undefined
}

/** The options of every RL step (`Learner.update`) but its reference and critic. */
const learnerOptionsOf = (setup: Setup, tokenBudget: number): Learner.Options => {
  const { algorithm, learner } = setup.config
  return {
    estimator: algorithm.advantage,
    ...(algorithm.gamma === undefined && algorithm.lambda === undefined ? {} : {
      advantage: {
        ...(algorithm.gamma === undefined ? {} : { gamma: algorithm.gamma }),
        ...(algorithm.lambda === undefined ? {} : { lambda: algorithm.lambda })
      }
    }),
    loss: setup.rlLoss,
    tokenBudget,
    maxLength: setup.folder.config.maxPositionEmbeddings,
    miniBatches: algorithm.miniBatches,
    epochs: algorithm.epochs,
    rowSteps: learner.rowSteps,
    // A Tinker datum is one whole row: shared prompts have no datum form (`Datums.fromMicroBatch`).
    sharePrefix: learner.sharePrefix && setup.tinker === undefined,
    ...(algorithm.klInReward === undefined ? {} : { klInReward: algorithm.klInReward }),
    ...(algorithm.overlong === undefined ? {} : { overlong: algorithm.overlong }),
    ...(algorithm.recomputeOldLogprobs === undefined ? {} : { recomputeOldLogprobs: algorithm.recomputeOldLogprobs })
  }
}

// ===== Learner =====

/** A step's outcome from the update's report: its figures, plus whether it applied and how many groups had signal. */
const outcomeOf = (report: Learner.UpdateResult, withSignal: number): Learner.Outcome => {
  const figures: Learner.Figures = {
    ...report.figures,
    "learner/applied": report.outcome === "applied" ? 1 : 0,
    ...(report.outcome === "critic_only" ? { "learner/critic_only": 1 } : {}),
    "learner/groups_with_signal": withSignal
  }
  if (report.outcome === "applied") return { _tag: "Applied", loss: figures["learner/loss"]!, figures }
  if (report.outcome === "critic_only") return { _tag: "CriticOnly", figures }
  return { _tag: "Skipped", why: "NoSignal", figures }
}

/** The ids of the folder tokenizer's vision tokens. */
const visionTokenIds = (folder: ModelFolder.ModelFolder): ReadonlySet<number> =>
  new Set(["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"].flatMap((token) => {
    const id = folder.tokenizer.tokenToId(token)
    return id === undefined ? [] : [id]
  }))

/** One RL step, or none when no group has a learning signal. */
const learn = (
  local: Local,
  step: number,
  all: ReadonlyArray<Trajectory.Group>
): Effect.Effect<Learner.Outcome, RunError> => {
  const { algorithm } = local.setup.config
  // Under a group-relative estimator a group whose rewards are all equal has zero advantages: no signal. A step
  // without any signal is skipped, because AdamW would still move every weight along its stale momentum (with
  // sparse early rewards that alone wrecks a freshly warmed-up policy). Otherwise every group goes to the
  // learner: the ones without signal cost no compute there but keep the step's size proportional to its signal.
  // KL in the reward makes equal outcomes differ (each chain pays its own divergence): every group has signal.
  // So does a teacher's reverse KL.
  const rewardsDecide = TrainConfig.isGroupRelative(algorithm.advantage) && (algorithm.klInReward ?? 0) === 0 &&
    algorithm.distillation === undefined
  const withSignal = rewardsDecide ? all.filter(Trajectory.rewardsDiffer).length : all.length
  if (withSignal === 0) {
    const figures = { "learner/applied": 0, "learner/groups_with_signal": 0 }
    return Effect.succeed({ _tag: "Skipped", why: "NoSignal", figures })
  }
  const { slot, reference, critic } = local
  const options: Learner.Options = {
    ...local.learnerOptions,
    ...(reference === undefined ? {} : { reference: reference.logprobs }),
    ...(critic === undefined ? {} : {
      critic,
      criticOnly: step <= TrainConfig.criticOf(local.setup.config).warmupSteps
    })
  }
  const { folder } = local.setup
  const vision = folder.vision?.vision
  // A vision model's sequences carry their images' pixels (decoded from the trajectories' image parts); one whose
  // policy sampled a vision token is masked.
  const groups = vision === undefined ? all : SequenceImages.maskStrayVisionTokens(all, visionTokenIds(folder))
  const update = vision === undefined ? Learner.update(all, options) : Effect.flatMap(
    SequenceImages.ofConversations(vision, groups.flatMap((g) => g.trajectories)),
    (pixels) => Learner.update(groups, { ...options, segmentImages: (segment) => pixels.get(segment) })
  )
  const changes = Effect.sync(() => local.versions !== undefined && LocalVersions.learnerChanges(local.versions))
  return Effect.andThen(changes, LearnerSlot.mutating(slot, update.pipe(
    Effect.provideService(GradientBackend.GradientBackend, slot.trainer)
  ))).pipe(
    Effect.tap(() => Effect.sync(() => (local.dirty = true))),
    Effect.mapError(learnerError),
    Effect.tap((report) =>
      report.outcome === "non_finite"
        ? Effect.fail(nonFinite(`step ${step}: the loss or the gradients of every mini-batch were not finite`))
        : LearnerSlot.finite(slot, `step ${step}`)
    ),
    Effect.map((report) => outcomeOf(report, withSignal))
  )
}

/** The packed sequences of demonstration conversations (a row without `messages` is its prompt). */
const sftSequences = (setup: Setup, rows: ReadonlyArray<Dataset.Row>) =>
  Effect.forEach(rows, (row) =>
    TrajectoryBuilder.fromConversation({
      tokenizer: setup.folder.tokenizer,
      template: setup.folder.template,
      messages: row.messages ?? Dataset.promptMessages(row, setup.config.agent.systemPrompt)
    }).pipe(
      Effect.flatMap((b) => sftImages(setup, b)),
      Effect.mapError((e) => runError("Learner", `demonstration line ${row.line}: ${e.message}`, e))
    )).pipe(Effect.map((xs) => xs.flat()))

/** A demonstration's sequences, each with its images' pixels on a vision model. */
const sftImages = (setup: Setup, built: SequenceImages.Conversation) => {
  const vision = setup.folder.vision?.vision
  const plain = (images?: ReadonlyMap<Trajectory.Segment, ReadonlyArray<VisionTower.Pixels>>) =>
    built.segments.map((segment) => SequenceImages.withImages(Packing.fromSegment(segment), images?.get(segment)))
  return vision === undefined
    ? Effect.succeed(plain())
    : Effect.map(SequenceImages.ofConversations(vision, [built]), plain)
}

/** One SFT step of the warm-up (whose first step starts its trainer); returns `warmup/...` figures. */
const sft = Effect.fn("LocalPolicy.sft")(function*(local: Local, step: number, rows: ReadonlyArray<Dataset.Row>) {
  const { slot } = local
  if (slot.phase !== "sft") yield* LearnerSlot.startSft(slot)
  const sequences = yield* sftSequences(local.setup, rows)
  const packed = yield* Packing.pack(sequences, {
    tokenBudget: local.tokenBudget,
    maxLength: local.setup.folder.config.maxPositionEmbeddings,
    aggregation: "token-mean"
  }).pipe(Effect.mapError(learnerError))
  const trainer = slot.trainer
  if (local.versions !== undefined) LocalVersions.learnerChanges(local.versions)
  const { loss, tokens, rowTokens, optim } = yield* LearnerSlot.mutating(slot, Effect.gen(function*() {
    let loss = 0
    let tokens = 0
    let rowTokens = 0
    for (const mb of packed.microBatches) {
      const r = yield* trainer.forwardBackward(mb).pipe(Effect.mapError(learnerError))
      loss += r.loss
      tokens += r.tokens
      rowTokens += Packing.computedTokens(mb)
    }
    if (!Number.isFinite(loss)) {
      yield* trainer.discard
      return yield* nonFinite(`warm-up step ${step}: the loss is ${loss}`)
    }
    const optim = yield* trainer.optimStep.pipe(Effect.mapError(learnerError))
    local.dirty = true
    return { loss, tokens, rowTokens, optim }
  }))
  yield* LearnerSlot.finite(slot, `warm-up step ${step}`)
  return {
    "warmup/loss": loss,
    "warmup/tokens": tokens,
    "warmup/grad_norm": optim.gradNorm,
    "warmup/lr": optim.lr,
    "perf/row_tokens": rowTokens
  }
})

/**
 * Saves the critic, then the policy's trainer (its state file, written last, marks the checkpoint complete), then the
 * reference.
 */
const save = Effect.fn("LocalPolicy.save")(function*(local: Local, dir: string) {
  if (local.critic !== undefined) yield* ValueCritic.save(local.critic, dir, local.version)
  yield* local.slot.trainer.save(dir, { policyVersion: local.version, rngState: [] }).pipe(
    Effect.mapError(checkpointError)
  )
  if (local.reference !== undefined) yield* KlReference.save(local.setup, local.reference, dir)
})

/** Loads a checkpoint: the policy's trainer, the reference the run started with, the critic. */
const load = Effect.fn("LocalPolicy.load")(
  function*(local: Local, dir: string) {
    const { slot, setup } = local
    if (local.versions !== undefined) LocalVersions.learnerChanges(local.versions)
    const meta = yield* LearnerSlot.mutating(slot, slot.trainer.load(dir)).pipe(Effect.mapError(checkpointError))
    if (KlReference.needed(setup.config.algorithm)) local.reference = yield* KlReference.load(setup, dir)
    if (setup.config.algorithm.advantage === "gae") {
      if (local.critic === undefined) local.critic = yield* ValueCritic.start(setup, yield* LearnerSlot.weights(slot))
      yield* ValueCritic.load(local.critic, dir)
    }
    local.version = meta.policyVersion
    local.dirty = true
  },
  // Whatever failed in a load (the reference's or the critic's trainer too) is the checkpoint's failure.
  Effect.mapError(checkpointError)
)

// ===== PolicyVersions =====

/**
 * Publishes the learner's weights as `version`. RL starts from version 0: the warm-up's trainer gives way to the RL
 * one, and the KL term's reference and the critic start there (a resumed run loaded them instead).
 */
const publish = Effect.fn("LocalPolicy.publish")(function*(local: Local, version: number) {
  const { slot, setup } = local
  const { algorithm } = setup.config
  if (version >= 0) {
    yield* LearnerSlot.endWarmup(slot)
    if (KlReference.needed(algorithm) && local.reference === undefined) {
      local.reference = yield* KlReference.make(setup, yield* LearnerSlot.weights(slot))
    }
    if (algorithm.advantage === "gae" && local.critic === undefined) {
      local.critic = yield* ValueCritic.start(setup, yield* LearnerSlot.weights(slot))
    }
  }
  local.version = version
  if (setup.tinker !== undefined) yield* TinkerLearner.publish(setup.tinker, version, local.dirty)
  else yield* LocalVersions.publish(local.versions!, version, local.dirty, LearnerSlot.weights(slot))
  local.dirty = false
})

// ===== Constructors =====

/** What the learner's pieces share, for a run of `config` on `folder` in the current scope. */
const setupOf = Effect.fnUntraced(function*(
  folder: ModelFolder.ModelFolder,
  config: TrainConfig.TrainConfig,
  intraOpThreads: number,
  releaseFolder: boolean
) {
  const { algorithm } = config
  const lora = config.model.lora
  const refused = lora === undefined ? undefined : Lora.validate(lora, folder.config)?.message ??
    (config.learner.url === undefined ? undefined : "model.lora with learner.url: a trainer server trains full weights")
  if (refused !== undefined) return yield* runError("Learner", refused)
  // With LoRA the learner trains the adapter alone, on the folder's weights as its frozen base (`docs/lora.md`).
  const vision = LocalVersions.visionOf(folder)
  const model = vision !== undefined
    ? OnnxTrainerVision.qwen2Vl(vision.config, vision.imageTokenId)
    : lora === undefined
    ? OnnxTrainer.qwen2(folder.config)
    : OnnxTrainer.qwen2Lora(folder.config, lora, folder.weights, config.model.from ?? config.model.path)
  const base: Omit<Setup, "engineWeights"> = {
    folder,
    config,
    model,
    optimizer: { ...Optimizer.defaultConfig, weightDecay: algorithm.weightDecay, maxGradNorm: algorithm.gradClip },
    rlLoss: lossConfig(algorithm, config.agent.temperature, config),
    // In learner steps; the optimiser takes `miniBatches × epochs` steps each.
    rlSchedule: LrSchedule.inUpdates(
      algorithm.lrSchedule === "cosine"
        ? LrSchedule.cosine(algorithm.lr, { warmupSteps: algorithm.lrWarmupSteps, totalSteps: algorithm.steps })
        : LrSchedule.constant(algorithm.lr, algorithm.lrWarmupSteps),
      algorithm.miniBatches * algorithm.epochs
    ),
    intraOpThreads,
    runScope: yield* Effect.scope,
    fsContext: yield* Effect.context<FileSystem.FileSystem | Scope.Scope>(),
    remote: RemoteLearner.make(folder, config, model.parameters),
    tinker: yield* TinkerLearner.make(config, folder),
    releaseFolder
  }
  const setup: Setup = { ...base, engineWeights: yield* engineWeightsOf(base) }
  return setup
})

/**
 * The options of {@link make}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly maxBatchSize?: number
  readonly intraOpThreads?: number
  /**
   * The caller hands the folder's weights over (`agentfly train`, which reads them for nothing else): in a local full
   * fine-tuning run of a text model the folder's weight map is emptied once the learner holds its own copy, so the
   * run does not keep them (4 bytes a parameter) to its end. Default false: the folder is left as it is.
   */
  readonly releaseFolderWeights?: boolean
}

/**
 * Builds the local learner, policy versions and ambient sampler of a run from a loaded model folder. Sessions live in
 * the current scope.
 *
 * With `algorithm.klCoef > 0` the KL term's reference policy is the policy RL starts from (policy version 0: the
 * warm-up's result, or the folder's weights). It is frozen when version 0 is first published and saved into every
 * checkpoint (`reference.safetensors`), so that a resumed run penalises against the same reference.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("LocalPolicy.make")(function*(
  folder: ModelFolder.ModelFolder,
  config: TrainConfig.TrainConfig,
  options: Options = {}
): Effect.fn.Return<
  {
    readonly learner: Learner.Learner["Service"]
    readonly versions: PolicyVersions["Service"]
    readonly sampler: Sampler["Service"]
  },
  RunError,
  FileSystem.FileSystem | Scope.Scope
> {
  const { algorithm } = config
  const budget = TrainConfig.onModel(config, folder.config).agent.maxContextTokens!
  if (budget > folder.config.maxPositionEmbeddings) {
    return yield* runError(
      "Learner",
      `agent.maxContextTokens is ${budget}, more than the model's ` +
        `${folder.config.maxPositionEmbeddings} positions (max_position_embeddings)`
    )
  }
  // One intra-op thread by default: see `learnerSlot`'s trainers (multi-threaded kernels sum in no fixed order).
  const setup = yield* setupOf(folder, config, options.intraOpThreads ?? 1, options.releaseFolderWeights === true)
  const tinker = setup.tinker
  const versions = tinker !== undefined ? undefined : yield* LocalVersions.make(setup, {
    maxBatchSize: options.maxBatchSize ?? 64
  })
  const tokenBudget = algorithm.microBatchSize * budget
  const distillation = algorithm.distillation
  // The teacher is built (and its tokenizer and prompt logprobs checked) before the first step.
  const teacher = distillation === undefined ? undefined : yield* Teacher.make(distillation.teacher, folder, {
    tokenBudget,
    intraOpThreads: setup.intraOpThreads
  }).pipe(
    Effect.provide(Path.layer),
    Effect.mapError((e) => runError("Learner", `algorithm.distillation: ${e.message}`, e))
  )
  const local: Local = {
    setup,
    slot: yield* LearnerSlot.make(setup, folder.weights),
    versions,
    learnerOptions: {
      ...learnerOptionsOf(setup, tokenBudget),
      ...(teacher === undefined ? {} : {
        distillation: { teacher, coef: distillation!.coef ?? 1, rewardWeight: distillation!.rewardWeight ?? 1 }
      })
    },
    tokenBudget,
    version: 0,
    dirty: false,
    reference: undefined,
    critic: undefined
  }
  // The learner holds its own copy now: the folder's weights go where the caller handed them over.
  if (versions !== undefined && folderReleasable(setup)) LocalVersions.releaseFolder(versions)
  const remote = setup.remote
  const learner = Learner.Learner.of({
    learn: (step, groups) => learn(local, step, groups),
    sft: (step, rows) => sft(local, step, rows),
    save: (dir) => save(local, dir),
    load: (dir) => load(local, dir),
    fingerprint: Effect.map(LearnerSlot.summary(local.slot), (s) => s.fingerprint),
    figures: tinker !== undefined
      ? TinkerLearner.figures(tinker)
      : remote === undefined
      ? undefined
      : RemoteLearner.figures(remote)
  })
  const policyVersions = PolicyVersions.of({
    publish: (version) => publish(local, version),
    sampler: (version) =>
      tinker !== undefined ? TinkerLearner.sampler(tinker, version) : LocalVersions.sampler(versions!, version),
    figures: versions?.servers?.figures ?? tinker?.onServers?.servers.figures
  })
  const sampler = tinker !== undefined ? TinkerLearner.ambient(tinker) : LocalVersions.ambient(versions!)
  return { learner, versions: policyVersions, sampler }
})

/**
 * A sampler on `engine` that lets one distinct prompt at a time into the engine's prefill (see
 * `internal/localVersions.ts`: what a sequence samples must not depend on the prompts that arrive beside it).
 *
 * @category constructors
 * @since 0.1.0
 */
export const prefillAlone: (engine: PolicyEngine.PolicyEngine["Service"]) => Sampler["Service"] =
  LocalVersions.prefillAlone

/**
 * The local learner, policy versions and ambient sampler as a layer.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (
  folder: ModelFolder.ModelFolder,
  config: TrainConfig.TrainConfig,
  options: Options = {}
): Layer.Layer<Learner.Learner | PolicyVersions | Sampler, RunError, FileSystem.FileSystem> =>
  Layer.effectContext(
    Effect.map(make(folder, config, options), ({ learner, versions, sampler }) =>
      Context.make(Learner.Learner, learner).pipe(
        Context.add(PolicyVersions, versions),
        Context.add(Sampler, sampler)
      ))
  )
