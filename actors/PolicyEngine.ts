/**
 * The local policy engine: a Qwen2-style model (`src/model/Qwen2.ts`) running on onnxruntime-node with a KV cache
 * and continuous batching, exposed as the token-in / token-out `Sampler` service.
 *
 * **Batching.** One decode loop (a fiber in the layer's scope) owns every running sequence. Between two decode
 * steps it takes the requests that arrived, prefills their prompts as one left-padded batch, samples their first
 * token and copies their keys/values into the running batch's cache; each step then decodes one token for every
 * running sequence. Finished sequences leave at step boundaries. The engine owns the cache (`internal/kvCache.ts`):
 * the graph returns only the new tokens' keys/values, so a step never copies the whole cache. Every sequence
 * carries its own position ids and attention mask, so its logits do not depend on its neighbours. While nothing is
 * waiting to join and a single policy version runs, steps follow each other inside one `Effect.callback` (a
 * "burst") rather than resuming the loop fiber after every `session.run`.
 *
 * **Prompt reuse.** A prompt shared by several joining requests (a GRPO group's chains) is computed once. A finished
 * sequence's keys/values are kept (per policy version, the most recent `2 × maxBatchSize`), and a request whose
 * prompt extends one (the chain's next turn: its tokens, the tool's output, the next generation prompt) computes
 * only the tokens after it.
 *
 * **Sampling.** Temperature / top-k / top-p or greedy (`temperature: 0`), stop token ids (the stop token is
 * included in the result) and `maxTokens`, in `src/Sampling.ts`. Every request owns an RNG seeded from its `seed`
 * (or from `Random` when absent) and draws once per token, so results do not depend on batching. Logprobs are
 * log-softmax of `logits / temperature` over the whole vocabulary at the sampled token (plain log-softmax when
 * greedy).
 *
 * **Weights.** The ONNX model is built once per engine from the config alone (`internal/engineModel.ts`): no
 * weight is serialized into it, so onnxruntime's 2 GB model limit never applies. By default the weights are
 * initializers whose data onnxruntime copies from the caller's arrays while it creates a version's session
 * (in-memory external data) and pre-packs for its MatMul kernels: decoding is as fast as with the weights baked in,
 * and faster than feeding them as inputs on every step (`weightsAs: "inputs"`, which holds no copy: what a large
 * model's training run uses; BENCHMARKS.md, "engine weights" and "0.5 B end to end on 2 cores"). The caller's
 * arrays are not referenced afterwards (they may be written in place); the engines of one thread that sample the
 * same version of the same weights share its session. `updateWeights` creates a new session while decoding goes
 * on. Requests that already started finish on the session they started with, and their result carries that
 * version; new requests go to the new one. An old session is released once its last sequence finishes. A LoRA
 * engine (`lora`) takes every weight as an input and its adapter unmerged: the base's arrays are the caller's (the
 * learner's), shared by every version, and a version swaps only the adapter (`internal/engineModel.ts`).
 *
 * @since 0.1.0
 */
import { Context, Deferred, Effect, Layer, Queue, Random, Schema, Semaphore } from "effect"
import type { Scope } from "effect"
import * as ort from "onnxruntime-node"
import { availableParallelism } from "node:os"
import * as Lora from "../src/Lora.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as VisionTower from "../src/model/VisionTower.ts"
import { Sampler, samplerError } from "../src/Sampler.ts"
import type { GenerateRequest, GenerateResult, SamplerError } from "../src/Sampler.ts"
import * as Sampling from "../src/Sampling.ts"
import { continued, decode, decodeBurst, failAll, prefill, release, removeRows } from "./internal/engineSteps.ts"
import type { Engine, Generation, Seq, Setup } from "./internal/engineSteps.ts"
import * as EngineModel from "./internal/engineModel.ts"
import * as EngineScore from "./internal/engineScore.ts"
import * as EngineVision from "./internal/engineVision.ts"
import * as KvCache from "./internal/kvCache.ts"

// ===== Models =====

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly config: ModelConfig.ModelConfig
  readonly weights: Qwen2.Weights
  /** Policy version of `weights` (default 0). */
  readonly version?: number
  /** Most sequences decoded together (default 32); later requests wait for a free slot. */
  readonly maxBatchSize?: number
  /**
   * Weights as the session's initializers (`"initializers"`, default: one copy per version, held by onnxruntime and
   * pre-packed) or fed as inputs on every step (`"inputs"`: the caller's arrays are used in place, products as
   * `FusedMatMul` with `transB`, one session for every version; what a full fine-tuning run of a large model
   * samples with, BENCHMARKS.md "0.5 B end to end on 2 cores" has its speed).
   */
  readonly weightsAs?: "initializers" | "inputs"
  /** onnxruntime intra-op threads (default {@link defaultThreads}). */
  readonly intraOpNumThreads?: number
  /** Requests that may wait for the loop before `generate` callers suspend (default 1024). */
  readonly mailboxCapacity?: number
  /**
   * A vision tower (`VisionTower.ts`; its `text` must be `config`) and the tokenizer's `<|image_pad|>` id: `weights`
   * then hold the tower's too, and `generate` takes images. Prompts with images are prefilled by a second session
   * (`internal/engineVision.ts`); everything else is the text engine's, unchanged.
   */
  readonly vision?: EngineVision.Options | undefined
  /**
   * A LoRA adapter decoded unmerged (`internal/engineModel.ts`): `weights` then hold the base and the adapter's
   * tensors (PEFT's names), all fed as inputs (`weightsAs` is ignored): a new version's weights that hold the same
   * base arrays swap only the adapter, and no version copies the base. Not with `vision`.
   */
  readonly lora?: Lora.Config | undefined
}

/**
 * @category models
 * @since 0.1.0
 */
export interface GenerateOptions {
  /** Called in the decode loop with each sampled token, as soon as it is sampled; must not throw or block. */
  readonly onToken?: ((tokenId: number, logprob: number) => void) | undefined
  /**
   * The prompt's images in the order of their pads (resized and normalised: `Image.resizeForVision`), for an
   * engine with `vision`; the prompt holds one `imageTokenId` per merged token of each.
   */
  readonly images?: ReadonlyArray<VisionTower.Pixels> | undefined
}

/**
 * A weight the model needs is not among the weights given.
 *
 * @category errors
 * @since 0.1.0
 */
export class MissingWeight extends Schema.TaggedError<MissingWeight>()("MissingWeight", {
  weight: Schema.String,
  message: Schema.String
}) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * A weight holds the wrong number of floats for its shape.
 *
 * @category errors
 * @since 0.1.0
 */
export class WeightShape extends Schema.TaggedError<WeightShape>()("WeightShape", {
  weight: Schema.String,
  message: Schema.String
}) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * A weight given is not one of the model's.
 *
 * @category errors
 * @since 0.1.0
 */
export class UnknownWeight extends Schema.TaggedError<UnknownWeight>()("UnknownWeight", {
  weight: Schema.String,
  message: Schema.String
}) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * The version given is not newer than the engine's current one: versions must increase.
 *
 * @category errors
 * @since 0.1.0
 */
export class StaleVersion extends Schema.TaggedError<StaleVersion>()("StaleVersion", {
  version: Schema.Number,
  current: Schema.Number,
  message: Schema.String
}) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * onnxruntime rejected the model (or the engine's thread could not be started).
 *
 * @category errors
 * @since 0.1.0
 */
export class SessionFailed extends Schema.TaggedError<SessionFailed>()("SessionFailed", { message: Schema.String }) {
  get isRetryable(): boolean {
    return false
  }
}

/**
 * Why `updateWeights` (or building the engine) failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const PolicyEngineErrorReason = Schema.Union([
  MissingWeight,
  WeightShape,
  UnknownWeight,
  StaleVersion,
  SessionFailed
])
export type PolicyEngineErrorReason = typeof PolicyEngineErrorReason.Type

/**
 * A failed weight update or engine build. Handle reasons with `Effect.catchReason("PolicyEngineError", …)`;
 * `message` is the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class PolicyEngineError extends Schema.TaggedError<PolicyEngineError>()("PolicyEngineError", {
  reason: PolicyEngineErrorReason
}) {
  get isRetryable(): boolean {
    return this.reason.isRetryable
  }
  override get message(): string {
    return this.reason.message
  }
}

/**
 * Counters for metrics and tests.
 *
 * @category models
 * @since 0.1.0
 */
export interface Stats {
  readonly decodeSteps: number
  readonly prefills: number
  /** Prompt tokens computed by prefills (a prompt shared by several requests of one prefill counts once). */
  readonly prefillTokens: number
  /** Prompt tokens whose keys/values came from the sequence the request continues, not computed again. */
  readonly reusedTokens: number
  readonly generatedTokens: number
  /** Largest number of sequences decoded in one step. */
  readonly largestBatch: number
  /** Sessions alive now (more than one while old versions drain). */
  readonly sessions: number
  /** Running sequences by policy version. */
  readonly running: Readonly<Record<number, number>>
}

/**
 * One scored position (`PolicyEngine.score`).
 *
 * @category models
 * @since 0.1.0
 */
export type PositionScore = EngineScore.PositionScore

/**
 * @category services
 * @since 0.1.0
 */
export class PolicyEngine extends Context.Service<PolicyEngine, {
  readonly config: ModelConfig.ModelConfig
  /** `Sampler.generate`, plus an optional per-token callback (how the HTTP server streams). */
  readonly generate: (
    request: GenerateRequest,
    options?: GenerateOptions
  ) => Effect.Effect<GenerateResult, SamplerError>
  /**
   * Swaps in new weights (Hugging Face names, float32). Returns once new requests use them; requests in flight
   * finish on their old version.
   */
  readonly updateWeights: (version: number, weights: Qwen2.Weights) => Effect.Effect<void, PolicyEngineError>
  /**
   * Scores given tokens with the current weights (a distillation teacher's prompt logprobs): `[0]` null, `[t]`
   * the logprob of token `t` after the ones before it (temperature 1), its rank and the `top` likeliest tokens.
   * Absent where the engine cannot (an engine on another thread).
   */
  readonly score?: (
    tokenIds: ReadonlyArray<number>,
    options?: { readonly top?: number }
  ) => Effect.Effect<ReadonlyArray<PositionScore | null>, SamplerError>
  readonly policyVersion: Effect.Effect<number>
  readonly stats: Effect.Effect<Stats>
}>()("agentfly/actors/PolicyEngine") {
  /**
   * @category layers
   * @since 0.1.0
   */
  static readonly layer = (options: Options): Layer.Layer<PolicyEngine, PolicyEngineError> =>
    Layer.effect(PolicyEngine, make(options))
}

/**
 * `Sampler` on top of a {@link PolicyEngine} (which batches concurrent requests itself).
 *
 * @category layers
 * @since 0.1.0
 */
export const layerSampler: Layer.Layer<Sampler, never, PolicyEngine> = Layer.effect(
  Sampler,
  Effect.gen(function*() {
    const engine = yield* PolicyEngine
    return Sampler.of({ generate: (r) => engine.generate(r), policyVersion: engine.policyVersion })
  })
)

// ===== Internals =====

const validateWeights = (
  c: ModelConfig.ModelConfig,
  weights: Qwen2.Weights,
  vision?: EngineVision.Options,
  lora?: Lora.Config
): PolicyEngineError | undefined => {
  const specs = vision === undefined
    ? EngineModel.weightSpecs(c, lora)
    : VisionTower.allParameters({ ...vision.config, text: c })
  for (const spec of specs) {
    const data = weights.get(spec.name)
    const n = spec.shape.reduce((a, b) => a * b, 1)
    if (data === undefined) {
      const message = `missing ${spec.name}`
      return new PolicyEngineError({ reason: new MissingWeight({ weight: spec.name, message }) })
    }
    if (data.length !== n) {
      const message = `${spec.name}: expected ${n} floats [${spec.shape.join(", ")}], got ${data.length}`
      return new PolicyEngineError({ reason: new WeightShape({ weight: spec.name, message }) })
    }
  }
  const known = new Set(specs.map((s) => s.name))
  for (const name of weights.keys()) {
    if (!known.has(name)) {
      return new PolicyEngineError({ reason: new UnknownWeight({ weight: name, message: `unknown weight ${name}` }) })
    }
  }
  return undefined
}

const badRequest = (message: string) => samplerError("BadRequest", message)

/**
 * What `generate` refuses with a `SamplerError` of reason `BadRequest` (an empty prompt, one longer than the
 * context, an id outside the vocabulary, bad sampling parameters), as a pure check: the HTTP server runs it before
 * it answers a streaming request's status line.
 *
 * @category validation
 * @since 0.1.0
 */
export const validateRequest = (c: ModelConfig.ModelConfig, r: GenerateRequest): SamplerError | undefined => {
  const { promptTokenIds: ids, sampling: s } = r
  if (ids.length === 0) return badRequest("the prompt is empty")
  if (ids.length > c.maxPositionEmbeddings) {
    return badRequest(`the prompt has ${ids.length} tokens; the context holds ${c.maxPositionEmbeddings}`)
  }
  const bad = ids.find((id) => !Number.isInteger(id) || id < 0 || id >= c.vocabSize)
  if (bad !== undefined) return badRequest(`token id ${bad} is outside the vocabulary [0, ${c.vocabSize})`)
  if (!Number.isInteger(s.maxTokens) || s.maxTokens < 1) {
    return badRequest(`maxTokens must be ≥ 1, got ${s.maxTokens}`)
  }
  if (!Number.isFinite(s.temperature) || s.temperature < 0) {
    return badRequest(`temperature must be a finite number ≥ 0, got ${s.temperature}`)
  }
  if (s.topP !== undefined && !(s.topP > 0 && s.topP <= 1)) return badRequest(`topP must be in (0, 1], got ${s.topP}`)
  if (s.topK !== undefined && s.topK < 0) return badRequest(`topK must be ≥ 0, got ${s.topK}`)
  return undefined
}

// ----- Setup and sessions -----

/**
 * The engine's onnxruntime intra-op threads when none are given: one for models under 50 M parameters (the embedded
 * presets: on a shared 2-core machine one thread decodes them about 2× faster than all cores, whose spinning workers
 * compete with everything else), every core for real models, whose products are large enough to split
 * (Qwen2.5-0.5B's width cut to 2 layers decoded 1.95× faster at batch 1 and 1.34× at batch 8 on 2 threads than 1).
 *
 * @category getters
 * @since 0.1.0
 */
export const defaultThreads = (c: ModelConfig.ModelConfig): number =>
  EngineModel.parameterCount(c) < 50e6 ? 1 : availableParallelism()


const makeSetup = (options: Options): Setup => {
  const c = options.config
  const lora = options.lora
  const weightsAs = lora !== undefined ? "inputs" : options.weightsAs ?? "initializers"
  const sessionOptions: ort.InferenceSession.SessionOptions = {
    executionProviders: ["cpu"],
    graphOptimizationLevel: "all",
    intraOpNumThreads: options.intraOpNumThreads ?? defaultThreads(c),
    interOpNumThreads: 1
  }
  const pastNames = Array.from({ length: c.numHiddenLayers }, (_, l) => [`past.${l}.key`, `past.${l}.value`]).flat()
  return {
    config: c,
    kvHeads: c.numKeyValueHeads,
    headDim: ModelConfig.headDim(c),
    vocabSize: c.vocabSize,
    maxBatch: options.maxBatchSize ?? 32,
    weightsAs,
    sessionOptions,
    model: EngineModel.modelBytes(c, weightsAs, lora),
    sessionKey: JSON.stringify([c, weightsAs, sessionOptions, ...(lora === undefined ? [] : [lora])]),
    lora,
    pastNames,
    newNames: pastNames.map((n) => n.replace("past", "new")),
    vision: options.vision && EngineVision.makeSetup(
      { ...options.vision, config: { ...options.vision.config, text: c } },
      weightsAs,
      JSON.stringify([c, weightsAs, sessionOptions])
    )
  }
}

const closedError = () => samplerError("Closed", "the policy engine was shut down")

/** A policy version's session, with an empty batch and cache. */
const newGeneration = Effect.fnUntraced(function*(setup: Setup, version: number, weights: Qwen2.Weights) {
  const c = setup.config
  const invalid = validateWeights(c, weights, setup.vision, setup.lora)
  if (invalid !== undefined) return yield* invalid
  const failed = (e: unknown) => new PolicyEngineError({ reason: new SessionFailed({ message: String(e) }) })
  // Weights as initializers are copied from the caller's arrays (external data) while the session is created; the
  // engines of this thread that sample the same version share that session.
  const options = setup.weightsAs === "inputs"
    ? setup.sessionOptions
    : { ...setup.sessionOptions, externalData: EngineModel.externalData(c, weights) }
  const create = () => ort.InferenceSession.create(setup.model, options)
  // A session over weights fed as inputs holds none: one serves every version.
  const { session, unload } = yield* EngineModel.acquireSession(
    EngineModel.sessionWeightsKey(setup.weightsAs, weights),
    setup.weightsAs === "inputs" ? 0 : version,
    setup.sessionKey,
    create,
    failed
  )
  const weightFeeds = setup.weightsAs === "inputs" ? EngineModel.weightFeeds(c, weights, setup.lora) : {}
  const cache = KvCache.make(setup.pastNames.length, setup.kvHeads, setup.headDim, setup.maxBatch)
  const mask = new BigInt64Array(0)
  const vision = setup.vision === undefined
    ? undefined
    : yield* EngineVision.session(setup.vision, setup.weightsAs, setup.sessionOptions, version, weights, failed).pipe(
      Effect.tapError(() => unload)
    )
  const both = vision === undefined ? unload : Effect.andThen(unload, vision.unload)
  const generation: Generation = { version, session, unload: both, weightFeeds, seqs: [], cache, retained: [], mask }
  return vision === undefined ? generation : { ...generation, vision }
})


// ----- The decode loop -----

/**
 * A failed step fails only the requests it touched; a defect (a bug) does the same after logging it, so the loop
 * keeps serving everyone else instead of leaving callers waiting forever.
 */
const guarded = (effect: Effect.Effect<void, SamplerError>, onError: (e: SamplerError) => Effect.Effect<void>) =>
  effect.pipe(
    Effect.catch(onError),
    Effect.catchDefect((defect) =>
      Effect.logError("PolicyEngine: defect in the decode loop", defect).pipe(
        Effect.andThen(onError(
          samplerError("ServerError", `policy engine defect: ${String(defect)}`)
        ))
      )
    )
  )

/**
 * One turn of the decode loop: takes the requests that arrived, lets waiting ones join the current generation as
 * far as the batch has room (prefilled), then decodes every generation that has running sequences and releases
 * the old ones that have none left.
 */
const step = (engine: Engine) =>
  Effect.gen(function*() {
    const { generations, mailbox, waiting } = engine
    const busy = waiting.length > 0 || generations.some((g) => g.seqs.length > 0)
    const incoming = busy ? yield* Queue.clear(mailbox) : yield* Queue.takeAll(mailbox)
    for (const s of incoming) if (!s.cancelled) waiting.push(s)
    const g = engine.current
    const room = engine.maxBatch - generations.reduce((n, x) => n + x.seqs.length, 0)
    if (waiting.length > 0 && room > 0) {
      const joining = waiting.splice(0, room)
      for (const s of joining) {
        const prefix = continued(g, s.prompt, s.imageKeys)
        s.prefix = prefix
        // A continued image conversation computes only its new images (none: it is text from here on).
        if (prefix !== undefined && s.vision !== undefined) s.vision = EngineVision.after(s.vision, prefix.images)
      }
      // Fresh prompts, continuations and prompts with images go in separate batches (a batch pads to its longest
      // new part). onnxruntime failing on a prompt batch fails those requests only; the running batch is untouched.
      const text = joining.filter((s) => s.vision === undefined)
      const fresh = text.filter((s) => s.prefix === undefined)
      for (const part of [fresh, text.filter((s) => s.prefix !== undefined)]) {
        if (part.length === 0) continue
        yield* guarded(
          prefill(engine, g, part),
          (e) => Effect.forEach(part, (s) => Deferred.fail(s.deferred, e), { discard: true })
        )
      }
      const images = joining.filter((s) => s.vision !== undefined)
      if (images.length > 0) {
        yield* guarded(
          prefill(engine, g, images, EngineVision.runner(engine.vision!, g.vision!)),
          (e) => Effect.forEach(images, (s) => Deferred.fail(s.deferred, e), { discard: true })
        )
      }
    }
    for (const x of [...generations]) {
      if (x.seqs.some((s) => s.cancelled)) removeRows(x, x.seqs.flatMap((s, i) => (s.cancelled ? [i] : [])))
      if (x.seqs.length > 0) {
        yield* guarded(
          generations.length === 1 ? decodeBurst(engine, x) : decode(engine, x),
          (e) => failAll(x, x.seqs, e)
        )
      }
      if (x !== engine.current && x.seqs.length === 0 && !EngineScore.pinned(x)) yield* retire(engine, x)
    }
  })

/** Releases an old generation nothing runs on any more (once: the loop and a scoring may both find it idle). */
const retire = (engine: Engine, g: Generation) =>
  Effect.suspend(() => {
    const i = engine.generations.indexOf(g)
    if (i < 0 || g === engine.current || g.seqs.length > 0 || EngineScore.pinned(g)) return Effect.void
    engine.generations.splice(i, 1)
    return release(g)
  })

/** Fails every unfinished request, and any submitted later, and releases the sessions. */
const close = (engine: Engine) =>
  Effect.gen(function*() {
    engine.closed = true
    yield* Queue.clear(engine.mailbox)
    yield* Effect.forEach([...engine.pending], (s) => Deferred.fail(s.deferred, closedError()), { discard: true })
    yield* Effect.forEach(engine.generations, release, { discard: true })
  })

// ----- The service's operations -----

const generate = Effect.fn("PolicyEngine.generate")(
  function*(engine: Engine, request: GenerateRequest, options?: GenerateOptions) {
    const invalid = validateRequest(engine.config, request)
    if (invalid !== undefined) return yield* invalid
    const images = options?.images ?? []
    const vision = images.length === 0 ? undefined : EngineVision.request(engine.vision, request.promptTokenIds, images)
    if (vision !== undefined && !("images" in vision)) return yield* vision
    const s = request.sampling
    const seed = s.seed ?? (yield* Random.nextInt)
    const seq: Seq = {
      deferred: yield* Deferred.make<GenerateResult, SamplerError>(),
      prompt: request.promptTokenIds,
      params: { temperature: s.temperature, topK: s.topK, topP: s.topP },
      rng: Sampling.rng(seed),
      stop: new Set(s.stopTokenIds ?? []),
      maxTokens: s.maxTokens,
      tokenIds: [],
      logprobs: [],
      onToken: options?.onToken,
      filled: 0,
      cancelled: false,
      prefix: undefined,
      vision,
      imageKeys: vision?.keys
    }
    if (engine.closed) return yield* closedError()
    engine.pending.add(seq)
    yield* Queue.offer(engine.mailbox, seq)
    return yield* Deferred.await(seq.deferred).pipe(
      Effect.onInterrupt(() => Effect.sync(() => {
        seq.cancelled = true
      })),
      Effect.ensuring(Effect.sync(() => engine.pending.delete(seq)))
    )
  }
)

const score = (engine: Engine, tokenIds: ReadonlyArray<number>, top: number) =>
  Effect.gen(function*() {
    const invalid = validateRequest(engine.config, {
      promptTokenIds: tokenIds,
      sampling: { temperature: 1, maxTokens: 1 }
    })
    if (invalid !== undefined) return yield* invalid
    if (!Number.isInteger(top) || top < 0) return yield* badRequest(`top must be an integer ≥ 0, got ${top}`)
    if (engine.closed) return yield* closedError()
    return yield* EngineScore.score(engine, engine.current, tokenIds, top, (g) => retire(engine, g))
  }).pipe(Effect.withSpan("PolicyEngine.score"))

const updateWeights = (engine: Engine, version: number, weights: Qwen2.Weights) =>
  Semaphore.withPermits(engine.updates, 1)(Effect.gen(function*() {
    if (version <= engine.current.version) {
      const current = engine.current.version
      const message = `version ${version} is not newer than the current version ${current}`
      return yield* new PolicyEngineError({ reason: new StaleVersion({ version, current, message }) })
    }
    const g = yield* newGeneration(engine, version, weights)
    engine.generations.push(g)
    engine.current = g
  })).pipe(Effect.withSpan("PolicyEngine.updateWeights"))

const snapshot = (engine: Engine): Stats => ({
  ...engine.stats,
  sessions: engine.generations.length,
  running: Object.fromEntries(engine.generations.map((g) => [g.version, g.seqs.length]))
})

// ===== Constructor =====

/**
 * Builds the engine in the current scope: creates the first session and forks the decode loop. Closing the
 * scope fails every unfinished request, and any submitted later, with a `SamplerError` of reason `Closed` and
 * releases the sessions.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fn("PolicyEngine.make")(function*(options: Options) {
  if (options.lora !== undefined && options.vision !== undefined) {
    const message = "an unmerged LoRA adapter with a vision tower is not supported: merge it (Lora.merge)"
    return yield* new PolicyEngineError({ reason: new SessionFailed({ message }) })
  }
  const setup = makeSetup(options)
  const first = yield* newGeneration(setup, options.version ?? 0, options.weights)
  const engine: Engine = {
    ...setup,
    current: first,
    generations: [first],
    mailbox: yield* Queue.bounded<Seq>(options.mailboxCapacity ?? 1024),
    waiting: [],
    stats: { decodeSteps: 0, prefills: 0, prefillTokens: 0, reusedTokens: 0, generatedTokens: 0, largestBatch: 0 },
    updates: yield* Semaphore.make(1),
    pending: new Set(),
    closed: false
  }
  yield* Effect.forever(step(engine)).pipe(Effect.forkScoped)
  yield* Effect.addFinalizer(() => close(engine))
  return PolicyEngine.of({
    config: engine.config,
    generate: (request, options) => generate(engine, request, options),
    updateWeights: (version, weights) => updateWeights(engine, version, weights),
    score: (tokenIds, options) => score(engine, tokenIds, options?.top ?? 0),
    policyVersion: Effect.sync(() => engine.current.version),
    stats: Effect.sync(() => snapshot(engine))
  })
}) satisfies (options: Options) => Effect.Effect<unknown, PolicyEngineError, Scope.Scope>
