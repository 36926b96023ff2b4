/**
 * A Tinker checkpoint's files, fetched as the SDK fetches them (`resources/weights.py`,
 * `get_checkpoint_archive_url`): `GET /api/v1/training_runs/MODEL/checkpoints/sampler_weights/NAME/archive` answers
 * `CheckpointArchiveUrlResponse { url, expires }`, `url` is a plain GET of a tar, unpacked here into a folder. A
 * LoRA model's sampler weights unpack to a PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`)
 * with an empty `checkpoint_complete`, which the SDK's CLI insists on and so does this.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Schema } from "effect"
import * as tar from "tar"
import * as Tinker from "../tinker/Types.ts"
import { TinkerClient, tinkerError } from "./TinkerClient.ts"

const samplerPath = /^tinker:\/\/([A-Za-z0-9._-]+)\/(sampler_weights|weights)\/([A-Za-z0-9._-]+)$/

const decodeUrl = Schema.decodeUnknownEffect(Schema.fromJsonString(Tinker.CheckpointArchiveUrlResponse))

/** Unpacks the tar `bytes` into `dir` (entries outside it are refused by `tar` itself). */
const untar = (bytes: Uint8Array, dir: string) =>
  Effect.callback<void, Error>((resume) => {
    const unpack = tar.x({ cwd: dir, strict: true })
    unpack.on("error", (e: Error) => resume(Effect.fail(e)))
    unpack.on("close", () => resume(Effect.void))
    unpack.end(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength))
  })

/**
 * Fetches the archive of checkpoint `path` (`tinker://MODEL/sampler_weights/NAME`) and unpacks it into `dir`
 * (made if absent): the folder, once its `checkpoint_complete` is there.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fetchInto = Effect.fn("TinkerArchive.fetchInto")(function*(path: string, dir: string) {
  const op = "get_checkpoint_archive_url"
  const m = samplerPath.exec(path)
  if (m === null) {
    return yield* tinkerError(op, "BadRequest", `${path} is not a tinker:// checkpoint path`, { status: 400 })
  }
  const client = yield* TinkerClient
  const route = `/api/v1/training_runs/${m[1]}/checkpoints/${m[2]}/${m[3]}/archive`
  const answer = yield* client.get(op, route)
  const { url } = yield* decodeUrl(new TextDecoder().decode(answer)).pipe(
    Effect.mapError((e) => tinkerError(op, "BadResponse", `unexpected answer: ${e.message}`))
  )
  const bytes = yield* client.get(op, url)
  const fs = yield* FileSystem.FileSystem
  const local = (e: { readonly message: string }) => tinkerError(op, "BadResponse", `${path}'s archive: ${e.message}`)
  yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(local))
  yield* untar(bytes, dir).pipe(Effect.mapError(local))
  const complete = yield* fs.exists(`${dir}/checkpoint_complete`).pipe(Effect.orElseSucceed(() => false))
  if (!complete) return yield* local({ message: "no checkpoint_complete in it (an incomplete checkpoint)" })
  return dir
})
