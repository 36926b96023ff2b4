/**
 * The steps of the local policy engine (`actors/PolicyEngine.ts`) over its state record: running a session, sampling
 * the next tokens, the batch's rows and retained prefixes, prefill and decode. The engine's service, its
 * constructor and its decode loop (which calls these steps in turn) are in `PolicyEngine.ts`; the steps live here so
 * that each can be tested alone.
 */
import { Deferred, Effect, Queue, Result } from "effect"
import type { Semaphore } from "effect"
import * as ort from "onnxruntime-node"
import type * as Lora from "../../src/Lora.ts"
import type * as ModelConfig from "../../src/model/ModelConfig.ts"
import { samplerError } from "../../src/Sampler.ts"
import type { FinishReason, GenerateResult, SamplerError } from "../../src/Sampler.ts"
import * as Sampling from "../../src/Sampling.ts"
import type * as EngineVision from "./engineVision.ts"
import * as KvCache from "./kvCache.ts"

// ===== Engine state =====

export interface Seq {
  readonly deferred: Deferred.Deferred<GenerateResult, SamplerError>
  readonly prompt: ReadonlyArray<number>
  readonly params: Sampling.Params
  readonly rng: Sampling.Rng
  readonly stop: ReadonlySet<number>
  readonly maxTokens: number
  readonly tokenIds: Array<number>
  readonly logprobs: Array<number>
  readonly onToken: ((tokenId: number, logprob: number) => void) | undefined
  /** Tokens of this sequence held in the KV cache. */
  filled: number
  cancelled: boolean
  /** The cached keys/values of an earlier request this one continues (until it joins the batch). */
  prefix: KvCache.Prefix | undefined
  /**
   * An image request's images still to compute (`engineVision.ts`): all of them, or those after the retained
   * sequence it continues; absent for text.
   */
  vision?: EngineVision.VisionRequest | undefined
  /** Every image of the prompt, by content, in pad order (what a retained sequence must match). */
  readonly imageKeys?: ReadonlyArray<string> | undefined
}

export interface Generation {
  readonly version: number
  readonly session: ort.InferenceSession
  /** Releases the session (shared by the engines of this thread that sample the same version: with its last user). */
  readonly unload: Effect.Effect<void>
  readonly weightFeeds: Readonly<Record<string, ort.Tensor>>
  /** The running sequences, in the order of the cache's rows. */
  seqs: Array<Seq>
  readonly cache: KvCache.KvCache
  /** Finished sequences' keys/values, most recent last, for requests that continue them (the next turn). */
  readonly retained: Array<{
    readonly tokens: ReadonlyArray<number>
    readonly prefix: KvCache.Prefix
    /** The images its pads stand for (absent: none). */
    readonly imageKeys?: ReadonlyArray<string> | undefined
  }>
  /** The decode step's attention mask memory, reused from step to step (a new one each step is ≈ 130 KB). */
  mask: BigInt64Array
  /** The vision prefill session of an engine with a tower. */
  readonly vision?: EngineVision.VisionSession | undefined
}

/** What the engine fixes at `make` for its whole life: what every session, cache and step is built from. */
export interface Setup {
  readonly config: ModelConfig.ModelConfig
  readonly kvHeads: number
  readonly headDim: number
  readonly vocabSize: number
  /** Most sequences decoded together, over every generation. */
  readonly maxBatch: number
  readonly weightsAs: "initializers" | "inputs"
  readonly sessionOptions: ort.InferenceSession.SessionOptions
  /** The decode model without weight data (`engineModel.ts`), shared by every version's session. */
  readonly model: Uint8Array
  /** What, besides the weights and the version, decides whether two engines can share a session. */
  readonly sessionKey: string
  /** The graph's past inputs (`past.{l}.key|value`), in the order of the cache's buffers. */
  readonly pastNames: ReadonlyArray<string>
  /** The graph's outputs for the new tokens' keys/values (`new.{l}.key|value`), in the same order. */
  readonly newNames: ReadonlyArray<string>
  /** The vision prefill model of an engine with a tower (option `vision`). */
  readonly vision?: EngineVision.VisionSetup | undefined
  /** The adapter an engine decodes unmerged (option `lora`): its tensors are among the weights fed. */
  readonly lora?: Lora.Config | undefined
}

/** The counting part of {@link Stats}. */
export interface Counters {
  decodeSteps: number
  prefills: number
  prefillTokens: number
  reusedTokens: number
  generatedTokens: number
  largestBatch: number
}

/**
 * What an engine holds and changes while it runs. `PolicyEngine.make` builds it; the steps below and the decode
 * loop take it first, as the functions of Effect's `Pool.ts` take the pool. Only the decode loop (one fiber)
 * changes the batches and caches; `generate` offers to the mailbox, `updateWeights` adds a generation under
 * `updates`.
 */
export interface Engine extends Setup {
  /** The generation new requests join: the latest weights. */
  current: Generation
  /** The current generation and every older one that still has running sequences. */
  readonly generations: Array<Generation>
  /** Requests submitted and not yet taken by the decode loop. */
  readonly mailbox: Queue.Queue<Seq>
  /** Requests taken from the mailbox, waiting for a free slot in the batch. */
  readonly waiting: Array<Seq>
  readonly stats: Counters
  /** One weight update at a time. */
  readonly updates: Semaphore.Semaphore
  /**
   * Every request from submission to its result: on close each fails, wherever it is (queued, waiting, decoding, or
   * held by the step fiber between the two), and a request submitted after close fails at once.
   */
  readonly pending: Set<Seq>
  closed: boolean
}

export const int64 = (values: ArrayLike<number>, dims: ReadonlyArray<number>): ort.Tensor => {
  const data = new BigInt64Array(values.length)
  for (let i = 0; i < values.length; i++) data[i] = BigInt(values[i]!)
  return new ort.Tensor("int64", data, dims)
}


// ----- Sessions and their inputs -----

/** The cache's buffers as the graph's past inputs (a prefix of each buffer, not a copy). */
export const pastFeeds = (setup: Setup, cache: KvCache.KvCache): Record<string, ort.Tensor> => {
  const views = KvCache.views(cache)
  return Object.fromEntries(
    setup.pastNames.map((n, i) => [n, new ort.Tensor("float32", views[i]!.data, views[i]!.dims)])
  )
}

/** The new tokens' keys/values of a run, in the order of the cache's buffers. */
export const newOf = (setup: Setup, out: ort.InferenceSession.ReturnType) =>
  setup.newNames.map((n) => out[n]!.data as Float32Array)


export const run = (g: Generation, feeds: Record<string, ort.Tensor>) =>
  Effect.callback<ort.InferenceSession.ReturnType, SamplerError>((resume) => {
    g.session.run({ ...g.weightFeeds, ...feeds }).then(
      (out) => resume(Effect.succeed(out)),
      (e) => resume(Effect.fail(samplerError("ServerError", `onnxruntime: ${String(e)}`)))
    )
  })

// The cache's memory goes back to this thread's pool, for the next engine (`session.run` is synchronous, so no
// run still reads it).
export const release = (g: Generation) =>
  g.unload.pipe(Effect.andThen(Effect.sync(() => KvCache.release(g.cache))))

// ----- Sampling -----

// Completing a Deferred is synchronous; doing it inline keeps the per-step path free of extra Effect work.
export const finish = (seq: Seq, version: number, finishReason: FinishReason) =>
  Deferred.doneUnsafe(
    seq.deferred,
    Effect.succeed({ tokenIds: seq.tokenIds, logprobs: seq.logprobs, finishReason, policyVersion: version })
  )

/** Samples the next token of each sequence from `logits [B, 1, V]`; returns the indices that go on. */
export const advance = (
  engine: Pick<Engine, "vocabSize" | "config" | "stats">,
  g: Pick<Generation, "version">,
  seqs: ReadonlyArray<Seq>,
  logits: Float32Array,
  lse?: ArrayLike<number>
): Array<number> => {
  const V = engine.vocabSize
  const kept: Array<number> = []
  for (let i = 0; i < seqs.length; i++) {
    const seq = seqs[i]!
    if (seq.cancelled) continue
    const s = Sampling.sample(logits.subarray(i * V, (i + 1) * V), seq.params, seq.rng, lse?.[i])
    seq.tokenIds.push(s.tokenId)
    seq.logprobs.push(s.logprob)
    seq.onToken?.(s.tokenId, s.logprob)
    engine.stats.generatedTokens++
    if (seq.stop.has(s.tokenId)) finish(seq, g.version, "stop")
    else if (seq.tokenIds.length >= seq.maxTokens || seq.filled >= engine.config.maxPositionEmbeddings) {
      finish(seq, g.version, "length")
    } else kept.push(i)
  }
  return kept
}

// ----- The batch: retained prefixes, rows -----

/**
 * Keeps a finished sequence's keys/values: its next turn (a prompt extending its tokens) then prefills only the
 * new tokens. The cache holds every token but the last sampled one, which was never fed back.
 */
export const retain = (engine: Engine, g: Generation, row: number) => {
  const s = g.seqs[row]!
  const tokens = [...s.prompt, ...s.tokenIds.slice(0, s.filled - s.prompt.length)]
  const prefix = KvCache.take(g.cache, row, s.filled)
  g.retained.push(s.imageKeys === undefined ? { tokens, prefix } : { tokens, prefix, imageKeys: s.imageKeys })
  if (g.retained.length > 2 * engine.maxBatch) g.retained.shift()
}

/**
 * Takes the longest retained sequence that `prompt` extends by one token or more and whose images (pads say nothing
 * of which image they were) are the first of `imageKeys`; `images` is how many of them it covers.
 */
export const continued = (
  g: Pick<Generation, "retained">,
  prompt: ReadonlyArray<number>,
  imageKeys: ReadonlyArray<string> = []
): (KvCache.Prefix & { readonly images: number }) | undefined => {
  let best = -1
  g.retained.forEach((e, k) => {
    if (e.tokens.length >= prompt.length || (best >= 0 && e.tokens.length <= g.retained[best]!.tokens.length)) return
    const keys = e.imageKeys ?? []
    if (keys.length > imageKeys.length || keys.some((key, i) => key !== imageKeys[i])) return
    for (let i = 0; i < e.tokens.length; i++) if (e.tokens[i] !== prompt[i]) return
    best = k
  })
  if (best < 0) return undefined
  const entry = g.retained.splice(best, 1)[0]!
  return { ...entry.prefix, images: entry.imageKeys?.length ?? 0 }
}

/** Removes the given rows (cancelled or finished sequences) from the batch, last first. */
export const removeRows = (g: Generation, rows: ReadonlyArray<number>) => {
  for (const r of [...rows].sort((a, b) => b - a)) {
    KvCache.remove(g.cache, r)
    g.seqs[r] = g.seqs[g.seqs.length - 1]!
    g.seqs.pop()
  }
}

/** Fails every sequence of a generation whose step failed, and resets its batch. */
export const failAll = (g: Generation, seqs: ReadonlyArray<Seq>, error: SamplerError) =>
  Effect.forEach(seqs, (s) => Deferred.fail(s.deferred, error), { discard: true }).pipe(
    Effect.andThen(Effect.sync(() => {
      g.seqs = []
      g.cache.rows = 0
    }))
  )

// ----- Prefill -----

/**
 * Prefills joining requests in one batch. Each distinct prompt is computed once (the chains of a group share
 * theirs), and only its tokens after the prefix it continues, if any; its keys/values and logits then serve
 * every request that has it (each still samples with its own RNG).
 */
export const prefill = Effect.fnUntraced(function*(
  engine: Engine,
  g: Generation,
  joining: ReadonlyArray<Seq>,
  /** Runs the batch instead of the text session (an image batch: `engineVision.ts`), given its distinct prompts. */
  runOn?: (
    feeds: Record<string, ort.Tensor>,
    distinct: ReadonlyArray<Seq>,
    ids: ReadonlyArray<number>
  ) => Effect.Effect<ort.InferenceSession.ReturnType, SamplerError>
) {
  const { kvHeads: KV, headDim: hd, vocabSize: V, pastNames, stats } = engine
  const distinct: Array<Seq> = [], rowOf: Array<number> = [], byPrompt = new Map<string, number>()
  for (const s of joining) {
    const key = s.vision === undefined ? s.prompt.join(",") : `${s.prompt.join(",")}|${s.vision.key}`
    let row = byPrompt.get(key)
    if (row === undefined) byPrompt.set(key, row = distinct.push(s) - 1)
    rowOf.push(row)
  }
  const prefixes = distinct.map((s) => s.prefix ?? KvCache.emptyPrefix(pastNames.length))
  const N = distinct.length, W = Math.max(...prefixes.map((p) => p.length))
  const S = Math.max(...distinct.map((s, i) => s.prompt.length - prefixes[i]!.length))
  const ids = new Array<number>(N * S).fill(0)
  const mask = new Array<number>(N * (W + S)).fill(0)
  const pos = new Array<number>(N * S).fill(0)
  distinct.forEach((s, i) => {
    const n = prefixes[i]!.length, pad = S - (s.prompt.length - n)
    mask.fill(1, i * (W + S), i * (W + S) + n) // the prefix, free slots, padding, then the new tokens
    for (let j = n; j < s.prompt.length; j++) {
      const t = pad + j - n
      ids[i * S + t] = s.prompt[j]!
      mask[i * (W + S) + W + t] = 1
      pos[i * S + t] = j
    }
  })
  for (const s of joining) {
    s.filled = s.prompt.length
    s.prefix = undefined
  }
  const past = KvCache.stack(prefixes, W, KV, hd)
  const feeds = {
    ...Object.fromEntries(pastNames.map((n, k) => [n, new ort.Tensor("float32", past[k]!, [N, KV, W, hd])])),
    input_ids: int64(ids, [N, S]),
    attention_mask: int64(mask, [N, W + S]),
    position_ids: int64(pos, [N, S])
  }
  const out = yield* (runOn === undefined ? run(g, feeds) : runOn(feeds, distinct, ids))
  stats.prefills++
  stats.prefillTokens += N * S
  stats.reusedTokens += prefixes.reduce((n, p) => n + p.length, 0)
  const logits = out["logits"]!.data as Float32Array
  const perSeq = new Float32Array(joining.length * V)
  rowOf.forEach((row, i) => perSeq.set(logits.subarray(row * V, (row + 1) * V), i * V))
  const lse = rowLse(out)
  const rows = advance(engine, g, joining, perSeq, lse && rowOf.map((row) => lse[row]!))
  const filled = g.seqs.map((s) => s.filled)
  KvCache.fit(g.cache, Math.max(...joining.map((s) => s.filled), ...filled) + 1, filled)
  const added = rows.map((i) => ({ index: rowOf[i]!, filled: joining[i]!.filled, prefix: prefixes[rowOf[i]!] }))
  KvCache.append(g.cache, newOf(engine, out), S, added)
  g.seqs.push(...rows.map((i) => joining[i]!))
})

// ----- Decode -----

export const decodeFeeds = (engine: Engine, g: Generation): Record<string, ort.Tensor> => {
  // Every row needs a free slot for this step's token.
  KvCache.fit(g.cache, g.seqs.reduce((m, s) => Math.max(m, s.filled), 0) + 1, g.seqs.map((s) => s.filled))
  const B = g.seqs.length, T = g.cache.capacity
  const ids = new BigInt64Array(B), pos = new BigInt64Array(B)
  if (g.mask.length < B * (T + 1)) g.mask = new BigInt64Array(engine.maxBatch * (T + 1))
  const mask = g.mask.subarray(0, B * (T + 1)).fill(0n)
  g.seqs.forEach((s, i) => {
    ids[i] = BigInt(s.tokenIds[s.tokenIds.length - 1]!)
    pos[i] = BigInt(s.filled)
    mask.fill(1n, i * (T + 1), i * (T + 1) + s.filled) // the cached tokens, free slots, then the new token
    mask[i * (T + 1) + T] = 1n
  })
  return {
    ...pastFeeds(engine, g.cache),
    input_ids: new ort.Tensor("int64", ids, [B, 1]),
    attention_mask: new ort.Tensor("int64", mask, [B, T + 1]),
    position_ids: new ort.Tensor("int64", pos, [B, 1])
  }
}

/** Each row's log-sum-exp of its logits, where the model computes it (`Qwen2.ForwardOptions.fusedKernels`). */
const rowLse = (out: ort.InferenceSession.ReturnType): Float64Array | undefined =>
  out["logsumexp"]?.data as Float64Array | undefined

export const afterDecode = (engine: Engine, g: Generation, out: ort.InferenceSession.ReturnType): void => {
  const { stats } = engine
  const B = g.seqs.length
  stats.decodeSteps++
  stats.largestBatch = Math.max(stats.largestBatch, B)
  KvCache.write(g.cache, newOf(engine, out), g.seqs.map((s) => s.filled))
  for (const s of g.seqs) s.filled++
  const kept = advance(engine, g, g.seqs, out["logits"]!.data as Float32Array, rowLse(out))
  if (kept.length < B) {
    const staying = new Set(kept)
    const leaving = g.seqs.flatMap((_, i) => (staying.has(i) ? [] : [i]))
    for (const i of leaving) if (!g.seqs[i]!.cancelled) retain(engine, g, i)
    removeRows(g, leaving)
  }
}

/** One decode step through the fiber (used while several versions share the loop). */
export const decode = (engine: Engine, g: Generation) =>
  Effect.flatMap(run(g, decodeFeeds(engine, g)), (out) => Effect.sync(() => afterDecode(engine, g, out)))

/**
 * Decodes steps back to back while nothing else needs the loop: no request waiting for a free slot and a single
 * policy version running. Each step then costs one onnxruntime promise, as in a raw loop, instead of a fiber
 * resumption (≈ 60 µs per step, a quarter of a batch-1 step of the tiny model). New requests, cancellations and
 * weight updates end the burst at the next step boundary.
 */
export const decodeBurst = (engine: Engine, g: Generation) =>
  Effect.callback<void, SamplerError>((resume) => {
    let stopped = false
    const next = (first: boolean): void => {
      if (stopped) return
      const joinable = Queue.sizeUnsafe(engine.mailbox) > 0 ||
        (engine.waiting.length > 0 && g.seqs.length < engine.maxBatch)
      if (!first && (g.seqs.length === 0 || joinable || g !== engine.current || g.seqs.some((s) => s.cancelled))) {
        return resume(Effect.void)
      }
      g.session.run({ ...g.weightFeeds, ...decodeFeeds(engine, g) }).then(
        (out) => {
          if (stopped) return
          const done = Result.try(() => afterDecode(engine, g, out))
          if (Result.isFailure(done)) return resume(Effect.die(done.failure))
          next(false)
        },
        (e) => {
          if (stopped) return
          resume(Effect.fail(samplerError("ServerError", `onnxruntime: ${String(e)}`)))
        }
      )
    }
    next(true)
    return Effect.sync(() => {
      stopped = true
    })
  })
