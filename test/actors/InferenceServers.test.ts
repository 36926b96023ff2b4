/**
 * Inference servers that follow the learner, on the real parts: `OpenAiServer`s with `acceptWeights` over loopback
 * HTTP, each on its own onnxruntime `PolicyEngine` (tiny Qwen2), and `InferenceServers` pushing weights to them and
 * spreading token-in / token-out requests over them. A pushed version samples exactly what a local engine with the
 * same weights samples; a dead server's requests go to the others and a restarted one is brought up to date before
 * it serves; bad weights, a wrong token and a server that does not accept weights are refused with a sentence.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, FileSystem, Scope } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as InferenceServers from "../../actors/InferenceServers.ts"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Safetensors from "../../src/Safetensors.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import { randomWeights } from "../utils/tinyModel.ts"

const live = Effect.provide(NodeServices.layer)

const folderOf = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-servers-" })}/tiny-servers`
  yield* ModelFolder.init(dir, { preset: "tiny", seed: 3 })
  return yield* ModelFolder.load(dir)
})

/** A server on its own scope (closing it is the server dying), on `port` (0: a free one). */
const startServer = (folder: ModelFolder.ModelFolder, options: OpenAiServer.Options = {}) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const server = yield* Effect.gen(function*() {
      const engine = yield* makeEngine({ config: folder.config, weights: folder.weights })
      return yield* OpenAiServer.make(folder, { acceptWeights: {}, ...options }).pipe(
        Effect.provideService(PolicyEngine, engine)
      )
    }).pipe(Scope.provide(scope))
    return { ...server, close: Scope.close(scope, Exit.void) }
  })

const greedy = (prompt: ReadonlyArray<number>): GenerateRequest => ({
  promptTokenIds: prompt,
  sampling: { temperature: 0, maxTokens: 12 }
})
const prompts = [[10, 20, 30, 40], [7, 7, 7], [100, 3, 55, 2, 9], [42]]

const fetchJson = (url: string, init?: RequestInit) =>
  Effect.promise(async () => {
    const response = await fetch(url, init)
    return { status: response.status, json: (await response.json()) as Record<string, any> }
  })

const versionOf = (baseUrl: string, token?: string) =>
  Effect.map(
    fetchJson(`${baseUrl}/models`, token === undefined ? undefined : { headers: { authorization: `Bearer ${token}` } }),
    (r) => r.json["data"][0].policy_version as number
  )

describe("InferenceServers", () => {
  it.live("pushed weights are the ones the servers sample with; requests spread over the servers", () =>
    live(Effect.scoped(Effect.gen(function*() {
      const folder = yield* folderOf
      const a = yield* startServer(folder)
      const b = yield* startServer(folder)
      const parameters = Qwen2.parameters(folder.config)
      const servers = yield* InferenceServers.make({ urls: [a.baseUrl, `${b.baseUrl}/`], parameters })
      const learned = randomWeights(folder.config, 7)
      yield* servers.push(1, learned)
      assert.deepStrictEqual([yield* versionOf(a.baseUrl), yield* versionOf(b.baseUrl)], [1, 1])

      // What a local engine with the pushed weights samples, and with the folder's (so that the test can fail).
      const local = yield* makeEngine({ config: folder.config, weights: learned, version: 1 })
      const before = yield* makeEngine({ config: folder.config, weights: folder.weights })
      const expected = yield* Effect.forEach(prompts, (p) => local.generate(greedy(p)))
      const old = yield* Effect.forEach(prompts, (p) => before.generate(greedy(p)))
      assert.notDeepEqual(expected.map((r) => r.tokenIds), old.map((r) => r.tokenIds))

      const sampler = servers.sampler(1)
      const got = yield* Effect.forEach([...prompts, ...prompts, ...prompts], (p) => sampler.generate(greedy(p)), {
        concurrency: "unbounded"
      })
      for (const [i, r] of got.entries()) {
        assert.deepStrictEqual(r.tokenIds, expected[i % prompts.length]!.tokenIds)
        assert.strictEqual(r.policyVersion, 1)
        for (const [k, lp] of r.logprobs.entries()) assert.closeTo(lp, expected[i % prompts.length]!.logprobs[k]!, 1e-4)
      }
      const status = yield* servers.status
      assert.deepStrictEqual(status.map((s) => s.version), [1, 1])
      assert.isTrue(status.every((s) => s.served >= 3), JSON.stringify(status))
      assert.strictEqual(status[0]!.served + status[1]!.served, 12)
    }))), { timeout: 300_000 })

  it.live(
    "a dead server's requests go to the others; a restarted one catches up before it serves; none left fails",
    () =>
      live(Effect.scoped(Effect.gen(function*() {
        const folder = yield* folderOf
        const a = yield* startServer(folder)
        let b = yield* startServer(folder)
        const servers = yield* InferenceServers.make({
          urls: [a.baseUrl, b.baseUrl],
          parameters: Qwen2.parameters(folder.config),
          restMs: 100,
          giveUpMs: 1_500
        })
        yield* servers.push(1, randomWeights(folder.config, 7))
        yield* b.close
        const first = yield* Effect.forEach(prompts, (p) => servers.sampler(1).generate(greedy(p)), {
          concurrency: "unbounded"
        })
        assert.isTrue(first.every((r) => r.policyVersion === 1))
        let status = yield* servers.status
        assert.isAbove(status[1]!.failures, 0)
        assert.match(status[1]!.lastError!, /Transport|ECONNREFUSED|fetch failed/)

        // The learner goes on: version 2 reaches the live server, the dead one missed it.
        const v2 = randomWeights(folder.config, 8)
        yield* servers.push(2, v2)
        assert.strictEqual(yield* versionOf(a.baseUrl), 2)

        // Restarted on its port with the folder's weights (another run's version 0): it must not serve version 2
        // requests with those, and it takes version 2 before it serves again.
        b = yield* startServer(folder, { port: b.port })
        assert.strictEqual(yield* versionOf(b.baseUrl), 0)
        const local = yield* makeEngine({ config: folder.config, weights: v2, version: 2 })
        const expected = yield* local.generate(greedy(prompts[0]!))
        for (let round = 0; round < 400 && (yield* servers.status)[1]!.served === 0; round++) {
          yield* Effect.sleep(50)
          const rs = yield* Effect.forEach(prompts, () => servers.sampler(2).generate(greedy(prompts[0]!)), {
            concurrency: "unbounded"
          })
          for (const r of rs) assert.deepStrictEqual(r.tokenIds, expected.tokenIds)
        }
        status = yield* servers.status
        assert.strictEqual(status[1]!.version, 2)
        assert.isAbove(status[1]!.served, 0)
        assert.strictEqual(yield* versionOf(b.baseUrl), 2)

        // Restarted between two requests, without missing a push: the run believes it holds version 2, so only the
        // server's own check (409 below the asked version) keeps its folder weights from sampling; then it catches up.
        yield* b.close
        b = yield* startServer(folder, { port: b.port })
        const served = (yield* servers.status)[1]!.served
        for (let round = 0; round < 400 && (yield* servers.status)[1]!.served === served; round++) {
          yield* Effect.sleep(50)
          const rs = yield* Effect.forEach(prompts, () => servers.sampler(2).generate(greedy(prompts[0]!)), {
            concurrency: "unbounded"
          })
          for (const r of rs) assert.deepStrictEqual(r.tokenIds, expected.tokenIds)
        }
        assert.isAbove((yield* servers.status)[1]!.served, served)
        assert.strictEqual(yield* versionOf(b.baseUrl), 2)

        // No server left: a push fails naming them, and a request fails (typed) once it has waited `giveUpMs`.
        yield* a.close
        yield* b.close
        const push = yield* Effect.flip(servers.push(3, v2))
        assert.strictEqual(push.reason._tag, "Servers")
        assert.include(push.message, "no inference server took policy version 3")
        assert.include(push.message, a.baseUrl)
        const request = yield* Effect.flip(servers.sampler(2).generate(greedy([1, 2, 3])))
        assert.strictEqual(request.reason._tag, "Transport")
        assert.include(request.message, b.baseUrl)
      }))), { timeout: 300_000 }
  )

  it.live("a request waits for a slow answer as long as its limit (engine.timeoutSeconds) allows, and not longer", () =>
    live(Effect.scoped(Effect.gen(function*() {
      const folder = yield* folderOf
      const a = yield* startServer(folder)
      // In front of the server, a proxy that holds every completion 1.2 s: a long answer of a busy server.
      const proxy = yield* Effect.acquireRelease(
        Effect.callback<Http.Server>((resume) => {
          const server = Http.createServer(async (req, res) => {
            const chunks: Array<Buffer> = []
            for await (const chunk of req) chunks.push(chunk as Buffer)
            if (req.url!.includes("completions")) await new Promise((r) => setTimeout(r, 1_200))
            const reply = await fetch(`${a.baseUrl}${req.url!.replace(/^\/v1/, "")}`, {
              method: req.method!,
              headers: { "content-type": "application/json" },
              ...(req.method === "GET" ? {} : { body: Buffer.concat(chunks) })
            })
            res.writeHead(reply.status, { "content-type": reply.headers.get("content-type") ?? "application/json" })
            res.end(Buffer.from(await reply.arrayBuffer()))
          })
          server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
        }),
        (server) => Effect.sync(() => server.close())
      )
      const url = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}/v1`
      const parameters = Qwen2.parameters(folder.config)
      const pusher = yield* InferenceServers.make({ urls: [a.baseUrl], parameters })
      yield* pusher.push(1, randomWeights(folder.config, 7))
      const patient = yield* InferenceServers.make({ urls: [url], parameters, pushes: false, timeoutMs: 5_000 })
      const started = Date.now()
      const answer = yield* patient.sampler(1).generate(greedy(prompts[0]!))
      assert.isAtLeast(Date.now() - started, 1_200)
      assert.strictEqual(answer.policyVersion, 1)
      const hasty = yield* InferenceServers.make({
        urls: [url],
        parameters,
        pushes: false,
        timeoutMs: 400,
        giveUpMs: 1_000,
        restMs: 100
      })
      const cut = yield* Effect.flip(hasty.sampler(1).generate(greedy(prompts[0]!)))
      assert.include(cut.message, "no inference server could serve policy version ≥ 1")
      assert.include(cut.message, "in 400 ms")
    }))), { timeout: 300_000 })

  it.live("bad weights, a stale version, a wrong token and a server that takes no weights are refused", () =>
    live(Effect.scoped(Effect.gen(function*() {
      const folder = yield* folderOf
      const parameters = Qwen2.parameters(folder.config)
      const open = yield* startServer(folder, { acceptWeights: undefined })
      const locked = yield* startServer(folder, { acceptWeights: { token: "s3cret" } })
      const plain = yield* startServer(folder)
      const bytesOf = (weights: ReadonlyMap<string, Float32Array>, only = parameters) =>
        Safetensors.serialize(only.map((p) => ({ name: p.name, shape: p.shape, data: weights.get(p.name)! })))
      const put = (url: string, body: Uint8Array, version: string, headers: Record<string, string> = {}) =>
        fetchJson(`${url}/weights`, {
          method: "PUT",
          headers: { "x-policy-version": version, "x-run-id": "run-a", ...headers },
          body: body as Uint8Array<ArrayBuffer>
        })
      const good = bytesOf(randomWeights(folder.config, 7))

      // A server started without accepting weights, and a wrong token: refused when the run connects, before it
      // trains anything, naming the fix.
      const notAccepted = yield* Effect.flip(InferenceServers.make({ urls: [open.baseUrl], parameters }))
      assert.strictEqual(notAccepted.reason._tag, "Servers")
      assert.match(
        notAccepted.message,
        /cannot follow this run's learner: it does not take weights \(HTTP 404: .*start it with --accept-weights/
      )
      const before = yield* versionOf(locked.baseUrl, "s3cret")
      const wrongToken = yield* Effect.flip(
        InferenceServers.make({ urls: [locked.baseUrl], parameters, token: "guess" })
      )
      assert.include(wrongToken.message, "it refuses this run's token")
      assert.include(wrongToken.message, "set AGENTFLY_WEIGHTS_TOKEN")
      assert.strictEqual(yield* versionOf(locked.baseUrl, "s3cret"), before, "the probe changed nothing")
      const withToken = yield* InferenceServers.make({ urls: [locked.baseUrl], parameters, token: "s3cret" })
      yield* withToken.push(5, folder.weights)
      assert.strictEqual(yield* versionOf(locked.baseUrl, "s3cret"), 5)
      // A rollout worker only samples (the run pushes): it is not asked whether the server takes its weights, but
      // the weights token guards every route of the server (folded in), so it samples only with it.
      const sampling = yield* InferenceServers.make({
        urls: [locked.baseUrl],
        parameters,
        pushes: false,
        token: "s3cret"
      })
      const sampled = yield* sampling.sampler(5).generate(greedy(prompts[0]!))
      assert.strictEqual(sampled.policyVersion, 5)
      const stranger = yield* Effect.flip(InferenceServers.make({ urls: [locked.baseUrl], parameters, pushes: false }))
      assert.include(stranger.message, "HTTP 401")

      // Bodies that are not the model's weights: 400 with the reason, and the server keeps what it had.
      const garbage = yield* put(plain.baseUrl, new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8, 9]), "1")
      assert.strictEqual(garbage.status, 400)
      const short = yield* put(plain.baseUrl, bytesOf(folder.weights, parameters.slice(1)), "1")
      assert.strictEqual(short.status, 400)
      assert.include(short.json["error"].message, parameters[0]!.name)
      const nan = randomWeights(folder.config, 7)
      nan.get(parameters[2]!.name)![3] = Number.NaN
      const notFinite = yield* put(plain.baseUrl, bytesOf(nan), "1")
      assert.strictEqual(notFinite.status, 400)
      assert.include(notFinite.json["error"].message, "not finite")
      const noVersion = yield* put(plain.baseUrl, good, "one")
      assert.strictEqual(noVersion.status, 400)
      assert.strictEqual(yield* versionOf(plain.baseUrl), 0)

      // Within a run versions increase; another run's push replaces the weights whatever its version.
      assert.strictEqual((yield* put(plain.baseUrl, good, "7")).status, 200)
      const stale = yield* put(plain.baseUrl, good, "7")
      assert.strictEqual(stale.status, 409)
      assert.strictEqual(stale.json["error"].code, "stale_policy_version")
      assert.strictEqual((yield* put(plain.baseUrl, good, "-3", { "x-run-id": "run-b" })).status, 200)
      assert.strictEqual(yield* versionOf(plain.baseUrl), -3)

      // A request for newer weights than the server holds is refused, not sampled with older ones.
      const behind = yield* fetchJson(`${plain.baseUrl}/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 2, min_policy_version: 0 })
      })
      assert.strictEqual(behind.status, 409)
      assert.strictEqual(behind.json["error"].code, "policy_version_behind")
      const fine = yield* fetchJson(`${plain.baseUrl}/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 2, min_policy_version: -3 })
      })
      assert.strictEqual(fine.status, 200)
      assert.strictEqual(fine.json["policy_version"], -3)

      // A server that is not there at the start is named.
      const absent = yield* Effect.flip(InferenceServers.make({ urls: ["http://127.0.0.1:9/v1"], parameters }))
      assert.match(absent.message, /inference server http:\/\/127\.0\.0\.1:9\/v1 did not answer GET \/models/)
    }))), { timeout: 300_000 })
})
