/**
 * A POST that waits as long as its caller allows. Node's `fetch` gives up on a request whose answer has not begun
 * after 5 minutes (undici's `headersTimeout`), whatever the caller's own limit: a learner step of a large model on a
 * trainer server can take longer. `node:http` has no such limit; here the only ones are `signal` and `timeoutMs`.
 *
 * @since 0.1.0
 */
import * as Http from "node:http"
import * as Https from "node:https"

/**
 * A reply: its status and its whole body.
 *
 * @category models
 * @since 0.1.0
 */
export interface Reply {
  readonly status: number
  readonly bytes: Uint8Array
}

/**
 * POSTs `body` to `url` (http or https) and reads the whole reply. Fails with the connection's error code
 * (`ECONNREFUSED`, `ECONNRESET`), `no answer within N s` past `timeoutMs`, or the signal's reason.
 *
 * @category constructors
 * @since 0.1.0
 */
export const post = (
  url: string,
  options: {
    readonly headers: Readonly<Record<string, string>>
    readonly body: Uint8Array
    readonly timeoutMs: number
    readonly signal?: AbortSignal | undefined
  }
): Promise<Reply> =>
  new Promise<Reply>((resolve, reject) => {
    const signal = AbortSignal.any([
      AbortSignal.timeout(options.timeoutMs),
      ...(options.signal === undefined ? [] : [options.signal])
    ])
    const send = url.startsWith("https:") ? Https.request : Http.request
    const request = send(url, {
      method: "POST",
      headers: { ...options.headers, "content-length": String(options.body.byteLength) },
      signal
    }, (response) => {
      const chunks: Array<Buffer> = []
      response.on("data", (chunk: Buffer) => chunks.push(chunk))
      response.on(
        "end",
        () => resolve({ status: response.statusCode ?? 0, bytes: new Uint8Array(Buffer.concat(chunks)) })
      )
      response.on("error", (e) => reject(e))
    })
    request.on("error", (e: Error & { code?: string }) => {
      const timedOut = signal.aborted && (signal.reason as Error | undefined)?.name === "TimeoutError"
      reject(
        timedOut
          ? new Error(`no answer within ${options.timeoutMs / 1000} s`)
          : new Error(e.code ?? e.message, { cause: e })
      )
    })
    request.end(options.body)
  })
