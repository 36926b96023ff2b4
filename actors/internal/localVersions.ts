/**
 * The published policy versions of the local learner: the weights of the last few versions, an engine per sampler
 * built from one of them, and the ambient sampler that follows the newest. With `engine.servers` the inference
 * servers sample instead of local engines, and every published version is pushed to them (`InferenceServers`).
 *
 * Each sampler of a version is a `PolicyEngine` of its own (KV cache, continuous batching) behind
 * {@link prefillAlone}, so that no two rollout batches, evaluations or warm-up checks ever share an engine batch:
 * what a batch samples then depends on its own requests only.
 */
import { Effect, Scope, Semaphore } from "effect"
import { resolve } from "node:path"
import { collectGarbage } from "../../src/internal/collectGarbage.ts"
import * as Lora from "../../src/Lora.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as VisionTower from "../../src/model/VisionTower.ts"
import type * as GradientBackend from "../../src/GradientBackend.ts"
import { Sampler, samplerError } from "../../src/Sampler.ts"
import * as EngineThread from "../EngineThread.ts"
import * as InferenceServers from "../InferenceServers.ts"
import * as PolicyEngine from "../PolicyEngine.ts"
import { runError, wrap, type RunError } from "../RunError.ts"
import * as EngineModel from "./engineModel.ts"
import { keptVersions, learnerError, type Setup } from "./localSetup.ts"
import * as LoraCarrier from "./loraCarrier.ts"
import * as RemoteLearner from "./remoteLearner.ts"

export interface Published {
  readonly version: number
  /**
   * Undefined when the trainer server pushes the weights to the inference servers itself, or for the folder's entry
   * once its weights were released ({@link releaseFolder}).
   */
  readonly weights: Qwen2.Weights | undefined
}

export interface Versions {
  readonly setup: Setup
  readonly maxBatchSize: number
  /**
   * Published weights, newest last: the versions the trainer may still sample (a batch of an async run is sampled
   * by a version up to `maxStaleness` behind the newest). The folder's weights come first, below every version the
   * trainer publishes (versions increase): before the warm-up's checks (negative versions) and version 0.
   */
  readonly published: Array<Published>
  /**
   * How many versions `published` keeps: the ones the schedule may still sample (`localSetup.keptVersions`: the
   * newest in sync mode, `maxStaleness + 1` in async mode). Learner step `s` waits for batch `s`, which samples
   * version `s − 1 − maxStaleness` or newer, so while any batch may still look its version up the newest published is
   * at most `s − 1` and that version is among the last `maxStaleness + 1`; evaluations and warm-up checks sample the
   * newest. A version that leaves is garbage once the engines sampling it close (they feed its arrays, or onnxruntime
   * copied them).
   */
  readonly retained: number
  /** The inference servers of `engine.servers`, which sample instead of local engines. */
  readonly servers: InferenceServers.InferenceServers | undefined
  /** The thread engines decode on (`engine.thread`), if any. */
  readonly engineThread: EngineThread.EngineThread | undefined
  /**
   * With a trainer server pushing to the inference servers (`learner.pushWeights`) the weights stay there: entries
   * after the first hold none (only local engines need them, and there are none then).
   */
  readonly weightless: boolean
  /** A LoRA run's carrier of adapters to the servers, if it has servers. */
  readonly lora: LoraCarrier.LoraCarrier | undefined
  /** The ambient sampler's engine, built on first use. */
  ambient: { readonly engine: PolicyEngine.PolicyEngine["Service"]; readonly sampler: Sampler["Service"] } | undefined
  readonly ambientLock: Semaphore.Semaphore
}

/** The versions, with the folder's weights published below the first version the learner publishes. */
export const make = Effect.fnUntraced(function*(setup: Setup, options: { readonly maxBatchSize: number }) {
  const { config, folder, remote } = setup
  const weightless = remote?.pushes === true
  // A LoRA run's versions go to the servers as adapters (`loraCarrier.ts`), sampled under the adapter's name.
  const lora = config.model.lora === undefined || config.engine.servers === undefined ? undefined : LoraCarrier.make({
    dir: resolve(config.output, "adapters"), // read by the servers: an absolute path
    name: adapterName,
    model: folder.config,
    lora: config.model.lora,
    baseModel: config.model.from ?? config.model.path
  })
  // Inference servers sample instead of local engines when the run lists them (`engine.servers`).
  const servers = config.engine.servers === undefined ? undefined : yield* InferenceServers.make({
    urls: config.engine.servers,
    // A LoRA run's servers get the merged weights (`forEngine`), all of them.
    parameters: config.model.lora === undefined ? setup.model.parameters : Qwen2.parameters(folder.config),
    token: process.env["AGENTFLY_WEIGHTS_TOKEN"] || undefined,
    carrier: weightless ? RemoteLearner.carrier(remote!) : lora?.carrier,
    ...(lora === undefined ? {} : { model: adapterName }),
    timeoutMs: config.engine.timeoutSeconds === undefined ? undefined : config.engine.timeoutSeconds * 1000
  }).pipe(Effect.mapError(wrap("Servers")))
  // Engines decode on a thread of their own when the run asks for it (`engine.thread`; see `EngineConfig`).
  const engineThread = servers === undefined && config.engine.thread === true ? yield* EngineThread.make : undefined
  const versions: Versions = {
    setup,
    maxBatchSize: options.maxBatchSize,
    published: [{ version: -1 - (config.warmup?.steps ?? 0), weights: folder.weights }],
    lora,
    retained: keptVersions(config),
    servers,
    engineThread,
    weightless,
    ambient: undefined,
    ambientLock: yield* Semaphore.make(1)
  }
  return versions
})

/**
 * Releases the folder's weights once the learner holds its own copy (`LocalPolicy.make`'s `releaseFolderWeights`):
 * the folder's entry keeps its version and loses its weights, and the folder's map is emptied so that nothing keeps
 * them alive. The folder's entry is never sampled (a warm-up's checks and version 0 are published first); an
 * unchanged version 0 (no warm-up) is then taken from the learner, the same values.
 */
export const releaseFolder = (versions: Versions): void => {
  const weights = versions.setup.folder.weights
  const i = versions.published.findIndex((p) => p.weights === weights)
  if (i >= 0) versions.published[i] = { version: versions.published[i]!.version, weights: undefined }
  if (weights instanceof Map) weights.clear()
  collectGarbage()
}

/**
 * The learner is about to change its weights (a step, a warm-up step, a load). In a sync run whose engines are fed
 * the published arrays, no version published so far is sampled again (the next batch, evaluation or check samples
 * the version published after this change), so their copies go now rather than when the next version replaces
 * them: the learner's step, a run's peak, does not hold a copy nothing reads (4 bytes a parameter). A version
 * republished unchanged (a step without signal) is taken from the learner again.
 */
export const learnerChanges = (versions: Versions): void => {
  const { setup } = versions
  const fed = setup.engineWeights === "inputs" && engineLora(setup) === undefined && setup.config.model.lora === undefined
  if (setup.config.mode !== "sync" || versions.servers !== undefined || !fed) return
  let dropped = false
  for (const [i, p] of versions.published.entries()) {
    if (p.weights === undefined) continue
    versions.published[i] = { version: p.version, weights: undefined }
    dropped = true
  }
  if (dropped) collectGarbage()
}

/** The newest published version. */
export const newest = (versions: Versions): Published => versions.published[versions.published.length - 1]!

/**
 * The adapter a LoRA run's engines decode unmerged (`PolicyEngine`'s `lora`), if they do: every LoRA run's but one
 * with a vision tower, whose engines take the adapter merged (`W + s·B·A`, a copy of each adapted weight a version).
 */
export const engineLora = (setup: Setup): Lora.Config | undefined =>
  setup.folder.vision === undefined ? setup.config.model.lora : undefined

/**
 * The weights an engine decodes with. A LoRA run's engines ({@link engineLora}): the base's own arrays (the folder's,
 * which the learner reads too: the same objects for every version) and the version's adapter; the folder's weights,
 * before the learner publishes, with a fresh adapter (`B = 0`: the base's function). With a vision tower, a LoRA
 * learner's weights merged. Anything else as it is.
 */
export const forEngine = (setup: Setup, weights: Qwen2.Weights): Qwen2.Weights => {
  const lora = setup.config.model.lora
  if (lora === undefined) return weights
  const c = setup.folder.config
  if (engineLora(setup) !== undefined) {
    // Only the model's tensors, by reference (a learner's map may hold others: validated by the engine).
    const fresh = Lora.hasAdapter(weights) ? undefined : freshAdapter(setup)
    return new Map(
      EngineModel.weightSpecs(c, lora).map((s) => [s.name, weights.get(s.name) ?? fresh?.get(s.name)!])
    )
  }
  return Lora.hasAdapter(weights) ? Lora.merge(c, lora, weights, weights) : weights
}

/** The run's fresh adapter (`Lora.init`), made once per run. */
const freshAdapter = (setup: Setup): ReadonlyMap<string, Float32Array> => {
  let adapter = freshAdapters.get(setup)
  if (adapter === undefined) {
    adapter = Lora.init(setup.folder.config, setup.config.model.lora!)
    freshAdapters.set(setup, adapter)
  }
  return adapter
}

const freshAdapters = new WeakMap<Setup, ReadonlyMap<string, Float32Array>>()

/** The adapter's name on the servers, in a LoRA run: what its requests name as their model. */
export const adapterName = "policy"

/** Pushes `version` to the servers: its adapter in a LoRA run (the carrier loads it), else its (merged) weights. */
const pushTo = (
  versions: Versions,
  servers: InferenceServers.InferenceServers,
  version: number,
  weights: Qwen2.Weights | undefined
) => {
  if (versions.lora !== undefined && weights !== undefined) {
    // The folder's weights (before the learner publishes) are the base: a fresh adapter (B = 0) is its function.
    const { folder, config } = versions.setup
    const adapter = Lora.hasAdapter(weights) ? Lora.adapterOf(weights) : Lora.init(folder.config, config.model.lora!)
    versions.lora.set(version, adapter)
  }
  const pushed = versions.lora !== undefined || weights === undefined ? undefined : forEngine(versions.setup, weights)
  return servers.push(version, pushed).pipe(Effect.mapError(wrap("Servers")))
}

/** The engine's vision options for a folder with a tower (its tokenizer's `<|image_pad|>` id), else none. */
export const visionOf = (folder: Setup["folder"]): PolicyEngine.Options["vision"] => {
  const pad = folder.tokenizer.tokenToId("<|image_pad|>")
  return folder.vision === undefined || pad === undefined ? undefined : { config: folder.vision, imageTokenId: pad }
}

const engineOf = (versions: Versions, version: number, weights: Qwen2.Weights) => {
  const vision = visionOf(versions.setup.folder)
  return (versions.engineThread?.make ?? PolicyEngine.make)({
    config: versions.setup.folder.config,
    weights: forEngine(versions.setup, weights),
    weightsAs: versions.setup.engineWeights,
    lora: engineLora(versions.setup),
    version,
    maxBatchSize: versions.maxBatchSize,
    ...(vision === undefined ? {} : { vision })
  }).pipe(Effect.mapError(learnerError))
}

/**
 * Publishes the learner's weights as `version`: `changed` says whether they differ from the newest published
 * version's, and `weights` takes them (only then). Republishing the newest version unchanged does nothing.
 */
export const publish = Effect.fnUntraced(function*(
  versions: Versions,
  version: number,
  changed: boolean,
  weights: Effect.Effect<GradientBackend.Weights, RunError>
) {
  const last = newest(versions)
  if (version < last.version || (version === last.version && changed)) {
    const message = `policy version ${version} is not newer than the published version ${last.version}`
    return yield* runError("Learner", message)
  }
  if (version === last.version) return
  // Unchanged weights are the newest version's (the folder's, when released, are the learner's: taken from it).
  const taken = versions.weightless
    ? undefined
    : changed || last.weights === undefined
    ? (yield* weights) as Qwen2.Weights
    : last.weights
  if (versions.servers !== undefined) {
    yield* pushTo(versions, versions.servers, version, taken)
  }
  versions.published.push({ version, weights: taken })
  if (versions.published.length > versions.retained) versions.published.shift()
})

/**
 * A version whose weights were let go: the folder's once the learner copied them (`releaseFolder`), or in a sync run
 * fed as inputs one the learner has changed since (`learnerChanges`).
 */
const released = (version: number) =>
  runError(
    "Learner",
    `policy version ${version}'s weights were let go (the model folder's once the learner copied them; in a sync ` +
      `run, every version once the learner changes its weights): sample the version the learner published last`
  )

/** A sampler of published `version` alone in its engine (or the servers' sampler of it), alive in the scope. */
export const sampler = Effect.fnUntraced(function*(versions: Versions, version: number) {
  const entry = versions.published.find((p) => p.version === version)
  if (entry === undefined) {
    return yield* runError(
      "Learner",
      `policy version ${version} is not among the published versions ${versions.published.map((p) => p.version)}`
    )
  }
  // Without servers every entry holds its weights (only a trainer pushing to servers keeps them), but those let go:
  // nothing samples them.
  if (versions.servers !== undefined) return versions.servers.sampler(version)
  if (entry.weights === undefined) return yield* released(version)
  return prefillAlone(yield* engineOf(versions, version, entry.weights), versions.setup.folder.vision?.vision)
})

/** The ambient sampler's current one: the servers', or one engine following the newest version. */
const ambientSampler = (versions: Versions) =>
  Semaphore.withPermits(versions.ambientLock, 1)(Effect.gen(function*() {
    const { version, weights } = newest(versions)
    const { servers } = versions
    if (servers !== undefined) {
      // Before the run's first push the servers hold no weights of this run: the newest version goes first.
      if ((yield* servers.pushed) === undefined) {
        yield* pushTo(versions, servers, version, weights)
      }
      return servers.sampler(version)
    }
    // Without servers every published entry holds its weights, but those let go.
    if (weights === undefined) return yield* released(version)
    if (versions.ambient === undefined) {
      const engine = yield* engineOf(versions, version, weights).pipe(
        Effect.provideService(Scope.Scope, versions.setup.runScope)
      )
      versions.ambient = { engine, sampler: prefillAlone(engine, versions.setup.folder.vision?.vision) }
    } else if ((yield* versions.ambient.engine.policyVersion) < version) {
      yield* versions.ambient.engine.updateWeights(version, forEngine(versions.setup, weights)).pipe(
        Effect.mapError(learnerError)
      )
    }
    return versions.ambient.sampler
  }))

/**
 * The ambient sampler (for callers outside a run's pipeline): one engine, built on first use, following the newest
 * published version.
 */
export const ambient = (versions: Versions): Sampler["Service"] =>
  Sampler.of({
    generate: (request) =>
      ambientSampler(versions).pipe(
        Effect.mapError((e) => samplerError("ServerError", e.message)),
        Effect.flatMap((current) => current.generate(request))
      ),
    policyVersion: Effect.sync(() => newest(versions).version)
  })

/**
 * A sampler on `engine` that lets one distinct prompt at a time into the engine's prefill: a request waits until the
 * requests admitted before it with another prompt have sampled their first token (requests with the same prompt,
 * such as a group's chains, go in together).
 *
 * **Why.** A prefill batch left-pads its prompts to the longest, which shifts where each prompt's keys sit in the
 * attention rows: the float32 sums then group differently and the logits move in their last bits, so what a
 * sequence samples would depend on which other prompts arrived in the same millisecond. Prefilled alone, a prompt
 * always has the same shapes; decode steps do not depend on their neighbours (every row has its own positions and
 * mask, and the cache grows in whole chunks). Cost: one prefill call per distinct prompt instead of one per
 * arrival burst.
 */
export const prefillAlone = (
  engine: PolicyEngine.PolicyEngine["Service"],
  vision?: VisionTower.VisionConfig
): Sampler["Service"] => {
  let admitting: string | undefined
  let admitted = 0
  const waiting: Array<() => boolean> = []
  const tryEnter = (key: string) => {
    if (admitting !== undefined && admitting !== key) return false
    admitting = key
    admitted++
    return true
  }
  const leave = () => {
    if (--admitted > 0) return
    admitting = undefined
    // In arrival order: the first prompt waiting is admitted, with every other request for that same prompt.
    for (let i = 0; i < waiting.length;) {
      if (waiting[i]!()) waiting.splice(i, 1)
      else i++
    }
  }
  // `ticket.inside` is set when the request is admitted; `out` lets the next prompt in (once per request).
  const enter = (key: string, ticket: { inside: boolean }) =>
    Effect.callback<void>((resume) => {
      const attempt = () => {
        if (!tryEnter(key)) return false
        ticket.inside = true
        resume(Effect.void)
        return true
      }
      if (attempt()) return
      waiting.push(attempt)
      return Effect.sync(() => {
        const i = waiting.indexOf(attempt)
        if (i >= 0) waiting.splice(i, 1)
      })
    })
  return Sampler.of({
    generate: ({ images, ...request }) =>
      // The release is in place before the wait starts, so that an interruption at any point lets the next one in.
      Effect.uninterruptibleMask((restore) => {
        const ticket = { inside: false }
        const out = () => {
          if (!ticket.inside) return
          ticket.inside = false
          leave()
        }
        // A prompt with images is its ids and its images' hashes (pads alone cannot tell images apart); the engine
        // takes the tower's pixels.
        const key = images === undefined
          ? request.promptTokenIds.join(",")
          : `${request.promptTokenIds.join(",")}|${images.map((image) => image.ref.sha256).join(",")}`
        const options = images === undefined || vision === undefined
          ? { onToken: out }
          : { onToken: out, images: images.map((image) => VisionTower.toPixels(vision, image)) }
        return restore(enter(key, ticket)).pipe(
          Effect.andThen(restore(engine.generate(request, options))),
          Effect.ensuring(Effect.sync(out))
        )
      }),
    policyVersion: engine.policyVersion
  })
}
