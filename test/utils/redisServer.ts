/**
 * A private redis-server for a test file: spawned on a free loopback port, killed by pid when the scope closes.
 */
import { Effect } from "effect"
import type { Scope } from "effect"
import { spawn } from "node:child_process"
import { createServer } from "node:net"
import { Redis } from "ioredis"

const freePort = Effect.callback<number>((resume) => {
  const server = createServer()
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(Effect.succeed(port)))
  })
})

const ping = (port: number) =>
  Effect.tryPromise(() => {
    const redis = new Redis({
      port,
      host: "127.0.0.1",
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null
    })
    redis.on("error", (_: unknown) => undefined)
    return redis.connect().then(() => redis.ping()).finally(() => redis.disconnect())
  })

/** Starts redis-server and returns its URL, its port and a way to kill it early (to test connection loss). */
export const redisServer: Effect.Effect<
  { readonly url: string; readonly port: number; readonly kill: Effect.Effect<void> },
  unknown,
  Scope.Scope
> = Effect.gen(function*() {
  const port = yield* freePort
  const child = yield* Effect.acquireRelease(
    Effect.sync(() =>
      spawn(
        "/usr/bin/redis-server",
        ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        { stdio: "ignore" }
      )
    ),
    (child) => Effect.sync(() => child.kill("SIGKILL"))
  )
  yield* Effect.retry(Effect.andThen(Effect.sleep("20 millis"), ping(port)), { times: 250 })
  return { url: `redis://127.0.0.1:${port}`, port, kill: Effect.sync(() => void child.kill("SIGKILL")) }
})
