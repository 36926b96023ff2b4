/**
 * The configuration of a training run (`agentfly train CONFIG`): the task (by name or module path), the model,
 * datasets, agent options, algorithm, sync/async mode, evaluation, checkpoints and output directory.
 *
 * A config is a JSON or YAML file, or a TypeScript module whose default export (or `config` export) is the
 * object. Decoding is strict: an unknown or mistyped key fails fast with the path of the bad key and, when a
 * known key is close, a suggestion (`algorithm.lrr: unknown key (did you mean "lr"?)`). Relative paths in the
 * config are resolved against the config file's directory, so a config and its data move together.
 *
 * **Bounds.** Every number has finite bounds, checked when the config is decoded (command-line overrides go through
 * the same Schema), and the error names them: `algorithm.lr: Expected a value between 0 (excluded) and 1`. They
 * are generous for the models this runtime trains and tight enough that a typo cannot crash or hang a run
 * (`groupsPerStep: 1e9` exhausted V8's heap, `numChains: 1e7` hung, `learner.workers: 1000` took 3 GiB, `lr: 1e400`
 * is Infinity and made every weight NaN). One step's rollouts (`groupsPerStep × numChains`) are at most
 * {@link maxTrajectoriesPerStep}.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Path, Schema, SchemaIssue } from "effect"
import * as Yaml from "yaml"
import * as Advantage from "./Advantage.ts"
import * as ContextPolicy from "./ContextPolicy.ts"
import * as Distillation from "./Distillation.ts"
import * as SchemaIssues from "./internal/schemaIssues.ts"
import * as Lora from "./Lora.ts"
import * as TinkerLoss from "./backends/TinkerLoss.ts"
import * as ModelPresets from "./model/ModelConfig.ts"
import { isModulePath, isNotFound, loadProblem, Ref as TaskRef } from "./Task.ts"
import { importUserModule } from "./internal/userModule.ts"

// ===== Schema =====

/** An integer in `[minimum, maximum]`. */
const IntIn = (minimum: number, maximum: number) => Schema.Int.check(Schema.isBetween({ minimum, maximum }))
/** A number in `[minimum, maximum]` (NaN and ±Infinity fail). */
const NumberIn = (minimum: number, maximum: number) => Schema.Number.check(Schema.isBetween({ minimum, maximum }))
/** A number in `(0, maximum]`. */
const PositiveUpTo = (maximum: number) =>
  Schema.Number.check(Schema.isBetween({ minimum: 0, maximum, exclusiveMinimum: true }))
const Probability = NumberIn(0, 1)
/** Step counts, intervals and dataset sizes. */
const Steps = IntIn(1, 10_000_000)
const Seed = IntIn(0, 0xffff_ffff)
/** A learning rate. */
const LearningRate = PositiveUpTo(1)
/** A sampling temperature (0: greedy), in the range OpenAI's API and `agentfly serve` take. */
const Temperature = NumberIn(0, 2)

/**
 * The most trajectories one learner step may roll out (`algorithm.groupsPerStep × agent.numChains`).
 *
 * @category constants
 * @since 0.1.0
 */
export const maxTrajectoriesPerStep = 65_536

const withDefault = <S extends Schema.Top>(schema: S, value: S["Encoded"]) =>
  schema.pipe(Schema.withDecodingDefaultKey<S, never>(Effect.succeed(value)))

/**
 * Where the policy lives. `preset` names a model architecture to initialise at `path` when the folder does not
 * exist yet (see `agentfly init-model`); `initSeed` seeds that initialisation.
 *
 * @category models
 * @since 0.1.0
 */
export const ModelConfig = Schema.Struct({
  path: Schema.String,
  // A preset's name is checked even when the folder exists (and the preset is unused): a typo would otherwise pass
  // until the day the folder is missing.
  // `tiny-vl` is `tiny` with a vision tower (`VisionTower.presets`).
  preset: Schema.optionalKey(
    Schema.Literals([...Object.keys(ModelPresets.presets) as Array<ModelPresets.PresetName>, "tiny-vl" as const])
  ),
  initSeed: withDefault(Seed, 0),
  /**
   * A run's checkpoint (`RUN/checkpoints/step-NNNNNN`) whose weights this run starts from instead of the folder's
   * (checked as `agentfly eval --checkpoint` checks one: shapes, finite values, its run's journal); the folder still
   * gives the architecture, tokenizer and template. One warm-up shared by several RL variants, for instance.
   */
  from: Schema.optionalKey(Schema.String),
  /**
   * LoRA adapters (`docs/lora.md`): `{ rank, alpha, dropout?, targets }`, targets by module name (`q_proj` …
   * `down_proj`). Only the adapters train; the base stays frozen. Absent: full fine-tuning.
   */
  lora: Schema.optionalKey(Lora.Config)
})

/**
 * Datasets: `train` rows are prompts for rollouts; `eval` is the held-out split. `onInvalidRow` decides whether a
 * row that fails validation stops the run (reported with its line number) or is skipped and reported.
 *
 * @category models
 * @since 0.1.0
 */
export const DataConfig = Schema.Struct({
  train: Schema.String,
  eval: Schema.optionalKey(Schema.String),
  onInvalidRow: withDefault(Schema.Literals(["stop", "skip"]), "stop")
})

/**
 * How the agent runs: chat template and tool-call parser by name, the system prompt, turn and token budgets,
 * `numChains` rollouts per row (one GRPO group) and the sampling temperature. `maxContextTokens` defaults to the
 * model's positions (`max_position_embeddings`) for a local policy and to no budget for an external sampler.
 *
 * @category models
 * @since 0.1.0
 */
export const AgentConfig = Schema.Struct({
  /** A built-in template name (`qwen2.5`, `qwen3`, `llama3`, `chatml`) or `model`: the model folder's own. */
  template: withDefault(Schema.String, "model"),
  parser: withDefault(Schema.String, "hermes"),
  systemPrompt: Schema.optionalKey(Schema.String),
  /** Render the tool list into the prompt (off for tiny policies that learn the tools from demonstrations). */
  renderTools: withDefault(Schema.Boolean, true),
  maxTurns: withDefault(IntIn(1, 1_000), 4),
  numChains: withDefault(IntIn(1, 1_024), 8),
  maxNewTokens: withDefault(IntIn(1, 1_048_576), 256),
  maxContextTokens: Schema.optionalKey(IntIn(1, 1_048_576)),
  temperature: withDefault(Temperature, 1),
  topP: withDefault(Probability, 1),
  /** Seconds a tool call may run when its tool sets no `timeout` (a hang becomes a `Timeout` observation). */
  toolTimeout: withDefault(PositiveUpTo(86_400), 30),
  /** What a chain does when its context nears `maxContextTokens` (`src/ContextPolicy.ts`; none: it ends there). */
  context: Schema.optionalKey(ContextPolicy.ContextPolicy)
})

/**
 * Advantage estimators (see `src/Advantage.ts`).
 *
 * @category models
 * @since 0.1.0
 */
export const AdvantageEstimator = Schema.Literals([
  "grpo",
  "grpo-no-std",
  "rloo",
  "reinforce++",
  "reinforce++-baseline",
  "gae"
])
export type AdvantageEstimator = typeof AdvantageEstimator.Type

/**
 * Whether an estimator's advantages are rewards relative to their group's (GRPO, Dr.GRPO, RLOO): a group whose
 * rewards are all equal then has none.
 *
 * @category getters
 * @since 0.1.0
 */
export const isGroupRelative = (estimator: AdvantageEstimator): boolean =>
  estimator === "grpo" || estimator === "grpo-no-std" || estimator === "rloo"

/**
 * DAPO's dynamic sampling (verl's `filter_groups`): more rows are rolled out, a batch of `groupsPerStep` at a
 * time and at most `maxBatches` batches a step (the first included), until `groupsPerStep` groups whose rewards
 * differ are found; the learner trains on those.
 *
 * @category models
 * @since 0.1.0
 */
export const DynamicSamplingConfig = Schema.Struct({
  maxBatches: withDefault(IntIn(2, 100), 3)
})

/**
 * Loss aggregation modes (verl's names).
 *
 * @category models
 * @since 0.1.0
 */
export const LossAggregation = Schema.Literals([
  "token-mean",
  "seq-mean-token-sum",
  "seq-mean-token-mean",
  "seq-mean-token-sum-norm"
])
export type LossAggregation = typeof LossAggregation.Type

/**
 * The RL algorithm: estimator, clipped surrogate loss, KL to the initial policy, optimiser, and batch sizes.
 * `groupsPerStep` rows (× `agent.numChains` rollouts) make one learner step; sequences are processed in
 * micro-batches of at most `microBatchSize` × `agent.maxContextTokens` tokens with gradients accumulated.
 * `steps` is the number of learner steps. `tisCap` caps the truncated importance weights (old / sampler
 * probabilities) that correct stale async samples.
 *
 * @category models
 * @since 0.1.0
 */
export const AlgorithmConfig = Schema.Struct({
  /** `gae`: PPO with a critic (the `critic` section); the others need none. */
  advantage: withDefault(AdvantageEstimator, "grpo"),
  /** Discount of `reinforce++` and `gae` (verl's default 1). */
  gamma: Schema.optionalKey(NumberIn(0, 1)),
  /** GAE's λ (verl's default 1: the return minus the critic's value). */
  lambda: Schema.optionalKey(NumberIn(0, 1)),
  aggregation: withDefault(LossAggregation, "token-mean"),
  /**
   * The policy-gradient loss (`docs/algorithms.md`): `ppo` (the clipped surrogate of GRPO, RLOO, REINFORCE++ and
   * PPO), `gspo` (a sequence-level ratio; pair it with `aggregation: "seq-mean-token-mean"` and GSPO's clip range
   * 3e-4 / 4e-4) or `cispo` (clipped IS weights, every token keeps a gradient; `clipLow: 1` for no lower bound).
   * Absent: `ppo`.
   */
  policyLoss: Schema.optionalKey(Schema.Literals(["ppo", "gspo", "cispo"])),
  /**
   * PPO's dual clip `c > 1` (arXiv:1912.09729): a negative advantage's loss is bounded by `c·|A|` however far the
   * ratio grows, or `"off"`. Absent: off in sync mode, 3 in async mode with `maxStaleness > 0` (the trust region
   * of stale samples, see `docs/algorithms.md`).
   */
  dualClip: Schema.optionalKey(
    Schema.Union([
      Schema.Number.check(Schema.isBetween({ minimum: 1, maximum: 100, exclusiveMinimum: true })),
      Schema.Literal("off")
    ])
  ),
  /**
   * DAPO's soft over-long punishment (arXiv:2503.14476): a trajectory of `L` policy tokens gets
   * `factor·min(0, (maxTokens − bufferTokens − L) / bufferTokens)`, at least `−factor`, added to its reward before
   * advantages. Absent: off.
   */
  overlong: Schema.optionalKey(Schema.Struct({
    maxTokens: IntIn(1, 1_048_576),
    bufferTokens: IntIn(1, 1_048_576),
    factor: Schema.optionalKey(NumberIn(0, 100))
  })),
  /**
   * On-policy distillation (`docs/algorithms.md`): a teacher (`{ path, checkpoint? }`: a model folder and optionally
   * a run's checkpoint; or `{ url, model, apiKeyEnv? }`: an OpenAI-compatible server answering vLLM's
   * `prompt_logprobs`) scores the student's sampled tokens; each token's advantage gains
   * `coef·(log π_teacher − log π_student)` (coef default 1), the task's advantages are weighted by `rewardWeight`
   * (default 1; 0 = distillation alone). The tokenizers must agree (checked at the start). Absent: off.
   */
  distillation: Schema.optionalKey(Distillation.Config),
  clipLow: withDefault(NumberIn(0, 1), 0.2),
  clipHigh: withDefault(NumberIn(0, 100), 0.2),
  klCoef: withDefault(NumberIn(0, 100), 0),
  /**
   * KL to the reference in the reward instead of (or besides) the loss (verl's `use_kl_in_reward`): every policy
   * token's reward becomes `r − β·(log π_sampler − log π_ref)` before advantages are computed (figure
   * `learner/reward_kl`). The reference is the policy RL starts from, as for `klCoef`.
   */
  klInReward: Schema.optionalKey(NumberIn(0, 100)),
  /**
   * Recompute the old policy's logprobs with the learner's weights before the update (verl's `compute_log_prob`),
   * instead of trusting the sampler's: the PPO ratio starts at exactly 1, and `tisCap` corrects the train/inference
   * mismatch with truncated importance weights. One forward pass per micro-batch more.
   */
  recomputeOldLogprobs: Schema.optionalKey(Schema.Boolean),
  entropyCoef: withDefault(NumberIn(0, 100), 0),
  lr: withDefault(LearningRate, 3e-4),
  lrSchedule: withDefault(Schema.Literals(["constant", "cosine"]), "constant"),
  lrWarmupSteps: withDefault(IntIn(0, 10_000_000), 0),
  tisCap: Schema.optionalKey(PositiveUpTo(1e6)),
  weightDecay: withDefault(NumberIn(0, 1), 0),
  gradClip: withDefault(PositiveUpTo(1e6), 1),
  groupsPerStep: withDefault(IntIn(1, 4_096), 8),
  /** Optimiser steps per learner step, each on whole groups (verl's `ppo_mini_batch_size` as a count). */
  miniBatches: withDefault(IntIn(1, 4_096), 1),
  /** Passes over a step's mini-batches (verl's `ppo_epochs`). */
  epochs: withDefault(IntIn(1, 100), 1),
  microBatchSize: withDefault(IntIn(1, 4_096), 16),
  /**
   * Roll out more rows until a step has `groupsPerStep` groups with a learning signal (DAPO's dynamic sampling);
   * group-relative estimators only.
   */
  dynamicSampling: Schema.optionalKey(DynamicSamplingConfig),
  steps: Steps
})

/**
 * Ends the warm-up early, at the first check where greedy accuracy on `data` reaches `accuracy`: a validation
 * split of its own (not `data.eval`, so the held-out figures stay unbiased), checked every `every` warm-up steps
 * from step `from` (default `every`) on its first `size` rows (all when absent). How many steps a policy needs to
 * reach a level varies a lot between seeds; a target makes every seed start RL from a comparable policy. Checks
 * before the policy has learnt the format are slow (it writes to the token limit), hence `from`. A warm-up that
 * reaches its step cap short of the target goes on to RL (`onMiss: "continue"`) or fails the run (`"fail"`, naming
 * the best check), rather than spending the RL steps on a policy that never learnt the task.
 *
 * @category models
 * @since 0.1.0
 */
export const WarmupStopConfig = Schema.Struct({
  data: Schema.String,
  accuracy: Probability,
  every: withDefault(Steps, 50),
  from: Schema.optionalKey(Steps),
  size: Schema.optionalKey(Steps),
  onMiss: withDefault(Schema.Literals(["continue", "fail"]), "continue")
})
export type WarmupStopConfig = typeof WarmupStopConfig.Type

/**
 * Optional SFT warm-up on demonstration conversations: masked NLL on assistant tokens only. `steps` is its length,
 * or its cap with `stopAt`.
 *
 * @category models
 * @since 0.1.0
 */
export const WarmupConfig = Schema.Struct({
  data: Schema.String,
  steps: Steps,
  stopAt: Schema.optionalKey(WarmupStopConfig),
  lr: withDefault(LearningRate, 2e-3),
  lrSchedule: withDefault(Schema.Literals(["constant", "cosine"]), "constant"),
  minLr: withDefault(NumberIn(0, 1), 0),
  warmupSteps: withDefault(IntIn(0, 10_000_000), 0),
  batchSize: withDefault(IntIn(1, 4_096), 16)
})

/**
 * Held-out evaluation every `every` learner steps (and before the first), on `size` rows of `data.eval` (all when
 * absent). `temperature: 0` is greedy. Sampled, `samples` answers per question average out the sampling noise of
 * one answer each (figures are over all of them).
 *
 * @category models
 * @since 0.1.0
 */
export const EvalConfig = Schema.Struct({
  every: withDefault(Steps, 10),
  size: Schema.optionalKey(Steps),
  temperature: withDefault(Temperature, 0),
  samples: withDefault(IntIn(1, 1_024), 1)
})

/**
 * Checkpoints every `every` learner steps (and at the end); the `keep` most recent are kept.
 *
 * @category models
 * @since 0.1.0
 */
export const CheckpointConfig = Schema.Struct({
  every: withDefault(Steps, 10),
  keep: withDefault(IntIn(1, 1_000), 2)
})

/** An HTTP(S) address of a server or worker. */
const ApiRoot = Schema.String.check(
  Schema.makeFilter((url) =>
    /^https?:\/\/[^/\s]+/.test(url) ||
    `expected an http(s) address such as http://10.0.0.2:8000/v1, got ${JSON.stringify(url)}`
  )
)

/**
 * A Tinker-API engine as the learner (`learner.backend: "tinker"`; `docs/tinker-training.md`): hosted Tinker
 * (`https://tinker.thinkingmachines.dev/services/tinker-prod`), SkyRL's Tinker backend, Twinkle, or `agentfly
 * trainer`. The API key is read from the environment variable `apiKeyEnv` names (default `TINKER_API_KEY`), never
 * from the config.
 *
 * @category models
 * @since 0.1.0
 */
export const TinkerLearnerConfig = Schema.Struct({
  /** The service root, without `/api/v1`: e.g. `http://10.0.0.2:8000` for a server of your own. */
  baseUrl: ApiRoot,
  /** The environment variable that holds the API key (sent as `X-API-Key`); unset or empty: no key. */
  apiKeyEnv: withDefault(Schema.String.check(Schema.isPattern(/^[A-Za-z_][A-Za-z0-9_]*$/)), "TINKER_API_KEY"),
  /** The engine's name of the base model, e.g. `Qwen/Qwen3-8B` (its tokenizer must be `model.path`'s). */
  baseModel: Schema.String.check(Schema.isMinLength(1)),
  /** The LoRA rank the engine trains; absent: the engine's full weights (where it offers that). */
  loraRank: Schema.optionalKey(IntIn(1, 1024)),
  /** How long one future (a step, a save) may take (default 1,800 s). */
  futureTimeoutSeconds: Schema.optionalKey(IntIn(1, 86_400))
})
export type TinkerLearnerConfig = typeof TinkerLearnerConfig.Type

/**
 * The learner's settings. `workers` splits each micro-batch's rows over that many threads, each
 * running its share on its own core (`OnnxTrainer.Options.workers`; 1 = everything on the main thread).
 *
 * @category models
 * @since 0.1.0
 */
export const LearnerConfig = Schema.Struct({
  workers: withDefault(IntIn(1, 64), 2),
  /**
   * Row counts a micro-batch of a given length may take (`Packing.Options.rowSteps`): 4 pads a step's last,
   * partly filled micro-batch to the next quarter of the capacity instead of all of it (≈ 10 % less learner work on
   * the calculator config, up to 4 compiled graphs per length). Default 1, with which the recorded runs were made:
   * another value sums the gradients in another order, so a run's figures differ within noise.
   */
  rowSteps: withDefault(IntIn(1, 64), 1),
  /**
   * A GRPO group's prompt computed once instead of once per chain (`Packing.Options.sharePrefix`,
   * `Qwen2.sharedPrefixGraph`): the learner runs each group's common tokens once and each chain's own tokens in a
   * row that attends to them. The same loss, logprobs and gradients up to float rounding; the sums run in another
   * order, so a run's figures differ in their last digits from one without (the shipped configs whose runs are
   * recorded in `BENCHMARKS.md` set it to false so that they repeat to the digit). Default true: the calculator
   * demo's learner steps take 0.54–0.58 s instead of 0.63 s.
   */
  sharePrefix: withDefault(Schema.Boolean, true),
  /**
   * How AdamW's two moments are stored (`OnnxTrainer.Options.moments`): `float32` (the default, 8 bytes a parameter)
   * or `bfloat16` (4 bytes a parameter: a full fine-tuning learner's peak falls by about 4 bytes a parameter, 1.2 GiB
   * at Qwen2.5-0.5B's 494 M). bfloat16 moments are narrowed after each update with stochastic rounding keyed by the
   * step and the element, so a run is still deterministic and its resume exact; checkpoints then hold them as BF16.
   * The loss follows float32's within noise, not to the digit. A trainer server (`learner.url`) and a Tinker engine
   * keep their own.
   */
  moments: Schema.optionalKey(Schema.Literals(["float32", "bfloat16"])),
  /**
   * Activation recompute (`OnnxTrainer.Options.recompute`): each decoder layer keeps only its input from the forward
   * pass and recomputes its inside in the backward, so the activations held fall to about one layer's (measured at
   * Qwen2.5-0.5B's width: BENCHMARKS.md, "real shapes"), for about 1.15× the learner's CPU time. The same loss, the
   * same gradients up to float rounding. The saving needs glibc's mmap threshold fixed: start the run as
   * `MALLOC_MMAP_THRESHOLD_=1048576 agentfly train …` (glibc reads it at start; it is not the default because it
   * slows small models' learner steps, `bin/agentfly.mjs` says how much). Default false.
   */
  recompute: Schema.optionalKey(Schema.Boolean),
  /**
   * A trainer server (`agentfly trainer`, here or on another machine, `http://HOST:PORT/v1`) that runs the
   * learner's forward/backward passes and optimiser steps instead of this process (`RemoteTrainer`): the run sends it
   * the packed micro-batches and gets the weights back to publish. Checkpoints stay in the run's folder. A step
   * computes the same numbers as a local one (same code, one intra-op thread), so a run repeats to the digit either
   * way when the server has the same `workers`. With `AGENTFLY_TRAINER_TOKEN` set, requests bear it.
   */
  url: Schema.optionalKey(ApiRoot),
  /**
   * With `url` and `engine.servers`: the trainer server pushes each published version to the inference servers
   * itself (`PUT /v1/weights` from its machine, the servers' `AGENTFLY_WEIGHTS_TOKEN` passed along), and the run
   * gets only their fingerprint, so the weights cross the network once instead of twice (trainer → run → servers).
   * The trainer's machine must reach the servers. False: the run fetches the weights and pushes them. Default true.
   */
  pushWeights: withDefault(Schema.Boolean, true),
  /**
   * With `url`: how long one call of the trainer server (a step, a checkpoint) may take before the run gives up on
   * it (default 1,800 s; a large model's step on a CPU host can take minutes).
   */
  timeoutSeconds: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 86_400 }))),
  /**
   * Where the learner's steps run: `local` (this process, or `url`'s trainer server; the default) or `tinker`, a
   * Tinker-API engine set up under `learner.tinker`.
   */
  backend: Schema.optionalKey(Schema.Literals(["local", "tinker"])),
  tinker: Schema.optionalKey(TinkerLearnerConfig)
})

/**
 * The critic of `algorithm.advantage: "gae"` (PPO with a value model, as verl's): a second model of the policy's
 * shape whose output head gives one value per token (`Qwen2.Head` `value`), started from the policy RL starts from
 * with a value head of zeros, and trained beside it on the GAE returns with the clipped value loss (`Loss.value`,
 * `valueClip` verl's `cliprange_value`). It follows the policy's mini-batches and epochs and is saved in every
 * checkpoint (`critic/`).
 *
 * @category models
 * @since 0.1.0
 */
export const CriticConfig = Schema.Struct({
  lr: withDefault(LearningRate, 1e-3),
  /**
   * RL steps at the start that train the critic alone, the policy unchanged (verl's `trainer.critic_warmup`): its
   * values start at zero, and a few steps let them approach the returns before they shape the policy's advantages.
   */
  warmupSteps: withDefault(IntIn(0, 10_000_000), 0),
  lrWarmupSteps: withDefault(IntIn(0, 10_000_000), 0),
  valueClip: withDefault(PositiveUpTo(1e6), 0.5),
  weightDecay: withDefault(NumberIn(0, 1), 0),
  gradClip: withDefault(PositiveUpTo(1e6), 1)
})
export type CriticConfig = typeof CriticConfig.Type

/**
 * The local policy engine. `thread: true` runs it on a worker thread of its own (`actors/EngineThread.ts`): it
 * decodes while the main thread runs the chains, tools and rewards and coordinates the learner. Default false, in
 * both modes: since the engine's KV caches come from a pool, an async run with the engine on the main thread was the
 * faster in 12 of 14 paired runs on 2 cores (`bench/pipeline-real.ts`), with one V8 isolate (≈ 90 MB) less. Sampled
 * tokens are the same either way.
 *
 * @category models
 * @since 0.1.0
 */
export const EngineConfig = Schema.Struct({
  thread: Schema.optionalKey(Schema.Boolean),
  /**
   * How the local engines hold a policy version's weights (`actors/internal/engineModel.ts`). `"initializers"`:
   * onnxruntime copies them into each version's session and pre-packs them (the fastest decoding; ≈ 8 bytes a
   * parameter per session besides the version's own copy). `"inputs"`: fed on every step from the published
   * version's arrays (no onnxruntime copy, one session for every version, and in a sync run no copy while the learner
   * steps; its products are not pre-packed: ≈ 0.74 of the decoding speed at Qwen2.5-0.5B's shapes, BENCHMARKS.md
   * "0.5 B end to end under 12 GiB"). Both sample the same tokens. `"auto"` (default): `"inputs"` where only it fits the machine's memory
   * (`MemoryEstimate`), else `"initializers"` (the embedded presets and `npm run demo` always). A LoRA run's engines
   * always take their weights as inputs (`docs/lora.md`).
   */
  weights: Schema.optionalKey(Schema.Literals(["auto", "initializers", "inputs"])),
  /**
   * Inference servers that sample the rollouts instead of the local engine: the API roots of `agentfly serve
   * --accept-weights` processes (`http://HOST:PORT/v1`), here or on other machines. The learner stays in this
   * process and pushes every version it publishes to all of them (`actors/InferenceServers.ts`); a run goes on while
   * one of them answers. Runs with servers do not repeat to the digit (each server batches what arrives).
   */
  servers: Schema.optionalKey(Schema.Array(ApiRoot).check(Schema.isMinLength(1))),
  /**
   * With `servers`: how long one sampling request may wait for a server's answer before it is tried elsewhere
   * (default 60 s; a long answer of a large model on a busy server may need more).
   */
  timeoutSeconds: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 86_400 })))
})

/**
 * Rollout workers: `agentfly rollout-worker` processes (here or on other machines) that run a training batch's
 * chains, tools, rewards and environments instead of this process (`actors/RolloutWorker.ts`). Each takes a
 * contiguous share of a batch's rows with the ids and seeds this process would give them; a share whose worker fails
 * goes to another. The workers sample on `engine.servers` (required with workers); evaluations and warm-up checks
 * still run in this process.
 *
 * @category models
 * @since 0.1.0
 */
export const RolloutConfig = Schema.Struct({
  workers: Schema.optionalKey(Schema.Array(ApiRoot).check(Schema.isMinLength(1))),
  /**
   * Instead of `workers`: a Redis server (`redis://HOST:PORT`) whose streams carry the batches' shares to whichever
   * `agentfly rollout-worker CONFIG --queue URL` processes are running, and their groups back
   * (`actors/RolloutQueue.ts`): workers may join and leave during the run; a dead worker's share goes to another.
   */
  queue: Schema.optionalKey(
    Schema.String.check(
      Schema.makeFilter((url) =>
        /^rediss?:\/\/[^/\s]+/.test(url) ||
        `expected a Redis address such as redis://10.0.0.7:6379, got ${JSON.stringify(url)}`
      )
    )
  ),
  /** Rows a share of the queue (default: each batch in 8 shares). */
  shareRows: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 1_000_000 }))),
  /**
   * How long a share may take (`workers`: on one worker, then it goes to the next) or a batch on the queue may wait
   * for its groups before the run stops (default 1,800 s).
   */
  timeoutSeconds: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 86_400 })))
})

/**
 * Where a run's OpenTelemetry traces and metrics go (`actors/Telemetry.ts`, docs/watch.md). Without this section a
 * run exports nothing unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set; `enabled: false` turns export off even then.
 *
 * @category models
 * @since 0.1.0
 */
export const TelemetryConfig = Schema.Struct({
  enabled: Schema.optionalKey(Schema.Boolean),
  /** An OTLP/HTTP collector's base URL (`http://localhost:4318`); `/v1/traces` and `/v1/metrics` are appended. */
  endpoint: Schema.optionalKey(
    Schema.String.check(
      Schema.makeFilter((url) =>
        /^https?:\/\/[^/\s]+/.test(url) ||
        `expected an OTLP/HTTP address such as http://localhost:4318, got ${JSON.stringify(url)}`
      )
    )
  ),
  /** The body's encoding (default: `OTEL_EXPORTER_OTLP_PROTOCOL`, else `http/protobuf`, as OpenTelemetry's SDKs). */
  protocol: Schema.optionalKey(Schema.Literals(["http/protobuf", "http/json"])),
  /** The `service.name` of the resource (default: `OTEL_SERVICE_NAME`, else `agentfly`). */
  serviceName: Schema.optionalKey(Schema.String),
  /** How often buffered spans and metrics are sent (default 5,000 ms); the rest is sent when the run ends. */
  exportIntervalMs: Schema.optionalKey(IntIn(10, 600_000))
})

const maxStalenessDefault = 1

/**
 * A whole training run. `mode: "async"` lets rollouts run ahead of the learner by at most `maxStaleness` policy
 * versions; `"sync"` generates each batch with the current policy.
 *
 * @category models
 * @since 0.1.0
 */
export const TrainConfig = Schema.Struct({
  name: Schema.optionalKey(Schema.String),
  /**
   * The task: a built-in name (`"calculator"`) or a module path (`"./task.ts"`, exporting `task`), optionally with
   * options (`{ "name": "calculator", "options": { "toolCallFormat": 0.2 } }`). Optional in a task module, which
   * exports its task beside the config.
   */
  task: Schema.optionalKey(TaskRef),
  seed: withDefault(Seed, 0),
  output: Schema.String,
  model: ModelConfig,
  data: DataConfig,
  agent: withDefault(AgentConfig, {}),
  algorithm: AlgorithmConfig,
  /** The critic of `algorithm.advantage: "gae"`; its defaults apply when the section is left out. */
  critic: Schema.optionalKey(CriticConfig),
  warmup: Schema.optionalKey(WarmupConfig),
  mode: withDefault(Schema.Literals(["sync", "async"]), "sync"),
  /** Async mode only: a sync run, which would ignore it, refuses a value above the default (0 and 1 pass). */
  maxStaleness: withDefault(IntIn(0, 16), maxStalenessDefault),
  eval: withDefault(EvalConfig, {}),
  checkpoint: withDefault(CheckpointConfig, {}),
  learner: withDefault(LearnerConfig, {}),
  engine: withDefault(EngineConfig, {}),
  rollout: withDefault(RolloutConfig, {}),
  sampleTrajectories: withDefault(IntIn(0, 1_000), 4),
  /**
   * The largest share of a step's trajectories that may fail for infrastructure reasons (environment, lease,
   * reward, sampler, chain defects) before the run stops with a typed error naming the reason; 1 never stops.
   */
  maxFailureShare: withDefault(Probability, 0.5),
  /** OpenTelemetry export of the run's traces and metrics (docs/watch.md); off unless configured. */
  telemetry: Schema.optionalKey(TelemetryConfig)
})
export type TrainConfig = typeof TrainConfig.Type

/**
 * A config as written (a config file's object, or one built in code): what {@link decode} takes, every default
 * left out. Typing a config in code with it catches a misspelt key at compile time.
 *
 * @category models
 * @since 0.1.0
 */
export type Input = typeof TrainConfig.Encoded

// ===== Errors =====

/**
 * Why a config cannot be used: `Unreadable`, `Syntax`, `Invalid` (a key's value; its heading is "invalid config"),
 * `UnsupportedFormat`; or `OutputInUse`: the config is fine, but its output directory already holds a run (the
 * source is that directory; `--resume` or `--overwrite` go on).
 *
 * @category errors
 * @since 0.1.0
 */
export const ConfigErrorReason = Schema.Literals([
  "Unreadable",
  "Syntax",
  "Invalid",
  "UnsupportedFormat",
  "OutputInUse"
])

/**
 * A config that cannot be used. `issues` lists one line per problem, each starting with the dotted path of the
 * offending key.
 *
 * @category errors
 * @since 0.1.0
 */
export class ConfigError extends Schema.TaggedError<ConfigError>()("ConfigError", {
  source: Schema.String,
  reason: ConfigErrorReason,
  issues: Schema.Array(Schema.String)
}) {
  override get message(): string {
    const heading = this.reason === "Invalid"
      ? "invalid config"
      : this.reason === "OutputInUse"
      ? "the output directory already holds a run"
      : this.reason
    return `${this.source}: ${heading}\n  ` + this.issues.join("\n  ")
  }
}

// ===== Issue formatting =====

/**
 * One line per problem, `path: message`, with a suggestion for mistyped keys (`SchemaIssues.formatIssues`, shared with
 * task options), and the value given when the decode kept it ({@link decodeOptions}): `algorithm.steps: Expected
 * number, got "12"` (cut to 60 characters).
 *
 * @category formatting
 * @since 0.1.0
 */
export const formatIssues: (schema: Schema.Top, issue: SchemaIssue.Issue) => Array<string> = SchemaIssues.formatIssues

/**
 * The parse options for a decode whose issues {@link formatIssues} prints: every problem, the values given kept.
 *
 * @category formatting
 * @since 0.1.0
 */
export const decodeOptions = SchemaIssues.decodeOptions

// ===== Constructors =====

const decodeStrict = Schema.decodeUnknownEffect(TrainConfig)

/**
 * A config as it runs on a model: its context budget (`agent.maxContextTokens`) filled in with the model's positions
 * when the config leaves it unset, so that the rollouts, the learner and the run's recorded `config.json` use the same
 * one. The one place a config is resolved against its model: `agentfly train`, `eval`, `rollout-worker` and
 * `LocalPolicy` all call it.
 *
 * @category constructors
 * @since 0.1.0
 */
export const onModel = (
  config: TrainConfig,
  model: { readonly maxPositionEmbeddings: number }
): TrainConfig => ({
  ...config,
  agent: { ...config.agent, maxContextTokens: config.agent.maxContextTokens ?? model.maxPositionEmbeddings }
})

/**
 * Decodes a config value strictly (unknown keys are errors), reporting every problem with its path.
 *
 * @category constructors
 * @since 0.1.0
 */
export const decode = (input: unknown, source = "config"): Effect.Effect<TrainConfig, ConfigError> =>
  decodeStrict(withoutUndefined(input), { ...SchemaIssues.decodeOptions, onExcessProperty: "error" }).pipe(
    Effect.mapError((e) =>
      new ConfigError({ source, reason: "Invalid", issues: formatIssues(TrainConfig, e.issue) })
    ),
    Effect.flatMap((config) => {
      const issues = crossKeyIssues(config)
      return issues.length === 0
        ? Effect.succeed(withDiscounts(config))
        : Effect.fail(new ConfigError({ source, reason: "Invalid", issues }))
    })
  )

/**
 * The discounts the estimator uses, written out with their defaults (verl's γ = λ = 1) where unset, so that a run's
 * recorded `config.json` says what it trained with; an estimator that uses none gets none.
 */
const withDiscounts = (config: TrainConfig): TrainConfig => {
  const { advantage, gamma, lambda } = config.algorithm
  const discounts = advantage === "gae"
    ? { gamma: gamma ?? Advantage.defaultConfig.gamma, lambda: lambda ?? Advantage.defaultConfig.lambda }
    : advantage === "reinforce++"
    ? { gamma: gamma ?? Advantage.defaultConfig.gamma }
    : {}
  return { ...config, algorithm: { ...config.algorithm, ...discounts } }
}

/**
 * The input without keys whose value is `undefined`, at any depth: a TypeScript config's `warmup: undefined` means
 * what a JSON file's missing key does (JSON cannot say `undefined`).
 */
const withoutUndefined = (input: unknown): unknown => {
  if (Array.isArray(input)) return input.map(withoutUndefined)
  if (typeof input !== "object" || input === null || Object.getPrototypeOf(input) !== Object.prototype) return input
  return Object.fromEntries(
    Object.entries(input).flatMap(([key, value]) => (value === undefined ? [] : [[key, withoutUndefined(value)]]))
  )
}

/** Bounds that involve several keys, one line per problem in {@link formatIssues}' style. */
const crossKeyIssues = (config: TrainConfig): Array<string> => {
  const { groupsPerStep, advantage } = config.algorithm
  const trajectories = groupsPerStep * config.agent.numChains
  return [
    ...(trajectories > maxTrajectoriesPerStep
      ? [
        `algorithm.groupsPerStep: ${groupsPerStep} groups × agent.numChains ${config.agent.numChains} is ` +
        `${trajectories} trajectories per step; expected at most ${maxTrajectoriesPerStep}`
      ]
      : []),
    ...(config.algorithm.dynamicSampling !== undefined && !isGroupRelative(advantage)
      ? [
        `algorithm.dynamicSampling: only a group-relative estimator ("grpo", "grpo-no-std", "rloo") loses groups ` +
        `whose rewards are equal (the advantage is "${advantage}")`
      ]
      : []),
    ...(config.algorithm.overlong !== undefined &&
        config.algorithm.overlong.bufferTokens > config.algorithm.overlong.maxTokens
      ? [
        `algorithm.overlong.bufferTokens: ${config.algorithm.overlong.bufferTokens} is more than maxTokens ` +
        `(${config.algorithm.overlong.maxTokens})`
      ]
      : []),
    ...(typeof config.algorithm.dualClip === "number" && (config.algorithm.policyLoss ?? "ppo") !== "ppo"
      ? [`algorithm.dualClip: only policyLoss "ppo" has a dual clip (the loss is "${config.algorithm.policyLoss}")`]
      : []),
    ...(config.critic !== undefined && advantage !== "gae"
      ? [`critic: only algorithm.advantage "gae" has a critic (the advantage is "${advantage}")`]
      : []),
    // Keys the chosen estimator or mode would ignore: a run that silently trains without them is not the run asked for.
    ...(config.algorithm.lambda !== undefined && advantage !== "gae"
      ? [`algorithm.lambda: only algorithm.advantage "gae" uses GAE's λ (the advantage is "${advantage}")`]
      : []),
    ...(config.algorithm.gamma !== undefined && advantage !== "gae" && advantage !== "reinforce++"
      ? [`algorithm.gamma: only algorithm.advantage "reinforce++" and "gae" discount (the advantage is "${advantage}")`]
      : []),
    ...(config.algorithm.miniBatches > groupsPerStep
      ? [
        `algorithm.miniBatches: ${config.algorithm.miniBatches} mini-batches of whole groups need at least as many ` +
        `groups a step (algorithm.groupsPerStep is ${groupsPerStep})`
      ]
      : []),
    ...(config.mode === "sync" && config.maxStaleness > maxStalenessDefault
      ? [
        `maxStaleness: ${config.maxStaleness} applies only in async mode (every sync batch samples with the current ` +
        `policy): set "mode": "async"`
      ]
      : []),
    // A learning rate still ramping up when the run ends never reaches the `lr` asked for (often a warm-up's step
    // count written where the RL phase's belongs).
    ...(config.algorithm.lrWarmupSteps > config.algorithm.steps
      ? [
        `algorithm.lrWarmupSteps: ${config.algorithm.lrWarmupSteps} is more than algorithm.steps ` +
        `${config.algorithm.steps}: the learning rate would never reach algorithm.lr`
      ]
      : []),
    ...(config.warmup !== undefined && config.warmup.warmupSteps > config.warmup.steps
      ? [
        `warmup.warmupSteps: ${config.warmup.warmupSteps} is more than warmup.steps ${config.warmup.steps}: the ` +
        `learning rate would never reach warmup.lr`
      ]
      : []),
    ...(config.critic !== undefined && config.critic.lrWarmupSteps > config.algorithm.steps
      ? [
        `critic.lrWarmupSteps: ${config.critic.lrWarmupSteps} is more than algorithm.steps ` +
        `${config.algorithm.steps}: the critic's learning rate would never reach critic.lr`
      ]
      : []),
    ...tinkerIssues(config),
    ...localLearnerIssues(config),
    ...(config.critic !== undefined && config.critic.warmupSteps >= config.algorithm.steps
      ? [
        `critic.warmupSteps: ${config.critic.warmupSteps} of algorithm.steps ${config.algorithm.steps} train the ` +
        `critic alone, which leaves no step for the policy`
      ]
      : [])
  ]
}

/** `learner.moments` and `learner.recompute` set where the steps run elsewhere (a trainer server, a Tinker engine). */
const localLearnerIssues = (config: TrainConfig): Array<string> => {
  const { learner } = config
  const elsewhere = learner.backend === "tinker"
    ? `learner.backend "tinker"`
    : learner.url !== undefined
    ? "learner.url (the trainer server keeps its own settings)"
    : undefined
  if (elsewhere === undefined) return []
  return (["moments", "recompute"] as const).flatMap((key) =>
    learner[key] === undefined ? [] : [`learner.${key}: only read by the local learner, not with ${elsewhere}`]
  )
}

/** A Tinker learner's section and the settings it cannot train (`TinkerLoss.refusals`). */
const tinkerIssues = (config: TrainConfig): Array<string> => {
  const { algorithm, learner } = config
  if (learner.backend !== "tinker") {
    return learner.tinker === undefined ? [] : [`learner.tinker: only read with learner.backend "tinker"`]
  }
  if (learner.tinker === undefined) return [`learner.tinker: learner.backend "tinker" needs baseUrl and baseModel`]
  const stale = config.mode === "async" && config.maxStaleness > 0 && (algorithm.policyLoss ?? "ppo") === "ppo"
  const dualClip = algorithm.dualClip === "off" ? undefined : algorithm.dualClip ?? (stale ? 3 : undefined)
  return TinkerLoss.refusals({
    advantage: algorithm.advantage,
    policyLoss: algorithm.policyLoss,
    klCoef: algorithm.klCoef,
    klInReward: algorithm.klInReward,
    entropyCoef: algorithm.entropyCoef,
    dualClip,
    tisCap: algorithm.tisCap,
    temperature: config.agent.temperature,
    distillation: algorithm.distillation !== undefined,
    lora: config.model.lora !== undefined,
    url: learner.url !== undefined,
    // A LoRA model's adapters are loaded on the servers (`tinkerLearner.ts`); full weights are not pushed.
    servers: config.engine.servers !== undefined && learner.tinker.loraRank === undefined
  })
}

/**
 * The critic's settings of a config (its defaults where the section is left out).
 *
 * @category getters
 * @since 0.1.0
 */
export const criticOf = (config: TrainConfig): CriticConfig => config.critic ?? criticDefaults

const criticDefaults: CriticConfig = Schema.decodeUnknownSync(CriticConfig)({})

/**
 * What differs between two configs (as JSON values, e.g. a run's recorded `config.json` and the one it is resumed
 * with), one line per key by dotted path: `seed: 11 → 12`, `algorithm.lr: 0.001 → 0.002`, `warmup: removed`.
 * Keys in `ignore` (dotted paths) are skipped.
 *
 * @category getters
 * @since 0.1.0
 */
export const changes = (before: unknown, after: unknown, ignore: ReadonlyArray<string> = []): Array<string> => {
  const out: Array<string> = []
  const show = (v: unknown) => (v === undefined ? "unset" : JSON.stringify(v))
  const isRecord = (v: unknown): v is Record<string, unknown> =>
    typeof v === "object" && v !== null && !Array.isArray(v)
  const walk = (a: unknown, b: unknown, path: string): void => {
    if (ignore.includes(path)) return
    if (isRecord(a) && isRecord(b)) {
      for (const key of [...new Set([...Object.keys(a), ...Object.keys(b)])].sort()) {
        walk(a[key], b[key], path === "" ? key : `${path}.${key}`)
      }
      return
    }
    if (JSON.stringify(a) !== JSON.stringify(b)) out.push(`${path || "(root)"}: ${show(a)} → ${show(b)}`)
  }
  walk(before, after, "")
  return out
}

/**
 * Resolves the config's relative paths (model, datasets, warm-up data and its validation split, output) against a
 * directory.
 *
 * @category combinators
 * @since 0.1.0
 */
export const resolvePaths = (config: TrainConfig, resolve: (p: string) => string): TrainConfig => ({
  ...config,
  // A task module's path too: the run's recorded config.json is then a config that `agentfly eval` and a resume
  // can be given from anywhere (left relative, it named a module beside the run's output).
  ...(config.task === undefined ? {} : { task: resolveTask(config.task, resolve) }),
  output: resolve(config.output),
  model: {
    ...config.model,
    path: resolve(config.model.path),
    ...(config.model.from === undefined ? {} : { from: resolve(config.model.from) })
  },
  data: {
    ...config.data,
    train: resolve(config.data.train),
    ...(config.data.eval === undefined ? {} : { eval: resolve(config.data.eval) })
  },
  ...(config.algorithm.distillation === undefined || !("path" in config.algorithm.distillation.teacher) ? {} : {
    algorithm: { ...config.algorithm, distillation: resolveTeacher(config.algorithm.distillation, resolve) }
  }),
  ...(config.warmup === undefined ? {} : {
    warmup: {
      ...config.warmup,
      data: resolve(config.warmup.data),
      ...(config.warmup.stopAt === undefined ? {} : {
        stopAt: { ...config.warmup.stopAt, data: resolve(config.warmup.stopAt.data) }
      })
    }
  })
})

/** A local teacher's folder and checkpoint, resolved as the model's are. */
const resolveTeacher = (config: Distillation.Config, resolve: (p: string) => string): Distillation.Config => {
  const teacher = config.teacher
  if (!("path" in teacher)) return config
  const checkpoint = teacher.checkpoint === undefined ? {} : { checkpoint: resolve(teacher.checkpoint) }
  return { ...config, teacher: { ...teacher, path: resolve(teacher.path), ...checkpoint } }
}

const resolveTask = (ref: TaskRef, resolve: (p: string) => string): TaskRef =>
  typeof ref === "string"
    ? (isModulePath(ref) ? resolve(ref) : ref)
    : (isModulePath(ref.name) ? { ...ref, name: resolve(ref.name) } : ref)

const readModule = (file: string) =>
  Effect.tryPromise({
    try: () => importUserModule(file),
    // A module that is not there, or whose imports its folder cannot find, is unreadable, not a syntax error.
    catch: (e) =>
      new ConfigError({
        source: file,
        reason: isNotFound(e) ? "Unreadable" : "Syntax",
        issues: [loadProblem(e, file)]
      })
  })

/**
 * A config file as read, before decoding: its raw value, its directory (relative paths are resolved against it)
 * and, for a module, everything it exports (a task module exports `task` beside its config).
 *
 * @category models
 * @since 0.1.0
 */
export interface Source {
  readonly file: string
  readonly dir: string
  readonly raw: unknown
  readonly exports: Readonly<Record<string, unknown>>
}

/**
 * Reads a config file: `.json`, `.yaml` / `.yml`, or a TypeScript / JavaScript module exporting the config as
 * its default export (or as `config`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const read = Effect.fn("TrainConfig.read")(function*(file: string) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const absolute = path.resolve(file)
  const extension = path.extname(absolute).toLowerCase()
  const dir = path.dirname(absolute)
  if ([".ts", ".mts", ".js", ".mjs"].includes(extension)) {
    const exports = yield* readModule(absolute)
    const raw = exports["default"] ?? exports["config"]
    if (raw === undefined) {
      // A task module without a config: say that, not every key the missing config would have had.
      return yield* new ConfigError({
        source: file,
        reason: "Invalid",
        issues: [
          `the module exports no config (a default export or \`export const config\`)` +
          (exports["task"] === undefined
            ? ""
            : `; to train its task, name the module from a config (paths are relative to the config file; from a ` +
              `config beside it: "task": "./${file.split(/[\\/]/).at(-1)}")`)
        ]
      })
    }
    return { file, dir, raw, exports } satisfies Source
  }
  if ([".json", ".yaml", ".yml"].includes(extension)) {
    const text = yield* fs.readFileString(absolute).pipe(
      Effect.mapError((e) =>
        new ConfigError({
          source: file,
          reason: "Unreadable",
          issues: [e.reason._tag === "NotFound" ? `no such file (${absolute})` : e.message]
        })
      )
    )
    const raw = yield* Effect.try({
      // YAML is a superset of JSON; the yaml parser reports line and column for both.
      try: () => Yaml.parse(text, { prettyErrors: true, uniqueKeys: true }) as unknown,
      catch: (e) => new ConfigError({ source: file, reason: "Syntax", issues: [String(e).split("\n")[0]!] })
    })
    return { file, dir, raw, exports: {} } satisfies Source
  }
  // A run's output directory is the usual slip (`agentfly eval runs/x`): it holds the config the run resolved.
  const isDirectory = yield* fs.stat(absolute).pipe(
    Effect.map((info) => info.type === "Directory"),
    Effect.orElseSucceed(() => false)
  )
  const recorded = path.join(absolute, "config.json")
  return yield* new ConfigError({
    source: file,
    reason: "UnsupportedFormat",
    issues: [
      !isDirectory
        ? `expected .json, .yaml, .yml, .ts or .js, got "${extension}"`
        : (yield* fs.exists(recorded).pipe(Effect.orElseSucceed(() => false)))
        ? `a directory, not a config file; the run there recorded its config: give ${recorded}`
        : `a directory, not a config file (.json, .yaml, .yml, .ts or .js)`
    ]
  })
})

/**
 * Decodes a read config (after `transform`, e.g. a task's defaults) and resolves its relative paths against its
 * directory.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromSource = (
  source: Source,
  transform: (raw: unknown) => unknown = (raw) => raw
): Effect.Effect<TrainConfig, ConfigError, Path.Path> =>
  Effect.flatMap(Path.Path, (path) =>
    Effect.map(
      decode(transform(source.raw), source.file),
      (config) => resolvePaths(config, (p) => path.resolve(source.dir, p))
    ))

/**
 * Loads a config file ({@link read}, then {@link fromSource}). Relative paths inside are resolved against the
 * file's directory.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = (file: string): Effect.Effect<TrainConfig, ConfigError, FileSystem.FileSystem | Path.Path> =>
  Effect.flatMap(read(file), (source) => fromSource(source))
