/**
 * A LoRA run's carrier of its policy versions to the inference servers (`InferenceServers.Carrier`): instead of the
 * weights (`PUT /v1/weights`), each version's adapter is written once as a PEFT folder (`RUN/adapters/NAME-vN`)
 * and every server is asked to load it through vLLM's `POST /v1/load_lora_adapter` (SGLang's `/load_lora_adapter`,
 * at the server's root, when `/v1/…` is not found) under a name that carries its version and digest
 * (`OpenAiCompatSampler.adapterName`: `policy-v3-<digest>`); requests then name it as their model, and the names two
 * versions old are unloaded (the one before stays for requests still in flight).
 *
 * **No silent sync.** The carrier keeps each version's digest (`Checkpoint.fingerprint` of the adapter it wrote)
 * and `check`s every sampled result against it: `agentfly serve` says the digest of the tensors it loaded, so a
 * server that acknowledged a load and samples with another adapter is caught by its digest, as a `SamplerError` of
 * reason `AdapterMismatch` (counted, retried, then masked: never training data). vLLM and SGLang say no digest:
 * their answer echoes the adapter's name, which is checked instead (a server that samples an older adapter under the
 * new name passes; see `docs/lora.md`).
 *
 * A rollout worker samples on the same servers without publishing: its carrier ({@link follower}) learns the
 * names from the servers' `GET /v1/models` and checks each answer against the digest its name carries.
 */
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Clock, Effect } from "effect"
import { adapterName, parseAdapterName } from "../../src/backends/OpenAiCompatSampler.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Lora from "../../src/Lora.ts"
import type * as ModelConfig from "../../src/model/ModelConfig.ts"
import { type GenerateResult, samplerError } from "../../src/Sampler.ts"
import * as AdapterSync from "../AdapterSync.ts"
import type * as InferenceServers from "../InferenceServers.ts"
import { runError } from "../RunError.ts"
import type * as WeightsPut from "./weightsPut.ts"
import { fetchMessage } from "./http.ts"

export interface LoraCarrier {
  readonly carrier: InferenceServers.Carrier
  /** The adapter of `version`, before it is pushed. */
  readonly set: (version: number, adapter: ReadonlyMap<string, Float32Array>) => void
  /** Bytes of the adapter folders written so far (for the figures). */
  readonly written: () => number
}

/** A POST of `body` to `url`'s adapter endpoint `path`; SGLang serves it at the root, beside `/v1`. */
const postAdapter = async (url: string, path: string, body: unknown, push: WeightsPut.Push) => {
  const send = (root: string) =>
    fetch(`${root}/${path}`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        ...(push.token === undefined ? {} : { authorization: `Bearer ${push.token}` })
      },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(push.timeoutMs)
    })
  const response = await send(url)
  const root = url.replace(/\/v1$/, "")
  return response.status === 404 && root !== url ? await send(root) : response
}

/** Asks the server at `url` to load the adapter folder at `path` under `name`, for `push`'s version. */
const postLoad = (url: string, push: WeightsPut.Push, name: string, path: string) =>
  Effect.promise(async (): Promise<WeightsPut.Outcome> => {
    try {
      const body = { lora_name: name, lora_path: path, load_inplace: true, policy_version: push.version }
      const response = await postAdapter(url, "load_lora_adapter", body, push)
      if (response.ok) return undefined
      const text = (await response.text()).slice(0, 500)
      // vLLM without runtime updates, or `agentfly serve` without --accept-weights, has no such endpoint.
      const hint = response.status !== 404 ? "" : " (it loads no adapters at run time: vLLM wants --enable-lora " +
        "and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, SGLang --enable-lora, agentfly serve --accept-weights)"
      return {
        fatal: response.status >= 400 && response.status < 500,
        message: `HTTP ${response.status}: ${text}${hint}`
      }
    } catch (e) {
      return { fatal: false, message: fetchMessage(e) }
    }
  })

/**
 * Whether `url` loads adapters at run time, asked before anything is trained: an empty load is refused as a bad
 * body (400, 422) by a server that has the endpoint, and as 404 or 401 by one without it or with another token.
 */
const probe = (url: string, token: string | undefined) =>
  Effect.tryPromise({
    try: async () => {
      const push: WeightsPut.Push = { version: 0, runId: "probe", token, timeoutMs: 10_000 }
      const response = await postAdapter(url, "load_lora_adapter", {}, push)
      const body = (await response.text()).slice(0, 300)
      if (response.status === 401) {
        throw new Error(`it refuses this run's token (${body}): set AGENTFLY_WEIGHTS_TOKEN to the server's token`)
      }
      if (response.status === 404 || response.status === 405) {
        throw new Error(
          `it loads no adapters at run time (HTTP ${response.status}: ${body}): start vLLM with --enable-lora and ` +
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, SGLang with --enable-lora, agentfly serve with --accept-weights"
        )
      }
    },
    catch: (e) =>
      runError("Servers", `inference server ${url} cannot follow this LoRA run: ${e instanceof Error ? e.message : e}`)
  })

/** Unloads `name` from `url`; a failure is logged (the server keeps an adapter it no longer needs). */
const postUnload = (url: string, push: WeightsPut.Push, name: string) =>
  Effect.promise(async () => {
    try {
      const response = await postAdapter(url, "unload_lora_adapter", { lora_name: name }, push)
      return response.ok || response.status === 404 ? undefined : `HTTP ${response.status}`
    } catch (e) {
      return fetchMessage(e)
    }
  }).pipe(Effect.flatMap((failure) =>
    failure === undefined ? Effect.void : Effect.logWarning(`${url}: unloading adapter ${name} failed (${failure})`)
  ))

/**
 * The result's adapter against the digest published for the version it answers (and the name that carries it);
 * the mismatch, if any.
 */
const checkResult = (digests: ReadonlyMap<number, string>, base: string, result: GenerateResult) => {
  const expected = digests.get(result.policyVersion)
  const stamp = result.adapter
  const named = expected === undefined ? undefined : adapterName(base, result.policyVersion, expected)
  return mismatchOf(result, expected ?? "(none published)", stamp === undefined || stamp.name !== named)
}

/** A `SamplerError` `AdapterMismatch` when the result's adapter is not `digest` (or `unnamed`: not the one asked). */
const mismatchOf = (result: GenerateResult, digest: string, unnamed: boolean) => {
  const stamp = result.adapter
  const mismatch = AdapterSync.check({ version: result.policyVersion, digest }, {
    lora_adapter: stamp === undefined || unnamed ? undefined : {
      digest: stamp.digest,
      policy_version: stamp.policyVersion ?? result.policyVersion
    }
  })
  if (mismatch === undefined) return undefined
  return samplerError("AdapterMismatch", mismatch.message, {
    expectedVersion: mismatch.expectedVersion,
    expectedDigest: mismatch.expectedDigest,
    ...(mismatch.gotVersion === undefined ? {} : { gotVersion: mismatch.gotVersion }),
    ...(mismatch.gotDigest === undefined ? {} : { gotDigest: mismatch.gotDigest })
  })
}

interface Options {
  readonly dir: string
  readonly name: string
  readonly model: ModelConfig.ModelConfig
  readonly lora: Lora.Config
  readonly baseModel: string
}

/** The carrier's state: the newest adapter, each version's folder and digest, the names each server holds. */
interface State {
  readonly options: Options
  latest: { readonly version: number; readonly adapter: ReadonlyMap<string, Float32Array> } | undefined
  readonly saved: Map<number, string>
  /** Each version's digest, as published (a few bytes a version: kept for the run). */
  readonly digests: Map<number, string>
  /** Per server, the names it holds of this run, oldest first (at most two). */
  readonly loaded: Map<string, Array<{ readonly version: number; readonly name: string }>>
  written: number
}

/** The version's folder, written once. */
const folder = (state: State, version: number, adapter: ReadonlyMap<string, Float32Array>) =>
  Effect.suspend(() => {
    const known = state.saved.get(version)
    if (known !== undefined) return Effect.succeed(known)
    const { options } = state
    const path = `${options.dir}/${options.name}-v${version}`
    return Lora.save(path, options.model, options.lora, adapter, options.baseModel).pipe(
      Effect.provide(NodeFileSystem.layer),
      Effect.map(() => {
        state.saved.set(version, path)
        // What the servers load from this folder: what they must answer for this version.
        state.digests.set(version, Checkpoint.fingerprint(adapter))
        state.written += Lora.parameters(options.model, options.lora)
          .reduce((n, p) => n + 4 * p.shape.reduce((a, b) => a * b, 1), 0)
        return path
      })
    )
  })

/** Books `name` as loaded on `url` and unloads the names before the previous one (requests may still use it). */
const loaded = (state: State, url: string, push: WeightsPut.Push, name: string) =>
  Effect.suspend(() => {
    const held = (state.loaded.get(url) ?? []).filter((h) => h.name !== name)
    held.push({ version: push.version, name })
    const superseded = held.splice(0, Math.max(0, held.length - 2))
    state.loaded.set(url, held)
    return Effect.forEach(superseded, (h) => postUnload(url, push, h.name), { discard: true })
  })

const loadOn = (state: State, url: string, push: WeightsPut.Push): Effect.Effect<WeightsPut.Outcome> => {
  const current = state.latest
  if (current === undefined || current.version !== push.version) {
    return Effect.succeed(current !== undefined && current.version > push.version ? "newer" : {
      fatal: false,
      message: `no adapter of policy version ${push.version} to load`
    })
  }
  return folder(state, current.version, current.adapter).pipe(
    Effect.flatMap((path) => {
      const name = adapterName(state.options.name, current.version, state.digests.get(current.version)!)
      return postLoad(url, push, name, path).pipe(
        Effect.tap((outcome) => (outcome === undefined ? loaded(state, url, push, name) : Effect.void))
      )
    }),
    Effect.catch((e) => Effect.succeed<WeightsPut.Outcome>({ fatal: true, message: e.message }))
  )
}

/**
 * The carrier of a run that publishes its adapters (`options.name` is the adapters' base name, `dir` where their
 * folders are written: a path the servers read).
 */
export const make = (options: Options): LoraCarrier => {
  const state: State = {
    options,
    latest: undefined,
    saved: new Map(),
    digests: new Map(),
    loaded: new Map(),
    written: 0
  }
  return {
    carrier: {
      pushAll: (push, urls) => Effect.forEach(urls, (url) => loadOn(state, url, push), { concurrency: "unbounded" }),
      pushOne: (push, url) => loadOn(state, url, push),
      check: (result) => checkResult(state.digests, options.name, result),
      // The newest name the server holds (the picker sends a request only to a server holding its version).
      model: (url) => Effect.sync(() => state.loaded.get(url)?.at(-1)?.name),
      probe: (url, token) => Effect.andThen(probe(url, token), clearEarlier(url, options.name, token))
    },
    set: (version, adapter) => {
      state.latest = { version, adapter }
    },
    written: () => state.written
  }
}

// ===== A rollout worker's carrier =====

/** An adapter name a server lists, and when the worker asked. */
interface Listed {
  readonly version: number
  readonly name: string
  readonly at: number
}

/** The adapters of `base` that `url` lists in `GET /models` (vLLM and `agentfly serve` list each loaded one). */
const listedOn = (url: string, base: string, token: string | undefined) =>
  Effect.promise(async () => {
    try {
      const response = await fetch(`${url}/models`, {
        headers: token === undefined ? {} : { authorization: `Bearer ${token}` },
        signal: AbortSignal.timeout(10_000)
      })
      const body = response.ok ? await response.json() as { data?: Array<{ id?: unknown }> } : {}
      return (body.data ?? []).flatMap((entry) => {
        const named = typeof entry.id === "string" ? parseAdapterName(entry.id) : undefined
        return named === undefined || named.base !== base ? [] : [{ version: named.version, name: entry.id as string }]
      })
    } catch {
      return []
    }
  })

type Named = { readonly version: number; readonly name: string }

/** The newest of `listed`, if any. */
const newestOf = (listed: ReadonlyArray<Named>) =>
  listed.reduce<Named | undefined>((a, b) => (a === undefined || b.version > a.version ? b : a), undefined)

/**
 * Unloads the adapters of `base` that `url` holds from an earlier process (a run stopped and started again, or
 * overwritten): a rollout worker asks for the newest one a server lists, which must be this process's.
 */
const clearEarlier = (url: string, base: string, token: string | undefined) =>
  Effect.flatMap(listedOn(url, base, token), (listed) =>
    Effect.forEach(
      listed,
      (l) => postUnload(url, { version: l.version, runId: "clear", token, timeoutMs: 10_000 }, l.name),
      { discard: true }
    ))

/**
 * A rollout worker's carrier: it publishes nothing (the trainer does), requests the newest adapter of `base` each
 * server lists (asked again when a share wants a newer version, and at most every `refreshMs`), and checks every
 * answer against the digest that the adapter's name carries, which the trainer published: a server that loaded the
 * name with other tensors (`agentfly serve` says their digest) is an `AdapterMismatch`, as on the trainer.
 */
export const follower = (
  base: string,
  options: { readonly token?: string | undefined; readonly refreshMs?: number } = {}
): InferenceServers.Carrier => {
  const listed = new Map<string, Listed>()
  /** The names requests were sent with (the newest 64): an answer naming another was not asked of it. */
  const asked = new Set<string>()
  const refreshMs = options.refreshMs ?? 1_000
  const none: WeightsPut.Outcome = { fatal: true, message: "a rollout worker does not publish adapters" }
  const carrier: InferenceServers.Carrier = {
    pushAll: (_push, urls) => Effect.succeed(urls.map(() => none)),
    pushOne: () => Effect.succeed(none),
    check: (result) => {
      const named = result.adapter === undefined ? undefined : parseAdapterName(result.adapter.name)
      const digest = named !== undefined && named.base === base && named.version === result.policyVersion
        ? named.digest
        : "(no adapter of this run named for this version)"
      return mismatchOf(result, digest, !asked.has(result.adapter?.name ?? ""))
    },
    model: (url, min) =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const known = listed.get(url)
        if (known !== undefined && known.version >= min && now - known.at < refreshMs) return known.name
        const newest = newestOf(yield* listedOn(url, base, options.token))
        if (newest === undefined) return known?.name
        listed.set(url, { ...newest, at: now })
        asked.add(newest.name)
        if (asked.size > 64) asked.delete(asked.values().next().value!)
        return newest.name
      })
  }
  return carrier
}
