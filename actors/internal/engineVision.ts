/**
 * The policy engine's image prompts (`PolicyEngine.ts`, option `vision`): a request with images is prefilled by a
 * second session over the same weights, the vision-language prefill graph (`VisionTower.inferenceGraph`: the tower
 * once per image, its merged tokens in place of the `<|image_pad|>` embeddings), which returns logits and the new
 * keys/values exactly as the text graph's prefill does. The sequence then joins the running batch and decodes with
 * the text graph like any other: after the prompt, every token is text. Requests without images never touch this
 * module, and their batches, sessions and feeds are what they were.
 *
 * A finished image sequence is retained with its images' content keys, and a later turn continues it only when its
 * first images are those (pads say nothing of which image they were): the tower then runs on the new images only,
 * and a turn without new images is a text continuation.
 */
import { Effect } from "effect"
import * as ort from "onnxruntime-node"
import { createHash } from "node:crypto"
import * as VisionTower from "../../src/model/VisionTower.ts"
import { samplerError } from "../../src/Sampler.ts"
import type { SamplerError } from "../../src/Sampler.ts"
import * as EngineModel from "./engineModel.ts"

/** What `PolicyEngine.Options.vision` gives: the model (its text part must be the engine's config) and the pad id. */
export interface Options {
  readonly config: VisionTower.VlConfig
  /** The `<|image_pad|>` token id of the engine's tokenizer: one per merged image token in a prompt. */
  readonly imageTokenId: number
}

/** The engine's vision setup: the prefill model without weight data. */
export interface VisionSetup extends Options {
  readonly model: Uint8Array
  readonly sessionKey: string
}

/**
 * An image request's images still to compute, `keys` theirs by content, `key` those of the whole prompt (requests
 * that share a prompt and its images are computed once).
 */
export interface VisionRequest {
  readonly images: ReadonlyArray<VisionTower.Pixels>
  readonly keys: ReadonlyArray<string>
  readonly key: string
}

/** The request without its first `n` images (a retained sequence holds them); `undefined` when none is left. */
export const after = (v: VisionRequest, n: number): VisionRequest | undefined =>
  n >= v.images.length ? undefined : { images: v.images.slice(n), keys: v.keys.slice(n), key: v.key }

/** A generation's vision session (shared like the text one by the engines that sample the same version). */
export interface VisionSession {
  readonly session: ort.InferenceSession
  readonly unload: Effect.Effect<void>
  readonly weightFeeds: Readonly<Record<string, ort.Tensor>>
}

export const makeSetup = (o: Options, weightsAs: "initializers" | "inputs", sessionKey: string): VisionSetup => ({
  ...o,
  model: EngineModel.withWeights(
    VisionTower.inferenceGraph(o.config, "inputs"),
    VisionTower.allParameters(o.config),
    weightsAs
  ),
  sessionKey: `${sessionKey}\u0000vision:${JSON.stringify(o)}`
})

/** The vision session of `weights` as `version` (external data or weight feeds, as the text session has them). */
export const session = <E>(
  v: VisionSetup,
  weightsAs: "initializers" | "inputs",
  sessionOptions: ort.InferenceSession.SessionOptions,
  version: number,
  weights: VisionTower.Weights,
  onError: (cause: unknown) => E
): Effect.Effect<VisionSession, E> => {
  const specs = VisionTower.allParameters(v.config)
  const external = specs.map((spec) => {
    const w = weights.get(spec.name)!
    return { path: spec.name, data: new Uint8Array(w.buffer, w.byteOffset, w.byteLength) }
  })
  const options = weightsAs === "inputs" ? sessionOptions : { ...sessionOptions, externalData: external }
  const create = () => ort.InferenceSession.create(v.model, options)
  return EngineModel.acquireSession(weights, version, v.sessionKey, create, onError).pipe(
    Effect.map(({ session, unload }) => ({
      session,
      unload,
      weightFeeds: weightsAs === "initializers" ? {} : Object.fromEntries(
        specs.map((spec) => [spec.name, new ort.Tensor("float32", weights.get(spec.name)!, spec.shape)])
      )
    }))
  )
}

/**
 * An image request's tower inputs, or `BadRequest` when the engine has no tower or the prompt's pad tokens do not
 * number the images' merged tokens.
 */
export const request = (
  v: VisionSetup | undefined,
  prompt: ReadonlyArray<number>,
  images: ReadonlyArray<VisionTower.Pixels>
): VisionRequest | SamplerError => {
  if (v === undefined) return samplerError("BadRequest", "this policy engine has no vision tower: images refused")
  const { inChannels: C, patchSize, spatialMergeSize } = v.config.vision, factor = patchSize * spatialMergeSize
  const fits = (i: VisionTower.Pixels) => i.width % factor === 0 && i.height % factor === 0
  const bad = images.find((i) => !fits(i) || i.data.length !== C * i.width * i.height)
  if (bad !== undefined) {
    const message = `an image of ${bad.width}×${bad.height}: sides must be multiples of ${factor}, ${C} channels`
    return samplerError("BadRequest", message)
  }
  const patches = images.reduce((n, i) => n + (i.width / patchSize) * (i.height / patchSize), 0)
  const expected = patches / spatialMergeSize ** 2
  const pads = prompt.filter((id) => id === v.imageTokenId).length
  if (pads !== expected) {
    return samplerError("BadRequest", `the prompt has ${pads} image pad tokens; its images make ${expected}`)
  }
  const keys = images.map(({ data, height, width }) =>
    createHash("sha256").update(`${width}x${height};`)
      .update(new Uint8Array(data.buffer, data.byteOffset, data.byteLength)).digest("hex")
  )
  return { images, keys, key: keys.join(",") }
}

/**
 * The tower's feeds for a prefill batch's distinct prompts (`ids [N, S]`, their new tokens left-padded): their
 * images in row order, numbered across the batch.
 */
export const feeds = (
  v: VisionSetup,
  requests: ReadonlyArray<VisionRequest>,
  ids: ReadonlyArray<number>,
  dims: readonly [number, number]
): Record<string, ort.Tensor> => {
  const inputs = VisionTower.patchify(v.config.vision, requests.flatMap((r) => r.images))
  const tensor = (f: Feed) =>
    f.dtype === "float32"
      ? new ort.Tensor("float32", f.data instanceof Float32Array ? f.data : Float32Array.from(f.data), f.dims)
      : new ort.Tensor("int64", BigInt64Array.from(Array.from(f.data), (x) => BigInt(x)), f.dims)
  const feeds = VisionTower.inputFeeds(v.config.vision, inputs)
  return {
    ...Object.fromEntries(Object.entries(feeds).map(([name, f]) => [name, tensor(f)])),
    image_token_index: tensor({ dtype: "int64", dims, data: VisionTower.imageTokenIndex(ids, v.imageTokenId, inputs) })
  }
}

interface Feed {
  readonly dtype: "float32" | "int64"
  readonly dims: ReadonlyArray<number>
  readonly data: ArrayLike<number>
}

/** Runs a vision prefill on the generation's vision session. */
export const run = (s: VisionSession, feeds: Record<string, ort.Tensor>) =>
  Effect.callback<ort.InferenceSession.ReturnType, SamplerError>((resume) => {
    s.session.run({ ...s.weightFeeds, ...feeds }).then(
      (out) => resume(Effect.succeed(out)),
      (e) => resume(Effect.fail(samplerError("ServerError", `onnxruntime (vision prefill): ${String(e)}`)))
    )
  })

/** `prefill`'s runner for a batch of image prompts: the text feeds plus the tower's, on the vision session. */
export const runner = (v: VisionSetup, s: VisionSession) =>
(
  textFeeds: Record<string, ort.Tensor>,
  distinct: ReadonlyArray<{ readonly vision?: VisionRequest | undefined }>,
  ids: ReadonlyArray<number>
) => {
  const dims = [distinct.length, ids.length / distinct.length] as const
  return run(s, { ...textFeeds, ...feeds(v, distinct.map((d) => d.vision!), ids, dims) })
}
