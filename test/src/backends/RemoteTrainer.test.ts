/**
 * The remote trainer's client (`RemoteTrainer`) against a scripted trainer server on loopback: what it sends (the
 * init frame, the session, numbered calls, the token), what it sends again and for how long (on Effect's clock, so
 * `TestClock` drives the patience), the failures it maps from the server's answers, and its traffic figures.
 * `test/actors/TrainerServer.test.ts` runs it against the real server.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, FileSystem, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as Wire from "../../../src/backends/internal/trainerWire.ts"
import * as RemoteTrainer from "../../../src/backends/RemoteTrainer.ts"
import * as Loss from "../../../src/Loss.ts"
import * as LrSchedule from "../../../src/LrSchedule.ts"
import * as ModelConfig from "../../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../../src/model/Qwen2.ts"
import * as Optimizer from "../../../src/Optimizer.ts"
import { tinyConfig } from "../../utils/tinyModel.ts"

/** A single-file checkpoint's files, the state file last. */
const checkpointFiles = ["model.safetensors", "optimizer.safetensors", "trainer_state.json"] as const

const config = tinyConfig({ vocabSize: 16, hiddenSize: 8, numHiddenLayers: 1, intermediateSize: 16 })
const parameters = Qwen2.parameters(config)
const weights = Qwen2.initWeights(config, 3)

/** A request as the server saw it. */
interface Seen {
  readonly path: string
  readonly op: string
  readonly headers: Http.IncomingHttpHeaders
  readonly body: Buffer
}

interface Answer {
  readonly status: number
  readonly body: Uint8Array | string
}

const ok = (header: Record<string, unknown> = {}, arrays: Iterable<readonly [string, Wire.TypedArray]> = []) => ({
  status: 200,
  body: Wire.encode(header, arrays)
})
const refusal = (status: number, code: string, message: string) => ({
  status,
  body: JSON.stringify({ error: { code, message } })
})

/**
 * A trainer server that records every request and answers as `script` says (by default: init → session `s-1`,
 * any other call → an empty frame).
 */
const scripted = (script: (seen: Seen, all: ReadonlyArray<Seen>) => Answer | undefined = () => undefined) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly url: string; readonly seen: Array<Seen>; readonly server: Http.Server }>((resume) => {
      const seen: Array<Seen> = []
      const server = Http.createServer((req, res) => {
        const chunks: Array<Buffer> = []
        req.on("data", (c: Buffer) => chunks.push(c))
        req.on("end", () => {
          const path = req.url ?? ""
          const one: Seen = { path, op: path.split("/").at(-1)!, headers: req.headers, body: Buffer.concat(chunks) }
          seen.push(one)
          const answer = script(one, seen) ?? (one.op === "init" ? ok({ session: "s-1" }) : ok())
          res.writeHead(answer.status, { "content-type": "application/octet-stream" })
          res.end(answer.body)
        })
      })
      server.listen(0, "127.0.0.1", () =>
        resume(Effect.succeed({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, seen, server })))
    }),
    ({ server }) => Effect.sync(() => server.close())
  )

const connect = (url: string, extra: Partial<RemoteTrainer.Options> = {}) =>
  RemoteTrainer.make({
    url,
    model: config,
    parameters,
    weights,
    loss: Loss.grpo,
    optimizer: Optimizer.defaultConfig,
    schedule: LrSchedule.constant(1e-3),
    ...extra
  })

const frameOf = (bytes: Buffer) => Wire.decode(bytes) as Wire.Frame
const numbered = (s: Seen) => [s.op, s.headers["x-agentfly-session"], s.headers["x-agentfly-seq"]]

/** A tick of real time: the client's HTTP round trips are real, only its waits run on the test clock. */
const tick = Effect.promise(() => new Promise((r) => setTimeout(r, 5)))

/** Waits (in real time) until the client has received `bytes` in all, then until it sleeps before sending again. */
const untilReceived = (traffic: RemoteTrainer.Traffic, bytes: number) =>
  Effect.gen(function*() {
    for (let i = 0; traffic.receivedBytes < bytes; i++) {
      if (i > 4_000) return yield* Effect.die(`${bytes} bytes not received after 20 s: ${JSON.stringify(traffic)}`)
      yield* tick
    }
    // The answer is counted in the same run of the client's fiber that starts its wait; a few ticks more for a fiber
    // the scheduler paused in between.
    for (let i = 0; i < 4; i++) yield* tick
  })

/** The failure `fiber` ends with; it must end without more waits (in real time, not the test clock's). */
const failureOf = <A, E>(fiber: Fiber.Fiber<A, E>) =>
  Effect.gen(function*() {
    for (let i = 0; fiber.pollUnsafe() === undefined; i++) {
      if (i > 4_000) return yield* Effect.die("the call still waits after the waits its patience allows")
      yield* tick
    }
    return yield* Effect.flip(Fiber.join(fiber))
  })

describe("RemoteTrainer", () => {
  it.effect("init sends the model, settings and weights; calls carry the session and the next number", () =>
    Effect.gen(function*() {
      const newer = ok({ outcomes: ["newer"] })
      const server = yield* scripted((seen) => (seen.op === "catch_up" ? newer : undefined))
      const traffic = RemoteTrainer.makeTraffic()
      const scope = yield* Scope.make()
      const trainer = yield* connect(`${server.url}/`, { name: "critic a", token: "t0k", workers: 3, traffic }).pipe(
        Scope.provide(scope)
      )
      const init = server.seen[0]!
      assert.strictEqual(init.path, "/v1/trainer/critic%20a/init")
      assert.strictEqual(init.headers["authorization"], "Bearer t0k")
      assert.strictEqual(init.headers["content-type"], "application/octet-stream")
      const frame = frameOf(init.body)
      assert.deepStrictEqual(frame.header["model"], ModelConfig.toJson(config))
      assert.deepStrictEqual(frame.header["loss"], Loss.grpo)
      assert.strictEqual(frame.header["workers"], 3)
      assert.notProperty(frame.header, "head")
      assert.deepStrictEqual(Wire.decodeWeights(frame, parameters), weights)

      yield* trainer.discard
      const push = { version: 2, runId: "r", token: "w", timeoutMs: 1_000 }
      const urls = ["http://10.0.0.2:8000/v1"]
      assert.deepStrictEqual(yield* trainer.catchUp(push, urls), ["newer"])
      assert.deepStrictEqual(frameOf(server.seen[2]!.body).header, { ...push, urls, arrays: [] })
      yield* trainer.discard
      // The catch-up is not numbered: the calls around it are 1 and 2.
      assert.deepStrictEqual(server.seen.slice(1).map(numbered), [
        ["discard", "s-1", "1"],
        ["catch_up", "s-1", "0"],
        ["discard", "s-1", "2"]
      ])
      assert.isTrue(server.seen.every((s) => s.headers["authorization"] === "Bearer t0k"))
      // Closing the scope frees the trainer on the server.
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(numbered(server.seen.at(-1)!), ["close", "s-1", "0"])
      // Traffic: the calls made (the close is not one), and every byte each way.
      assert.strictEqual(traffic.calls, 4)
      assert.strictEqual(traffic.retries, 0)
      assert.strictEqual(traffic.sentBytes, server.seen.slice(0, 4).reduce((n, s) => n + s.body.length, 0))
      const answered = ok({ session: "s-1" }).body.length + 2 * ok().body.length + newer.body.length
      assert.strictEqual(traffic.receivedBytes, answered)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  // Live clock: the client waits 0.1, 0.2 and 0.4 s between attempts.
  it.live("a call the connection lost on the way (502, 503, 504) is sent again with its number; a 500 is not", () =>
    Effect.gen(function*() {
      const server = yield* scripted((seen, all) => {
        if (seen.op !== "step") return undefined
        const tries = all.filter((s) => s.op === "step").length
        if (tries === 1) return { status: 503, body: "unavailable" }
        if (tries === 2) return { status: 502, body: "bad gateway" }
        if (tries === 3) return { status: 504, body: "gateway timeout" }
        if (tries === 4) return ok({ step: 7 })
        return { status: 500, body: "it broke" }
      })
      const traffic = RemoteTrainer.makeTraffic()
      const trainer = yield* connect(server.url, { traffic })
      assert.strictEqual(yield* trainer.step, 7)
      assert.deepStrictEqual(server.seen.slice(1).map(numbered), [
        ["step", "s-1", "1"],
        ["step", "s-1", "1"],
        ["step", "s-1", "1"],
        ["step", "s-1", "1"]
      ])
      assert.deepStrictEqual([traffic.calls, traffic.retries], [2, 3])
      const broken = yield* Effect.flip(trainer.step)
      assert.strictEqual(broken.reason._tag, "Remote")
      assert.strictEqual(broken.message, `the trainer at ${server.url} refused step (HTTP 500): it broke`)
      assert.deepStrictEqual(numbered(server.seen[5]!), ["step", "s-1", "2"])
      assert.strictEqual(server.seen.length, 6)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.effect("an unreachable trainer gets a call again until its patience ends: 5 s at init, retryMillis after", () =>
    Effect.gen(function*() {
      let up = true
      const server = yield* scripted((seen) =>
        up && seen.op !== "step" ? undefined : { status: 503, body: "down" }
      )
      const traffic = RemoteTrainer.makeTraffic()
      const trainer = yield* connect(server.url, { traffic, retryMillis: 8_000 })
      // Mid-run: waits of 0.1, 0.2, 0.4, 0.8, 1.6, 2 and 2 s (7.1 s); the next 2 s would pass 8 s.
      const before = traffic.receivedBytes
      const step = yield* Effect.forkChild(trainer.step)
      for (const [n, wait] of [100, 200, 400, 800, 1_600, 2_000, 2_000].entries()) {
        yield* untilReceived(traffic, before + (n + 1) * 4)
        yield* TestClock.adjust(wait)
      }
      const lost = yield* failureOf(step)
      assert.strictEqual(lost.reason._tag, "Unavailable")
      assert.strictEqual(
        lost.message,
        `the trainer at ${server.url} could not be reached for 8 s (step: HTTP 503); start it with ` +
          "`agentfly trainer --host HOST --port PORT` and resume the run from its last checkpoint"
      )
      assert.strictEqual(server.seen.filter((s) => s.op === "step").length, 8)
      assert.deepStrictEqual([traffic.calls, traffic.retries], [2, 7])

      // At the start of a run, 5 s: 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s, and the next 2 s would pass them.
      up = false
      const fresh = RemoteTrainer.makeTraffic()
      const init = yield* Effect.forkChild(connect(server.url, { traffic: fresh, retryMillis: 8_000 }))
      for (const [n, wait] of [100, 200, 400, 800, 1_600].entries()) {
        yield* untilReceived(fresh, (n + 1) * 4)
        yield* TestClock.adjust(wait)
      }
      const absent = yield* failureOf(init)
      assert.include(absent.message, "could not be reached for 5 s (init: HTTP 503); start it with")
      assert.include(absent.message, "(learner.url names it)")
      assert.deepStrictEqual([fresh.calls, fresh.retries], [1, 5])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.effect("the server's refusals become typed failures naming the trainer", () =>
    Effect.gen(function*() {
      const answers: Record<string, Answer> = {
        forward_backward: refusal(400, "BadBatch", "token 999 is outside the vocabulary"),
        logprobs: ok(),
        optim_step: ok({ step: 1, lr: 0.1 }),
        step: refusal(404, "unknown_session", "no trainer \"policy\" with session s-1 here"),
        weights: { status: 200, body: "<html>proxy</html>" },
        summary: ok({ nonFinite: null }),
        push: ok({ outcomes: [null] }),
        save: ok({}, [["model.safetensors", new Uint8Array(2)]]),
        load: refusal(422, "Checkpoint", "<checkpoint>/model.safetensors: not a safetensors file")
      }
      const server = yield* scripted((seen) => answers[seen.op])
      const trainer = yield* connect(server.url)
      const where = `the trainer at ${server.url}`
      const batch = Wire.decodeBatch(frameOf(Wire.encode({ batch: 0, length: 0, lossTokens: 0 }, [
        ["inputIds", new Int32Array(0)],
        ["attentionMask", new Uint8Array(0)],
        ["targets", new Int32Array(0)],
        ["mask", new Uint8Array(0)],
        ["weights", new Float32Array(0)],
        ["advantages", new Float32Array(0)],
        ["samplerLogprobs", new Float32Array(0)],
        ["refLogprobs", new Float32Array(0)],
        ["sequenceIndex", new Int32Array(0)]
      ])))
      assert.notStrictEqual(typeof batch, "string")
      const mb = batch as Exclude<typeof batch, string>
      const failures = [
        yield* Effect.flip(trainer.forwardBackward(mb)),
        yield* Effect.flip(trainer.logprobs(mb)),
        yield* Effect.flip(trainer.optimStep),
        yield* Effect.flip(trainer.step),
        yield* Effect.flip(trainer.weights),
        yield* Effect.flip(trainer.summary),
        yield* Effect.flip(trainer.push({ version: 1, runId: "r", timeoutMs: 1_000 }, ["http://a/v1", "http://b/v1"]))
      ]
      assert.deepStrictEqual(failures.map((e) => [e.reason._tag, e.message]), [
        ["BadBatch", "token 999 is outside the vocabulary"],
        ["Remote", `${where} answered logprobs without tokenLogprobs`],
        ["Remote", `${where} answered optim_step without gradNorm`],
        [
          "Remote",
          `${where} no longer holds this run's trainer "policy" (no trainer "policy" with session s-1 here): it ` +
          "restarted or another run took the name over; resume the run from its last checkpoint"
        ],
        ["Remote", `${where} answered weights with not an agentfly trainer frame (magic AFT1 missing)`],
        ["Remote", `${where} answered summary without a fingerprint`],
        ["Remote", `${where} answered push without an outcome per server`]
      ])

      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      const save = yield* Effect.flip(trainer.save(`${dir}/ckpt`, { policyVersion: 1, rngState: [] }))
      assert.deepStrictEqual(
        [save.reason._tag, save.message],
        ["Remote", `${where} answered save without optimizer.safetensors`]
      )
      // A load sends the run's files; the server's message names them by the run's own path.
      const missing = yield* Effect.flip(trainer.load(dir))
      assert.deepStrictEqual(
        [missing.reason._tag, missing.message],
        ["Checkpoint", `${dir}/model.safetensors is missing`]
      )
      for (const file of checkpointFiles) yield* fs.writeFileString(`${dir}/${file}`, file)
      const corrupt = yield* Effect.flip(trainer.load(dir))
      assert.deepStrictEqual(
        [corrupt.reason._tag, corrupt.message],
        ["Checkpoint", `${dir}/model.safetensors: not a safetensors file`]
      )
      const sent = frameOf(server.seen.at(-1)!.body)
      assert.deepStrictEqual(
        [...sent.arrays].map(([name, bytes]) => [name, Buffer.from(bytes as Uint8Array).toString()]),
        checkpointFiles.map((f) => [f, f])
      )
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.effect("weights and their summary come over the wire once between optimiser steps, as copies", () =>
    Effect.gen(function*() {
      const server = yield* scripted((seen) => {
        if (seen.op === "weights") return ok({}, parameters.map((p) => [p.name, weights.get(p.name)!] as const))
        if (seen.op === "summary") return ok({ fingerprint: "f1", nonFinite: null })
        if (seen.op === "optim_step") return ok({ step: 1, gradNorm: 0.5, lr: 0.1 })
        return undefined
      })
      const trainer = yield* connect(server.url)
      const first = yield* trainer.weights
      first.get(parameters[0]!.name)![0] = 1234
      const second = yield* trainer.weights
      assert.deepStrictEqual(second, weights, "the caller's change is its own")
      assert.deepStrictEqual(yield* trainer.summary, { fingerprint: "f1", nonFinite: undefined })
      yield* trainer.summary
      const count = (op: string) => server.seen.filter((s) => s.op === op).length
      assert.deepStrictEqual([count("weights"), count("summary")], [1, 1])
      assert.deepStrictEqual(yield* trainer.optimStep, { step: 1, gradNorm: 0.5, lr: 0.1 })
      yield* trainer.weights
      yield* trainer.summary
      assert.deepStrictEqual([count("weights"), count("summary")], [2, 2])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.effect("save writes the trainer's files into the run's directory, the state file last", () =>
    Effect.gen(function*() {
      const files = checkpointFiles.map((f) => [f, new Uint8Array(Buffer.from(`${f}!`))] as const)
      const server = yield* scripted((seen) => (seen.op === "save" ? ok({}, files) : undefined))
      const trainer = yield* connect(server.url)
      const fs = yield* FileSystem.FileSystem
      const dir = `${yield* fs.makeTempDirectoryScoped()}/step-3`
      yield* trainer.save(dir, { policyVersion: 3, rngState: [1, 2] })
      assert.deepStrictEqual(frameOf(server.seen.at(-1)!.body).header["meta"], { policyVersion: 3, rngState: [1, 2] })
      assert.deepStrictEqual((yield* fs.readDirectory(dir)).sort(), [...checkpointFiles].sort())
      for (const file of checkpointFiles) {
        assert.strictEqual(yield* fs.readFileString(`${dir}/${file}`), `${file}!`)
      }
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
})
