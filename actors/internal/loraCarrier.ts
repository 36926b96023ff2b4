/**
 * A LoRA run's carrier of its policy versions to the inference servers (`InferenceServers.Carrier`): instead of the
 * weights (`PUT /v1/weights`), each version's adapter is written once as a PEFT folder (`RUN/adapters/NAME-vN`)
 * and every server is asked to load it in place under one name through vLLM's `POST /v1/load_lora_adapter`
 * (`actors/AdapterSync.ts`); requests then name the adapter as their model. A server that acknowledges a load and
 * keeps an older adapter answers the next request with its older `policy_version` (409 `policy_version_behind`
 * against the request's `min_policy_version`), so the batch is not sampled from it: it is loaded again, and a
 * request that finds no server with the version fails as a typed sampler error.
 */
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Effect } from "effect"
import * as Lora from "../../src/Lora.ts"
import type * as ModelConfig from "../../src/model/ModelConfig.ts"
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

export const make = (options: {
  readonly dir: string
  readonly name: string
  readonly model: ModelConfig.ModelConfig
  readonly lora: Lora.Config
  readonly baseModel: string
}): LoraCarrier => {
  let latest: { readonly version: number; readonly adapter: ReadonlyMap<string, Float32Array> } | undefined
  const saved = new Map<number, string>()
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
      Effect.flatMap((path) =>
        Effect.promise(async (): Promise<WeightsPut.Outcome> => {
          try {
            const response = await fetch(`${url}/load_lora_adapter`, {
              method: "POST",
              headers: {
                "content-type": "application/json",
                ...(push.token === undefined ? {} : { authorization: `Bearer ${push.token}` })
              },
              body: JSON.stringify({
                lora_name: options.name,
                lora_path: path,
                load_inplace: true,
                policy_version: push.version
              }),
              signal: AbortSignal.timeout(push.timeoutMs)
            })
            if (response.ok) return undefined
            const text = (await response.text()).slice(0, 500)
            return { fatal: response.status >= 400 && response.status < 500, message: `HTTP ${response.status}: ${text}` }
          } catch (e) {
            return { fatal: false, message: fetchMessage(e) }
          }
        })
      ),
      Effect.catch((e) => Effect.succeed<WeightsPut.Outcome>({ fatal: true, message: e.message }))
    )
  }
  return {
    carrier: {
      pushAll: (push, urls) => Effect.forEach(urls, (url) => loadOn(url, push), { concurrency: "unbounded" }),
      pushOne: (push, url) => loadOn(url, push)
    },
    set: (version, adapter) => {
      latest = { version, adapter }
    },
    written: () => written
  }
}
