/**
 * The state of one OpenAI-compatible server (`OpenAiServer.ts`), one record ({@link ServerState}), and the steps
 * every route shares over it: sampling one sequence through the fair scheduler, the policy version a client sees,
 * tokenizing a prompt within the limits. `OpenAiServer.make` builds the record; the routes are top-level functions
 * over it (`openAiServerRequests.ts`, `openAiServerAnswers.ts`), as `resourcePool.ts` is.
 *
 * @since 0.1.0
 */
import { Clock, Effect } from "effect"
import type { Scope, Semaphore } from "effect"
import type * as ChatTemplate from "../../src/ChatTemplate.ts"
import type { ModelConfig } from "../../src/model/ModelConfig.ts"
import type * as Qwen2 from "../../src/model/Qwen2.ts"
import type { GenerateRequest, GenerateResult } from "../../src/Sampler.ts"
import type * as Tokenizer from "../../src/Tokenizer.ts"
import type { PolicyEngine } from "../PolicyEngine.ts"
import type * as Auth from "./auth.ts"
import * as Fair from "./fairScheduler.ts"
import { ApiError, samplerError } from "./openAiWire.ts"
import { encodeWithin, overContext, tooManyTokens } from "./promptBudget.ts"

/**
 * What the server needs to know about the model besides the engine: its name and text-side files.
 *
 * @category models
 * @since 0.1.0
 */
export interface Model {
  readonly name: string
  readonly tokenizer: Tokenizer.Tokenizer
  readonly template: ChatTemplate.ChatTemplate
  /** Ids that end a turn: they stop every completion unless the request sets `ignore_eos` (vLLM's extension). */
  readonly stopTokenIds: ReadonlyArray<number>
}

/**
 * The server's options with their defaults filled in (`OpenAiServer.Options` says what each means).
 *
 * @category models
 * @since 0.1.0
 */
export interface Limits {
  readonly host: string
  readonly maxBodyBytes: number
  readonly maxPrompts: number
  readonly maxRequestTokens: number
  readonly maxRunning: number
  readonly maxRunningPerRequest: number
  readonly renderTools?: boolean | undefined
  readonly acceptWeights?: { readonly token?: string | undefined } | undefined
  readonly maxConcurrent: number
}

/**
 * A loaded adapter: its name, folder, digest, the policy version it was published as, and its engine.
 *
 * @category models
 * @since 0.1.0
 */
export interface Adapter {
  readonly name: string
  readonly path: string
  readonly digest: string
  readonly version: number
  readonly engine: PolicyEngine["Service"]
  readonly scope: Scope.Closeable
}

/**
 * What the server needs for adapters: the base weights they are merged into, the scope their engines live in.
 *
 * @category models
 * @since 0.1.0
 */
export interface Adapters {
  readonly base: Qwen2.Weights | undefined
  readonly scope: Scope.Scope
  readonly loaded: Map<string, Adapter>
  readonly maxBatchSize: number
}

/**
 * One server's state.
 *
 * @category models
 * @since 0.1.0
 */
export interface ServerState {
  readonly engine: PolicyEngine["Service"]
  readonly config: ModelConfig
  readonly model: Model
  readonly limits: Limits
  /** Most sequences of one request in the engine at once. */
  readonly perRequest: number
  readonly slots: Fair.Slots
  /** `promptBudget.charsPerTokenBound` of the tokenizer. */
  readonly charsPerToken: number
  /**
   * The policy version a client sees is the label its learner pushed the weights with. The engine's own versions
   * count pushes (they must increase), and a new run may push versions below the last run's: `owner` is the run
   * whose weights these are, and a push from another run replaces them whatever its version (one run at a time).
   */
  readonly labels: Map<number, number>
  owner: string | undefined
  /** One weights push at a time. */
  readonly pushing: Semaphore.Semaphore
  readonly parameters: ReadonlyArray<Qwen2.ParameterSpec>
  /** Every parameter's float32 bytes, plus room for the safetensors header. */
  readonly maxWeightBytes: number
  /** The last response id's number (an object: request views of the state share it). */
  readonly counter: { ids: number }
  /** LoRA adapters loaded over `POST /v1/load_lora_adapter` (`openAiServerAdapters.ts`). */
  readonly adapters: Adapters
  /** In a request's view of the state: the adapter it samples with. */
  readonly adapter?: Adapter | undefined
  /** Tokens any route takes: the server's own and the weights token (`internal/auth.ts`). */
  readonly auth: Auth.Tokens
  /** The weights token alone, when set: only it may replace the weights. */
  readonly weightsAuth: Auth.Tokens | undefined
  readonly gate: Auth.Gate
}

/**
 * A response's `lora_adapter` field (`{}` unless the request sampled with a LoRA adapter): its name, digest and
 * policy version, so that a trainer can check it sampled what it published.
 *
 * @category getters
 * @since 0.1.0
 */
export const adapterStamp = (state: ServerState): Record<string, unknown> =>
  state.adapter === undefined ? {} : {
    lora_adapter: { name: state.adapter.name, digest: state.adapter.digest, policy_version: state.adapter.version }
  }

/**
 * The next response id, `prefix-n`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const nextId = (state: ServerState, prefix: string): string => `${prefix}-${++state.counter.ids}`

/**
 * Now, in seconds (OpenAI's `created`).
 *
 * @category getters
 * @since 0.1.0
 */
export const now: Effect.Effect<number> = Effect.map(Clock.currentTimeMillis, (ms) => Math.floor(ms / 1000))

/**
 * The label (the pushing learner's version) of an engine version.
 *
 * @category getters
 * @since 0.1.0
 */
export const labelOf = (state: ServerState, engineVersion: number): number =>
  state.labels.get(engineVersion) ?? engineVersion

/**
 * The label of the weights new requests get now.
 *
 * @category getters
 * @since 0.1.0
 */
export const currentLabel = (state: ServerState): Effect.Effect<number> =>
  Effect.map(state.engine.policyVersion, (v) => labelOf(state, v))

/**
 * A request's `min_policy_version` against the weights new requests get now (409 when they are older).
 *
 * @category validation
 * @since 0.1.0
 */
export const atLeast = (state: ServerState, min: number | null | undefined): Effect.Effect<void, ApiError> =>
  min === undefined || min === null ? Effect.void : Effect.flatMap(currentLabel(state), (current) =>
    current >= min ? Effect.void : Effect.fail(
      new ApiError({
        status: 409,
        message: `this server's weights are policy version ${current}; the request asks for at least ${min}`,
        param: "min_policy_version",
        code: "policy_version_behind"
      })
    ))

/**
 * One sequence of a request (its lane), once the fair scheduler gives it a place in the batch; its policy version
 * the label.
 *
 * @category constructors
 * @since 0.1.0
 */
export const generate = (
  state: ServerState,
  lane: Fair.Lane,
  request: GenerateRequest,
  onToken?: (id: number, logprob: number) => void
): Effect.Effect<GenerateResult, ApiError> =>
  Fair.withSlot(state.slots, lane, Effect.mapError(state.engine.generate(request, { onToken }), samplerError)).pipe(
    Effect.map((result) => ({ ...result, policyVersion: labelOf(state, result.policyVersion) }))
  )

/**
 * Tokenizes `text` (a prompt, or a rendered chat) within the context and `left`, what is left of the request's
 * token budget.
 *
 * @category constructors
 * @since 0.1.0
 */
export const encodePrompt = (
  state: ServerState,
  text: string,
  left: number,
  param: string
): Effect.Effect<ReadonlyArray<number>, ApiError> => {
  const { config, limits } = state
  const limit = Math.min(config.maxPositionEmbeddings, left)
  const encoded = encodeWithin(state.model.tokenizer, state.charsPerToken, text, limit)
  if ("ids" in encoded) return Effect.succeed(encoded.ids)
  return Effect.fail(
    encoded.over > config.maxPositionEmbeddings ?
      overContext(encoded.over, encoded.exact, config, param) :
      tooManyTokens(limits.maxRequestTokens - left + encoded.over, false, limits.maxRequestTokens, param)
  )
}
