/**
 * A LoRA run's carrier of its policy versions to the inference servers (`InferenceServers.Carrier`): instead of the
 * weights (`PUT /v1/weights`), each version's adapter is written once as a PEFT folder (`RUN/adapters/NAME-vN`)
 * and every server is asked to load it in place under one name through vLLM's `POST /v1/load_lora_adapter`
 * (`actors/AdapterSync.ts`); requests then name the adapter as their model. A server that acknowledges a load and
 * keeps an older adapter answers the next request with its older `policy_version` (409 `policy_version_behind`
 * against the request's `min_policy_version`), so the batch is not sampled from it: it is loaded again, and a
 * request that finds no server with the version fails as a typed sampler error.
 *
 * **No silent sync.** The carrier keeps each version's digest (`Checkpoint.fingerprint` of the adapter it wrote)
 * and `check`s every sampled result against it: a server that acknowledged a load but samples with another adapter
 * under the new version number passes the version check and is caught by its digest, as a `SamplerError` of reason
 * `AdapterMismatch` (counted, retried, then masked: never training data).
 */
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Effect } from "effect"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Lora from "../../src/Lora.ts"
import type * as ModelConfig from "../../src/model/ModelConfig.ts"
import { type GenerateResult, samplerError } from "../../src/Sampler.ts"
import * as AdapterSync from "../AdapterSync.ts"
import type * as InferenceServers from "../InferenceServers.ts"
import type * as WeightsPut from "./weightsPut.ts"
import { fetchMessage } from "./http.ts"

export interface LoraCarrier {
  readonly carrier: InferenceServers.Carrier
  /** The adapter of `version`, before it is pushed. */
  readonly set: (version: number, adapter: ReadonlyMap<string, Float32Array>) => void
  /** Bytes of the adapter folders written so far (for the figures). */
  readonly written: () => number
}

/** Asks the server at `url` to load the adapter folder at `path` in place under `name`, for `push`'s version. */
const postLoad = (url: string, push: WeightsPut.Push, name: string, path: string) =>
  Effect.promise(async (): Promise<WeightsPut.Outcome> => {
    try {
      const response = await fetch(`${url}/load_lora_adapter`, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          ...(push.token === undefined ? {} : { authorization: `Bearer ${push.token}` })
        },
        body: JSON.stringify({ lora_name: name, lora_path: path, load_inplace: true, policy_version: push.version }),
        signal: AbortSignal.timeout(push.timeoutMs)
      })
      if (response.ok) return undefined
      const text = (await response.text()).slice(0, 500)
      return { fatal: response.status >= 400 && response.status < 500, message: `HTTP ${response.status}: ${text}` }
    } catch (e) {
      return { fatal: false, message: fetchMessage(e) }
    }
  })

/** The result's adapter against the digest published for the version it answers; the mismatch, if any. */
const checkResult = (digests: ReadonlyMap<number, string>, name: string, result: GenerateResult) => {
  const expected = digests.get(result.policyVersion)
  const stamp = result.adapter
  const mismatch = AdapterSync.check({ version: result.policyVersion, digest: expected ?? "(none published)" }, {
    lora_adapter: stamp === undefined || stamp.name !== name ? undefined : {
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

export const make = (options: {
  readonly dir: string
  readonly name: string
  readonly model: ModelConfig.ModelConfig
  readonly lora: Lora.Config
  readonly baseModel: string
}): LoraCarrier => {
  let latest: { readonly version: number; readonly adapter: ReadonlyMap<string, Float32Array> } | undefined
  const saved = new Map<number, string>()
  /** Each version's digest, as published (a few bytes a version: kept for the run). */
  const digests = new Map<number, string>()
  let written = 0
  /** The version's folder, written once. */
  const folder = (version: number, adapter: ReadonlyMap<string, Float32Array>) =>
    Effect.suspend(() => {
      const known = saved.get(version)
      if (known !== undefined) return Effect.succeed(known)
      const path = `${options.dir}/${options.name}-v${version}`
      return Lora.save(path, options.model, options.lora, adapter, options.baseModel).pipe(
        Effect.provide(NodeFileSystem.layer),
        Effect.map(() => {
          saved.set(version, path)
          // What the servers load from this folder: what they must answer for this version.
          digests.set(version, Checkpoint.fingerprint(adapter))
          written += Lora.parameters(options.model, options.lora)
            .reduce((n, p) => n + 4 * p.shape.reduce((a, b) => a * b, 1), 0)
          return path
        })
      )
    })
  const loadOn = (url: string, push: WeightsPut.Push): Effect.Effect<WeightsPut.Outcome> => {
    const current = latest
    if (current === undefined || current.version !== push.version) {
      return Effect.succeed(current !== undefined && current.version > push.version ? "newer" : {
        fatal: false,
        message: `no adapter of policy version ${push.version} to load`
      })
    }
    return folder(current.version, current.adapter).pipe(
      Effect.flatMap((path) => postLoad(url, push, options.name, path)),
      Effect.catch((e) => Effect.succeed<WeightsPut.Outcome>({ fatal: true, message: e.message }))
    )
  }
  return {
    carrier: {
      pushAll: (push, urls) => Effect.forEach(urls, (url) => loadOn(url, push), { concurrency: "unbounded" }),
      pushOne: (push, url) => loadOn(url, push),
      check: (result) => checkResult(digests, options.name, result)
    },
    set: (version, adapter) => {
      latest = { version, adapter }
    },
    written: () => written
  }
}
