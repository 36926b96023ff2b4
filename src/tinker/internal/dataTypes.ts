/**
 * The Tinker API's data, training, weights and sampling types (`../Types.ts` re-exports them with the rest).
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import { Metadata, Metrics, optional, optionalTag, tag, withDefault } from "./fields.ts"

// ===== Ids =====

/**
 * `ModelID` (`types/model_id.py`): a string the server hands out in `CreateModelResponse`.
 *
 * @category models
 * @since 0.1.0
 */
export const ModelID = Schema.String

/**
 * `RequestID` (`types/request_id.py`): a future's id.
 *
 * @category models
 * @since 0.1.0
 */
export const RequestID = Schema.String

// ===== Inputs =====

/**
 * `TensorDtype` (`types/tensor_dtype.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const TensorDtype = Schema.Literals(["int64", "float32"])
export type TensorDtype = typeof TensorDtype.Type

/**
 * `TensorData` (`types/_pydantic_types/tensor_data.py`): a flattened tensor; `shape` defaults to one dimension;
 * sparse CSR when `sparse_crow_indices`/`sparse_col_indices` are set (then `shape` is required and `data` holds the
 * non-zero values).
 *
 * @category models
 * @since 0.1.0
 */
export const TensorData = Schema.Struct({
  data: Schema.Array(Schema.Number),
  dtype: TensorDtype,
  shape: optional(Schema.Array(Schema.Int)),
  sparse_crow_indices: optional(Schema.Array(Schema.Int)),
  sparse_col_indices: optional(Schema.Array(Schema.Int))
})
export type TensorData = typeof TensorData.Type

/**
 * `EncodedTextChunk` (`types/encoded_text_chunk.py`): token ids.
 *
 * @category models
 * @since 0.1.0
 */
export const EncodedTextChunk = Schema.Struct({
  tokens: Schema.Array(Schema.Int),
  type: tag("encoded_text")
})
export type EncodedTextChunk = typeof EncodedTextChunk.Type

/**
 * `ImageAssetPointerChunk` (`types/image_asset_pointer_chunk.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const ImageAssetPointerChunk = Schema.Struct({
  format: Schema.Literals(["png", "jpeg"]),
  location: Schema.String,
  expected_tokens: optional(Schema.Int),
  type: tag("image_asset_pointer")
})

/**
 * `ImageChunk` (`types/image_chunk.py`): `data` is base64 on the wire.
 *
 * @category models
 * @since 0.1.0
 */
export const ImageChunk = Schema.Struct({
  data: Schema.String,
  format: Schema.Literals(["png", "jpeg"]),
  expected_tokens: optional(Schema.Int),
  type: tag("image")
})

/**
 * `DmelChunk` (`types/dmel_chunk.py`): `dmel` is base64 on the wire.
 *
 * @category models
 * @since 0.1.0
 */
export const DmelChunk = Schema.Struct({ dmel: Schema.String, type: tag("dmel") })

/**
 * `ModelInputChunk` (`types/model_input_chunk.py`), discriminated by `type`.
 *
 * @category models
 * @since 0.1.0
 */
export const ModelInputChunk = Schema.Union([EncodedTextChunk, ImageAssetPointerChunk, ImageChunk, DmelChunk])
export type ModelInputChunk = typeof ModelInputChunk.Type

/**
 * `ModelInput` (`types/_pydantic_types/model_input.py`): a sequence of chunks.
 *
 * @category models
 * @since 0.1.0
 */
export const ModelInput = Schema.Struct({ chunks: Schema.Array(ModelInputChunk) })
export type ModelInput = typeof ModelInput.Type

/**
 * `LossFnInputs` (`types/loss_fn_inputs.py`): `target_tokens`, `weights`, `logprobs`, `advantages`, … by name.
 *
 * @category models
 * @since 0.1.0
 */
export const LossFnInputs = Schema.Record(Schema.String, TensorData)
export type LossFnInputs = typeof LossFnInputs.Type

/**
 * `LossFnOutput` (`types/loss_fn_output.py`): per datum, e.g. `logprobs` and `elementwise_loss`.
 *
 * @category models
 * @since 0.1.0
 */
export const LossFnOutput = Schema.Record(Schema.String, TensorData)
export type LossFnOutput = typeof LossFnOutput.Type

/**
 * `LossFnType` (`types/loss_fn_type.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const LossFnType = Schema.Literals(["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"])
export type LossFnType = typeof LossFnType.Type

/**
 * `Datum` (`types/_pydantic_types/datum.py`): one sequence of a forward/backward batch.
 *
 * @category models
 * @since 0.1.0
 */
export const Datum = Schema.Struct({ loss_fn_inputs: LossFnInputs, model_input: ModelInput })
export type Datum = typeof Datum.Type

// ===== Training =====

/**
 * `ForwardBackwardInput` (`types/_pydantic_types/forward_backward_input.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const ForwardBackwardInput = Schema.Struct({
  data: Schema.Array(Datum),
  loss_fn: LossFnType,
  loss_fn_config: optional(Metrics)
})
export type ForwardBackwardInput = typeof ForwardBackwardInput.Type

/**
 * `ForwardBackwardRequest` (`types/forward_backward_request.py`): `POST /api/v1/forward_backward`.
 *
 * @category models
 * @since 0.1.0
 */
export const ForwardBackwardRequest = Schema.Struct({
  forward_backward_input: ForwardBackwardInput,
  model_id: ModelID,
  seq_id: optional(Schema.Int)
})
export type ForwardBackwardRequest = typeof ForwardBackwardRequest.Type

/**
 * `ForwardRequest` (`types/forward_request.py`): `POST /api/v1/forward` (no gradient accumulated).
 *
 * @category models
 * @since 0.1.0
 */
export const ForwardRequest = Schema.Struct({
  forward_input: ForwardBackwardInput,
  model_id: ModelID,
  seq_id: optional(Schema.Int)
})
export type ForwardRequest = typeof ForwardRequest.Type

/**
 * `ForwardBackwardOutput` (the JSON form of 829c151's `types/forward_backward_output.py`; `metrics` defaults to `{}`
 * at d595dc2).
 *
 * @category models
 * @since 0.1.0
 */
export const ForwardBackwardOutput = Schema.Struct({
  loss_fn_output_type: Schema.String,
  loss_fn_outputs: Schema.Array(LossFnOutput),
  metrics: withDefault(Metrics, {})
})
export type ForwardBackwardOutput = typeof ForwardBackwardOutput.Type

/**
 * `AdamParams` (`types/optim_step_request.py`), with the SDK's defaults.
 *
 * @category models
 * @since 0.1.0
 */
export const AdamParams = Schema.Struct({
  learning_rate: withDefault(Schema.Number, 0.0001),
  beta1: withDefault(Schema.Number, 0.9),
  beta2: withDefault(Schema.Number, 0.95),
  eps: withDefault(Schema.Number, 1e-12),
  /** Decoupled weight decay. */
  weight_decay: withDefault(Schema.Number, 0),
  /** Largest global gradient norm; 0 = no clipping. */
  grad_clip_norm: withDefault(Schema.Number, 0)
})
export type AdamParams = typeof AdamParams.Type

/**
 * `OptimStepRequest` (`types/optim_step_request.py`): `POST /api/v1/optim_step`.
 *
 * @category models
 * @since 0.1.0
 */
export const OptimStepRequest = Schema.Struct({
  adam_params: AdamParams,
  model_id: ModelID,
  seq_id: optional(Schema.Int),
  type: tag("optim_step")
})
export type OptimStepRequest = typeof OptimStepRequest.Type

/**
 * `OptimStepResponse` (`types/_pydantic_types/optim_step_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const OptimStepResponse = Schema.Struct({ metrics: optional(Metrics) })
export type OptimStepResponse = typeof OptimStepResponse.Type

// ===== Weights =====

/**
 * `SaveWeightsForSamplerRequest` (`types/save_weights_for_sampler_request.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const SaveWeightsForSamplerRequest = Schema.Struct({
  model_id: ModelID,
  path: optional(Schema.String),
  sampling_session_seq_id: optional(Schema.Int),
  seq_id: optional(Schema.Int),
  ttl_seconds: optional(Schema.Int),
  type: tag("save_weights_for_sampler")
})
export type SaveWeightsForSamplerRequest = typeof SaveWeightsForSamplerRequest.Type

/**
 * `SaveWeightsForSamplerResponse` (`types/_pydantic_types/save_weights_for_sampler_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const SaveWeightsForSamplerResponse = Schema.Struct({
  path: Schema.String,
  type: optionalTag("save_weights_for_sampler")
})
export type SaveWeightsForSamplerResponse = typeof SaveWeightsForSamplerResponse.Type

/**
 * `SaveWeightsForSamplerResponseInternal`: the same future's result when the request asked for a sampling session
 * (`sampling_session_seq_id`) instead of a path.
 *
 * @category models
 * @since 0.1.0
 */
export const SaveWeightsForSamplerResponseInternal = Schema.Struct({
  path: optional(Schema.String),
  sampling_session_id: optional(Schema.String),
  type: optionalTag("save_weights_for_sampler")
})

/**
 * `SaveWeightsRequest` (`types/save_weights_request.py`): the training state (weights and optimizer).
 *
 * @category models
 * @since 0.1.0
 */
export const SaveWeightsRequest = Schema.Struct({
  model_id: ModelID,
  path: optional(Schema.String),
  seq_id: optional(Schema.Int),
  ttl_seconds: optional(Schema.Int),
  overwrite: withDefault(Schema.Boolean, false),
  type: tag("save_weights")
})
export type SaveWeightsRequest = typeof SaveWeightsRequest.Type

/**
 * `SaveWeightsResponse` (`types/save_weights_response.py`): `path` is a `tinker://` URI.
 *
 * @category models
 * @since 0.1.0
 */
export const SaveWeightsResponse = Schema.Struct({ path: Schema.String, type: optionalTag("save_weights") })
export type SaveWeightsResponse = typeof SaveWeightsResponse.Type

/**
 * `LoadWeightsRequest` (`types/load_weights_request.py`): legacy addressing (`model_id` + `seq_id`) or
 * create-via-load (`session_id` + `model_seq_id`).
 *
 * @category models
 * @since 0.1.0
 */
export const LoadWeightsRequest = Schema.Struct({
  model_id: optional(ModelID),
  seq_id: optional(Schema.Int),
  session_id: optional(Schema.String),
  model_seq_id: optional(Schema.Int),
  base_model: optional(Schema.String),
  user_metadata: optional(Metadata),
  path: Schema.String,
  optimizer: Schema.Boolean,
  weights_access_token: optional(Schema.String),
  type: tag("load_weights")
})
export type LoadWeightsRequest = typeof LoadWeightsRequest.Type

/**
 * `LoadWeightsResponse` (`types/_pydantic_types/load_weights_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const LoadWeightsResponse = Schema.Struct({
  path: optional(Schema.String),
  model_id: optional(Schema.String),
  type: optionalTag("load_weights")
})
export type LoadWeightsResponse = typeof LoadWeightsResponse.Type

// ===== Sampling =====

/**
 * `StopReason` (`types/_pydantic_types/stop_reason.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const StopReason = Schema.Literals(["length", "stop"])
export type StopReason = typeof StopReason.Type

/**
 * `SamplingParams` (`types/_pydantic_types/sampling_params.py`), with the SDK's defaults.
 *
 * @category models
 * @since 0.1.0
 */
export const SamplingParams = Schema.Struct({
  max_tokens: optional(Schema.Int),
  seed: optional(Schema.Int),
  stop: optional(Schema.Union([Schema.String, Schema.Array(Schema.String), Schema.Array(Schema.Int)])),
  temperature: withDefault(Schema.Number, 1),
  /** -1: no limit. */
  top_k: withDefault(Schema.Int, -1),
  top_p: withDefault(Schema.Number, 1)
})
export type SamplingParams = typeof SamplingParams.Type

/**
 * `SampleRequest` (`types/sample_request.py`): `POST /api/v1/asample`.
 *
 * @category models
 * @since 0.1.0
 */
export const SampleRequest = Schema.Struct({
  num_samples: withDefault(Schema.Int, 1),
  prompt: ModelInput,
  sampling_params: SamplingParams,
  base_model: optional(Schema.String),
  /** A `tinker://` path from `save_weights_for_sampler`; absent: the base model. */
  model_path: optional(Schema.String),
  sampling_session_id: optional(Schema.String),
  seq_id: optional(Schema.Int),
  prompt_logprobs: optional(Schema.Boolean),
  topk_prompt_logprobs: withDefault(Schema.Int, 0),
  type: tag("sample")
})
export type SampleRequest = typeof SampleRequest.Type

/**
 * `SampledSequence` (the JSON form of 829c151's `types/sampled_sequence.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const SampledSequence = Schema.Struct({
  stop_reason: StopReason,
  tokens: Schema.Array(Schema.Int),
  logprobs: optional(Schema.Array(Schema.Number))
})
export type SampledSequence = typeof SampledSequence.Type

/**
 * `SampleResponse` (the JSON form of 829c151's `types/sample_response.py`, plus d595dc2's top-k prompt logprobs as
 * SkyRL writes them: per prompt token, `[token_id, logprob]` pairs or null).
 *
 * @category models
 * @since 0.1.0
 */
export const SampleResponse = Schema.Struct({
  sequences: Schema.Array(SampledSequence),
  type: tag("sample"),
  prompt_logprobs: optional(Schema.Array(Schema.NullOr(Schema.Number))),
  topk_prompt_logprobs: optional(
    Schema.Array(Schema.NullOr(Schema.Array(Schema.Tuple([Schema.Int, Schema.Number]))))
  )
})
export type SampleResponse = typeof SampleResponse.Type

/**
 * `CreateSamplingSessionRequest` (`types/create_sampling_session_request.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const CreateSamplingSessionRequest = Schema.Struct({
  session_id: Schema.String,
  sampling_session_seq_id: Schema.Int,
  base_model: optional(Schema.String),
  model_path: optional(Schema.String),
  type: tag("create_sampling_session")
})
export type CreateSamplingSessionRequest = typeof CreateSamplingSessionRequest.Type

/**
 * `CreateSamplingSessionResponse` (`types/create_sampling_session_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const CreateSamplingSessionResponse = Schema.Struct({
  type: tag("create_sampling_session"),
  sampling_session_id: Schema.String
})
export type CreateSamplingSessionResponse = typeof CreateSamplingSessionResponse.Type
