/**
 * A scripted Tinker server on loopback for failure injection: each request is answered by the test's handler, which
 * may answer any status and headers, drop the connection, or hang. Every request is recorded (path, body, headers).
 */
import { Effect } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"

export interface Seen {
  readonly path: string
  readonly body: any
  readonly headers: Readonly<Record<string, string | undefined>>
}

export type Answer =
  | { readonly status: number; readonly json?: unknown; readonly headers?: Record<string, string> }
  | "drop"
  | "hang"

export type Handler = (seen: Seen, index: number) => Answer

export interface ScriptedServer {
  readonly baseUrl: string
  readonly seen: Array<Seen>
  /** Requests to `path` so far. */
  readonly count: (path: string) => number
}

/** Starts the server in the test's scope (closed with it). */
export const scriptedTinker = (handler: Handler) =>
  Effect.acquireRelease(
    Effect.callback<ScriptedServer & { readonly close: () => void }>((resume) => {
      const seen: Array<Seen> = []
      const server = createServer((req, res) => {
        let raw = ""
        req.on("data", (chunk) => (raw += chunk))
        req.on("end", () => {
          const entry: Seen = {
            path: req.url ?? "",
            body: raw === "" ? undefined : JSON.parse(raw),
            headers: req.headers as Record<string, string | undefined>
          }
          seen.push(entry)
          const answer = handler(entry, seen.length - 1)
          if (answer === "hang") return
          if (answer === "drop") return void req.socket.destroy()
          res.writeHead(answer.status, { "content-type": "application/json", ...answer.headers })
          res.end(JSON.stringify(answer.json ?? { detail: "scripted refusal" }))
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo
        resume(Effect.succeed({
          baseUrl: `http://127.0.0.1:${port}`,
          seen,
          count: (path) => seen.filter((s) => s.path === path).length,
          close: () => {
            server.closeAllConnections()
            server.close()
          }
        }))
      })
    }),
    (server) => Effect.sync(server.close)
  )
