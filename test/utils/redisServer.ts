/**
 * A private redis-server for a test file: spawned on a free loopback port with its own data directory, killed by
 * pid (and the directory removed) when the scope closes. It can be killed and restarted on the same port and
 * directory mid-test, with or without persistence (AOF), and started as a replica of another one.
 */
import { Effect } from "effect"
import type { Scope } from "effect"
import { spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { cpSync, mkdtempSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Redis } from "ioredis"

/** A port nothing listens on now (for a server to be started on it, and again after a restart). */
export const freePort = Effect.callback<number>((resume) => {
  const server = createServer()
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(Effect.succeed(port)))
  })
})

/** Runs one command on a short-lived connection that never retries (so a dead server fails at once). */
const command = <A>(port: number, f: (redis: Redis) => Promise<A>) =>
  Effect.tryPromise(() => {
    const redis = new Redis({
      port,
      host: "127.0.0.1",
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null
    })
    redis.on("error", (_: unknown) => undefined)
    return redis.connect().then(() => f(redis)).finally(() => redis.disconnect())
  })

const ping = (port: number) => command(port, (redis) => redis.ping())

/**
 * How the server runs. `appendonly`: AOF persistence, else none at all (`--save '' --appendonly no`, as
 * `.ci/setup-services` runs it). `appendfsync` (default Redis's `everysec`): `always` makes every acknowledged
 * write survive a SIGKILL; with `everysec` Redis may postpone writing the AOF while a background fsync runs, and a
 * SIGKILL then loses writes it had already acknowledged. `replicaOf`: the port of a primary to follow.
 */
export interface RedisServerOptions {
  readonly appendonly?: boolean
  readonly appendfsync?: "always" | "everysec"
  readonly replicaOf?: number
}

/** A running test server. */
export interface RedisServer {
  readonly url: string
  readonly port: number
  /** The data directory (holds the AOF files when `appendonly`). */
  readonly dir: string
  /** SIGKILL the server and wait for it to exit (no shutdown save: what a crash leaves). */
  readonly kill: Effect.Effect<void>
  /** Start it again on the same port and directory (after {@link kill}); a new `run_id`. */
  readonly start: Effect.Effect<void, unknown>
  /** Replace the data directory with a copy saved by {@link snapshot} (only while killed). */
  readonly restoreSnapshot: Effect.Effect<void>
  /** Copy the data directory aside, e.g. to restart later from persisted state that misses newer writes. */
  readonly snapshot: Effect.Effect<void>
  /** `REPLICAOF NO ONE`: a replica becomes a primary (a manual failover). */
  readonly promote: Effect.Effect<void, unknown>
  /** Waits until this replica's link to its primary is up and it has applied everything the primary sent. */
  readonly synced: Effect.Effect<void, unknown>
}

/**
 * Starts redis-server with `options` and returns its URL, its port and ways to kill, restart, snapshot and
 * promote it.
 */
export const redisServerWith = (options: RedisServerOptions): Effect.Effect<RedisServer, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const port = yield* freePort
    const dir = yield* Effect.acquireRelease(
      Effect.sync(() => mkdtempSync(join(tmpdir(), "agentfly-redis-"))),
      (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
    )
    const snapshotDir = `${dir}.snapshot`
    yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(snapshotDir, { recursive: true, force: true })))
    const args = [
      "--port",
      String(port),
      "--bind",
      "127.0.0.1",
      "--dir",
      dir,
      "--save",
      "",
      "--appendonly",
      options.appendonly === true ? "yes" : "no",
      "--appendfsync",
      options.appendfsync ?? "everysec",
      // A replica syncs at once (the default waits 5 s for more replicas before a diskless full sync).
      "--repl-diskless-sync-delay",
      "0",
      ...(options.replicaOf === undefined ? [] : ["--replicaof", "127.0.0.1", String(options.replicaOf)])
    ]
    let child: ChildProcess | undefined
    const kill = Effect.callback<void>((resume) => {
      const current = child
      child = undefined
      if (current === undefined || current.exitCode !== null || current.signalCode !== null) {
        return resume(Effect.void)
      }
      current.once("exit", () => resume(Effect.void))
      current.kill("SIGKILL")
    })
    const start = Effect.gen(function*() {
      child = spawn("/usr/bin/redis-server", args, { stdio: "ignore" })
      yield* Effect.retry(Effect.andThen(Effect.sleep("20 millis"), ping(port)), { times: 250 })
    })
    yield* Effect.addFinalizer(() => kill)
    yield* start
    const info = command(port, (redis) => redis.info("replication"))
    return {
      url: `redis://127.0.0.1:${port}`,
      port,
      dir,
      kill,
      start,
      snapshot: Effect.sync(() => cpSync(dir, snapshotDir, { recursive: true })),
      restoreSnapshot: Effect.sync(() => {
        rmSync(dir, { recursive: true, force: true })
        cpSync(snapshotDir, dir, { recursive: true })
      }),
      promote: Effect.asVoid(command(port, (redis) => redis.replicaof("NO", "ONE"))),
      synced: Effect.gen(function*() {
        const primary = options.replicaOf!
        const offset = (text: string, field: string) => Number(text.match(new RegExp(`${field}:(\\d+)`))?.[1] ?? -1)
        const target = offset(yield* command(primary, (redis) => redis.info("replication")), "master_repl_offset")
        yield* Effect.retry(
          Effect.flatMap(info, (text) =>
            text.includes("master_link_status:up") && offset(text, "master_repl_offset") >= target
              ? Effect.void
              : Effect.andThen(Effect.sleep("20 millis"), Effect.fail("not synced"))),
          { times: 500 }
        )
      })
    }
  })

/** A server without persistence (as `.ci/setup-services` runs it). */
export const redisServer: Effect.Effect<RedisServer, unknown, Scope.Scope> = redisServerWith({})
