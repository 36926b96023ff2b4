/**
 * The policy inference service, token-in / token-out. A request carries prompt token ids and sampling
 * parameters; a response carries the sampled completion ids, one logprob per sampled id, the finish reason and
 * the policy version whose weights produced them. Sampled ids are never decoded and re-tokenized for training.
 *
 * Backends (the local onnxruntime engine, an OpenAI-compatible server, a scripted fake) provide this service;
 * the batching actor in `actors/` sits in front of any of them.
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer, Schema } from "effect"
import { dual } from "effect/Function"
import * as Image from "./Image.ts"
import { Conversation, ToolCall } from "./Message.ts"

/**
 * Sampling parameters. `temperature: 0` means greedy. Logprobs are log-softmax of the logits divided by the
 * sampling temperature (the distribution actually sampled from; plain log-softmax when greedy).
 *
 * @category models
 * @since 0.1.0
 */
export const SamplingParams = Schema.Struct({
  temperature: Schema.Number,
  topP: Schema.optionalKey(Schema.Number),
  topK: Schema.optionalKey(Schema.Int),
  maxTokens: Schema.Int,
  stopTokenIds: Schema.optionalKey(Schema.Array(Schema.Int)),
  seed: Schema.optionalKey(Schema.Int)
})
export type SamplingParams = typeof SamplingParams.Type

/**
 * @category models
 * @since 0.1.0
 */
export const GenerateRequest = Schema.Struct({
  promptTokenIds: Schema.Array(Schema.Int),
  sampling: SamplingParams,
  /**
   * The images of the prompt's image spans, in the order of their `<|image_pad|>` runs (a vision model's prompt):
   * each its reference and RGB pixels (`Image.Image`). Absent for a text-only prompt.
   */
  images: Schema.optionalKey(Schema.Array(Schema.Struct({ ref: Image.ImageRef, rgb: Schema.Uint8Array })))
})
export type GenerateRequest = typeof GenerateRequest.Type

/**
 * Why generation stopped: a stop token was sampled (it is included in `tokenIds`), or `maxTokens` was reached.
 *
 * @category models
 * @since 0.1.0
 */
export const FinishReason = Schema.Literals(["stop", "length"])
export type FinishReason = typeof FinishReason.Type

/**
 * @category models
 * @since 0.1.0
 */
export const GenerateResult = Schema.Struct({
  tokenIds: Schema.Array(Schema.Int),
  logprobs: Schema.Array(Schema.Number),
  finishReason: FinishReason,
  policyVersion: Schema.Int,
  /**
   * The LoRA adapter a server says it sampled with (`agentfly serve`'s `lora_adapter`): its name, the digest of the
   * tensors it loaded and its policy version. Absent for full weights, or a server that does not say.
   */
  adapter: Schema.optionalKey(Schema.Struct({
    name: Schema.String,
    digest: Schema.String,
    policyVersion: Schema.optionalKey(Schema.Int)
  }))
})
export type GenerateResult = typeof GenerateResult.Type

/**
 * The backend did not answer in time (or answered HTTP 408).
 *
 * @category errors
 * @since 0.1.0
 */
export class Timeout extends Schema.TaggedError<Timeout>()("Timeout", { message: Schema.String }) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * The backend is busy (HTTP 429, a full queue): retry later, after `retryAfterMs` when it said how long.
 *
 * @category errors
 * @since 0.1.0
 */
export class Overloaded extends Schema.TaggedError<Overloaded>()("Overloaded", {
  message: Schema.String,
  /** How long the backend asked us to wait before retrying (an HTTP `Retry-After`), when it said. */
  retryAfterMs: Schema.optionalKey(Schema.Number)
}) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * The backend failed (HTTP 5xx, an unreadable answer, an engine fault). `retryAfterMs` is kept because a 503 may
 * say how long to wait (an HTTP `Retry-After`), as a 429 does.
 *
 * @category errors
 * @since 0.1.0
 */
export class ServerError extends Schema.TaggedError<ServerError>()("ServerError", {
  message: Schema.String,
  /** The HTTP status, when the backend answered one. */
  status: Schema.optionalKey(Schema.Int),
  retryAfterMs: Schema.optionalKey(Schema.Number)
}) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * The request itself is invalid (e.g. a prompt longer than the context, an HTTP 4xx): retrying cannot help.
 *
 * @category errors
 * @since 0.1.0
 */
export class BadRequest extends Schema.TaggedError<BadRequest>()("BadRequest", {
  message: Schema.String,
  /** The HTTP status, when the backend answered one. */
  status: Schema.optionalKey(Schema.Int)
}) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * The backend cannot return token ids: unusable for token-in/token-out training.
 *
 * @category errors
 * @since 0.1.0
 */
export class NoTokenIds extends Schema.TaggedError<NoTokenIds>()("NoTokenIds", { message: Schema.String }) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * The backend does not return prompt logprobs (a teacher's scores of given tokens: vLLM's `prompt_logprobs`).
 *
 * @category errors
 * @since 0.1.0
 */
export class NoPromptLogprobs extends Schema.TaggedError<NoPromptLogprobs>()("NoPromptLogprobs", {
  message: Schema.String
}) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * The connection was refused or reset, or no server could take the request.
 *
 * @category errors
 * @since 0.1.0
 */
export class Transport extends Schema.TaggedError<Transport>()("Transport", { message: Schema.String }) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * The sampler was shut down.
 *
 * @category errors
 * @since 0.1.0
 */
export class Closed extends Schema.TaggedError<Closed>()("Closed", { message: Schema.String }) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * A server sampled with another LoRA adapter than the one the run published for the version it answered (another
 * digest, or none): a server that acknowledged a load and kept the old adapter. Never training data; retrying may
 * find the adapter loaded again.
 *
 * @category errors
 * @since 0.1.0
 */
export class AdapterMismatch extends Schema.TaggedError<AdapterMismatch>()("AdapterMismatch", {
  message: Schema.String,
  expectedVersion: Schema.Int,
  expectedDigest: Schema.String,
  gotVersion: Schema.optionalKey(Schema.Int),
  gotDigest: Schema.optionalKey(Schema.String)
}) {
  get isRetryable(): boolean {
    return true
  }
}

/**
 * Why a sampler request failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const SamplerErrorReason = Schema.Union([
  Timeout,
  Overloaded,
  ServerError,
  BadRequest,
  NoTokenIds,
  NoPromptLogprobs,
  Transport,
  Closed,
  AdapterMismatch
])
export type SamplerErrorReason = typeof SamplerErrorReason.Type

/**
 * A failed generate call. Handle reasons with `Effect.catchReason("SamplerError", "Overloaded", …)`; `message` is
 * the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class SamplerError extends Schema.TaggedError<SamplerError>()("SamplerError", {
  reason: SamplerErrorReason
}) {
  get isRetryable(): boolean {
    return this.reason.isRetryable
  }
  /** How long the backend asked us to wait before retrying (`Overloaded`, `ServerError`), when it said. */
  get retryAfterMs(): number | undefined {
    return "retryAfterMs" in this.reason ? this.reason.retryAfterMs : undefined
  }
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `samplerError`; a reason left out is a compile error. */
const reasons = {
  Timeout,
  Overloaded,
  ServerError,
  BadRequest,
  NoTokenIds,
  NoPromptLogprobs,
  Transport,
  Closed,
  AdapterMismatch
} satisfies Record<
  SamplerErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message (`retryAfterMs` of `Overloaded`, `status` of `BadRequest`).
 *
 * @category errors
 * @since 0.1.0
 */
export type SamplerErrorFacts<Tag extends SamplerErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `SamplerError` of the reason tagged `tag`: `samplerError("Closed", "the batcher was shut down")`,
 * `samplerError("Overloaded", text, { retryAfterMs })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const samplerError = <Tag extends SamplerErrorReason["_tag"]>(
  tag: Tag,
  message: string,
  facts?: SamplerErrorFacts<Tag>
): SamplerError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => SamplerErrorReason
  return new SamplerError({ reason: new Reason({ ...facts, message }) })
}

/**
 * The Sampler service.
 *
 * @category services
 * @since 0.1.0
 */
export class Sampler extends Context.Service<Sampler, {
  readonly generate: (request: GenerateRequest) => Effect.Effect<GenerateResult, SamplerError>
  /** The policy version new requests will be sampled with. */
  readonly policyVersion: Effect.Effect<number>
}>()("agentfly/src/Sampler") {}

// ===== Scripted fake =====

/**
 * One scripted completion: token ids (the finish reason is derived), an object with explicit fields, or a
 * `SamplerError` to fail the call with.
 *
 * @category models
 * @since 0.1.0
 */
export type ScriptedCompletion =
  | ReadonlyArray<number>
  | {
    readonly tokenIds: ReadonlyArray<number>
    readonly finishReason?: FinishReason | undefined
    readonly logprobs?: ReadonlyArray<number> | undefined
  }
  | SamplerError

/**
 * A script for the scripted sampler: a list of completions answered in call order (shared by all callers; an
 * exhausted list fails with `BadRequest`), or a function of the request and the 0-based call index, which may
 * return an effect (e.g. to wait on a latch, or to fail).
 *
 * @category models
 * @since 0.1.0
 */
export type Script =
  | ReadonlyArray<ScriptedCompletion>
  | ((
    request: GenerateRequest,
    call: number
  ) => ScriptedCompletion | Effect.Effect<ScriptedCompletion, SamplerError>)

/**
 * Options of the scripted sampler. `policyVersion` is a number or an effect read at every call (e.g. a `Ref`
 * that a test bumps to simulate a weight update).
 *
 * @category models
 * @since 0.1.0
 */
export interface ScriptedOptions {
  readonly policyVersion?: number | Effect.Effect<number> | undefined
}

/**
 * The deterministic logprob the scripted sampler reports for `tokenId` at `position` of a completion: a value in
 * [-1, -0.001] from an integer hash, so tests can check that logprobs travel with their tokens.
 *
 * @category constructors
 * @since 0.1.0
 */
export const scriptedLogprob = (tokenId: number, position: number): number => {
  const h = Math.imul(tokenId ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(position + 1, 0xc2b2ae35)
  return -(((h >>> 0) % 1000) + 1) / 1000
}

/**
 * Shapes a scripted completion like a real engine would: cut at the first stop token (kept, finish `stop`) or at
 * `maxTokens` (finish `length`).
 */
const shapeCompletion = (
  request: GenerateRequest,
  completion: Exclude<ScriptedCompletion, SamplerError>,
  policyVersion: number
): GenerateResult => {
  const full = "tokenIds" in completion ? completion.tokenIds : (completion as ReadonlyArray<number>)
  const given = "tokenIds" in completion ? completion : undefined
  const stops = request.sampling.stopTokenIds
  let end = full.length
  let finishReason: FinishReason = given?.finishReason ?? "stop"
  if (stops !== undefined && stops.length > 0) {
    const at = full.findIndex((id) => stops.includes(id))
    if (at >= 0) {
      end = at + 1
      finishReason = "stop"
    }
  }
  if (end > request.sampling.maxTokens) {
    end = Math.max(0, request.sampling.maxTokens)
    finishReason = "length"
  }
  const tokenIds = full.slice(0, end)
  const logprobs = given?.logprobs !== undefined
    ? given.logprobs.slice(0, end)
    : tokenIds.map((id, i) => scriptedLogprob(id, i))
  return { tokenIds, logprobs, finishReason, policyVersion }
}

/**
 * A scripted `Sampler` for tests and examples: answers from a script, with deterministic logprobs and a policy
 * version. The completion is cut at the first stop token or at `maxTokens`, as a real engine would.
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeScripted = (script: Script, options?: ScriptedOptions): Effect.Effect<Sampler["Service"]> =>
  Effect.sync(() => {
    let calls = 0
    const version = options?.policyVersion
    const policyVersion: Effect.Effect<number> = version === undefined
      ? Effect.succeed(0)
      : typeof version === "number"
      ? Effect.succeed(version)
      : version
    const next = (request: GenerateRequest): Effect.Effect<ScriptedCompletion, SamplerError> => {
      const call = calls++
      if (typeof script === "function") {
        const out = script(request, call)
        return Effect.isEffect(out) ? out : Effect.succeed(out)
      }
      const completion = script[call]
      return completion === undefined
        ? Effect.fail(
          samplerError("BadRequest", `scripted sampler exhausted after ${script.length} calls`)
        )
        : Effect.succeed(completion)
    }
    return Sampler.of({
      generate: Effect.fnUntraced(function*(request: GenerateRequest) {
        const completion = yield* next(request)
        if (completion instanceof SamplerError) return yield* completion
        return shapeCompletion(request, completion, yield* policyVersion)
      }),
      policyVersion
    })
  })

/**
 * A layer providing the scripted `Sampler`.
 *
 * @category layers
 * @since 0.1.0
 */
export const layerScripted = (script: Script, options?: ScriptedOptions): Layer.Layer<Sampler> =>
  Layer.effect(Sampler, makeScripted(script, options))

/**
 * Runs an effect with a scripted `Sampler` provided (dual, in the style of effect/ai's `withLanguageModel`).
 *
 * **Example** (Scripting two completions)
 *
 * ```ts
 * program.pipe(Sampler.withScriptedSampler([[1, 2, 3], [4, 5]]))
 * ```
 *
 * @category combinators
 * @since 0.1.0
 */
export const withScriptedSampler: {
  (script: Script, options?: ScriptedOptions): <A, E, R>(self: Effect.Effect<A, E, R>) => Effect.Effect<
    A,
    E,
    Exclude<R, Sampler>
  >
  <A, E, R>(self: Effect.Effect<A, E, R>, script: Script, options?: ScriptedOptions): Effect.Effect<
    A,
    E,
    Exclude<R, Sampler>
  >
} = dual(
  (args) => Effect.isEffect(args[0]),
  <A, E, R>(self: Effect.Effect<A, E, R>, script: Script, options?: ScriptedOptions) =>
    Effect.flatMap(makeScripted(script, options), (sampler) => Effect.provideService(self, Sampler, sampler))
)

// ===== Chat mode (black-box APIs) =====

/**
 * A chat request for a black-box API: messages (and tool definitions as OpenAI function specs) in, text out.
 *
 * @category models
 * @since 0.1.0
 */
export const ChatRequest = Schema.Struct({
  messages: Conversation,
  tools: Schema.optionalKey(Schema.Array(Schema.Unknown)),
  sampling: SamplingParams
})
export type ChatRequest = typeof ChatRequest.Type

/**
 * The assistant turn a chat API returned. No token ids, no logprobs: trajectories built from it are not
 * trainable by policy-gradient losses (evaluation and SFT data only).
 *
 * @category models
 * @since 0.1.0
 */
export const ChatResult = Schema.Struct({
  content: Schema.String,
  toolCalls: Schema.Array(ToolCall),
  finishReason: FinishReason
})
export type ChatResult = typeof ChatResult.Type

/**
 * A text-level sampler for black-box chat APIs (OpenAI-style `/chat/completions`).
 *
 * @category services
 * @since 0.1.0
 */
export class ChatSampler extends Context.Service<ChatSampler, {
  readonly complete: (request: ChatRequest) => Effect.Effect<ChatResult, SamplerError>
}>()("agentfly/src/ChatSampler") {}
