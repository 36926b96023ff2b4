/**
 * Which of our losses and algorithms a Tinker engine trains exactly (`learner.backend: "tinker"`), as pure functions:
 * the Tinker loss of a `Loss.Config`, and the config keys a Tinker learner refuses, each with its reason. The table
 * is `docs/tinker-training.md`'s; `TrainConfig.decode` reports the refusals as config issues before a run starts.
 *
 * Every Tinker loss is `Σ_t weights[t] · ℓ_t` over a datum's tokens (`src/tinker/Datums.ts`), and our aggregation
 * modes are such weights (`Loss.aggregationWeights`, computed over the whole mini-batch before packing), so the
 * aggregation maps exactly whatever its mode. What cannot cross is what the API has no input or output for: a
 * second model (critic, KL reference), the full distribution (entropy), a ratio over a whole sequence, two kinds of
 * logprobs per token (TIS), a bound on the ratio below a negative advantage (dual clip), a sampling temperature.
 *
 * @since 0.1.0
 */
import type * as Loss from "../Loss.ts"
import type * as Types from "../tinker/Types.ts"

/**
 * The Tinker loss and its `loss_fn_config` for one of our losses, or why there is none.
 *
 * @category models
 * @since 0.1.0
 */
export type Mapping =
  | {
    readonly lossFn: Exclude<Types.LossFnType, "dro">
    readonly lossFnConfig?: Readonly<Record<string, number>> | undefined
  }
  | { readonly refused: string }

/**
 * The Tinker loss of `config`: `nll` → `cross_entropy`; `ppo` → `ppo` with `clip_low_threshold = 1 − clipLow`,
 * `clip_high_threshold = 1 + clipHigh`; `cispo` → `cispo` (the same gradient; its loss value is CISPO's surrogate,
 * not our tangent form). Anything the API cannot express is refused with the reason.
 *
 * @category constructors
 * @since 0.1.0
 */
export const lossFnOf = (config: Loss.Config): Mapping => {
  const extra = extraTerms(config)
  if (extra !== undefined) return { refused: extra }
  const thresholds = { clip_low_threshold: 1 - config.clipLow, clip_high_threshold: 1 + config.clipHigh }
  switch (config.policyLoss) {
    case "nll":
      return { lossFn: "cross_entropy" }
    case "ppo":
      return { lossFn: "ppo", lossFnConfig: thresholds }
    case "cispo":
      return { lossFn: "cispo", lossFnConfig: thresholds }
    case "gspo":
      return { refused: reasons.gspo }
    case "value":
      return { refused: reasons.critic }
  }
}

/** The terms of `config` beyond the policy loss that a Tinker loss has no input for. */
const extraTerms = (config: Loss.Config): string | undefined =>
  config.klCoef !== 0
    ? reasons.kl
    : config.entropyCoef !== 0
    ? reasons.entropy
    : config.dualClip !== undefined
    ? reasons.dualClip
    : config.tisCap !== undefined
    ? reasons.tis
    : config.temperature !== undefined && config.temperature !== 1
    ? reasons.temperature
    : undefined

/**
 * Why each refused setting cannot run on a Tinker engine.
 *
 * @category models
 * @since 0.1.0
 */
export const reasons = {
  critic: "PPO with a critic (advantage \"gae\") trains a second model with a value head; a Tinker model is one " +
    "LM with the API's token losses, none of them a value loss",
  kl: "a KL term to a frozen reference needs the reference's logprobs inside the loss; Tinker's losses take " +
    "target tokens, logprobs, advantages and weights only",
  klInReward: "KL in the reward needs a frozen reference model's logprobs, which this learner computes locally " +
    "from the weights a Tinker engine keeps",
  entropy: "an entropy bonus needs the full next-token distribution; Tinker's losses see the target tokens' " +
    "logprobs only",
  gspo: "GSPO's ratio is one per sequence (a mean over its tokens); Tinker's ratios are per token",
  dualClip: "Tinker's ppo has no dual clip (the bound on the ratio for negative advantages); set " +
    "algorithm.dualClip to \"off\" (async runs with maxStaleness > 0 default it to 3)",
  tis: "truncated importance weights need the proximal and the sampling logprobs of each token; a Tinker datum " +
    "carries one logprobs",
  temperature: "Tinker computes the learner's logprobs at temperature 1; rollouts sampled at another temperature " +
    "would train on the wrong distribution's ratios",
  distillation: "on-policy distillation's teacher runs beside the local learner; it is not wired to a Tinker learner",
  lora: "model.lora trains a local adapter; with a Tinker engine the adapter lives there: set learner.tinker.loraRank",
  url: "learner.url is another remote learner; choose one",
  servers: "engine.servers loads each version's LoRA adapter on your servers; a full-weights Tinker model " +
    "(no learner.tinker.loraRank) has no adapter to load (sampling goes through its asample instead)"
} as const

/**
 * The settings of a run that a Tinker learner cannot train as asked, as config issues (`key: reason`). `algorithm`
 * is the config's, `dualClip` its effective dual clip (a number when on), `temperature` the rollouts'.
 *
 * @category constructors
 * @since 0.1.0
 */
export const refusals = (run: {
  readonly advantage: string
  readonly policyLoss: string | undefined
  readonly klCoef: number
  readonly klInReward: number | undefined
  readonly entropyCoef: number
  readonly dualClip: number | undefined
  readonly tisCap: number | undefined
  readonly temperature: number
  readonly distillation: boolean
  readonly lora: boolean
  readonly url: boolean
  /** `engine.servers` with a full-weights Tinker model (a LoRA model's adapters are loaded there). */
  readonly servers: boolean
}): Array<string> => {
  const issue = (key: string, why: string) => `${key}: refused with learner.backend "tinker": ${why}`
  return [
    ...(run.advantage === "gae" ? [issue("algorithm.advantage", reasons.critic)] : []),
    ...(run.policyLoss === "gspo" ? [issue("algorithm.policyLoss", reasons.gspo)] : []),
    ...(run.klCoef !== 0 ? [issue("algorithm.klCoef", reasons.kl)] : []),
    ...((run.klInReward ?? 0) !== 0 ? [issue("algorithm.klInReward", reasons.klInReward)] : []),
    ...(run.entropyCoef !== 0 ? [issue("algorithm.entropyCoef", reasons.entropy)] : []),
    ...(run.dualClip !== undefined ? [issue("algorithm.dualClip", reasons.dualClip)] : []),
    ...(run.tisCap !== undefined ? [issue("algorithm.tisCap", reasons.tis)] : []),
    ...(run.temperature > 0 && run.temperature !== 1 ? [issue("agent.temperature", reasons.temperature)] : []),
    ...(run.distillation ? [issue("algorithm.distillation", reasons.distillation)] : []),
    ...(run.lora ? [issue("model.lora", reasons.lora)] : []),
    ...(run.url ? [issue("learner.url", reasons.url)] : []),
    ...(run.servers ? [issue("engine.servers", reasons.servers)] : [])
  ]
}
