/**
 * The checkpoint archive route (`actors/tinker/Archives.ts`) and its client (`src/backends/TinkerArchive.ts`), on
 * loopback: a LoRA model's sampler weights come back as the SDK's tar (the three files its CLI insists on), unpacked
 * into a PEFT folder `Lora.load` reads, each save its own adapter; full weights and training checkpoints are refused.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, Redacted } from "effect"
import * as tar from "tar"
import * as Archives from "../../actors/tinker/Archives.ts"
import * as TinkerServer from "../../actors/tinker/TinkerServer.ts"
import * as TinkerArchive from "../../src/backends/TinkerArchive.ts"
import * as TinkerClient from "../../src/backends/TinkerClient.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Lora from "../../src/Lora.ts"
import * as T from "../../src/tinker/Types.ts"
import { base, client, createModel, fbRequest, optimRequest, postFb, sftData } from "./utils.ts"

const step = (c: ReturnType<typeof client>, model: string, seq: number) =>
  Effect.gen(function*() {
    yield* c.done(yield* postFb(c, fbRequest(model, sftData(), seq)), T.ForwardBackwardOutput)
    const opt = yield* c.post("optim_step", T.OptimStepRequest, optimRequest(model, seq + 1), T.UntypedAPIFuture)
    yield* c.done(opt, T.OptimStepResponse)
  })

const save = (c: ReturnType<typeof client>, model: string, name: string) =>
  Effect.gen(function*() {
    const saved = yield* c.post("save_weights_for_sampler", T.SaveWeightsForSamplerRequest, {
      model_id: model,
      path: name,
      type: "save_weights_for_sampler"
    }, T.UntypedAPIFuture)
    return (yield* c.done(saved, T.SaveWeightsForSamplerResponse)).path
  })

/** The names of the entries of the tar file at `file`. */
const entries = (file: string) =>
  Effect.promise(async () => {
    const names: Array<string> = []
    await tar.t({ file, onReadEntry: (e) => void names.push(e.path) })
    return names
  })

describe("Tinker checkpoint archives", () => {
  it.live("a LoRA model's sampler weights: the SDK's tar, unpacked to the adapter of that save", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const tmp = yield* fs.makeTempDirectoryScoped({ prefix: "tinker-archive-" })
      const { baseUrl } = yield* TinkerServer.serve({ bases: [base], pollMillis: 200, apiKeys: ["k1"] })
      const c = client(baseUrl, "k1")
      const { model } = yield* createModel(c, 4)
      yield* step(c, model, 1)
      const v1 = yield* save(c, model, "v1")
      yield* step(c, model, 3)
      const v2 = yield* save(c, model, "v2")
      const fetchInto = (path: string, dir: string) =>
        TinkerArchive.fetchInto(path, dir).pipe(
          Effect.provide(TinkerClient.layer({ baseUrl, apiKey: Redacted.make("k1"), maxRetries: 0 })),
          Effect.provide(NodeHttpClient.layerNodeHttp)
        )
      // The route answers the SDK's `CheckpointArchiveUrlResponse`; its URL is a plain GET (no key) of the tar.
      const route = `training_runs/${model}/checkpoints/sampler_weights/v1/archive`
      const answer = yield* c.raw("GET", route)
      assert.strictEqual(answer.status, 200)
      const { url, expires } = answer.body as T.CheckpointArchiveUrlResponse
      assert.isTrue(Date.parse(expires) > Date.now())
      const bytes = yield* Effect.promise(async () => new Uint8Array(await (await fetch(url)).arrayBuffer()))
      yield* fs.writeFile(`${tmp}/v1.tar`, bytes)
      assert.deepStrictEqual(yield* entries(`${tmp}/v1.tar`), [...Archives.files])
      // Without the key the route is refused (the URL is the capability, not the route).
      assert.strictEqual((yield* client(baseUrl).raw("GET", route)).status, 401)
      // Through the client: PEFT folders `Lora.load` reads, each save its own adapter (a trained one: B is not 0).
      yield* fetchInto(v1, `${tmp}/v1`)
      yield* fetchInto(v2, `${tmp}/v2`)
      const one = yield* Lora.load(`${tmp}/v1`, base.config)
      const two = yield* Lora.load(`${tmp}/v2`, base.config)
      assert.strictEqual(one.config.rank, 4)
      assert.strictEqual(one.config.alpha, 32)
      assert.strictEqual(one.baseModel, base.name)
      const targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
      assert.deepStrictEqual(one.config.targets, targets)
      const trained = [...one.adapter].filter(([name]) => name.endsWith("lora_B.weight"))
      assert.isTrue(trained.some(([, data]) => data.some((x) => x !== 0)))
      assert.notStrictEqual(Checkpoint.fingerprint(one.adapter), Checkpoint.fingerprint(two.adapter))
      // A save is kept as it was: v1 fetched again after v2 is v1's adapter still.
      yield* fetchInto(v1, `${tmp}/v1-again`)
      const again = yield* Lora.load(`${tmp}/v1-again`, base.config)
      assert.strictEqual(Checkpoint.fingerprint(again.adapter), Checkpoint.fingerprint(one.adapter))
      // Refused: training checkpoints, unknown names, full-weights models' sampler weights.
      const refused = (path: string) => Effect.flip(fetchInto(path, `${tmp}/refused`))
      const training = yield* refused(`tinker://${model}/weights/v1`)
      assert.include(training.message, "only sampler weights are archived here")
      assert.include((yield* refused(`tinker://${model}/sampler_weights/v9`)).message, "has no adapter archive")
      const full = (yield* createModel(c)).model
      yield* step(c, full, 1)
      const fullPath = yield* save(c, full, "v1")
      const noAdapter = yield* refused(fullPath)
      assert.strictEqual(noAdapter.reason._tag, "BadRequest")
      assert.include(noAdapter.message, "only a LoRA model's sampler weights have one")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)
})
