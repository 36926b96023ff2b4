/**
 * `npm run bench -- trainer`: a learner step in this process (`OnnxTrainer`) against the same step on a trainer
 * server (`agentfly trainer` in a child process on loopback, `RemoteTrainer`), as `agentfly train` runs it: the
 * forward/backward passes over one GRPO step's micro-batches (8 groups × 8 chains of the calculator demo's shape,
 * prompts shared: `learner.sharePrefix`), the optimiser step, then the weights asked for three times (the finite
 * check, publishing, the journal's fingerprint). Tiny preset, 2 learner workers on either side; rounds alternate.
 *
 * Headline: the wire's cost a step (round trips of the step's calls on loopback, both sides' encoding and decoding
 * of its micro-batches and of the weights) ÷ the in-process step's time; our own target ≤ 0.1, no issue sets one.
 * Also: remote ÷ local time a step (on a shared 2-core machine it swings with the load either way), bytes each way.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { loadavg } from "node:os"
import { resolve } from "node:path"
import * as OnnxTrainer from "../src/backends/OnnxTrainer.ts"
import * as RemoteTrainer from "../src/backends/RemoteTrainer.ts"
import * as Wire from "../src/backends/internal/trainerWire.ts"
import * as Loss from "../src/Loss.ts"
import * as LrSchedule from "../src/LrSchedule.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Optimizer from "../src/Optimizer.ts"
import * as Packing from "../src/Packing.ts"
import type * as GradientBackend from "../src/GradientBackend.ts"
import { median, sequences } from "./internal/demoBatch.ts"
import type { BenchResult } from "./run.ts"

const ROUNDS = 16
// Steps of each side before timing: the first few are slower on both (graph compilation, arenas growing).
const WARMUP = 5
// `BENCH_TRAINER_PRESET=small` for the small preset (15 MB of weights a step instead of 2.7).
const preset = (process.env["BENCH_TRAINER_PRESET"] ?? "tiny") as ModelConfig.PresetName
const c = ModelConfig.presets[preset]


/** `agentfly trainer --port 0` in a child process, for the life of the scope; its API root. */
const trainerProcess = Effect.acquireRelease(
  Effect.callback<{ readonly url: string; readonly kill: () => void }, Error>((resume) => {
    const child = spawn(process.execPath, ["--import", "tsx", "cli/main.ts", "trainer", "--port", "0"], {
      cwd: resolve(import.meta.dirname, ".."),
      stdio: ["ignore", "pipe", "inherit"]
    })
    let text = ""
    child.stdout.on("data", (chunk: Buffer) => {
      text += chunk.toString()
      const url = /at (http:\/\/\S+\/v1)/.exec(text)?.[1]
      if (url !== undefined) resume(Effect.succeed({ url, kill: () => child.kill("SIGKILL") }))
    })
    child.on("exit", (code) => resume(Effect.fail(new Error(`agentfly trainer exited with ${code}: ${text}`))))
  }),
  (t) => Effect.sync(t.kill)
)

/** Bytes sent and received through `fetch` (the remote trainer's only way out). */
const traffic = { sent: 0, received: 0 }
const realFetch = globalThis.fetch
globalThis.fetch = async (input, init) => {
  const body = init?.body
  if (body instanceof Uint8Array) traffic.sent += body.byteLength
  const response = await realFetch(input, init)
  const bytes = await response.arrayBuffer()
  traffic.received += bytes.byteLength
  return new Response(bytes, { status: response.status, headers: response.headers })
}

const figures = Effect.gen(function*() {
  const loadBefore = loadavg()[0]!
  const model = OnnxTrainer.qwen2(c)
  const settings = {
    weights: Qwen2.initWeights(c, 1),
    loss: Loss.grpo,
    optimizer: Optimizer.defaultConfig,
    schedule: LrSchedule.constant(1e-4)
  }
  const packed = yield* Packing.pack(sequences(), {
    tokenBudget: 16 * 256,
    maxLength: c.maxPositionEmbeddings,
    aggregation: "seq-mean-token-mean",
    padRows: true,
    sharePrefix: true
  })
  const local = (yield* OnnxTrainer.make({ ...settings, model, workers: 2, intraOpThreads: 1 })).trainer
  const server = yield* trainerProcess
  const remote = yield* RemoteTrainer.make({
    ...settings,
    url: server.url,
    model: c,
    parameters: model.parameters,
    workers: 2
  })

  const step = (trainer: GradientBackend.GradientBackend["Service"]) =>
    Effect.gen(function*() {
      const t0 = performance.now()
      for (const mb of packed.microBatches) yield* trainer.forwardBackward(mb)
      yield* trainer.optimStep
      for (let i = 0; i < 3; i++) yield* trainer.weights
      return performance.now() - t0
    })
  for (let i = 0; i < WARMUP; i++) {
    yield* step(local)
    yield* step(remote)
  }
  const times = { local: [] as Array<number>, remote: [] as Array<number> }
  const before = { ...traffic }
  for (let i = 0; i < ROUNDS; i++) {
    times.local.push(yield* step(local))
    times.remote.push(yield* step(remote))
  }
  // Both trainers took the same steps from the same weights: the remote one must hold what the local one holds.
  const [a, b] = [yield* local.weights, yield* remote.weights]
  const same = [...a].every(([k, v]) => Buffer.compare(Buffer.from(v.buffer), Buffer.from(b.get(k)!.buffer)) === 0)
  if (!same) return yield* Effect.die(new Error("the remote trainer's weights differ from the local trainer's"))
  const ratio = median(times.remote) / median(times.local)
  // The wire's own costs, apart from the noisy steps: a numbered call that computes nothing, and both sides'
  // encoding and decoding of a step's micro-batches and of the weights.
  const rtt: Array<number> = []
  for (let i = 0; i < 50; i++) {
    const t0 = performance.now()
    yield* remote.step
    rtt.push(performance.now() - t0)
  }
  const codec: Array<number> = []
  for (let i = 0; i < 20; i++) {
    const t0 = performance.now()
    for (const mb of packed.microBatches) Wire.decodeBatch(Wire.decode(Wire.encodeBatch(mb)) as Wire.Frame)
    Wire.decodeWeights(Wire.decode(Wire.encode({}, [...a])) as Wire.Frame, model.parameters)
    codec.push(performance.now() - t0)
  }
  const calls = packed.microBatches.length + 2
  const overheadMs = calls * median(rtt) + median(codec)
  const perStep = {
    sentMB: (traffic.sent - before.sent) / ROUNDS / 1e6,
    receivedMB: (traffic.received - before.received) / ROUNDS / 1e6
  }
  console.log(
    `  local ${median(times.local).toFixed(0)} ms a step, remote ${median(times.remote).toFixed(0)} ms ` +
      `(${perStep.sentMB.toFixed(2)} MB sent, ${perStep.receivedMB.toFixed(2)} MB received a step; a call's round ` +
      `trip ${median(rtt).toFixed(2)} ms, coding ${median(codec).toFixed(1)} ms a step: ≈ ${overheadMs.toFixed(0)} ms)`
  )
  return {
    headline: {
      metric: `the wire's cost a learner step ÷ the in-process step, ${preset} preset, 2 workers`,
      value: overheadMs / median(times.local),
      target: 0.1,
      better: "lower" as const
    },
    remoteOverLocal: ratio,
    local: { ms: median(times.local), rounds: times.local },
    remote: { ms: median(times.remote), rounds: times.remote, ...perStep },
    wire: {
      roundTripMs: median(rtt),
      codingMsPerStep: median(codec),
      callsPerStep: calls,
      overheadMsPerStep: overheadMs
    },
    microBatches: packed.microBatches.map((mb) =>
      `${mb.batch}×${mb.length}${mb.prefix === undefined ? "" : ` + ${mb.prefix.batch}×${mb.prefix.length}`}`
    ),
    preset,
    identicalWeights: same,
    loadAverage: { before: loadBefore, after: loadavg()[0]! }
  }
})

export default (): Promise<BenchResult> =>
  Effect.runPromise(figures.pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
