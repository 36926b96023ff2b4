/**
 * The remote trainer (`RemoteTrainer` against `TrainerServer` on loopback): the same numbers as a local
 * `OnnxTrainer` to the bit, checkpoints that move between the two, a broken connection that loses nothing and runs
 * nothing twice, a restarted server that says so, and bad input refused with typed errors.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, FileSystem, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Http from "node:http"
import * as net from "node:net"
import * as TrainerServer from "../../actors/TrainerServer.ts"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as RemoteTrainer from "../../src/backends/RemoteTrainer.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Safetensors from "../../src/Safetensors.ts"
import * as Wire from "../../src/backends/internal/trainerWire.ts"
import * as Loss from "../../src/Loss.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Optimizer from "../../src/Optimizer.ts"
import * as Packing from "../../src/Packing.ts"
import type * as GradientBackend from "../../src/GradientBackend.ts"
import * as Sampling from "../../src/Sampling.ts"
import { tinyConfig } from "../utils/tinyModel.ts"

/** A single-file checkpoint's files, the state file last. */
const checkpointFiles = ["model.safetensors", "optimizer.safetensors", "trainer_state.json"] as const

const config = tinyConfig({ vocabSize: 32, hiddenSize: 32, numHiddenLayers: 2, intermediateSize: 64 })
const model = OnnxTrainer.qwen2(config)

/**
 * 4 groups of 3 chains: each group's chains share a prompt of 6–9 tokens, then 5–10 sampled tokens of their own.
 */
const sequences = (): ReadonlyArray<Packing.Sequence> => {
  const r = Sampling.rng(5)
  const token = () => Math.floor(r.next() * config.vocabSize)
  return Array.from({ length: 4 }, (_, g) => {
    const prompt = Array.from({ length: 6 + g }, token)
    return Array.from({ length: 3 }, (_, c) => {
      const own = 5 + ((g + c * 2) % 6)
      const n = prompt.length + own
      return {
        tokenIds: Int32Array.from([...prompt, ...Array.from({ length: own }, token)]),
        lossMask: Uint8Array.from({ length: n }, (_, t) => (t >= prompt.length ? 1 : 0)),
        samplerLogprobs: Float32Array.from({ length: n }, () => -3.5 + r.next()),
        advantages: Float32Array.from({ length: n }, () => (c === 0 ? 1 : -0.5))
      }
    })
  }).flat()
}

const batches = (sharePrefix: boolean) =>
  Effect.map(
    Packing.pack(sequences(), {
      tokenBudget: 4 * 32,
      lengthMultiple: 16,
      aggregation: "seq-mean-token-mean",
      sharePrefix
    }),
    (p) => p.microBatches
  )

const weights = Qwen2.initWeights(config, 3)
const settings = {
  weights,
  loss: Loss.grpo,
  optimizer: Optimizer.defaultConfig,
  schedule: LrSchedule.constant(1e-3)
}

const local = (workers: number) =>
  Effect.map(OnnxTrainer.make({ ...settings, model, workers, intraOpThreads: 1 }), (t) => t.trainer)

const remote = (url: string, workers: number, extra: Partial<RemoteTrainer.Options> = {}) =>
  RemoteTrainer.make({ ...settings, url, model: config, parameters: model.parameters, workers, ...extra })

/** A port nothing listens on. */
const freePortOf = Effect.callback<number>((resume) => {
  const server = net.createServer()
  server.listen(0, "127.0.0.1", () => {
    const port = (server.address() as net.AddressInfo).port
    server.close(() => resume(Effect.succeed(port)))
  })
})

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("base64")
const weightBits = (w: GradientBackend.Weights) => [...w].map(([k, v]) => `${k}:${bits(v)}`).join("|")

/** Every figure of `steps` optimiser steps over `mbs`, as strings (bit patterns for arrays). */
const run = (trainer: GradientBackend.GradientBackend["Service"], mbs: ReadonlyArray<Packing.MicroBatch>, steps: number) =>
  Effect.gen(function*() {
    const out: Array<string> = []
    for (let s = 0; s < steps; s++) {
      for (const mb of mbs) {
        const r = yield* trainer.forwardBackward(mb)
        out.push(`${r.loss} ${r.tokens} ${r.clipped} ${r.approxKl} ${r.entropy} ${bits(r.tokenLogprobs)}`)
      }
      const o = yield* trainer.optimStep
      out.push(`${o.step} ${o.gradNorm} ${o.lr}`)
    }
    out.push(bits(yield* trainer.logprobs(mbs[0]!)))
    return out
  })

/** A TCP proxy to `port` that cuts the connection of the next `drops` calls of `op` once the server answers them. */
const cuttingProxy = (port: number, op: string, drops: { count: number }) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly server: net.Server; readonly port: number }>((resume) => {
      const server = net.createServer((client) => {
        const upstream = net.connect(port, "127.0.0.1")
        let pending: string | undefined
        client.on("data", (chunk) => {
          const m = /POST \/v1\/trainer\/[^/]+\/(\w+) HTTP/.exec(chunk.toString("latin1"))
          if (m !== null) pending = m[1]
          upstream.write(chunk)
        })
        upstream.on("data", (chunk) => {
          if (pending === op && drops.count > 0) {
            drops.count--
            client.destroy()
            upstream.destroy()
            return
          }
          client.write(chunk)
        })
        const end = () => {
          client.destroy()
          upstream.destroy()
        }
        client.on("error", end).on("close", end)
        upstream.on("error", end).on("close", end)
      })
      server.listen(
        0,
        "127.0.0.1",
        () => resume(Effect.succeed({ server, port: (server.address() as net.AddressInfo).port }))
      )
    }),
    ({ server }) => Effect.sync(() => server.close())
  )

/** An inference server's weights route that records every PUT, answering `status` (200 until set). */
const weightsRecorder = Effect.acquireRelease(
  Effect.callback<{
    readonly url: string
    readonly puts: Array<{ readonly headers: Http.IncomingHttpHeaders; readonly bytes: Buffer }>
    readonly answer: { status: number; body: string }
    readonly server: Http.Server
  }>((resume) => {
    const puts: Array<{ readonly headers: Http.IncomingHttpHeaders; readonly bytes: Buffer }> = []
    const answer = { status: 200, body: "{}" }
    const server = Http.createServer((req, res) => {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c))
      req.on("end", () => {
        if (req.method === "PUT" && req.url === "/v1/weights") {
          puts.push({ headers: req.headers, bytes: Buffer.concat(chunks) })
        }
        res.writeHead(answer.status, { "content-type": "application/json" })
        res.end(answer.body)
      })
    })
    server.listen(0, "127.0.0.1", () =>
      resume(Effect.succeed({
        url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}/v1`,
        puts,
        answer,
        server
      })))
  }),
  ({ server }) => Effect.sync(() => server.close())
)

describe("RemoteTrainer and TrainerServer", () => {
  it.live("summarise the weights and push them to inference servers from the trainer's machine", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TrainerServer.serve()
      const mbs = yield* batches(false)
      const traffic = RemoteTrainer.makeTraffic()
      const there = yield* remote(baseUrl, 1, { traffic })
      yield* run(there, mbs, 1)
      const sent = traffic.receivedBytes
      const summary = yield* there.summary
      // The summary is a few bytes, not the weights; and the fingerprint is the one the run computes from them.
      assert.isBelow(traffic.receivedBytes - sent, 1_000)
      assert.strictEqual(summary.nonFinite, undefined)
      const current = yield* there.weights
      assert.strictEqual(summary.fingerprint, Checkpoint.fingerprint(current))
      assert.notStrictEqual(summary.fingerprint, Checkpoint.fingerprint(weights))

      const a = yield* weightsRecorder
      const b = yield* weightsRecorder
      const dead = `http://127.0.0.1:${yield* freePortOf}/v1`
      const push = { version: 5, runId: "run-1", token: "w-token", timeoutMs: 5_000 }
      const outcomes = yield* there.push(push, [a.url, b.url, dead])
      assert.strictEqual(outcomes[0], undefined)
      assert.strictEqual(outcomes[1], undefined)
      const failed = outcomes[2] as { fatal: boolean; message: string }
      assert.isFalse(failed.fatal)
      assert.include(failed.message, "ECONNREFUSED")
      // What a server got: this trainer's weights as safetensors, the version, the run's id and the servers' token.
      for (const server of [a, b]) {
        assert.strictEqual(server.puts.length, 1)
        const { headers, bytes } = server.puts[0]!
        assert.strictEqual(headers["x-policy-version"], "5")
        assert.strictEqual(headers["x-run-id"], "run-1")
        assert.strictEqual(headers["authorization"], "Bearer w-token")
        const parsed = yield* Safetensors.parse(bytes)
        const got = yield* Safetensors.readFloat32(parsed, "push", model.parameters)
        assert.strictEqual(weightBits(got), weightBits(current))
      }
      // A server that missed it gets the same version again; a version the trainer no longer holds is "newer".
      const again = yield* there.catchUp(push, [a.url])
      assert.deepStrictEqual(again, [undefined])
      assert.strictEqual(weightBits(
        yield* Safetensors.readFloat32(yield* Safetensors.parse(a.puts[1]!.bytes), "again", model.parameters)
      ), weightBits(current))
      assert.deepStrictEqual(yield* there.catchUp({ ...push, version: 4 }, [a.url]), ["newer"])
      assert.strictEqual(a.puts.length, 2)
      // A server that refuses the weights (a 4xx) is a fatal outcome, its answer quoted.
      b.answer.status = 401
      b.answer.body = `{"error":{"message":"a valid bearer token is required"}}`
      const refused = (yield* there.push({ ...push, version: 6 }, [b.url]))[0] as { fatal: boolean; message: string }
      assert.isTrue(refused.fatal)
      assert.include(refused.message, "HTTP 401")
      assert.include(refused.message, "bearer token")
      // The catch-up is not a numbered call: the learner's next calls go on in order.
      yield* run(there, mbs, 1)
      assert.notStrictEqual((yield* there.summary).fingerprint, summary.fingerprint)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)


  it.effect("compute what a local trainer computes, to the bit (whole rows and shared prompts, 1 and 2 workers)", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TrainerServer.serve()
      for (const [sharePrefix, workers] of [[false, 1], [true, 2]] as const) {
        const mbs = yield* batches(sharePrefix)
        assert.strictEqual(mbs.some((mb) => mb.prefix !== undefined), sharePrefix)
        const here = yield* local(workers)
        const there = yield* remote(baseUrl, workers)
        const expected = yield* run(here, mbs, 3)
        assert.deepStrictEqual(yield* run(there, mbs, 3), expected)
        assert.strictEqual(weightBits(yield* there.weights), weightBits(yield* here.weights))
        assert.strictEqual(yield* there.step, 3)
        // The weights moved: a trainer that ignored the steps would pass the comparisons above only by accident.
        assert.notStrictEqual(weightBits(yield* there.weights), weightBits(weights))
      }
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.effect("checkpoints move between a remote and a local trainer and resume the same steps", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const { baseUrl } = yield* TrainerServer.serve()
      const mbs = yield* batches(false)
      const dir = yield* fs.makeTempDirectoryScoped()
      const there = yield* remote(baseUrl, 1)
      yield* run(there, mbs, 2)
      yield* there.save(`${dir}/remote`, { policyVersion: 2, rngState: [7, 8] })
      assert.deepStrictEqual(
        (yield* fs.readDirectory(`${dir}/remote`)).sort(),
        [...checkpointFiles].sort()
      )
      // Loaded locally, it continues as the remote trainer does.
      const here = yield* local(1)
      assert.deepStrictEqual(yield* here.load(`${dir}/remote`), { policyVersion: 2, rngState: [7, 8] })
      assert.deepStrictEqual(yield* run(here, mbs, 1), yield* run(there, mbs, 1))
      // And the other way: a local checkpoint into a fresh remote trainer.
      yield* here.save(`${dir}/local`, { policyVersion: 3, rngState: [] })
      const fresh = yield* remote(baseUrl, 1, { name: "fresh" })
      assert.strictEqual((yield* fresh.load(`${dir}/local`)).policyVersion, 3)
      assert.strictEqual(yield* fresh.step, 3)
      assert.strictEqual(weightBits(yield* fresh.weights), weightBits(yield* here.weights))
      // A corrupt checkpoint is refused by the server, naming the run's own path.
      const file = `${dir}/local/model.safetensors`
      const bytes = yield* fs.readFile(file)
      bytes[bytes.length - 1] ^= 0xff
      yield* fs.writeFile(file, bytes)
      const corrupt = yield* Effect.flip(fresh.load(`${dir}/local`))
      assert.strictEqual(corrupt.reason._tag, "Checkpoint")
      assert.include(corrupt.message, `${dir}/local/model.safetensors`)
      assert.notInclude(corrupt.message, "agentfly-trainer-")
      const missing = yield* Effect.flip(fresh.load(`${dir}/nowhere`))
      assert.strictEqual(missing.reason._tag, "Checkpoint")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  // Live clock: the client waits between attempts.
  it.live("a call whose connection broke after the server ran it is answered again, not run twice", () =>
    Effect.gen(function*() {
      const { port } = yield* TrainerServer.serve()
      const drops = { count: 0 }
      const proxy = yield* cuttingProxy(port, "forward_backward", drops)
      const mbs = yield* batches(false)
      const here = yield* local(1)
      const traffic = RemoteTrainer.makeTraffic()
      const there = yield* remote(`http://127.0.0.1:${proxy.port}/v1`, 1, { traffic })
      drops.count = 2
      const expected = yield* run(here, mbs, 2)
      // Gradients accumulate: a forward/backward run twice would double its share and change every weight after.
      assert.deepStrictEqual(yield* run(there, mbs, 2), expected)
      assert.strictEqual(drops.count, 0)
      assert.strictEqual(traffic.retries, 2)
      // init, then 2 × (3 forward/backward + optim_step) and the logprobs: counted once each, whatever the retries.
      assert.strictEqual(traffic.calls, 1 + 2 * (mbs.length + 1) + 1)
      assert.strictEqual(weightBits(yield* there.weights), weightBits(yield* here.weights))
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("a server that went away fails the call Unavailable; a restarted one says it lost the run's trainer", () =>
    Effect.gen(function*() {
      const first = yield* Scope.make()
      const { port, baseUrl } = yield* TrainerServer.serve().pipe(Effect.provideService(Scope.Scope, first))
      const there = yield* remote(baseUrl, 1, { retryMillis: 400 })
      const mbs = yield* batches(false)
      yield* there.forwardBackward(mbs[0]!)
      yield* Scope.close(first, Exit.void)
      const gone = yield* Effect.flip(there.optimStep)
      assert.strictEqual(gone.reason._tag, "Unavailable")
      assert.include(gone.message, "could not be reached")
      yield* TrainerServer.serve({ port })
      const lost = yield* Effect.flip(there.optimStep)
      assert.strictEqual(lost.reason._tag, "Remote")
      assert.include(lost.message, "resume the run from its last checkpoint")
      // One that is not there when the run starts: refused within 5 s (not its 60 s mid-run patience), and with
      // nothing to resume yet. Within 5 s the waits (0.1, 0.2, 0.4, 0.8, 1.6 s, then 2 s) leave room for 5 retries
      // at most, however slow each attempt; 60 s would allow over 30.
      const traffic = RemoteTrainer.makeTraffic()
      const absent = yield* Effect.flip(remote(`http://127.0.0.1:${port + 1}/v1`, 1, { traffic }))
      assert.strictEqual(absent.reason._tag, "Unavailable")
      assert.isAtMost(traffic.retries, 5)
      assert.include(absent.message, "could not be reached for 5 s (init: ECONNREFUSED)")
      assert.notInclude(absent.message, "resume")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("a call waits as long as learner.timeoutSeconds allows, and a hung trainer fails it naming that limit", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TrainerServer.serve()
      // In front of the trainer, a proxy that holds every call 1.2 s before passing it on: a slow step.
      const held: Array<Http.ServerResponse> = []
      const proxy = (delayMs: number | "forever") =>
        Effect.acquireRelease(
          Effect.callback<{ readonly url: string; readonly server: Http.Server }>((resume) => {
            const server = Http.createServer(async (req, res) => {
              const chunks: Array<Buffer> = []
              for await (const chunk of req) chunks.push(chunk as Buffer)
              if (delayMs === "forever") return void held.push(res)
              await new Promise((r) => setTimeout(r, delayMs))
              const headers = Object.fromEntries(
                Object.entries(req.headers).filter(([k]) => k.startsWith("x-agentfly") || k === "content-type")
              ) as Record<string, string>
              const reply = await fetch(`${baseUrl}${req.url!.replace(/^\/v1/, "")}`, {
                method: "POST",
                headers,
                body: Buffer.concat(chunks)
              })
              res.writeHead(reply.status, { "content-type": reply.headers.get("content-type") ?? "" })
              res.end(Buffer.from(await reply.arrayBuffer()))
            })
            server.listen(0, "127.0.0.1", () =>
              resume(Effect.succeed({
                url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}/v1`,
                server
              })))
          }),
          ({ server }) => Effect.sync(() => server.close())
        )
      const slow = yield* proxy(1_200)
      // A limit far above the proxy's delay and any step's time on a loaded machine: only its waiting is tested here.
      const patient = yield* remote(slow.url, 1, { callMillis: 300_000 })
      const mbs = yield* batches(false)
      const started = Date.now()
      yield* patient.forwardBackward(mbs[0]!)
      assert.isAtLeast(Date.now() - started, 1_200)
      const hung = yield* proxy("forever")
      const traffic = RemoteTrainer.makeTraffic()
      const gaveUp = yield* Effect.flip(remote(hung.url, 1, { callMillis: 800, traffic }))
      assert.strictEqual(gaveUp.reason._tag, "Unavailable")
      assert.include(gaveUp.message, "gave no answer to init within 0.8 s (learner.timeoutSeconds)")
      assert.deepStrictEqual([traffic.calls, traffic.retries], [1, 0], "given up once, not sent again behind it")
      for (const res of held) res.destroy()
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  // The idle expiry runs on Effect's clock: the test moves it, so no phase of the test can outlast it by being slow.
  it.effect("two runs' trainers live side by side; one left without calls is closed", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TrainerServer.serve({ idleMillis: 1_000 })
      const trainers = Effect.promise(async () =>
        (await (await fetch(`${baseUrl}/trainer`)).json() as { trainers: Array<string> }).trainers.sort()
      )
      const mbs = yield* batches(false)
      const a = yield* remote(baseUrl, 1, { name: "policy-a" })
      const b = yield* remote(baseUrl, 1, { name: "policy-b" })
      const here = yield* local(1)
      // Interleaved: each trainer's gradients are its own.
      for (const mb of mbs) {
        yield* a.forwardBackward(mb)
        yield* b.forwardBackward(mb)
        yield* here.forwardBackward(mb)
      }
      yield* Effect.all([a.optimStep, b.optimStep, here.optimStep])
      const expected = weightBits(yield* here.weights)
      assert.strictEqual(weightBits(yield* a.weights), expected)
      assert.strictEqual(weightBits(yield* b.weights), expected)
      // b keeps calling every 250 ms; a does not. A sweep every second: at 1 s a has been idle 1 s, not more.
      for (let i = 1; i <= 8; i++) {
        yield* TestClock.adjust(250)
        yield* b.step
        if (i === 4) assert.deepStrictEqual(yield* trainers, ["policy-a", "policy-b"])
      }
      assert.deepStrictEqual(yield* trainers, ["policy-b"])
      const closed = yield* Effect.flip(a.step)
      assert.strictEqual(closed.reason._tag, "Remote")
      assert.include(closed.message, "no longer holds")
      assert.strictEqual(yield* b.step, 1)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.effect("bad input gets typed refusals and the trainer goes on", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TrainerServer.serve({ token: "s3cret" })
      const mbs = yield* batches(false)
      // No token, then a wrong one.
      const unauthorised = yield* Effect.flip(remote(baseUrl, 1, { token: "wrong" }))
      assert.strictEqual(unauthorised.reason._tag, "Remote")
      assert.include(unauthorised.message, "AGENTFLY_TRAINER_TOKEN")
      const there = yield* remote(baseUrl, 1, { token: "s3cret" })
      // A token id outside the vocabulary: the trainer's own check, typed, and nothing accumulated.
      const bad = { ...mbs[0]!, targets: mbs[0]!.targets.map((t, i) => (i === 3 ? 999 : t)) }
      const refused = yield* Effect.flip(there.forwardBackward(bad))
      assert.strictEqual(refused.reason._tag, "BadBatch")
      assert.include(refused.message, "999")
      assert.strictEqual((yield* Effect.flip(there.optimStep)).reason._tag, "NothingAccumulated")
      yield* there.forwardBackward(mbs[0]!)
      assert.strictEqual((yield* there.optimStep).step, 1)
      // Weights of another model, a frame that is not one, a call out of order.
      const post = (path: string, body: Uint8Array, headers: Record<string, string> = {}) =>
        Effect.promise(async () => {
          const r = await fetch(`${baseUrl}/trainer/${path}`, {
            method: "POST",
            headers: { authorization: "Bearer s3cret", ...headers },
            body: body as Uint8Array<ArrayBuffer>
          })
          return { status: r.status, error: (await r.json() as { error: { code: string; message: string } }).error }
        })
      const header = {
        model: ModelConfig.toJson(config),
        loss: Loss.grpo,
        optimizer: Optimizer.defaultConfig,
        schedule: LrSchedule.constant(0),
        workers: 1
      }
      const short = yield* post(
        "other/init",
        Wire.encode(
          header,
          model.parameters.map((p, i) => [p.name, new Float32Array(i === 0 ? 3 : weights.get(p.name)!.length)] as const)
        )
      )
      assert.strictEqual(short.status, 400)
      assert.include(short.error.message, model.parameters[0]!.name)
      // Weights of the right shapes with a NaN: refused as a model folder's are, naming the tensor.
      const nanWeights = model.parameters.map((p, i) => {
        const values = Float32Array.from(weights.get(p.name)!)
        if (i === 1) values[2] = Number.NaN
        return [p.name, values] as const
      })
      const nan = yield* post("other/init", Wire.encode(header, nanWeights))
      assert.strictEqual(nan.status, 400)
      assert.include(nan.error.message, `weight ${model.parameters[1]!.name} holds 1 non-finite value(s)`)
      const garbage = yield* post("other/init", Buffer.from("{\"not\": \"a frame\"}"))
      assert.deepStrictEqual([garbage.status, garbage.error.code], [400, "invalid_request"])
      const stranger = yield* post("policy/optim_step", Wire.encode({}), {
        "x-agentfly-session": "nobody",
        "x-agentfly-seq": "1"
      })
      assert.deepStrictEqual([stranger.status, stranger.error.code], [404, "unknown_session"])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it("the wire carries a micro-batch with shared prompts unchanged", async () => {
    const mbs = await Effect.runPromise(batches(true))
    for (const mb of mbs) {
      const back = Wire.decodeBatch(Wire.decode(Wire.encodeBatch(mb)) as Wire.Frame)
      assert.deepStrictEqual(back, mb)
    }
    assert.include(Wire.decode(Buffer.from("AFT1")) as string, "frame of 4 bytes")
    const frame = Wire.decode(
      Wire.encode({ batch: 1, length: 1, lossTokens: 0 }, [["inputIds", new Float32Array(1)]])
    ) as Wire.Frame
    assert.include(Wire.decodeBatch(frame) as string, "inputIds must be i32")
  })
})
