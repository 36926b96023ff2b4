/**
 * Packing of variable-length, token-masked sequences into padded micro-batches under a token budget.
 *
 * One row holds one sequence (a trajectory segment), right-padded. Rows are aligned for next-token prediction:
 * position `t` reads `inputIds[t]` and is trained on target `tokenIds[t + 1]`, so every per-token array (loss mask,
 * sampler logprobs, advantages, reference logprobs) is shifted left by one. Sequences are sorted by length
 * (longest first, ties by input order: deterministic) and packed greedily so that `rows × paddedLength ≤
 * tokenBudget`; the padded length is rounded up to `lengthMultiple` so that few distinct shapes (one compiled
 * graph each) occur.
 *
 * Aggregation weights (`Loss.aggregationWeights`) are computed from the totals of **all** sequences packed
 * together, so that summing micro-batch gradients equals the gradient of the whole mini-batch loss.
 *
 * With `sharePrefix`, sequences that begin with the same tokens before their first loss token (a GRPO group's
 * chains: one prompt, several continuations) are packed as their common tokens once (the micro-batch's `prefix`
 * rows) and each sequence's rest in a row of its own, whose tokens attend to their prompt's and to themselves
 * (`Qwen2.sharedPrefixGraph`), with positions that continue the prompt's. The loss is the same as with whole rows;
 * the learner computes each prompt once instead of once per chain.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import * as Loss from "./Loss.ts"
import * as Trajectory from "./Trajectory.ts"
import type * as VisionTower from "./model/VisionTower.ts"

// ===== Models =====

/**
 * One training sequence with per-token data aligned to `tokenIds` (not yet shifted).
 *
 * @category models
 * @since 0.1.0
 */
export interface Sequence {
  readonly tokenIds: Int32Array
  /** 1 where the policy sampled the token. */
  readonly lossMask: Uint8Array
  /** Sampler logprobs; read only where `lossMask` is 1. */
  readonly samplerLogprobs?: Float32Array | undefined
  /** Per-token advantages. */
  readonly advantages?: Float32Array | Float64Array | undefined
  /** Per-token reference-policy logprobs (KL penalty). */
  readonly refLogprobs?: Float32Array | undefined
  /**
   * The images of its `<|image_pad|>` tokens, in pad order (a vision model's: `VisionTower.ts`). Such a sequence is
   * never in a shared-prompt group (its prompt's pads need the tower).
   */
  readonly images?: ReadonlyArray<VisionTower.Pixels> | undefined
}

/**
 * A padded micro-batch, `[batch × length]` row-major.
 *
 * @category models
 * @since 0.1.0
 */
export interface MicroBatch {
  readonly batch: number
  readonly length: number
  readonly inputIds: Int32Array
  /** 1 on real tokens, 0 on padding. */
  readonly attentionMask: Uint8Array
  /** Each token's position in its sequence; absent = counted along the row's real tokens from 0. */
  readonly positionIds?: Int32Array | undefined
  /** The common tokens the rows continue (`sharePrefix`); absent = every row is a whole sequence. */
  readonly prefix?: Prefix | undefined
  readonly targets: Int32Array
  readonly mask: Uint8Array
  readonly weights: Float32Array
  readonly advantages: Float32Array
  readonly samplerLogprobs: Float32Array
  readonly refLogprobs: Float32Array
  /**
   * Logprobs of the targets under the learner's proximal ("old") policy, recomputed before the update; absent =
   * the sampler's logprobs stand in for them (then truncated importance weights are all 1).
   */
  readonly oldLogprobs?: Float32Array | undefined
  /** `[batch]`: index of each row's sequence in the input; −1 for an empty padding row (`padRows`). */
  readonly sequenceIndex: Int32Array
  /** Loss tokens in this micro-batch. */
  readonly lossTokens: number
  /** `[batch]`: each row's images in pad order (`Sequence.images`); absent when no row has any. */
  readonly images?: ReadonlyArray<ReadonlyArray<VisionTower.Pixels>> | undefined
}

/**
 * The prompts of a micro-batch's rows, `[batch × length]`, each row's continuing from position `length` of its own
 * (its real tokens are the first ones).
 *
 * @category models
 * @since 0.1.0
 */
export interface Prefix {
  readonly batch: number
  readonly length: number
  readonly inputIds: Int32Array
  /** 1 on real tokens, 0 on padding. */
  readonly attentionMask: Uint8Array
  /** `[rows]`: the prompt each row of the micro-batch continues. */
  readonly index: Int32Array
}

/**
 * Packing options.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Maximum `rows × paddedLength` per micro-batch. */
  readonly tokenBudget: number
  /** Padded lengths are rounded up to a multiple of this (default 16). */
  readonly lengthMultiple?: number
  /** Most tokens of one sequence, the model's positions (default: no limit beyond the budget). */
  readonly maxLength?: number
  readonly aggregation: Loss.AggregationMode
  /** For `seq-mean-token-sum-norm`; defaults to the longest padded length. */
  readonly normLength?: number
  /**
   * Pad every micro-batch with empty rows up to `⌊tokenBudget / length⌋` rows (the capacity; see `rowSteps`), so
   * that its shape depends on its padded length only: fewer distinct shapes, hence fewer compiled graphs (each costs
   * ≈ 0.3 s to create), at the price of computing padding rows. Default false.
   */
  readonly padRows?: boolean
  /**
   * With `padRows`, how many row counts a micro-batch of a given length may take: its rows are padded up to a
   * multiple of ⌈capacity / rowSteps⌉ (at most the capacity), so that the last micro-batch of a step, often half
   * full, computes fewer empty rows, at the price of up to `rowSteps` shapes per length. Default 1: every
   * micro-batch has the capacity's rows.
   */
  readonly rowSteps?: number
  /**
   * The sequences the loss is aggregated over, when they are more than the packed ones (default: the packed ones).
   * Sequences whose advantages are all zero add nothing to a policy-gradient loss but still count in its
   * normalisation (verl's `token-mean` over the whole batch), so a caller may leave them out of the compute only.
   */
  readonly aggregateOver?: ReadonlyArray<Sequence>
  /**
   * Pack sequences that share their tokens before their first loss token (at least 8 of them, at least two
   * sequences) as one prompt and their rests (see the module's description); others as whole rows. `rowSteps`
   * applies to the whole rows only. Default false.
   */
  readonly sharePrefix?: boolean
}

/**
 * A sequence is longer than the model's positions or the token budget.
 *
 * @category errors
 * @since 0.1.0
 */
export class SequenceTooLong extends Schema.TaggedError<SequenceTooLong>()("SequenceTooLong", {
  message: Schema.String,
  /** Its index. */
  sequence: Schema.Int,
  /** Its length. */
  tokens: Schema.Int
}) {}

/**
 * A sequence's arrays do not have one entry per token.
 *
 * @category errors
 * @since 0.1.0
 */
export class ShapeMismatch extends Schema.TaggedError<ShapeMismatch>()("ShapeMismatch", { message: Schema.String }) {}

/**
 * The token budget or the multiple is not positive.
 *
 * @category errors
 * @since 0.1.0
 */
export class BadBudget extends Schema.TaggedError<BadBudget>()("BadBudget", { message: Schema.String }) {}

/**
 * Why packing failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const PackingErrorReason = Schema.Union([SequenceTooLong, ShapeMismatch, BadBudget])
export type PackingErrorReason = typeof PackingErrorReason.Type

/**
 * Packing failed. `message` is the reason's. Handle reasons with
 * `Effect.catchReason("PackingError", "SequenceTooLong", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class PackingError extends Schema.TaggedError<PackingError>()("PackingError", {
  reason: PackingErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `packingError`; a reason left out is a compile error. */
const reasons = { SequenceTooLong, ShapeMismatch, BadBudget } satisfies Record<
  PackingErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message.
 *
 * @category errors
 * @since 0.1.0
 */
export type PackingErrorFacts<Tag extends PackingErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `PackingError` of the reason tagged `tag`: `packingError("SequenceTooLong", text, { sequence, tokens })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const packingError = <Tag extends PackingErrorReason["_tag"]>(
  tag: Tag,
  message: string,
  facts?: PackingErrorFacts<Tag>
): PackingError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => PackingErrorReason
  return new PackingError({ reason: new Reason({ ...facts, message }) })
}

// ===== Constructors =====

/**
 * The tokens a micro-batch computes: its rows' real tokens and its shared prompts' (`learner/tokens_per_s`).
 *
 * @category getters
 * @since 0.1.0
 */
export const computedTokens = (mb: MicroBatch): number => {
  let n = 0
  for (const m of mb.attentionMask) n += m
  for (const m of mb.prefix?.attentionMask ?? []) n += m
  return n
}

/**
 * Turns one trajectory segment plus per-token advantages into a {@link Sequence}.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromSegment = (
  segment: Trajectory.Segment,
  advantages?: Float32Array | Float64Array,
  refLogprobs?: Float32Array
): Sequence => ({
  tokenIds: Trajectory.tokenIds(segment),
  lossMask: Trajectory.lossMask(segment),
  samplerLogprobs: Trajectory.logprobs(segment),
  advantages,
  refLogprobs
})

const roundUp = (n: number, multiple: number) => Math.ceil(n / multiple) * multiple

const check = (sequences: ReadonlyArray<Sequence>, options: Options, multiple: number): PackingError | undefined => {
  if (!(options.tokenBudget > 0) || !(multiple > 0)) {
    const message = `token budget ${options.tokenBudget}, multiple ${multiple}`
    return packingError("BadBudget", message)
  }
  for (const [i, s] of sequences.entries()) {
    const n = s.tokenIds.length
    for (const [name, a] of [["lossMask", s.lossMask], ["samplerLogprobs", s.samplerLogprobs], [
      "advantages",
      s.advantages
    ], ["refLogprobs", s.refLogprobs]] as const) {
      if (a !== undefined && a.length !== n) {
        const message = `sequence ${i}: ${name} has ${a.length} entries, ${n} tokens`
        return packingError("ShapeMismatch", message)
      }
    }
    if (options.maxLength !== undefined && n > options.maxLength) {
      return packingError(
        "SequenceTooLong",
        `sequence ${i} has ${n} tokens, more than the model's ${options.maxLength} positions`,
        { sequence: i, tokens: n }
      )
    }
    if (roundUp(n, multiple) > options.tokenBudget) {
      return packingError(
        "SequenceTooLong",
        `sequence ${i} has ${n} tokens (padded ${roundUp(n, multiple)}), over the budget of ${options.tokenBudget}`,
        { sequence: i, tokens: n }
      )
    }
  }
  return undefined
}

/**
 * Packs sequences into micro-batches. Fails with `PackingError` when a sequence alone exceeds the budget or its
 * arrays disagree in length.
 *
 * @category constructors
 * @since 0.1.0
 */
export const pack = (
  sequences: ReadonlyArray<Sequence>,
  options: Options
): Effect.Effect<Packed, PackingError> =>
  Effect.suspend(() => {
    const error = check(sequences, options, options.lengthMultiple ?? 16)
    return error !== undefined ? Effect.fail(error) : Effect.succeed(packUnsafe(sequences, options))
  })

/**
 * The result of packing.
 *
 * @category models
 * @since 0.1.0
 */
export interface Packed {
  readonly microBatches: ReadonlyArray<MicroBatch>
  readonly totals: Loss.Totals
}

/**
 * {@link pack} without validation, for input already checked.
 *
 * @category constructors
 * @since 0.1.0
 */
export const packUnsafe = (sequences: ReadonlyArray<Sequence>, options: Options): Packed => {
  const multiple = options.lengthMultiple ?? 16
  // Totals over the shifted masks of every sequence of the mini-batch the loss is aggregated over.
  const over = options.aggregateOver ?? sequences
  let tokens = 0
  let nonEmpty = 0
  for (const s of over) {
    let n = 0
    for (let t = 1; t < s.lossMask.length; t++) n += s.lossMask[t] !== 0 ? 1 : 0
    tokens += n
    nonEmpty += n > 0 ? 1 : 0
  }
  const totals: Loss.Totals = { tokens, sequences: nonEmpty }
  const groups = options.sharePrefix === true ? shareGroups(sequences, options.tokenBudget, multiple) : []
  const inGroup = new Set(groups.flatMap((g) => g.members))
  const order = sequences.map((_, i) => i).filter((i) => !inGroup.has(i)).sort((a, b) =>
    sequences[b]!.tokenIds.length - sequences[a]!.tokenIds.length || a - b
  )
  const normLength = options.normLength ?? roundUp(Math.max(1, ...over.map((s) => s.tokenIds.length)), multiple)
  const microBatches: Array<MicroBatch> = []
  let start = 0
  while (start < order.length) {
    const length = roundUp(Math.max(1, sequences[order[start]!]!.tokenIds.length), multiple)
    const capacity = Math.floor(options.tokenBudget / length)
    const rows = Math.min(capacity, order.length - start)
    const slice = order.slice(start, start + rows)
    const step = Math.ceil(capacity / Math.max(1, options.rowSteps ?? 1))
    const padTo = options.padRows === true ? Math.min(capacity, Math.ceil(rows / step) * step) : rows
    const padded = padTo === rows ? slice : [...slice, ...new Array<number>(padTo - rows).fill(-1)]
    microBatches.push(withImages(sequences, fill(sequences, padded, length, totals, options.aggregation, normLength)))
    start += rows
  }
  for (const batch of sharedBatches(sequences, groups, options.tokenBudget, multiple, options.padRows === true)) {
    microBatches.push(fillShared(sequences, batch, totals, options.aggregation, normLength))
  }
  return { microBatches, totals }
}

/** A micro-batch with its rows' images, if any. */
const withImages = (sequences: ReadonlyArray<Sequence>, mb: MicroBatch): MicroBatch => {
  const images = Array.from(mb.sequenceIndex, (i) => (i < 0 ? [] : sequences[i]!.images ?? []))
  return images.every((row) => row.length === 0) ? mb : { ...mb, images }
}

/** Sequences sharing their first `shared` tokens, and no loss on them. */
interface Group {
  readonly shared: number
  readonly members: ReadonlyArray<number>
}

/** Fewer common tokens than this are copied, not shared: not worth a graph of their own. */
const minShared = 8

/**
 * Groups sequences by their tokens before their first loss token but one: the last common token's prediction is
 * each sequence's first loss token, so each sequence's own row starts with it. Groups of one are left out.
 */
const shareGroups = (sequences: ReadonlyArray<Sequence>, budget: number, multiple: number): Array<Group> => {
  const groups = new Map<string, { readonly shared: number; readonly members: Array<number> }>()
  sequences.forEach((s, i) => {
    if ((s.images?.length ?? 0) > 0) return
    let firstLoss = 1
    while (firstLoss < s.lossMask.length && s.lossMask[firstLoss] === 0) firstLoss++
    const shared = firstLoss - 1
    if (firstLoss === s.lossMask.length || shared < minShared) return
    const key = `${shared}:${s.tokenIds.subarray(0, shared).join(",")}`
    const group = groups.get(key)
    if (group === undefined) groups.set(key, { shared, members: [i] })
    else group.members.push(i)
  })
  // A prompt and a rest padded apart take up to one multiple more than the sequence padded whole: a group whose
  // longest does not fit the budget that way stays in whole rows.
  const fits = (g: Group) =>
    g.members.every((i) =>
      roundUp(g.shared, multiple) + roundUp(sequences[i]!.tokenIds.length - g.shared, multiple) <= budget
    )
  return [...groups.values()].filter((g) => g.members.length > 1 && fits(g))
}

/**
 * A shared micro-batch: its rows (sequence, its group's place among the prompts; −1: padding), its prompts and how
 * many prompt rows it takes (more with padding: empty ones).
 */
interface SharedBatch {
  readonly rows: ReadonlyArray<{ readonly sequence: number; readonly prefix: number }>
  readonly prefixes: ReadonlyArray<Group>
  readonly promptRows: number
  readonly rowLength: number
  readonly prefixLength: number
}

/**
 * Fills micro-batches with the groups' rows while `rows × rest length + prompt rows × prompt length` (both padded)
 * fits the budget, each micro-batch holding the prompts of its rows' groups, in the cheaper (fewer cells) of two
 * orders: longest rest first across groups (little padding of rests, but a micro-batch may need every group's
 * prompt) or group by group (a prompt or two a micro-batch, rests padded to their group's longest).
 *
 * With `padRows`, shapes depend on the padded lengths only (each shape costs a compiled graph, on every worker):
 * a micro-batch takes the most prompt rows its order can need (every group's across groups, `⌈rows / k⌉ + 1` group
 * by group, `k` the largest group), the unused ones empty, and its rows are padded to the most that fit beside them.
 */
const sharedBatches = (
  sequences: ReadonlyArray<Sequence>,
  groups: ReadonlyArray<Group>,
  budget: number,
  multiple: number,
  padRows: boolean
): Array<SharedBatch> => {
  const rest = (c: Chain) => sequences[c.sequence]!.tokenIds.length - c.group.shared
  const byRest = (a: Chain, b: Chain) => rest(b) - rest(a) || a.sequence - b.sequence
  const chainsOf = (group: Group) => group.members.map((sequence) => ({ group, sequence })).sort(byRest)
  const across = groups.flatMap(chainsOf).sort(byRest)
  const byGroup = groups.map(chainsOf).sort((a, b) => byRest(a[0]!, b[0]!)).flat()
  const k = Math.max(...groups.map((g) => g.members.length))
  const candidates = [
    // Every group's prompt, padded to a power of two: how many groups carry a signal varies from step to step.
    fillBatches(across, rest, budget, multiple, padRows ? () => 2 ** Math.ceil(Math.log2(groups.length)) : undefined),
    fillBatches(byGroup, rest, budget, multiple, padRows ? (n) => Math.ceil(n / k) + 1 : undefined)
  ]
  const cells = (batches: ReadonlyArray<SharedBatch>) =>
    batches.reduce((n, b) => n + b.rows.length * b.rowLength + b.promptRows * b.prefixLength, 0)
  return cells(candidates[1]!) < cells(candidates[0]!) ? candidates[1]! : candidates[0]!
}

interface Chain {
  readonly group: Group
  readonly sequence: number
}

/**
 * Micro-batches of `chains` in their order. With `padPrompts(rows)`, prompt rows are padded to that many (never
 * fewer than the prompts used: smaller groups than the largest may put more prompts beside the same rows), and rows
 * to what fits beside them.
 */
const fillBatches = (
  chains: ReadonlyArray<Chain>,
  rest: (c: Chain) => number,
  budget: number,
  multiple: number,
  padPrompts?: (rows: number) => number
): Array<SharedBatch> => {
  const padRows = padPrompts !== undefined
  const promptRows = (n: number, used: number) => (padPrompts === undefined ? used : Math.max(used, padPrompts(n)))
  const out: Array<SharedBatch> = []
  let rows: Array<{ sequence: number; prefix: number }> = []
  let prefixes: Array<Group> = []
  let rowLength = 0
  let prefixLength = 0
  const cost = (n: number, used: number, r: number, p: number) => n * r + promptRows(n, used) * p
  const close = () => {
    let n = rows.length
    while (padRows && cost(n + 1, prefixes.length, rowLength, prefixLength) <= budget) n++
    while (rows.length < n) rows.push({ sequence: -1, prefix: 0 })
    // Fewer empty prompt rows where a lone row and its padding would not fit (only with budgets of a few rows).
    const fit = Math.floor((budget - n * rowLength) / prefixLength)
    const prompts = Math.max(prefixes.length, Math.min(promptRows(n, prefixes.length), fit))
    out.push({ rows, prefixes, promptRows: prompts, rowLength, prefixLength })
    rows = []
    prefixes = []
    rowLength = prefixLength = 0
  }
  for (const chain of chains) {
    const r = Math.max(rowLength, roundUp(rest(chain), multiple))
    const p = Math.max(prefixLength, roundUp(chain.group.shared, multiple))
    const used = prefixes.length + (prefixes.includes(chain.group) ? 0 : 1)
    if (rows.length > 0 && cost(rows.length + 1, used, r, p) > budget) close()
    if (!prefixes.includes(chain.group)) prefixes.push(chain.group)
    rows.push({ sequence: chain.sequence, prefix: prefixes.indexOf(chain.group) })
    rowLength = Math.max(rowLength, roundUp(rest(chain), multiple))
    prefixLength = Math.max(prefixLength, roundUp(chain.group.shared, multiple))
  }
  if (rows.length > 0) close()
  return out
}

const fillShared = (
  sequences: ReadonlyArray<Sequence>,
  { prefixes, prefixLength, promptRows, rowLength, rows }: SharedBatch,
  totals: Loss.Totals,
  aggregation: Loss.AggregationMode,
  normLength: number
): MicroBatch => {
  const prefixIds = new Int32Array(promptRows * prefixLength)
  const prefixMask = new Uint8Array(promptRows * prefixLength)
  prefixes.forEach((g, k) => {
    prefixIds.set(sequences[g.members[0]!]!.tokenIds.subarray(0, g.shared), k * prefixLength)
    prefixMask.fill(1, k * prefixLength, k * prefixLength + g.shared)
  })
  const mb = fill(
    sequences,
    rows.map((r) => r.sequence),
    rowLength,
    totals,
    aggregation,
    normLength,
    rows.map((r) => prefixes[r.prefix]!.shared)
  )
  return {
    ...mb,
    prefix: {
      batch: promptRows,
      length: prefixLength,
      inputIds: prefixIds,
      attentionMask: prefixMask,
      index: Int32Array.from(rows, (r) => r.prefix)
    }
  }
}

const fill = (
  sequences: ReadonlyArray<Sequence>,
  rows: ReadonlyArray<number>,
  length: number,
  totals: Loss.Totals,
  aggregation: Loss.AggregationMode,
  normLength: number,
  from?: ReadonlyArray<number>
): MicroBatch => {
  const batch = rows.length
  const cells = batch * length
  const inputIds = new Int32Array(cells)
  const attentionMask = new Uint8Array(cells)
  const targets = new Int32Array(cells)
  const mask = new Uint8Array(cells)
  const advantages = new Float32Array(cells)
  const samplerLogprobs = new Float32Array(cells)
  const refLogprobs = new Float32Array(cells)
  // With `from`, row b holds tokens from[b]… of its sequence, at positions from[b]… (after its shared prompt).
  const positionIds = from === undefined ? undefined : new Int32Array(cells)
  let lossTokens = 0
  rows.forEach((index, b) => {
    if (index < 0) return // an empty padding row: no tokens, no loss
    const s = sequences[index]!
    const start = from?.[b] ?? 0
    const n = s.tokenIds.length - start
    const o = b * length - start // cell of token t: o + t
    inputIds.set(s.tokenIds.subarray(start), o + start)
    attentionMask.fill(1, o + start, o + start + n)
    for (let t = start; t < s.tokenIds.length; t++) {
      if (positionIds !== undefined) positionIds[o + t] = t
      if (t + 1 === s.tokenIds.length) break
      targets[o + t] = s.tokenIds[t + 1]!
      if (s.lossMask[t + 1] === 0) continue
      mask[o + t] = 1
      lossTokens++
      advantages[o + t] = s.advantages?.[t + 1] ?? 0
      samplerLogprobs[o + t] = s.samplerLogprobs?.[t + 1] ?? 0
      refLogprobs[o + t] = s.refLogprobs?.[t + 1] ?? 0
    }
  })
  const weights = Loss.aggregationWeights(aggregation, mask, batch, length, totals, normLength)
  return {
    batch,
    length,
    inputIds,
    attentionMask,
    ...(positionIds === undefined ? {} : { positionIds }),
    targets,
    mask,
    weights,
    advantages,
    samplerLogprobs,
    refLogprobs,
    sequenceIndex: Int32Array.from(rows),
    lossTokens
  }
}
