/**
 * LoRA adapters on `agentfly serve`, through vLLM's documented dynamic-adapter endpoints (vLLM "LoRA Adapters",
 * "Dynamically serving LoRA Adapters": `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` with a JSON
 * body `{ "lora_name", "lora_path" }`, then requests naming `lora_name` as their `model`). An adapter is a PEFT
 * folder (`adapter_config.json`, `adapter_model.safetensors`: `src/Lora.ts`) on this machine's file system; loading
 * it merges it into the server's base weights and gives it an engine of its own, so a request naming it samples
 * the adapted model and one naming the base samples the base.
 *
 * **No silent sync.** Every response sampled with an adapter carries `lora_adapter: { name, digest,
 * policy_version }`, the digest being `Checkpoint.fingerprint` of the tensors the server loaded (what the trainer
 * computes over the adapter it published): a trainer compares it with what it published (`LoraSync.ts`), so a
 * server that acknowledged a load and kept an older adapter is caught at the next batch.
 *
 * Loading and unloading need `--accept-weights` (and its token, when set), as pushing weights does: vLLM gates the
 * same endpoints behind `VLLM_ALLOW_RUNTIME_LORA_UPDATING`.
 */
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import type * as Http from "node:http"
import { Effect, Exit, Schema, Scope } from "effect"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Lora from "../../src/Lora.ts"
import * as PolicyEngine from "../PolicyEngine.ts"
import * as Auth from "./auth.ts"
import { type Adapter, adapterStamp, type ServerState } from "./openAiServerState.ts"
import * as Wire from "./openAiWire.ts"

const LoadBody = Schema.Struct({
  lora_name: Schema.String.check(Schema.isMinLength(1)),
  lora_path: Schema.String.check(Schema.isMinLength(1)),
  /** vLLM's: replace an adapter already loaded under this name. */
  load_inplace: Schema.optionalKey(Schema.Boolean),
  /** This server's extension: the policy version the adapter was published as (default 0). */
  policy_version: Schema.optionalKey(Schema.Int)
})

const UnloadBody = Schema.Struct({
  lora_name: Schema.String.check(Schema.isMinLength(1)),
  lora_int_id: Schema.optionalKey(Schema.Int)
})

/** The same rights as a weights push: `--accept-weights`, POST, and the weights token when one is set. */
const allowed = (state: ServerState, req: Http.IncomingMessage, path: string): Effect.Effect<void, Wire.ApiError> => {
  if (state.limits.acceptWeights === undefined) {
    const message = "this server does not load adapters (start it with --accept-weights)"
    return Effect.fail(new Wire.ApiError({ status: 404, message, code: "weights_not_accepted" }))
  }
  if (req.method !== "POST") return Effect.fail(Wire.notAllowed(req.method ?? "GET", path, "POST"))
  if (state.weightsAuth !== undefined && !Auth.authorize(state.weightsAuth, req).ok) {
    const message = "a valid bearer token is required to load or unload adapters"
    return Effect.fail(new Wire.ApiError({ status: 401, message, code: "unauthorized" }))
  }
  return Effect.void
}

const decode = <S extends Schema.Codec<unknown, unknown>>(schema: S, raw: unknown) =>
  Schema.decodeUnknownEffect(schema)(raw).pipe(
    Effect.mapError((e) => Wire.invalid(e.message))
  ) as Effect.Effect<S["Type"], Wire.ApiError>

/**
 * `POST /v1/load_lora_adapter`: reads the PEFT folder at `lora_path`, merges it into the base and starts its engine.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fnUntraced(function*(state: ServerState, req: Http.IncomingMessage) {
  yield* allowed(state, req, "/v1/load_lora_adapter")
  const body = yield* decode(LoadBody, yield* Wire.readJson(req, state.limits.maxBodyBytes))
  const adapters = state.adapters
  if (adapters.base === undefined) {
    return yield* Wire.invalid("this server has no base weights for adapters", "lora_path")
  }
  const name = body.lora_name
  if (name === state.model.name) return yield* Wire.invalid(`${name} is the base model's name`, "lora_name")
  const old = adapters.loaded.get(name)
  if (old !== undefined && body.load_inplace !== true) {
    return yield* Wire.invalid(`The lora adapter '${name}' has already been loaded.`, "lora_name")
  }
  const read = yield* Lora.load(body.lora_path, state.config).pipe(
    Effect.provide(NodeFileSystem.layer),
    Effect.mapError((e) => Wire.invalid(e.message, "lora_path"))
  )
  const merged = Lora.merge(state.config, read.config, adapters.base, read.adapter)
  const scope = yield* Scope.fork(adapters.scope)
  const version = body.policy_version ?? 0
  const engine = yield* PolicyEngine.make({
    config: state.config,
    weights: merged,
    version,
    maxBatchSize: adapters.maxBatchSize
  }).pipe(
    Scope.provide(scope),
    Effect.tapError(() => Scope.close(scope, Exit.void)),
    Effect.mapError((e) => new Wire.ApiError({ status: 500, message: e.message }))
  )
  const adapter: Adapter = {
    name,
    path: body.lora_path,
    digest: Checkpoint.fingerprint(read.adapter),
    version,
    engine,
    scope
  }
  adapters.loaded.set(name, adapter)
  if (old !== undefined) yield* Scope.close(old.scope, Exit.void)
  return { lora_name: name, digest: adapter.digest, policy_version: version }
})

/**
 * `POST /v1/unload_lora_adapter`: stops the adapter's engine (its requests in flight are interrupted).
 *
 * @category constructors
 * @since 0.1.0
 */
export const unload = Effect.fnUntraced(function*(state: ServerState, req: Http.IncomingMessage) {
  yield* allowed(state, req, "/v1/unload_lora_adapter")
  const body = yield* decode(UnloadBody, yield* Wire.readJson(req, state.limits.maxBodyBytes))
  const adapter = state.adapters.loaded.get(body.lora_name)
  if (adapter === undefined) {
    return yield* Wire.notFound(`The lora adapter '${body.lora_name}' cannot be found.`, "lora_not_found")
  }
  state.adapters.loaded.delete(body.lora_name)
  yield* Scope.close(adapter.scope, Exit.void)
  return { lora_name: body.lora_name }
})

/**
 * The state a request naming `model` samples with: the server's own for the base (or no name), a view whose engine
 * is the adapter's for a loaded adapter's name, `undefined` for a name this server does not have.
 *
 * @category getters
 * @since 0.1.0
 */
export const stateFor = (state: ServerState, model: unknown): ServerState | undefined => {
  if (typeof model !== "string" || model === state.model.name) return state
  const adapter = state.adapters.loaded.get(model)
  if (adapter === undefined) return undefined
  // A view: the shared parts (counters, limits, slots) are the same objects, only the engine and the label differ.
  return { ...state, engine: adapter.engine, adapter }
}

/**
 * The response's `lora_adapter` field for a request sampled with an adapter.
 *
 * @category getters
 * @since 0.1.0
 */
export const stamp = (state: ServerState, value: unknown): unknown =>
  state.adapter === undefined || typeof value !== "object" || value === null ? value : {
    ...value,
    ...adapterStamp(state)
  }

/**
 * The adapters as `GET /v1/models` entries (vLLM lists them with the base as `parent`).
 *
 * @category getters
 * @since 0.1.0
 */
export const modelEntries = (state: ServerState, created: number) =>
  [...state.adapters.loaded.values()].map((a) => ({
    id: a.name,
    object: "model",
    created,
    owned_by: "agentfly",
    root: a.path,
    parent: state.model.name,
    policy_version: a.version,
    digest: a.digest
  }))
