/**
 * The checkpoint archive route of the Tinker API, as the SDK calls it (`resources/weights.py`,
 * `get_checkpoint_archive_url`): `GET /api/v1/training_runs/MODEL/checkpoints/sampler_weights/NAME/archive` answers
 * `CheckpointArchiveUrlResponse { url, expires }`, and `url` is a plain GET (no key: the URL is the capability, as a
 * signed URL is) of a tar holding a LoRA model's sampler weights as a PEFT adapter: `adapter_config.json`,
 * `adapter_model.safetensors` and an empty `checkpoint_complete` (the SDK's `cli/commands/checkpoint.py` refuses an
 * archive without them). `Models.saveForSampler` writes those files; a full-weights model has none, and its sampler
 * weights are refused here (400), as are training checkpoints (`weights/NAME`).
 *
 * @since 0.1.0
 */
import { Clock, Effect, FileSystem } from "effect"
import type * as Http from "node:http"
import * as tar from "tar"
import * as Types from "../../src/tinker/Types.ts"
import * as Auth from "../internal/auth.ts"
import * as Models from "./Models.ts"

/** The files of an archive, in order. */
export const files = ["adapter_config.json", "adapter_model.safetensors", "checkpoint_complete"] as const

/** How long an archive's URL is served (the SDK's signed URLs expire too). */
const lifetimeMs = 60 * 60_000

const name = "([A-Za-z0-9._-]+)"
/** The SDK puts `checkpoint_id` in the path as it is: its slash may come encoded. */
const routePattern = new RegExp(
  `^/api/v1/training_runs/${name}/checkpoints/(sampler_weights|weights)(?:/|%2F)${name}/archive$`,
  "i"
)
const tarPattern = /^\/api\/v1\/archives\/([0-9a-f-]{36})\.tar$/

const json = (res: Http.ServerResponse, status: number, body: unknown) => {
  const bytes = Buffer.from(JSON.stringify(body))
  res.writeHead(status, { "content-type": "application/json", "content-length": bytes.length }).end(bytes)
}
const refuse = (res: Http.ServerResponse, status: number, detail: string) =>
  json(res, status, Types.encodeJson(Types.ErrorBody, { detail }))

/** Streams the tar of `dir`'s archive files into `res`. */
const sendTar = (res: Http.ServerResponse, dir: string) =>
  Effect.callback<void>((resume) => {
    res.writeHead(200, { "content-type": "application/x-tar" })
    const pack = tar.c({ cwd: dir, portable: true }, [...files])
    pack.on("error", () => {
      res.destroy()
      resume(Effect.void)
    })
    res.on("close", () => resume(Effect.void))
    pack.pipe(res)
  })

/**
 * A handler of the archive route and the archives' URLs over the checkpoints folder `checkpoints`, run with `run`:
 * true when it took `req`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const handler = (
  checkpoints: string,
  keys: Auth.Tokens,
  run: (effect: Effect.Effect<void, never, FileSystem.FileSystem>) => void
) => {
  const issued = new Map<string, { readonly dir: string; readonly expires: number }>()
  const archive = (req: Http.IncomingMessage, res: Http.ServerResponse, m: RegExpExecArray) =>
    Effect.gen(function*() {
      const presented = req.headers[Types.headers.apiKey.toLowerCase()]
      const key = typeof presented === "string" ? presented : undefined
      if (Auth.required(keys) && Auth.match(keys, key) === -1) {
        return refuse(res, 401, "a valid X-API-Key header is required")
      }
      const [, model, kind, checkpoint] = m as unknown as [string, string, string, string]
      const path = `tinker://${model}/${kind}/${checkpoint}`
      if (kind !== "sampler_weights") {
        return refuse(res, 400, `${path}: only sampler weights are archived here (a LoRA model's adapter)`)
      }
      const dir = Models.adapterDir(checkpoints, model, checkpoint)
      const fs = yield* FileSystem.FileSystem
      const complete = yield* fs.exists(`${dir}/checkpoint_complete`).pipe(Effect.orElseSucceed(() => false))
      if (!complete) {
        return refuse(res, 400, `${path} has no adapter archive: only a LoRA model's sampler weights have one`)
      }
      const now = yield* Clock.currentTimeMillis
      for (const [token, entry] of issued) if (entry.expires <= now) issued.delete(token)
      const token = crypto.randomUUID()
      issued.set(token, { dir, expires: now + lifetimeMs })
      const url = `http://${req.headers.host ?? "127.0.0.1"}/api/v1/archives/${token}.tar`
      json(res, 200, Types.encodeJson(Types.CheckpointArchiveUrlResponse, {
        url,
        expires: new Date(now + lifetimeMs).toISOString()
      }))
    })
  const download = (res: Http.ServerResponse, token: string) =>
    Effect.gen(function*() {
      const entry = issued.get(token)
      if (entry === undefined || entry.expires <= (yield* Clock.currentTimeMillis)) {
        return refuse(res, 404, "no such archive (or it expired): ask the archive route again")
      }
      yield* sendTar(res, entry.dir)
    })
  return (req: Http.IncomingMessage, res: Http.ServerResponse): boolean => {
    const path = (req.url ?? "/").split("?")[0]!
    const route = routePattern.exec(path)
    const tarred = tarPattern.exec(path)
    if (route === null && tarred === null) return false
    if (req.method !== "GET") {
      refuse(res, 405, `${req.method} ${path} is not served`)
      return true
    }
    run(route !== null ? archive(req, res, route) : download(res, tarred![1]!))
    return true
  }
}
