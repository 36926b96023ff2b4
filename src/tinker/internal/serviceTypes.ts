/**
 * The Tinker API's session, model, future and service types (`../Types.ts` re-exports them with the rest).
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import {
  ForwardBackwardOutput,
  LoadWeightsResponse,
  ModelID,
  OptimStepResponse,
  RequestID,
  SampleResponse,
  SaveWeightsForSamplerResponse,
  SaveWeightsResponse
} from "./dataTypes.ts"
import { Metadata, optional, optionalTag, tag, withDefault } from "./fields.ts"

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
 * `ClientConfigRequest` (`types/client_config_request.py`): `POST /api/v1/client/config`, the SDK's first call.
 *
 * @category models
 * @since 0.1.0
 */
export const ClientConfigRequest = Schema.Struct({ sdk_version: Schema.String })
export type ClientConfigRequest = typeof ClientConfigRequest.Type

/**
 * `ClientConfigResponse` (`types/client_config_response.py`): the server's feature flags for the SDK, with its
 * defaults; plus `proto_write_fwdbwd` and `fwd_via_fwdbwd` of the SDK before 0.25 (b1e4ee3), which post
 * `forward_backward` as JSON unless `proto_write_fwdbwd` is true. Servers may add flags (the SDK ignores unknown ones).
 *
 * @category models
 * @since 0.1.0
 */
export const ClientConfigResponse = Schema.Struct({
  pjwt_auth_enabled: withDefault(Schema.Boolean, false),
  credential_default_source: withDefault(Schema.String, "api_key"),
  sample_dispatch_bytes_semaphore_size: withDefault(Schema.Int, 10 * 1024 * 1024),
  inflight_response_bytes_semaphore_size: withDefault(Schema.Int, 50 * 1024 * 1024),
  parallel_fwdbwd_chunks: withDefault(Schema.Boolean, true),
  proto_write_fwdbwd: withDefault(Schema.Boolean, false),
  proto_compress_fwdbwd: withDefault(Schema.Boolean, false),
  fwd_via_fwdbwd: withDefault(Schema.Boolean, false),
  fwdbwd_max_chunk_len: withDefault(Schema.Int, 1024),
  fwdbwd_max_chunk_bytes_count: withDefault(Schema.Int, 5_000_000),
  fwdbwd_dispatch_bytes_semaphore_size: withDefault(Schema.Int, 50 * 1000 * 1000),
  billing_exception_max_pause_duration_sec: withDefault(Schema.Int, 60 * 60),
  sample_no_retries: withDefault(Schema.Boolean, false),
  sample_enable_stuck_detection: withDefault(Schema.Boolean, true),
  sample_max_concurrent_requests: withDefault(Schema.Int, 2000),
  use_pyqwest_transport: withDefault(Schema.Boolean, true),
  create_model_via_load_weights: withDefault(Schema.Boolean, false)
})
export type ClientConfigResponse = typeof ClientConfigResponse.Type

/**
 * `HealthResponse` (`types/health_response.py`): `GET /api/v1/healthz`.
 *
 * @category models
 * @since 0.1.0
 */
export const HealthResponse = Schema.Struct({ status: Schema.Literal("ok") })
export type HealthResponse = typeof HealthResponse.Type

/**
 * `CheckpointArchiveUrlResponse` (`types/checkpoint_archive_url_response.py`): `GET
 * /api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id}/archive` (`resources/weights.py`,
 * `get_checkpoint_archive_url`; `checkpoint_id` is `sampler_weights/NAME` or `weights/NAME`). `url` is a plain GET
 * of the checkpoint's tar; `expires` a `datetime.datetime`, written by pydantic as an ISO 8601 string.
 *
 * @category models
 * @since 0.1.0
 */
export const CheckpointArchiveUrlResponse = Schema.Struct({ url: Schema.String, expires: Schema.String })
export type CheckpointArchiveUrlResponse = typeof CheckpointArchiveUrlResponse.Type

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
  client_config: { method: "POST", path: "/api/v1/client/config" },
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
