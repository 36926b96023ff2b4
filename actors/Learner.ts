/**
 * The learner of a run: the {@link Learner} service the training loop drives (RL and SFT steps, checkpoints, the
 * weights' fingerprint), and {@link update}, one RL step over the `GradientBackend` in context, which the local
 * learner (`actors/LocalPolicy.ts`) runs for `learn`.
 *
 * {@link update} takes a step's groups of token-masked trajectories, computes advantages, packs micro-batches, runs
 * the optimiser step(s) and returns the step's `learner/*` figures. It is a function, not an actor: the pipeline
 * around it (how far rollouts run ahead, the bounded hand-over of batches, publishing each step's weights as the next
 * policy version) belongs to the training loop (`actors/TrainLoop.ts`).
 *
 * All maths is in `src/` ({@link update} only moves data between `Advantage`, `Packing` and the trainer):
 * - a trajectory takes part only when it is `trainable`, not `masked` and `rewardStatus === "scored"`; others are
 *   excluded from their group's baseline and from the loss;
 * - advantages are computed per trajectory (its segments concatenated), with the outcome reward on its last policy
 *   token (a folded trajectory's segment rewards each on its segment's last one), then split back per segment: each
 *   segment is one packed row;
 * - the loss aggregation weights span the whole mini-batch, so micro-batch gradients sum exactly.
 *
 * @since 0.1.0
 */
import { Clock, Context, Effect } from "effect"
import type * as Dataset from "../src/Dataset.ts"
import { Advantage, Distillation, GradientBackend, Loss, Packing, Trajectory } from "../src/index.ts"
import type * as VisionTower from "../src/model/VisionTower.ts"
import { LearnerError, learnerError } from "./internal/learnerError.ts"
import { withImages } from "./internal/sequenceImages.ts"
import type { RunError } from "./RunError.ts"

// ===== The service =====

/**
 * Named figures of one step (`learner/…`, `warmup/…`).
 *
 * @category models
 * @since 0.1.0
 */
export type Figures = Readonly<Record<string, number>>

/**
 * What one RL step did: `Applied` (the policy moved; `loss` is the step's), `Skipped` (no update: no group had a
 * learning signal, every advantage was 0), or `CriticOnly` (a step of the critic's warm-up: the policy did not move).
 * `figures` are the step's `learner/*` figures either way.
 *
 * @category models
 * @since 0.1.0
 */
export type Outcome =
  | { readonly _tag: "Applied"; readonly loss: number; readonly figures: Figures }
  | { readonly _tag: "Skipped"; readonly why: "NoSignal"; readonly figures: Figures }
  | { readonly _tag: "CriticOnly"; readonly figures: Figures }

/**
 * The learning side of a run as the loop drives it: RL and SFT steps on the learner's weights, checkpoints and the
 * weights' fingerprint. The local learner is onnxruntime's (`LocalPolicy.layer`); a remote trainer can stand behind
 * the same service. Publishing the weights as policy versions is `PolicyVersions`' job.
 *
 * @category services
 * @since 0.1.0
 */
export class Learner extends Context.Service<Learner, {
  /** One RL update on these groups (advantages, loss, optimiser step). */
  readonly learn: (step: number, groups: ReadonlyArray<Trajectory.Group>) => Effect.Effect<Outcome, RunError>
  /** One SFT step (masked NLL on assistant tokens) on demonstration conversations; returns `warmup/...` figures. */
  readonly sft: (step: number, rows: ReadonlyArray<Dataset.Row>) => Effect.Effect<Figures, RunError>
  /** Saves weights and optimiser state into `dir` (which exists and is empty). */
  readonly save: (dir: string) => Effect.Effect<void, RunError>
  readonly load: (dir: string) => Effect.Effect<void, RunError>
  /** A fingerprint of the learner's weights (journaled after every step), computed once per change of weights. */
  readonly fingerprint: Effect.Effect<string, RunError>
  /** Figures of the learner's own machinery for a step's metrics (a trainer server: `trainer/…`), if any. */
  readonly figures?: Effect.Effect<Figures> | undefined
}>()("agentfly/actors/Learner") {}

// ===== Models =====

/**
 * Learner options.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly estimator: Advantage.Estimator
  readonly advantage?: Partial<Advantage.Config>
  /** The loss configuration the trainer was built with (its aggregation mode drives the packing weights). */
  readonly loss: Loss.Config
  /** Maximum rows × padded length per micro-batch. */
  readonly tokenBudget: number
  /** Most tokens of one sequence (the model's positions); a longer one fails the step with a `Packing` error. */
  readonly maxLength?: number
  readonly lengthMultiple?: number
  /**
   * See `Packing.Options.padRows`: pads micro-batches with empty rows so that shapes depend on length only, which
   * bounds the number of compiled graphs (≈ 0.3 s each). Default true; only the last micro-batch of a step wastes
   * compute.
   */
  readonly padRows?: boolean
  /**
   * See `Packing.Options.rowSteps`. Default 1: every micro-batch has the capacity's rows. 4 pads a step's last
   * micro-batch to a quarter of the capacity instead (on the calculator config ≈ 9 of its 19 rows were padding,
   * ≈ 10 % of the learner's work), at the price of up to 4 graphs per length; it changes the last bits of the weights
   * (other shard sizes sum in another order), so runs recorded with 1 do not repeat to the digit with 4.
   */
  readonly rowSteps?: number
  /**
   * See `Packing.Options.sharePrefix`: a group's prompt computed once, each chain's own tokens in a row attending to
   * it. Default false here; `agentfly train` turns it on (`learner.sharePrefix`, default true).
   */
  readonly sharePrefix?: boolean
  /**
   * Optimiser steps per learner step (verl's `train_batch_size / ppo_mini_batch_size`): the step's groups are split
   * into this many mini-batches of whole groups, each packed and normalised on its own, and the optimiser steps
   * after each. Advantages are computed once, over the whole step. Default 1.
   */
  readonly miniBatches?: number
  /** Passes over the step's mini-batches (verl's `ppo_epochs`). Default 1. */
  readonly epochs?: number
  /**
   * Recompute the old (proximal) policy's logprobs with the learner's current weights before the update, instead
   * of trusting the sampler's: the PPO ratio is then exactly 1 at the update and `loss.tisCap` corrects the
   * train/inference mismatch (older policy version or a different engine) with truncated importance weights.
   * Costs one forward pass per micro-batch. Default false.
   */
  readonly recomputeOldLogprobs?: boolean
  /** The tower's pixels of a segment's image spans (a vision model's: `Packing.Sequence.images`); none if absent. */
  readonly segmentImages?: (segment: Trajectory.Segment) => ReadonlyArray<VisionTower.Pixels> | undefined
  /**
   * KL in the reward (instead of, or besides, `loss.klCoef`): every policy token's reward becomes
   * `r − β·(log π_sampler − log π_ref)` before advantages are computed (`Loss.penalizeRewards`). Needs
   * `reference`.
   */
  readonly klInReward?: number
  /**
   * Reference-policy logprobs of a micro-batch's targets, required when `loss.klCoef !== 0` or `klInReward` is set
   * (e.g. `OnnxTrainer.makeReference`).
   */
  readonly reference?: (batch: Packing.MicroBatch) => Effect.Effect<Float32Array, GradientBackend.GradientBackendError>
  /**
   * The critic of the `gae` estimator (required by it): a trainer over a value model (`OnnxTrainer.qwen2Value`)
   * built with `Loss.value`. Before the update it gives every policy token its value (its "logprobs"); GAE turns
   * rewards and values into advantages and returns, and the critic then learns the returns over the same
   * mini-batches and epochs as the policy (`critic/*` figures).
   */
  readonly critic?: GradientBackend.GradientBackend["Service"]
  /**
   * On-policy distillation (`src/Distillation.ts`): the teacher scores every included segment's tokens and each
   * policy token's advantage becomes `rewardWeight·A + coef·(log π_teacher − log π_sampler)` (figure
   * `learner/teacher_kl`: the mean of `log π_sampler − log π_teacher`, the reverse KL's estimate).
   */
  readonly distillation?: {
    readonly teacher: Distillation.Teacher
    readonly coef: number
    readonly rewardWeight: number
  }
  /**
   * DAPO's over-long shaping: `Loss.overlongPenalty` of each trajectory's policy-token count is added to its reward
   * before advantages are computed.
   */
  readonly overlong?: Parameters<typeof Loss.overlongPenalty>[1]
  /** Train the critic alone this step (its warm-up): the policy's trainer is not touched. */
  readonly criticOnly?: boolean
}

// The update's errors live beside it, in their own module; they are this module's as much.
export {
  AdvantageFailed,
  Config,
  LearnerError,
  learnerError,
  LearnerErrorReason,
  MissingLogprobs,
  PackingFailed,
  TrainerFailed
} from "./internal/learnerError.ts"

// ===== The update =====

/**
 * The result of one {@link update}.
 *
 * @category models
 * @since 0.1.0
 */
export interface UpdateResult {
  /**
   * `applied`, or why no update of the policy happened: no loss token with a gradient, every mini-batch non-finite, or
   * a step of the critic's warm-up (`criticOnly`).
   */
  readonly outcome: "applied" | "empty" | "non_finite" | "critic_only"
  /** The `learner/*` metrics, plus the step's `groups`, `trajectories` and `excluded` counts. */
  readonly figures: Readonly<Record<string, number>>
}

interface Row {
  readonly trajectory: Trajectory.Trajectory
  readonly group: number
  readonly included: boolean
}

const isIncluded = (t: Trajectory.Trajectory) => t.trainable && !t.masked && t.rewardStatus === "scored"

/** Concatenated per-trajectory token view: loss mask and the outcome reward on the last policy token. */
const advantageInput = (rows: ReadonlyArray<Row>, options: Pick<Options, "overlong"> = {}): Advantage.Input => {
  const lengths = rows.map((r) => r.trajectory.segments.reduce((n, s) => n + Trajectory.segmentLength(s), 0))
  const length = Math.max(1, ...lengths)
  const batch = rows.length
  const tokenRewards = new Float64Array(batch * length)
  const responseMask = new Uint8Array(batch * length)
  rows.forEach((row, b) => {
    let offset = b * length
    for (const segment of row.trajectory.segments) {
      const mask = Trajectory.lossMask(segment)
      responseMask.set(mask, offset)
      offset += mask.length
    }
    // A folded trajectory's segments carry rewards of their own (`ContextPolicy`): each on its last policy token.
    if (Trajectory.hasSegmentRewards(row.trajectory)) {
      Trajectory.placeSegmentRewards(row.trajectory, tokenRewards, b * length)
      return
    }
    const response = responseMask.subarray(b * length, (b + 1) * length)
    const last = response.lastIndexOf(1)
    const reward = options.overlong === undefined
      ? row.trajectory.reward
      : row.trajectory.reward + Loss.overlongPenalty(response.reduce((n, m) => n + m, 0), options.overlong)
    if (last >= 0) tokenRewards[b * length + last] = reward
  })
  return {
    batch,
    length,
    tokenRewards,
    responseMask,
    groupIndex: Int32Array.from(rows, (r) => r.group),
    include: Uint8Array.from(rows, (r) => (r.included ? 1 : 0))
  }
}

/** Each included segment of each row, with its offset in the row's concatenated tokens. */
const includedSegments = (rows: ReadonlyArray<Row>) => {
  const segments: Array<{ readonly row: number; readonly offset: number; readonly segment: Trajectory.Segment }> = []
  rows.forEach((row, b) => {
    if (!row.included) return
    let offset = 0
    for (const segment of row.trajectory.segments) {
      segments.push({ row: b, offset, segment })
      offset += Trajectory.segmentLength(segment)
    }
  })
  return segments
}

/**
 * Runs `score` (a forward pass: the reference's logprobs, the critic's values) over every included segment and
 * lays its outputs out as the advantage input's cells, beside the sampler's logprobs; `mask` marks policy tokens.
 */
const scoreTokens = Effect.fnUntraced(function*(
  rows: ReadonlyArray<Row>,
  input: Advantage.Input,
  options: Options,
  score: (batch: Packing.MicroBatch) => Effect.Effect<Float32Array, GradientBackend.GradientBackendError>,
  pack: { readonly padRows?: boolean; readonly sharePrefix?: boolean } = {}
) {
  const segments = includedSegments(rows)
  const sequences = segments.map((s) => withImages(Packing.fromSegment(s.segment), options.segmentImages?.(s.segment)))
  const packed = yield* Packing.pack(sequences, {
    tokenBudget: options.tokenBudget,
    aggregation: "token-mean",
    padRows: pack.padRows === true,
    sharePrefix: pack.sharePrefix === true,
    ...(options.maxLength === undefined ? {} : { maxLength: options.maxLength }),
    ...(options.lengthMultiple === undefined ? {} : { lengthMultiple: options.lengthMultiple })
  }).pipe(Effect.mapError((e) => learnerError("Packing", e.message, { cause: e })))
  const cells = input.batch * input.length
  const sampler = new Float64Array(cells)
  const scores = new Float64Array(cells)
  const mask = new Uint8Array(cells)
  for (const mb of packed.microBatches) {
    const scored = yield* score(mb).pipe(
      Effect.mapError((e) => learnerError("Trainer", e.message, { cause: e }))
    )
    mb.sequenceIndex.forEach((index, r) => {
      if (index < 0) return
      const { row, offset } = segments[index]!
      for (let t = 0; t < mb.length; t++) {
        const i = r * mb.length + t
        if (mb.mask[i] === 0) continue
        // position t (of the segment: rows after a shared prompt start past it) predicts the token after it
        const cell = row * input.length + offset + (mb.positionIds?.[i] ?? t) + 1
        sampler[cell] = mb.samplerLogprobs[i]!
        scores[cell] = scored[i]!
        mask[cell] = 1
      }
    })
  }
  return { sampler, scores, mask }
})

/**
 * KL in the reward: runs the reference policy over every included segment and returns the advantage input with
 * `r_t − β·(log π_sampler − log π_ref)` on policy tokens, plus the mean of `log π_sampler − log π_ref`.
 */
const penalizeWithReference = Effect.fnUntraced(function*(
  rows: ReadonlyArray<Row>,
  input: Advantage.Input,
  options: Options,
  coef: number
) {
  if (options.reference === undefined) {
    return yield* learnerError("Config", "klInReward is set but no reference policy is given")
  }
  const { sampler, scores: ref, mask } = yield* scoreTokens(rows, input, options, options.reference)
  let kl = 0
  for (let i = 0; i < mask.length; i++) kl += mask[i] ? sampler[i]! - ref[i]! : 0
  const tokens = mask.reduce((a, m) => a + m, 0)
  const tokenRewards = Loss.penalizeRewards(input.tokenRewards, sampler, ref, mask, coef)
  return { input: { ...input, tokenRewards }, meanKl: tokens > 0 ? kl / tokens : 0 }
})

/** The packing every trained pass of a step shares (the policy's and the critic's); each adds its aggregation. */
const packingOf = (options: Options) => ({
  tokenBudget: options.tokenBudget,
  ...(options.maxLength === undefined ? {} : { maxLength: options.maxLength }),
  ...(options.lengthMultiple === undefined ? {} : { lengthMultiple: options.lengthMultiple }),
  padRows: options.padRows ?? true,
  rowSteps: options.rowSteps ?? 1,
  sharePrefix: options.sharePrefix === true
})

/**
 * `epochs` passes over the mini-batches: each one's micro-batches through `accumulate`, then an optimiser step. A
 * non-finite mini-batch is skipped (the trainer dropped its gradients) and the others still apply.
 */
const optimize = Effect.fnUntraced(function*(
  trainer: GradientBackend.GradientBackend["Service"],
  packed: ReadonlyArray<Packing.Packed>,
  epochs: number,
  accumulate: (microBatches: ReadonlyArray<Packing.MicroBatch>) => Effect.Effect<void, LearnerError>,
  trainerError: (e: GradientBackend.GradientBackendError) => LearnerError
) {
  let applied = 0, gradNorm = 0, lr = 0, microBatches = 0
  for (let epoch = 0; epoch < Math.max(1, epochs); epoch++) {
    for (const p of packed) {
      yield* accumulate(p.microBatches).pipe(Effect.onError(() => trainer.discard))
      microBatches += p.microBatches.length
      const optim = yield* Effect.result(trainer.optimStep)
      if (optim._tag === "Failure") {
        if (optim.failure.reason._tag === "NonFiniteGradient") continue
        return yield* trainerError(optim.failure)
      }
      applied++
      gradNorm += optim.success.gradNorm
      lr = optim.success.lr
    }
  }
  return { applied, gradNorm, lr, microBatches }
})

/**
 * The critic's step: its values' targets are the GAE returns, over the policy's mini-batches (`chunks` of row
 * indices) and epochs. Returns the `critic/*` figures.
 */
const trainCritic = Effect.fnUntraced(function*(
  critic: GradientBackend.GradientBackend["Service"],
  rows: ReadonlyArray<Row>,
  input: Advantage.Input,
  values: Float64Array,
  returns: Float64Array,
  chunks: ReadonlyArray<ReadonlyArray<number>>,
  options: Options
) {
  const trainerError = (e: GradientBackend.GradientBackendError) =>
    learnerError("Trainer", `critic: ${e.message}`, { cause: e })
  const ofRow = new Map<number, Array<Packing.Sequence>>()
  rows.forEach((row, b) => {
    if (!row.included) return
    const sequences: Array<Packing.Sequence> = []
    let offset = b * input.length
    for (const segment of row.trajectory.segments) {
      const n = Trajectory.segmentLength(segment)
      // Token-aligned, as advantages are: the old values where the sampler's logprobs go, the returns as advantages.
      sequences.push({
        tokenIds: Trajectory.tokenIds(segment),
        lossMask: Trajectory.lossMask(segment),
        samplerLogprobs: Float32Array.from(values.subarray(offset, offset + n)),
        advantages: Float32Array.from(returns.subarray(offset, offset + n))
      })
      offset += n
    }
    ofRow.set(b, sequences)
  })
  const packed: Array<Packing.Packed> = []
  for (const chunk of chunks) {
    const sequences = chunk.flatMap((b) => ofRow.get(b) ?? [])
    const p = yield* Packing.pack(sequences, { ...packingOf(options), aggregation: "token-mean" }).pipe(
      Effect.mapError((e) => learnerError("Packing", `critic: ${e.message}`, { cause: e }))
    )
    if (p.totals.tokens > 0 && p.microBatches.length > 0) packed.push(p)
  }
  const sums = { loss: 0, tokens: 0, clipped: 0, squaredError: 0 }
  const { applied, gradNorm } = yield* optimize(critic, packed, options.epochs ?? 1, (microBatches) =>
    Effect.forEach(microBatches, (mb) =>
      Effect.map(Effect.mapError(critic.forwardBackward(mb), trainerError), (r) => {
        sums.loss += r.loss
        sums.tokens += r.tokens
        sums.clipped += r.clipped
        sums.squaredError += r.approxKl
      }), { discard: true }), trainerError)
  // verl's `vf_explained_var` over the policy tokens, and the means of the values and returns the critic saw.
  const mask = input.responseMask
  const include = input.include
  let n = 0, sumV = 0, sumR = 0, sumR2 = 0, sumD = 0, sumD2 = 0
  for (let i = 0; i < mask.length; i++) {
    if (mask[i] === 0 || (include !== undefined && include[Math.floor(i / input.length)] === 0)) continue
    const d = returns[i]! - values[i]!
    n++
    sumV += values[i]!
    sumR += returns[i]!
    sumR2 += returns[i]! ** 2
    sumD += d
    sumD2 += d * d
  }
  const variance = (s: number, s2: number) => Math.max(0, s2 / Math.max(1, n) - (s / Math.max(1, n)) ** 2)
  const varR = variance(sumR, sumR2)
  const updates = Math.max(1, packed.length * Math.max(1, options.epochs ?? 1))
  return {
    "critic/loss": sums.loss / updates,
    "critic/clip_frac": sums.clipped / Math.max(1, sums.tokens),
    "critic/mse": sums.squaredError / Math.max(1, sums.tokens),
    "critic/value_mean": sumV / Math.max(1, n),
    "critic/return_mean": sumR / Math.max(1, n),
    "critic/explained_variance": varR > 0 ? 1 - variance(sumD, sumD2) / varR : 0,
    "critic/grad_norm": applied > 0 ? gradNorm / applied : 0,
    "critic/optimizer_steps": applied
  }
})

/** Forward and backward over every micro-batch, adding the results into `sums`. */
const accumulate = Effect.fnUntraced(function*(
  microBatches: ReadonlyArray<Packing.MicroBatch>,
  options: Options,
  sums: Record<"loss" | "tokens" | "clipped" | "clippedLower" | "approxKl" | "entropy" | "kl" | "rowTokens", number>,
  trainerError: (e: GradientBackend.GradientBackendError) => LearnerError
) {
  const trainer = yield* GradientBackend.GradientBackend
  for (const mb of microBatches) {
    let batch = mb
    if (options.loss.klCoef !== 0) {
      if (options.reference === undefined) {
        const message = "loss.klCoef is set but no reference policy is given"
        return yield* learnerError("Config", message)
      }
      batch = { ...mb, refLogprobs: yield* options.reference(mb).pipe(Effect.mapError(trainerError)) }
    }
    if (options.recomputeOldLogprobs === true) {
      batch = { ...batch, oldLogprobs: yield* trainer.logprobs(batch).pipe(Effect.mapError(trainerError)) }
    }
    const r = yield* trainer.forwardBackward(batch).pipe(Effect.mapError(trainerError))
    sums.loss += r.loss
    sums.tokens += r.tokens
    sums.clipped += r.clipped
    sums.clippedLower += r.clippedLower
    sums.approxKl += r.approxKl
    sums.entropy += r.entropy
    sums.kl += r.kl
    sums.rowTokens += Packing.computedTokens(mb)
  }
})

/** Fails (`MissingLogprobs`) when an included trajectory lacks the sampler logprobs the step reads. */
const checkLogprobs = Effect.fnUntraced(function*(rows: ReadonlyArray<Row>, options: Options) {
  // The PPO ratio (unless recomputed), the importance weights and KL in the reward read the sampler's logprobs.
  const needsSamplerLogprobs = (Loss.isPolicyGradient(options.loss) &&
    (options.recomputeOldLogprobs !== true || options.loss.tisCap !== undefined)) ||
    (options.klInReward !== undefined && options.klInReward !== 0) || options.distillation !== undefined
  if (!needsSamplerLogprobs) return
  const unscored = (span: Trajectory.Span) => span.source === "policy" && span.logprobs === undefined
  const missing = rows.find((row) => row.included && row.trajectory.segments.some((s) => s.spans.some(unscored)))
  if (missing !== undefined) {
    const message = `trajectory ${missing.trajectory.trajectoryId} has policy tokens without sampler logprobs`
    return yield* learnerError("MissingLogprobs", message)
  }
})

/**
 * The step's advantages and returns, over the rewards penalised by the reference's KL (`klInReward`) and the
 * critic's values (`gae`) where the options ask for them.
 */
const estimate = Effect.fnUntraced(function*(rows: ReadonlyArray<Row>, options: Options) {
  const raw = advantageInput(rows, options)
  const penalized = options.klInReward !== undefined && options.klInReward !== 0
    ? yield* penalizeWithReference(rows, raw, options, options.klInReward)
    : undefined
  const critic = options.critic
  if (options.estimator === "gae" && critic === undefined) {
    return yield* learnerError("Config", "the gae estimator needs a critic (options.critic)")
  }
  // The critic's values of every policy token, before any update (verl's `compute_values`).
  const values = critic === undefined || options.estimator !== "gae"
    ? undefined
    : (yield* scoreTokens(rows, raw, options, critic.logprobs, {
      padRows: options.padRows ?? true,
      sharePrefix: options.sharePrefix === true
    })).scores
  const input = { ...(penalized?.input ?? raw), values }
  const computed = yield* Advantage.compute(options.estimator, input, options.advantage).pipe(
    Effect.mapError((e) => learnerError("Advantage", e.message, { cause: e }))
  )
  const { returns } = computed
  if (options.distillation === undefined) return { penalized, values, input, advantages: computed.advantages, returns }
  const distilled = yield* distill(rows, input.length, computed.advantages, options.distillation)
  return { penalized, values, input, advantages: distilled.advantages, returns, teacherKl: distilled.meanKl }
})

/**
 * On-policy distillation: the teacher's logprobs of every included segment's tokens, laid out as the advantages'
 * cells beside the sampler's, and the task's advantages mixed with the reverse-KL ones.
 */
const distill = Effect.fnUntraced(function*(
  rows: ReadonlyArray<Row>,
  length: number,
  advantages: Float64Array,
  options: NonNullable<Options["distillation"]>
) {
  const segments = includedSegments(rows)
  const scores = yield* options.teacher.score(segments.map((s) => Trajectory.tokenIds(s.segment))).pipe(
    Effect.mapError((e) => learnerError("Trainer", `teacher: ${e.message}`, { cause: e }))
  )
  const scored = segments.map(({ row, offset, segment }, k) => ({
    start: row * length + offset,
    mask: Trajectory.lossMask(segment),
    student: Trajectory.logprobs(segment),
    teacher: scores[k]!
  }))
  return Distillation.advantagesOf(advantages, scored, options.coef, options.rewardWeight)
})

/** Whole groups per mini-batch, in order: group g goes to mini-batch ⌊g·k / groups⌋. */
const miniBatching = (groups: number, options: Options) => {
  const k = Math.max(1, Math.min(options.miniBatches ?? 1, groups))
  return { k, miniBatchOf: (group: number) => Math.floor((group * k) / groups) }
}

/** The included rows' segments as sequences with their advantages, in their groups' mini-batches (`k`). */
const chunksOf = (
  rows: ReadonlyArray<Row>,
  length: number,
  advantages: Float64Array,
  { k, miniBatchOf }: ReturnType<typeof miniBatching>,
  options: Options
) => {
  const sequences: Array<Packing.Sequence> = []
  const sequenceGroup: Array<number> = []
  rows.forEach((row, b) => {
    if (!row.included) return
    let offset = b * length
    for (const segment of row.trajectory.segments) {
      const n = Trajectory.segmentLength(segment)
      const sequence = Packing.fromSegment(segment, Float32Array.from(advantages.subarray(offset, offset + n)))
      sequences.push(withImages(sequence, options.segmentImages?.(segment)))
      sequenceGroup.push(row.group)
      offset += n
    }
  })
  const chunks: Array<Array<Packing.Sequence>> = Array.from({ length: k }, () => [])
  sequences.forEach((sequence, i) => chunks[miniBatchOf(sequenceGroup[i]!)]!.push(sequence))
  return chunks
}

/** The policy's mini-batches (`chunks` of sequences), each packed into micro-batches; empty ones are left out. */
const packPolicy = Effect.fnUntraced(function*(chunks: ReadonlyArray<Array<Packing.Sequence>>, options: Options) {
  const packOptions = {
    ...packingOf(options),
    aggregation: options.loss.aggregation,
    ...(options.loss.normLength === undefined ? {} : { normLength: options.loss.normLength })
  }
  // A sequence whose advantages are all zero (a group without reward variance) has no gradient under a pure
  // policy-gradient loss, but it still counts in the loss's normalisation: a step where few groups carry a signal
  // is then a small step, as in verl, instead of one as large as a step where all do (which is noise under AdamW).
  // With a KL or entropy term every token has a gradient, so everything is computed.
  const gradientFree = options.loss.klCoef === 0 && options.loss.entropyCoef === 0
  const hasGradient = (s: Packing.Sequence) =>
    !gradientFree || s.advantages === undefined || s.advantages.some((a) => a !== 0)
  const packed: Array<Packing.Packed> = []
  for (const chunk of chunks) {
    const p = yield* Packing.pack(chunk.filter(hasGradient), { ...packOptions, aggregateOver: chunk }).pipe(
      Effect.mapError((e) => learnerError("Packing", e.message, { cause: e }))
    )
    if (p.totals.tokens > 0 && p.microBatches.length > 0) packed.push(p)
  }
  return packed
})

/** The policy's forward/backward passes and optimiser steps over `packed`, with the sums of their results. */
const trainPolicy = Effect.fnUntraced(function*(
  trainer: GradientBackend.GradientBackend["Service"],
  packed: ReadonlyArray<Packing.Packed>,
  options: Options
) {
  const sums = { loss: 0, tokens: 0, clipped: 0, clippedLower: 0, approxKl: 0, entropy: 0, kl: 0, rowTokens: 0 }
  const trainerError = (e: GradientBackend.GradientBackendError) =>
    learnerError("Trainer", e.message, { cause: e })
  const optimized = yield* optimize(
    trainer,
    packed,
    options.epochs ?? 1,
    (microBatches) =>
      accumulate(microBatches, options, sums, trainerError).pipe(
        Effect.asVoid,
        Effect.provideService(GradientBackend.GradientBackend, trainer)
      ),
    trainerError
  )
  return { ...optimized, sums }
})

/** An applied step's `learner/*` figures. */
const policyFigures = (
  trained: Effect.Success<ReturnType<typeof trainPolicy>>,
  packed: number,
  options: Options,
  elapsed: number
) => {
  const { sums, applied, gradNorm, lr, microBatches } = trained
  const per = (x: number) => x / Math.max(1, sums.tokens)
  const updates = packed * Math.max(1, options.epochs ?? 1)
  return {
    "learner/loss": sums.loss / updates,
    "learner/clip_frac": per(sums.clipped),
    "learner/clip_frac_lower": per(sums.clippedLower),
    "learner/approx_kl": per(sums.approxKl),
    "learner/entropy": per(sums.entropy),
    "learner/kl": per(sums.kl),
    "learner/grad_norm": gradNorm / applied,
    "learner/lr": lr,
    "learner/optimizer_steps": applied,
    "learner/loss_tokens": sums.tokens / updates,
    "learner/micro_batches": microBatches,
    "learner/tokens_per_s": (sums.rowTokens * 1000) / elapsed,
    "learner/step_ms": elapsed
  }
}

/**
 * One learner step over `groups` with the `GradientBackend` in context: advantages → packing → forward/backward per
 * micro-batch → optimiser step (one per mini-batch and epoch). Returns the step's outcome and figures.
 *
 * **Gotchas**
 * - Nothing is published: the new weights stay in the trainer until the caller publishes them (`PolicyVersions.publish`).
 * - A non-finite mini-batch is skipped (the trainer drops its gradients) and the others still apply; a step where
 *   all are skipped is `non_finite`. A failed forward/backward discards the gradients accumulated so far (none
 *   leaks into the next step) and fails the step, as does any other failed optimiser step.
 *
 * @category constructors
 * @since 0.1.0
 */
export const update = Effect.fn("Learner.update")(function*(
  groups: ReadonlyArray<Trajectory.Group>,
  options: Options
): Effect.fn.Return<UpdateResult, LearnerError, GradientBackend.GradientBackend> {
  const trainer = yield* GradientBackend.GradientBackend
  const started = yield* Clock.currentTimeMillis
  const rows: Array<Row> = groups.flatMap((g, group) =>
    g.trajectories.map((trajectory) => ({ trajectory, group, included: isIncluded(trajectory) }))
  )
  const excluded = rows.filter((r) => !r.included).length
  yield* checkLogprobs(rows, options)
  const estimated = yield* estimate(rows, options)
  const { penalized, values, input, advantages, returns } = estimated
  const base = {
    groups: groups.length,
    trajectories: rows.length,
    excluded,
    ...(penalized === undefined ? {} : { "learner/reward_kl": penalized.meanKl }),
    ...("teacherKl" in estimated ? { "learner/teacher_kl": estimated.teacherKl } : {})
  }
  const batching = miniBatching(groups.length, options)
  const { k, miniBatchOf } = batching
  const packed = yield* packPolicy(chunksOf(rows, input.length, advantages, batching, options), options)
  const criticFigures = values === undefined ? {} : yield* trainCritic(
    options.critic!,
    rows,
    input,
    values,
    returns,
    Array.from({ length: k }, (_, j) => rows.flatMap((r, b) => (miniBatchOf(r.group) === j ? [b] : []))),
    options
  )
  if (options.criticOnly === true && values !== undefined) {
    return { outcome: "critic_only" as const, figures: { ...base, ...criticFigures } }
  }
  if (packed.length === 0) return { outcome: "empty" as const, figures: { ...base, ...criticFigures } }
  const trained = yield* trainPolicy(trainer, packed, options)
  if (trained.applied === 0) return { outcome: "non_finite" as const, figures: { ...base, ...criticFigures } }
  const elapsed = Math.max(1, (yield* Clock.currentTimeMillis) - started)
  return {
    outcome: "applied" as const,
    figures: { ...base, ...criticFigures, ...policyFigures(trained, packed.length, options, elapsed) }
  }
})
