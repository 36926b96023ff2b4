/**
 * The Tinker Schemas against JSON shaped as the SDK's pydantic `model_dump(mode="json", exclude_none=True)` writes
 * it (hand-written from `src/tinker/types/*.py` at d595dc2): each fixture decodes, encodes back to itself, and the
 * SDK's defaults are filled in where a sender left them out. Bodies the SDK would refuse are refused.
 */
import { assert, describe, it } from "@effect/vitest"
import { Schema } from "effect"
import * as T from "../../src/tinker/Types.ts"

const tokens = (ids: ReadonlyArray<number>) => ({ chunks: [{ tokens: ids, type: "encoded_text" }] })
const f32 = (data: ReadonlyArray<number>) => ({ data, dtype: "float32", shape: [data.length] })
const i64 = (data: ReadonlyArray<number>) => ({ data, dtype: "int64", shape: [data.length] })
const adamDefaults = { learning_rate: 0.0001, beta1: 0.9, beta2: 0.95, eps: 1e-12, weight_decay: 0, grad_clip_norm: 0 }

/** Each Schema with bodies as `model_dump` writes them (defaults written, `None` left out). */
const dumped: ReadonlyArray<readonly [string, Schema.Codec<any, any>, ReadonlyArray<unknown>]> = [
  ["TensorData", T.TensorData, [
    f32([0.5, -1]),
    { data: [1, 2], dtype: "int64" },
    { data: [1, 1], dtype: "float32", shape: [2, 3], sparse_crow_indices: [0, 1, 2], sparse_col_indices: [0, 2] }
  ]],
  ["ModelInput", T.ModelInput, [
    tokens([1, 2, 3]),
    { chunks: [] },
    {
      chunks: [
        { tokens: [7], type: "encoded_text" },
        { format: "png", location: "s3://x.png", type: "image_asset_pointer" }
      ]
    },
    { chunks: [{ data: "iVBORw0=", format: "jpeg", expected_tokens: 4, type: "image" }] }
  ]],
  ["Datum", T.Datum, [
    { loss_fn_inputs: { target_tokens: i64([2, 3]), weights: f32([0, 1]) }, model_input: tokens([1, 2]) },
    {
      loss_fn_inputs: { target_tokens: i64([5]), logprobs: f32([-0.25]), advantages: f32([1.5]) },
      model_input: tokens([4])
    }
  ]],
  ["ForwardBackwardRequest", T.ForwardBackwardRequest, [
    {
      forward_backward_input: {
        data: [{ loss_fn_inputs: { target_tokens: i64([2]), weights: f32([1]) }, model_input: tokens([1]) }],
        loss_fn: "cross_entropy"
      },
      model_id: "model_1",
      seq_id: 3
    },
    {
      forward_backward_input: { data: [], loss_fn: "ppo", loss_fn_config: { clip_low_threshold: 0.8 } },
      model_id: "model_1"
    }
  ]],
  ["ForwardRequest", T.ForwardRequest, [
    { forward_input: { data: [], loss_fn: "importance_sampling" }, model_id: "m", seq_id: 1 }
  ]],
  ["ForwardBackwardOutput", T.ForwardBackwardOutput, [
    { loss_fn_output_type: "ArrayRecord", loss_fn_outputs: [{ logprobs: f32([-1]) }], metrics: { "loss:sum": 1.5 } },
    { loss_fn_output_type: "TorchLossReturn", loss_fn_outputs: [], metrics: {} }
  ]],
  ["AdamParams", T.AdamParams, [adamDefaults, { ...adamDefaults, learning_rate: 0.001, grad_clip_norm: 1 }]],
  ["OptimStepRequest", T.OptimStepRequest, [
    { adam_params: adamDefaults, model_id: "m", seq_id: 4, type: "optim_step" },
    { adam_params: { ...adamDefaults, weight_decay: 0.01 }, model_id: "m", type: "optim_step" }
  ]],
  ["OptimStepResponse", T.OptimStepResponse, [{}, { metrics: { grad_norm: 0.5 } }]],
  ["SaveWeightsForSamplerRequest", T.SaveWeightsForSamplerRequest, [
    { model_id: "m", path: "step-1", seq_id: 5, type: "save_weights_for_sampler" },
    { model_id: "m", sampling_session_seq_id: 0, ttl_seconds: 60, type: "save_weights_for_sampler" }
  ]],
  ["SaveWeightsForSamplerResponse", T.SaveWeightsForSamplerResponse, [
    { path: "tinker://m/sampler_weights/step-1" },
    { path: "tinker://m/sampler_weights/step-1", type: "save_weights_for_sampler" }
  ]],
  ["SaveWeightsRequest", T.SaveWeightsRequest, [
    { model_id: "m", path: "ckpt", seq_id: 6, overwrite: false, type: "save_weights" },
    { model_id: "m", overwrite: true, type: "save_weights" }
  ]],
  ["SaveWeightsResponse", T.SaveWeightsResponse, [{ path: "tinker://m/weights/ckpt", type: "save_weights" }]],
  ["LoadWeightsRequest", T.LoadWeightsRequest, [
    { model_id: "m", seq_id: 1, path: "tinker://m/weights/ckpt", optimizer: true, type: "load_weights" },
    {
      session_id: "s",
      model_seq_id: 0,
      base_model: "tiny",
      user_metadata: { run: "a" },
      path: "tinker://m/weights/ckpt",
      optimizer: false,
      type: "load_weights"
    }
  ]],
  ["LoadWeightsResponse", T.LoadWeightsResponse, [{}, { path: "tinker://m/weights/ckpt", model_id: "m" }]],
  ["SamplingParams", T.SamplingParams, [
    { temperature: 1, top_k: -1, top_p: 1 },
    { max_tokens: 16, seed: 7, stop: ["\n"], temperature: 0.7, top_k: 40, top_p: 0.9 },
    { stop: [2, 3], temperature: 1, top_k: -1, top_p: 1 },
    { stop: "</s>", temperature: 1, top_k: -1, top_p: 1 }
  ]],
  ["SampleRequest", T.SampleRequest, [
    {
      num_samples: 2,
      prompt: tokens([1, 2]),
      sampling_params: { max_tokens: 8, temperature: 1, top_k: -1, top_p: 1 },
      model_path: "tinker://m/sampler_weights/step-1",
      topk_prompt_logprobs: 0,
      type: "sample"
    },
    {
      num_samples: 1,
      prompt: tokens([1]),
      sampling_params: { temperature: 1, top_k: -1, top_p: 1 },
      base_model: "tiny",
      prompt_logprobs: true,
      topk_prompt_logprobs: 2,
      type: "sample"
    }
  ]],
  ["SampleResponse", T.SampleResponse, [
    { sequences: [{ stop_reason: "length", tokens: [4, 5], logprobs: [-0.5, -1.25] }], type: "sample" },
    {
      sequences: [{ stop_reason: "stop", tokens: [] }],
      type: "sample",
      prompt_logprobs: [null, -2],
      topk_prompt_logprobs: [null, [[3, -0.5], [9, -1.5]]]
    }
  ]],
  ["CreateSamplingSessionRequest", T.CreateSamplingSessionRequest, [
    { session_id: "s", sampling_session_seq_id: 0, base_model: "tiny", type: "create_sampling_session" }
  ]],
  ["CreateSamplingSessionResponse", T.CreateSamplingSessionResponse, [
    { type: "create_sampling_session", sampling_session_id: "ss" }
  ]],
  ["CreateSessionRequest", T.CreateSessionRequest, [
    { tags: [], sdk_version: "0.25.0", type: "create_session" },
    { tags: ["a"], user_metadata: { k: 1 }, sdk_version: "0.25.0", project_id: "p", type: "create_session" }
  ]],
  ["CreateSessionResponse", T.CreateSessionResponse, [
    { type: "create_session", session_id: "s" },
    { type: "create_session", warning_message: "old SDK", session_id: "s" }
  ]],
  ["SessionHeartbeatRequest", T.SessionHeartbeatRequest, [{ session_id: "s", type: "session_heartbeat" }]],
  ["SessionHeartbeatResponse", T.SessionHeartbeatResponse, [{ type: "session_heartbeat" }]],
  ["LoraConfig", T.LoraConfig, [
    { rank: 8, train_unembed: true, train_mlp: true, train_attn: true },
    { rank: 32, seed: 1, train_unembed: false, train_mlp: true, train_attn: false }
  ]],
  ["CreateModelRequest", T.CreateModelRequest, [
    {
      session_id: "s",
      model_seq_id: 0,
      base_model: "tiny",
      lora_config: { rank: 4, train_unembed: true, train_mlp: true, train_attn: true },
      type: "create_model"
    },
    { session_id: "s", model_seq_id: 1, base_model: "Qwen/Qwen3-8B", user_metadata: {}, type: "create_model" }
  ]],
  ["CreateModelResponse", T.CreateModelResponse, [{ model_id: "m", type: "create_model" }]],
  ["GetInfoRequest", T.GetInfoRequest, [{ model_id: "m", type: "get_info" }]],
  ["GetInfoResponse", T.GetInfoResponse, [
    { model_data: {}, model_id: "m" },
    {
      type: "get_info",
      model_data: { arch: "qwen2", model_name: "tiny", tokenizer_id: "byte" },
      model_id: "m",
      is_lora: true,
      lora_rank: 4,
      model_name: "tiny"
    }
  ]],
  ["UntypedAPIFuture", T.UntypedAPIFuture, [{ request_id: "r1" }, { request_id: "r1", model_id: "m" }]],
  ["FutureRetrieveRequest", T.FutureRetrieveRequest, [
    { request_id: "r1", allow_metadata_only: false },
    { request_id: "r1", allow_metadata_only: true }
  ]],
  ["TryAgainResponse", T.TryAgainResponse, [
    { type: "try_again", request_id: "r1", queue_state: "active" },
    { type: "try_again", request_id: "r1", queue_state: "paused_rate_limit", queue_state_reason: "quota" }
  ]],
  ["RequestFailedResponse", T.RequestFailedResponse, [
    { error: "bad input", category: "user" },
    { error: "oom", category: "server" },
    { error: "?", category: "unknown" }
  ]],
  ["HealthResponse", T.HealthResponse, [{ status: "ok" }]],
  ["ClientConfigRequest", T.ClientConfigRequest, [{ sdk_version: "0.24.0" }]],
  ["GetServerCapabilitiesResponse", T.GetServerCapabilitiesResponse, [
    { supported_models: [] },
    { supported_models: [{ model_name: "tiny", max_context_length: 256 }, {}] }
  ]],
  ["UnloadModelRequest", T.UnloadModelRequest, [{ model_id: "m", type: "unload_model" }]],
  ["UnloadModelResponse", T.UnloadModelResponse, [{ model_id: "m" }]]
]

/** Bodies a sender may shorten (defaults left out, `None` written as null) and what they decode to, dumped. */
const shortened: ReadonlyArray<readonly [string, Schema.Codec<any, any>, unknown, unknown]> = [
  ["AdamParams: every default", T.AdamParams, {}, adamDefaults],
  [
    "OptimStepRequest: type and adam_params' defaults",
    T.OptimStepRequest,
    { adam_params: { learning_rate: 0.01 }, model_id: "m", seq_id: null },
    { adam_params: { ...adamDefaults, learning_rate: 0.01 }, model_id: "m", type: "optim_step" }
  ],
  [
    "SampleRequest: num_samples 1, topk 0, sampling defaults, chunk type",
    T.SampleRequest,
    { prompt: { chunks: [{ tokens: [1] }] }, sampling_params: { max_tokens: null }, model_path: null },
    {
      num_samples: 1,
      prompt: tokens([1]),
      sampling_params: { temperature: 1, top_k: -1, top_p: 1 },
      topk_prompt_logprobs: 0,
      type: "sample"
    }
  ],
  [
    "LoraConfig: every layer trained",
    T.LoraConfig,
    { rank: 2, seed: null },
    { rank: 2, train_unembed: true, train_mlp: true, train_attn: true }
  ],
  [
    "CreateSessionResponse as FastAPI writes it (nulls)",
    T.CreateSessionResponse,
    { type: "create_session", info_message: null, warning_message: null, error_message: null, session_id: "s" },
    { type: "create_session", session_id: "s" }
  ],
  [
    "ForwardBackwardOutput: metrics {}",
    T.ForwardBackwardOutput,
    { loss_fn_output_type: "x", loss_fn_outputs: [] },
    { loss_fn_output_type: "x", loss_fn_outputs: [], metrics: {} }
  ],
  [
    "ClientConfigResponse: every flag's default, unknown flags ignored",
    T.ClientConfigResponse,
    { pjwt_auth_enabled: true, some_future_flag: 1 },
    {
      pjwt_auth_enabled: true,
      credential_default_source: "api_key",
      sample_dispatch_bytes_semaphore_size: 10485760,
      inflight_response_bytes_semaphore_size: 52428800,
      parallel_fwdbwd_chunks: true,
      proto_write_fwdbwd: false,
      proto_compress_fwdbwd: false,
      fwd_via_fwdbwd: false,
      fwdbwd_max_chunk_len: 1024,
      fwdbwd_max_chunk_bytes_count: 5000000,
      fwdbwd_dispatch_bytes_semaphore_size: 50000000,
      billing_exception_max_pause_duration_sec: 3600,
      sample_no_retries: false,
      sample_enable_stuck_detection: true,
      sample_max_concurrent_requests: 2000,
      use_pyqwest_transport: true,
      create_model_via_load_weights: false
    }
  ],
  [
    "FutureRetrieveRequest: allow_metadata_only false",
    T.FutureRetrieveRequest,
    { request_id: "r" },
    { request_id: "r", allow_metadata_only: false }
  ]
]

/** Bodies the SDK's pydantic models refuse. */
const refused: ReadonlyArray<readonly [string, Schema.Codec<any, any>, unknown]> = [
  ["an unknown loss", T.ForwardBackwardInput, { data: [], loss_fn: "dpo" }],
  ["a tensor dtype outside int64/float32", T.TensorData, { data: [1], dtype: "float16" }],
  ["a fractional token id", T.EncodedTextChunk, { tokens: [1.5] }],
  ["a chunk of unknown type", T.ModelInput, { chunks: [{ tokens: [1], type: "audio" }] }],
  ["a request without model_id", T.OptimStepRequest, { adam_params: {} }],
  ["a load without optimizer", T.LoadWeightsRequest, { path: "tinker://m/weights/x" }],
  ["an unknown error category", T.RequestFailedResponse, { error: "x", category: "client" }],
  ["an unknown queue state", T.TryAgainResponse, { request_id: "r", queue_state: "waiting" }],
  ["a stop list of mixed types", T.SamplingParams, { stop: ["a", 1] }],
  ["a health status other than ok", T.HealthResponse, { status: "degraded" }]
]

describe("Tinker Schemas (SDK 0.25.0, d595dc2)", () => {
  for (const [name, schema, bodies] of dumped) {
    it(`${name}: model_dump bodies decode and encode back to themselves`, () => {
      for (const body of bodies) {
        const decoded = Schema.decodeUnknownSync(schema)(body)
        assert.deepStrictEqual(Schema.encodeSync(schema)(decoded), body)
      }
    })
  }

  for (const [name, schema, body, dumpedBody] of shortened) {
    it(`defaults and nulls: ${name}`, () => {
      assert.deepStrictEqual(Schema.encodeSync(schema)(Schema.decodeUnknownSync(schema)(body)), dumpedBody)
    })
  }

  for (const [name, schema, body] of refused) {
    it(`refused: ${name}`, () => {
      assert.throws(() => Schema.decodeUnknownSync(schema)(body))
    })
  }

  it("a future's answer decodes by the result the request makes, pending and failed alike", () => {
    const saved = T.futureResult(T.SaveWeightsResponse)
    const decode = Schema.decodeUnknownSync(saved)
    assert.deepStrictEqual(decode({ type: "try_again", request_id: "r", queue_state: "active" }), {
      type: "try_again",
      request_id: "r",
      queue_state: "active"
    })
    assert.deepStrictEqual(decode({ error: "x", category: "user" }), { error: "x", category: "user" })
    assert.deepStrictEqual(decode({ path: "tinker://m/weights/a" }), { path: "tinker://m/weights/a" })
    assert.throws(() => decode({ sequences: [] }))
  })

  it("the SDK's routes and headers", () => {
    assert.strictEqual(T.routes.forward_backward.path, "/api/v1/forward_backward")
    assert.strictEqual(T.routes.healthz.method, "GET")
    assert.strictEqual(T.headers.apiKey, "X-API-Key")
    assert.strictEqual(T.headers.idempotencyKey, "X-Idempotency-Key")
    assert.deepStrictEqual(T.sdk, { name: "tinker", version: "0.25.0", commit: "d595dc2" })
  })
})
