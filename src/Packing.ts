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
 * chains: one prompt, several continuations) share a row: the common tokens once (segment 1), then each
 * sequence's rest as a segment of its own that attends to the common tokens and to itself, with positions that
 * continue theirs. The loss is the same as with a row each (the same tokens see the same context); the learner
 * computes the prompt once instead of once per chain.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import * as Loss from "./Loss.ts"
import * as Trajectory from "./Trajectory.ts"

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
  /**
   * 1 on real tokens, 0 on padding; with `sharePrefix`, a shared row's segment ids: 1 on the common tokens, 2, 3, …
   * on each sequence's own (see the model's `attention_mask`).
   */
  readonly attentionMask: Uint8Array
  /** Each token's position in its sequence; absent = counted along the row's real tokens. */
  readonly positionIds?: Int32Array | undefined
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
  /**
   * `[batch]`: index of each row's sequence in the input (a shared row's first); −1 for an empty padding row
   * (`padRows`).
   */
  readonly sequenceIndex: Int32Array
  /** Loss tokens in this micro-batch. */
  readonly lossTokens: number
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
   * Lay sequences with a common beginning in one row (see the module's description). A shared row is at most
   * `rowLength` times as long as its longest sequence (default 1.5: a longer row costs more attention than the
   * prompt copies it saves on small models), and a sequence whose own tokens outnumber the common ones keeps a row
   * of its own. Default: off, one row a sequence.
   */
  readonly sharePrefix?: { readonly rowLength?: number } | undefined
}

/**
 * Why packing failed.
 *
 * @category errors
 * @since 0.1.0
 */
export class PackingError extends Schema.TaggedError<PackingError>()("PackingError", {
  reason: Schema.Literals(["SequenceTooLong", "ShapeMismatch", "BadBudget"]),
  message: Schema.String
}) {}

// ===== Constructors =====

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
    return new PackingError({ reason: "BadBudget", message })
  }
  for (const [i, s] of sequences.entries()) {
    const n = s.tokenIds.length
    for (const [name, a] of [["lossMask", s.lossMask], ["samplerLogprobs", s.samplerLogprobs], [
      "advantages",
      s.advantages
    ], ["refLogprobs", s.refLogprobs]] as const) {
      if (a !== undefined && a.length !== n) {
        const message = `sequence ${i}: ${name} has ${a.length} entries, ${n} tokens`
        return new PackingError({ reason: "ShapeMismatch", message })
      }
    }
    if (options.maxLength !== undefined && n > options.maxLength) {
      return new PackingError({
        reason: "SequenceTooLong",
        message: `sequence ${i} has ${n} tokens, more than the model's ${options.maxLength} positions`
      })
    }
    if (roundUp(n, multiple) > options.tokenBudget) {
      return new PackingError({
        reason: "SequenceTooLong",
        message: `sequence ${i} has ${n} tokens (padded ${roundUp(n, multiple)}), over the budget of ${
          options.tokenBudget
        }`
      })
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
  const units = options.sharePrefix === undefined
    ? sequences.map((_, i): Unit => ({ members: [i], shared: 0, length: sequences[i]!.tokenIds.length }))
    : shareUnits(sequences, options.sharePrefix.rowLength ?? 1.5, multiple, options.tokenBudget)
  // Longest first, ties by input order: deterministic.
  units.sort((a, b) => b.length - a.length || a.members[0]! - b.members[0]!)
  const normLength = options.normLength ?? roundUp(Math.max(1, ...over.map((s) => s.tokenIds.length)), multiple)
  const microBatches: Array<MicroBatch> = []
  let start = 0
  while (start < units.length) {
    const length = roundUp(Math.max(1, units[start]!.length), multiple)
    const capacity = Math.floor(options.tokenBudget / length)
    const rows = Math.min(capacity, units.length - start)
    const slice = units.slice(start, start + rows)
    const step = Math.ceil(capacity / Math.max(1, options.rowSteps ?? 1))
    const padTo = options.padRows === true ? Math.min(capacity, Math.ceil(rows / step) * step) : rows
    const padded = padTo === rows ? slice : [...slice, ...new Array<Unit>(padTo - rows).fill(emptyRow)]
    const positions = options.sharePrefix !== undefined
    microBatches.push(fill(sequences, padded, length, totals, options.aggregation, normLength, positions))
    start += rows
  }
  return { microBatches, totals }
}

/** One row: its sequences (one unless shared) and the common tokens they share (0 unless shared). */
interface Unit {
  readonly members: ReadonlyArray<number>
  readonly shared: number
  readonly length: number
}

const emptyRow: Unit = { members: [], shared: 0, length: 0 }

/** Fewer common tokens than this stay unshared: a short prompt is cheaper copied than attended across. */
const minShared = 8

/**
 * Groups sequences by the tokens before their first loss token but one (the last common token's prediction is
 * each sequence's first loss token, so it starts each segment), then fills rows of at most `rowLength` × the
 * group's longest sequence, first fit by decreasing length.
 */
const shareUnits = (
  sequences: ReadonlyArray<Sequence>,
  rowLength: number,
  multiple: number,
  tokenBudget: number
): Array<Unit> => {
  const groups = new Map<string, { readonly shared: number; readonly members: Array<number> }>()
  const units: Array<Unit> = []
  sequences.forEach((s, i) => {
    let firstLoss = 1
    while (firstLoss < s.lossMask.length && s.lossMask[firstLoss] === 0) firstLoss++
    if (firstLoss === s.lossMask.length) firstLoss = -1
    const shared = firstLoss - 1
    if (firstLoss === -1 || shared < minShared) {
      units.push({ members: [i], shared: 0, length: s.tokenIds.length })
      return
    }
    const key = `${shared}:${s.tokenIds.subarray(0, shared).join(",")}`
    const group = groups.get(key)
    if (group === undefined) groups.set(key, { shared, members: [i] })
    else group.members.push(i)
  })
  for (const { shared, members } of groups.values()) {
    const longest = Math.max(...members.map((i) => sequences[i]!.tokenIds.length))
    // Within the budget's whole multiples, which hold any one sequence padded (`check`).
    const limit = Math.min(
      Math.floor(tokenBudget / multiple) * multiple,
      Math.max(roundUp(longest, multiple), Math.floor(longest * rowLength))
    )
    const rows: Array<{ members: Array<number>; length: number }> = []
    const byLength = [...members].sort((a, b) => sequences[b]!.tokenIds.length - sequences[a]!.tokenIds.length || a - b)
    for (const i of byLength) {
      const rest = sequences[i]!.tokenIds.length - shared
      // A chain longer than the common part keeps a row of its own: the attention across a longer row then costs
      // more than the copy it saves (measured, `bench/share-prefix.ts`).
      if (rest > shared) {
        units.push({ members: [i], shared: 0, length: shared + rest })
        continue
      }
      const row = rows.find((r) => r.length + rest <= limit && r.members.length < maxSegments)
      if (row === undefined) rows.push({ members: [i], length: shared + rest })
      else {
        row.members.push(i)
        row.length += rest
      }
    }
    for (const row of rows) {
      row.members.sort((a, b) => a - b)
      units.push(row.members.length === 1 ? { ...row, shared: 0 } : { ...row, shared })
    }
  }
  return units
}

/** Segment ids are bytes: 1 is the common tokens, so a row holds at most 254 sequences. */
const maxSegments = 254

const fill = (
  sequences: ReadonlyArray<Sequence>,
  rows: ReadonlyArray<Unit>,
  length: number,
  totals: Loss.Totals,
  aggregation: Loss.AggregationMode,
  normLength: number,
  withPositions: boolean
): MicroBatch => {
  const batch = rows.length
  const cells = batch * length
  const inputIds = new Int32Array(cells)
  const attentionMask = new Uint8Array(cells)
  const positionIds = withPositions ? new Int32Array(cells) : undefined
  const targets = new Int32Array(cells)
  const mask = new Uint8Array(cells)
  const advantages = new Float32Array(cells)
  const samplerLogprobs = new Float32Array(cells)
  const refLogprobs = new Float32Array(cells)
  let lossTokens = 0
  rows.forEach((unit, b) => {
    let o = b * length
    // Tokens [from, to) of sequence s from cell o on, in segment `segment`, each trained on the token after it.
    const place = (s: Sequence, from: number, to: number, segment: number) => {
      const n = s.tokenIds.length
      inputIds.set(s.tokenIds.subarray(from, to), o)
      attentionMask.fill(segment, o, o + to - from)
      for (let t = from; t < to; t++) {
        const cell = o + t - from
        if (positionIds !== undefined) positionIds[cell] = t
        if (t + 1 === n) continue
        targets[cell] = s.tokenIds[t + 1]!
        if (s.lossMask[t + 1] === 0) continue
        mask[cell] = 1
        lossTokens++
        advantages[cell] = s.advantages?.[t + 1] ?? 0
        samplerLogprobs[cell] = s.samplerLogprobs?.[t + 1] ?? 0
        refLogprobs[cell] = s.refLogprobs?.[t + 1] ?? 0
      }
      o += to - from
    }
    if (unit.shared === 0) {
      for (const index of unit.members) place(sequences[index]!, 0, sequences[index]!.tokenIds.length, 1)
      return
    }
    // The common tokens once (their targets carry no loss: they end before every member's first loss token), then
    // each sequence's rest.
    place(sequences[unit.members[0]!]!, 0, unit.shared, 1)
    unit.members.forEach((index, k) => place(sequences[index]!, unit.shared, sequences[index]!.tokenIds.length, k + 2))
  })
  const weights = Loss.aggregationWeights(
    aggregation,
    mask,
    batch,
    length,
    totals,
    normLength,
    positionIds === undefined ? undefined : attentionMask
  )
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
    sequenceIndex: Int32Array.from(rows, (unit) => unit.members[0] ?? -1),
    lossTokens
  }
}
