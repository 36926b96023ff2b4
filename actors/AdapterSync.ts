/**
 * A LoRA run's policy versions on inference servers, with no silent sync: publishing a version writes the adapter as
 * a PEFT folder (kilobytes to megabytes, not the weights) and asks each server to load it through vLLM's documented
 * endpoint (`POST /v1/load_lora_adapter` `{ lora_name, lora_path, load_inplace }`; `agentfly serve --accept-weights`
 * implements the same), and every sampled response is checked against what was published: a server answers which
 * adapter it sampled with (`lora_adapter: { name, digest, policy_version }`), and a response without it, or with
 * another digest or version, is an {@link AdapterMismatch}, never training data. Mismatches are counted, and
 * {@link Tracker} stops the run ({@link SyncLost}) when they persist for `maxConsecutive` batches.
 *
 * Why: a weight sync that silently delivered nothing cost a verl user two months (verl#7495): a server that
 * acknowledged an adapter and kept sampling with the previous one. A digest in every response makes that visible
 * at the next batch.
 *
 * **Gotchas** `lora_path` is read by the server: it must see the folder at the same path (same machine, or a shared
 * file system), as vLLM's endpoint requires.
 *
 * @since 0.1.0
 */
import { Clock, Effect, FileSystem, Schema } from "effect"
import * as Checkpoint from "../src/Checkpoint.ts"
import * as Lora from "../src/Lora.ts"
import type * as ModelConfig from "../src/model/ModelConfig.ts"

// ===== Errors =====

/**
 * A response sampled with another adapter than the one published (or with none).
 *
 * @category errors
 * @since 0.1.0
 */
export class AdapterMismatch extends Schema.TaggedError<AdapterMismatch>()("AdapterMismatch", {
  message: Schema.String,
  expectedVersion: Schema.Int,
  expectedDigest: Schema.String,
  /** What the response said (undefined: it named no adapter). */
  gotVersion: Schema.optionalKey(Schema.Int),
  gotDigest: Schema.optionalKey(Schema.String)
}) {}

/**
 * A server refused to load the adapter, or could not be reached.
 *
 * @category errors
 * @since 0.1.0
 */
export class LoadFailed extends Schema.TaggedError<LoadFailed>()("LoadFailed", {
  message: Schema.String,
  server: Schema.String
}) {}

/**
 * Mismatches persisted for `maxConsecutive` batches: the run stops rather than train on what it did not publish.
 *
 * @category errors
 * @since 0.1.0
 */
export class SyncLost extends Schema.TaggedError<SyncLost>()("SyncLost", {
  message: Schema.String,
  mismatches: Schema.Int
}) {}

// ===== Publishing =====

/**
 * A published adapter version: the name requests use, the version, the digest every response must carry, the folder
 * and what publishing it cost.
 *
 * @category models
 * @since 0.1.0
 */
export interface Publication {
  readonly name: string
  readonly version: number
  readonly digest: string
  readonly path: string
  /** Bytes written (the adapter's tensors and config) and sent (the request bodies). */
  readonly bytes: number
  readonly millis: number
}

/**
 * @category models
 * @since 0.1.0
 */
export interface PublishOptions {
  /** The servers' API roots (`http://host:port/v1`). */
  readonly urls: ReadonlyArray<string>
  /** Where version folders are written (`DIR/NAME-vVERSION`). */
  readonly dir: string
  /** The name requests use as their `model` (one name, loaded in place: every version replaces the last). */
  readonly name: string
  readonly version: number
  readonly model: ModelConfig.ModelConfig
  readonly lora: Lora.Config
  readonly adapter: ReadonlyMap<string, Float32Array>
  readonly baseModel: string
  readonly token?: string | undefined
}

const load = (url: string, body: string, token: string | undefined) =>
  Effect.tryPromise({
    try: async () => {
      const response = await fetch(`${url}/load_lora_adapter`, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          ...(token === undefined ? {} : { authorization: `Bearer ${token}` })
        },
        body
      })
      return { ok: response.ok, status: response.status, text: await response.text() }
    },
    catch: (u) => new LoadFailed({ server: url, message: `${url}: ${u instanceof Error ? u.message : String(u)}` })
  }).pipe(Effect.flatMap((r) =>
    r.ok ? Effect.void : Effect.fail(
      new LoadFailed({ server: url, message: `${url}/load_lora_adapter: HTTP ${r.status}: ${r.text.slice(0, 300)}` })
    )
  ))

/**
 * Writes version `version`'s adapter folder and has every server load it under `name` (in place).
 *
 * @category constructors
 * @since 0.1.0
 */
export const publish = Effect.fn("AdapterSync.publish")(function*(options: PublishOptions) {
  const start = yield* Clock.currentTimeMillis
  const fs = yield* FileSystem.FileSystem
  const path = `${options.dir}/${options.name}-v${options.version}`
  yield* Lora.save(path, options.model, options.lora, options.adapter, options.baseModel)
  const body = JSON.stringify({
    lora_name: options.name,
    lora_path: path,
    load_inplace: true,
    policy_version: options.version
  })
  yield* Effect.forEach(options.urls, (url) => load(url, body, options.token), { concurrency: "unbounded" })
  let bytes = body.length * options.urls.length
  for (const file of ["adapter_model.safetensors", "adapter_config.json"]) {
    const info = yield* fs.stat(`${path}/${file}`).pipe(Effect.orElseSucceed(() => undefined))
    bytes += Number(info?.size ?? 0)
  }
  const publication: Publication = {
    name: options.name,
    version: options.version,
    digest: Checkpoint.fingerprint(options.adapter),
    path,
    bytes,
    millis: (yield* Clock.currentTimeMillis) - start
  }
  return publication
})

// ===== Checking =====

/**
 * Checks one sampled response (the JSON body of a completion) against the publication it was asked of: `undefined`
 * when it carries the published adapter's digest and version, else the mismatch.
 *
 * @category getters
 * @since 0.1.0
 */
export const check = (
  published: Pick<Publication, "version" | "digest">,
  response: unknown
): AdapterMismatch | undefined => {
  const stamp = (response as { lora_adapter?: { digest?: unknown; policy_version?: unknown } } | null)?.lora_adapter
  const digest = typeof stamp?.digest === "string" ? stamp.digest : undefined
  const version = typeof stamp?.policy_version === "number" ? stamp.policy_version : undefined
  if (digest === published.digest && version === published.version) return undefined
  const said = digest === undefined ? "no adapter" : `adapter version ${version} (digest ${digest})`
  return new AdapterMismatch({
    message: `a response was sampled with ${said}, not the published version ${published.version} ` +
      `(digest ${published.digest}); it is not used for training`,
    expectedVersion: published.version,
    expectedDigest: published.digest,
    ...(version === undefined ? {} : { gotVersion: version }),
    ...(digest === undefined ? {} : { gotDigest: digest })
  })
}

/**
 * Counts mismatched batches: `batch` checks a batch's responses, returning the mismatches (those responses are
 * dropped by the caller); `maxConsecutive` batches in a row with any mismatch fail with {@link SyncLost}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Tracker {
  readonly batch: (
    published: Publication,
    responses: ReadonlyArray<unknown>
  ) => Effect.Effect<ReadonlyArray<AdapterMismatch>, SyncLost>
  /** Mismatched responses so far. */
  readonly mismatches: () => number
}

/**
 * A {@link Tracker} (default: the run stops after 3 mismatched batches in a row).
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeTracker = (maxConsecutive = 3): Tracker => {
  let total = 0
  let streak = 0
  return {
    mismatches: () => total,
    batch: (published, responses) =>
      Effect.suspend(() => {
        const bad = responses.flatMap((r) => {
          const m = check(published, r)
          return m === undefined ? [] : [m]
        })
        total += bad.length
        streak = bad.length > 0 ? streak + 1 : 0
        if (streak < maxConsecutive) return Effect.succeed(bad)
        return Effect.fail(
          new SyncLost({
            message: `${streak} batches in a row were sampled with another adapter than the one published ` +
              `(${bad[0]!.message}): the servers did not load what this run published`,
            mismatches: total
          })
        )
      })
  }
}
