/**
 * The Tinker API's wire types as Effect Schemas, transcribed from the official Python SDK and named as it names them.
 *
 * **Source.** `thinking-machines-lab/tinker`, SDK version **0.25.0** (`pyproject.toml`), commit **d595dc2**
 * ("Sync contents", 2026-08-08): `src/tinker/types/*.py` (pydantic models; `_pydantic_types/` where the public type is
 * a dataclass over numpy) and `docs/api/types.md`. The three response types that HEAD turned into numpy dataclasses
 * (`SampleResponse`, `SampledSequence`, `ForwardBackwardOutput`) keep the JSON form Stainless generated from the
 * OpenAPI document at the SDK's first commit 829c151, which open servers (SkyRL's `skyrl/tinker/types.py`) still
 * send. The OpenAPI document itself (`.stats.yml`: `openapi_spec_hash ed32399a…`) is not reachable from here.
 *
 * **JSON form.** Each Schema's encoded side is what pydantic's `model_dump(mode="json", exclude_none=True)` writes
 * (the SDK posts bodies that way): a field with a default is written with its value, an `Optional[...] = None` field
 * is left out. Decoding is as lenient as pydantic: a defaulted field may be absent (its default is filled in), an
 * optional field may be absent or `null` (servers built on FastAPI write `null`s), unknown keys are ignored.
 *
 * **Not here**: the protobuf body the SDK ≥ 0.25 posts to `forward_backward` (see `docs/tinker.md`), telemetry,
 * billing, checkpoints listing and archive routes.
 *
 * @since 0.1.0
 */
import { Effect, Option, Schema, SchemaGetter } from "effect"

/** The SDK release and commit these Schemas were transcribed from. */
export const sdk = { name: "tinker", version: "0.25.0", commit: "d595dc2" } as const

// ===== Helpers =====

/** `Optional[X] = None`: absent when None (`exclude_none`); `null` is accepted on decoding and read as absent. */
const optional = <S extends Schema.Top>(schema: S) =>
  Schema.optionalKey(Schema.NullOr(schema)).pipe(Schema.decodeTo(Schema.optionalKey(Schema.toType(schema)), {
    decode: SchemaGetter.transformOptional(Option.filter((v) => v !== null)),
    encode: SchemaGetter.passthrough()
  }))

/** A field with a pydantic default: filled in on decoding when absent, always written. */
const withDefault = <S extends Schema.Top>(schema: S, value: S["Encoded"]) =>
  schema.pipe(Schema.withDecodingDefaultKey<S, never>(Effect.succeed(value)))

/** The `type` discriminator pydantic writes with its default. */
const tag = <const L extends string>(literal: L) => withDefault(Schema.Literal(literal), literal)

/** `Optional[Literal[...]] = None`: a response's `type`, absent or null on some servers. */
const optionalTag = <const L extends string>(literal: L) => optional(Schema.Literal(literal))

/** Free-form metadata (`dict[str, Any]`). */
const Metadata = Schema.Record(Schema.String, Schema.Unknown)

/** `Dict[str, float]`. */
const Metrics = Schema.Record(Schema.String, Schema.Number)

/**
 * `value` as JSON through `schema` (what goes on the wire).
 *
 * @category constructors
 * @since 0.1.0
 */
export const encodeJson = <S extends Schema.Codec<any, any, never, never>>(schema: S, value: S["Type"]): unknown =>
  Schema.encodeSync(schema)(value)

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

// ===== Sessions and models =====

/**
 * `CreateSessionRequest` (`types/create_session_request.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const CreateSessionRequest = Schema.Struct({
  tags: Schema.Array(Schema.String),
  user_metadata: optional(Metadata),
  sdk_version: Schema.String,
  project_id: optional(Schema.String),
  type: tag("create_session")
})
export type CreateSessionRequest = typeof CreateSessionRequest.Type

/**
 * `CreateSessionResponse` (`types/create_session_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const CreateSessionResponse = Schema.Struct({
  type: tag("create_session"),
  info_message: optional(Schema.String),
  warning_message: optional(Schema.String),
  error_message: optional(Schema.String),
  session_id: Schema.String
})
export type CreateSessionResponse = typeof CreateSessionResponse.Type

/**
 * `SessionHeartbeatRequest` (`types/session_heartbeat_request.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const SessionHeartbeatRequest = Schema.Struct({ session_id: Schema.String, type: tag("session_heartbeat") })
export type SessionHeartbeatRequest = typeof SessionHeartbeatRequest.Type

/**
 * `SessionHeartbeatResponse` (`types/session_heartbeat_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const SessionHeartbeatResponse = Schema.Struct({ type: tag("session_heartbeat") })
export type SessionHeartbeatResponse = typeof SessionHeartbeatResponse.Type

/**
 * `LoraConfig` (`types/lora_config.py`), with the SDK's defaults.
 *
 * @category models
 * @since 0.1.0
 */
export const LoraConfig = Schema.Struct({
  rank: Schema.Int,
  seed: optional(Schema.Int),
  train_unembed: withDefault(Schema.Boolean, true),
  train_mlp: withDefault(Schema.Boolean, true),
  train_attn: withDefault(Schema.Boolean, true)
})
export type LoraConfig = typeof LoraConfig.Type

/**
 * `CreateModelRequest` (`types/create_model_request.py`): `POST /api/v1/create_model`.
 *
 * @category models
 * @since 0.1.0
 */
export const CreateModelRequest = Schema.Struct({
  session_id: Schema.String,
  model_seq_id: Schema.Int,
  base_model: Schema.String,
  user_metadata: optional(Metadata),
  lora_config: optional(LoraConfig),
  type: tag("create_model")
})
export type CreateModelRequest = typeof CreateModelRequest.Type

/**
 * `CreateModelResponse` (`types/create_model_response.py`): the future's result.
 *
 * @category models
 * @since 0.1.0
 */
export const CreateModelResponse = Schema.Struct({ model_id: ModelID, type: tag("create_model") })
export type CreateModelResponse = typeof CreateModelResponse.Type

/**
 * `UnloadModelRequest` (`types/unload_model_request.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const UnloadModelRequest = Schema.Struct({ model_id: ModelID, type: tag("unload_model") })
export type UnloadModelRequest = typeof UnloadModelRequest.Type

/**
 * `UnloadModelResponse` (`types/unload_model_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const UnloadModelResponse = Schema.Struct({ model_id: ModelID, type: optionalTag("unload_model") })
export type UnloadModelResponse = typeof UnloadModelResponse.Type

/**
 * `GetInfoRequest` (`types/get_info_request.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const GetInfoRequest = Schema.Struct({ model_id: ModelID, type: tag("get_info") })
export type GetInfoRequest = typeof GetInfoRequest.Type

/**
 * `ModelData` (`types/_pydantic_types/get_info_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const ModelData = Schema.Struct({
  arch: optional(Schema.String),
  model_name: optional(Schema.String),
  tokenizer_id: optional(Schema.String)
})
export type ModelData = typeof ModelData.Type

/**
 * `GetInfoResponse` (`types/_pydantic_types/get_info_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const GetInfoResponse = Schema.Struct({
  type: optionalTag("get_info"),
  model_data: ModelData,
  model_id: ModelID,
  is_lora: optional(Schema.Boolean),
  lora_rank: optional(Schema.Int),
  model_name: optional(Schema.String)
})
export type GetInfoResponse = typeof GetInfoResponse.Type

// ===== Futures =====

/**
 * `UntypedAPIFuture` (`types/shared/untyped_api_future.py`): what every asynchronous route answers at once.
 *
 * @category models
 * @since 0.1.0
 */
export const UntypedAPIFuture = Schema.Struct({ request_id: RequestID, model_id: optional(ModelID) })
export type UntypedAPIFuture = typeof UntypedAPIFuture.Type

/**
 * `FutureRetrieveRequest` (`types/future_retrieve_request.py`): `POST /api/v1/retrieve_future`.
 *
 * @category models
 * @since 0.1.0
 */
export const FutureRetrieveRequest = Schema.Struct({
  request_id: RequestID,
  allow_metadata_only: withDefault(Schema.Boolean, false)
})
export type FutureRetrieveRequest = typeof FutureRetrieveRequest.Type

/**
 * `TryAgainResponse` (`types/try_again_response.py`): the future is still pending; poll again.
 *
 * @category models
 * @since 0.1.0
 */
export const TryAgainResponse = Schema.Struct({
  type: tag("try_again"),
  request_id: RequestID,
  queue_state: Schema.Literals(["active", "paused_capacity", "paused_rate_limit"]),
  /** Read by the SDK's queue-state logger (`lib/api_future_impl.py`), not declared in the type. */
  queue_state_reason: optional(Schema.String)
})
export type TryAgainResponse = typeof TryAgainResponse.Type

/**
 * `RequestErrorCategory` (`types/request_error_category.py`): a `StrEnum` of `auto()` members, whose values are the
 * lower-cased names.
 *
 * @category models
 * @since 0.1.0
 */
export const RequestErrorCategory = Schema.Literals(["unknown", "server", "user"])
export type RequestErrorCategory = typeof RequestErrorCategory.Type

/**
 * `RequestFailedResponse` (`types/request_failed_response.py`): the future failed.
 *
 * @category models
 * @since 0.1.0
 */
export const RequestFailedResponse = Schema.Struct({ error: Schema.String, category: RequestErrorCategory })
export type RequestFailedResponse = typeof RequestFailedResponse.Type

/**
 * `FutureRetrieveResponse` (`types/future_retrieve_response.py`), plus `SampleResponse` (an `asample` future's
 * result, retrieved the same way). Which member a caller expects depends on the request that made the future:
 * decode with {@link futureResult} rather than with this union, whose members overlap (`{ path }`).
 *
 * @category models
 * @since 0.1.0
 */
export const FutureRetrieveResponse = Schema.Union([
  TryAgainResponse,
  RequestFailedResponse,
  ForwardBackwardOutput,
  OptimStepResponse,
  SaveWeightsResponse,
  LoadWeightsResponse,
  SaveWeightsForSamplerResponse,
  CreateModelResponse,
  UnloadModelResponse,
  SampleResponse
])
export type FutureRetrieveResponse = typeof FutureRetrieveResponse.Type

/**
 * What `retrieve_future` answers for a future whose result is `result`: pending, failed, or the result.
 *
 * @category constructors
 * @since 0.1.0
 */
export const futureResult = <S extends Schema.Top>(result: S) =>
  Schema.Union([TryAgainResponse, RequestFailedResponse, result])

// ===== Service =====

/**
 * `HealthResponse` (`types/health_response.py`): `GET /api/v1/healthz`.
 *
 * @category models
 * @since 0.1.0
 */
export const HealthResponse = Schema.Struct({ status: Schema.Literal("ok") })
export type HealthResponse = typeof HealthResponse.Type

/**
 * `SupportedModel` (`types/get_server_capabilities_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const SupportedModel = Schema.Struct({
  model_name: optional(Schema.String),
  max_context_length: optional(Schema.Int)
})
export type SupportedModel = typeof SupportedModel.Type

/**
 * `GetServerCapabilitiesResponse` (`types/get_server_capabilities_response.py`).
 *
 * @category models
 * @since 0.1.0
 */
export const GetServerCapabilitiesResponse = Schema.Struct({ supported_models: Schema.Array(SupportedModel) })
export type GetServerCapabilitiesResponse = typeof GetServerCapabilitiesResponse.Type

/**
 * The body of an HTTP error (4xx/5xx). The SDK declares none (`_base_client.py` keeps whatever JSON came, in
 * `APIStatusError.body`); this is FastAPI's `HTTPException` body, which SkyRL's server answers and ours copies.
 * Not an SDK type.
 *
 * @category models
 * @since 0.1.0
 */
export const ErrorBody = Schema.Struct({ detail: Schema.Unknown })
export type ErrorBody = typeof ErrorBody.Type

/**
 * The HTTP headers the SDK sends (`_client.py`, `lib/_auth_token_provider.py`): its API key and, on every
 * non-GET request, an idempotency key kept across its own retries (`stainless-python-retry-<uuid>`).
 *
 * @category models
 * @since 0.1.0
 */
export const headers = { apiKey: "X-API-Key", idempotencyKey: "X-Idempotency-Key" } as const

/**
 * The routes (`resources/*.py`), each with the request it takes and what it answers at once: a future
 * ({@link UntypedAPIFuture}) for the training, weights and sampling calls, the response itself for the rest.
 *
 * @category models
 * @since 0.1.0
 */
export const routes = {
  healthz: { method: "GET", path: "/api/v1/healthz" },
  get_server_capabilities: { method: "GET", path: "/api/v1/get_server_capabilities" },
  create_session: { method: "POST", path: "/api/v1/create_session" },
  session_heartbeat: { method: "POST", path: "/api/v1/session_heartbeat" },
  create_sampling_session: { method: "POST", path: "/api/v1/create_sampling_session" },
  create_model: { method: "POST", path: "/api/v1/create_model" },
  get_info: { method: "POST", path: "/api/v1/get_info" },
  unload_model: { method: "POST", path: "/api/v1/unload_model" },
  forward: { method: "POST", path: "/api/v1/forward" },
  forward_backward: { method: "POST", path: "/api/v1/forward_backward" },
  optim_step: { method: "POST", path: "/api/v1/optim_step" },
  save_weights_for_sampler: { method: "POST", path: "/api/v1/save_weights_for_sampler" },
  save_weights: { method: "POST", path: "/api/v1/save_weights" },
  load_weights: { method: "POST", path: "/api/v1/load_weights" },
  asample: { method: "POST", path: "/api/v1/asample" },
  retrieve_future: { method: "POST", path: "/api/v1/retrieve_future" }
} as const
export type Route = keyof typeof routes
