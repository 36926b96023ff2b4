/**
 * The Tinker server's futures: what it accepted, in what order each model runs it, and what each came to.
 *
 * - **Order.** A model's calls run one at a time in the order they were accepted (a queue and a fiber per model);
 *   `asample` runs beside them (it reads the engine, not the learner).
 * - **Exactly once.** A request is accepted once: a retry bearing the same `X-Idempotency-Key`, or the same
 *   `(model_id, seq_id)` with the same body (SkyRL's rule), answers the future the first one made; the same
 *   `(model_id, seq_id)` with another body is refused (409). Acceptance is written to the {@link FutureLog} before
 *   the answer, an outcome before `retrieve_future` can see it.
 * - **Restart.** {@link replay} rebuilds the state from the log: calls that change a model (`create_model`,
 *   `forward_backward`, `optim_step`, `load_weights`, `save_weights_for_sampler`, `unload_model`) run again in order
 *   (their recorded outcomes stand; the learner is deterministic on the CPU, so the weights come out the same);
 *   calls accepted without an outcome run for the first time. An optimiser step whose answer was lost, or whose
 *   process died, is thus applied once to the state its client saw.
 * - **Snapshots.** Every `snapshotEvery`-th publication of sampler weights (with no gradients pending) writes the
 *   model's state (`Models.snapshot`) and a log entry; a replay restores a model's last snapshot and runs only the
 *   calls after it, so a restart costs the calls since the last snapshot, not the whole run.
 *
 * @since 0.1.0
 */
import { Cause, Deferred, Effect, Exit, FileSystem, Queue, Schema, Scope, Semaphore } from "effect"
import type * as Lora from "../../src/Lora.ts"
import * as Types from "../../src/tinker/Types.ts"
import type { Sampler } from "../../src/Sampler.ts"
import type * as FutureLog from "./FutureLog.ts"
import * as Models from "./Models.ts"

// ===== Models =====

/** What a future came to (the JSON of its result, or its failure). */
export type Outcome = { readonly ok: unknown } | { readonly failed: Models.Failed }

/**
 * A future: its request and, once done, its outcome.
 *
 * @category models
 * @since 0.1.0
 */
export interface Future {
  readonly id: string
  readonly route: string
  /** The body as received (what the log keeps, and what a retry is compared with). */
  readonly body: unknown
  /** The body decoded with its route's Schema. */
  readonly request: unknown
  readonly model: string | undefined
  readonly done: Deferred.Deferred<Outcome>
}

/** A model's slot: its base and adapter (known at acceptance), its queue, and the model once created. */
interface Slot {
  readonly id: string
  /** Absent: a logged model whose base this server no longer offers (its creation fails). */
  readonly base: Models.Base | undefined
  readonly lora: Lora.Config | undefined
  readonly queue: Queue.Queue<Job>
  hosted: Models.Hosted | Models.Failed | undefined
}

interface Job {
  readonly future: Future
  /** The outcome the log holds (a replay): it stands, whatever this run gives. */
  readonly recorded: Outcome | undefined
}

/**
 * Options of the futures' state.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly bases: ReadonlyArray<Models.Base>
  /** Where checkpoints go (`checkpoints/MODEL/NAME`). */
  readonly checkpoints: string
  /** Each model's learner threads. */
  readonly workers: number
  /** Where snapshots go (`snapshots/MODEL/FUTURE`). */
  readonly snapshots: string
  /** Publications of sampler weights between snapshots of a model (0: none). */
  readonly snapshotEvery: number
  /** Runs before each future's work (tests hold a future pending with it). */
  readonly beforeRun?: ((route: string, id: string) => Effect.Effect<void>) | undefined
}

/**
 * The state.
 *
 * @category models
 * @since 0.1.0
 */
export interface State {
  readonly options: Options
  readonly log: FutureLog.FutureLog
  readonly scope: Scope.Scope
  readonly fs: FileSystem.FileSystem
  readonly sessions: Set<string>
  readonly slots: Map<string, Slot>
  readonly futures: Map<string, Future>
  readonly byKey: Map<string, string>
  readonly bySeq: Map<string, string>
  /** Acceptances one at a time: a retry racing its original finds it. */
  readonly accepting: Semaphore.Semaphore
  readonly baseSamplers: Map<string, Deferred.Deferred<Sampler["Service"], Models.Failed>>
  nextId: number
}

/** Calls that change a model: a replay runs them again. */
const mutating = new Set([
  "create_model",
  "forward_backward",
  "optim_step",
  "load_weights",
  "save_weights_for_sampler",
  "unload_model"
])

// ===== Work =====

/**
 * The requests that make futures, by route, with their Schemas.
 *
 * @category models
 * @since 0.1.0
 */
export const futureRoutes = {
  create_model: Types.CreateModelRequest,
  forward: Types.ForwardRequest,
  forward_backward: Types.ForwardBackwardRequest,
  optim_step: Types.OptimStepRequest,
  save_weights_for_sampler: Types.SaveWeightsForSamplerRequest,
  save_weights: Types.SaveWeightsRequest,
  load_weights: Types.LoadWeightsRequest,
  asample: Types.SampleRequest,
  unload_model: Types.UnloadModelRequest
} as const
export type FutureRoute = keyof typeof futureRoutes

/**
 * @category guards
 * @since 0.1.0
 */
export const isFutureRoute = (route: string): route is FutureRoute => Object.hasOwn(futureRoutes, route)

/**
 * The request Schema of a future-making route.
 *
 * @category constructors
 * @since 0.1.0
 */
export const schemaOf = (route: FutureRoute) => futureRoutes[route] as Schema.Codec<unknown, unknown, never, never>

/** A logged body decoded with its route's Schema (it was decoded so when accepted: a failure here is a defect). */
const decodeLogged = (route: string, body: unknown): unknown =>
  isFutureRoute(route) ? Schema.decodeUnknownSync(schemaOf(route))(body) : body

/** The model a call needs, created and not unloaded. */
const hostedOf = (slot: Slot): Effect.Effect<Models.Hosted, Models.Failed> =>
  slot.hosted === undefined ?
    Effect.fail(Models.failed("user", `model ${slot.id} was unloaded`)) :
    "category" in slot.hosted ?
    Effect.fail(Models.failed("user", `model ${slot.id} could not be created: ${slot.hosted.error}`)) :
    Effect.succeed(slot.hosted)

/** The work of a model's future. */
const work = (
  state: State,
  slot: Slot,
  future: Future
): Effect.Effect<unknown, Models.Failed, FileSystem.FileSystem> => {
  const { request } = future
  switch (future.route) {
    case "create_model":
      if (slot.base === undefined) {
        return Effect.fail(Models.failed("user", `the base model of ${slot.id} is not offered by this server now`))
      }
      return Models.create(slot.id, slot.base, slot.lora, state.options).pipe(
        Effect.tapError((f) => Effect.sync(() => void (slot.hosted = f))),
        Effect.map((h) => {
          slot.hosted = h
          return Types.encodeJson(Types.CreateModelResponse, { model_id: slot.id, type: "create_model" })
        })
      )
    case "forward_backward":
      return Effect.flatMap(hostedOf(slot), (h) =>
        Models.forwardBackward(h, (request as Types.ForwardBackwardRequest).forward_backward_input))
    case "forward":
      return Effect.flatMap(hostedOf(slot), (h) => Models.forward(h, (request as Types.ForwardRequest).forward_input))
    case "optim_step":
      return Effect.flatMap(hostedOf(slot), (h) =>
        Models.optimStep(h, (request as Types.OptimStepRequest).adam_params))
    case "save_weights":
      return Effect.flatMap(hostedOf(slot), (h) =>
        Models.saveWeights(h, request as Types.SaveWeightsRequest, `checkpoint-${future.id}`))
    case "load_weights":
      return Effect.flatMap(hostedOf(slot), (h) => Models.loadWeights(h, request as Types.LoadWeightsRequest))
    case "save_weights_for_sampler":
      return Effect.flatMap(hostedOf(slot), (h) =>
        Models.saveForSampler(h, request as Types.SaveWeightsForSamplerRequest).pipe(
          Effect.tap(() => snapshotAfter(state, h, future.id))
        ))
    case "restore_snapshot":
      return Effect.flatMap(hostedOf(slot), (h) =>
        Models.restore(h, future.body as string).pipe(
          // Calls after the snapshot would run on the wrong state: the model is lost instead.
          Effect.tapError((f) => Effect.sync(() => void (slot.hosted = Models.failed("server", f.error))))
        ))
    case "unload_model":
      return Effect.flatMap(hostedOf(slot), (h) =>
        Models.close(h).pipe(
          Effect.andThen(Effect.sync(() => void (slot.hosted = undefined))),
          Effect.as(Types.encodeJson(Types.UnloadModelResponse, { model_id: slot.id, type: "unload_model" }))
        ))
    default:
      return Effect.fail(Models.failed("server", `no work for ${future.route}`))
  }
}

/**
 * A snapshot of `h` after future `id` when one is due (then the model's older snapshots go). A failed snapshot fails
 * nothing: the log still holds every call.
 */
const snapshotAfter = (state: State, h: Models.Hosted, id: string) => {
  const every = state.options.snapshotEvery
  if (every <= 0 || h.samplerVersion % every !== 0 || h.pending > 0) return Effect.void
  const root = `${state.options.snapshots}/${h.id}`
  const dir = `${root}/${id}`
  return Effect.gen(function*() {
    const older = yield* state.fs.readDirectory(root).pipe(Effect.orElseSucceed((): Array<string> => []))
    yield* Models.snapshot(h, dir)
    yield* state.log.append({ t: "snapshot", model: h.id, after: id, dir })
    for (const name of older) yield* state.fs.remove(`${root}/${name}`, { recursive: true }).pipe(Effect.ignore)
  }).pipe(
    Effect.catch((e) => Effect.logWarning(`snapshot of ${h.id} after ${id} failed: ${e.error}`)),
    Effect.provideService(FileSystem.FileSystem, state.fs)
  )
}

/** The sampler an `asample` request names: a model's newest sampler weights, or a base model's own. */
const samplerFor = (state: State, request: Types.SampleRequest) =>
  Effect.gen(function*() {
    const path = request.model_path ?? request.sampling_session_id
    if (path !== undefined && !path.startsWith("base:")) {
      const parsed = Models.parsePath(path)
      const slot = parsed === undefined ? undefined : state.slots.get(parsed.model)
      if (slot === undefined) return yield* Effect.fail(Models.failed("user", `no sampler weights ${path} here`))
      const found = Models.samplerOf(yield* hostedOf(slot), path)
      return "category" in found ? yield* Effect.fail(found) : found.sampler
    }
    const name = path?.slice("base:".length) ?? request.base_model
    const base = state.options.bases.find((b) => b.name === name)
    if (base === undefined) return yield* Effect.fail(Models.failed("user", `no base model ${name} here`))
    let sampler = state.baseSamplers.get(base.name)
    if (sampler === undefined) {
      const made = yield* Deferred.make<Sampler["Service"], Models.Failed>()
      state.baseSamplers.set(base.name, made)
      yield* Deferred.into(Models.baseSampler(base, state.scope), made)
      sampler = made
    }
    return yield* Deferred.await(sampler)
  })

/** Runs `future`'s work and records its outcome (unless a replay already holds one), then completes it. */
const execute = (state: State, job: Job, work: Effect.Effect<unknown, Models.Failed, FileSystem.FileSystem>) =>
  Effect.gen(function*() {
    const { future } = job
    if (state.options.beforeRun !== undefined) yield* state.options.beforeRun(future.route, future.id)
    const exit = yield* Effect.exit(Effect.provideService(work, FileSystem.FileSystem, state.fs))
    if (Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)) return yield* Effect.interrupt
    const outcome: Outcome = Exit.isSuccess(exit) ?
      { ok: exit.value } :
      {
        failed: Cause.findErrorOption(exit.cause).pipe((o) =>
          o._tag === "Some" ? o.value : Models.failed("server", `internal error: ${Cause.pretty(exit.cause)}`)
        )
      }
    if (job.recorded === undefined) yield* state.log.append({ t: "outcome", id: future.id, ...outcome })
    else if (("ok" in outcome) !== ("ok" in job.recorded)) {
      yield* Effect.logWarning(`replayed future ${future.id} (${future.route}) came out otherwise than recorded`)
    }
    yield* Deferred.succeed(future.done, job.recorded ?? outcome)
  })

/** A model's slot, with the fiber that runs its queue in the state's scope. */
const openSlot = (state: State, id: string, base: Models.Base | undefined, lora: Lora.Config | undefined) =>
  Effect.gen(function*() {
    const queue = yield* Queue.unbounded<Job>()
    const slot: Slot = { id, base, lora, queue, hosted: undefined }
    state.slots.set(id, slot)
    yield* Queue.take(queue).pipe(
      Effect.flatMap((job) => execute(state, job, work(state, slot, job.future))),
      Effect.forever,
      Effect.forkIn(state.scope)
    )
    yield* Scope.addFinalizer(
      state.scope,
      Effect.suspend(() =>
        slot.hosted !== undefined && !("category" in slot.hosted) ? Models.close(slot.hosted) : Effect.void
      )
    )
    return slot
  })

/** Starts `future` (a model's queue, or beside it for `asample`). */
const start = (state: State, future: Future, recorded: Outcome | undefined) => {
  const job: Job = { future, recorded }
  if (future.route === "asample") {
    const request = future.request as Types.SampleRequest
    const sample = Effect.flatMap(samplerFor(state, request), (sampler) => Models.sample(sampler, request))
    return Effect.asVoid(Effect.forkIn(execute(state, job, sample), state.scope))
  }
  const slot = future.model === undefined ? undefined : state.slots.get(future.model)
  return slot === undefined ?
    Deferred.succeed(future.done, { failed: Models.failed("user", `no model ${future.model}`) }) :
    Queue.offer(slot.queue, job)
}

// ===== Acceptance =====

/**
 * What a request that makes a future says about itself (from its decoded body).
 *
 * @category models
 * @since 0.1.0
 */
export interface Request {
  readonly route: string
  /** The body as received (what the log keeps). */
  readonly body: unknown
  /** The body decoded. */
  readonly request: unknown
  readonly key: string | undefined
  readonly model: string | undefined
  readonly seq: number | undefined
  /** For `create_model`: the model's base and adapter. */
  readonly create?: { readonly base: Models.Base; readonly lora: Lora.Config | undefined } | undefined
}

/**
 * The answer to a future-making request: the future it made, or the one a retry of it names; `conflict` when the
 * same `seq_id` of a model came with another request.
 *
 * @category constructors
 * @since 0.1.0
 */
export const accept = (state: State, request: Request) =>
  state.accepting.withPermits(1)(Effect.gen(function*() {
    const again = request.key === undefined ? undefined : state.byKey.get(request.key)
    if (again !== undefined) return { future: state.futures.get(again)!, fresh: false } as const
    const seqKey = request.model === undefined || request.seq === undefined ?
      undefined :
      `${request.model}#${request.seq}`
    const earlier = seqKey === undefined ? undefined : state.futures.get(state.bySeq.get(seqKey) ?? "")
    if (earlier !== undefined) {
      const same = earlier.route === request.route && JSON.stringify(earlier.body) === JSON.stringify(request.body)
      return same ? { future: earlier, fresh: false } as const : "conflict" as const
    }
    const id = String(state.nextId)
    const model = request.route === "create_model" ? `model-${id}` : request.model
    yield* state.log.append({
      t: "request",
      id,
      route: request.route,
      body: request.body,
      ...(request.key === undefined ? {} : { key: request.key }),
      ...(model === undefined ? {} : { model }),
      ...(request.seq === undefined ? {} : { seq: request.seq })
    })
    const future = yield* register(state, { ...request, id, model })
    if (request.create !== undefined) yield* openSlot(state, model!, request.create.base, request.create.lora)
    yield* start(state, future, undefined)
    return { future, fresh: true } as const
  }))

/** Indexes a future by id, idempotency key and `(model, seq_id)`. */
const register = (
  state: State,
  r: {
    readonly id: string
    readonly route: string
    readonly body: unknown
    readonly request: unknown
    readonly model: string | undefined
    readonly key: string | undefined
    readonly seq: number | undefined
  }
) =>
  Effect.map(Deferred.make<Outcome>(), (done) => {
    const future: Future = { id: r.id, route: r.route, body: r.body, request: r.request, model: r.model, done }
    state.futures.set(r.id, future)
    state.nextId = Math.max(state.nextId, Number(r.id) + 1)
    if (r.key !== undefined) state.byKey.set(r.key, r.id)
    if (r.model !== undefined && r.seq !== undefined) state.bySeq.set(`${r.model}#${r.seq}`, r.id)
    return future
  })

// ===== Constructors =====

/**
 * The state over `log` in the current scope, its accepted calls replayed (see the module's notes).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fnUntraced(function*(options: Options, log: FutureLog.FutureLog) {
  const state: State = {
    options,
    log,
    scope: yield* Effect.scope,
    fs: yield* FileSystem.FileSystem,
    sessions: new Set(),
    slots: new Map(),
    futures: new Map(),
    byKey: new Map(),
    bySeq: new Map(),
    accepting: yield* Semaphore.make(1),
    baseSamplers: new Map(),
    nextId: 1
  }
  yield* replay(state)
  return state
})

/** Rebuilds `state` from its log: sessions, futures, and models by running their calls again. */
const replay = (state: State) =>
  Effect.gen(function*() {
    const entries = [...state.log.entries]
    const outcomes = new Map<string, Outcome>()
    for (const e of entries) {
      if (e.t === "outcome") outcomes.set(e.id, e.failed !== undefined ? { failed: e.failed } : { ok: e.ok })
    }
    const snapshots = new Map<string, FutureLog.Snapshot>()
    for (const e of entries) if (e.t === "snapshot") snapshots.set(e.model, e)
    const later: Array<readonly [Future, Outcome | undefined]> = []
    for (const e of entries) {
      if (e.t === "session") state.sessions.add(e.id)
      if (e.t !== "request") continue
      const request = decodeLogged(e.route, e.body)
      const future = yield* register(state, { ...e, request, model: e.model, key: e.key, seq: e.seq })
      const recorded = outcomes.get(e.id)
      const snapshot = e.model === undefined ? undefined : snapshots.get(e.model)
      if (e.route === "create_model") {
        yield* openSlot(state, e.model!, ...createOf(state, request))
        yield* start(state, future, recorded)
        if (snapshot !== undefined) yield* restoreAfterCreate(state, snapshot)
        continue
      }
      // Covered by the model's snapshot: done before it was taken (a sample may not be: it runs beside the queue).
      if (snapshot !== undefined && Number(e.id) <= Number(snapshot.after) && recorded !== undefined) {
        yield* Deferred.succeed(future.done, recorded)
        continue
      }
      const rerun = mutating.has(e.route) || (recorded === undefined && e.route !== "asample")
      if (rerun) yield* start(state, future, recorded)
      else if (recorded !== undefined) yield* Deferred.succeed(future.done, recorded)
      else later.push([future, recorded])
    }
    // Samples accepted before the restart run once the models are back (their sampler weights republished).
    if (later.length > 0) {
      yield* Effect.forEach(state.slots.values(), (slot) => awaitQueue(state, slot), { discard: true })
      yield* Effect.forEach(later, ([future, recorded]) => start(state, future, recorded), { discard: true })
    }
  })

/** Queues the restoration of `snapshot` on its model (right after its creation): not a future of the API. */
const restoreAfterCreate = (state: State, snapshot: FutureLog.Snapshot) =>
  Effect.gen(function*() {
    const done = yield* Deferred.make<Outcome>()
    const future: Future = {
      id: `snapshot-${snapshot.after}`,
      route: "restore_snapshot",
      body: snapshot.dir,
      request: snapshot.dir,
      model: snapshot.model,
      done
    }
    // Recorded as done: its outcome is not written to the log.
    yield* start(state, future, { ok: null })
  })

/** Waits until every future queued on `slot` so far is done. */
const awaitQueue = (state: State, slot: Slot) =>
  Effect.forEach([...state.futures.values()].filter((f) => f.model === slot.id && f.route !== "asample"), (f) =>
    Deferred.await(f.done), { discard: true })

/** The base and adapter of a logged `create_model` body (checked when it was accepted). */
const createOf = (state: State, decoded: unknown): readonly [Models.Base | undefined, Lora.Config | undefined] => {
  const request = decoded as Types.CreateModelRequest
  const base = state.options.bases.find((b) => b.name === request.base_model)
  const lora = Models.loraOf(request.lora_config)
  return [base, lora !== undefined && "category" in lora ? undefined : lora]
}
