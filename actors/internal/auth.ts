/**
 * What every network endpoint (`agentfly serve`, the gateway, the trainer server; rollout workers next) shares to
 * keep strangers out: bearer tokens loaded from an environment variable or a file, checked in constant time, a bind
 * check that refuses to listen beyond loopback without one, random identities, and a cap on requests in flight.
 *
 * **The order a server checks in** (so that nothing answers a stranger with state, and nothing is buffered for one):
 * 1. {@link Gate.enter}: over the cap of requests in flight, 503 `overloaded` at once;
 * 2. {@link authorize}: no or a wrong `Authorization: Bearer` token, 401 `unauthorized` for every route, known or not,
 *    before the body is read (the reply closes the connection: an unread body is not drained);
 * 3. the body within its limit (`http.ts#readBody`: `Content-Length` first, then as it streams), 413 closing the
 *    connection;
 * 4. the route's own checks.
 *
 * **Tokens.** A server holds a list of accepted tokens (several clients may each have one: the gateway binds an
 * episode to the token that opened it). {@link load} reads them from an environment variable (one token) and/or a
 * file (one token a line; blank lines and `#` comments skipped). Only SHA-256 digests are kept, and a presented
 * token is compared with every accepted one by `crypto.timingSafeEqual` over equal-length digests, without an early
 * exit, so the time taken says nothing about how much of a token was right, nor which.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Schema } from "effect"
import { createHash, randomBytes, timingSafeEqual } from "node:crypto"
import type * as Http from "node:http"

// ===== Tokens =====

/**
 * Accepted tokens, as digests. An empty list means no authentication (allowed on loopback only, see
 * {@link bindProblem}).
 *
 * @category models
 * @since 0.1.0
 */
export interface Tokens {
  readonly digests: ReadonlyArray<Buffer>
}

/**
 * Why tokens could not be loaded (an unreadable or empty token file).
 *
 * @category errors
 * @since 0.1.0
 */
export class AuthConfigError extends Schema.TaggedError<AuthConfigError>()("AuthConfigError", {
  message: Schema.String
}) {}

const digest = (token: string): Buffer => createHash("sha256").update(token, "utf8").digest()

/**
 * Tokens from plain strings (empty strings and `undefined` skipped).
 *
 * @category constructors
 * @since 0.1.0
 */
export const tokens = (list: ReadonlyArray<string | undefined>): Tokens => ({
  digests: list.filter((t): t is string => t !== undefined && t !== "").map(digest)
})

/**
 * Whether any token is required.
 *
 * @category guards
 * @since 0.1.0
 */
export const required = (t: Tokens | undefined): boolean => t !== undefined && t.digests.length > 0

/**
 * The first set, non-empty environment variable of `names` (a former name may follow the current one).
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromEnv = (...names: ReadonlyArray<string>): string | undefined => {
  for (const name of names) {
    const value = process.env[name]?.trim()
    if (value !== undefined && value !== "") return value
  }
  return undefined
}

/**
 * A server's tokens: the environment variable's (first of `env` set) plus each line of `file`, if given.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fnUntraced(function*(
  fs: FileSystem.FileSystem,
  options: { readonly env: ReadonlyArray<string>; readonly file?: string | undefined }
) {
  const list: Array<string> = []
  const fromVariable = fromEnv(...options.env)
  if (fromVariable !== undefined) list.push(fromVariable)
  if (options.file !== undefined) {
    const file = options.file
    const text = yield* fs.readFileString(file).pipe(
      Effect.mapError((e) => new AuthConfigError({ message: `the token file ${file} could not be read: ${e.message}` }))
    )
    const lines = text.split(/\r?\n/).map((l) => l.trim()).filter((l) => l !== "" && !l.startsWith("#"))
    if (lines.length === 0) return yield* new AuthConfigError({ message: `the token file ${file} holds no token` })
    list.push(...lines)
  }
  return list
})

/**
 * The token an `Authorization: Bearer TOKEN` header presents, if any.
 *
 * @category constructors
 * @since 0.1.0
 */
export const bearer = (req: Http.IncomingMessage): string | undefined => {
  const header = req.headers.authorization
  if (typeof header !== "string") return undefined
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header)
  return match === null ? undefined : match[1]
}

/**
 * Which accepted token `presented` is (its index), or -1. Every accepted digest is compared, in constant time each.
 *
 * @category constructors
 * @since 0.1.0
 */
export const match = (t: Tokens, presented: string | undefined): number => {
  // A missing token is compared too (with a digest of nothing): the same work either way.
  const given = digest(presented ?? "")
  let found = -1
  t.digests.forEach((d, i) => {
    if (timingSafeEqual(d, given) && presented !== undefined && found === -1) found = i
  })
  return found
}

/**
 * The outcome of checking a request: who it is (`client`: the index of its token, 0 when none is required), or not
 * allowed.
 *
 * @category models
 * @since 0.1.0
 */
export type Verdict = { readonly ok: true; readonly client: number } | { readonly ok: false }

/**
 * Checks a request's bearer token against `t`; with no token required, every request is client 0.
 *
 * @category constructors
 * @since 0.1.0
 */
export const authorize = (t: Tokens | undefined, req: Http.IncomingMessage): Verdict => {
  if (!required(t)) return { ok: true, client: 0 }
  const client = match(t!, bearer(req))
  return client === -1 ? { ok: false } : { ok: true, client }
}

/**
 * Headers for a client that sends `token` (none when it is undefined).
 *
 * @category constructors
 * @since 0.1.0
 */
export const headers = (token: string | undefined): Record<string, string> =>
  token === undefined || token === "" ? {} : { authorization: `Bearer ${token}` }

// ===== Binding =====

/**
 * Whether `host` is a loopback address (`127.0.0.0/8`, `::1`, `localhost`).
 *
 * @category guards
 * @since 0.1.0
 */
export const isLoopback = (host: string): boolean => {
  const h = host.trim().toLowerCase().replace(/^\[|\]$/g, "")
  return h === "localhost" || h === "::1" || /^127(\.\d{1,3}){3}$/.test(h) || /^::ffff:127(\.\d{1,3}){3}$/.test(h)
}

/**
 * Why a server must not listen on `host`: a non-loopback address without a token (anyone who reaches it would be
 * served); undefined when it may. `how` names the way to set a token, for the message.
 *
 * @category constructors
 * @since 0.1.0
 */
export const bindProblem = (host: string, t: Tokens | undefined, how: string): string | undefined =>
  isLoopback(host) || required(t) ? undefined :
    `refusing to listen on ${host} without a token: anyone who reaches it would be served. Set ${how}, ` +
    `or listen on 127.0.0.1 (loopback) only`

/**
 * What a command (`agentfly serve`, `gateway`, `trainer`) does at start: loads its tokens (`env` variables, then the
 * `--token-file`) and refuses a non-loopback `host` without one, with the reason.
 *
 * @category constructors
 * @since 0.1.0
 */
export const forServer = Effect.fnUntraced(function*(options: {
  readonly env: ReadonlyArray<string>
  readonly file?: string | undefined
  readonly host: string
  /** Tokens the server also takes (`agentfly serve`'s weights token), counted for the bind check. */
  readonly also?: ReadonlyArray<string | undefined> | undefined
}) {
  const list = yield* load(yield* FileSystem.FileSystem, options)
  const all = tokens([...list, ...options.also ?? []])
  const problem = bindProblem(options.host, all, `${options.env[0]} or --token-file`)
  if (problem !== undefined) return yield* new AuthConfigError({ message: problem })
  return list
})

// ===== Identities =====

/**
 * A random 128-bit identifier, hex (from `node:crypto`: Effect's `Random` is not cryptographic).
 *
 * @category constructors
 * @since 0.1.0
 */
export const randomId = (): string => randomBytes(16).toString("hex")

// ===== Requests in flight =====

/**
 * A cap on requests a server answers at once: past it, a request is refused at once (503) instead of queued, so
 * that many slow clients cannot hold memory (bodies) without bound.
 *
 * @category models
 * @since 0.1.0
 */
export interface Gate {
  readonly max: number
  inFlight: number
}

/**
 * @category constructors
 * @since 0.1.0
 */
export const gate = (max: number): Gate => ({ max: Math.max(1, max), inFlight: 0 })

/**
 * Takes a place (true), or false when `max` requests are in flight; a taken place is given back with {@link leave}.
 *
 * @category combinators
 * @since 0.1.0
 */
export const enter = (g: Gate): boolean => {
  if (g.inFlight >= g.max) return false
  g.inFlight++
  return true
}

/**
 * @category combinators
 * @since 0.1.0
 */
export const leave = (g: Gate): void => {
  g.inFlight = Math.max(0, g.inFlight - 1)
}

/**
 * Runs `effect` within a place of `g`, or `refused` when none is free.
 *
 * @category combinators
 * @since 0.1.0
 */
export const within = <A, E, R>(
  g: Gate,
  effect: Effect.Effect<A, E, R>,
  refused: Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> =>
  Effect.suspend(() => enter(g) ? Effect.ensuring(effect, Effect.sync(() => leave(g))) : refused)

/**
 * Statuses whose reply closes the connection: the request's body may not have been read (401 before it, 413 past
 * its limit, 503 over the cap), and Node would otherwise drain whatever the client still sends (10 GB).
 *
 * @category guards
 * @since 0.1.0
 */
export const closesConnection = (status: number): boolean => status === 401 || status === 413 || status === 503
