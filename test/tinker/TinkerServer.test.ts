/**
 * The Tinker API served over the local learner (`actors/tinker/TinkerServer.ts`), through `fetch` on loopback:
 * every body the server receives and sends decodes with the Schemas (the contract), the learner's numbers are an
 * in-process learner's to the bit, a lost answer retried with its idempotency key runs nothing twice, a server killed
 * mid-future and started again on its state directory completes the future once, and bad requests get the API's
 * errors.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, FileSystem, Schema, Scope } from "effect"
import * as FutureLog from "../../actors/tinker/FutureLog.ts"
import * as TinkerServer from "../../actors/tinker/TinkerServer.ts"
import * as T from "../../src/tinker/Types.ts"
import {
  adam,
  base,
  client,
  createModel,
  fbRequest,
  forwardLogprobs,
  inProcess,
  optimRequest,
  postFb,
  recorder,
  sftData
} from "./utils.ts"

const serve = (options: Partial<TinkerServer.Options> = {}) =>
  Effect.gen(function*() {
    const contract = recorder()
    const server = yield* TinkerServer.serve({ bases: [base], pollMillis: 200, onBody: contract.onBody, ...options })
    return { ...server, contract }
  })

const step = (c: ReturnType<typeof client>, model: string, seq: number) =>
  Effect.gen(function*() {
    const fb = yield* postFb(c, fbRequest(model, sftData(), seq))
    const out = yield* c.done(fb, T.ForwardBackwardOutput)
    const opt = yield* c.post("optim_step", T.OptimStepRequest, optimRequest(model, seq + 1), T.UntypedAPIFuture)
    return { out, optim: yield* c.done(opt, T.OptimStepResponse) }
  })

describe("TinkerServer", () => {
  it.live("session, model, forward_backward + optim_step, forward: an in-process learner's numbers to the bit", () =>
    Effect.gen(function*() {
      const { baseUrl, contract } = yield* serve()
      const c = client(baseUrl)
      const health = yield* c.raw("GET", "healthz")
      assert.deepStrictEqual(health.body, { status: "ok" })
      const sdk = { sdk_version: "0.24.0" }
      const flags = yield* c.post("client_config", T.ClientConfigRequest, sdk, T.ClientConfigResponse)
      assert.strictEqual(flags.proto_write_fwdbwd, false)
      assert.strictEqual(flags.pjwt_auth_enabled, false)
      const caps = yield* c.raw("GET", "get_server_capabilities")
      assert.deepStrictEqual(caps.body, { supported_models: [{ model_name: "tiny-test", max_context_length: 512 }] })
      const { model, session } = yield* createModel(c)
      const heartbeat = yield* c.raw("POST", "session_heartbeat", { session_id: session, type: "session_heartbeat" })
      assert.strictEqual(heartbeat.status, 200)
      const info = yield* c.post("get_info", T.GetInfoRequest, { model_id: model, type: "get_info" }, T.GetInfoResponse)
      assert.strictEqual(info.is_lora, false)
      assert.strictEqual(info.model_name, "tiny-test")
      const first = yield* step(c, model, 1)
      assert.strictEqual(first.out.loss_fn_outputs.length, 3)
      assert.strictEqual(first.out.loss_fn_outputs[1]!["logprobs"]!.data.length, 9)
      assert.isTrue(first.out.metrics["loss:sum"]! > 0)
      assert.strictEqual(first.optim.metrics?.["step"], 1)
      assert.strictEqual(first.optim.metrics?.["learning_rate"], adam.learning_rate)
      yield* step(c, model, 3)
      const expected = yield* inProcess([sftData()], 2)
      assert.deepStrictEqual(yield* forwardLogprobs(c, model, sftData()), expected.logprobs)
      assert.deepStrictEqual(contract.violations, [])
      assert.isTrue(contract.seen.includes("response retrieve_future 200"))
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("with 2 learner threads (--workers 2), an in-process learner's numbers with 2 threads, to the bit", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* serve({ workers: 2 })
      const c = client(baseUrl)
      const { model } = yield* createModel(c)
      const data = Array.from({ length: 10 }, (_, shift) => sftData(shift * 5)).flat()
      const fb = yield* postFb(c, fbRequest(model, data, 1))
      yield* c.done(fb, T.ForwardBackwardOutput)
      const opt = yield* c.post("optim_step", T.OptimStepRequest, optimRequest(model, 2), T.UntypedAPIFuture)
      assert.strictEqual((yield* c.done(opt, T.OptimStepResponse)).metrics?.["step"], 1)
      // (On this small model one and two threads happen to agree too: the test shows the threads run, not that they
      // change the numbers.)
      const twoThreads = yield* inProcess([data], 1, base, sftData(), 2)
      assert.deepStrictEqual(yield* forwardLogprobs(c, model, sftData()), twoThreads.logprobs)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("save_weights_for_sampler then asample: token ids and logprobs from the published weights", () =>
    Effect.gen(function*() {
      const { baseUrl, contract } = yield* serve()
      const c = client(baseUrl)
      const { model } = yield* createModel(c, 4)
      const info = yield* c.post("get_info", T.GetInfoRequest, { model_id: model, type: "get_info" }, T.GetInfoResponse)
      assert.strictEqual(info.lora_rank, 4)
      yield* step(c, model, 1)
      const saved = yield* c.post("save_weights_for_sampler", T.SaveWeightsForSamplerRequest, {
        model_id: model,
        path: "v1",
        type: "save_weights_for_sampler"
      }, T.UntypedAPIFuture)
      const { path } = yield* c.done(saved, T.SaveWeightsForSamplerResponse)
      assert.strictEqual(path, `tinker://${model}/sampler_weights/v1`)
      const sampleOf = (model_path: string) =>
        c.post("asample", T.SampleRequest, {
          num_samples: 2,
          prompt: { chunks: [{ tokens: [1, 2, 3], type: "encoded_text" }] },
          sampling_params: { max_tokens: 5, seed: 7, temperature: 1, top_k: -1, top_p: 1 },
          model_path,
          topk_prompt_logprobs: 0,
          type: "sample"
        }, T.UntypedAPIFuture)
      const sampled = yield* c.done(yield* sampleOf(path), T.SampleResponse)
      assert.strictEqual(sampled.sequences.length, 2)
      for (const s of sampled.sequences) {
        assert.strictEqual(s.tokens.length, 5)
        assert.strictEqual(s.logprobs?.length, 5)
        assert.isTrue(s.logprobs!.every((lp) => lp <= 0))
        assert.strictEqual(s.stop_reason, "length")
      }
      const unknown = yield* c.result(yield* sampleOf(`tinker://${model}/sampler_weights/v9`), T.SampleResponse)
      assert.deepInclude(unknown, { category: "user" })
      // The base model's own weights, through a sampling session.
      const { session } = yield* createModel(c)
      const sampling = yield* c.post("create_sampling_session", T.CreateSamplingSessionRequest, {
        session_id: session,
        sampling_session_seq_id: 0,
        base_model: "tiny-test",
        type: "create_sampling_session"
      }, T.CreateSamplingSessionResponse)
      const fromBase = yield* c.done(
        yield* c.post("asample", T.SampleRequest, {
          num_samples: 1,
          prompt: { chunks: [{ tokens: [1, 2, 3], type: "encoded_text" }] },
          sampling_params: { max_tokens: 4, seed: 7, temperature: 0, top_k: -1, top_p: 1 },
          sampling_session_id: sampling.sampling_session_id,
          topk_prompt_logprobs: 0,
          type: "sample"
        }, T.UntypedAPIFuture),
        T.SampleResponse
      )
      assert.strictEqual(fromBase.sequences[0]!.tokens.length, 4)
      assert.deepStrictEqual(contract.violations, [])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("a lost answer retried with its idempotency key gets the same future: forward_backward runs once", () =>
    Effect.gen(function*() {
      const drops = { forward_backward: 1, optim_step: 1 }
      const { baseUrl, contract } = yield* serve({
        dropAnswer: (route) => (route in drops && drops[route as keyof typeof drops]-- > 0)
      })
      const c = client(baseUrl)
      const { model } = yield* createModel(c)
      // The answer is lost: the client's connection breaks after the server accepted (and ran) the call.
      const lost = yield* Effect.exit(c.raw("POST", "forward_backward", fbRequest(model, sftData()), {
        [T.headers.idempotencyKey]: "fb-1"
      }))
      assert.isTrue(Exit.isFailure(lost))
      const fb = yield* postFb(c, fbRequest(model, sftData()), "fb-1")
      assert.strictEqual(fb.request_id, "2")
      yield* c.done(fb, T.ForwardBackwardOutput)
      assert.isTrue(Exit.isFailure(yield* Effect.exit(c.raw("POST", "optim_step", optimRequest(model), {
        [T.headers.idempotencyKey]: "opt-1"
      }))))
      const opt = yield* c.post("optim_step", T.OptimStepRequest, optimRequest(model), T.UntypedAPIFuture, "opt-1")
      const stepped = yield* c.done(opt, T.OptimStepResponse)
      assert.strictEqual(stepped.metrics?.["step"], 1)
      // Gradients accumulate: a forward/backward run twice would double them, and every weight would differ.
      const expected = yield* inProcess([sftData()], 1)
      assert.deepStrictEqual(yield* forwardLogprobs(c, model, sftData()), expected.logprobs)
      assert.deepStrictEqual(contract.violations, [])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("save_weights, then load_weights: the saved weights back, with AdamW's moments or without", () =>
    Effect.gen(function*() {
      const { baseUrl, contract } = yield* serve()
      const c = client(baseUrl)
      const { model } = yield* createModel(c)
      yield* step(c, model, 1)
      const saved = yield* c.post("save_weights", T.SaveWeightsRequest, {
        model_id: model,
        path: "after-1",
        overwrite: false,
        type: "save_weights"
      }, T.UntypedAPIFuture)
      const { path } = yield* c.done(saved, T.SaveWeightsResponse)
      assert.strictEqual(path, `tinker://${model}/weights/after-1`)
      const atSave = yield* forwardLogprobs(c, model, sftData())
      yield* step(c, model, 3)
      assert.notDeepEqual(yield* forwardLogprobs(c, model, sftData()), atSave)
      const load = (optimizer: boolean) =>
        Effect.flatMap(
          c.post("load_weights", T.LoadWeightsRequest, {
            model_id: model,
            path,
            optimizer,
            type: "load_weights"
          }, T.UntypedAPIFuture),
          (f) => c.done(f, T.LoadWeightsResponse)
        )
      yield* load(true)
      assert.deepStrictEqual(yield* forwardLogprobs(c, model, sftData()), atSave)
      // With the moments, the next step is the in-process learner's second step.
      yield* step(c, model, 10)
      assert.deepStrictEqual(yield* forwardLogprobs(c, model, sftData()), (yield* inProcess([sftData()], 2)).logprobs)
      yield* load(false)
      assert.deepStrictEqual(yield* forwardLogprobs(c, model, sftData()), atSave)
      const twice = yield* c.post("save_weights", T.SaveWeightsRequest, {
        model_id: model,
        path: "after-1",
        overwrite: false,
        type: "save_weights"
      }, T.UntypedAPIFuture)
      assert.deepInclude(yield* c.result(twice, T.SaveWeightsResponse), { category: "user" })
      assert.deepStrictEqual(contract.violations, [])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("losses: one per optimiser step; another loss in the next step moves the learner's state over", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* serve()
      const c = client(baseUrl)
      const { model } = yield* createModel(c)
      yield* step(c, model, 1)
      const rl = (data: Array<T.Datum>): T.ForwardBackwardRequest => ({
        forward_backward_input: {
          data: data.map((d) => ({
            ...d,
            loss_fn_inputs: {
              ...d.loss_fn_inputs,
              logprobs: { data: d.loss_fn_inputs["weights"]!.data.map(() => -4), dtype: "float32" },
              advantages: { data: d.loss_fn_inputs["weights"]!.data.map(() => 0.5), dtype: "float32" }
            }
          })),
          loss_fn: "ppo"
        },
        model_id: model
      })
      const ppo = yield* c.done(yield* postFb(c, rl(sftData())), T.ForwardBackwardOutput)
      // The batch's ratios exp(log π + 4) lie far above 1.2: PPO clips them.
      assert.isTrue(ppo.metrics["clipped:sum"]! > 0)
      const mixed = yield* c.result(yield* postFb(c, fbRequest(model, sftData())), T.ForwardBackwardOutput)
      assert.deepInclude(mixed, { category: "user" })
      const optim = () =>
        Effect.flatMap(
          c.post("optim_step", T.OptimStepRequest, optimRequest(model), T.UntypedAPIFuture),
          (f) => c.done(f, T.OptimStepResponse)
        )
      const stepped = yield* optim()
      assert.strictEqual(stepped.metrics?.["step"], 2)
      // Back to cross-entropy in the next step: AdamW's state moved with the weights (step 3 follows step 2).
      yield* c.done(yield* postFb(c, fbRequest(model, sftData())), T.ForwardBackwardOutput)
      const third = yield* optim()
      assert.strictEqual(third.metrics?.["step"], 3)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("a seq_id sent again with the same body is the same future; with another body, 409", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* serve()
      const c = client(baseUrl)
      const { model } = yield* createModel(c)
      const a = yield* postFb(c, fbRequest(model, sftData(), 1))
      const b = yield* postFb(c, fbRequest(model, sftData(), 1))
      assert.strictEqual(b.request_id, a.request_id)
      const other = yield* c.raw("POST", "forward_backward", Schema.encodeSync(T.ForwardBackwardRequest)(
        fbRequest(model, sftData(5), 1)
      ))
      assert.strictEqual(other.status, 409)
      assert.deepStrictEqual(Object.keys(other.body as object), ["detail"])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("killed mid-future and started again on its state directory, the server completes the future once", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const stateDir = yield* fs.makeTempDirectoryScoped({ prefix: "tinker-restart-" })
      const first = yield* Scope.make()
      const held = yield* Deferred.make<void>()
      const before = yield* serve({
        stateDir,
        // The optimiser step never starts on the first server: it is pending when the server dies.
        beforeRun: (route) =>
          route === "optim_step" ? Deferred.succeed(held, undefined).pipe(Effect.andThen(Effect.never)) : Effect.void
      }).pipe(Scope.provide(first))
      const c1 = client(before.baseUrl)
      const { model } = yield* createModel(c1)
      const fb = yield* postFb(c1, fbRequest(model, sftData(), 1))
      yield* c1.done(fb, T.ForwardBackwardOutput)
      const opt = yield* c1.post("optim_step", T.OptimStepRequest, optimRequest(model, 2), T.UntypedAPIFuture)
      yield* Deferred.await(held)
      const retrieve = { request_id: opt.request_id }
      const answer = T.futureResult(T.OptimStepResponse)
      const pending = yield* c1.post("retrieve_future", T.FutureRetrieveRequest, retrieve, answer)
      assert.deepInclude(pending, { type: "try_again" })
      yield* Scope.close(first, Exit.void)

      const after = yield* serve({ stateDir })
      const c2 = client(after.baseUrl)
      const stepped = yield* c2.done(opt, T.OptimStepResponse)
      assert.strictEqual(stepped.metrics?.["step"], 1)
      // The retry of the step (same seq_id) is the same future, not a second step.
      const again = yield* c2.post("optim_step", T.OptimStepRequest, optimRequest(model, 2), T.UntypedAPIFuture)
      assert.strictEqual(again.request_id, opt.request_id)
      const expected = yield* inProcess([sftData()], 1)
      assert.deepStrictEqual(yield* forwardLogprobs(c2, model, sftData()), expected.logprobs)
      // One outcome for the step in the log, written by the second server.
      const log = yield* FutureLog.read(`${stateDir}/requests.jsonl`)
      assert.strictEqual(log.filter((e) => e.t === "outcome" && e.id === opt.request_id).length, 1)
      assert.deepStrictEqual(after.contract.violations, [])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("a restart restores the last snapshot and replays only the calls after it", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const stateDir = yield* fs.makeTempDirectoryScoped({ prefix: "tinker-snapshot-" })
      const first = yield* Scope.make()
      const before = yield* serve({ stateDir, snapshotEvery: 2 }).pipe(Scope.provide(first))
      const c1 = client(before.baseUrl)
      const { model } = yield* createModel(c1)
      const publish = (c: ReturnType<typeof client>, name: string) =>
        Effect.flatMap(
          c.post("save_weights_for_sampler", T.SaveWeightsForSamplerRequest, {
            model_id: model,
            path: name,
            type: "save_weights_for_sampler"
          }, T.UntypedAPIFuture),
          (f) => c.done(f, T.SaveWeightsForSamplerResponse)
        )
      yield* step(c1, model, 1)
      yield* publish(c1, "v1")
      yield* step(c1, model, 3)
      const { path } = yield* publish(c1, "v2") // the second publication: a snapshot
      yield* step(c1, model, 5)
      yield* Scope.close(first, Exit.void)
      const log = yield* FutureLog.read(`${stateDir}/requests.jsonl`)
      assert.strictEqual(log.filter((e) => e.t === "snapshot").length, 1)

      const ran: Array<string> = []
      const beforeRun = (route: string) => Effect.sync(() => void ran.push(route))
      const after = yield* serve({ stateDir, snapshotEvery: 2, beforeRun })
      const c2 = client(after.baseUrl)
      // The weights are three steps' (two restored, one replayed): an in-process learner's to the bit.
      assert.deepStrictEqual(yield* forwardLogprobs(c2, model, sftData()), (yield* inProcess([sftData()], 3)).logprobs)
      assert.deepStrictEqual(ran.filter((r) => r !== "forward"), [
        "create_model",
        "restore_snapshot",
        "forward_backward",
        "optim_step"
      ])
      // The restored engine samples the snapshot's sampler weights.
      const sampled = yield* c2.done(
        yield* c2.post("asample", T.SampleRequest, {
          num_samples: 1,
          prompt: { chunks: [{ tokens: [1, 2], type: "encoded_text" }] },
          sampling_params: { max_tokens: 3, seed: 1, temperature: 1, top_k: -1, top_p: 1 },
          model_path: path,
          topk_prompt_logprobs: 0,
          type: "sample"
        }, T.UntypedAPIFuture),
        T.SampleResponse
      )
      assert.strictEqual(sampled.sequences[0]!.tokens.length, 3)
      assert.deepStrictEqual(after.contract.violations, [])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("refusals: 401 without the key, 400 unknown base model, 404, 415 protobuf, 422, a failed future, 429", () =>
    Effect.gen(function*() {
      const { baseUrl, contract } = yield* serve({ apiKeys: ["secret"], quota: 3 })
      const stranger = client(baseUrl, "wrong")
      const denied = yield* stranger.raw("POST", "create_session", { tags: [], sdk_version: "x" })
      assert.strictEqual(denied.status, 401)
      assert.deepStrictEqual(Object.keys(denied.body as object), ["detail"])
      const c = client(baseUrl, "secret")
      const { session, model } = yield* createModel(c)
      const unknown = yield* c.raw("POST", "create_model", {
        session_id: session,
        model_seq_id: 1,
        base_model: "Qwen/Qwen3-8B",
        type: "create_model"
      })
      assert.strictEqual(unknown.status, 400)
      assert.include((unknown.body as { detail: string }).detail, "tiny-test")
      assert.strictEqual((yield* c.raw("POST", "retrieve_future", { request_id: "999" })).status, 404)
      assert.strictEqual((yield* c.raw("POST", "get_info", { model_id: "nope" })).status, 404)
      const proto = yield* c.raw("POST", "forward_backward", {}, { "content-type": "application/x-protobuf" })
      assert.strictEqual(proto.status, 415)
      contract.malformed.add(JSON.stringify({ model_id: model }))
      assert.strictEqual((yield* c.raw("POST", "optim_step", { model_id: model })).status, 422)
      // A failed future: a loss this learner has no counterpart for, refused as the user's fault.
      const dro = yield* c.post("forward_backward", T.ForwardBackwardRequest, {
        forward_backward_input: { data: sftData(), loss_fn: "dro" },
        model_id: model
      }, T.UntypedAPIFuture)
      assert.deepInclude(yield* c.result(dro, T.ForwardBackwardOutput), { category: "user" })
      const next = () => c.raw("POST", "optim_step", Schema.encodeSync(T.OptimStepRequest)(optimRequest(model)))
      assert.strictEqual((yield* next()).status, 200)
      const over = yield* next()
      assert.strictEqual(over.status, 429)
      assert.strictEqual(over.headers.get("retry-after"), "1")
      assert.deepStrictEqual(contract.violations, [])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)
})
