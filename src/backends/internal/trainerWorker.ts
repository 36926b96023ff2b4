/**
 * One data-parallel trainer thread (`OnnxTrainer.Options.workers`): it owns onnxruntime sessions for the shard
 * shapes it is sent (one intra-op thread each by default), runs its shard of each micro-batch and accumulates the
 * gradients into its own shared buffer, and takes one slice of the gradient reduction and of AdamW. Messages are
 * handled one at a time, in arrival order. `trainerWorker.mjs` loads this file through tsx; `trainerPool.ts` is the
 * other end.
 *
 * This is an edge like a CLI main: plain promises, no Effect.
 */
import { parentPort, workerData } from "node:worker_threads"
import * as ort from "onnxruntime-node"
import * as AdamStep from "../../internal/adamStep.ts"
import * as CollectGarbage from "../../internal/collectGarbage.ts"
import * as NativeKernels from "../../internal/nativeKernels.ts"
import type * as ChunkedHead from "../../autodiff/ChunkedHead.ts"
import type * as Optimizer from "../../Optimizer.ts"

// ===== Protocol =====

/** Where each parameter sits in the flat shared arrays (float offsets), in the model's parameter order. */
export interface Layout {
  readonly names: ReadonlyArray<string>
  readonly offsets: ReadonlyArray<number>
  readonly lengths: ReadonlyArray<number>
  readonly total: number
}

/** What a worker is started with (`workerData`). */
export interface Init {
  readonly index: number
  readonly layout: Layout
  /** Shared arrays of `layout.total` elements: the weights, Adam's moments, the reduced gradients. */
  readonly params: SharedArrayBuffer
  readonly m: SharedArrayBuffer
  readonly v: SharedArrayBuffer
  /** The moments' precision: float32, or bfloat16 bits (2 bytes an element). */
  readonly moments: AdamStep.Precision
  readonly accum: SharedArrayBuffer
  /** Every worker's gradient accumulator, indexed by worker. */
  readonly grads: ReadonlyArray<SharedArrayBuffer>
  /** `[start, end)` float offsets of this worker's share of the reduction and of AdamW. */
  readonly slice: readonly [number, number]
  readonly sessionOptions: ort.InferenceSession.SessionOptions
  /** Free onnxruntime-node's copies of the gradients after each run (`OnnxTrainer.Options.releaseOutputs`). */
  readonly releaseOutputs: boolean
}

/** A non-weight graph input (token ids, masks, loss inputs). */
export type Feed =
  | { readonly type: "int64"; readonly data: BigInt64Array; readonly dims: ReadonlyArray<number> }
  | { readonly type: "float32"; readonly data: Float32Array; readonly dims: ReadonlyArray<number> }

export type Request =
  | {
    readonly op: "compile"
    readonly key: string
    readonly bytes: Uint8Array
    readonly weights: ReadonlyArray<{ readonly name: string; readonly dims: ReadonlyArray<number> }>
    /** `[weight, gradient output]` pairs; empty for a forward-only graph. */
    readonly gradients: ReadonlyArray<readonly [string, string]>
    /** Inputs that are rows of a weight (`Autodiff.TrainingGraph.views`). */
    readonly views: ReadonlyArray<ChunkedHead.View>
  }
  | { readonly op: "release"; readonly key: string }
  | {
    readonly op: "run"
    readonly key: string
    /** Weights version: the worker refreshes its private copy of the shared weights when it changes. */
    readonly version: number
    readonly feeds: Readonly<Record<string, Feed>>
    /** `set`: the first shard since the accumulator was cleared; `add`: later ones; `none`: forward only. */
    readonly accumulate: "set" | "add" | "none"
  }
  | { readonly op: "reduce"; readonly sources: ReadonlyArray<number> }
  | {
    readonly op: "adam"
    /** The optimiser's step count before this update. */
    readonly step: number
    readonly lr: number
    readonly scale: number
    readonly config: Optimizer.Config
  }
  /** The bytes of weights this thread holds in private copies (none of a LoRA run's base: it maps that from a file). */
  | { readonly op: "held" }
  /** Release every session and end the thread (after replying). */
  | { readonly op: "close" }
  /** Fail at once, as a bug in the thread would (tests of the failure path); never queued or answered. */
  | { readonly op: "crash" }

export interface RunResult {
  readonly loss: number
  readonly stats: Float32Array
  readonly tokenLogprobs: Float32Array
}

/** What a request returns: a run's results, the L2 norm of a reduced gradient slice, or the bytes held. */
export interface Output {
  readonly run?: RunResult
  readonly norm?: number
  readonly held?: number
}

export type Reply =
  | { readonly id: number; readonly ok: true; readonly output: Output }
  | { readonly id: number; readonly ok: false; readonly reason: "Session" | "Run"; readonly message: string }

// ===== Maths =====

/**
 * `dst[start, end) = Σ sources[start, end)`, added in the order given (zeros when there is no source); returns
 * Σ dst[i]² over the slice in float64, in index order (what `Optimizer.globalNorm` sums over the slice's views), so
 * that the reduction and the norm take one pass over the gradients instead of three.
 */
export const sumSlices = (
  dst: Float32Array,
  sources: ReadonlyArray<Float32Array>,
  start: number,
  end: number
): number => {
  let sq = 0
  const [a, b] = sources
  if (a === undefined) {
    dst.fill(0, start, end)
  } else if (sources.length === 1) {
    for (let i = start; i < end; i++) {
      const x = a[i]!
      dst[i] = x
      sq += x * x
    }
  } else if (sources.length === 2) {
    for (let i = start; i < end; i++) {
      const x = Math.fround(a[i]! + b![i]!)
      dst[i] = x
      sq += x * x
    }
  } else {
    for (let i = start; i < end; i++) {
      let x = a[i]!
      for (let s = 1; s < sources.length; s++) x = Math.fround(x + sources[s]![i]!)
      dst[i] = x
      sq += x * x
    }
  }
  return sq
}

/** Per-parameter views of the part of a flat array that lies in `[start, end)` (parameters outside are left out). */
export const sliceViews = <A extends Float32Array | Uint16Array>(
  flat: A,
  layout: Layout,
  start: number,
  end: number
): Map<string, A> => {
  const out = new Map<string, A>()
  layout.names.forEach((name, i) => {
    const from = Math.max(start, layout.offsets[i]!)
    const to = Math.min(end, layout.offsets[i]! + layout.lengths[i]!)
    if (from < to) out.set(name, flat.subarray(from, to) as A)
  })
  return out
}

/** Where each parameter's part in `[start, end)` begins in the flat arrays (the index AdamW's rounding is keyed by). */
export const sliceOffsets = (layout: Layout, start: number, end: number): Map<string, number> => {
  const out = new Map<string, number>()
  layout.names.forEach((name, i) => {
    const from = Math.max(start, layout.offsets[i]!)
    if (from < Math.min(end, layout.offsets[i]! + layout.lengths[i]!)) out.set(name, from)
  })
  return out
}

// ===== Worker =====

interface Session {
  readonly session: ort.InferenceSession
  readonly weights: ReadonlyArray<{ readonly name: string; readonly dims: ReadonlyArray<number> }>
  readonly gradients: ReadonlyArray<readonly [string, string]>
  readonly views: ReadonlyArray<ChunkedHead.View>
}

/** What a worker holds: views of the shared arrays, its private copy of the weights, its sessions. */
interface WorkerState {
  readonly init: Init
  readonly accum: Float32Array
  readonly grads: ReadonlyArray<Float32Array>
  /** This worker's gradient accumulator, by parameter. */
  readonly own: ReadonlyMap<string, Float32Array>
  /** The shared weights, by parameter. */
  readonly shared: ReadonlyMap<string, Float32Array>
  /**
   * onnxruntime-node rejects SharedArrayBuffer-backed tensors ("Invalid argument"), so the worker feeds a private
   * copy of the weights, refreshed once per weights version (one memcpy per optimiser step).
   */
  readonly local: ReadonlyMap<string, Float32Array>
  /** The weights version `local` holds (-1: none yet). */
  version: number
  /** This worker's slice of the weights, gradients and moments, for AdamW. */
  readonly adam: {
    readonly params: Map<string, Float32Array>
    readonly grads: Map<string, Float32Array>
    readonly m: Map<string, AdamStep.Moment>
    readonly v: Map<string, AdamStep.Moment>
    /** Each parameter's slice's first index over all parameters. */
    readonly offsets: ReadonlyMap<string, number>
  }
  readonly sessions: Map<string, Session>
}

const makeWorker = (init: Init): WorkerState => {
  const { layout } = init
  const f32 = (b: SharedArrayBuffer) => new Float32Array(b)
  const moment = (b: SharedArrayBuffer) => (init.moments === "bfloat16" ? new Uint16Array(b) : new Float32Array(b))
  const params = f32(init.params)
  const accum = f32(init.accum)
  const grads = init.grads.map(f32)
  const shared = sliceViews(params, layout, 0, layout.total)
  const [start, end] = init.slice
  return {
    init,
    accum,
    grads,
    own: sliceViews(grads[init.index]!, layout, 0, layout.total),
    shared,
    local: new Map([...shared].map(([k, v]) => [k, Float32Array.from(v)])),
    version: -1,
    adam: {
      params: sliceViews(params, layout, start, end),
      grads: sliceViews(accum, layout, start, end),
      m: sliceViews<AdamStep.Moment>(moment(init.m), layout, start, end),
      v: sliceViews<AdamStep.Moment>(moment(init.v), layout, start, end),
      offsets: sliceOffsets(layout, start, end)
    },
    sessions: new Map()
  }
}

/** Runs this worker's shard of a micro-batch, accumulating its gradients as asked. */
const run = async (w: WorkerState, r: Extract<Request, { op: "run" }>): Promise<RunResult> => {
  const s = w.sessions.get(r.key)
  if (s === undefined) throw new Error(`no session for ${r.key}`)
  if (w.version !== r.version) {
    for (const [name, weights] of w.local) weights.set(w.shared.get(name)!)
    w.version = r.version
  }
  const feeds: Record<string, ort.Tensor> = {}
  for (const [name, f] of Object.entries(r.feeds)) {
    feeds[name] = f.type === "int64"
      ? new ort.Tensor("int64", f.data, [...f.dims])
      : new ort.Tensor("float32", f.data, [...f.dims])
  }
  for (const weight of s.weights) {
    feeds[weight.name] = new ort.Tensor("float32", w.local.get(weight.name)!, [...weight.dims])
  }
  // The head's vocabulary slices: views of the weight's rows, no copy.
  for (const v of s.views) {
    const columns = feeds[v.of]!.dims[1]!
    const rows = (feeds[v.of]!.data as Float32Array).subarray(v.start * columns, v.end * columns)
    feeds[v.name] = new ort.Tensor("float32", rows, [v.end - v.start, columns])
  }
  const out = await s.session.run(feeds)
  if (r.accumulate !== "none") {
    for (const [weight, gradName] of s.gradients) {
      const g = out[gradName]!.data as Float32Array
      const acc = w.own.get(weight)!
      if (r.accumulate === "set") acc.set(g)
      else NativeKernels.addInto(acc, g)
    }
  }
  const logprobs = out["token_logprobs"]!.data as Float32Array
  const result = {
    loss: (out["loss"]!.data as Float32Array)[0]!,
    stats: Float32Array.from(out["stats"]!.data as Float32Array),
    tokenLogprobs: Float32Array.from(logprobs)
  }
  // onnxruntime-node's copies of the shard's gradients: freed now (`collectGarbage.ts`).
  if (s.gradients.length > 0 && w.init.releaseOutputs) {
    CollectGarbage.release(s.gradients.map(([, gradName]) => out[gradName]!.data as Float32Array))
  }
  return result
}

const handle = async (w: WorkerState, r: Request): Promise<Output> => {
  const { adam, sessions } = w
  switch (r.op) {
    case "compile": {
      const session = await ort.InferenceSession.create(r.bytes, w.init.sessionOptions)
      sessions.set(r.key, { session, weights: r.weights, gradients: r.gradients, views: r.views })
      return {}
    }
    case "release": {
      const s = sessions.get(r.key)
      sessions.delete(r.key)
      await s?.session.release()
      return {}
    }
    case "run":
      return { run: await run(w, r) }
    case "reduce": {
      // The slice's norm too, so that the global norm needs no pass over every gradient on the main thread.
      const [start, end] = w.init.slice
      return { norm: Math.sqrt(sumSlices(w.accum, r.sources.map((i) => w.grads[i]!), start, end)) }
    }
    case "held":
      return { held: [...w.local.values()].reduce((n, a) => n + a.byteLength, 0) }
    case "adam":
      AdamStep.step(
        adam.params,
        adam.grads,
        { step: r.step, m: adam.m, v: adam.v },
        r.lr,
        r.config,
        r.scale,
        AdamStep.defaultNoDecay,
        adam.offsets
      )
      return {}
    case "close":
      for (const s of sessions.values()) await s.session.release()
      sessions.clear()
      return {}
    case "crash": // handled on arrival, never queued
      throw new Error("crash requested")
  }
}

const serve = (init: Init) => {
  const worker = makeWorker(init)
  const port = parentPort!
  let queue: Promise<void> = Promise.resolve()
  port.on("message", (message: Request & { readonly id: number }) => {
    if (message.op === "crash") throw new Error("crash requested")
    queue = queue.then(() =>
      handle(worker, message).then(
        (output) => port.postMessage({ id: message.id, ok: true, output } satisfies Reply),
        (e: unknown) =>
          port.postMessage({
            id: message.id,
            ok: false,
            reason: message.op === "compile" ? "Session" : "Run",
            message: e instanceof Error ? e.message : String(e)
          })
      ).then(() => {
        // A closed thread ends itself: the pool never terminates one (see `trainerPool.ts`).
        if (message.op === "close") process.exit(0)
      })
    )
  })
  port.postMessage({ id: 0, ok: true, output: {} } satisfies Reply) // ready
}

// Only as a worker started by `trainerPool.ts` (never when a test runner imports this file on its own thread).
if (parentPort !== null && (workerData as Partial<Init> | null)?.layout !== undefined) serve(workerData as Init)
