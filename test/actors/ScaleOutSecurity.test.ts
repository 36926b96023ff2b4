/**
 * Issue 40's findings against the three endpoints, each over real HTTP on 127.0.0.1 (the `openai` SDK where a client
 * would use it): the trainer server lists nothing, runs nothing and tells no right session from a wrong one without
 * its token, hands out random session ids, answers `%ZZ` with 400 and sends a run's weights only to servers its own
 * pushes named; `agentfly serve` guards sampling as well as weights; the gateway keeps one client out of another's
 * episodes, bounds open episodes (429) and refuses a 10 GB `Content-Length` without reading it; and none of them
 * listens beyond loopback without a token.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Cause, Effect, Exit, FileSystem } from "effect"
import * as Http from "node:http"
import * as net from "node:net"
import OpenAI from "openai"
import * as Gateway from "../../actors/Gateway.ts"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as TrainerServer from "../../actors/TrainerServer.ts"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as Wire from "../../src/backends/internal/trainerWire.ts"
import * as RemoteTrainer from "../../src/backends/RemoteTrainer.ts"
import * as Loss from "../../src/Loss.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Optimizer from "../../src/Optimizer.ts"
import { tinyConfig } from "../utils/tinyModel.ts"
import { scriptedEngine } from "../utils/scriptedEngine.ts"
import { format, scriptedSampler } from "./gateway/fixtures.ts"

const config = tinyConfig({ vocabSize: 32, hiddenSize: 32, numHiddenLayers: 2, intermediateSize: 64 })
const model = OnnxTrainer.qwen2(config)
const weights = Qwen2.initWeights(config, 3)
const settings = { weights, loss: Loss.grpo, optimizer: Optimizer.defaultConfig, schedule: LrSchedule.constant(1e-3) }

interface Answer {
  readonly status: number
  readonly headers: Http.IncomingHttpHeaders
  readonly text: string
}

/** One request over a fresh connection (no keep-alive), its answer read whole. */
const send = (
  url: string,
  init: { method?: string; headers?: Record<string, string>; body?: Uint8Array | string } = {}
) =>
  Effect.callback<Answer>((resume) => {
    const req = Http.request(
      url,
      { method: init.method ?? "GET", headers: init.headers ?? {}, agent: false },
      (res) => {
        const chunks: Array<Buffer> = []
        res.on("data", (c: Buffer) => chunks.push(c))
        res.on(
          "end",
          () =>
            resume(
              Effect.succeed({
                status: res.statusCode!,
                headers: res.headers,
                text: Buffer.concat(chunks).toString("latin1")
              })
            )
        )
      }
    )
    req.on("error", (e) => resume(Effect.die(e)))
    req.end(init.body)
  })

/**
 * Headers announcing a 10 GB body, then one byte of it: the answer, and whether the server then closed the connection
 * (it must, rather than wait for, or drain, the other 10 GB).
 */
const hugeBody = (port: number, path: string, extra = "") =>
  Effect.callback<{ readonly head: string; readonly closed: boolean }>((resume) => {
    const socket = net.connect(port, "127.0.0.1")
    let data = ""
    socket.on("data", (c: Buffer) => void (data += c.toString()))
    socket.on("end", () => {
      socket.destroy()
      resume(Effect.succeed({ head: data, closed: true }))
    })
    socket.on("error", () => resume(Effect.succeed({ head: data, closed: true })))
    socket.write(
      `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n${extra}` +
        `Content-Length: 10737418240\r\n\r\n{`
    )
  })

/** A weights server that records the PUTs it gets (a stand-in for `agentfly serve`, or an attacker's server). */
const recorder = Effect.acquireRelease(
  Effect.callback<{ readonly url: string; readonly puts: Array<number>; readonly server: Http.Server }>((resume) => {
    const puts: Array<number> = []
    const server = Http.createServer((req, res) => {
      let size = 0
      req.on("data", (c: Buffer) => void (size += c.length))
      req.on("end", () => {
        if (req.method === "PUT") puts.push(size)
        res.writeHead(200, { "content-type": "application/json" })
        res.end("{}")
      })
    })
    server.listen(
      0,
      "127.0.0.1",
      () =>
        resume(
          Effect.succeed({ url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}/v1`, puts, server })
        )
    )
  }),
  ({ server }) => Effect.sync(() => server.close())
)

const dies = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.map(Effect.exit(effect), (exit) => Exit.isFailure(exit) ? Cause.pretty(exit.cause) : "it started")

const initFrame = Wire.encode(
  {
    model: ModelConfig.toJson(config),
    loss: settings.loss,
    optimizer: settings.optimizer,
    schedule: settings.schedule,
    workers: 1
  },
  model.parameters.map((p) => [p.name, weights.get(p.name)!] as const)
)

describe("trainer server", () => {
  it.live("without its token: 401 for every route before any state is told or touched", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TrainerServer.serve({ token: "trainer-secret" })
      const auth = { authorization: "Bearer trainer-secret" }
      const opened = yield* send(`${baseUrl}/trainer/policy/init`, { method: "POST", headers: auth, body: initFrame })
      assert.strictEqual(opened.status, 200)
      const session = Wire.decode(Buffer.from(opened.text, "latin1"))
      // The listing, a numbered call with a huge sequence number on the right session and on a wrong one, an init
      // that would replace the run's trainer, a close, an unknown route: all the same 401.
      const right = typeof session === "string" ? "" : String(session.header["session"])
      const strangers = [
        send(`${baseUrl}/trainer`),
        send(`${baseUrl}/trainer`, { headers: { authorization: "Bearer trainer-secreT" } }),
        send(`${baseUrl}/trainer/policy/optim_step`, {
          method: "POST",
          headers: { "x-agentfly-session": right, "x-agentfly-seq": "999999" },
          body: Wire.encode({})
        }),
        send(`${baseUrl}/trainer/policy/optim_step`, {
          method: "POST",
          headers: { "x-agentfly-session": "policy-1-guess", "x-agentfly-seq": "999999" },
          body: Wire.encode({})
        }),
        send(`${baseUrl}/trainer/policy/init`, { method: "POST", body: initFrame }),
        send(`${baseUrl}/trainer/policy/close`, {
          method: "POST",
          headers: { "x-agentfly-session": right, "x-agentfly-seq": "0" }
        }),
        send(`${baseUrl}/nothing-here`)
      ]
      for (const answer of yield* Effect.all(strangers)) {
        assert.strictEqual(answer.status, 401, answer.text)
        assert.include(answer.text, "unauthorized")
        // The body is not read for a stranger, nor drained: the connection closes.
        assert.strictEqual(answer.headers.connection, "close")
        assert.notInclude(answer.text, "policy")
      }
      // The run's trainer is still there, with its session.
      const listed = yield* send(`${baseUrl}/trainer`, { headers: auth })
      assert.deepStrictEqual(JSON.parse(listed.text).trainers, ["policy"])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("session ids are 128 random bits; %ZZ in a URL is a 400; a 10 GB body is refused unread", () =>
    Effect.gen(function*() {
      const { baseUrl, port } = yield* TrainerServer.serve()
      const sessions: Array<string> = []
      for (let i = 0; i < 3; i++) {
        const opened = yield* send(`${baseUrl}/trainer/policy/init`, { method: "POST", body: initFrame })
        const frame = Wire.decode(Buffer.from(opened.text, "latin1"))
        assert.notStrictEqual(typeof frame, "string")
        sessions.push(String((frame as Wire.Frame).header["session"]))
      }
      for (const s of sessions) assert.match(s, /^[0-9a-f]{32}$/)
      assert.strictEqual(new Set(sessions).size, 3)
      const bad = yield* send(`${baseUrl}/trainer/%ZZ/step`, { method: "POST", body: Wire.encode({}) })
      assert.strictEqual(bad.status, 400)
      assert.include(bad.text, "invalid_request")
      const huge = yield* hugeBody(port, "/v1/trainer/policy/init")
      assert.match(huge.head, /^HTTP\/1\.1 413/)
      assert.match(huge.head, /connection: close/i)
      assert.isTrue(huge.closed)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("catch_up sends the weights only to servers a push named; an allow-list bounds pushes", () =>
    Effect.gen(function*() {
      const { baseUrl } = yield* TrainerServer.serve({ token: "t" })
      const own = yield* recorder
      const evil = yield* recorder
      const there = yield* RemoteTrainer.make({
        ...settings,
        url: baseUrl,
        model: config,
        parameters: model.parameters,
        workers: 1,
        token: "t"
      })
      const push = { version: 1, runId: "run-1", timeoutMs: 5_000 }
      assert.deepStrictEqual(yield* there.push(push, [own.url]), [undefined])
      assert.deepStrictEqual(yield* there.catchUp(push, [own.url]), [undefined])
      const refused = yield* Effect.flip(there.catchUp(push, [evil.url]))
      assert.include(refused.message, "not a server this trainer pushed to")
      assert.strictEqual(evil.puts.length, 0)
      assert.strictEqual(own.puts.length, 2)

      const allowed = yield* TrainerServer.serve({ allowPushUrls: [own.url] })
      const bounded = yield* RemoteTrainer.make({
        ...settings,
        url: allowed.baseUrl,
        model: config,
        parameters: model.parameters,
        workers: 1
      })
      const outside = yield* Effect.flip(bounded.push(push, [evil.url]))
      assert.include(outside.message, "not an allowed inference server")
      assert.strictEqual(evil.puts.length, 0)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("a non-loopback host without a token is refused at start", () =>
    Effect.gen(function*() {
      const message = yield* dies(TrainerServer.serve({ host: "0.0.0.0" }))
      assert.include(message, "refusing to listen on 0.0.0.0 without a token")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
})

const tinyFolder = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-security-" })}/tiny-test`
  yield* ModelFolder.init(dir, { preset: "tiny", seed: 3 })
  return yield* ModelFolder.load(dir)
})

describe("agentfly serve", () => {
  it.live("sampling needs the token as much as the weights do; only the weights token replaces weights", () =>
    Effect.gen(function*() {
      const folder = yield* tinyFolder
      let generated = 0
      const engine = scriptedEngine(folder, () =>
        Effect.sync(() => {
          generated++
          return { tokenIds: [65, 66], logprobs: [-1, -1], finishReason: "length" as const, policyVersion: 9 }
        }))
      const server = yield* OpenAiServer.make(folder, { token: "serve-secret", acceptWeights: { token: "w-secret" } })
        .pipe(Effect.provideService(PolicyEngine, engine))
      const ask = (apiKey: string) =>
        Effect.tryPromise(() =>
          new OpenAI({ baseURL: server.baseUrl, apiKey, maxRetries: 0 }).completions.create({
            model: folder.name,
            prompt: "hello",
            max_tokens: 2
          })
        )
      const stranger = yield* Effect.flip(ask("guess"))
      assert.strictEqual((stranger.cause as { status?: number }).status, 401)
      assert.strictEqual(generated, 0)
      assert.strictEqual((yield* ask("serve-secret")).choices.length, 1)
      assert.strictEqual((yield* ask("w-secret")).choices.length, 1)
      assert.strictEqual((yield* send(`${server.baseUrl}/models`)).status, 401)
      assert.strictEqual((yield* send(`${server.baseUrl}/nowhere`)).status, 401)
      // A sampling client cannot replace the weights; the weights token gets past the token check (to the body's).
      const put = (token: string) =>
        send(`${server.baseUrl}/weights`, {
          method: "PUT",
          headers: { authorization: `Bearer ${token}`, "x-policy-version": "1" },
          body: "not weights"
        })
      assert.strictEqual((yield* put("serve-secret")).status, 401)
      assert.strictEqual((yield* put("w-secret")).status, 400)
      const message = yield* dies(OpenAiServer.make(folder, { host: "0.0.0.0" }).pipe(
        Effect.provideService(PolicyEngine, engine)
      ))
      assert.include(message, "refusing to listen on 0.0.0.0 without a token")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)
})

describe("gateway", () => {
  const serving = (options: Partial<Gateway.Options> = {}) =>
    Effect.gen(function*() {
      return yield* Gateway.make({
        tokens: ["alice-token", "bob-token"],
        autoOpen: {
          episode: {
            format,
            sampler: yield* scriptedSampler(),
            sampling: { temperature: 1, maxTokens: 64 },
            requestSampling: "honour",
            maxContextTokens: 400,
            renderTools: false
          },
          onEnd: () => Effect.void
        },
        ...options
      })
    })

  const chat = (baseURL: string, apiKey: string) =>
    Effect.tryPromise(() =>
      new OpenAI({ baseURL, apiKey, maxRetries: 0 }).chat.completions.create({
        model: "any",
        messages: [{ role: "user", content: "What is 2+3?" }]
      })
    )

  it.live("one client cannot read, use or reward another's episode; a stranger gets 401 everywhere", () =>
    Effect.gen(function*() {
      const gateway = yield* serving()
      const episode = `${gateway.url}/episodes/e1`
      yield* chat(`${episode}/v1`, "alice-token")
      const as = (token: string | undefined) => token === undefined ? {} : { authorization: `Bearer ${token}` }
      // Bob: the episode is as unknown to him as a missing one, and his request opens nothing under its id.
      const read = yield* send(episode, { headers: as("bob-token") })
      assert.strictEqual(read.status, 404)
      assert.notInclude(read.text, "What is")
      const reward = yield* send(`${episode}/reward`, {
        method: "POST",
        headers: { ...as("bob-token"), "content-type": "application/json" },
        body: JSON.stringify({ reward: 1e6 })
      })
      assert.strictEqual(reward.status, 404)
      const used = yield* Effect.flip(chat(`${episode}/v1`, "bob-token"))
      assert.strictEqual((used.cause as { status?: number }).status, 404)
      // Nobody: 401, the route or the episode unknown or not.
      for (const path of ["/episodes/e1", "/episodes/nope", "/v1/models", "/nowhere"]) {
        assert.strictEqual((yield* send(`${gateway.url}${path}`)).status, 401, path)
      }
      const stranger = yield* Effect.flip(chat(`${episode}/v1`, "guess"))
      assert.strictEqual((stranger.cause as { status?: number }).status, 401)
      // Alice: her episode, untouched by the others.
      const own = JSON.parse((yield* send(episode, { headers: as("alice-token") })).text)
      assert.strictEqual(own.requests, 1)
      assert.isNull(own.reward)
    }).pipe(Effect.scoped), 300_000)

  it.live("open episodes are bounded: past the limit a new one is 429 until one ends", () =>
    Effect.gen(function*() {
      const gateway = yield* serving({ maxEpisodes: 2 })
      yield* chat(`${gateway.url}/episodes/a/v1`, "alice-token")
      yield* chat(`${gateway.url}/episodes/b/v1`, "bob-token")
      const third = yield* Effect.flip(chat(`${gateway.url}/episodes/c/v1`, "alice-token"))
      assert.strictEqual((third.cause as { status?: number }).status, 429)
      assert.strictEqual((yield* gateway.stats).episodes, 2)
      const ended = yield* send(`${gateway.url}/episodes/a/end`, {
        method: "POST",
        headers: { authorization: "Bearer alice-token" }
      })
      assert.strictEqual(ended.status, 200)
      // The end runs on its own fiber: the next request sees the place free once it has.
      while ((yield* gateway.stats).episodes === 2) yield* Effect.yieldNow
      yield* chat(`${gateway.url}/episodes/c/v1`, "alice-token")
      // An ended id: its client is told it ended (409); another client learns nothing of it (404).
      const again = yield* Effect.flip(chat(`${gateway.url}/episodes/a/v1`, "alice-token"))
      assert.strictEqual((again.cause as { status?: number }).status, 409)
      const other = yield* Effect.flip(chat(`${gateway.url}/episodes/a/v1`, "bob-token"))
      assert.strictEqual((other.cause as { status?: number }).status, 404)
    }).pipe(Effect.scoped), 300_000)

  it.live(
    "a 10 GB Content-Length is refused before a byte is buffered, and the connection closed",
    () =>
      Effect.gen(function*() {
        const gateway = yield* serving()
        const huge = yield* hugeBody(
          gateway.port,
          "/episodes/e/v1/chat/completions",
          "Authorization: Bearer bob-token\r\n"
        )
        assert.match(huge.head, /^HTTP\/1\.1 413/)
        assert.match(huge.head, /connection: close/i)
        assert.isTrue(huge.closed)
        // Without a token: 401 before the body, closed too.
        const stranger = yield* hugeBody(gateway.port, "/episodes/e/v1/chat/completions")
        assert.match(stranger.head, /^HTTP\/1\.1 401/)
        assert.isTrue(stranger.closed)
        assert.strictEqual((yield* gateway.stats).episodes, 0)
        const message = yield* dies(Gateway.make({ host: "0.0.0.0" }))
        assert.include(message, "refusing to listen on 0.0.0.0 without a token")
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "a training run's episodes are reached only at the URLs its agents are given, not at a guessable id",
    () =>
      Effect.gen(function*() {
        const gateway = yield* Gateway.make({ privateEpisodes: true })
        const episode = yield* gateway.open({
          id: "run1-g0-c0",
          groupId: "run1-g0",
          format,
          sampler: yield* scriptedSampler(),
          sampling: { temperature: 1, maxTokens: 64 },
          requestSampling: "cap"
        })
        assert.match(episode.baseURL, /\/episodes\/run1-g0-c0~[0-9a-f]{32}\/v1$/)
        assert.strictEqual(episode.id, "run1-g0-c0")
        const guessed = `${gateway.url}/episodes/run1-g0-c0`
        const stranger = yield* Effect.flip(chat(`${guessed}/v1`, "any"))
        assert.strictEqual((stranger.cause as { status?: number }).status, 404)
        const json = { "content-type": "application/json" }
        const posted = (url: string) =>
          send(url, { method: "POST", headers: json, body: JSON.stringify({ reward: 1e6 }) })
        assert.strictEqual((yield* posted(`${guessed}/reward`)).status, 404)
        assert.strictEqual((yield* send(guessed)).status, 404)
        assert.isUndefined(episode.posted())
        // The agent, with its URLs: served, and its reward taken.
        yield* chat(episode.baseURL, "any")
        assert.strictEqual((yield* posted(episode.rewardURL)).status, 200)
        assert.strictEqual(episode.posted()?.reward, 1e6)
        assert.strictEqual(episode.recorder.requests, 1)
      }).pipe(Effect.scoped),
    60_000
  )
})
