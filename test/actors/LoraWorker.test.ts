/**
 * No silent sync on rollout workers: a LoRA run's trainer publishes each version's adapter to `agentfly serve`
 * (behind a proxy) under a name carrying its version and digest; a rollout worker (`RolloutWorker.serve`, sampling
 * through the follower carrier that `agentfly rollout-worker` gives a LoRA run) requests the newest name the server
 * lists and checks every answer's digest against the one that name carries. When the proxy acknowledges a load and
 * keeps the old adapter under the new name, the worker's next batch is caught: every request fails as an
 * `AdapterMismatch`, the trajectories come back to the trainer masked (never training data), and the worker's
 * sampling failures reach the trainer's figures.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import * as Http from "node:http"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as InferenceServers from "../../actors/InferenceServers.ts"
import * as LoraCarrier from "../../actors/internal/loraCarrier.ts"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as RolloutSetup from "../../actors/RolloutSetup.ts"
import * as RolloutWorker from "../../actors/RolloutWorker.ts"
import { task as calculator } from "../../environments/calculator/CalculatorTask.ts"
import type * as Dataset from "../../src/Dataset.ts"
import * as Lora from "../../src/Lora.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Task from "../../src/Task.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"

const rows: ReadonlyArray<Dataset.Row> = Array.from({ length: 2 }, (_, i) => ({
  index: i,
  line: i + 1,
  question: `What is ${i + 2} + ${3 * i}?`,
  fields: { answer: String(i + 2 + 3 * i) }
}))

const settings: Lora.Config = { rank: 2, alpha: 4, targets: ["q_proj", "v_proj"] }

/**
 * A proxy to `target` that, once `lie.on`, passes every adapter load on with the first folder it loaded: the server
 * acknowledges the new name and keeps the old adapter under it.
 */
const proxy = (target: string, lie: { on: boolean }) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ server: Http.Server; url: string }>((resolve) => {
        const folders: Array<string> = []
        const server = Http.createServer(async (req, res) => {
          const chunks: Array<Buffer> = []
          for await (const c of req) chunks.push(c as Buffer)
          let body: string | undefined = req.method === "GET" ? undefined : Buffer.concat(chunks).toString("utf8")
          if (req.url?.endsWith("/load_lora_adapter") && body !== undefined && body !== "{}") {
            const load = JSON.parse(body) as { lora_path: string }
            folders.push(load.lora_path)
            body = JSON.stringify({ ...load, lora_path: lie.on ? folders[0]! : load.lora_path })
          }
          const upstream = await fetch(`${target}${req.url!.replace(/^\/v1/, "")}`, {
            method: req.method!,
            headers: { "content-type": "application/json" },
            ...(body === undefined ? {} : { body })
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

/** A distinct adapter per seed (B nonzero, so that each samples and digests differently). */
const adapterFor = (folder: ModelFolder.ModelFolder, seed: number) => {
  const adapter = Lora.init(folder.config, { ...settings, seed })
  for (const [name, data] of adapter) if (name.endsWith("lora_B.weight")) data.fill(seed / 50)
  return adapter
}

const sampling = { firstSeq: 0, chains: 2, temperature: 0, seed: 7 }

describe("a LoRA run's rollout worker: the adapter digest of every response", () => {
  it.live("is checked on the worker against the published name; a server keeping the old adapter is caught", () =>
    Effect.scoped(Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped({ prefix: "lora-worker-" })
      yield* ModelFolder.init(`${dir}/tiny`, { preset: "tiny", seed: 3 })
      const folder = yield* ModelFolder.load(`${dir}/tiny`)
      const engine = yield* makeEngine({ config: folder.config, weights: folder.weights })
      const serve = yield* OpenAiServer.make(folder, { acceptWeights: {}, loraBase: folder.weights }).pipe(
        Effect.provideService(PolicyEngine, engine)
      )
      const lie = { on: false }
      const front = yield* proxy(serve.baseUrl, lie)
      const parameters = Qwen2.parameters(folder.config)
      // The trainer's side: it publishes the adapters.
      const lora = LoraCarrier.make({
        dir: `${dir}/adapters`,
        name: "policy",
        model: folder.config,
        lora: settings,
        baseModel: `${dir}/tiny`
      })
      const trainer = yield* InferenceServers.make({
        urls: [front.url],
        parameters,
        carrier: lora.carrier,
        model: "policy"
      })
      // The worker's side, as `agentfly rollout-worker` builds it for a LoRA run.
      const workerSide = yield* InferenceServers.make({
        urls: [front.url],
        parameters,
        pushes: false,
        carrier: LoraCarrier.follower("policy"),
        model: "policy",
        restMs: 20,
        giveUpMs: 5_000
      })
      const task = yield* Task.instantiate("calculator", calculator, undefined)
      const config = yield* TrainConfig.decode({
        output: `${dir}/run`,
        model: { path: `${dir}/tiny` },
        data: { train: "train.jsonl" },
        agent: {
          systemPrompt: "Use the calculator tool.",
          renderTools: false,
          numChains: 2,
          maxTurns: 1,
          maxNewTokens: 8
        },
        algorithm: { steps: 1 },
        engine: { servers: [front.url] }
      })
      const agent = yield* RolloutSetup.make({ task, config, format: ChainFormat.ofConfig(config, folder) })
      const worker = yield* RolloutWorker.serve(agent, workerSide)
      const client = yield* RolloutWorker.client({
        urls: [worker.baseUrl],
        agentKey: RolloutWorker.agentKey(task.name, config),
        runId: RolloutWorker.runId(task.name, config)
      })

      // Version 1, loaded as published: the worker's batch is sampled with it and kept.
      lora.set(1, adapterFor(folder, 1))
      yield* trainer.push(1)
      const honest = (yield* client.collect(rows, sampling, 1)).flatMap((g) => g.trajectories)
      assert.lengthOf(honest, 4)
      for (const t of honest) {
        assert.isFalse(t.masked, t.error)
        const policy = t.segments.flatMap((s) => s.spans).filter((s) => s.source === "policy")
        assert.isAbove(policy.length, 0)
        for (const span of policy) assert.strictEqual(span.policyVersion, 1)
      }
      assert.strictEqual((yield* client.figures!)["servers/failures"], 0)

      // Version 2: the server acknowledges its name and keeps version 1's adapter under it.
      lie.on = true
      lora.set(2, adapterFor(folder, 2))
      yield* trainer.push(2)
      const caught = (yield* client.collect(rows, sampling, 2)).flatMap((g) => g.trajectories)
      assert.lengthOf(caught, 4)
      for (const t of caught) {
        // Never training data: masked, ended by the sampler's error, which names both digests.
        assert.isTrue(t.masked)
        assert.strictEqual(t.termination, "error")
        assert.include(t.error, "AdapterMismatch")
        const said = /sampled with adapter version 2 \(digest [0-9a-f]{16}\), not the published version 2/
        assert.match(t.error ?? "", said)
      }
      // Counted where the trainer's figures see them.
      assert.isAbove((yield* client.figures!)["servers/failures"]!, 0)
    }).pipe(Effect.provide([NodeServices.layer, ResourceManager.ResourceManager.layer]))), { timeout: 300_000 })
})
