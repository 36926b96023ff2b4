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
import { Context, Schema } from "effect"
import type { Effect } from "effect"

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
  sampling: SamplingParams
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
  policyVersion: Schema.Int
})
export type GenerateResult = typeof GenerateResult.Type

/**
 * Why a sampler request failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const SamplerErrorReason = Schema.Literals([
  "Timeout", // the backend did not answer in time
  "Overloaded", // 429 or a full queue: retry later
  "ServerError", // 5xx
  "BadRequest", // the request itself is invalid (e.g. prompt longer than the context)
  "NoTokenIds", // the backend cannot return token ids: unusable for token-in/token-out training
  "Transport", // connection refused / reset
  "Closed" // the sampler was shut down
])
export type SamplerErrorReason = typeof SamplerErrorReason.Type

/**
 * A failed generate call.
 *
 * @category errors
 * @since 0.1.0
 */
export class SamplerError extends Schema.TaggedError<SamplerError>()("SamplerError", {
  reason: SamplerErrorReason,
  message: Schema.String
}) {
  get isRetryable(): boolean {
    return this.reason === "Timeout" || this.reason === "Overloaded" || this.reason === "ServerError" ||
      this.reason === "Transport"
  }
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
