/**
 * A run's Tinker engine (`learner.backend: "tinker"`): the client, the trainers made on it (the warm-up's, then RL's
 * from the warm-up's state with a fresh optimiser), and the published policy versions, each a
 * `save_weights_for_sampler` path sampled through `asample` (`TinkerSampler`). The local learner's pieces
 * (`learnerSlot`, `LocalPolicy`) call these where a local or `learner.url` run builds trainers and engines.
 *
 * **On your own servers.** A LoRA run (`learner.tinker.loraRank`) with `engine.servers` samples there instead: each
 * version's adapter is fetched through the checkpoint archive route (`TinkerArchive`), read back with `Lora.load`
 * (its own `adapter_config.json`: rank, alpha and targets are the engine's, not our defaults) and loaded on the
 * servers under its versioned name by the LoRA carrier (`loraCarrier.ts`), as a local LoRA run's adapters are.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Effect, FileSystem, Redacted } from "effect"
import { HttpClient } from "effect/http"
import type { Scope } from "effect"
import { resolve } from "node:path"
import * as Lora from "../../src/Lora.ts"
import type * as ModelConfig from "../../src/model/ModelConfig.ts"
import type * as ModelFolder from "../../src/ModelFolder.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import type * as Loss from "../../src/Loss.ts"
import type * as LrSchedule from "../../src/LrSchedule.ts"
import type * as Optimizer from "../../src/Optimizer.ts"
import type { Sampler } from "../../src/Sampler.ts"
import { samplerError } from "../../src/Sampler.ts"
import type * as TrainConfig from "../../src/TrainConfig.ts"
import * as TinkerArchive from "../../src/backends/TinkerArchive.ts"
import * as TinkerClient from "../../src/backends/TinkerClient.ts"
import * as TinkerSampler from "../../src/backends/TinkerSampler.ts"
import * as TinkerTrainer from "../../src/backends/TinkerTrainer.ts"
import * as InferenceServers from "../InferenceServers.ts"
import type { Figures } from "../Learner.ts"
import { runError, wrap } from "../RunError.ts"
import * as LoraCarrier from "./loraCarrier.ts"

/** One published version: its `tinker://` sampler path (absent: the base model, before any step). */
interface Published {
  readonly version: number
  readonly path: string | undefined
}

/** A LoRA run's inference servers (`engine.servers`) and the carrier of its adapters to them. */
interface OnServers {
  readonly servers: InferenceServers.InferenceServers
  readonly carrier: LoraCarrier.LoraCarrier
  /** What the carrier writes with: the engine's settings, as the newest archive's `adapter_config.json` says. */
  readonly options: { lora: Lora.Config; readonly model: ModelConfig.ModelConfig }
  /** Where archives are unpacked (`RUN/tinker-archives/vN`). */
  readonly archives: string
  /** The adapter of the newest version pushed (a fresh one, B = 0, before any step: the base's function). */
  adapter: ReadonlyMap<string, Float32Array> | undefined
}

/** The adapter's name on the servers: what requests name as their model (a local LoRA run's too). */
const adapterName = "policy"

/** Tinker's LoRA targets when it trains attention and MLP (`TinkerTrainer`'s `lora_config`), alpha 32. */
const engineLora = (rank: number): Lora.Config => ({
  rank,
  alpha: 32,
  targets: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
})

/** The servers of a LoRA Tinker run with `engine.servers`, probed before anything trains. */
const onServersOf = Effect.fnUntraced(function*(
  config: TrainConfig.TrainConfig,
  rank: number,
  folder: ModelFolder.ModelFolder
) {
  const options = { lora: engineLora(rank), model: folder.config }
  const carrier = LoraCarrier.make({
    dir: resolve(config.output, "adapters"), // read by the servers: an absolute path
    name: adapterName,
    baseModel: config.learner.tinker!.baseModel,
    model: folder.config,
    get lora() {
      return options.lora
    }
  })
  const servers = yield* InferenceServers.make({
    urls: config.engine.servers!,
    parameters: Qwen2.parameters(folder.config),
    token: process.env["AGENTFLY_WEIGHTS_TOKEN"] || undefined,
    carrier: carrier.carrier,
    model: adapterName,
    timeoutMs: config.engine.timeoutSeconds === undefined ? undefined : config.engine.timeoutSeconds * 1000
  }).pipe(Effect.mapError(wrap("Servers")))
  const on: OnServers = {
    servers,
    carrier,
    options,
    archives: resolve(config.output, "tinker-archives"),
    adapter: undefined
  }
  return on
})

export interface Tinker {
  readonly config: TrainConfig.TinkerLearnerConfig
  readonly client: TinkerClient.TinkerClient["Service"]
  readonly seed: number
  /** The trainer in use, once made. */
  current: TinkerTrainer.TinkerTrainer | undefined
  readonly published: Array<Published>
  readonly retained: number
  /** The traffic up to the previous step's figures. */
  counted: TinkerClient.Traffic
  /** A LoRA run's servers (`engine.servers`), which sample instead of `asample`. */
  readonly onServers: OnServers | undefined
  readonly fs: FileSystem.FileSystem
}

/** The run's Tinker engine, or undefined without `learner.backend: "tinker"`. */
export const make = Effect.fnUntraced(function*(config: TrainConfig.TrainConfig, folder: ModelFolder.ModelFolder) {
  const tinker = config.learner.tinker
  if (config.learner.backend !== "tinker" || tinker === undefined) return undefined
  const key = process.env[tinker.apiKeyEnv]
  // Through node:http, not `fetch`, as the inference servers are (fetch gives up on an answer after 5 minutes).
  const http = yield* NodeHttpClient.makeNodeHttp.pipe(
    Effect.provideService(NodeHttpClient.HttpAgent, yield* NodeHttpClient.makeAgent({ keepAlive: true }))
  )
  const client = yield* TinkerClient.make({
    baseUrl: tinker.baseUrl,
    ...(key === undefined || key === "" ? {} : { apiKey: Redacted.make(key) }),
    ...(tinker.futureTimeoutSeconds === undefined ? {} : { futureTimeoutMs: tinker.futureTimeoutSeconds * 1000 })
  }).pipe(Effect.provideService(HttpClient.HttpClient, http))
  const state: Tinker = {
    config: tinker,
    client,
    seed: config.seed,
    current: undefined,
    published: [{ version: -1 - (config.warmup?.steps ?? 0), path: undefined }],
    retained: (config.mode === "async" ? config.maxStaleness : 0) + 2,
    counted: { ...client.traffic },
    onServers: config.engine.servers === undefined || tinker.loraRank === undefined
      ? undefined
      : yield* onServersOf(config, tinker.loraRank, folder),
    fs: yield* FileSystem.FileSystem
  }
  return state
})

/** Where the key comes from, for the messages of an engine that refused it. */
const hint = (tinker: Tinker) => (e: { readonly message: string }) =>
  e.message.includes("Unauthorized") || e.message.includes("HTTP 401") || e.message.includes("HTTP 403")
    ? `${e.message} (the API key is read from $${tinker.config.apiKeyEnv}: learner.tinker.apiKeyEnv)`
    : e.message

/**
 * A trainer on the engine with `loss` and `schedule`: new, or (`from`) from a saved training state without its
 * optimiser. It becomes the one in use.
 */
export const trainer = (
  tinker: Tinker,
  settings: {
    readonly loss: Loss.Config
    readonly schedule: LrSchedule.Config
    readonly optimizer: Optimizer.Config
    readonly from?: string | undefined
  }
): Effect.Effect<TinkerTrainer.TinkerTrainer, ReturnType<typeof runError>, Scope.Scope | FileSystem.FileSystem> =>
  TinkerTrainer.make({
    baseModel: tinker.config.baseModel,
    ...(tinker.config.loraRank === undefined ? {} : { loraRank: tinker.config.loraRank }),
    seed: tinker.seed,
    loss: settings.loss,
    optimizer: settings.optimizer,
    schedule: settings.schedule,
    metadata: { source: "agentfly" },
    ...(settings.from === undefined ? {} : { from: { path: settings.from, optimizer: false } })
  }).pipe(
    Effect.provideService(TinkerClient.TinkerClient, tinker.client),
    Effect.mapError((e) => runError("Learner", hint(tinker)(e), e)),
    Effect.tap((t) => Effect.sync(() => (tinker.current = t)))
  )

/** The training state of the trainer in use, saved under `name` (the warm-up's, handed to RL). */
export const saveState = (tinker: Tinker, name: string) =>
  Effect.suspend(() => tinker.current!.saveState(name)).pipe(
    Effect.mapError((e) => runError("Learner", hint(tinker)(e), e))
  )

/** Publishes the trainer's current weights as `version` (`changed`: they differ from the newest published). */
export const publish = Effect.fnUntraced(function*(tinker: Tinker, version: number, changed: boolean) {
  const last = tinker.published[tinker.published.length - 1]!
  if (version < last.version || (version === last.version && changed)) {
    const message = `policy version ${version} is not newer than the published version ${last.version}`
    return yield* runError("Learner", message)
  }
  if (version === last.version) return
  // Unchanged weights (a fresh adapter is the base model) are the newest version's path again.
  const current = tinker.current
  const path = changed && current !== undefined
    ? yield* current.saveForSampler(`v${version}`).pipe(Effect.mapError((e) => runError("Learner", hint(tinker)(e), e)))
    : last.path
  if (tinker.onServers !== undefined) yield* pushAdapter(tinker, tinker.onServers, version, changed ? path : undefined)
  tinker.published.push({ version, path })
  if (tinker.published.length > tinker.retained) tinker.published.shift()
})

/**
 * Pushes `version` to the servers: the adapter of sampler weights `path`, fetched from the engine's archive (absent:
 * the newest adapter again, or a fresh one before any, whose B = 0 is the base model's function).
 */
const pushAdapter = Effect.fnUntraced(function*(
  tinker: Tinker,
  on: OnServers,
  version: number,
  path: string | undefined
) {
  if (path !== undefined) {
    const fetched = yield* TinkerArchive.fetchInto(path, `${on.archives}/v${version}`).pipe(
      Effect.provideService(TinkerClient.TinkerClient, tinker.client),
      Effect.provideService(FileSystem.FileSystem, tinker.fs),
      Effect.mapError((e) => runError("Learner", hint(tinker)(e), e))
    )
    const read = yield* Lora.load(fetched, on.options.model).pipe(
      Effect.provideService(FileSystem.FileSystem, tinker.fs),
      Effect.mapError((e) => runError("Learner", `the adapter of ${path}: ${e.message}`, e))
    )
    // The engine's settings, not our defaults: the servers must compute the function that was trained.
    on.options.lora = read.config
    on.adapter = read.adapter
    // The carrier writes its own copy of the folder (`RUN/adapters/policy-vN`) for the servers.
    yield* tinker.fs.remove(fetched, { recursive: true }).pipe(Effect.ignore)
  }
  on.carrier.set(version, on.adapter ?? Lora.init(on.options.model, on.options.lora))
  yield* on.servers.push(version).pipe(Effect.mapError(wrap("Servers")))
})

/** A sampler of published `version` on the engine. */
export const sampler = Effect.fnUntraced(function*(tinker: Tinker, version: number) {
  const entry = tinker.published.find((p) => p.version === version)
  if (entry === undefined) {
    const all = tinker.published.map((p) => p.version)
    return yield* runError("Learner", `policy version ${version} is not among the published versions ${all}`)
  }
  const on = tinker.onServers
  if (on !== undefined) {
    // Before the run's first push the servers hold no adapter of this run: the newest version goes first.
    if ((yield* on.servers.pushed) === undefined) {
      yield* pushAdapter(tinker, on, tinker.published[tinker.published.length - 1]!.version, undefined)
    }
    return on.servers.sampler(version)
  }
  const options = { modelPath: entry.path, baseModel: tinker.config.baseModel, policyVersion: version }
  return yield* TinkerSampler.make(options).pipe(Effect.provideService(TinkerClient.TinkerClient, tinker.client))
})

/** The sampler of the newest published version, whichever it is when a request comes. */
export const ambient = (tinker: Tinker): Sampler["Service"] => ({
  generate: (request) =>
    sampler(tinker, tinker.published[tinker.published.length - 1]!.version).pipe(
      Effect.mapError((e) => samplerError("ServerError", e.message)),
      Effect.flatMap((s) => s.generate(request))
    ),
  policyVersion: Effect.sync(() => tinker.published[tinker.published.length - 1]!.version)
})

/** The traffic since the previous call: `tinker/requests`, `tinker/retries`, `tinker/polls`, `tinker/resubmits`. */
export const figures = (tinker: Tinker): Effect.Effect<Figures> =>
  Effect.sync(() => {
    const now = { ...tinker.client.traffic }
    const before = tinker.counted
    tinker.counted = now
    return {
      "tinker/requests": now.requests - before.requests,
      "tinker/retries": now.retries - before.retries,
      "tinker/polls": now.polls - before.polls,
      "tinker/resubmits": now.resubmits - before.resubmits
    }
  })
