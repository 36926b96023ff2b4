/**
 * The gateway: an OpenAI-compatible HTTP server that records token-level trajectories of agents written with any
 * SDK. Every request belongs to an **episode**, named by the URL path prefix `/episodes/ID/v1/...` (what every SDK
 * can set, through its `baseURL`) or by an `x-agentfly-episode: ID` header on a plain `/v1/...` path:
 *
 * | route                                          | what it does                                                   |
 * |------------------------------------------------|----------------------------------------------------------------|
 * | `POST /episodes/ID/v1/chat/completions`        | chat with `tools`, tool calls, parallel tool calls, `stream`   |
 * | `POST /episodes/ID/v1/completions`             | text or token-id prompts (needs the model's tokenizer)         |
 * | `POST /episodes/ID/v1/responses`               | OpenAI's Responses API (`gateway/Responses.ts`)                |
 * | `POST /episodes/ID/v1/messages`                | Anthropic's Messages API (`gateway/Messages.ts`)               |
 * | `POST /episodes/ID/v1/messages/count_tokens`   | the prompt's tokens under the episode's template (no record)   |
 * | `GET  /v1/models`, `/episodes/ID/v1/models`    | the served model                                               |
 * | `POST /episodes/ID/reward`                     | `{ "reward": number, "metrics"?: {...} }`: the episode's score |
 * | `POST /episodes/ID/end`                        | (serving mode) ends the episode without a reward (its status:  |
 * |                                                | `not_applicable`)                                              |
 * | `GET  /episodes/ID`                            | the episode so far: threads, requests, its trajectory          |
 *
 * Every wire format is a translation to and from the one chat request the recorder answers: an episode's record
 * is the same whichever format (or mix of formats) its agent speaks. A reward or `end` names an open episode: one
 * never opened is a 404 naming its id (serving mode opens episodes by their first model request only). A request
 * refused with a 400 before sampling (a bad field, a tool result that answers no call) is recorded on the episode
 * as `SamplerRejected` (`Recorder.refused`), the reason its trajectory fails with if its agent then gives up.
 *
 * Each episode's requests are sampled token-in / token-out and recorded as `Recorder` describes (threads, segments
 * on history rewrites, parallel requests as linked threads). A program opens an episode with {@link Gateway.open}
 * (scoped: closing the scope closes it) and reads its trajectory when its agent is done; in **serving mode**
 * (`autoOpen`), a request to an unknown episode opens one, a posted reward or `end` finishes it, and an episode idle
 * for `idleTimeout` is abandoned (masked); each finished episode goes to `onEnd`. In serving mode a request answered
 * with an error is not recorded (`Recorder.Config.keepRefused: false`): the episode stays as it was, and one that
 * recorded nothing (only refused requests, or none) ends without going to `onEnd`, its id free again.
 *
 * **Errors.** A malformed request gets an OpenAI-style body `{ error: { message, type, param, code } }` with a 4xx
 * status (400 invalid request or `context_length_exceeded`, 404 unknown route or episode, 405, 410 an episode
 * closed while its request ran, 409 an ended episode's id used again in serving mode, 413 body too large, 501
 * `/v1/completions` without a tokenizer); a sampler failure
 * is 429 or 5xx after retries. The gateway never crashes on input.
 *
 * **Strangers** (`Options.tokens`, `internal/auth.ts`): with tokens, a request without one is 401 on every route,
 * before its body is read; an episode opened by a request belongs to its token (another client gets 404); serving
 * mode holds at most `maxEpisodes` open episodes (429 `too_many_episodes` past it); at most `maxConcurrent` requests
 * are answered at once (503). Without tokens the gateway listens on loopback only.
 *
 * **Streaming.** `stream: true` is answered as server-sent events once the turn is sampled (the text in one delta,
 * then one delta per tool call): the SDKs see a well-formed stream; time-to-first-token is not the point of a
 * training gateway.
 *
 * The server is plain `node:http` owned by a scope: closing it stops listening, ends open connections and
 * interrupts the requests they were waiting for.
 *
 * @since 0.1.0
 */
import * as Http from "node:http"
import { Clock, Context, Duration, Effect, Fiber, FiberSet, Layer, Schedule, Schema, Scope } from "effect"
import type * as AgentTask from "../src/AgentTask.ts"
import type * as Message from "../src/Message.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import * as Bodies from "./gateway/Bodies.ts"
import * as Messages from "./gateway/Messages.ts"
import * as Recorder from "./gateway/Recorder.ts"
import * as Responses from "./gateway/Responses.ts"
import * as Auth from "./internal/auth.ts"
import * as HttpActor from "./internal/http.ts"
import * as Wire from "./internal/openAiWire.ts"

// ===== Models =====

/**
 * An open episode.
 *
 * @category models
 * @since 0.1.0
 */
export interface Episode {
  readonly id: string
  /** The API root its agent uses, `http://host:port/episodes/ID/v1`. */
  readonly baseURL: string
  readonly rewardURL: string
  readonly recorder: Recorder.Recorder
  /** The reward posted to `/episodes/ID/reward`, if any (the last one wins). */
  readonly posted: () => AgentTask.Score | undefined
  /** Stops accepting requests and interrupts those in flight (answered 410). Idempotent. */
  readonly close: Effect.Effect<void>
}

/**
 * A finished episode in serving mode.
 *
 * @category models
 * @since 0.1.0
 */
export interface Finished {
  readonly trajectory: Trajectory.Trajectory
  readonly threads: ReadonlyArray<Recorder.ThreadRecord>
}

/**
 * Serving mode: what an episode opened by its first request samples with, and where finished episodes go.
 *
 * @category models
 * @since 0.1.0
 */
export interface AutoOpen {
  /** `keepRefused` is false here: the client got an error, so the record is as if the request never came. */
  readonly episode: Omit<Recorder.Config, "id" | "groupId" | "keepRefused">
  /** An episode without a request for this long is abandoned: masked and freed (default 10 minutes). */
  readonly idleTimeout?: Duration.Input | undefined
  readonly onEnd: (finished: Finished) => Effect.Effect<void>
}

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Default `127.0.0.1`. */
  readonly host?: string | undefined
  /** Default 0: a free port. */
  readonly port?: number | undefined
  /** Largest request body accepted (default 16 MiB: agents send whole conversations). */
  readonly maxBodyBytes?: number | undefined
  /** The model name `/v1/models` lists (default `agentfly`); requests may name any model. */
  readonly model?: string | undefined
  readonly autoOpen?: AutoOpen | undefined
  /**
   * Client tokens (`AGENTFLY_GATEWAY_TOKEN`, `agentfly gateway --token-file` with one a line): every route requires
   * `Authorization: Bearer` one of them (what an SDK's `apiKey` sends), checked in constant time before anything
   * else, else 401. An episode opened by a request belongs to the token that opened it: another client's requests,
   * reads and rewards get the 404 an unknown episode gets. Episodes opened with {@link Gateway.open} take any of the
   * tokens. Without tokens every client is served, and only on loopback: a non-loopback `host` is refused at start.
   */
  readonly tokens?: ReadonlyArray<string> | undefined
  /** Serving mode: most episodes open at once (default 1024); a request that would open one more gets 429. */
  readonly maxEpisodes?: number | undefined
  /** Most requests answered at once (default 4096); past it a request gets 503 `overloaded` before its body. */
  readonly maxConcurrent?: number | undefined
  /**
   * Episodes opened with {@link Gateway.open} are reached at an unguessable path, `/episodes/ID~KEY` (KEY: 128 random
   * bits), given in their `baseURL` and `rewardURL`; their plain id does not route (default false). What a training
   * run's gateway does (`AgentRollout`): its agents use the URLs they are given, and nobody else can read, use or
   * reward an episode whose id (the run's, the row's, the chain's) they could guess.
   */
  readonly privateEpisodes?: boolean | undefined
}

/**
 * Counters of a gateway.
 *
 * @category models
 * @since 0.1.0
 */
export interface Stats {
  /** Episodes open now. */
  readonly episodes: number
  /** Requests being answered now. */
  readonly inFlight: number
  readonly requests: number
  readonly errors: number
}

/**
 * An episode of this id is open already.
 *
 * @category errors
 * @since 0.1.0
 */
export class DuplicateEpisode extends Schema.TaggedError<DuplicateEpisode>()("DuplicateEpisode", {
  message: Schema.String,
  id: Schema.String
}) {}

/**
 * The id cannot name an episode (empty, too long, or characters a URL path cannot carry).
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidId extends Schema.TaggedError<InvalidId>()("InvalidId", {
  message: Schema.String,
  id: Schema.String
}) {}

/**
 * Why the gateway refused to open an episode; handle a reason with `Effect.catchReason("GatewayError", "InvalidId",
 * …)`. `message` is the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class GatewayError extends Schema.TaggedError<GatewayError>()("GatewayError", {
  reason: Schema.Union([DuplicateEpisode, InvalidId])
}) {
  override get message(): string {
    return this.reason.message
  }
}

/**
 * The gateway service.
 *
 * @category services
 * @since 0.1.0
 */
export class Gateway extends Context.Service<Gateway, {
  readonly port: number
  /** `http://host:port` */
  readonly url: string
  readonly model: string
  /** Opens an episode in the current scope (closing the scope closes it). */
  readonly open: (config: Recorder.Config) => Effect.Effect<Episode, GatewayError, Scope.Scope>
  readonly stats: Effect.Effect<Stats>
}>()("agentfly/actors/Gateway") {
  /**
   * @category layers
   * @since 0.1.0
   */
  static readonly layer = (options: Options = {}): Layer.Layer<Gateway> => Layer.effect(Gateway, make(options))
}

// ===== State =====

/** An open episode and what the gateway keeps beside it. */
interface Entry {
  /** Where it is routed: its id, or with `privateEpisodes`, its id and a random key. */
  readonly key: string
  readonly episode: Episode
  readonly fibers: Set<Fiber.Fiber<void>>
  posted: AgentTask.Score | undefined
  lastSeen: number
  closed: boolean
  /** Opened by its first request (serving mode). */
  readonly auto: boolean
  /** The client (its token's index) that opened it by a request; undefined: opened by the program, any client's. */
  readonly owner: number | undefined
  /** Stored Responses (`store` not false): each one's conversation, input and output, for `previous_response_id`. */
  readonly responses: Map<string, ReadonlyArray<Message.Message>>
}

/**
 * A gateway's state, one record: every step below is a top-level function over it (the shape of
 * `internal/resourcePool.ts`); `make` builds it, starts the idle sweep and listens.
 */
interface GatewayState {
  readonly scope: Scope.Scope
  readonly maxBody: number
  readonly model: string
  readonly auto: AutoOpen | undefined
  readonly entries: Map<string, Entry>
  /**
   * Ids of finished episodes (the latest `endedKept`): a request naming one is refused rather than opening a second
   * episode under the same id, whose record would share its trajectory id with the first's.
   */
  readonly ended: Map<string, number | undefined>
  readonly counters: { inFlight: number; requests: number; errors: number; ids: number }
  readonly auth: Auth.Tokens
  readonly gate: Auth.Gate
  readonly maxEpisodes: number
  readonly privateEpisodes: boolean
  /** `http://host:port`, once listening. */
  url: string
}

/** What an episode route does with its episode and the request's body. */
type EpisodeHandler = (
  state: GatewayState,
  entry: Entry,
  body: unknown,
  res: Http.ServerResponse
) => Effect.Effect<void, Wire.ApiError>

const validId = /^[A-Za-z0-9._~-]{1,200}$/

/** How many finished episodes' ids serving mode remembers (to refuse their reuse). */
const endedKept = 100_000

const Reward = Schema.Struct({
  reward: Schema.Finite,
  metrics: Schema.optionalKey(Schema.Record(Schema.String, Schema.Finite))
})

const now = Effect.map(Clock.currentTimeMillis, (ms) => Math.floor(ms / 1000))

// ===== Episodes =====

const closeEntry = (state: GatewayState, entry: Entry): Effect.Effect<void> =>
  Effect.suspend(() => {
    if (entry.closed) return Effect.void
    entry.closed = true
    if (state.entries.get(entry.key) === entry) state.entries.delete(entry.key)
    return Fiber.interruptAll([...entry.fibers])
  })

const openEntry = Effect.fnUntraced(function*(
  state: GatewayState,
  config: Recorder.Config,
  auto: boolean,
  owner: number | undefined
) {
  if (!validId.test(config.id)) {
    const message = `episode id ${JSON.stringify(config.id)}: use [A-Za-z0-9._~-]`
    return yield* new GatewayError({ reason: new InvalidId({ message, id: config.id }) })
  }
  if (state.entries.has(config.id) || [...state.entries.values()].some((e) => e.episode.id === config.id)) {
    return yield* new GatewayError({
      reason: new DuplicateEpisode({ message: `episode ${config.id} is already open`, id: config.id })
    })
  }
  const recorder = yield* Recorder.make(config)
  const key = !auto && state.privateEpisodes ? `${config.id}~${Auth.randomId()}` : config.id
  const entry: Entry = {
    key,
    episode: undefined as unknown as Episode,
    fibers: new Set(),
    posted: undefined,
    lastSeen: yield* Clock.currentTimeMillis,
    closed: false,
    auto,
    owner,
    responses: new Map()
  }
  const episode: Episode = {
    id: config.id,
    baseURL: `${state.url}/episodes/${key}/v1`,
    rewardURL: `${state.url}/episodes/${key}/reward`,
    recorder,
    posted: () => entry.posted,
    close: closeEntry(state, entry)
  }
  ;(entry as { episode: Episode }).episode = episode
  state.entries.set(key, entry)
  return entry
})

/** Serving mode: closes an episode and hands its trajectory (with the posted reward) to `onEnd`. */
const finish = Effect.fnUntraced(function*(state: GatewayState, entry: Entry, ending: Recorder.Ending) {
  const auto = state.auto
  if (entry.closed || auto === undefined) return
  yield* closeEntry(state, entry)
  // Nothing recorded (no request, or only refused ones, which leave nothing): nothing to write, and the id was
  // never written under, so it stays free.
  if (entry.episode.recorder.threads.length === 0) return
  state.ended.set(entry.episode.id, entry.owner)
  if (state.ended.size > endedKept) state.ended.delete(state.ended.keys().next().value!)
  const base = yield* Recorder.trajectory(entry.episode.recorder, ending)
  const score = entry.posted
  // Ended with `/end` and no reward: nothing to score it by, which is not a pending score (excluded from baselines).
  const unscored: Trajectory.Trajectory = base.masked ? base : { ...base, rewardStatus: "not_applicable" }
  const trajectory: Trajectory.Trajectory = score === undefined ? unscored : {
    ...base,
    reward: score.reward,
    rewardStatus: base.masked ? "failed" : "scored",
    metrics: { ...base.metrics, ...score.metrics }
  }
  yield* auto.onEnd({ trajectory, threads: Recorder.threads(entry.episode.recorder) })
})

/** Serving mode: abandons the episodes opened by a request that have had none for `idleMs`. */
const reapIdle = Effect.fnUntraced(function*(state: GatewayState, idleMs: number) {
  const t = yield* Clock.currentTimeMillis
  for (const entry of [...state.entries.values()]) {
    if (entry.auto && entry.fibers.size === 0 && t - entry.lastSeen >= idleMs) {
      const message = `abandoned: no request for ${Math.round(idleMs / 1000)} s`
      yield* finish(state, entry, { _tag: "Abandoned", message })
    }
  }
})

/** The open episode `id` if `client` may use it: another client's is as unknown as a missing one. */
const visible = (state: GatewayState, id: string, client: number): Entry | undefined => {
  const found = state.entries.get(id)
  return found === undefined || (found.owner !== undefined && found.owner !== client) ? undefined : found
}

const autoOpened = (state: GatewayState) => {
  let n = 0
  for (const entry of state.entries.values()) if (entry.auto) n++
  return n
}

/** The open episode `id`; in serving mode, a new one for an id never used. */
const entryFor = Effect.fnUntraced(function*(state: GatewayState, id: string, client: number) {
  const found = visible(state, id, client)
  if (found !== undefined) return found
  const auto = state.auto
  if (auto === undefined || !validId.test(id) || state.entries.has(id)) {
    return yield* Wire.notFound(`no open episode ${JSON.stringify(id)}`, "episode_not_found")
  }
  // Another client's ended id is as unknown as an open one of theirs: no oracle of which ids were used.
  if (state.ended.has(id) && state.ended.get(id) !== client) {
    return yield* Wire.notFound(`no open episode ${JSON.stringify(id)}`, "episode_not_found")
  }
  if (state.ended.has(id)) {
    return yield* new Wire.ApiError({
      status: 409,
      message: `episode ${JSON.stringify(id)} has ended (a reward or /end was posted, or it was abandoned): ` +
        `give each episode an id of its own`,
      code: "episode_ended"
    })
  }
  if (autoOpened(state) >= state.maxEpisodes) {
    return yield* new Wire.ApiError({
      status: 429,
      message: `${state.maxEpisodes} episodes are open: end one (a reward or /end) before opening another`,
      code: "too_many_episodes"
    })
  }
  return yield* openEntry(state, { ...auto.episode, id, groupId: id, keepRefused: false }, true, client).pipe(
    Effect.mapError((e) => Wire.invalid(e.message))
  )
})

// ===== Routes =====

/** A body's check: its 400 is recorded on the episode (`Recorder.refused`) before it is answered. */
const checked = <A>(entry: Entry, check: Effect.Effect<A, Wire.ApiError>) =>
  Effect.tapError(check, (e) => Recorder.refused(entry.episode.recorder, e))

const chat: EpisodeHandler = Effect.fnUntraced(function*(state, entry, raw, res) {
  const body = yield* checked(entry, Bodies.decodeChat(raw))
  const turn = yield* Recorder.chat(entry.episode.recorder, body)
  const id = `chatcmpl-${++state.counters.ids}`
  const created = yield* now
  if (body.stream) yield* Wire.sendEvents(res, Bodies.chatChunks(id, created, state.model, turn, body))
  else yield* Wire.sendJson(res, 200, Bodies.chatCompletion(id, created, state.model, turn, body.logprobs))
})

const completions: EpisodeHandler = Effect.fnUntraced(function*(state, entry, raw, res) {
  const body = yield* checked(entry, Bodies.decodeCompletion(raw))
  const { turn, text, promptTokenIds } = yield* Recorder.completion(entry.episode.recorder, body)
  const id = `cmpl-${++state.counters.ids}`
  const created = yield* now
  if (body.stream) yield* Wire.sendEvents(res, Bodies.completionChunks(id, created, state.model, turn, text))
  else {
    const value = Bodies.textCompletion(id, created, state.model, turn, text, promptTokenIds, body.logprobs)
    yield* Wire.sendJson(res, 200, value)
  }
})

const responses: EpisodeHandler = Effect.fnUntraced(function*(state, entry, raw, res) {
  const request = yield* checked(entry, Wire.lift(Responses.decode(raw, (id) => entry.responses.get(id))))
  const turn = yield* Recorder.chat(entry.episode.recorder, request.chat)
  const answer: Responses.Answer = { n: ++state.counters.ids, createdAt: yield* now, model: state.model, request, turn }
  if (request.store) entry.responses.set(`resp_${answer.n}`, [...request.conversation, Responses.assistantOf(turn)])
  if (request.chat.stream) yield* Wire.sendEvents(res, Responses.events(answer))
  else yield* Wire.sendJson(res, 200, Responses.response(answer))
})

const messages: EpisodeHandler = Effect.fnUntraced(function*(state, entry, raw, res) {
  const body = yield* checked(entry, Wire.lift(Messages.decode(raw)))
  const turn = yield* Recorder.chat(entry.episode.recorder, body)
  const id = `msg_${++state.counters.ids}`
  const model = Wire.isRecord(raw) && typeof raw["model"] === "string" ? raw["model"] : state.model
  if (body.stream) yield* Wire.sendEvents(res, Messages.events(id, model, turn))
  else yield* Wire.sendJson(res, 200, Messages.message(id, model, turn))
})

const countTokens: EpisodeHandler = Effect.fnUntraced(function*(_state, entry, raw, res) {
  const body = yield* Wire.lift(Messages.decodeCount(raw))
  const inputTokens = yield* Recorder.countTokens(entry.episode.recorder, body)
  yield* Wire.sendJson(res, 200, { input_tokens: inputTokens })
})

/** Anthropic's error bodies on its route (counted as errors, as the others are by the server's handler). */
const anthropicErrors = (state: GatewayState, res: Http.ServerResponse, effect: Effect.Effect<void, Wire.ApiError>) =>
  Effect.catch(effect, (e) =>
    Effect.andThen(
      Effect.sync(() => void state.counters.errors++),
      res.headersSent
        ? Effect.sync(() => void (res.writableEnded || res.end(Bodies.namedEvent("error", Messages.errorBody(e)))))
        : Wire.sendJson(res, e.status, Messages.errorBody(e))
    ))

const reward: EpisodeHandler = Effect.fnUntraced(function*(state, entry, raw, res) {
  const score = yield* Schema.decodeUnknownEffect(Reward)(raw).pipe(
    Effect.mapError(() => Wire.invalid(`expected { "reward": number, "metrics"?: { name: number } }`, "reward"))
  )
  entry.posted = score.metrics === undefined ? { reward: score.reward } : score
  yield* Wire.sendJson(res, 200, { ok: true, episode: entry.episode.id, reward: score.reward })
  // Finishing closes the episode, which interrupts its requests: this one's too, so it runs on its own.
  if (entry.auto) yield* Effect.forkIn(finish(state, entry, { _tag: "Returned" }), state.scope)
})

const end: EpisodeHandler = (state, entry, _body, res) =>
  Effect.andThen(
    Wire.sendJson(res, 200, { ok: true, episode: entry.episode.id }),
    Effect.forkIn(finish(state, entry, { _tag: "Returned" }), state.scope)
  )

const describe = Effect.fnUntraced(function*(entry: Entry, res: Http.ServerResponse) {
  const recorder = entry.episode.recorder
  const trajectory = yield* Recorder.trajectory(recorder, { _tag: "Returned" })
  yield* Wire.sendJson(res, 200, {
    id: entry.episode.id,
    requests: recorder.requests,
    threads: Recorder.threads(recorder).length,
    reward: entry.posted ?? null,
    trajectory
  })
})

/**
 * The open episode `id` for a reward or an `end`, which never open one: a 404 naming the id when it was never
 * opened (a typo, a reward posted before the first request), a 409 when it has ended.
 */
const openedFor = (state: GatewayState, id: string, client: number): Effect.Effect<Entry, Wire.ApiError> => {
  const found = visible(state, id, client)
  if (found !== undefined) return Effect.succeed(found)
  if (state.ended.has(id) && state.ended.get(id) === client) {
    const message = `episode ${JSON.stringify(id)} has ended`
    return Effect.fail(new Wire.ApiError({ status: 409, message, code: "episode_ended" }))
  }
  return Effect.fail(Wire.notFound(
    `no open episode ${JSON.stringify(id)}: an episode opens with its first model request, and a reward or /end ` +
      `names an open one`,
    "episode_not_found"
  ))
}

/** An episode request, tracked so that closing the episode interrupts it (answered 410). */
const inEpisode = Effect.fnUntraced(function*(
  state: GatewayState,
  id: string,
  client: number,
  req: Http.IncomingMessage,
  res: Http.ServerResponse,
  handler: EpisodeHandler,
  opens: boolean
) {
  const body = yield* Wire.readJson(req, state.maxBody)
  const entry = opens ? yield* entryFor(state, id, client) : yield* openedFor(state, id, client)
  entry.lastSeen = yield* Clock.currentTimeMillis
  const closed = new Wire.ApiError({ status: 410, message: `episode ${id} was closed`, code: "episode_closed" })
  const fiber = yield* Effect.forkChild(handler(state, entry, body, res).pipe(
    Effect.onInterrupt(() => Wire.sendJson(res, 410, Wire.errorBody(closed)))
  ))
  entry.fibers.add(fiber as Fiber.Fiber<void>)
  yield* Fiber.join(fiber).pipe(
    Effect.ensuring(Effect.flatMap(Clock.currentTimeMillis, (t) =>
      Effect.sync(() => {
        entry.fibers.delete(fiber as Fiber.Fiber<void>)
        entry.lastSeen = t
      })))
  )
})

/** Anthropic's SDK sends its key as `x-api-key`: the same token as a bearer one. */
const withApiKey = (req: Http.IncomingMessage): Http.IncomingMessage => {
  const key = req.headers["x-api-key"]
  if (req.headers.authorization !== undefined || typeof key !== "string") return req
  return { headers: { ...req.headers, authorization: `Bearer ${key}` } } as Http.IncomingMessage
}

/** Where a request goes: the episode (from the path or the header) and the route within it. */
const route = (state: GatewayState, req: Http.IncomingMessage, res: Http.ServerResponse) => {
  // Before the route, the body or any episode: a stranger gets the same 401 everywhere.
  const verdict = Auth.authorize(state.auth, withApiKey(req))
  if (!verdict.ok) return Effect.fail(Wire.unauthorized("AGENTFLY_GATEWAY_TOKEN: the SDK's apiKey"))
  const client = verdict.client
  const path = (req.url ?? "/").split("?")[0]!.replace(/\/+$/, "")
  const method = req.method ?? "GET"
  const only = (allowed: string, effect: () => Effect.Effect<void, Wire.ApiError>) =>
    method === allowed ? effect() : Effect.fail(Wire.notAllowed(method, path, allowed))
  const header = req.headers["x-agentfly-episode"]
  const scoped = /^\/episodes\/([^/]+)(\/.*)?$/.exec(path)
  const id = scoped !== null ? decodeURIComponent(scoped[1]!) : typeof header === "string" ? header : undefined
  const rest = scoped !== null ? scoped[2] ?? "" : path
  const noRoute = Effect.fail(Wire.notFound(`no route ${method} ${path}`))
  const episodeRoute = (handler: EpisodeHandler, opens = true) =>
    id === undefined
      ? Effect.fail(Wire.invalid(
        "no episode: use http://host:port/episodes/ID/v1 as the base URL (or an x-agentfly-episode header)",
        undefined,
        "episode_required"
      ))
      : only("POST", () => inEpisode(state, id, client, req, res, handler, opens))
  switch (rest) {
    case "/v1/models":
      return only("GET", () => Effect.flatMap(now, (created) => Wire.sendJson(res, 200, models(state, created))))
    case "/v1/chat/completions":
      return episodeRoute(chat)
    case "/v1/completions":
      return episodeRoute(completions)
    case "/v1/responses":
      return episodeRoute(responses)
    case "/v1/messages":
      return anthropicErrors(state, res, episodeRoute(messages))
    case "/v1/messages/count_tokens":
      return anthropicErrors(state, res, episodeRoute(countTokens))
    case "/reward":
      return scoped === null ? noRoute : episodeRoute(reward, false)
    case "/end":
      return scoped === null || state.auto === undefined ? noRoute : episodeRoute(end, false)
    case "":
      if (scoped === null || id === undefined) return noRoute
      return only("GET", () => {
        const entry = visible(state, id, client)
        const missing = Wire.notFound(`no open episode ${JSON.stringify(id)}`, "episode_not_found")
        return entry === undefined ? Effect.fail(missing) : describe(entry, res)
      })
    default:
      return noRoute
  }
}

const models = (state: GatewayState, created: number) => ({
  object: "list",
  data: [{ id: state.model, object: "model", created, owned_by: "agentfly" }]
})

/** A request, counted while it is answered. */
const counted = (state: GatewayState, req: Http.IncomingMessage, res: Http.ServerResponse) =>
  Effect.suspend(() => {
    state.counters.requests++
    state.counters.inFlight++
    return Effect.ensuring(
      Auth.within(state.gate, route(state, req, res), Effect.fail(Wire.overloaded(state.gate.max))),
      Effect.sync(() => void state.counters.inFlight--)
    )
  })

// ===== Constructor =====

/**
 * Starts a gateway in the current scope.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("Gateway.make")(function*(options: Options = {}) {
  const run = yield* FiberSet.makeRuntime<never>()
  const host = options.host ?? "127.0.0.1"
  const auth = Auth.tokens(options.tokens ?? [])
  const problem = Auth.bindProblem(host, auth, "AGENTFLY_GATEWAY_TOKEN or --token-file")
  if (problem !== undefined) return yield* Effect.die(new Error(problem))
  const state: GatewayState = {
    scope: yield* Effect.scope,
    maxBody: options.maxBodyBytes ?? 16 * 1024 * 1024,
    model: options.model ?? "agentfly",
    auto: options.autoOpen,
    entries: new Map(),
    ended: new Map(),
    counters: { inFlight: 0, requests: 0, errors: 0, ids: 0 },
    auth,
    gate: Auth.gate(options.maxConcurrent ?? 4096),
    maxEpisodes: options.maxEpisodes ?? 1024,
    privateEpisodes: options.privateEpisodes ?? false,
    url: ""
  }
  if (state.auto !== undefined) {
    const idleMs = Duration.toMillis(Duration.fromInputUnsafe(state.auto.idleTimeout ?? Duration.minutes(10)))
    const every = Schedule.spaced(Math.max(10, Math.min(1000, idleMs / 4)))
    yield* reapIdle(state, idleMs).pipe(Effect.repeat(every), Effect.forkIn(state.scope))
  }
  const server = Http.createServer(
    Wire.handler(run, (req, res) => counted(state, req, res), () => void state.counters.errors++)
  )
  server.keepAliveTimeout = 60_000
  // A deep accept queue: a training step opens hundreds of agents' connections at once.
  const port = yield* HttpActor.listen(server, { port: options.port ?? 0, host, backlog: 4096 })
  state.url = `http://${host}:${port}`
  return Gateway.of({
    port,
    url: state.url,
    model: state.model,
    open: (config) =>
      Effect.acquireRelease(openEntry(state, config, false, undefined), (entry) => closeEntry(state, entry)).pipe(
        Effect.map((entry) => entry.episode)
      ),
    stats: Effect.sync(() => ({
      episodes: state.entries.size,
      inFlight: state.counters.inFlight,
      requests: state.counters.requests,
      errors: state.counters.errors
    }))
  })
})
