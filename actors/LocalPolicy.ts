/**
 * The local `Trainer.Policy` and `Sampler`: everything in this process, on onnxruntime-node. Sampling runs on
 * `PolicyEngine`s (KV cache, continuous batching): `Policy.sampler(version)` builds one per rollout batch,
 * evaluation or warm-up check from that published version's weights, so that no two of them ever share an engine
 * batch (what a batch samples then depends on its own requests only; see `Trainer.ts`). RL steps are
 * `Learner.update` over an `OnnxTrainer` built with the run's loss and optimiser; the SFT warm-up uses its own
 * `OnnxTrainer` with the NLL loss and the warm-up's learning rate, whose weights seed the RL trainer (with a fresh
 * optimiser) when the warm-up ends. With `engine.servers`, rollouts are sampled by those inference servers instead,
 * and every published version is pushed to them (`InferenceServers`).
 *
 * @since 0.1.0
 */
import { Context, Effect, Exit, FileSystem, Layer, Scope, Semaphore } from "effect"
import { createHash } from "node:crypto"
import * as Checkpoint from "../src/Checkpoint.ts"
import * as Dataset from "../src/Dataset.ts"
import * as DiskFull from "../src/internal/diskFull.ts"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import type * as ModelFolder from "../src/ModelFolder.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as RemoteTrainer from "../src/backends/RemoteTrainer.ts"
import * as Optimizer from "../src/Optimizer.ts"
import * as Packing from "../src/Packing.ts"
import * as PolicyTrainer from "../src/PolicyTrainer.ts"
import * as Safetensors from "../src/Safetensors.ts"
import { Sampler, samplerError } from "../src/Sampler.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import * as Trajectory from "../src/Trajectory.ts"
import * as TrajectoryBuilder from "../src/TrajectoryBuilder.ts"
import * as EngineThread from "./EngineThread.ts"
import * as InferenceServers from "./InferenceServers.ts"
import * as Learner from "./Learner.ts"
import * as PolicyEngine from "./PolicyEngine.ts"
import { PolicyVersions } from "./PolicyVersions.ts"
import { RunError, runError } from "./RunError.ts"

const learnerError = (e: { readonly message: string }) => runError("Learner", e.message, e)
const nonFinite = (message: string) => runError("NonFinite", message)
const checkpointError = (e: { readonly message: string }) =>
  runError(DiskFull.isDiskFull(e) ? "DiskFull" : "Checkpoint", e.message, e)

/** The trainer's current weights; a remote trainer that cannot send them stops the run. */
const weightsOf = (trainer: PolicyTrainer.PolicyTrainer["Service"]) => Effect.mapError(trainer.weights, learnerError)

/**
 * The RL loss of a config.
 *
 * @category constructors
 * @since 0.1.0
 */
export const lossConfig = (algorithm: TrainConfig.TrainConfig["algorithm"], temperature = 1): Loss.Config => ({
  ...Loss.grpo,
  aggregation: algorithm.aggregation,
  clipLow: algorithm.clipLow,
  clipHigh: algorithm.clipHigh,
  klCoef: algorithm.klCoef,
  entropyCoef: algorithm.entropyCoef,
  ...(algorithm.tisCap === undefined ? {} : { tisCap: algorithm.tisCap }),
  // The learner's logprobs must be those of the distribution the rollouts sampled from (greedy counts as 1).
  ...(temperature > 0 && temperature !== 1 ? { temperature } : {})
})

/**
 * A run's context budget on this model: `agent.maxContextTokens`, or the model's positions when the config leaves it
 * unset.
 *
 * @category constructors
 * @since 0.1.0
 */
export const contextTokens = (folder: ModelFolder.ModelFolder, config: TrainConfig.TrainConfig): number =>
  config.agent.maxContextTokens ?? folder.config.maxPositionEmbeddings

/**
 * A config as it runs on this model: its context budget filled in ({@link contextTokens}), so that the rollouts,
 * the learner and the run's recorded `config.json` use the same one.
 *
 * @category constructors
 * @since 0.1.0
 */
export const onModel = (folder: ModelFolder.ModelFolder, config: TrainConfig.TrainConfig): TrainConfig.TrainConfig => ({
  ...config,
  agent: { ...config.agent, maxContextTokens: contextTokens(folder, config) }
})

/**
 * Builds the local policy and sampler for a run from a loaded model folder. Sessions live in the current scope.
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
  options: { readonly maxBatchSize?: number; readonly intraOpThreads?: number } = {}
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
  const budget = contextTokens(folder, config)
  if (budget > folder.config.maxPositionEmbeddings) {
    return yield* runError(
      "Learner",
      `agent.maxContextTokens is ${budget}, more than the model's ` +
        `${folder.config.maxPositionEmbeddings} positions (max_position_embeddings)`
    )
  }
  const fsContext = yield* Effect.context<FileSystem.FileSystem | Scope.Scope>()
  // Published weights, newest last: the versions the trainer may still sample (a batch of an async run is sampled
  // by a version up to `maxStaleness` behind the newest). The folder's weights come first, below every version the
  // trainer publishes (versions increase): before the warm-up's checks (negative versions) and version 0.
  const retained = (config.mode === "async" ? config.maxStaleness : 0) + 2
  // With a trainer server pushing to the inference servers (`learner.pushWeights`) the weights stay there: entries
  // after the first hold none (only local engines need them, and there are none then).
  const published: Array<{ readonly version: number; readonly weights: Qwen2.Weights | undefined }> = [
    { version: -1 - (config.warmup?.steps ?? 0), weights: folder.weights }
  ]
  const newest = () => published[published.length - 1]!
  // The remote trainer in use (`learner.url`), which carries the weights to the servers when it pushes them.
  let remoteTrainer: RemoteTrainer.RemoteTrainer | undefined
  const trainerPushes = config.learner.url !== undefined && config.engine.servers !== undefined &&
    config.learner.pushWeights
  const fromTrainer = (e: { readonly message: string }) =>
    runError("Servers", `the trainer server could not push the weights: ${e.message}`, e)
  const carrier: InferenceServers.Carrier = {
    pushAll: (push, urls) =>
      Effect.suspend(() => remoteTrainer!.push(push, urls)).pipe(
        Effect.mapError(fromTrainer),
        Effect.map((outcomes) =>
          outcomes.map((o) =>
            typeof o === "object" ? { ...o, message: `pushed by the trainer server: ${o.message}` } : o
          )
        )
      ),
    pushOne: (push, url) =>
      Effect.suspend(() => remoteTrainer!.catchUp(push, [url])).pipe(
        Effect.map((outcomes) => outcomes[0]),
        Effect.catch((e) => Effect.succeed({ fatal: false, message: `the trainer server: ${e.message}` }))
      )
  }
  // Inference servers sample instead of local engines when the run lists them (`engine.servers`).
  const servers = config.engine.servers === undefined ? undefined : yield* InferenceServers.make({
    urls: config.engine.servers,
    parameters: OnnxTrainer.qwen2(folder.config).parameters,
    token: process.env["AGENTFLY_WEIGHTS_TOKEN"] || undefined,
    carrier: trainerPushes ? carrier : undefined,
    timeoutMs: config.engine.timeoutSeconds === undefined ? undefined : config.engine.timeoutSeconds * 1000
  })
  // Engines decode on a thread of their own when the run asks for it (`engine.thread`; see `EngineConfig`).
  const engineThread = servers === undefined && config.engine.thread === true ? yield* EngineThread.make : undefined
  const engineOf = (version: number, weights: Qwen2.Weights) =>
    (engineThread?.make ?? PolicyEngine.make)({
      config: folder.config,
      weights,
      version,
      maxBatchSize: options.maxBatchSize ?? 64
    }).pipe(Effect.mapError(learnerError))
  const model = OnnxTrainer.qwen2(folder.config)
  const optimizer: Optimizer.Config = {
    ...Optimizer.defaultConfig,
    weightDecay: algorithm.weightDecay,
    maxGradNorm: algorithm.gradClip
  }
  const rlLoss = lossConfig(algorithm, config.agent.temperature)
  // Each trainer lives in its own scope, closed when the next one replaces it (its sessions and worker threads go).
  const runScope = yield* Effect.scope
  // `learner.url`: the learner's steps run in an `agentfly trainer` process (here or on another machine).
  // Its trainers are named after the run's output directory and seed, so that runs sharing a trainer server keep
  // their own, and a resumed run replaces what its earlier process left there.
  const runName = createHash("sha256").update(JSON.stringify([config.output, config.seed])).digest("hex").slice(0, 12)
  const remote = config.learner.url === undefined ? undefined : {
    url: config.learner.url,
    name: `policy-${runName}`,
    token: process.env["AGENTFLY_TRAINER_TOKEN"] || undefined,
    model: folder.config,
    parameters: model.parameters,
    workers: config.learner.workers,
    callMillis: config.learner.timeoutSeconds === undefined ? undefined : config.learner.timeoutSeconds * 1000,
    traffic: RemoteTrainer.makeTraffic()
  }
  let trafficCounted = RemoteTrainer.makeTraffic()
  const trainerFigures = Effect.sync(() => {
    const now = { ...remote!.traffic }
    const out = {
      "trainer/calls": now.calls - trafficCounted.calls,
      "trainer/retries": now.retries - trafficCounted.retries,
      "trainer/sent_mb": (now.sentBytes - trafficCounted.sentBytes) / 1e6,
      "trainer/received_mb": (now.receivedBytes - trafficCounted.receivedBytes) / 1e6
    }
    trafficCounted = now
    return out
  })
  let trainerScope: Scope.Closeable | undefined
  const makeTrainer = (
    weights: PolicyTrainer.Weights,
    loss: Loss.Config,
    schedule: LrSchedule.Config
  ) =>
    Effect.gen(function*() {
      if (trainerScope !== undefined) yield* Scope.close(trainerScope, Exit.void)
      trainerScope = yield* Scope.fork(runScope)
      return trainerScope
    }).pipe(Effect.flatMap((scope) =>
      (remote === undefined
        ? OnnxTrainer.make({
          model,
          weights,
          loss,
          optimizer,
          schedule,
          workers: config.learner.workers,
          // One intra-op thread: onnxruntime's multi-threaded kernels do not sum in a fixed order, so with two
          // threads the same step on the same batch gave different weights from run to run (and a resumed run other
          // weights than the unbroken one). Parallelism comes from `learner.workers`, which split rows, not sums.
          intraOpThreads: options.intraOpThreads ?? 1
        }).pipe(Effect.map((t) => t.trainer))
        : RemoteTrainer.make({ ...remote, weights, loss, optimizer, schedule }).pipe(
          Effect.tap((t) => Effect.sync(() => (remoteTrainer = t)))
        )).pipe(
          // The trainer's own scope inside `fsContext`, which carries the run's: provided outside, the run's scope
          // won and every replaced trainer kept its sessions and worker threads until the run ended (measured: the
          // warm-up's two workers and their sessions, 300–500 MB, held through RL).
          Effect.provideService(Scope.Scope, scope),
          Effect.mapError(learnerError),
          Effect.provide(fsContext)
        )
    ))
  const rlSchedule = algorithm.lrSchedule === "cosine"
    ? LrSchedule.cosine(algorithm.lr, { warmupSteps: algorithm.lrWarmupSteps, totalSteps: algorithm.steps })
    : LrSchedule.constant(algorithm.lr, algorithm.lrWarmupSteps)

  // The trainer in use: the SFT one during the warm-up, then the RL one.
  let phase: "sft" | "rl" = "rl"
  let trainer: PolicyTrainer.PolicyTrainer["Service"] = yield* makeTrainer(folder.weights, rlLoss, rlSchedule)
  let version = 0
  // Whether the learner's weights differ from the engine's (after any SFT or RL step, or a checkpoint load).
  let dirty = false
  const tokenBudget = algorithm.microBatchSize * budget
  const maxLength = folder.config.maxPositionEmbeddings
  const learnerOptions: Learner.Options = {
    estimator: algorithm.advantage,
    ...(algorithm.gamma === undefined && algorithm.lambda === undefined ? {} : {
      advantage: {
        ...(algorithm.gamma === undefined ? {} : { gamma: algorithm.gamma }),
        ...(algorithm.lambda === undefined ? {} : { lambda: algorithm.lambda })
      }
    }),
    loss: rlLoss,
    tokenBudget,
    maxLength,
    miniBatches: algorithm.miniBatches,
    epochs: algorithm.epochs,
    rowSteps: config.learner.rowSteps,
    sharePrefix: config.learner.sharePrefix,
    ...(algorithm.klInReward === undefined ? {} : { klInReward: algorithm.klInReward }),
    ...(algorithm.recomputeOldLogprobs === undefined ? {} : { recomputeOldLogprobs: algorithm.recomputeOldLogprobs })
  }

  // The frozen reference policy of the KL term (only with klCoef > 0) or of KL in the reward (klInReward > 0).
  const needsReference = algorithm.klCoef > 0 || (algorithm.klInReward ?? 0) > 0
  let reference:
    | { readonly weights: PolicyTrainer.Weights; readonly logprobs: NonNullable<Learner.Options["reference"]> }
    | undefined
  const setReference = (weights: PolicyTrainer.Weights) =>
    (remote === undefined
      ? OnnxTrainer.makeReference(model, weights, { intraOpThreads: options.intraOpThreads ?? 1 })
      : Effect.map(
        RemoteTrainer.make({
          ...remote,
          name: `reference-${runName}`,
          weights,
          loss: Loss.sft,
          optimizer,
          schedule: LrSchedule.constant(0)
        }).pipe(Effect.provideService(Scope.Scope, runScope)),
        (frozen) => frozen.logprobs
      )).pipe(
        Effect.map((logprobs) => void (reference = { weights, logprobs })),
        Effect.mapError(learnerError),
        Effect.provide(fsContext)
      )
  const referenceFile = (dir: string) => `${dir}/reference.safetensors`
  const saveReference = (dir: string) =>
    Effect.gen(function*() {
      if (reference === undefined) return
      const fs = yield* FileSystem.FileSystem
      const { weights } = reference
      const tensors = model.parameters.map((p) => ({ name: p.name, shape: p.shape, data: weights.get(p.name)! }))
      yield* fs.writeFile(referenceFile(dir), Safetensors.serialize(tensors))
    }).pipe(Effect.mapError(checkpointError), Effect.provide(fsContext))
  const loadReference = (dir: string) =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const file = referenceFile(dir)
      if (!(yield* fs.exists(file))) {
        return yield* runError(
          "Checkpoint",
          `${file} is missing: a KL term (algorithm.klCoef or klInReward > 0) needs the reference policy ` +
            `the run started with`
        )
      }
      const parsed = yield* Safetensors.parse(yield* fs.readFile(file), file)
      return yield* Safetensors.readFloat32(parsed, file, model.parameters)
    }).pipe(
      Effect.mapError((e) => (e instanceof RunError ? e : checkpointError(e))),
      Effect.flatMap(setReference),
      Effect.provide(fsContext)
    )

  // The critic of `gae` (PPO with a value model): started from the policy RL starts from (version 0), in a scope of
  // its own; a resumed run loads it from the checkpoint's `critic/` folder instead.
  const criticSettings = TrainConfig.criticOf(config)
  let critic: PolicyTrainer.PolicyTrainer["Service"] | undefined
  const startCritic = (policyWeights: PolicyTrainer.Weights) => {
    const criticModel = OnnxTrainer.qwen2Value(folder.config)
    const settings = {
      weights: Qwen2.criticWeights(folder.config, policyWeights),
      loss: { ...Loss.value, clipLow: criticSettings.valueClip, clipHigh: criticSettings.valueClip },
      optimizer: { ...Optimizer.defaultConfig, weightDecay: criticSettings.weightDecay, maxGradNorm: criticSettings.gradClip },
      schedule: LrSchedule.constant(criticSettings.lr, criticSettings.lrWarmupSteps)
    }
    return Scope.fork(runScope).pipe(
      Effect.flatMap((scope) =>
        (remote === undefined
          ? Effect.map(
            OnnxTrainer.make({
              model: criticModel,
              ...settings,
              workers: config.learner.workers,
              intraOpThreads: options.intraOpThreads ?? 1
            }),
            (made) => made.trainer
          )
          : RemoteTrainer.make({
            ...remote,
            name: `critic-${runName}`,
            head: "value",
            parameters: criticModel.parameters,
            ...settings
          })).pipe(Effect.provideService(Scope.Scope, scope))
      ),
      Effect.map((made) => void (critic = made)),
      Effect.mapError(learnerError),
      Effect.provide(fsContext)
    )
  }
  const criticDir = (dir: string) => `${dir}/critic`

  const startSft = Effect.gen(function*() {
    const warmup = config.warmup!
    const schedule = warmup.lrSchedule === "cosine"
      ? LrSchedule.cosine(warmup.lr, { warmupSteps: warmup.warmupSteps, totalSteps: warmup.steps, minLr: warmup.minLr })
      : LrSchedule.constant(warmup.lr, warmup.warmupSteps)
    trainer = yield* makeTrainer(yield* weightsOf(trainer), Loss.sft, schedule)
    phase = "sft"
  })

  const sftSequences = (rows: ReadonlyArray<Dataset.Row>) =>
    Effect.forEach(rows, (row) =>
      TrajectoryBuilder.fromConversation({
        tokenizer: folder.tokenizer,
        template: folder.template,
        messages: row.messages ?? Dataset.promptMessages(row, config.agent.systemPrompt)
      }).pipe(
        Effect.map((b) => b.segments.map((segment) => Packing.fromSegment(segment))),
        Effect.mapError((e) =>
          runError("Learner", `demonstration line ${row.line}: ${e.message}`, e)
        )
      )).pipe(Effect.map((xs) => xs.flat()))

  // A step that left a weight NaN or infinite (a learning rate too large, an overflow) stops the run before the
  // weights are published, journaled or saved.
  // A remote trainer summarises its weights where they are (a fingerprint and the first non-finite value).
  const summary = Effect.suspend(() =>
    remoteTrainer !== undefined
      ? Effect.mapError(remoteTrainer.summary, learnerError)
      : Effect.map(weightsOf(trainer), (w) => ({
        fingerprint: fingerprintOf(w),
        nonFinite: Checkpoint.firstNonFinite(w)
      }))
  )
  const finiteWeights = (after: string) =>
    Effect.flatMap(summary, ({ nonFinite: bad }) =>
      bad === undefined
        ? Effect.void
        : Effect.fail(nonFinite(`${after} made the weights non-finite (${bad}); nothing was published or saved`))
    )

  const learner = Learner.Learner.of({
    learn: (step, all) => {
      // Under a group-relative estimator a group whose rewards are all equal has zero advantages: no signal. A step
      // without any signal is skipped, because AdamW would still move every weight along its stale momentum (with
      // sparse early rewards that alone wrecks a freshly warmed-up policy). Otherwise every group goes to the
      // learner: the ones without signal cost no compute there but keep the step's size proportional to its signal.
      // KL in the reward makes equal outcomes differ (each chain pays its own divergence): every group has signal.
      const rewardsDecide = TrainConfig.isGroupRelative(algorithm.advantage) && (algorithm.klInReward ?? 0) === 0
      const withSignal = rewardsDecide ? all.filter(Trajectory.rewardsDiffer).length : all.length
      if (withSignal === 0) {
        return Effect.succeed({
          _tag: "Skipped" as const,
          why: "NoSignal" as const,
          figures: { "learner/applied": 0, "learner/groups_with_signal": 0 }
        })
      }
      const options = {
        ...learnerOptions,
        ...(reference === undefined ? {} : { reference: reference.logprobs }),
        ...(critic === undefined ? {} : { critic, criticOnly: step <= criticSettings.warmupSteps })
      }
      return Learner.update(all, options).pipe(
        Effect.provideService(PolicyTrainer.PolicyTrainer, trainer),
        Effect.tap(() => Effect.sync(() => (dirty = true))),
        Effect.mapError(learnerError),
        Effect.tap((report) =>
          report.outcome === "non_finite"
            ? Effect.fail(nonFinite(`step ${step}: the loss or the gradients of every mini-batch were not finite`))
            : finiteWeights(`step ${step}`)
        ),
        Effect.map((report): Learner.Outcome => {
          const figures: Learner.Figures = {
            ...report.figures,
            "learner/applied": report.outcome === "applied" ? 1 : 0,
            ...(report.outcome === "critic_only" ? { "learner/critic_only": 1 } : {}),
            "learner/groups_with_signal": withSignal
          }
          return report.outcome === "applied"
            ? { _tag: "Applied", loss: figures["learner/loss"] ?? 0, figures }
            : report.outcome === "critic_only"
            ? { _tag: "CriticOnly", figures }
            : { _tag: "Skipped", why: "NoSignal", figures }
        })
      )
    },
    sft: (step, rows) =>
      Effect.gen(function*() {
        if (phase !== "sft") yield* startSft
        const sequences = yield* sftSequences(rows)
        const packed = yield* Packing.pack(sequences, { tokenBudget, maxLength, aggregation: "token-mean" }).pipe(
          Effect.mapError(learnerError)
        )
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
        dirty = true
        yield* finiteWeights(`warm-up step ${step}`)
        return {
          "warmup/loss": loss,
          "warmup/tokens": tokens,
          "warmup/grad_norm": optim.gradNorm,
          "warmup/lr": optim.lr,
          "perf/row_tokens": rowTokens
        }
      }),
    save: (dir) =>
      // The critic first: the policy's state file, written last, marks the checkpoint complete.
      (critic === undefined ? Effect.void : critic.save(criticDir(dir), { policyVersion: version, rngState: [] })).pipe(
        Effect.andThen(trainer.save(dir, { policyVersion: version, rngState: [] })),
        Effect.mapError(checkpointError),
        Effect.andThen(saveReference(dir))
      ),
    load: (dir) =>
      trainer.load(dir).pipe(
        Effect.mapError(checkpointError),
        Effect.tap(() => (needsReference ? loadReference(dir) : Effect.void)),
        Effect.tap(() =>
          algorithm.advantage !== "gae" ? Effect.void : Effect.gen(function*() {
            if (critic === undefined) yield* startCritic(yield* weightsOf(trainer))
            yield* critic!.load(criticDir(dir)).pipe(Effect.mapError(checkpointError))
          })
        ),
        Effect.tap((meta) =>
          Effect.sync(() => {
            version = meta.policyVersion
            dirty = true
          })
        ),
        Effect.asVoid,
        Effect.mapError(checkpointError)
      ),
    fingerprint: Effect.map(summary, (s) => s.fingerprint),
    figures: remote === undefined ? undefined : trainerFigures
  })
  const versions = PolicyVersions.of({
    publish: (v) =>
      Effect.gen(function*() {
        // The end of the warm-up (a negative version is one of its checks): the RL trainer starts from the SFT
        // weights with a fresh optimiser.
        if (phase === "sft" && v >= 0) {
          trainer = yield* makeTrainer(yield* weightsOf(trainer), rlLoss, rlSchedule)
          phase = "rl"
        }
        // RL starts from version 0: the KL term's reference is frozen there (a resumed run loaded it instead).
        if (needsReference && reference === undefined && v >= 0) yield* setReference(yield* weightsOf(trainer))
        if (algorithm.advantage === "gae" && critic === undefined && v >= 0) yield* startCritic(yield* weightsOf(trainer))
        version = v
        const last = newest()
        if (v < last.version || (v === last.version && dirty)) {
          return yield* runError(
            "Learner",
            `policy version ${v} is not newer than the published version ${last.version}`
          )
        }
        if (v === last.version) return
        const weights = trainerPushes ? undefined : dirty ? (yield* weightsOf(trainer)) as Qwen2.Weights : last.weights
        if (servers !== undefined) yield* servers.push(v, weights)
        published.push({ version: v, weights })
        if (published.length > retained) published.shift()
        dirty = false
      }),
    sampler: (v) =>
      Effect.gen(function*() {
        const entry = published.find((p) => p.version === v)
        if (entry === undefined) {
          return yield* runError(
            "Learner",
            `policy version ${v} is not among the published versions ${published.map((p) => p.version)}`
          )
        }
        // Without servers every entry holds its weights (only a trainer pushing to servers keeps them).
        return servers === undefined ? prefillAlone(yield* engineOf(v, entry.weights!)) : servers.sampler(v)
      }),
    figures: servers?.figures
  })
  // The ambient sampler (for callers outside a run's pipeline): one engine, built on first use, following the newest
  // published version.
  let ambient: { readonly engine: PolicyEngine.PolicyEngine["Service"]; readonly sampler: Sampler["Service"] } | undefined
  const ambientLock = yield* Semaphore.make(1)
  const ambientEngine = Semaphore.withPermits(ambientLock, 1)(Effect.gen(function*() {
    const { version: v, weights } = newest()
    if (servers !== undefined) {
      // Before the run's first push the servers hold no weights of this run: the newest version goes first.
      if ((yield* servers.pushed) === undefined) yield* servers.push(v, weights)
      return servers.sampler(v)
    }
    // Without servers every published entry holds its weights.
    if (ambient === undefined) {
      const engine = yield* engineOf(v, weights!).pipe(Effect.provideService(Scope.Scope, runScope))
      ambient = { engine, sampler: prefillAlone(engine) }
    } else if ((yield* ambient.engine.policyVersion) < v) {
      yield* ambient.engine.updateWeights(v, weights!).pipe(Effect.mapError(learnerError))
    }
    return ambient.sampler
  }))
  const sampler = Sampler.of({
    generate: (request) =>
      ambientEngine.pipe(
        Effect.mapError((e) => samplerError("ServerError", e.message)),
        Effect.flatMap((gated) => gated.generate(request))
      ),
    policyVersion: Effect.sync(() => newest().version)
  })
  return { learner, versions, sampler }
})

/**
 * A sampler on `engine` that lets one distinct prompt at a time into the engine's prefill: a request waits until the
 * requests admitted before it with another prompt have sampled their first token (requests with the same prompt,
 * such as a group's chains, go in together).
 *
 * **Why.** A prefill batch left-pads its prompts to the longest, which shifts where each prompt's keys sit in the
 * attention rows: the float32 sums then group differently and the logits move in their last bits, so what a
 * sequence samples would depend on which other prompts arrived in the same millisecond. Prefilled alone, a prompt
 * always has the same shapes; decode steps do not depend on their neighbours (every row has its own positions and
 * mask, and the cache grows in whole chunks). Cost: one prefill call per distinct prompt instead of one per
 * arrival burst.
 *
 * @category constructors
 * @since 0.1.0
 */
export const prefillAlone = (engine: PolicyEngine.PolicyEngine["Service"]): Sampler["Service"] => {
  let admitting: string | undefined
  let admitted = 0
  const waiting: Array<() => boolean> = []
  const tryEnter = (key: string) => {
    if (admitting !== undefined && admitting !== key) return false
    admitting = key
    admitted++
    return true
  }
  const leave = () => {
    if (--admitted > 0) return
    admitting = undefined
    // In arrival order: the first prompt waiting is admitted, with every other request for that same prompt.
    for (let i = 0; i < waiting.length;) {
      if (waiting[i]!()) waiting.splice(i, 1)
      else i++
    }
  }
  // `ticket.inside` is set when the request is admitted; `out` lets the next prompt in (once per request).
  const enter = (key: string, ticket: { inside: boolean }) =>
    Effect.callback<void>((resume) => {
      const attempt = () => {
        if (!tryEnter(key)) return false
        ticket.inside = true
        resume(Effect.void)
        return true
      }
      if (attempt()) return
      waiting.push(attempt)
      return Effect.sync(() => {
        const i = waiting.indexOf(attempt)
        if (i >= 0) waiting.splice(i, 1)
      })
    })
  return Sampler.of({
    generate: (request) =>
      // The release is in place before the wait starts, so that an interruption at any point lets the next one in.
      Effect.uninterruptibleMask((restore) => {
        const ticket = { inside: false }
        const out = () => {
          if (!ticket.inside) return
          ticket.inside = false
          leave()
        }
        return restore(enter(request.promptTokenIds.join(","), ticket)).pipe(
          Effect.andThen(restore(engine.generate(request, { onToken: out }))),
          Effect.ensuring(Effect.sync(out))
        )
      }),
    policyVersion: engine.policyVersion
  })
}

/**
 * A fingerprint of weights: `Checkpoint.fingerprint` (equal fingerprints mean bit-identical weights).
 *
 * @category getters
 * @since 0.1.0
 */
export const fingerprintOf = (weights: PolicyTrainer.Weights): string => Checkpoint.fingerprint(weights)

/**
 * The local policy and sampler as a layer.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (
  folder: ModelFolder.ModelFolder,
  config: TrainConfig.TrainConfig,
  options: { readonly maxBatchSize?: number; readonly intraOpThreads?: number } = {}
): Layer.Layer<Learner.Learner | PolicyVersions | Sampler, RunError, FileSystem.FileSystem> =>
  Layer.effectContext(
    Effect.map(make(folder, config, options), ({ learner, sampler, versions }) =>
      Context.make(Learner.Learner, learner).pipe(Context.add(PolicyVersions, versions), Context.add(Sampler, sampler)))
  )
