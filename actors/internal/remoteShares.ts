/**
 * What the two ways of rolling a batch out elsewhere share (HTTP workers, `RolloutWorker.ts`; the Redis queue,
 * `RolloutQueue.ts`): a batch cut into *shares* (contiguous rows, each carrying its first row's index in the batch),
 * the wire of a share and of its answer, a worker rolling a share out, and the figures a trainer gathers from the
 * answers (each worker's latest environment figures, the workers' sampling counts, its own `workers/…` counts).
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import type * as Dataset from "../../src/Dataset.ts"
import { Conversation } from "../../src/Message.ts"
import { Sampler } from "../../src/Sampler.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import type * as InferenceServers from "../InferenceServers.ts"
import * as Rollouts from "../Rollouts.ts"
import type { RolloutSetup } from "../RolloutSetup.ts"
import { type RunError, runError } from "../RunError.ts"

// ===== Wire =====

/** A dataset row as a share carries it. */
export const WireRow = Schema.Struct({
  index: Schema.Int,
  line: Schema.Int,
  question: Schema.optionalKey(Schema.String),
  messages: Schema.optionalKey(Conversation),
  fields: Schema.Record(Schema.String, Schema.Unknown)
})

/** A share: its rows, its place in the batch and how the batch samples. */
export const RolloutRequest = Schema.Struct({
  agentKey: Schema.String,
  rows: Schema.Array(WireRow),
  firstSeq: Schema.Int,
  rowOffset: Schema.Int,
  chains: Schema.Int,
  temperature: Schema.Number,
  seed: Schema.Int,
  version: Schema.Int
})

/** A share's answer. */
export const RolloutResponse = Schema.toCodecJson(Schema.Struct({
  groups: Schema.Array(Trajectory.Group),
  /** The worker's environment figures after the share (`env/<resource>/…`, `TaskRuntime.environmentStats`). */
  env: Schema.optionalKey(Schema.Record(Schema.String, Schema.Number)),
  /** The worker's sampling requests since its previous answer (`servers/requests`, `servers/failures`). */
  servers: Schema.optionalKey(Schema.Record(Schema.String, Schema.Number))
}))

/** A share's answer from its JSON text. */
export const decodeResponse = Schema.decodeUnknownEffect(Schema.fromJsonString(RolloutResponse))

/** A run stopped by its workers (`RunError`, reason `Workers`). */
export const workersError = (message: string): RunError => runError("Workers", message)

// ===== Shares =====

/** A batch's contiguous rows and the index of the first in the batch. */
export interface Share {
  readonly rows: ReadonlyArray<Dataset.Row>
  readonly rowOffset: number
}

/** `count` contiguous shares, as equal as possible (fewer when the batch has fewer rows; at least one). */
export const evenShares = (rows: ReadonlyArray<Dataset.Row>, count: number): Array<Share> => {
  const k = Math.max(1, Math.min(count, rows.length))
  return Array.from({ length: k }, (_, i) => {
    const r0 = Math.floor(rows.length * i / k), r1 = Math.floor(rows.length * (i + 1) / k)
    return { rows: rows.slice(r0, r1), rowOffset: r0 }
  })
}

/** Contiguous shares of `size` rows each (the last one shorter). */
export const sharesOf = (rows: ReadonlyArray<Dataset.Row>, size: number): Array<Share> => {
  const shares: Array<Share> = []
  for (let r0 = 0; r0 < rows.length; r0 += size) shares.push({ rows: rows.slice(r0, r0 + size), rowOffset: r0 })
  return shares
}

// ===== A worker's side =====

/** The counts of a run's inference servers that a worker's sampling adds to. */
const serverCounts = ["servers/requests", "servers/failures"] as const

/** A worker's sampling counts since its previous read (`InferenceServers.figures`), to send with a share's groups. */
export const samplingCounts = (
  servers: InferenceServers.InferenceServers
): Effect.Effect<Record<string, number>> =>
  Effect.map(servers.figures, (figures) => Object.fromEntries(serverCounts.map((key) => [key, figures[key] ?? 0])))

/** Why a worker could not roll a share out: the message, and a code (the run's reason, or `unencodable`). */
export interface ShareFailure {
  readonly message: string
  readonly code: string
}

/** A share's answer as JSON values (`RolloutResponse` encoded). */
export type EncodedResponse = {
  readonly groups: unknown
  readonly env?: unknown
  readonly servers?: unknown
}

/**
 * A share rolled out on a worker, sampling on `servers` at the share's version: its groups with the worker's
 * environment figures and sampling counts, encoded for the wire.
 */
export const rollOut = (
  agent: RolloutSetup,
  servers: InferenceServers.InferenceServers,
  request: typeof RolloutRequest.Type
): Effect.Effect<EncodedResponse, ShareFailure> =>
  Effect.gen(function*() {
    const groups = yield* Rollouts.collectGroups(agent, request.rows as ReadonlyArray<Dataset.Row>, request).pipe(
      Effect.provideService(Sampler, servers.sampler(request.version)),
      Effect.mapError((e): ShareFailure => ({ message: e.message, code: e.reason._tag }))
    )
    const env = yield* agent.runtime.environmentStats
    const sampled = yield* samplingCounts(servers)
    const encoded = yield* Schema.encodeEffect(RolloutResponse)({ groups, env, servers: sampled }).pipe(
      Effect.mapError((e): ShareFailure => ({ message: e.message, code: "unencodable" }))
    )
    return encoded as EncodedResponse
  })

// ===== A trainer's side =====

/** Adds `more`'s counts to `into` (missing keys count 0). */
export const addCounts = (into: Record<string, number>, more: Readonly<Record<string, number>>): void => {
  for (const [key, value] of Object.entries(more)) into[key] = (into[key] ?? 0) + value
}

/**
 * The environment figures of several workers as one run's: the latest snapshot of each, counts and gauges summed,
 * wait-time percentiles and maxima the largest of them (the pools' own percentiles cannot be merged exactly).
 */
export const mergeEnvFigures = (snapshots: Iterable<Readonly<Record<string, number>>>): Record<string, number> => {
  const out: Record<string, number> = {}
  for (const snapshot of snapshots) {
    for (const [key, value] of Object.entries(snapshot)) {
      out[key] = key.endsWith("_ms") ? Math.max(out[key] ?? 0, value) : (out[key] ?? 0) + value
    }
  }
  return out
}

/**
 * What a trainer gathers from its workers' answers for a step's figures: each worker's latest environment figures,
 * the workers' sampling counts since the previous read, and the trainer's `workers/…` totals at that read.
 */
export interface Gathered<K extends string> {
  readonly env: Map<string, Readonly<Record<string, number>>>
  sampled: Record<string, number>
  counted: Record<K, number>
}

/** Nothing gathered yet; `zero` names the trainer's totals (`shares`, `failures`, …), all 0. */
export const makeGathered = <K extends string>(zero: Record<K, number>): Gathered<K> => ({
  env: new Map(),
  sampled: {},
  counted: { ...zero }
})

/** Keeps a worker's answer's figures. */
export const gather = <K extends string>(
  gathered: Gathered<K>,
  worker: string,
  answer: { readonly env?: Readonly<Record<string, number>>; readonly servers?: Readonly<Record<string, number>> }
): void => {
  if (answer.env !== undefined) gathered.env.set(worker, answer.env)
  if (answer.servers !== undefined) addCounts(gathered.sampled, answer.servers)
}

/**
 * The figures since the previous read: the environment figures merged, the sampling counts, and each of `totals`'
 * increase as `workers/<total>`.
 */
export const takeFigures = <K extends string>(
  gathered: Gathered<K>,
  totals: Readonly<Record<K, number>>
): Record<string, number> => {
  const out: Record<string, number> = { ...mergeEnvFigures(gathered.env.values()), ...gathered.sampled }
  for (const key of Object.keys(totals) as Array<K>) out[`workers/${key}`] = totals[key] - gathered.counted[key]
  gathered.counted = { ...totals }
  gathered.sampled = {}
  return out
}
