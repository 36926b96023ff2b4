/**
 * An estimate of a local training run's peak resident memory, from the model's shapes and the learner's settings,
 * so that a run that cannot fit is refused before it starts (with settings that would fit) instead of being killed
 * by the out-of-memory killer in its first step, silently.
 *
 * The parts, in bytes, for `P` parameters (float32 everywhere):
 * - `weights`: 4·P, plus 4·P per learner worker thread when `workers > 1` (onnxruntime-node rejects
 *   `SharedArrayBuffer`-backed tensors, so each worker feeds a private copy of the shared weights). A LoRA run's
 *   workers copy only their adapters (4·A each) and map the frozen base from one file (one more 4·P, in the page
 *   cache, for all of them: `backends/internal/frozenFile.ts`).
 * - `gradients`: the accumulator (4·P) and what a run leaves beside it: with one worker the returned copy of every
 *   gradient and, from the second micro-batch of a step, onnxruntime's own outputs (8·P); with workers, per worker
 *   its accumulator in shared memory, onnxruntime's outputs and their copy (12·P each). The copies are freed after
 *   each micro-batch (`OnnxTrainer.Options.releaseOutputs`), but they come at the end of a run, on top of the
 *   activations that malloc has not yet returned, so they still count.
 * - `optimizer`: AdamW's two moments, 8·P (4·P with `learner.moments` "bfloat16").
 *   (A LoRA run trains its adapters alone: `gradients` and `optimizer` count them, not P.)
 * - `activations`: what the backward pass keeps of each layer, per token `(12·D + 4·F + H·T)` floats (hidden width
 *   D, MLP width F, H heads attending to T positions): the values the training graph holds from the forward to the
 *   backward, counted node by node on the graph at Qwen2.5-0.5B's width (the attention's probabilities, four
 *   `[tokens, F]` tensors of the MLP, twelve of the hidden width). Until issue 41's last changes it was
 *   `(8·D + 5·F + 2·H·T)`, fitted to measurements that also held a transposed copy of every layer weight. With
 *   activation recompute (`learner.recompute`) one layer's inside plus `2·D` floats a token for every layer (what
 *   `scripts/graph-liveness.ts --recompute` counts: 627, 704 and 788 MiB at 1, 12 and 24 layers for 2 × 512 tokens).
 * - `head`: the output head's working set, about six float tensors per worker of one tile's logits (as many cells
 *   as `defaultChunk` tokens of the whole vocabulary: `autodiff/ChunkedHead.ts`), or of the whole shard's logits when
 *   they fit in one tile.
 * - `extra`: the KL reference's weights (4·P) and a GAE critic (a second trainer on the trunk), when the run has them;
 *   the sampling side; the process and onnxruntime (0.4 GiB). With engines that take their weights as initializers
 *   (`engine.weights`) the sampling side is ≈ 20·P: the model folder's weights, held for the run (4·P), the
 *   published versions a run keeps (2 × 4·P) and the decode engine's session (onnxruntime's copy of the weights and
 *   its pre-packed products, ≈ 8·P). Measured on a whole run at Qwen2.5-0.5B's shapes (24 layers, micro-batches of
 *   1 × 640 tokens): 23.2 GiB when the out-of-memory killer ended it after its third RL step, where 12·P for the
 *   sampling side estimated 20.2 GiB and let it start on a 23.6 GiB machine; 20·P estimates 23.9 GiB. With engines
 *   fed the published version's arrays as inputs it is 4·P a published version held while the learner steps
 *   (`publishedVersions`: none in sync mode, which lets them go then; `maxStaleness + 1` in async mode), plus the
 *   folder's 4·P where the caller keeps its weights (`agentfly train` hands them over once the learner has its own
 *   copy). While a sync run samples, it holds one version (4·P) and the learner's state without activations: less
 *   than a learner step. Measured on the whole run above with bfloat16 moments and recompute (engines fed as inputs):
 *   9.73 GiB, where this estimates 10.17 GiB (BENCHMARKS.md, "0.5 B end to end under 12 GiB").
 *
 * Measured with `scripts/learner-memory.ts` at Qwen2.5-0.5B's width (1 worker, 4 × 512 tokens): 1 layer (151 M
 * parameters) estimated 4.40 GiB, measured 4.04 GiB (4.64 GiB before the gradient copies were freed and the
 * transposed weights dropped). bfloat16 moments measured 4.0 bytes a parameter less (12 layers, 2 × 512 tokens:
 * 8.14 → 6.97 GiB; 24 layers, 1 × 512: 10.76 → 8.96 GiB).
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as ChunkedHead from "./autodiff/ChunkedHead.ts"
import type * as Optimizer from "./Optimizer.ts"
import type * as ModelConfig from "./model/ModelConfig.ts"
import * as Qwen2 from "./model/Qwen2.ts"

const GiB = 1024 ** 3

// ===== Models =====

/**
 * What the estimate reads of a run.
 *
 * @category models
 * @since 0.1.0
 */
export interface Settings {
  /** Rows of a micro-batch (`algorithm.microBatchSize`). */
  readonly microBatchSize: number
  /** Tokens of a row (`agent.maxContextTokens`). */
  readonly sequenceLength: number
  /** Learner worker threads (`learner.workers`). */
  readonly workers: number
  /** A frozen KL reference is held (`algorithm.klCoef > 0`). Default false. */
  readonly reference?: boolean
  /** A GAE critic is trained beside the policy. Default false. */
  readonly critic?: boolean
  /** AdamW's moments' precision (`learner.moments`). Default float32. */
  readonly moments?: Optimizer.Precision
  /**
   * Activation recompute (`learner.recompute`) with glibc's mmap threshold fixed (`MALLOC_MMAP_THRESHOLD_`): without
   * it the freed activations stay resident and the peak does not fall, so a caller counts recompute only then.
   * Default false.
   */
  readonly recompute?: boolean
  /** The decode engine runs in this process. Default true. */
  readonly engine?: boolean
  /** How the engines hold a version's weights (`engine.weights`, resolved). Default `"initializers"`. */
  readonly engineWeights?: "initializers" | "inputs"
  /** With engines fed as `"inputs"`: the published versions held while the learner steps (default 1). */
  readonly publishedVersions?: number
  /** With engines fed as `"inputs"`: the model folder's weights are released once the learner has its own. */
  readonly folderReleased?: boolean
  /**
   * Parameters the learner trains, with gradients and AdamW moments: a LoRA run's adapters (`model.lora`; its base
   * is frozen). Default all of the model's.
   */
  readonly trainedParameters?: number
}

/**
 * Estimated peak bytes, by part, and their total.
 *
 * @category models
 * @since 0.1.0
 */
export interface Estimate {
  readonly parameters: number
  readonly weights: number
  readonly gradients: number
  readonly optimizer: number
  readonly activations: number
  readonly head: number
  readonly extra: number
  readonly total: number
}

/**
 * A run whose estimated peak exceeds the machine's memory. `fits` lists settings that would fit (a smaller
 * micro-batch, fewer workers), best first; empty when none does.
 *
 * @category errors
 * @since 0.1.0
 */
export class OutOfMemory extends Schema.TaggedError<OutOfMemory>()("OutOfMemory", {
  message: Schema.String,
  /** Estimated peak bytes. */
  estimate: Schema.Number,
  /** The machine's memory (bytes): the cgroup limit, or the physical memory. */
  available: Schema.Number,
  fits: Schema.Array(Schema.Struct({
    microBatchSize: Schema.Number,
    workers: Schema.Number,
    /** Present where the fit needs bfloat16 moments (`learner.moments`). */
    moments: Schema.optionalKey(Schema.Literal("bfloat16")),
    /** Present where the fit needs activation recompute (`learner.recompute`). */
    recompute: Schema.optionalKey(Schema.Literal(true)),
    estimate: Schema.Number
  }))
}) {}

/**
 * Settings that would fit (an entry of `OutOfMemory.fits`).
 *
 * @category models
 * @since 0.1.0
 */
export type Fit = OutOfMemory["fits"][number]

// ===== Estimate =====

/**
 * The estimated peak resident bytes of a training run of `model` with `settings`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const estimate = (model: ModelConfig.ModelConfig, settings: Settings): Estimate => {
  const P = Qwen2.parameters(model).reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0)
  const { workers, microBatchSize, sequenceLength: T } = settings
  const D = model.hiddenSize
  const tokens = microBatchSize * T
  const A = settings.trainedParameters ?? P
  const lora = settings.trainedParameters !== undefined
  const weights = 4 * P + (workers > 1 ? 4 * A * workers + (lora ? 4 * P : 0) : 0)
  const gradients = 4 * A + (workers > 1 ? 12 * A * workers : 8 * A)
  const optimizer = (settings.moments === "bfloat16" ? 4 : 8) * A
  const perToken = 12 * D + 4 * model.intermediateSize + model.numAttentionHeads * T
  const activations = settings.recompute === true
    ? 4 * tokens * (2 * D * model.numHiddenLayers + perToken)
    : 4 * tokens * model.numHiddenLayers * perToken
  const shardTokens = Math.ceil(microBatchSize / Math.max(1, Math.min(workers, microBatchSize))) * T
  const head = 6 * 4 * model.vocabSize * Math.min(shardTokens, ChunkedHead.defaultChunk(model.vocabSize)) *
    Math.min(workers, microBatchSize)
  const trunkP = P - (model.tieWordEmbeddings ? 0 : model.vocabSize * D)
  const extra = 0.4 * GiB + (settings.reference === true ? 4 * P : 0) +
    (settings.critic === true ? weights + gradients + optimizer + activations - 28 * (P - trunkP) : 0) +
    (settings.engine === false ? 0 : samplingSide(P, settings))
  const total = weights + gradients + optimizer + activations + head + extra
  return { parameters: P, weights, gradients, optimizer, activations, head, extra, total }
}

/** The sampling side's bytes for `P` parameters (module notes: `extra`). */
const samplingSide = (P: number, settings: Settings): number =>
  settings.engineWeights === "inputs"
    ? 4 * P * ((settings.publishedVersions ?? 1) + (settings.folderReleased === true ? 0 : 1))
    : 20 * P

/** Bytes as GiB with two decimals. */
const gib = (bytes: number) => `${(bytes / GiB).toFixed(2)} GiB`

/**
 * One line per part, for messages: `weights 0.56 GiB, gradients …`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const describe = (e: Estimate): string =>
  `weights ${gib(e.weights)}, gradients ${gib(e.gradients)}, optimizer ${gib(e.optimizer)}, ` +
  `activations ${gib(e.activations)}, output head ${gib(e.head)}, reference, critic, engine and runtime ` +
  `${gib(e.extra)}`

/**
 * Settings that fit in `available` bytes, best first: the micro-batch halved until it fits, at the given workers
 * and with one worker; then, at the run's micro-batch and workers, bfloat16 moments or activation recompute (either
 * alone where it fits, else both), where the run does not have them already.
 *
 * @category combinators
 * @since 0.1.0
 */
export const fitting = (model: ModelConfig.ModelConfig, settings: Settings, available: number): Array<Fit> => {
  const out: Array<Fit> = []
  for (const workers of [...new Set([settings.workers, 1])]) {
    for (let rows = settings.microBatchSize; rows >= 1; rows = rows === 1 ? 0 : Math.floor(rows / 2)) {
      const total = estimate(model, { ...settings, workers, microBatchSize: rows }).total
      if (total <= available) {
        out.push({ microBatchSize: rows, workers, estimate: total })
        break
      }
    }
  }
  return [...out, ...memorySettings(model, settings, available)]
}

/** bfloat16 moments, recompute, or both (only where neither alone fits): those the run lacks that fit. */
const memorySettings = (model: ModelConfig.ModelConfig, settings: Settings, available: number): Array<Fit> => {
  const bf16 = settings.moments === "bfloat16" ? [] : [{ moments: "bfloat16" as const }]
  const recompute = settings.recompute === true ? [] : [{ recompute: true as const }]
  const at = (extra: { readonly moments?: "bfloat16"; readonly recompute?: true }): Fit => ({
    microBatchSize: settings.microBatchSize,
    workers: settings.workers,
    ...extra,
    estimate: estimate(model, { ...settings, ...extra }).total
  })
  const alone = [...bf16, ...recompute].map(at).filter((f) => f.estimate <= available)
  if (alone.length > 0 || bf16.length === 0 || recompute.length === 0) return alone
  const both = at({ moments: "bfloat16", recompute: true })
  return both.estimate <= available ? [both] : []
}

/** The longest context (halved from the run's, down to 256 tokens) that fits one row on one worker, if any. */
const shorterContext = (model: ModelConfig.ModelConfig, settings: Settings, available: number) => {
  for (let length = Math.floor(settings.sequenceLength / 2); length >= 256; length = Math.floor(length / 2)) {
    const total = estimate(model, { ...settings, sequenceLength: length, microBatchSize: 1, workers: 1 }).total
    if (total <= available) return { sequenceLength: length, microBatchSize: 1, workers: 1, estimate: total }
  }
  return undefined
}

const setting = (f: Fit) =>
  `algorithm.microBatchSize ${f.microBatchSize} with learner.workers ${f.workers}` +
  (f.moments === undefined ? "" : ` and learner.moments "bfloat16"`) +
  (f.recompute === undefined ? "" : " and learner.recompute true (with MALLOC_MMAP_THRESHOLD_=1048576 set)") +
  ` (${gib(f.estimate)})`

/**
 * `undefined` when the run fits in `available` bytes, else the refusal: the estimate by part and the settings that
 * would fit.
 *
 * @category combinators
 * @since 0.1.0
 */
export const check = (
  model: ModelConfig.ModelConfig,
  settings: Settings,
  available: number
): OutOfMemory | undefined => {
  const e = estimate(model, settings)
  if (e.total <= available) return undefined
  const fits = fitting(model, settings, available)
  const shorter = fits.length === 0 ? shorterContext(model, settings, available) : undefined
  const advice = fits.length > 0
    ? `these would fit: ${fits.map(setting).join("; ")}`
    : shorter !== undefined
    ? `no micro-batch size or worker count fits at ${settings.sequenceLength} tokens a row; this would: ` +
      `agent.maxContextTokens ${shorter.sequenceLength} with ${setting(shorter)}`
    : "no micro-batch size, worker count or context length fits: use a machine with more memory or a smaller model"
  return new OutOfMemory({
    message: `the run needs about ${gib(e.total)} (${describe(e)}) for ${(e.parameters / 1e6).toFixed(0)} M ` +
      `parameters, micro-batches of ${settings.microBatchSize} × ${settings.sequenceLength} tokens and ` +
      `${settings.workers} learner worker(s), more than the ${gib(available)} this machine has; ${advice}`,
    estimate: e.total,
    available,
    fits
  })
}

/**
 * Peak bytes per parameter, the figure `metrics.jsonl` carries beside the peak RSS.
 *
 * @category combinators
 * @since 0.1.0
 */
export const bytesPerParameter = (model: ModelConfig.ModelConfig, peakBytes: number): number =>
  peakBytes / Qwen2.parameters(model).reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0)

