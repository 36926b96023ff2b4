/**
 * One `PUT /v1/weights` to an inference server (`agentfly serve --accept-weights`), shared by the run's
 * `InferenceServers` and a trainer server that pushes its weights to the servers itself (`learner.pushWeights`).
 *
 * @since 0.1.0
 */
import type * as RemoteTrainer from "../../src/backends/RemoteTrainer.ts"
import * as Safetensors from "../../src/Safetensors.ts"
import { fetchMessage } from "./http.ts"

/**
 * What a push did to one server (the trainer server's wire carries the same: `RemoteTrainer.PushOutcome`).
 *
 * @category models
 * @since 0.1.0
 */
export type Outcome = RemoteTrainer.PushOutcome

/**
 * Who pushes, and with what: the version, the run's id (`x-run-id`), the servers' token, a time limit per server.
 *
 * @category models
 * @since 0.1.0
 */
export type Push = RemoteTrainer.PushRequest

/**
 * Named weights as the safetensors bytes a server takes, in the model's parameter order.
 *
 * @category constructors
 * @since 0.1.0
 */
export const serialize = (
  parameters: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>,
  weights: ReadonlyMap<string, Float32Array>
): Uint8Array | string => {
  const tensors = parameters.map((p) => ({ name: p.name, shape: p.shape, data: weights.get(p.name) }))
  const missing = tensors.find((t) => t.data === undefined || t.data.length === 0)
  if (missing !== undefined) return `the learner's weights have no tensor ${missing.name}`
  return Safetensors.serialize(tensors.map((t) => ({ ...t, data: t.data! })))
}

/**
 * Puts `bytes` on the server at `url` (its API root) as `push.version`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const put = async (url: string, bytes: Uint8Array, push: Push): Promise<Outcome> => {
  try {
    const response = await fetch(`${url}/weights`, {
      method: "PUT",
      headers: {
        ...(push.token === undefined ? {} : { authorization: `Bearer ${push.token}` }),
        "content-type": "application/octet-stream",
        "x-policy-version": String(push.version),
        "x-run-id": push.runId
      },
      body: bytes as Uint8Array<ArrayBuffer>,
      signal: AbortSignal.timeout(push.timeoutMs)
    })
    if (response.ok) return undefined
    const text = (await response.text()).slice(0, 500)
    // Already newer (a catch-up that arrived after the next push): nothing to do.
    if (response.status === 409 && text.includes("stale_policy_version")) return "newer"
    return { fatal: response.status >= 400 && response.status < 500, message: `HTTP ${response.status}: ${text}` }
  } catch (e) {
    return { fatal: false, message: fetchMessage(e) }
  }
}
