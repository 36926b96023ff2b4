/**
 * `npm run bench -- tinker`: a learner step in this process (`OnnxTrainer`) against the same step through the Tinker
 * API (`TinkerTrainer` → `TinkerClient` → our Tinker server, `actors/tinker/TinkerServer.ts`, on loopback in this
 * process): the forward/backward passes over one GRPO step's micro-batches (8 groups × 8 chains of the calculator
 * demo's shape; whole rows, as Tinker datums carry them), then the optimiser step. Tiny preset, 1 learner worker on
 * either side (the server's learner has one); rounds alternate.
 *
 * Headline: the client's cost a learner step ÷ the in-process step: the step's HTTP requests (each submit and each
 * poll of its future) at the round trip of a call that computes nothing, plus the coding of its micro-batches both
 * ways (`Datums.fromMicroBatch`, the Schemas' encoding, JSON, and back on the server; the outputs' logprobs back),
 * measured apart from the noisy steps. Target ≤ 0.1 (issue 43). Also: API ÷ local time a step as measured (the
 * server shares this process's cores), requests and polls a step.
 */
import { NodeServices } from "@effect/platform-node"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Effect, Layer, Schema } from "effect"
import { loadavg } from "node:os"
import * as TinkerServer from "../actors/tinker/TinkerServer.ts"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as TinkerClient from "../src/backends/TinkerClient.ts"
import * as TinkerTrainer from "../src/backends/TinkerTrainer.ts"
import type * as GradientBackend from "../src/GradientBackend.ts"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Optimizer from "../src/Optimizer.ts"
import * as Packing from "../src/Packing.ts"
import * as Datums from "../src/tinker/Datums.ts"
import * as Tinker from "../src/tinker/Types.ts"
import { median, sequences } from "./internal/demoBatch.ts"
import type { BenchResult } from "./run.ts"

const ROUNDS = 12
// Steps of each side before timing: the first few are slower on both (graph compilation, arenas growing).
const WARMUP = 4
const c = ModelConfig.presets.tiny


const encodeRequest = Schema.encodeSync(Tinker.ForwardBackwardRequest)
const decodeRequest = Schema.decodeUnknownSync(Tinker.ForwardBackwardRequest)
const encodeOutput = Schema.encodeSync(Tinker.ForwardBackwardOutput)
const decodeOutput = Schema.decodeUnknownSync(Tinker.ForwardBackwardOutput)

/** Both sides' coding of one micro-batch's request and of its answer, without the network or the model. */
const coding = (mb: Packing.MicroBatch) => {
  const data = Datums.fromMicroBatch(mb, "ppo") as Array<Tinker.Datum>
  const body = JSON.stringify(encodeRequest({
    model_id: "m",
    seq_id: 1,
    forward_backward_input: { data, loss_fn: "ppo", loss_fn_config: { clip_low_threshold: 0.8 } }
  }))
  const request = decodeRequest(JSON.parse(body))
  Datums.toMicroBatch(request.forward_backward_input.data, "ppo")
  const answer = JSON.stringify(encodeOutput({
    loss_fn_output_type: "ArrayRecord",
    loss_fn_outputs: Datums.outputs(data, mb.length, new Float32Array(mb.batch * mb.length)),
    metrics: { "loss:sum": 0 }
  }))
  decodeOutput(JSON.parse(answer))
}

const figures = Effect.gen(function*() {
  const loadBefore = loadavg()[0]!
  const weights = Qwen2.initWeights(c, 1)
  const settings = { loss: Loss.grpo, optimizer: Optimizer.defaultConfig, schedule: LrSchedule.constant(1e-4) }
  const packed = yield* Packing.pack(sequences(), {
    tokenBudget: 16 * 256,
    maxLength: c.maxPositionEmbeddings,
    aggregation: "seq-mean-token-mean",
    padRows: true,
    sharePrefix: false
  })
  const model = OnnxTrainer.qwen2(c)
  const local = (yield* OnnxTrainer.make({ ...settings, weights, model, workers: 1, intraOpThreads: 1 })).trainer
  const server = yield* TinkerServer.serve({ bases: [{ name: "tiny", config: c, weights }], pollMillis: 1000 })
  const client = yield* TinkerClient.make({ baseUrl: server.baseUrl })
  const remote = yield* TinkerTrainer.make({ ...settings, baseModel: "tiny" }).pipe(
    Effect.provideService(TinkerClient.TinkerClient, client)
  )
  const step = (trainer: GradientBackend.GradientBackend["Service"]) =>
    Effect.gen(function*() {
      const t0 = performance.now()
      for (const mb of packed.microBatches) yield* trainer.forwardBackward(mb)
      yield* trainer.optimStep
      return performance.now() - t0
    })
  for (let i = 0; i < WARMUP; i++) {
    yield* step(local)
    yield* step(remote)
  }
  const times = { local: [] as Array<number>, remote: [] as Array<number> }
  const before = { ...client.traffic }
  for (let i = 0; i < ROUNDS; i++) {
    times.local.push(yield* step(local))
    times.remote.push(yield* step(remote))
  }
  const requests = (client.traffic.requests - before.requests) / ROUNDS
  const polls = (client.traffic.polls - before.polls) / ROUNDS
  // The round trip of a call that computes nothing (a session heartbeat), and the coding of a step's micro-batches.
  const rtt: Array<number> = []
  for (let i = 0; i < 50; i++) {
    const t0 = performance.now()
    yield* client.call("session_heartbeat", Tinker.SessionHeartbeatRequest, {
      session_id: "sess",
      type: "session_heartbeat"
    }, Tinker.SessionHeartbeatResponse).pipe(Effect.ignore)
    rtt.push(performance.now() - t0)
  }
  const codec: Array<number> = []
  for (let i = 0; i < 10; i++) {
    const t0 = performance.now()
    for (const mb of packed.microBatches) coding(mb)
    codec.push(performance.now() - t0)
  }
  const overheadMs = requests * median(rtt) + median(codec)
  console.log(
    `  local ${median(times.local).toFixed(0)} ms a step, through the API ${median(times.remote).toFixed(0)} ms ` +
      `(${requests.toFixed(1)} requests of which ${polls.toFixed(1)} polls a step; a call's round trip ` +
      `${median(rtt).toFixed(2)} ms, coding ${median(codec).toFixed(1)} ms a step: ≈ ${overheadMs.toFixed(0)} ms)`
  )
  return {
    headline: {
      metric: "the Tinker client's cost a learner step ÷ the in-process step, tiny preset, 1 worker",
      value: overheadMs / median(times.local),
      target: 0.1,
      better: "lower" as const
    },
    apiOverLocal: median(times.remote) / median(times.local),
    local: { ms: median(times.local), rounds: times.local },
    api: { ms: median(times.remote), rounds: times.remote, requestsPerStep: requests, pollsPerStep: polls },
    wire: { roundTripMs: median(rtt), codingMsPerStep: median(codec), overheadMsPerStep: overheadMs },
    microBatches: packed.microBatches.map((mb) => `${mb.batch}×${mb.length}`),
    preset: "tiny",
    loadAverage: { before: loadBefore, after: loadavg()[0]! }
  }
})

export default (): Promise<BenchResult> =>
  Effect.runPromise(
    figures.pipe(Effect.scoped, Effect.provide(Layer.merge(NodeServices.layer, NodeHttpClient.layerNodeHttp)))
  )
