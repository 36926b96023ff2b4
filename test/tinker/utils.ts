/**
 * Fixtures of the Tinker server tests: a small base model, a plain `fetch` client that encodes every request and
 * decodes every answer with the Schemas, a contract recorder that decodes every body the server received and sent,
 * and the in-process learner the server's numbers are compared with.
 */
import { Effect, Schema } from "effect"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import type * as Loss from "../../src/Loss.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import type * as Packing from "../../src/Packing.ts"
import * as Datums from "../../src/tinker/Datums.ts"
import * as T from "../../src/tinker/Types.ts"
import type * as Models from "../../actors/tinker/Models.ts"
import { randomWeights, tinyConfig } from "../utils/tinyModel.ts"

export const config = tinyConfig({ vocabSize: 61, hiddenSize: 32, numHiddenLayers: 2, intermediateSize: 48 })
export const base: Models.Base = { name: "tiny-test", config, weights: randomWeights(config, 3) }

// ===== Contract =====

type Codec = Schema.Codec<any, any, never, never>

/** Each route's request Schema and the Schema of a 200 answer to it. */
const contract: Record<string, readonly [Codec | undefined, Codec]> = {
  healthz: [undefined, T.HealthResponse],
  client_config: [T.ClientConfigRequest, T.ClientConfigResponse],
  get_server_capabilities: [undefined, T.GetServerCapabilitiesResponse],
  create_session: [T.CreateSessionRequest, T.CreateSessionResponse],
  session_heartbeat: [T.SessionHeartbeatRequest, T.SessionHeartbeatResponse],
  create_sampling_session: [T.CreateSamplingSessionRequest, T.CreateSamplingSessionResponse],
  get_info: [T.GetInfoRequest, T.GetInfoResponse],
  create_model: [T.CreateModelRequest, T.UntypedAPIFuture],
  forward: [T.ForwardRequest, T.UntypedAPIFuture],
  forward_backward: [T.ForwardBackwardRequest, T.UntypedAPIFuture],
  optim_step: [T.OptimStepRequest, T.UntypedAPIFuture],
  save_weights: [T.SaveWeightsRequest, T.UntypedAPIFuture],
  load_weights: [T.LoadWeightsRequest, T.UntypedAPIFuture],
  save_weights_for_sampler: [T.SaveWeightsForSamplerRequest, T.UntypedAPIFuture],
  asample: [T.SampleRequest, T.UntypedAPIFuture],
  unload_model: [T.UnloadModelRequest, T.UntypedAPIFuture],
  retrieve_future: [T.FutureRetrieveRequest, T.FutureRetrieveResponse]
}

/**
 * Records every body the server saw and sent, decoding each with the route's Schema (an error body with
 * `ErrorBody`); `violations` lists what did not decode. A request the test sends malformed on purpose is named in
 * `malformed`.
 */
export const recorder = () => {
  const violations: Array<string> = []
  const seen: Array<string> = []
  const onBody = (route: string, direction: "request" | "response", status: number, body: unknown) => {
    seen.push(`${direction} ${route} ${status}`)
    const pair = contract[route]
    if (pair === undefined) return
    const schema = direction === "request" ? pair[0] : status === 200 ? pair[1] : T.ErrorBody
    if (schema === undefined || (direction === "request" && malformed.has(JSON.stringify(body)))) return
    const decoded = Schema.decodeUnknownExit(schema)(body)
    if (decoded._tag === "Failure") violations.push(`${direction} ${route} ${status}: ${JSON.stringify(body)}`)
  }
  const malformed = new Set<string>()
  return { onBody, violations, seen, malformed }
}

// ===== Client =====

/** What an HTTP call answered. */
export interface Answer {
  readonly status: number
  readonly body: unknown
  readonly headers: Headers
}

/** A client of `baseUrl` with `apiKey`; requests are encoded, 200 answers decoded with the route's Schemas. */
export const client = (baseUrl: string, apiKey?: string) => {
  const raw = (method: string, route: string, body?: unknown, headers: Record<string, string> = {}) =>
    Effect.promise(async (): Promise<Answer> => {
      const path = (T.routes as Record<string, { readonly path: string }>)[route]?.path ?? `/api/v1/${route}`
      const res = await fetch(`${baseUrl}${path}`, {
        method,
        headers: {
          "content-type": "application/json",
          ...(apiKey === undefined ? {} : { [T.headers.apiKey]: apiKey }),
          ...headers
        },
        ...(body === undefined ? {} : { body: JSON.stringify(body) })
      })
      const text = await res.text()
      return { status: res.status, body: text === "" ? undefined : JSON.parse(text), headers: res.headers }
    })
  const post = <A>(
    route: T.Route,
    request: Codec,
    value: unknown,
    response: Schema.Codec<A, any, never, never>,
    key?: string
  ) =>
    Effect.gen(function*() {
      const answer = yield* raw("POST", route, Schema.encodeSync(request)(value), key === undefined ? {} : {
        [T.headers.idempotencyKey]: key
      })
      if (answer.status !== 200) {
        return yield* Effect.die(new Error(`${route}: ${answer.status} ${JSON.stringify(answer.body)}`))
      }
      return Schema.decodeUnknownSync(response)(answer.body)
    })
  /** Polls a future until it is done: its result decoded with `result`, or the failure. */
  const result = <A>(future: T.UntypedAPIFuture, schema: Schema.Codec<A, any, never, never>) =>
    Effect.gen(function*() {
      const union = T.futureResult(schema)
      for (;;) {
        const answer = yield* post("retrieve_future", T.FutureRetrieveRequest, { request_id: future.request_id }, union)
        if ((answer as { type?: string }).type === "try_again") continue
        return answer as A | T.RequestFailedResponse
      }
    })
  const done = <A>(future: T.UntypedAPIFuture, schema: Schema.Codec<A, any, never, never>) =>
    Effect.flatMap(result(future, schema), (r) =>
      typeof r === "object" && r !== null && "category" in r && "error" in r ?
        Effect.die(new Error(`future ${future.request_id} failed: ${JSON.stringify(r)}`)) :
        Effect.succeed(r as A))
  return { raw, post, result, done }
}
export type Client = ReturnType<typeof client>

/** Posts a forward_backward (with an idempotency key when given): its future. */
export const postFb = (c: Client, request: T.ForwardBackwardRequest, key?: string) =>
  c.post("forward_backward", T.ForwardBackwardRequest, request, T.UntypedAPIFuture, key)

/** A session and a model on `base` (LoRA of `rank` when given): the model id. */
export const createModel = (c: Client, rank?: number, baseName = base.name) =>
  Effect.gen(function*() {
    const session = yield* c.post("create_session", T.CreateSessionRequest, {
      tags: [],
      sdk_version: "0.25.0",
      type: "create_session"
    }, T.CreateSessionResponse)
    const future = yield* c.post("create_model", T.CreateModelRequest, {
      session_id: session.session_id,
      model_seq_id: 0,
      base_model: baseName,
      ...(rank === undefined ? {} : {
        lora_config: { rank, seed: 1, train_unembed: true, train_mlp: true, train_attn: true }
      }),
      type: "create_model"
    }, T.UntypedAPIFuture)
    const created = yield* c.done(future, T.CreateModelResponse)
    return { model: created.model_id, session: session.session_id }
  })

// ===== Batches =====

const text = (tokens: ReadonlyArray<number>): T.ModelInput => ({ chunks: [{ tokens, type: "encoded_text" }] })

/** Three SFT datums (targets: the next token), weights off on the first two positions. */
export const sftData = (shift = 0): Array<T.Datum> =>
  [0, 1, 2].map((r) => {
    const ids = Array.from({ length: 7 + 3 * r }, (_, i) => (i * 7 + r * 11 + shift) % 61)
    return {
      model_input: text(ids.slice(0, -1)),
      loss_fn_inputs: {
        target_tokens: { data: ids.slice(1), dtype: "int64", shape: [ids.length - 1] },
        weights: { data: ids.slice(1).map((_, i) => (i < 2 ? 0 : 1)), dtype: "float32", shape: [ids.length - 1] }
      }
    }
  })

export const adam: T.AdamParams = {
  learning_rate: 0.01,
  beta1: 0.9,
  beta2: 0.95,
  eps: 1e-12,
  weight_decay: 0,
  grad_clip_norm: 1
}

export const fbRequest = (model: string, data: Array<T.Datum>, seq?: number): T.ForwardBackwardRequest => ({
  forward_backward_input: { data, loss_fn: "cross_entropy" },
  model_id: model,
  ...(seq === undefined ? {} : { seq_id: seq })
})

export const optimRequest = (model: string, seq?: number): T.OptimStepRequest => ({
  adam_params: adam,
  model_id: model,
  ...(seq === undefined ? {} : { seq_id: seq }),
  type: "optim_step"
})

/** The targets' logprobs of `data` under the model's weights, as the server's `forward` answers them. */
export const forwardLogprobs = (c: Client, model: string, data: Array<T.Datum>) =>
  Effect.gen(function*() {
    const future = yield* c.post("forward", T.ForwardRequest, {
      forward_input: { data, loss_fn: "cross_entropy" },
      model_id: model
    }, T.UntypedAPIFuture)
    const out = yield* c.done(future, T.ForwardBackwardOutput)
    return out.loss_fn_outputs.map((o) => o["logprobs"]!.data)
  })

/** The same steps on an in-process learner: `steps` × (forward/backward of each batch, optimiser step). */
export const inProcess = (
  batches: ReadonlyArray<Array<T.Datum>>,
  steps: number,
  on: Models.Base = base,
  probeData: Array<T.Datum> = sftData(),
  workers = 1
) =>
  Effect.scoped(Effect.gen(function*() {
    const made = yield* OnnxTrainer.make({
      model: OnnxTrainer.qwen2(on.config),
      weights: on.weights,
      loss: Datums.lossConfig("cross_entropy") as Loss.Config,
      optimizer: { beta1: adam.beta1, beta2: adam.beta2, eps: adam.eps, weightDecay: 0, maxGradNorm: 1 },
      schedule: LrSchedule.constant(adam.learning_rate),
      workers,
      intraOpThreads: 1
    })
    const mbs = batches.map((b) => Datums.toMicroBatch(b, "cross_entropy") as Packing.MicroBatch)
    for (let s = 0; s < steps; s++) {
      for (const mb of mbs) yield* made.trainer.forwardBackward(mb)
      yield* made.trainer.optimStep
    }
    const probe = Datums.toMicroBatch(probeData, "cross_entropy") as Packing.MicroBatch
    const lp = yield* made.trainer.logprobs(probe)
    const weights = yield* made.trainer.weights
    return {
      logprobs: probeData.map((d, r) =>
        Array.from(lp.subarray(r * probe.length, r * probe.length + d.loss_fn_inputs["target_tokens"]!.data.length))
      ),
      fingerprint: Checkpoint.fingerprint(weights)
    }
  }))
