/**
 * `agentfly serve`'s LoRA endpoints, as vLLM documents them: `POST /v1/load_lora_adapter` / `unload_lora_adapter`
 * with `{ lora_name, lora_path }`, requests naming the adapter as their model, and the adapter's digest in every
 * response sampled with it.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Lora from "../../src/Lora.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Sampling from "../../src/Sampling.ts"

const settings: Lora.Config = { rank: 4, alpha: 8, targets: ["q_proj", "v_proj", "up_proj", "down_proj"] }

/** A trained-looking adapter: `B` non-zero and large enough to change greedy tokens. */
const adapterFor = (folder: ModelFolder.ModelFolder, seed: number) => {
  const adapter = Lora.init(folder.config, { ...settings, seed })
  const r = Sampling.rng(seed)
  for (const [name, data] of adapter) {
    if (name.endsWith("lora_B.weight")) for (let i = 0; i < data.length; i++) data[i] = Sampling.normal(r) * 0.5
  }
  return adapter
}

const call = (url: string, body: unknown) =>
  Effect.promise(async () => {
    const response = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body)
    })
    return { status: response.status, json: (await response.json()) as Record<string, any> }
  })

const setup = (acceptWeights: boolean) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const root = yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-lora-serve-" })
    const dir = `${root}/tiny-test`
    yield* ModelFolder.init(dir, { preset: "tiny", seed: 3 })
    const folder = yield* ModelFolder.load(dir)
    const engine = yield* makeEngine({ config: folder.config, weights: folder.weights, version: 0 })
    const server = yield* OpenAiServer.make(folder, {
      ...(acceptWeights ? { acceptWeights: {}, loraBase: folder.weights } : {})
    }).pipe(Effect.provideService(PolicyEngine, engine))
    return { root, folder, server }
  })

const greedy = (model: string) => ({ model, prompt: [10, 20, 30, 40], max_tokens: 8, temperature: 0, logprobs: 1 })

describe("agentfly serve: LoRA adapters", () => {
  it.live("loads a PEFT adapter, samples it by name with its digest, and unloads it", () =>
    Effect.gen(function*() {
      const { root, folder, server } = yield* setup(true)
      const adapter = adapterFor(folder, 7)
      const path = `${root}/adapter-v1`
      yield* Lora.save(path, folder.config, settings, adapter, "tiny-test")

      const loaded = yield* call(`${server.baseUrl}/load_lora_adapter`, {
        lora_name: "policy",
        lora_path: path,
        policy_version: 1
      })
      assert.strictEqual(loaded.status, 200, JSON.stringify(loaded.json))
      assert.strictEqual(loaded.json["digest"], Checkpoint.fingerprint(adapter))
      const models = yield* Effect.promise(() => fetch(`${server.baseUrl}/models`).then((r) => r.json()))
      assert.deepStrictEqual(models.data.map((m: { id: string }) => m.id), ["tiny-test", "policy"])

      const base = yield* call(`${server.baseUrl}/completions`, greedy("tiny-test"))
      const adapted = yield* call(`${server.baseUrl}/completions`, greedy("policy"))
      assert.strictEqual(adapted.status, 200, JSON.stringify(adapted.json))
      assert.isUndefined(base.json["lora_adapter"])
      assert.deepStrictEqual(adapted.json["lora_adapter"], {
        name: "policy",
        digest: Checkpoint.fingerprint(adapter),
        policy_version: 1
      })
      assert.strictEqual(adapted.json["policy_version"], 1)
      // The adapter changes the model: the same greedy request gives other logprobs.
      assert.notDeepEqual(
        adapted.json["choices"][0].logprobs.token_logprobs,
        base.json["choices"][0].logprobs.token_logprobs
      )

      // The same name again is refused unless in place (vLLM's rule); in place, the new adapter answers.
      const again = yield* call(`${server.baseUrl}/load_lora_adapter`, { lora_name: "policy", lora_path: path })
      assert.strictEqual(again.status, 400)
      assert.include(again.json["error"].message, "has already been loaded")
      const next = adapterFor(folder, 8)
      yield* Lora.save(`${root}/adapter-v2`, folder.config, settings, next, "tiny-test")
      const replaced = yield* call(`${server.baseUrl}/load_lora_adapter`, {
        lora_name: "policy",
        lora_path: `${root}/adapter-v2`,
        load_inplace: true,
        policy_version: 2
      })
      assert.strictEqual(replaced.status, 200)
      const second = yield* call(`${server.baseUrl}/completions`, greedy("policy"))
      assert.strictEqual(second.json["lora_adapter"].digest, Checkpoint.fingerprint(next))

      // A streamed response says it too, in its last event.
      const streamed = yield* Effect.promise(() =>
        fetch(`${server.baseUrl}/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ ...greedy("policy"), stream: true })
        }).then((r) => r.text())
      )
      const events = streamed.split("\n").filter((l) => l.startsWith("data: {")).map((l) => JSON.parse(l.slice(6)))
      assert.strictEqual(events.at(-1).choices[0].lora_adapter.digest, Checkpoint.fingerprint(next))

      const unloaded = yield* call(`${server.baseUrl}/unload_lora_adapter`, { lora_name: "policy" })
      assert.strictEqual(unloaded.status, 200)
      const gone = yield* call(`${server.baseUrl}/completions`, greedy("policy"))
      assert.strictEqual(gone.status, 404)
      assert.include(gone.json["error"].message, "\"policy\" does not exist")
      const missing = yield* call(`${server.baseUrl}/unload_lora_adapter`, { lora_name: "policy" })
      assert.strictEqual(missing.status, 404)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 120_000)

  it.live("refuses loads without --accept-weights, and a folder that is not a LoRA adapter of this model", () =>
    Effect.gen(function*() {
      const closed = yield* setup(false)
      const refused = yield* call(`${closed.server.baseUrl}/load_lora_adapter`, { lora_name: "x", lora_path: "/" })
      assert.strictEqual(refused.status, 404)
      assert.include(refused.json["error"].message, "--accept-weights")

      const { root, folder, server } = yield* setup(true)
      const fs = yield* FileSystem.FileSystem
      yield* Lora.save(`${root}/bad`, folder.config, settings, adapterFor(folder, 1), "tiny-test")
      const config = JSON.parse(yield* fs.readFileString(`${root}/bad/adapter_config.json`))
      yield* fs.writeFileString(
        `${root}/bad/adapter_config.json`,
        JSON.stringify({ ...config, target_modules: ["c_attn"] })
      )
      const bad = yield* call(`${server.baseUrl}/load_lora_adapter`, { lora_name: "x", lora_path: `${root}/bad` })
      assert.strictEqual(bad.status, 400)
      assert.include(bad.json["error"].message, "\"c_attn\" is not a module of this model")
      const none = yield* call(`${server.baseUrl}/load_lora_adapter`, { lora_name: "x", lora_path: `${root}/none` })
      assert.strictEqual(none.status, 400)
      assert.include(none.json["error"].message, "adapter_config.json")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 120_000)
})
