/**
 * A LoRA run's adapters on servers that say no digest (vLLM, SGLang), against a scripted loopback server that speaks
 * vLLM's endpoints as documented: `GET /v1/models` lists the base and each loaded adapter, `POST
 * /v1/load_lora_adapter` `{ lora_name, lora_path }` (400 for a name already loaded, unless `load_inplace`), `POST
 * /v1/unload_lora_adapter` `{ lora_name }` (404 for an unknown name), and `/v1/completions` answers a request naming
 * a loaded adapter with that name as its `model` and no `policy_version` nor `lora_adapter` (404 for an unknown
 * model). The SGLang variant serves the adapter endpoints at the root only. `preloaded`: adapters an earlier process
 * left loaded.
 *
 * Each published version is loaded under a name carrying its version and digest, requested by that name, read back
 * from the echoed name; the names two versions old are unloaded; a server that answers with another model (it
 * loaded nothing and samples the base) is an `AdapterMismatch`.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import * as Http from "node:http"
import * as InferenceServers from "../../actors/InferenceServers.ts"
import * as LoraCarrier from "../../actors/internal/loraCarrier.ts"
import { adapterName, parseAdapterName } from "../../src/backends/OpenAiCompatSampler.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Lora from "../../src/Lora.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"

const model = ModelConfig.presets.tiny
const settings: Lora.Config = { rank: 2, alpha: 4, targets: ["q_proj", "v_proj"] }

/** A distinct adapter per seed (B nonzero, so that each has its own digest). */
const adapterFor = (seed: number) => {
  const adapter = Lora.init(model, { ...settings, seed })
  for (const [name, data] of adapter) if (name.endsWith("lora_B.weight")) data.fill(seed / 100)
  return adapter
}

interface Scripted {
  readonly url: string
  /** What was asked of it, in order: `load NAME PATH`, `unload NAME`, `complete MODEL`. */
  readonly calls: Array<string>
  readonly loaded: Set<string>
}

/**
 * The scripted server. `sglang`: the adapter endpoints at the root only. `base`: it acknowledges loads and answers
 * every completion with the base model's name (as a server that ignored the adapter would).
 */
const scripted = (
  mode: { readonly sglang?: boolean; readonly base?: boolean; readonly preloaded?: ReadonlyArray<string> } = {}
) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<Scripted & { readonly server: Http.Server }>((resolve) => {
        const calls: Array<string> = []
        const loaded = new Set<string>(mode.preloaded)
        const json = (res: Http.ServerResponse, status: number, body: unknown) =>
          res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body))
        const server = Http.createServer(async (req, res) => {
          const chunks: Array<Buffer> = []
          for await (const c of req) chunks.push(c as Buffer)
          const text = Buffer.concat(chunks).toString("utf8")
          const body = (text === "" ? {} : JSON.parse(text)) as Record<string, unknown>
          const path = req.url ?? "/"
          const adapters = mode.sglang === true ? "/" : "/v1/"
          if (path === "/v1/models") {
            return json(res, 200, {
              object: "list",
              data: [{ id: "base" }, ...[...loaded].map((id) => ({ id, parent: "base" }))]
            })
          }
          if (path === `${adapters}load_lora_adapter`) {
            const name = body["lora_name"], where = body["lora_path"]
            if (typeof name !== "string" || typeof where !== "string") return json(res, 400, { error: "bad body" })
            if (loaded.has(name) && body["load_inplace"] !== true) return json(res, 400, { error: "already loaded" })
            calls.push(`load ${name} ${where}`)
            loaded.add(name)
            return res.writeHead(200).end(`Success: LoRA adapter '${name}' added successfully.`)
          }
          if (path === `${adapters}unload_lora_adapter`) {
            const name = String(body["lora_name"])
            if (!loaded.delete(name)) return json(res, 404, { error: `The lora adapter '${name}' cannot be found.` })
            calls.push(`unload ${name}`)
            return res.writeHead(200).end(`Success: LoRA adapter '${name}' removed successfully.`)
          }
          if (path === "/v1/completions") {
            const asked = String(body["model"])
            calls.push(`complete ${asked}`)
            if (asked !== "base" && !loaded.has(asked)) {
              return json(res, 404, { error: `The model ${asked} does not exist.` })
            }
            return json(res, 200, {
              model: mode.base === true ? "base" : asked,
              choices: [{ token_ids: [5, 6], logprobs: { token_logprobs: [-0.5, -0.25] }, finish_reason: "length" }]
            })
          }
          return json(res, 404, { detail: "Not Found" })
        })
        server.listen(0, "127.0.0.1", () => {
          const port = (server.address() as { port: number }).port
          resolve({ server, url: `http://127.0.0.1:${port}/v1`, calls, loaded })
        })
      })
    ),
    ({ server }) => Effect.promise(() => new Promise<void>((resolve) => server.close(() => resolve())))
  )

const request = { promptTokenIds: [1, 2, 3], sampling: { temperature: 0, maxTokens: 2 } }

/** A LoRA run's servers over `front`, publishing through the carrier into `dir`. */
const publisher = (dir: string, url: string) =>
  Effect.gen(function*() {
    const lora = LoraCarrier.make({ dir, name: "policy", model, lora: settings, baseModel: "base" })
    const servers = yield* InferenceServers.make({
      urls: [url],
      parameters: Qwen2.parameters(model),
      carrier: lora.carrier,
      model: "policy",
      restMs: 20,
      giveUpMs: 2_000
    })
    const publish = (version: number, seed: number) =>
      Effect.gen(function*() {
        const adapter = adapterFor(seed)
        lora.set(version, adapter)
        yield* servers.push(version)
        return adapterName("policy", version, Checkpoint.fingerprint(adapter))
      })
    return { servers, publish }
  })

describe("LoRA adapters on a server that says no digest (vLLM's endpoints)", () => {
  it.live("each version is loaded and requested under a name with its version and digest; older names unloaded", () =>
    Effect.gen(function*() {
      const dir = yield* (yield* FileSystem.FileSystem).makeTempDirectoryScoped({ prefix: "lora-vllm-" })
      // An earlier process of the run left its adapters loaded; another run's base name is not this run's.
      const earlier = "policy-v9-00000000000000ff", stranger = "other-v1-00000000000000ff"
      const vllm = yield* scripted({ preloaded: [earlier, stranger] })
      const { servers, publish } = yield* publisher(dir, vllm.url)
      const v1 = yield* publish(1, 1)
      assert.match(v1, /^policy-v1-[0-9a-f]{16}$/)
      const one = yield* servers.sampler(1).generate(request)
      // The version and the adapter come from the echoed name: vLLM says neither.
      assert.strictEqual(one.policyVersion, 1)
      assert.deepStrictEqual(one.adapter, { name: v1, digest: parseAdapterName(v1)!.digest, policyVersion: 1 })
      const v2 = yield* publish(2, 2)
      const v3 = yield* publish(3, 3)
      assert.notStrictEqual(parseAdapterName(v2)!.digest, parseAdapterName(v3)!.digest)
      const three = yield* servers.sampler(3).generate(request)
      assert.strictEqual(three.policyVersion, 3)
      assert.deepStrictEqual(vllm.calls, [
        // Before anything is trained: the earlier process's adapters go, so that a worker never picks them.
        `unload ${earlier}`,
        `load ${v1} ${dir}/policy-v1`,
        `complete ${v1}`,
        `load ${v2} ${dir}/policy-v2`,
        `load ${v3} ${dir}/policy-v3`,
        // The one before the newest stays loaded for requests still in flight.
        `unload ${v1}`,
        `complete ${v3}`
      ])
      assert.deepStrictEqual([...vllm.loaded], [stranger, v2, v3])
      // What was loaded is the PEFT folder of that version's adapter.
      const read = yield* Lora.load(`${dir}/policy-v3`, model)
      assert.strictEqual(Checkpoint.fingerprint(read.adapter), parseAdapterName(v3)!.digest)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 60_000)

  it.live("a server answering with another model than the adapter asked for is an AdapterMismatch", () =>
    Effect.gen(function*() {
      const dir = yield* (yield* FileSystem.FileSystem).makeTempDirectoryScoped({ prefix: "lora-vllm-" })
      const vllm = yield* scripted({ base: true })
      const { servers, publish } = yield* publisher(dir, vllm.url)
      const v1 = yield* publish(1, 1)
      const error = yield* Effect.flip(servers.sampler(1).generate(request))
      assert.strictEqual(error.reason._tag, "AdapterMismatch")
      assert.include(error.message, "sampled with no adapter, not the published version 1")
      assert.include(error.message, parseAdapterName(v1)!.digest)
      // The server was asked for the adapter, and is asked to load it again before it serves.
      assert.include(vllm.calls, `complete ${v1}`)
      const status = yield* servers.status
      assert.include(status[0]!.lastError, "AdapterMismatch")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 60_000)

  it.live("SGLang's endpoints at the root are found; a server without any is refused before anything is trained", () =>
    Effect.gen(function*() {
      const dir = yield* (yield* FileSystem.FileSystem).makeTempDirectoryScoped({ prefix: "lora-vllm-" })
      const sglang = yield* scripted({ sglang: true })
      const { servers, publish } = yield* publisher(dir, sglang.url)
      const v1 = yield* publish(1, 1)
      assert.deepStrictEqual(sglang.calls, [`load ${v1} ${dir}/policy-v1`])
      assert.strictEqual((yield* servers.sampler(1).generate(request)).policyVersion, 1)
      // A server with no adapter endpoints at all (vLLM without runtime updates).
      const bare = yield* Effect.acquireRelease(
        Effect.promise(() =>
          new Promise<{ server: Http.Server; url: string }>((resolve) => {
            const server = Http.createServer((req, res) => {
              const body = req.url === "/v1/models" ? { data: [{ id: "base" }] } : { detail: "Not Found" }
              res.writeHead(req.url === "/v1/models" ? 200 : 404, { "content-type": "application/json" })
                .end(JSON.stringify(body))
            })
            server.listen(0, "127.0.0.1", () =>
              resolve({ server, url: `http://127.0.0.1:${(server.address() as { port: number }).port}/v1` }))
          })
        ),
        ({ server }) => Effect.promise(() => new Promise<void>((resolve) => server.close(() => resolve())))
      )
      const refused = yield* Effect.flip(publisher(dir, bare.url))
      assert.strictEqual(refused.reason._tag, "Servers")
      assert.include(refused.message, "loads no adapters at run time")
      assert.include(refused.message, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 60_000)
})
