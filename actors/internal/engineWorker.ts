/**
 * The engine thread (`EngineThread.ts`): policy engines (`PolicyEngine.make`) running on a worker thread of their
 * own, so that onnxruntime's `session.run`, which executes synchronously on its calling thread, decodes beside the
 * main thread's chains, tools and learner instead of taking turns with them. One thread hosts every engine of a
 * run (an engine per rollout batch): starting a thread costs a module graph, an engine a session.
 *
 * Tokens streamed to the main thread (`stream: true`) go in one message per turn of this thread's event loop (a
 * decode step's tokens together), always before the request's result.
 *
 * This is an edge like a CLI main: the Effect runtime is entered per message.
 */
import { Cause, Effect, Exit, Fiber, Option, Schema, Scope } from "effect"
import { parentPort, workerData } from "node:worker_threads"
import type { MessagePort } from "node:worker_threads"
import { SamplerError, SamplerErrorReason, samplerError, ServerError } from "../../src/Sampler.ts"
import type { GenerateRequest, GenerateResult } from "../../src/Sampler.ts"
import * as PolicyEngine from "../PolicyEngine.ts"

// ===== Protocol =====

/**
 * An error as it crosses the thread boundary: a sampler or engine error's reason encoded by its schema (a plain
 * object, which the structured clone of `postMessage` keeps, with the reason's facts).
 */
export type WireError =
  | { readonly tag: "SamplerError"; readonly reason: typeof SamplerErrorReason.Encoded }
  | { readonly tag: "PolicyEngineError"; readonly reason: typeof PolicyEngine.PolicyEngineErrorReason.Encoded }

export type Request =
  | { readonly op: "open"; readonly engine: number; readonly options: PolicyEngine.Options }
  | { readonly op: "close"; readonly engine: number }
  | {
    readonly op: "generate"
    readonly engine: number
    readonly id: number
    readonly request: GenerateRequest
    readonly stream: boolean
    /** A vision engine's images (`PolicyEngine.GenerateOptions.images`), copied by the structured clone. */
    readonly images?: PolicyEngine.GenerateOptions["images"]
  }
  | { readonly op: "interrupt"; readonly id: number }
  | {
    readonly op: "update"
    readonly engine: number
    readonly id: number
    readonly version: number
    readonly weights: Map<string, Float32Array>
  }
  | { readonly op: "stats"; readonly engine: number; readonly id: number }
  /** Close every engine, then end the thread. */
  | { readonly op: "exit" }
  /** Fail as a bug in the thread would (tests of the failure path). */
  | { readonly op: "crash" }

export type Reply =
  | { readonly op: "ready" }
  | { readonly op: "opened"; readonly engine: number; readonly error?: WireError }
  | { readonly op: "closed"; readonly engine: number }
  /** `[id, token, logprob]` triples, flattened. */
  | { readonly op: "tokens"; readonly data: ReadonlyArray<number> }
  | { readonly op: "done"; readonly id: number; readonly result: GenerateResult | PolicyEngine.Stats | null }
  | { readonly op: "failed"; readonly id: number; readonly error: WireError }

/** What the thread is started with (`workerData`); the marker keeps a test runner's import from serving. */
export interface Init {
  readonly engineThread: true
}

/**
 * The wire form of a failure on the thread: a typed error as it is, anything else as a sampler `ServerError`.
 */
export const toWire = (e: unknown): WireError => {
  if (e instanceof PolicyEngine.PolicyEngineError) {
    return { tag: "PolicyEngineError", reason: Schema.encodeSync(PolicyEngine.PolicyEngineErrorReason)(e.reason) }
  }
  const error = e instanceof SamplerError ? e : samplerError("ServerError", e instanceof Error ? e.message : String(e))
  return { tag: "SamplerError", reason: Schema.encodeSync(SamplerErrorReason)(error.reason) }
}

const unreadable = (reason: unknown) => `an unreadable error from the engine thread: ${JSON.stringify(reason)}`

/**
 * The typed error a wire error stands for, on the calling thread. A reason that does not decode (never, while both
 * threads run this file) becomes a `ServerError` (a `SessionFailed` for an engine error) naming it, rather than an
 * exception in a message handler.
 */
export const fromWire = (e: WireError): SamplerError | PolicyEngine.PolicyEngineError =>
  e.tag === "PolicyEngineError"
    ? new PolicyEngine.PolicyEngineError({
      reason: Option.getOrElse(
        Schema.decodeUnknownOption(PolicyEngine.PolicyEngineErrorReason)(e.reason),
        () => new PolicyEngine.SessionFailed({ message: unreadable(e.reason) })
      )
    })
    : new SamplerError({
      reason: Option.getOrElse(
        Schema.decodeUnknownOption(SamplerErrorReason)(e.reason),
        () => new ServerError({ message: unreadable(e.reason) })
      )
    })

// ===== Serving =====

type Engine = PolicyEngine.PolicyEngine["Service"]

/** What the thread holds: its engines, the requests running on them, and the tokens not yet posted. */
interface Server {
  readonly port: MessagePort
  readonly engines: Map<number, { readonly engine: Engine; readonly scope: Scope.Closeable }>
  readonly running: Map<number, Fiber.Fiber<unknown, unknown>>
  tokens: Array<number>
  flushScheduled: boolean
}

const post = (server: Server, reply: Reply) => server.port.postMessage(reply)

/** Posts the tokens sampled since the last flush, in one message. */
const flush = (server: Server) => {
  server.flushScheduled = false
  if (server.tokens.length === 0) return
  post(server, { op: "tokens", data: server.tokens })
  server.tokens = []
}

/** Streams request `id`'s tokens: they go out together at the next turn of the event loop. */
const streamTo = (server: Server, id: number) => (token: number, logprob: number) => {
  server.tokens.push(id, token, logprob)
  if (!server.flushScheduled) {
    server.flushScheduled = true
    setImmediate(() => flush(server))
  }
}

/** Runs `effect` as request `id`: its result or typed error goes back, tokens first. */
const answer = <A>(server: Server, id: number, effect: Effect.Effect<A, unknown>, wrap: (a: A) => Reply) => {
  const fiber = Effect.runFork(effect)
  server.running.set(id, fiber)
  fiber.addObserver((exit) => {
    server.running.delete(id)
    flush(server)
    if (Exit.isSuccess(exit)) return post(server, wrap(exit.value))
    if (Cause.hasInterruptsOnly(exit.cause)) return // the caller left
    post(server, { op: "failed", id, error: toWire(Cause.squash(exit.cause)) })
  })
}

const withEngine = (server: Server, engine: number, id: number, f: (e: Engine) => void) => {
  const entry = server.engines.get(engine)
  if (entry !== undefined) return f(entry.engine)
  post(server, { op: "failed", id, error: toWire(samplerError("Closed", `engine ${engine} is closed`)) })
}

const open = (server: Server, engine: number, options: PolicyEngine.Options) => {
  const scope = Scope.makeUnsafe()
  Effect.runPromiseExit(PolicyEngine.make(options).pipe(Scope.provide(scope))).then((exit) => {
    if (Exit.isSuccess(exit)) {
      server.engines.set(engine, { engine: exit.value, scope })
      return post(server, { op: "opened", engine })
    }
    Effect.runFork(Scope.close(scope, exit))
    post(server, { op: "opened", engine, error: toWire(Cause.squash(exit.cause)) })
  })
}

const close = (server: Server, engine: number) => {
  const entry = server.engines.get(engine)
  server.engines.delete(engine)
  if (entry === undefined) return post(server, { op: "closed", engine })
  Effect.runPromise(Scope.close(entry.scope, Exit.void)).then(() => post(server, { op: "closed", engine }))
}

/** Closes every engine, then ends the thread. */
const exit = (server: Server) => {
  const scopes = [...server.engines.values()].map((e) => e.scope)
  server.engines.clear()
  Effect.runPromise(Effect.forEach(scopes, (scope) => Scope.close(scope, Exit.void), { discard: true }))
    .finally(() => process.exit(0))
}

const onRequest = (server: Server, message: Request) => {
  switch (message.op) {
    case "open":
      return open(server, message.engine, message.options)
    case "close":
      return close(server, message.engine)
    case "generate": {
      const { id, images, request, stream } = message
      const onToken = stream ? { onToken: streamTo(server, id) } : {}
      const options = { ...onToken, ...(images === undefined ? {} : { images }) }
      return withEngine(server, message.engine, id, (engine) =>
        answer(
          server,
          id,
          engine.generate(request, stream || images !== undefined ? options : undefined),
          (result) => ({ op: "done", id, result })
        ))
    }
    case "interrupt": {
      const fiber = server.running.get(message.id)
      if (fiber !== undefined) Effect.runFork(Fiber.interrupt(fiber))
      return
    }
    case "update": {
      const { id, version, weights } = message
      return withEngine(server, message.engine, id, (engine) =>
        answer(server, id, engine.updateWeights(version, weights), () => ({ op: "done", id, result: null })))
    }
    case "stats":
      return withEngine(server, message.engine, message.id, (engine) =>
        answer(server, message.id, engine.stats, (result) => ({ op: "done", id: message.id, result })))
    case "exit":
      return exit(server)
    case "crash":
      throw new Error("crash requested")
  }
}

const serve = () => {
  const server: Server = {
    port: parentPort!,
    engines: new Map(),
    running: new Map(),
    tokens: [],
    flushScheduled: false
  }
  server.port.on("message", (message: Request) => onRequest(server, message))
  post(server, { op: "ready" })
}

// Only as the thread `EngineThread.ts` starts (never when a test runner imports this file on its own thread).
if (parentPort !== null && (workerData as Partial<Init> | null)?.engineThread === true) serve()
