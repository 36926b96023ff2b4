/**
 * What the HTTP actors (the OpenAI-compatible server, the gateway, inference servers, rollout workers) share:
 * listening for the life of a scope, reading a request body within a limit, and saying why a `fetch` failed.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import type { Scope } from "effect"
import type * as Http from "node:http"
import type { AddressInfo } from "node:net"

/**
 * Why a body could not be read: 413 past the limit, 400 when the connection broke.
 *
 * @category models
 * @since 0.1.0
 */
export interface BodyError {
  readonly status: 400 | 413
  readonly message: string
}

/**
 * A request's body; one over `maxBytes` is refused from its `Content-Length`, or as soon as it passes the limit.
 *
 * @category constructors
 * @since 0.1.0
 */
export const readBody = (req: Http.IncomingMessage, maxBytes: number): Effect.Effect<Buffer, BodyError> =>
  Effect.callback<Buffer, BodyError>((resume) => {
    const tooLarge: BodyError = { status: 413, message: `the request body exceeds ${maxBytes} bytes` }
    if (Number(req.headers["content-length"] ?? 0) > maxBytes) return resume(Effect.fail(tooLarge))
    const chunks: Array<Buffer> = []
    let size = 0, done = false
    req.on("data", (c: Buffer) => {
      if (done) return
      size += c.length
      if (size > maxBytes) {
        done = true
        chunks.length = 0
        resume(Effect.fail(tooLarge))
      } else chunks.push(c)
    })
    req.on("end", () => {
      if (done) return
      done = true
      resume(Effect.succeed(Buffer.concat(chunks)))
    })
    req.on("error", () => {
      if (!done) resume(Effect.fail({ status: 400, message: "the request body could not be read" }))
      done = true
    })
  })

/**
 * What a failed `fetch` says, with its cause (`fetch failed: ECONNREFUSED`): what a user must fix.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fetchMessage = (e: unknown): string => {
  const error = e as { message?: string; cause?: { code?: string; message?: string } }
  const cause = error.cause?.code ?? error.cause?.message
  return [error.message ?? String(e), cause].filter((x) => x !== undefined && x !== "").join(": ")
}

/**
 * Listens on `port` (0: a free one) for the life of the scope, and returns the port; closing the scope ends open
 * connections and stops listening.
 *
 * @category constructors
 * @since 0.1.0
 */
export const listen = (
  server: Http.Server,
  options: { readonly port: number; readonly host: string; readonly backlog?: number | undefined }
): Effect.Effect<number, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.callback<void>((resume) => {
      server.listen({ port: options.port, host: options.host, backlog: options.backlog }, () => resume(Effect.void))
    }),
    () =>
      Effect.callback<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(() => (server.address() as AddressInfo).port))
