/**
 * `npm run bench -- tinker-server`: a learner step in this process (`OnnxTrainer`) against the same step through the
 * Tinker API of `agentfly trainer --tinker-model tiny` (a child process on loopback): one `forward_backward` per
 * micro-batch and an `optim_step`, each a future posted and retrieved with `fetch`, bodies JSON as the Schemas of
 * `src/tinker/Types.ts` encode them. The batch: one GRPO step of the calculator demo's shape (8 groups × 8 chains,
 * 172–241 tokens, prompts not shared: a datum cannot say so), 4 micro-batches, `importance_sampling`. Tiny preset,
 * one learner thread on either side; rounds alternate.
 *
 * Headline: the API's cost a step (HTTP round trips, JSON and Schema encoding and decoding on both sides, the
 * server's request log written and fsync'ed, the polls) ÷ the in-process step's time; target ≤ 0.1 (issue 43's figure
 * is the client's cost, measured by `bench/tinker.ts`; this one is the server's share of it, with a plain client).
 */
import { NodeServices } from "@effect/platform-node"
import { Effect, Schema } from "effect"
import { spawn } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { loadavg, tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import type * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Packing from "../src/Packing.ts"
import * as Datums from "../src/tinker/Datums.ts"
import * as T from "../src/tinker/Types.ts"
import { median, sequences } from "./internal/demoBatch.ts"
import type { BenchResult } from "./run.ts"

const ROUNDS = 12
const WARMUP = 3


/** `agentfly trainer --port 0 --tinker-model tiny` for the life of the scope: its base URL. */
const serverProcess = (stateDir: string) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly url: string; readonly kill: () => void }, Error>((resume) => {
      const args = ["--import", "tsx", "cli/main.ts", "trainer", "--port", "0", "--tinker-model", "tiny"]
      const child = spawn(process.execPath, [...args, "--tinker-state-dir", stateDir], {
        cwd: resolve(import.meta.dirname, ".."),
        stdio: ["ignore", "pipe", "inherit"]
      })
      let text = ""
      child.stdout.on("data", (chunk: Buffer) => {
        text += chunk.toString()
        const url = /Tinker API at (http:\/\/\S+)\/api\/v1/.exec(text)?.[1]
        if (url !== undefined) resume(Effect.succeed({ url, kill: () => child.kill("SIGKILL") }))
      })
      child.on("exit", (code) => resume(Effect.fail(new Error(`agentfly trainer exited with ${code}: ${text}`))))
    }),
    (t) => Effect.sync(t.kill)
  )

const traffic = { sent: 0, received: 0 }

/** POSTs `body` (encoded with `request`) to `route`; the answer decoded with `response`. */
const post = async <A>(url: string, route: T.Route, request: Schema.Codec<any, any>, body: unknown, response: Schema.Codec<A, any>) => {
  const text = JSON.stringify(Schema.encodeSync(request as Schema.Codec<any, any, never, never>)(body))
  traffic.sent += text.length
  const res = await fetch(`${url}/api/v1/${route}`, { method: "POST", headers: { "content-type": "application/json" }, body: text })
  const answer = await res.text()
  traffic.received += answer.length
  if (res.status !== 200) throw new Error(`${route}: ${res.status} ${answer}`)
  return Schema.decodeUnknownSync(response as Schema.Codec<A, any, never, never>)(JSON.parse(answer))
}

/** Posts a future and retrieves it until done. */
const future = async <A>(url: string, route: T.Route, request: Schema.Codec<any, any>, body: unknown, result: Schema.Codec<A, any>) => {
  const f = await post(url, route, request, body, T.UntypedAPIFuture)
  for (;;) {
    const r = await post(url, "retrieve_future", T.FutureRetrieveRequest, { request_id: f.request_id }, T.futureResult(result))
    if ((r as { type?: string }).type === "try_again") continue
    if ((r as { category?: string }).category !== undefined) throw new Error(`${route} failed: ${JSON.stringify(r)}`)
    return r as A
  }
}

const adam: T.AdamParams = { learning_rate: 1e-4, beta1: 0.9, beta2: 0.95, eps: 1e-12, weight_decay: 0, grad_clip_norm: 1 }

const figures = Effect.gen(function*() {
  const loadBefore = loadavg()[0]!
  const stateDir = mkdtempSync(join(tmpdir(), "bench-tinker-server-"))
  const server = yield* serverProcess(stateDir)
  const folder = yield* ModelFolder.load(join(stateDir, "bases", "tiny"))
  const packed = Packing.packUnsafe(sequences(), { tokenBudget: 16 * 256, aggregation: "seq-mean-token-mean" })
  const batches = packed.microBatches.map((mb) => Datums.fromMicroBatch(mb, "importance_sampling") as Array<T.Datum>)
  const mbs = batches.map((b) => Datums.toMicroBatch(b, "importance_sampling") as Packing.MicroBatch)
  const local = (yield* OnnxTrainer.make({
    model: OnnxTrainer.qwen2(folder.config),
    weights: folder.weights,
    loss: Datums.lossConfig("importance_sampling") as Loss.Config,
    optimizer: { beta1: 0.9, beta2: 0.95, eps: 1e-12, weightDecay: 0, maxGradNorm: 1 },
    schedule: LrSchedule.constant(1e-4),
    intraOpThreads: 1
  })).trainer
  const session = yield* Effect.promise(() =>
    post(server.url, "create_session", T.CreateSessionRequest, { tags: [], sdk_version: "bench", type: "create_session" }, T.CreateSessionResponse)
  )
  const created = yield* Effect.promise(() =>
    future(server.url, "create_model", T.CreateModelRequest, {
      session_id: session.session_id,
      model_seq_id: 0,
      base_model: "tiny",
      type: "create_model"
    }, T.CreateModelResponse)
  )
  const model = created.model_id
  const localStep = Effect.gen(function*() {
    const t0 = performance.now()
    for (const mb of mbs) yield* local.forwardBackward(mb)
    yield* local.optimStep
    return performance.now() - t0
  })
  const remoteStep = Effect.promise(async () => {
    const t0 = performance.now()
    for (const data of batches) {
      const body = { forward_backward_input: { data, loss_fn: "importance_sampling" }, model_id: model }
      await future(server.url, "forward_backward", T.ForwardBackwardRequest, body, T.ForwardBackwardOutput)
    }
    await future(server.url, "optim_step", T.OptimStepRequest, { adam_params: adam, model_id: model, type: "optim_step" }, T.OptimStepResponse)
    return performance.now() - t0
  })
  for (let i = 0; i < WARMUP; i++) {
    yield* localStep
    yield* remoteStep
  }
  traffic.sent = 0
  traffic.received = 0
  const localMs: Array<number> = [], remoteMs: Array<number> = []
  for (let i = 0; i < ROUNDS; i++) {
    localMs.push(yield* localStep)
    remoteMs.push(yield* remoteStep)
  }
  const local_ = median(localMs), remote_ = median(remoteMs)
  const overhead = Math.max(0, remote_ - local_) / local_
  const result: BenchResult = {
    headline: {
      metric: "Tinker API cost a learner step (server + plain client on loopback) ÷ in-process step, tiny preset",
      value: overhead,
      target: 0.1,
      better: "lower"
    },
    inProcessStepMs: local_,
    apiStepMs: remote_,
    apiOverInProcess: remote_ / local_,
    microBatches: mbs.length,
    sequences: 64,
    requestBytesPerStep: traffic.sent / ROUNDS,
    responseBytesPerStep: traffic.received / ROUNDS,
    rounds: ROUNDS,
    loadAverage: { before: loadBefore, after: loadavg()[0]! }
  }
  return result
})

export default () => Effect.runPromise(figures.pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
