/**
 * A client of the Tinker API (`forward_backward`, `optim_step`, `save_weights_for_sampler`, `asample`, …): hosted
 * Tinker, SkyRL's Tinker backend, Twinkle, or `agentfly trainer`. It behaves as the official Python SDK does
 * (`thinking-machines-lab/tinker`, `_base_client.py` and `lib/api_future_impl.py`), so a server written for that SDK
 * sees the same requests:
 *
 * - **Every request is encoded and every answer decoded** with the Schemas the caller passes (the SDK's types,
 *   transcribed in `src/tinker/`); an answer that does not decode fails `BadResponse`, never a defect.
 * - **Retries** of 408, 409, 429, 5xx and lost connections, at most `maxRetries` times (SDK: 10), after
 *   `min(0.5 s · 2^n, 10 s)` less up to a quarter of jitter, or the server's `retry-after-ms` / `Retry-After` when it
 *   asks for 0–60 s; `x-should-retry: true | false` overrides the status. What is left when they run out is a typed
 *   reason: `QuotaExceeded` (429), `ServerError`, `ConnectionLost`.
 * - **Idempotency**: every POST bears an `X-Idempotency-Key`, the same on each retry of one call (the SDK's header),
 *   so a server that applied a step whose answer was lost answers the retry with the same future instead of applying
 *   it again.
 * - **Futures**: the operations that compute answer a future (`request_id`); it is polled on `retrieve_future` until
 *   it holds a result (`try_again` and HTTP 408 mean keep polling), failed (`FutureFailed` with the server's
 *   category), or `futureTimeoutMs` passed (`FutureTimedOut`). A future the server no longer knows (HTTP 410, as a
 *   restarted server answers) is submitted again with the original idempotency key, as the SDK's
 *   `RetryableException` does: the server returns the stored result or runs it once.
 * - Other refusals: 401/403 `Unauthorized`, 404 `UnknownModel` (the model, session or future named is not there),
 *   400/422 `BadRequest`, 402 `QuotaExceeded`. None of them is retried.
 *
 * The HTTP client comes from context (`NodeHttpClient.layerNodeHttp` from `@effect/platform-node`).
 *
 * @since 0.1.0
 */
import { Clock, Context, Duration, Effect, Layer, Option, Random, Redacted, Schema } from "effect"
import { HttpClient, HttpClientRequest } from "effect/http"
import type { HttpClientResponse } from "effect/http"
import * as Tinker from "../tinker/Types.ts"

// ===== Errors =====

/**
 * The server refused the API key (401) or the key may not do this (403). Check the environment variable that
 * `learner.apiKeyEnv` names.
 *
 * @category errors
 * @since 0.1.0
 */
export class Unauthorized extends Schema.TaggedError<Unauthorized>()("Unauthorized", {
  message: Schema.String,
  status: Schema.Int
}) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * The model, session or future named is not on the server (404): a wrong base model name, or a model that was
 * unloaded (a server restarted without keeping it).
 *
 * @category errors
 * @since 0.1.0
 */
export class UnknownModel extends Schema.TaggedError<UnknownModel>()("UnknownModel", { message: Schema.String }) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * Rate limited (429) after every retry, or out of quota (402).
 *
 * @category errors
 * @since 0.1.0
 */
export class QuotaExceeded extends Schema.TaggedError<QuotaExceeded>()("QuotaExceeded", {
  message: Schema.String,
  status: Schema.Int,
  /** The last wait the server asked for, when it said. */
  retryAfterMs: Schema.optionalKey(Schema.Number)
}) {
  get isRetryable(): boolean {
    return this.status === 429
  }
}

/**
 * The server refused the request as malformed (400, 422): a bug on one side, or an option the server lacks.
 *
 * @category errors
 * @since 0.1.0
 */
export class BadRequest extends Schema.TaggedError<BadRequest>()("BadRequest", {
  message: Schema.String,
  status: Schema.Int
}) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * 5xx, 408 or 409 after every retry.
 *
 * @category errors
 * @since 0.1.0
 */
export class ServerError extends Schema.TaggedError<ServerError>()("ServerError", {
  message: Schema.String,
  status: Schema.Int
}) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * No answer came back (refused, reset, timed out) after every retry.
 *
 * @category errors
 * @since 0.1.0
 */
export class ConnectionLost extends Schema.TaggedError<ConnectionLost>()("ConnectionLost", {
  message: Schema.String
}) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * The future finished with a failure (`RequestFailedResponse`): `category` is the server's (`user` for a request
 * it cannot run, `server` or `unknown` otherwise).
 *
 * @category errors
 * @since 0.1.0
 */
export class FutureFailed extends Schema.TaggedError<FutureFailed>()("FutureFailed", {
  message: Schema.String,
  requestId: Schema.String,
  category: Schema.String
}) {
  get isRetryable(): boolean {
    return this.category !== "user"
  }
}

/**
 * The future held no result within `futureTimeoutMs`.
 *
 * @category errors
 * @since 0.1.0
 */
export class FutureTimedOut extends Schema.TaggedError<FutureTimedOut>()("FutureTimedOut", {
  message: Schema.String,
  requestId: Schema.String,
  waitedMs: Schema.Number
}) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * A request that does not encode, or an answer that does not decode, with the API's types.
 *
 * @category errors
 * @since 0.1.0
 */
export class BadResponse extends Schema.TaggedError<BadResponse>()("BadResponse", { message: Schema.String }) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * Why a Tinker call failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const TinkerErrorReason = Schema.Union([
  Unauthorized,
  UnknownModel,
  QuotaExceeded,
  BadRequest,
  ServerError,
  ConnectionLost,
  FutureFailed,
  FutureTimedOut,
  BadResponse
])
export type TinkerErrorReason = typeof TinkerErrorReason.Type

/**
 * A failed Tinker call (`op`: the API's operation, e.g. `forward_backward`). Handle reasons with
 * `Effect.catchReason("TinkerError", "QuotaExceeded", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class TinkerError extends Schema.TaggedError<TinkerError>()("TinkerError", {
  op: Schema.String,
  reason: TinkerErrorReason
}) {
  get isRetryable(): boolean {
    return this.reason.isRetryable
  }
  override get message(): string {
    return `${this.op}: ${this.reason.message}`
  }
}

const reasons = {
  Unauthorized,
  UnknownModel,
  QuotaExceeded,
  BadRequest,
  ServerError,
  ConnectionLost,
  FutureFailed,
  FutureTimedOut,
  BadResponse
} satisfies Record<TinkerErrorReason["_tag"], unknown>

/**
 * The facts a reason carries besides its message.
 *
 * @category errors
 * @since 0.1.0
 */
export type TinkerErrorFacts<Tag extends TinkerErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `TinkerError` of the reason tagged `tag`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const tinkerError = <Tag extends TinkerErrorReason["_tag"]>(
  op: string,
  tag: Tag,
  message: string,
  ...facts: {} extends TinkerErrorFacts<Tag> ? [facts?: TinkerErrorFacts<Tag>] : [facts: TinkerErrorFacts<Tag>]
): TinkerError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => TinkerErrorReason
  return new TinkerError({ op, reason: new Reason({ ...facts[0], message }) })
}

// ===== Options =====

/**
 * Where the server is and how patient to be with it.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The service root, e.g. `https://tinker.thinkingmachines.dev/services/tinker-prod` (the SDK's default). */
  readonly baseUrl: string
  /** Sent as `X-API-Key`, as the SDK does. */
  readonly apiKey?: Redacted.Redacted<string> | undefined
  /** Retries of one request after its first attempt (SDK: 10). */
  readonly maxRetries?: number | undefined
  /** First backoff (SDK: 500 ms); doubles per retry up to `maxRetryMs` (SDK: 10 s). */
  readonly initialRetryMs?: number | undefined
  readonly maxRetryMs?: number | undefined
  /** Time limit of one HTTP attempt (SDK: 60 s). */
  readonly requestTimeoutMs?: number | undefined
  /** How long a future may take to hold its result (default 30 minutes). */
  readonly futureTimeoutMs?: number | undefined
  /** Resubmissions of a future the server forgot (HTTP 410), before `ServerError` (default 3). */
  readonly resubmits?: number | undefined
}

/**
 * What went over the wire (for a step's figures and the tests): requests, retries, futures polled.
 *
 * @category models
 * @since 0.1.0
 */
export interface Traffic {
  requests: number
  retries: number
  polls: number
  resubmits: number
}

// ===== Pure helpers =====

/**
 * The wait before retry `retries` (0-based) as the SDK computes it: the server's `retry-after-ms` or `Retry-After`
 * (seconds or an HTTP date) when it asks for more than 0 and at most 60 s, else `min(initial · 2^retries, max)`
 * times a jitter in `[0.75, 1]` (`jitter` ∈ [0, 1)).
 *
 * @category constructors
 * @since 0.1.0
 */
export const retryDelayMs = (
  retries: number,
  asked: number | undefined,
  jitter: number,
  initialMs = 500,
  maxMs = 10_000
): number => {
  if (asked !== undefined && asked > 0 && asked <= 60_000) return asked
  return Math.min(initialMs * 2 ** Math.min(retries, 1000), maxMs) * (1 - 0.25 * jitter)
}

/**
 * The wait a response asks for, in milliseconds: `retry-after-ms`, else `Retry-After` as seconds or an HTTP date.
 *
 * @category constructors
 * @since 0.1.0
 */
export const askedWaitMs = (headers: Readonly<Record<string, string>>, nowMs: number): number | undefined => {
  const ms = Number(headers["retry-after-ms"])
  if (headers["retry-after-ms"] !== undefined && Number.isFinite(ms)) return ms
  const header = headers["retry-after"]
  if (header === undefined) return undefined
  const seconds = Number(header)
  if (header.trim() !== "" && Number.isFinite(seconds)) return seconds * 1000
  const at = Date.parse(header)
  return Number.isNaN(at) ? undefined : at - nowMs
}

/** The status codes the SDK retries (`_should_retry`), unless `x-should-retry` says otherwise. */
const retriedStatus = (status: number, header: string | undefined) =>
  header === "true" ? true : header === "false" ? false : status === 408 || status === 409 || status === 429 ||
    status >= 500

/** The typed reason of a refusal that is not (or no longer) retried. */
const refusal = (op: string, status: number, detail: string, asked: number | undefined): TinkerError => {
  const text = `HTTP ${status}${detail === "" ? "" : `: ${detail.slice(0, 500)}`}`
  if (status === 401 || status === 403) {
    return tinkerError(op, "Unauthorized", `the API key was refused (${text})`, { status })
  }
  if (status === 404) return tinkerError(op, "UnknownModel", `not found on the server (${text})`)
  if (status === 402 || status === 429) {
    const wait = asked === undefined ? {} : { retryAfterMs: asked }
    return tinkerError(op, "QuotaExceeded", `rate limited or out of quota (${text})`, { status, ...wait })
  }
  if (status >= 400 && status < 500 && status !== 408 && status !== 409) {
    return tinkerError(op, "BadRequest", text, { status })
  }
  return tinkerError(op, "ServerError", text, { status })
}

const transportMessage = (error: { readonly message: string; readonly cause?: unknown }): string => {
  const cause = error.cause
  const detail = cause instanceof Error
    ? [(cause as { code?: unknown }).code, cause.message].filter((x) => typeof x === "string" && x !== "").join(": ")
    : ""
  return detail === "" || error.message.includes(detail) ? error.message : `${error.message}: ${detail}`
}

// ===== State =====

/** What every request needs: the HTTP client, the root, the headers, the limits and the traffic counters. */
interface Connection {
  readonly http: HttpClient.HttpClient
  readonly root: string
  readonly headers: Readonly<Record<string, string>>
  readonly maxRetries: number
  readonly initialRetryMs: number
  readonly maxRetryMs: number
  readonly requestTimeoutMs: number
  readonly futureTimeoutMs: number
  readonly resubmits: number
  readonly traffic: Traffic
}

/** One attempt's outcome: an answer (any status), or no answer. */
type Attempt =
  | {
    readonly _tag: "Answer"
    readonly status: number
    readonly text: string
    readonly headers: Record<string, string>
  }
  | { readonly _tag: "Lost"; readonly message: string }

const attempt = (c: Connection, path: string, body: unknown, headers: Record<string, string>) =>
  c.http.execute(
    HttpClientRequest.post(`${c.root}${path}`).pipe(
      HttpClientRequest.acceptJson,
      HttpClientRequest.setHeaders({ ...c.headers, ...headers }),
      HttpClientRequest.bodyJsonUnsafe(body)
    )
  ).pipe(
    Effect.flatMap((response: HttpClientResponse.HttpClientResponse) =>
      Effect.map(response.text, (text): Attempt => ({
        _tag: "Answer",
        status: response.status,
        text,
        headers: response.headers as Record<string, string>
      }))
    ),
    Effect.timeoutOrElse({
      duration: Duration.millis(c.requestTimeoutMs),
      orElse: () => Effect.succeed<Attempt>({ _tag: "Lost", message: `no answer within ${c.requestTimeoutMs} ms` })
    }),
    Effect.catch((e) => Effect.succeed<Attempt>({ _tag: "Lost", message: transportMessage(e) }))
  )

const parseJson = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))

/**
 * POSTs `body` to `path` with idempotency key `key` (the same on every retry), retrying as the SDK does; the
 * answer's JSON.
 */
const post = Effect.fnUntraced(function*(
  c: Connection,
  op: string,
  path: string,
  body: unknown,
  key: string,
  maxRetries: number = c.maxRetries
) {
  c.traffic.requests++
  for (let retries = 0;; retries++) {
    const headers = { [Tinker.headers.idempotencyKey]: key, "x-stainless-retry-count": String(retries) }
    const outcome = yield* attempt(c, path, body, headers)
    let asked: number | undefined
    if (outcome._tag === "Answer") {
      if (outcome.status >= 200 && outcome.status < 300) {
        const json = parseJson(outcome.text)
        if (Option.isNone(json)) {
          return yield* tinkerError(op, "BadResponse", `not JSON: ${outcome.text.slice(0, 200)}`)
        }
        return json.value
      }
      asked = askedWaitMs(outcome.headers, yield* Clock.currentTimeMillis)
      if (!retriedStatus(outcome.status, outcome.headers["x-should-retry"]) || retries >= maxRetries) {
        return yield* refusal(op, outcome.status, detailOf(outcome.text), asked)
      }
    } else if (retries >= maxRetries) {
      return yield* tinkerError(op, "ConnectionLost", `${c.root}${path}: ${outcome.message}`)
    }
    c.traffic.retries++
    const delay = retryDelayMs(retries, asked, yield* Random.next, c.initialRetryMs, c.maxRetryMs)
    yield* Effect.sleep(Duration.millis(delay))
  }
})

/** A refusal's message: the API's `detail` or `error` field, or the body's first bytes. */
const detailOf = (text: string): string => {
  const body = Option.getOrUndefined(decodeErrorBody(text))
  return typeof body?.detail === "string" ? body.detail : text.slice(0, 300)
}

const decodeErrorBody = Schema.decodeUnknownOption(Schema.fromJsonString(Tinker.ErrorBody))

/** A Schema with no services to encode or decode: the API's types. */
type Codec = Schema.Codec<any, any>

const encode = <S extends Codec>(op: string, schema: S, value: S["Type"]) =>
  Schema.encodeUnknownEffect(schema)(value).pipe(
    Effect.mapError((e) => tinkerError(op, "BadResponse", `the request does not encode: ${e.message}`))
  )

const decode = <S extends Codec>(op: string, schema: S, json: unknown) =>
  Schema.decodeUnknownEffect(schema)(json).pipe(
    Effect.mapError((e) => tinkerError(op, "BadResponse", `unexpected answer: ${e.message}`))
  )

const newKey = Effect.sync(() => `agentfly-retry-${crypto.randomUUID()}`)

// ===== Futures =====

/** One poll's outcome: the result's JSON, keep polling (after a backoff: `failed`), or the future is gone (410). */
type Poll =
  | { readonly _tag: "Done"; readonly json: unknown }
  | { readonly _tag: "Pending"; readonly failed?: TinkerError }
  | { readonly _tag: "Gone" }

/** What a poll's failure means, as the SDK's `_APIFuture` reads it (it polls with retries off). */
const pollFailure = (e: TinkerError): Effect.Effect<Poll, TinkerError> => {
  const r = e.reason
  // 408 is a try_again in an HTTP error's clothes; 5xx is asked again at once, as the SDK does.
  if (r._tag === "ServerError") return Effect.succeed({ _tag: "Pending" })
  if (r._tag === "BadRequest" && r.status === 410) return Effect.succeed({ _tag: "Gone" })
  if (r._tag === "ConnectionLost" || (r._tag === "QuotaExceeded" && r.status === 429)) {
    return Effect.succeed({ _tag: "Pending", failed: e })
  }
  return Effect.fail(e)
}

const isTryAgain = Schema.decodeUnknownOption(Tinker.TryAgainResponse)
const isFailed = Schema.decodeUnknownOption(Tinker.RequestFailedResponse)

const pollOnce = Effect.fnUntraced(function*(c: Connection, op: string, requestId: string, key: string) {
  c.traffic.polls++
  const body = yield* encode(op, Tinker.FutureRetrieveRequest, { request_id: requestId, allow_metadata_only: false })
  const polled = yield* post(c, op, Tinker.routes.retrieve_future.path, body, key, 0).pipe(
    Effect.map((json): Poll => ({ _tag: "Done", json })),
    Effect.catch(pollFailure)
  )
  if (polled._tag !== "Done") return polled
  // The envelope first (`FutureRetrieveResponse`'s members overlap): pending, failed, else the caller's result.
  if (Option.isSome(isTryAgain(polled.json))) return { _tag: "Pending" } as Poll
  const failed = isFailed(polled.json)
  if (Option.isSome(failed)) {
    return yield* tinkerError(op, "FutureFailed", failed.value.error, { requestId, category: failed.value.category })
  }
  return polled
})

/**
 * Polls future `requestId` until it holds a result, failed, is gone, or `futureTimeoutMs` passed since `started`.
 * Lost connections and 429s back off (`maxRetries` in a row at most); other pending answers are asked again soon.
 */
const awaitFuture = Effect.fnUntraced(function*(c: Connection, op: string, requestId: string, started: number) {
  const key = yield* newKey
  let backoffs = 0
  for (let n = 0;; n++) {
    const now = yield* Clock.currentTimeMillis
    if (now - started > c.futureTimeoutMs) {
      return yield* tinkerError(op, "FutureTimedOut", `future ${requestId} held no result after ${now - started} ms`, {
        requestId,
        waitedMs: now - started
      })
    }
    const poll = yield* pollOnce(c, op, requestId, key)
    if (poll._tag !== "Pending") return poll
    if (poll.failed !== undefined) {
      if (backoffs >= c.maxRetries) return yield* poll.failed
      const delay = retryDelayMs(backoffs++, undefined, yield* Random.next, c.initialRetryMs, c.maxRetryMs)
      yield* Effect.sleep(Duration.millis(delay))
      continue
    }
    backoffs = 0
    // The server long-polls (the SDK asks again at once); a short pause keeps one that answers at once from spinning.
    yield* Effect.sleep(Duration.millis(Math.min(2 ** n, 100)))
  }
})

/**
 * Submits a request whose answer is a future, and waits for its result. The request keeps one idempotency key
 * through its retries and resubmissions, so the server runs it once.
 */
const submit = Effect.fnUntraced(function*<S extends Codec>(
  c: Connection,
  op: string,
  path: string,
  body: unknown,
  result: S
) {
  const key = yield* newKey
  const started = yield* Clock.currentTimeMillis
  for (let resubmits = 0;; resubmits++) {
    const future = yield* Effect.flatMap(post(c, op, path, body, key), (json) =>
      decode(op, Tinker.UntypedAPIFuture, json))
    const poll = yield* awaitFuture(c, op, future.request_id, started)
    if (poll._tag === "Done") return (yield* decode(op, result, poll.json)) as S["Type"]
    if (resubmits >= c.resubmits) {
      return yield* tinkerError(op, "ServerError", `future ${future.request_id} was lost ${resubmits + 1} times`, {
        status: 410
      })
    }
    c.traffic.resubmits++
    yield* Effect.logWarning(`Tinker: the server lost ${op}'s future ${future.request_id}; submitting it again`)
  }
})

// ===== Service =====

/**
 * The Tinker client service: typed calls of the API, each encoded and decoded with the Schemas given.
 *
 * @category services
 * @since 0.1.0
 */
export class TinkerClient extends Context.Service<TinkerClient, {
  /**
   * A call answered directly (`create_session`, `get_info`, …): `request` encodes `value`, `response` decodes the
   * answer (the Schemas of `src/tinker/Types.ts`).
   */
  readonly call: <Req extends Codec, Res extends Codec>(
    route: Tinker.Route,
    request: Req,
    value: Req["Type"],
    response: Res
  ) => Effect.Effect<Res["Type"], TinkerError>
  /** A call answered with a future (`forward_backward`, `optim_step`, …), polled until `result` decodes from it. */
  readonly submit: <Req extends Codec, Res extends Codec>(
    route: Tinker.Route,
    request: Req,
    value: Req["Type"],
    result: Res
  ) => Effect.Effect<Res["Type"], TinkerError>
  /**
   * A GET of `target` (a path under the server's root, with the API key, or an absolute URL such as an archive's,
   * without it), following redirects: the body's bytes of a 2xx answer, else a `TinkerError` as for a call.
   */
  readonly get: (op: string, target: string) => Effect.Effect<Uint8Array, TinkerError>
  readonly traffic: Traffic
  readonly baseUrl: string
}>()("agentfly/src/backends/TinkerClient") {}

/** One GET (no retry but the 503 "retry later" the archive route may answer, up to `c.maxRetries`). */
const get = Effect.fnUntraced(function*(c: Connection, op: string, target: string) {
  c.traffic.requests++
  const absolute = /^https?:\/\//.test(target)
  const request = HttpClientRequest.get(absolute ? target : `${c.root}${target}`).pipe(
    HttpClientRequest.setHeaders(absolute ? {} : c.headers)
  )
  for (let retries = 0;; retries++) {
    const response = yield* HttpClient.followRedirects(c.http, 5).execute(request).pipe(
      Effect.mapError((e) => tinkerError(op, "ConnectionLost", `${target}: ${transportMessage(e)}`))
    )
    if (response.status >= 200 && response.status < 300) {
      const bytes = yield* response.arrayBuffer.pipe(
        Effect.mapError((e) => tinkerError(op, "ConnectionLost", `${target}: ${transportMessage(e)}`))
      )
      return new Uint8Array(bytes)
    }
    const text = yield* Effect.orElseSucceed(response.text, () => "")
    if (response.status !== 503 || retries >= c.maxRetries) {
      return yield* refusal(op, response.status, detailOf(text), undefined)
    }
    c.traffic.retries++
    yield* Effect.sleep(Duration.millis(retryDelayMs(retries, undefined, yield* Random.next, c.initialRetryMs,
      c.maxRetryMs)))
  }
})

/**
 * A Tinker client on `options.baseUrl`, over the HTTP client in context.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fnUntraced(function*(options: Options) {
  const c: Connection = {
    http: yield* HttpClient.HttpClient,
    root: options.baseUrl.replace(/\/+$/, ""),
    headers: options.apiKey === undefined ? {} : { [Tinker.headers.apiKey]: Redacted.value(options.apiKey) },
    maxRetries: options.maxRetries ?? 10,
    initialRetryMs: options.initialRetryMs ?? 500,
    maxRetryMs: options.maxRetryMs ?? 10_000,
    requestTimeoutMs: options.requestTimeoutMs ?? 60_000,
    futureTimeoutMs: options.futureTimeoutMs ?? 30 * 60_000,
    resubmits: options.resubmits ?? 3,
    traffic: { requests: 0, retries: 0, polls: 0, resubmits: 0 }
  }
  return TinkerClient.of({
    call: (route, request, value, response) =>
      Effect.gen(function*() {
        const body = yield* encode(route, request, value)
        const json = yield* post(c, route, Tinker.routes[route].path, body, yield* newKey)
        return (yield* decode(route, response, json)) as typeof response["Type"]
      }),
    submit: (route, request, value, result) =>
      Effect.flatMap(encode(route, request, value), (body) =>
        submit(c, route, Tinker.routes[route].path, body, result)),
    get: (op, target) => get(c, op, target),
    traffic: c.traffic,
    baseUrl: c.root
  })
})

/**
 * The client as a layer.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (options: Options): Layer.Layer<TinkerClient, never, HttpClient.HttpClient> =>
  Layer.effect(TinkerClient, make(options))
