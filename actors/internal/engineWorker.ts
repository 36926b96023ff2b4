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

const serve = () => {
  const port = parentPort!
  const engines = new Map<number, { readonly engine: PolicyEngine.PolicyEngine["Service"]; readonly scope: Scope.Closeable }>()
  const running = new Map<number, Fiber.Fiber<unknown, unknown>>()
  const post = (reply: Reply) => port.postMessage(reply)

  let tokens: Array<number> = []
  let flushScheduled = false
  const flush = () => {
    flushScheduled = false
    if (tokens.length === 0) return
    post({ op: "tokens", data: tokens })
    tokens = []
  }
  const streamTo = (id: number) => (token: number, logprob: number) => {
    tokens.push(id, token, logprob)
    if (!flushScheduled) {
      flushScheduled = true
      setImmediate(flush)
    }
  }

  /** Runs `effect` as request `id`: its result or typed error goes back, tokens first. */
  const answer = <A>(id: number, effect: Effect.Effect<A, unknown>, wrap: (a: A) => Reply) => {
    const fiber = Effect.runFork(effect)
    running.set(id, fiber)
    fiber.addObserver((exit) => {
      running.delete(id)
      flush()
      if (Exit.isSuccess(exit)) return post(wrap(exit.value))
      if (Cause.hasInterruptsOnly(exit.cause)) return // the caller left
      post({ op: "failed", id, error: toWire(Cause.squash(exit.cause)) })
    })
  }

  const withEngine = (engine: number, id: number, f: (e: PolicyEngine.PolicyEngine["Service"]) => void) => {
    const entry = engines.get(engine)
    if (entry !== undefined) return f(entry.engine)
    post({ op: "failed", id, error: toWire(samplerError("Closed", `engine ${engine} is closed`)) })
  }

  port.on("message", (message: Request) => {
    switch (message.op) {
      case "open": {
        const scope = Scope.makeUnsafe()
        Effect.runPromiseExit(PolicyEngine.make(message.options).pipe(Scope.provide(scope))).then((exit) => {
          if (Exit.isSuccess(exit)) {
            engines.set(message.engine, { engine: exit.value, scope })
            return post({ op: "opened", engine: message.engine })
          }
          Effect.runFork(Scope.close(scope, exit))
          post({ op: "opened", engine: message.engine, error: toWire(Cause.squash(exit.cause)) })
        })
        return
      }
      case "close": {
        const entry = engines.get(message.engine)
        engines.delete(message.engine)
        if (entry === undefined) return post({ op: "closed", engine: message.engine })
        Effect.runPromise(Scope.close(entry.scope, Exit.void)).then(() => post({ op: "closed", engine: message.engine }))
        return
      }
      case "generate":
        return withEngine(message.engine, message.id, (engine) =>
          answer(
            message.id,
            engine.generate(message.request, message.stream ? { onToken: streamTo(message.id) } : undefined),
            (result) => ({ op: "done", id: message.id, result })
          ))
      case "interrupt": {
        const fiber = running.get(message.id)
        if (fiber !== undefined) Effect.runFork(Fiber.interrupt(fiber))
        return
      }
      case "update":
        return withEngine(message.engine, message.id, (engine) =>
          answer(
            message.id,
            engine.updateWeights(message.version, message.weights),
            () => ({ op: "done", id: message.id, result: null })
          ))
      case "stats":
        return withEngine(message.engine, message.id, (engine) =>
          answer(message.id, engine.stats, (result) => ({ op: "done", id: message.id, result })))
      case "exit": {
        const scopes = [...engines.values()].map((e) => e.scope)
        engines.clear()
        Effect.runPromise(Effect.forEach(scopes, (scope) => Scope.close(scope, Exit.void), { discard: true }))
          .finally(() => process.exit(0))
        return
      }
      case "crash":
        throw new Error("crash requested")
    }
  })
  post({ op: "ready" })
}

// Only as the thread `EngineThread.ts` starts (never when a test runner imports this file on its own thread).
if (parentPort !== null && (workerData as Partial<Init> | null)?.engineThread === true) serve()
