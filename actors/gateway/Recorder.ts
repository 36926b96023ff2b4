/**
 * What the gateway records for one episode: its **threads** (one per conversation the agent keeps), each a
 * token-level transcript built token-in / token-out exactly as a rollout chain builds one (the same
 * `ChainPorts.Format`, the same sampler call), and the trajectory they add up to.
 *
 * **Matching a request to a thread** (`Threads.ts`): a request that sends a thread's conversation back with tool
 * results or user turns appended continues it (only the new messages are tokenized); one that starts as an idle
 * thread did but rewrote its history starts a new **segment** of that thread; anything else, or a continuation of
 * a thread busy with another request, starts a thread of its own, linked to the episode.
 *
 * Tool-call ids are rewritten to be unique within the episode (`call_<n>`) and mapped back to the transcript's own
 * ids when their results arrive, so SDKs that key results by id never see a repeated one.
 *
 * `/v1/completions` requests are threads of token ids: a prompt that extends a thread's tokens continues it (the new
 * tokens are `env`), one that extends only its first prompt starts a new segment.
 *
 * Every wire format (chat completions, Responses, Anthropic Messages) reaches the recorder as the same chat request:
 * one episode model. A request refused before sampling is recorded as a failure ({@link refused}); one interrupted
 * before its answer (its client gone, its episode closed) is counted and named in the trajectory's `error`.
 *
 * @since 0.1.0
 */
import { Clock, Effect, Schedule } from "effect"
import type * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Message from "../../src/Message.ts"
import * as RolloutError from "../../src/RolloutError.ts"
import type { GenerateResult, Sampler, SamplerError, SamplingParams } from "../../src/Sampler.ts"
import type * as Tokenizer from "../../src/Tokenizer.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import type * as ChainPorts from "../../src/ChainPorts.ts"
import * as Wire from "../internal/openAiWire.ts"
import * as Bodies from "./Bodies.ts"
import * as Threads from "./Threads.ts"

// ===== Models =====

/**
 * How an episode samples and renders.
 *
 * @category models
 * @since 0.1.0
 */
export interface Config {
  readonly id: string
  readonly groupId: string
  readonly format: ChainPorts.Format
  readonly sampler: Sampler["Service"]
  /**
   * The episode's sampling. With `requestSampling: "cap"` (training) its temperature, `topP`, `topK` and seed are
   * used whatever a request asks, and its `maxTokens` caps the request's; with `"honour"` (serving) a request's
   * own values win and these are the defaults.
   */
  readonly sampling: SamplingParams
  readonly requestSampling: "cap" | "honour"
  /** Token budget of one sequence; a request past it is refused with `context_length_exceeded`. */
  readonly maxContextTokens?: number | undefined
  /**
   * What a request answered with an error leaves in the record. `true` (default; training): what it reached, so a
   * request refused for the context budget ends the episode as `context_length` with its prompt, as a chain's does.
   * `false` (serving mode): nothing; the episode is as it was before the request, which the client may retry.
   */
  readonly keepRefused?: boolean | undefined
  /** Render the request's `tools` into the prompt (default true). */
  readonly renderTools?: boolean | undefined
  /** Needed by `/v1/completions` (text prompts, the answer's text). */
  readonly tokenizer?: Tokenizer.Tokenizer | undefined
  /** Retries of transient sampler failures before the request is answered 503 (default: 3, exponential). */
  readonly retry?: Schedule.Schedule<unknown, SamplerError> | undefined
  /** The dataset row's fields, passed through to the trajectory. */
  readonly row?: Readonly<Record<string, unknown>> | undefined
}

/**
 * The state of one episode (mutated only by this module).
 *
 * @category models
 * @since 0.1.0
 */
export interface Recorder {
  readonly config: Config
  readonly threads: Array<Threads.Thread>
  /** Client call id → the transcript's call id. */
  readonly callIds: Map<string, string>
  /** Failures of the gateway's own steps (sampler, template), newest last. */
  readonly failures: Array<RolloutError.RolloutError>
  requests: number
  /** Requests interrupted before they were answered (the client went away, the episode closed), and the last's. */
  cut: number
  lastCut: number | undefined
  rewrites: number
  samplerMs: number
  activity: number
  readonly startedAt: number
}

/**
 * A fresh recorder.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (config: Config): Effect.Effect<Recorder> =>
  Effect.map(Clock.currentTimeMillis, (startedAt) => ({
    config,
    threads: [],
    callIds: new Map(),
    failures: [],
    requests: 0,
    cut: 0,
    lastCut: undefined,
    rewrites: 0,
    samplerMs: 0,
    activity: 0,
    startedAt
  }))

// ===== Sampling =====

/** Codes of 400s the recorder's own steps record (the sampler's, the template's) or that end the episode. */
const recordedElsewhere = new Set(["context_length_exceeded", "template_failed", "sampler_rejected"])

/**
 * Records a request refused with a 400 before sampling (a bad field, a tool result answering no call) as a
 * `SamplerRejected` failure of the episode: the reason its trajectory fails with if the agent then gives up, as a
 * refusal of the engine's would be, rather than the crash (`EnvFailed`) it looks like from outside.
 *
 * @category constructors
 * @since 0.1.0
 */
export const refused = (recorder: Recorder, e: Wire.ApiError): Effect.Effect<void> =>
  Effect.sync(() => {
    if (e.status !== 400 || (e.code !== undefined && recordedElsewhere.has(e.code))) return
    const param = e.param === undefined ? "" : ` (${e.param})`
    record(
      recorder,
      new RolloutError.RolloutError({
        reason: "SamplerRejected",
        message: `a request was refused${param}: ${e.message}`,
        chainId: recorder.config.id
      })
    )
  })

/** Counts a request interrupted before it was answered (its number: the count when it came). */
const cutOnInterrupt = <A, E>(recorder: Recorder, effect: Effect.Effect<A, E>): Effect.Effect<A, E> => {
  const n = recorder.requests
  return Effect.onInterrupt(effect, () =>
    Effect.sync(() => {
      recorder.cut++
      recorder.lastCut = n
    }))
}

const record = (recorder: Recorder, error: RolloutError.RolloutError) => {
  recorder.failures.push(error)
  return error
}

const defaultRetry = Schedule.max([Schedule.exponential(100), Schedule.recurs(3)])

const templateApiError = (recorder: Recorder, e: RolloutError.RolloutError): Wire.ApiError => {
  record(recorder, e)
  return Wire.invalid(`the conversation cannot be rendered: ${e.message}`, "messages", "template_failed")
}

/** The sampling of one request under the episode's rules; `maxTokens` capped by the remaining context. */
const samplingOf = (
  config: Config,
  body: Pick<Bodies.ChatBody, "maxTokens" | "temperature" | "topP" | "topK" | "seed" | "stopTokenIds">,
  remaining: number
): SamplingParams => {
  const base = config.sampling
  const own = config.requestSampling === "honour"
  const pick = <A>(requested: A | undefined, fallback: A | undefined) => (own ? requested ?? fallback : fallback)
  const temperature = pick(body.temperature, base.temperature) ?? 1
  const topP = pick(body.topP, base.topP)
  const topK = pick(body.topK, base.topK)
  const seed = pick(body.seed, base.seed)
  const asked = body.maxTokens ?? base.maxTokens
  const maxTokens = Math.min(own ? asked : Math.min(asked, base.maxTokens), remaining)
  const stopTokenIds = [...(base.stopTokenIds ?? []), ...body.stopTokenIds, ...config.format.stopTokenIds]
  return {
    temperature,
    ...(topP === undefined ? {} : { topP }),
    ...(topK === undefined ? {} : { topK }),
    maxTokens,
    stopTokenIds,
    ...(seed === undefined ? {} : { seed })
  }
}

/** Samples one completion for `prompt`; failures are recorded on the episode and answered as API errors. */
const sample = (
  recorder: Recorder,
  prompt: ReadonlyArray<number>,
  sampling: SamplingParams
): Effect.Effect<GenerateResult, Wire.ApiError> =>
  Effect.gen(function*() {
    const t0 = yield* Clock.currentTimeMillis
    const result = yield* recorder.config.sampler.generate({ promptTokenIds: prompt, sampling }).pipe(
      Effect.retry({ schedule: recorder.config.retry ?? defaultRetry, while: (e: SamplerError) => e.isRetryable }),
      Effect.ensuring(Effect.map(Clock.currentTimeMillis, (t1) => void (recorder.samplerMs += t1 - t0))),
      Effect.mapError((e) => {
        record(recorder, RolloutError.fromSamplerError(e, recorder.config.id))
        return Wire.samplerError(e)
      })
    )
    return result
  })

const contextLeft = (
  recorder: Recorder,
  thread: Threads.Common,
  length: number
): Effect.Effect<number, Wire.ApiError> => {
  const budget = recorder.config.maxContextTokens
  const remaining = budget === undefined ? Number.POSITIVE_INFINITY : budget - length
  if (remaining > 0) return Effect.succeed(remaining)
  thread.contextEnded = true
  return Effect.fail(
    Wire.invalid(
      `the conversation has ${length} tokens; this episode's context holds ${budget}`,
      "messages",
      "context_length_exceeded"
    )
  )
}

const dropThread = (recorder: Recorder, thread: Threads.Thread): void => {
  const at = recorder.threads.indexOf(thread)
  if (at !== -1) recorder.threads.splice(at, 1)
}

/**
 * With `keepRefused: false`, a request that fails (or is interrupted) puts back what it changed: a new thread is
 * dropped, a continued or rewritten one gets its segments, transcript (a fork taken before) and keys back, and the
 * request is not counted. The state is captured when this is called, before `effect` runs.
 */
const undoneOnFailure = <A, E>(
  recorder: Recorder,
  thread: Threads.Thread,
  isNew: boolean,
  effect: Effect.Effect<A, E>
): Effect.Effect<A, E> => {
  if (recorder.config.keepRefused !== false) return effect
  const { rewrites } = recorder
  const closed = thread.closed.length
  const contextEnded = thread.contextEnded
  const chat = thread._tag === "Chat" && !isNew
    ? {
      transcript: thread.transcript.fork(),
      keys: [...thread.keys],
      startCount: thread.startCount,
      pendingSample: thread.pendingSample
    }
    : undefined
  return Effect.onError(effect, () =>
    Effect.sync(() => {
      recorder.requests--
      recorder.rewrites = rewrites
      if (isNew) return dropThread(recorder, thread)
      thread.closed.length = closed
      thread.contextEnded = contextEnded
      if (chat !== undefined) Object.assign(thread, chat)
    }))
}

/** Marks a thread busy for the duration of `effect` (synchronously, so two requests never share a thread). */
const occupying = <A, E>(
  recorder: Recorder,
  thread: Threads.Thread,
  effect: Effect.Effect<A, E>
): Effect.Effect<A, E> => {
  thread.busy = true
  return Effect.ensuring(
    effect,
    Effect.sync(() => {
      thread.busy = false
      thread.lastActive = ++recorder.activity
    })
  )
}

const newCommon = (recorder: Recorder, parent: number | undefined): Threads.Common => ({
  index: recorder.threads.length,
  parent,
  closed: [],
  busy: false,
  lastActive: ++recorder.activity,
  turns: 0,
  tokens: 0,
  lastFinish: undefined,
  contextEnded: false
})

// ===== Chat =====

/** A client message with its tool-call ids mapped to the transcript's own. */
const toTranscriptIds = (recorder: Recorder, m: Message.Message): Message.Message => {
  const own = (id: string) => recorder.callIds.get(id) ?? id
  if (m.role === "tool") return { ...m, tool_call_id: own(m.tool_call_id) }
  if (m.role === "assistant" && m.tool_calls !== undefined) {
    return { ...m, tool_calls: m.tool_calls.map((c) => ({ ...c, id: own(c.id) })) }
  }
  return m
}

const startTranscript = (
  recorder: Recorder,
  messages: ReadonlyArray<Message.Message>,
  tools: ReadonlyArray<ChatTemplate.ToolSpec>
) =>
  recorder.config.format.start(messages.map((m) => toTranscriptIds(recorder, m)), tools).pipe(
    Effect.mapError((e) => templateApiError(recorder, e))
  )

/**
 * Answers a chat request: matches it to a thread (continuing, rewriting or starting one), samples the next turn
 * token-in / token-out and records it.
 *
 * @category constructors
 * @since 0.1.0
 */
export const chat = (recorder: Recorder, body: Bodies.ChatBody): Effect.Effect<Bodies.Turn, Wire.ApiError> =>
  Effect.suspend(() => {
    recorder.requests++
    const tools = recorder.config.renderTools === false ? [] : body.tools
    const keys = body.messages.map(Bodies.messageKey)
    const toolsKey = Bodies.toolsKey(tools)
    const choice = Threads.chooseChat(recorder.threads, keys, toolsKey)
    if (choice._tag !== "New") {
      const continued = continueChat(recorder, choice, body, keys, tools)
      return cutOnInterrupt(
        recorder,
        occupying(recorder, choice.thread, undoneOnFailure(recorder, choice.thread, false, continued))
      )
    }
    // A placeholder holds the new thread's place (and its busy mark) while its prompt is rendered.
    const thread: Threads.ChatThread = {
      ...newCommon(recorder, choice.parent),
      _tag: "Chat",
      transcript: undefined as unknown as ChainPorts.Transcript,
      keys: [...keys],
      startCount: keys.length,
      toolsKey,
      pendingSample: true,
      toolCalls: 0,
      parseErrors: 0,
      unknownCalls: 0,
      cutAtRequest: undefined
    }
    recorder.threads.push(thread)
    return cutOnInterrupt(
      recorder,
      occupying(
        recorder,
        thread,
        undoneOnFailure(
          recorder,
          thread,
          true,
          Effect.gen(function*() {
            thread.transcript = yield* startTranscript(recorder, body.messages, tools).pipe(
              // A thread whose prompt cannot be rendered never existed.
              Effect.tapError(() => Effect.sync(() => dropThread(recorder, thread)))
            )
            return yield* sampleChat(recorder, thread, body)
          })
        )
      )
    )
  })

const continueChat = Effect.fnUntraced(function*(
  recorder: Recorder,
  choice: Exclude<Threads.Choice<Threads.ChatThread>, { readonly _tag: "New" }>,
  body: Bodies.ChatBody,
  keys: ReadonlyArray<string>,
  tools: ReadonlyArray<ChatTemplate.ToolSpec>
) {
  const thread = choice.thread
  if (choice._tag === "Rewrite") {
    const transcript = yield* startTranscript(recorder, body.messages, tools)
    thread.closed.push(...thread.transcript.segments())
    thread.transcript = transcript
    thread.keys = [...keys]
    thread.startCount = keys.length
    thread.pendingSample = true
    recorder.rewrites++
  } else if (keys.length > choice.from) {
    const observations = body.messages.slice(choice.from).map((m) => toTranscriptIds(recorder, m))
    yield* thread.transcript.appendObservations(observations).pipe(
      Effect.mapError((e) => templateApiError(recorder, e))
    )
    thread.keys.push(...keys.slice(choice.from))
    thread.pendingSample = true
  }
  return yield* sampleChat(recorder, thread, body)
})

const sampleChat = Effect.fnUntraced(function*(recorder: Recorder, thread: Threads.ChatThread, body: Bodies.ChatBody) {
  const transcript = thread.transcript
  const remaining = yield* contextLeft(recorder, thread, transcript.length())
  const sampling = samplingOf(recorder.config, body, remaining)
  const prompt = transcript.promptTokenIds()
  const result = yield* sample(recorder, prompt, sampling)
  const turn = yield* transcript.appendSampled(result).pipe(Effect.mapError((e) => templateApiError(recorder, e)))
  thread.pendingSample = false
  const calls = turn.toolCalls.map((c) => {
    const id = `call_${recorder.callIds.size}`
    recorder.callIds.set(id, c.id)
    return { ...c, id }
  })
  const content = Message.text(turn.message.content)
  const finishReason: Bodies.Turn["finishReason"] = !turn.complete ? "length" : calls.length > 0 ? "tool_calls" : "stop"
  thread.keys.push(
    Bodies.messageKey({ role: "assistant", content, ...(calls.length > 0 ? { tool_calls: calls } : {}) })
  )
  thread.turns++
  thread.tokens += result.tokenIds.length
  thread.toolCalls += calls.length
  if (turn.parseErrors.length > 0) thread.parseErrors++
  const declared = new Set(body.tools.map((t) => t.function.name))
  thread.unknownCalls += calls.filter((c) => !declared.has(c.function.name)).length
  thread.lastFinish = finishReason
  thread.cutAtRequest = finishReason === "length" && body.maxTokens !== undefined &&
      body.maxTokens < recorder.config.sampling.maxTokens && sampling.maxTokens === body.maxTokens
    ? body.maxTokens
    : undefined
  // Cut by the context budget only when the budget, not the request's own max_tokens, set the limit.
  thread.contextEnded = !turn.complete && sampling.maxTokens >= remaining
  const answered: Bodies.Turn = {
    content,
    toolCalls: calls,
    finishReason,
    tokenIds: result.tokenIds,
    logprobs: result.logprobs,
    policyVersion: result.policyVersion,
    promptTokens: prompt.length
  }
  return answered
})

/**
 * The prompt tokens a chat request would render to on a fresh thread (Anthropic's `count_tokens`): nothing is
 * recorded or sampled.
 *
 * @category getters
 * @since 0.1.0
 */
export const countTokens = (recorder: Recorder, body: Bodies.ChatBody): Effect.Effect<number, Wire.ApiError> => {
  const tools = recorder.config.renderTools === false ? [] : body.tools
  return recorder.config.format.start(body.messages.map((m) => toTranscriptIds(recorder, m)), tools).pipe(
    Effect.map((transcript) => transcript.length()),
    Effect.mapError((e) =>
      Wire.invalid(`the conversation cannot be rendered: ${e.message}`, "messages", "template_failed")
    )
  )
}

// ===== Completions =====

/**
 * Answers a `/v1/completions` request on a thread of token ids. Returns the turn, its text and the prompt's ids (a
 * text prompt's, tokenized).
 *
 * @category constructors
 * @since 0.1.0
 */
export const completion = (
  recorder: Recorder,
  body: Bodies.CompletionBody
): Effect.Effect<
  { readonly turn: Bodies.Turn; readonly text: string; readonly promptTokenIds: ReadonlyArray<number> },
  Wire.ApiError
> =>
  Effect.suspend(() => {
    const tokenizer = recorder.config.tokenizer
    if (tokenizer === undefined) {
      return Effect.fail(
        new Wire.ApiError({
          status: 501,
          message: "/v1/completions needs the model's tokenizer, which this gateway was started without",
          code: "unsupported"
        })
      )
    }
    const ids = typeof body.prompt === "string" ? tokenizer.encode(body.prompt) : body.prompt
    const bad = ids.find((id) => !tokenizer.isValidId(id))
    if (bad !== undefined) return Effect.fail(Wire.invalid(`token id ${bad} is outside the vocabulary`, "prompt"))
    recorder.requests++
    const choice = Threads.chooseTokens(recorder.threads, ids)
    let thread: Threads.TokenThread
    if (choice._tag === "New") {
      thread = { ...newCommon(recorder, undefined), _tag: "Tokens", spans: [], ids: [], start: ids }
      recorder.threads.push(thread)
    } else thread = choice.thread
    return cutOnInterrupt(recorder, occupying(
      recorder,
      thread,
      undoneOnFailure(recorder, thread, choice._tag === "New", Effect.gen(function*() {
        const remaining = yield* contextLeft(recorder, thread, ids.length)
        const sampling = samplingOf(recorder.config, body, remaining)
        const result = yield* sample(recorder, ids, sampling)
        if (choice._tag === "Rewrite") {
          thread.closed.push({ spans: thread.spans, messageCount: 0 })
          recorder.rewrites++
        }
        if (choice._tag !== "Continue") {
          thread.spans = [{ source: "prompt", tokenIds: [...ids] }]
          thread.start = ids
        } else if (ids.length > choice.from) thread.spans.push({ source: "env", tokenIds: ids.slice(choice.from) })
        thread.spans.push({
          source: "policy",
          tokenIds: [...result.tokenIds],
          logprobs: [...result.logprobs],
          policyVersion: result.policyVersion
        })
        thread.ids = [...ids, ...result.tokenIds]
        thread.turns++
        thread.tokens += result.tokenIds.length
        const stops = new Set(sampling.stopTokenIds)
        const shown = result.finishReason === "stop" && stops.has(result.tokenIds.at(-1)!)
          ? result.tokenIds.slice(0, -1)
          : result.tokenIds
        thread.lastFinish = result.finishReason
        return {
          turn: {
            content: "",
            toolCalls: [],
            finishReason: result.finishReason,
            tokenIds: result.tokenIds,
            logprobs: result.logprobs,
            policyVersion: result.policyVersion,
            promptTokens: ids.length
          },
          text: tokenizer.decode(shown),
          promptTokenIds: ids
        }
      }))
    ))
  })

// ===== Trajectories =====

/**
 * One thread's record: its segments (closed ones first) and its message view.
 *
 * @category models
 * @since 0.1.0
 */
export interface ThreadRecord {
  readonly index: number
  readonly parent: number | undefined
  readonly segments: ReadonlyArray<Trajectory.Segment>
  readonly messages: Message.Conversation
  readonly turns: number
}

/**
 * The threads that sampled at least one turn, in the order they started.
 *
 * @category getters
 * @since 0.1.0
 */
export const threads = (recorder: Recorder): Array<ThreadRecord> =>
  recorder.threads.filter((t) => t.turns > 0).map((t) => ({
    index: t.index,
    parent: t.parent,
    segments: Threads.segmentsOf(t),
    messages: t._tag === "Chat" ? t.transcript.messages() : [],
    turns: t.turns
  }))

/**
 * How an episode ended, as the runner saw it.
 *
 * @category models
 * @since 0.1.0
 */
export type Ending =
  | { readonly _tag: "Returned" }
  | { readonly _tag: "Failed"; readonly error: RolloutError.RolloutError; readonly masked: boolean }
  | { readonly _tag: "Abandoned"; readonly message: string }

/**
 * The episode as one trajectory: every thread's segments (a training sequence each, sharing the episode's reward),
 * the message view of the thread that answered last (the final transcript), and figures under `gateway/`.
 * Unscored: `rewardStatus` is `pending` (or `failed` when masked).
 *
 * @category constructors
 * @since 0.1.0
 */
export const trajectory = Effect.fnUntraced(function*(recorder: Recorder, ending: Ending) {
  const endedAt = yield* Clock.currentTimeMillis
  const config = recorder.config
  // A thread refused for the context budget before its first turn still holds its prompt, as a chain would.
  const sampled = recorder.threads.filter((t) => t.turns > 0 || t.contextEnded)
  const last = [...sampled].sort((a, b) => b.lastActive - a.lastActive)[0]
  const budget = config.maxContextTokens
  const segments = sampled.flatMap(Threads.segmentsOf).map((s) =>
    budget === undefined ? s : Trajectory.clipSegment(s, budget)
  )
  const chats = sampled.filter((t): t is Threads.ChatThread => t._tag === "Chat")
  const masked = ending._tag === "Abandoned" || (ending._tag === "Failed" && ending.masked)
  const termination: Trajectory.Termination = ending._tag === "Abandoned"
    ? "interrupted"
    : last?.contextEnded === true
    ? "context_length"
    : ending._tag === "Failed"
    ? "error"
    : last === undefined
    ? "episode_end"
    : last.lastFinish === "length"
    ? "stop"
    : last.lastFinish === "tool_calls"
    ? "episode_end"
    : "no_tool_call"
  // A request cut mid-way (its client gone, its episode closed) is said, though the episode may still be scored.
  const cut = recorder.cut === 0 ? "" : `request ${recorder.lastCut!} was cut mid-way (${recorder.cut} ` +
    `request${recorder.cut > 1 ? "s" : ""} interrupted before their answer: the client went away or the episode ` +
    `closed)`
  const error = ending._tag === "Failed"
    ? { error: `${ending.error.reason}: ${ending.error.message}${cut === "" ? "" : `; ${cut}`}`,
      errorReason: ending.error.reason }
    : ending._tag === "Abandoned"
    ? { error: `${ending.message}${cut === "" ? "" : `; ${cut}`}` }
    : cut !== ""
    ? { error: cut }
    : {}
  const result: Trajectory.Trajectory = {
    trajectoryId: config.id,
    groupId: config.groupId,
    chainId: config.id,
    messages: last?._tag === "Chat" ? last.transcript.messages() : [],
    segments,
    termination,
    reward: 0,
    rewardStatus: masked ? "failed" : "pending",
    metrics: {
      turns: sampled.reduce((n, t) => n + t.turns, 0),
      tool_calls: chats.reduce((n, t) => n + t.toolCalls, 0),
      tokens_generated: sampled.reduce((n, t) => n + t.tokens, 0),
      sampler_latency_ms: recorder.samplerMs,
      rollout_time_ms: endedAt - recorder.startedAt,
      "gateway/requests": recorder.requests,
      "gateway/threads": sampled.length,
      "gateway/segments": segments.length,
      "gateway/rewrites": recorder.rewrites,
      ...(recorder.cut > 0 ? { "gateway/cut_requests": recorder.cut } : {}),
      ...(chats.some((t) => t.parseErrors > 0)
        ? { "tool_errors/ParseFailed": chats.reduce((n, t) => n + t.parseErrors, 0) }
        : {}),
      ...(termination === "stop" && last?._tag === "Chat" && last.cutAtRequest !== undefined
        ? { "gateway/cut_at_request_max_tokens": last.cutAtRequest }
        : {}),
      ...(chats.some((t) => t.unknownCalls > 0)
        ? { "tool_errors/UnknownTool": chats.reduce((n, t) => n + t.unknownCalls, 0) }
        : {})
    },
    trainable: true,
    masked,
    ...(config.row === undefined ? {} : { row: config.row }),
    ...error,
    ...(termination === "episode_end" ? { episodeEnd: last === undefined ? "no_requests" : "after_tool_calls" } : {})
  }
  return result
})
