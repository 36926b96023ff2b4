/**
 * A token-in / token-out `Sampler` on a Tinker engine's `asample`: the prompt's token ids in, the sampled token ids and
 * their logprobs out, from the weights a `save_weights_for_sampler` published (`modelPath`, a `tinker://` path), or
 * the base model. Each policy version of a `learner.backend: "tinker"` run is one such path; a sampler is pinned to
 * one, so every token it samples comes from that version.
 *
 * The request's stop token ids are its only stops (`sampling_params.stop` as ids), as in the local engine. An answer
 * without logprobs cannot train: `NoTokenIds`. Client failures map to the `SamplerError` reasons a rollout's error
 * policy knows: a quota to `Overloaded`, an unreachable engine to `Transport`, a future that took too long to
 * `Timeout`, a refused request to `BadRequest`.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import type { GenerateRequest, GenerateResult, SamplerError } from "../Sampler.ts"
import { Sampler, samplerError } from "../Sampler.ts"
import * as Tinker from "../tinker/Types.ts"
import { TinkerClient } from "./TinkerClient.ts"
import type { TinkerError } from "./TinkerClient.ts"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The weights to sample: a `tinker://` path from `save_weights_for_sampler`; absent: `baseModel`. */
  readonly modelPath?: string | undefined
  readonly baseModel: string
  /** The policy version these weights are (reported with every sample). */
  readonly policyVersion: number
}

/**
 * The `SampleRequest` of a generate request.
 *
 * @category constructors
 * @since 0.1.0
 */
export const sampleRequest = (options: Options, request: GenerateRequest): Tinker.SampleRequest => {
  const { sampling } = request
  return {
    num_samples: 1,
    prompt: { chunks: [{ tokens: [...request.promptTokenIds], type: "encoded_text" }] },
    sampling_params: {
      max_tokens: sampling.maxTokens,
      ...(sampling.seed === undefined ? {} : { seed: sampling.seed }),
      ...(sampling.stopTokenIds === undefined || sampling.stopTokenIds.length === 0
        ? {}
        : { stop: [...sampling.stopTokenIds] }),
      temperature: sampling.temperature,
      top_k: sampling.topK ?? -1,
      top_p: sampling.topP ?? 1
    },
    ...(options.modelPath === undefined ? { base_model: options.baseModel } : { model_path: options.modelPath }),
    topk_prompt_logprobs: 0,
    type: "sample"
  }
}

/** A client failure as the sampler's. */
const fromTinker = (e: TinkerError): SamplerError => {
  const r = e.reason
  const message = `Tinker ${e.message}`
  switch (r._tag) {
    case "QuotaExceeded":
      return samplerError("Overloaded", message, r.retryAfterMs === undefined ? {} : { retryAfterMs: r.retryAfterMs })
    case "ServerError":
      return samplerError("ServerError", message, { status: r.status })
    case "ConnectionLost":
      return samplerError("Transport", message)
    case "FutureTimedOut":
      return samplerError("Timeout", message)
    case "Unauthorized":
    case "BadRequest":
      return samplerError("BadRequest", message, { status: r.status })
    default:
      return samplerError("BadRequest", message)
  }
}

/**
 * A sampler of `options`' weights on the Tinker engine of the client in context.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fnUntraced(function*(options: Options) {
  const client = yield* TinkerClient
  return Sampler.of({
    generate: Effect.fn("TinkerSampler.generate")(function*(request: GenerateRequest) {
      const response = yield* client.submit(
        "asample",
        Tinker.SampleRequest,
        sampleRequest(options, request),
        Tinker.SampleResponse
      ).pipe(Effect.mapError(fromTinker))
      const sequence = response.sequences[0]
      if (sequence === undefined) return yield* samplerError("ServerError", "Tinker asample answered no sequence")
      if (sequence.logprobs === undefined || sequence.logprobs.length !== sequence.tokens.length) {
        return yield* samplerError("NoTokenIds", "Tinker asample answered no logprobs for the sampled tokens")
      }
      const result: GenerateResult = {
        tokenIds: sequence.tokens,
        logprobs: sequence.logprobs,
        finishReason: sequence.stop_reason,
        policyVersion: options.policyVersion
      }
      return result
    }),
    policyVersion: Effect.succeed(options.policyVersion)
  })
})
