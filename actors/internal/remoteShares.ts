/**
 * What the two ways of rolling a batch out elsewhere share (HTTP workers, `RolloutWorker.ts`; the Redis queue,
 * `RolloutQueue.ts`): a batch cut into *shares* (contiguous rows, each carrying its first row's index in the batch),
 * the wire of a share and of its answer, a worker rolling a share out, and the figures a trainer gathers from the
 * answers (each worker's latest environment figures, the workers' sampling counts, its own `workers/…` counts).
 *
 * **Strangers.** A share names its run ({@link runIdOf}: what a worker reads from the run's own config) and carries
 * a random id; with a worker token (`AGENTFLY_WORKER_TOKEN`, given to the trainer and its workers out of band) its
 * answer carries an HMAC over (run id, share id, groups, figures, error) with a key derived from the token and the
 * run id ({@link resultMac}), which the trainer checks before it uses anything of the answer. A share's numbers are
 * bounded ({@link RolloutRequest}), and a share asking for a policy version the servers do not hold waits for it a
 * bounded time ({@link awaitVersion}) instead of holding its chains.
 *
 * @since 0.1.0
 */
import { Clock, Effect, Schema } from "effect"
import { createHash, createHmac, timingSafeEqual } from "node:crypto"
import { basename } from "node:path"
import type * as Dataset from "../../src/Dataset.ts"
import { Conversation } from "../../src/Message.ts"
import { Sampler } from "../../src/Sampler.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import type * as InferenceServers from "../InferenceServers.ts"
import * as Rollouts from "../Rollouts.ts"
import type { RolloutSetup } from "../RolloutSetup.ts"
import { type RunError, runError } from "../RunError.ts"
import * as Auth from "./auth.ts"

// ===== Wire =====

/** A dataset row as a share carries it. */
export const WireRow = Schema.Struct({
  index: Schema.Int,
  line: Schema.Int,
  question: Schema.optionalKey(Schema.String),
  messages: Schema.optionalKey(Conversation),
  fields: Schema.Record(Schema.String, Schema.Unknown)
})

const IntIn = (minimum: number, maximum: number) => Schema.Int.check(Schema.isBetween({ minimum, maximum }))

/** The most rows of a share, and past its last row (a step rolls out at most this many trajectories). */
export const maxShareRows = TrainConfig.maxTrajectoriesPerStep

/**
 * A share: its run and id, its rows, its place in the batch and how the batch samples; every number bounded as the
 * run's config bounds it (a temperature in [0, 2], at most 1,024 chains, rows within a step's).
 */
export const RolloutRequest = Schema.Struct({
  runId: Schema.String.check(Schema.isMaxLength(128)),
  share: Schema.String.check(Schema.isMaxLength(128)),
  agentKey: Schema.String.check(Schema.isMaxLength(128)),
  rows: Schema.Array(WireRow).check(Schema.isMaxLength(maxShareRows)),
  firstSeq: IntIn(0, Number.MAX_SAFE_INTEGER),
  rowOffset: IntIn(0, maxShareRows),
  chains: IntIn(1, 1_024),
  temperature: Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 2 })),
  seed: IntIn(0, Number.MAX_SAFE_INTEGER),
  version: IntIn(-(2 ** 31), 2 ** 31)
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

// ===== Run identity and results' authentication =====

/**
 * A run's id as its trainer and its workers both compute it from the run's config: the task, the `agent` section,
 * the inference servers, the seed and the output folder's name (not its path, which differs between machines). Two
 * runs whose task and agent match but that sample elsewhere, seed otherwise or write elsewhere have different ids
 * (and so different queue keys); a resumed run keeps its id.
 */
export const runIdOf = (taskName: string, config: TrainConfig.TrainConfig): string =>
  createHash("sha256")
    .update(JSON.stringify([taskName, config.agent, config.engine.servers ?? [], config.seed, basename(config.output)]))
    .digest("hex")
    .slice(0, 32)

/** What of an answer its HMAC covers. */
export interface Signed {
  readonly groups?: unknown
  readonly env?: unknown
  readonly servers?: unknown
  readonly error?: unknown
}

/**
 * The HMAC (SHA-256, hex) of a share's answer: over the run id, the share id and the answer's groups, figures and
 * error as JSON, keyed by a per-run key derived from the workers' token. JSON text is stable through a parse and
 * a stringify, so the trainer recomputes it from the answer it parsed.
 */
export const resultMac = (token: string, runId: string, share: string, answer: Signed): string => {
  const key = createHmac("sha256", token).update(`agentfly results ${runId}`).digest()
  const { groups = null, env = null, servers = null, error = null } = answer
  return createHmac("sha256", key).update(JSON.stringify([runId, share, groups, env, servers, error])).digest("hex")
}

/** Whether `mac` is the answer's (compared in constant time); always true without a token. */
export const macOk = (token: string | undefined, runId: string, share: string, answer: Signed, mac: unknown) => {
  if (token === undefined) return true
  if (typeof mac !== "string" || !/^[0-9a-f]{64}$/.test(mac)) return false
  return timingSafeEqual(Buffer.from(mac, "hex"), Buffer.from(resultMac(token, runId, share, answer), "hex"))
}

/** The answer with its HMAC, when there is a token. */
export const signed = <A extends Signed>(token: string | undefined, runId: string, share: string, answer: A) =>
  token === undefined ? answer : { ...answer, mac: resultMac(token, runId, share, answer) }

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
 * The newest policy version a server reports (`GET /models`'s `policy_version`: its weights', and each LoRA
 * adapter's it lists), or undefined when it does not say.
 */
const reportedVersion = (url: string): Effect.Effect<number | undefined> =>
  Effect.tryPromise(() =>
    fetch(`${url}/models`, {
      headers: Auth.headers(Auth.fromEnv("AGENTFLY_SERVE_TOKEN", "AGENTFLY_WEIGHTS_TOKEN")),
      signal: AbortSignal.timeout(10_000)
    }).then((response) => response.json() as Promise<{ data?: Array<{ policy_version?: unknown }> }>)
  ).pipe(
    Effect.map((body) => {
      const versions = (body.data ?? []).flatMap((m) =>
        typeof m.policy_version === "number" ? [m.policy_version] : []
      )
      return versions.length === 0 ? undefined : Math.max(...versions)
    }),
    Effect.orElseSucceed(() => undefined)
  )

/**
 * Waits until one of `servers` holds policy version `version` (or newer), asking them every second, for at most
 * `waitMs` (on `Clock`); then the share fails (`version_ahead`) instead of its chains waiting on a version that may
 * never come (a server behind is retried as long as it answers). Servers that all say nothing are not waited for.
 */
export const awaitVersion = (
  servers: InferenceServers.InferenceServers,
  version: number,
  waitMs: number
): Effect.Effect<void, ShareFailure> =>
  Effect.gen(function*() {
    const start = yield* Clock.currentTimeMillis
    while (true) {
      const status = yield* servers.status
      const known = status.flatMap((s) => (s.version === undefined ? [] : [s.version]))
      if (known.some((v) => v >= version)) return
      const reported = yield* Effect.forEach(status, (s) => reportedVersion(s.url), { concurrency: "unbounded" })
      const held = [...known, ...reported.filter((v): v is number => v !== undefined)]
      // No server says (all down): the chains fail for the servers' own reason, as they would without a worker.
      if (held.length === 0 || held.some((v) => v >= version)) return
      if ((yield* Clock.currentTimeMillis) - start >= waitMs) {
        return yield* Effect.fail<ShareFailure>({
          message: `the share asks for policy version ${version}, and no inference server of this worker holds it ` +
            `after ${waitMs / 1000} s (the newest held: ${Math.max(...held)})`,
          code: "version_ahead"
        })
      }
      yield* Effect.sleep(1_000)
    }
  })

/** How long a worker waits for its servers to hold a share's policy version (default 60 s). */
export const defaultVersionWaitMs = 60_000

/**
 * A share rolled out on a worker, sampling on `servers` at the share's version (once one holds it, waiting up to
 * `versionWaitMs`): its groups with the worker's environment figures and sampling counts, encoded for the wire.
 */
export const rollOut = (
  setup: RolloutSetup,
  servers: InferenceServers.InferenceServers,
  request: typeof RolloutRequest.Type,
  versionWaitMs: number = defaultVersionWaitMs
): Effect.Effect<EncodedResponse, ShareFailure> =>
  Effect.gen(function*() {
    yield* awaitVersion(servers, request.version, versionWaitMs)
    const groups = yield* Rollouts.collectGroups(setup, request.rows as ReadonlyArray<Dataset.Row>, request).pipe(
      Effect.provideService(Sampler, servers.sampler(request.version)),
      Effect.mapError((e): ShareFailure => ({ message: e.message, code: e.reason._tag }))
    )
    const env = yield* setup.runtime.environmentStats
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
