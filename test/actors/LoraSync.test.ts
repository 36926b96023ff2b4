/**
 * No silent sync: a LoRA run publishes each version's adapter to `agentfly serve` over vLLM's load endpoint and
 * checks every sampled response's adapter digest. A server that acknowledges a load and keeps the old adapter (a
 * proxy here that answers the load itself and forwards everything else) is caught at the next batch, counted, and
 * the run is stopped when it persists.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import * as Http from "node:http"
import * as AdapterSync from "../../actors/AdapterSync.ts"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import * as OpenAiCompatSampler from "../../src/backends/OpenAiCompatSampler.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as Lora from "../../src/Lora.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Sampling from "../../src/Sampling.ts"

const settings: Lora.Config = { rank: 2, alpha: 4, targets: ["q_proj", "v_proj"] }

const adapterFor = (folder: ModelFolder.ModelFolder, seed: number) => {
  const adapter = Lora.init(folder.config, { ...settings, seed })
  const r = Sampling.rng(seed)
  for (const [name, data] of adapter) {
    if (name.endsWith("lora_B.weight")) for (let i = 0; i < data.length; i++) data[i] = Sampling.normal(r) * 0.1
  }
  return adapter
}

/** A proxy to `target` that acknowledges every adapter load without passing it on: the silent-sync bug. */
const lyingProxy = (target: string) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ server: Http.Server; url: string }>((resolve) => {
        const server = Http.createServer(async (req, res) => {
          const chunks: Array<Buffer> = []
          for await (const c of req) chunks.push(c as Buffer)
          if (req.url?.endsWith("/load_lora_adapter")) {
            res.writeHead(200, { "content-type": "application/json" }).end("{}")
            return
          }
          const upstream = await fetch(`${target}${req.url!.replace(/^\/v1/, "")}`, {
            method: req.method!,
            headers: { "content-type": "application/json" },
            ...(req.method === "GET" ? {} : { body: Buffer.concat(chunks) })
          })
          res.writeHead(upstream.status, { "content-type": "application/json" }).end(await upstream.text())
        })
        server.listen(0, "127.0.0.1", () => {
          const port = (server.address() as { port: number }).port
          resolve({ server, url: `http://127.0.0.1:${port}/v1` })
        })
      })
    ),
    ({ server }) => Effect.promise(() => new Promise<void>((resolve) => server.close(() => resolve())))
  )

const sample = (url: string) =>
  Effect.promise(() =>
    fetch(`${url}/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "policy", prompt: [10, 20, 30], max_tokens: 4, temperature: 0 })
    }).then((r) => r.json() as Promise<unknown>)
  )

describe("AdapterSync", () => {
  it.live("a server that acknowledges a load and keeps the old adapter is caught at the next batch", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const root = yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-lora-sync-" })
      yield* ModelFolder.init(`${root}/tiny`, { preset: "tiny", seed: 3 })
      const folder = yield* ModelFolder.load(`${root}/tiny`)
      const engine = yield* makeEngine({ config: folder.config, weights: folder.weights })
      const server = yield* OpenAiServer.make(folder, { acceptWeights: {}, loraBase: folder.weights }).pipe(
        Effect.provideService(PolicyEngine, engine)
      )
      const proxy = yield* lyingProxy(server.baseUrl)
      const common = {
        dir: `${root}/adapters`,
        name: "policy",
        model: folder.config,
        lora: settings,
        baseModel: "tiny"
      }

      // Version 1 reaches the server; the honest path checks clean.
      const v1 = yield* AdapterSync.publish({
        ...common,
        urls: [server.baseUrl],
        version: 1,
        adapter: adapterFor(folder, 1)
      })
      assert.isAbove(v1.bytes, 0)
      const tracker = AdapterSync.makeTracker(2)
      assert.deepStrictEqual(yield* tracker.batch(v1, [yield* sample(proxy.url), yield* sample(server.baseUrl)]), [])

      // Version 2 is "loaded" through the lying proxy: acknowledged, never delivered.
      const v2 = yield* AdapterSync.publish({
        ...common,
        urls: [proxy.url],
        version: 2,
        adapter: adapterFor(folder, 2)
      })
      assert.notStrictEqual(v2.digest, v1.digest)
      const caught = yield* tracker.batch(v2, [yield* sample(proxy.url), yield* sample(proxy.url)])
      assert.strictEqual(caught.length, 2)
      assert.strictEqual(caught[0]!._tag, "AdapterMismatch")
      assert.strictEqual(caught[0]!.expectedVersion, 2)
      assert.strictEqual(caught[0]!.gotVersion, 1)
      assert.strictEqual(caught[0]!.gotDigest, v1.digest)
      assert.include(caught[0]!.message, "not the published version 2")
      assert.strictEqual(tracker.mismatches(), 2)

      // It persists: the second mismatched batch in a row stops the run.
      const lost = yield* Effect.flip(tracker.batch(v2, [yield* sample(proxy.url)]))
      assert.strictEqual(lost._tag, "SyncLost")
      assert.strictEqual(lost.mismatches, 3)

      // The run's sampler returns the adapter a response names (its digest checked by the run's carrier), and
      // nothing for the base: a full-weights response carries no adapter and nothing is checked.
      const samplerOf = (model: string) =>
        OpenAiCompatSampler.make({ baseUrl: server.baseUrl, model, retries: 0 }).pipe(
          Effect.provide(NodeHttpClient.layerNodeHttp)
        )
      const request = { promptTokenIds: [10, 20, 30], sampling: { temperature: 0, maxTokens: 4 } }
      const adapted = yield* (yield* samplerOf("policy")).generate(request)
      assert.deepStrictEqual(adapted.adapter, { name: "policy", digest: v1.digest, policyVersion: 1 })
      assert.strictEqual(adapted.policyVersion, 1)
      const base = yield* (yield* samplerOf(folder.name)).generate(request)
      assert.isFalse("adapter" in base)

      // A response that names no adapter (a server without LoRA) is a mismatch too.
      const none = AdapterSync.check(v2, { choices: [] })
      assert.isTrue(none?.message.startsWith("a response was sampled with no adapter"))
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 120_000)
})
