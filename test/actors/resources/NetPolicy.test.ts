/**
 * A container's network allow-list (`Docker.ContainerOptions.allowHosts`, `internal/netPolicy.ts`) on the real
 * engine. The test makes its own network: a veth pair left in the host's namespace, carrying two private addresses
 * (10.251.N.1 and 10.251.N.9) with a TCP server on each; nothing outside the machine is touched. A container allowed
 * the first reaches it and only it (the second and the host's link address are "network unreachable"); a container
 * without an allow-list reaches neither; the container's link is gone when the container is.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFileSync } from "node:child_process"
import { createServer } from "node:net"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as Docker from "../../../actors/resources/Docker.ts"
import * as NetPolicy from "../../../actors/resources/internal/netPolicy.ts"
import * as Resource from "../../../src/Resource.ts"

const n = process.pid % 250
const [allowed, denied] = [`10.251.${n}.1`, `10.251.${n}.9`]
const pair = `aft${process.pid}`.slice(0, 12)

/** The test's own addresses, on a veth pair it creates (and removes). */
const testNetwork = Effect.acquireRelease(
  Effect.sync(() => {
    execFileSync("ip", ["link", "add", `${pair}a`, "type", "veth", "peer", "name", `${pair}b`])
    for (const address of [allowed, denied]) execFileSync("ip", ["addr", "add", `${address}/32`, "dev", `${pair}a`])
    execFileSync("ip", ["link", "set", `${pair}a`, "up"])
    execFileSync("ip", ["link", "set", `${pair}b`, "up"])
  }),
  () => Effect.sync(() => execFileSync("ip", ["link", "del", `${pair}a`]))
)

/** A TCP server on `host:port` that answers "hi". */
const server = (host: string, port: number) =>
  Effect.acquireRelease(
    Effect.callback<ReturnType<typeof createServer>>((resume) => {
      const s = createServer((socket) => socket.end("hi"))
      s.listen(port, host, () => resume(Effect.succeed(s)))
    }),
    (s) => Effect.sync(() => s.close())
  )

/** What a connection from inside the container to each address says: `ok`, or the error's name. */
const probe = (container: Docker.Container, hosts: ReadonlyArray<string>, port: number) =>
  Effect.map(
    container.exec([
      "python3",
      "-c",
      `import socket
for a in ${JSON.stringify(hosts)}:
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((a, ${port})); print(a, s.recv(2).decode())
    except OSError as e:
        print(a, type(e).__name__, e.errno)`
    ], { timeoutMillis: 30_000 }),
    (r) => r.stdout.trim().split("\n")
  )

describe("a container's network allow-list (Docker)", () => {
  it.live("reaches its allowed host and nothing else; without a list, nothing; its link goes with it", () =>
    Effect.gen(function*() {
      yield* testNetwork
      const port = 20_000 + (process.pid % 10_000)
      yield* server(allowed, port)
      yield* server(denied, port)
      const engine = yield* Docker.make({ handleSignals: false })
      const manager = yield* ResourceManager.make()
      const start = (name: string, allowHosts: ReadonlyArray<string>) =>
        Effect.gen(function*() {
          const spec = Resource.makeUnsafe({ name, kind: "docker", image: "agentfly/python:1", limits: { pids: 32 } })
          const launcher = yield* Docker.launcher({ cmd: ["sleep", "3600"], allowHosts }).pipe(
            Effect.provideService(Docker.DockerEngine, engine)
          )
          const lease = yield* manager.acquire(Resource.resource(spec, launcher), { chainId: name, groupId: name })
          return lease
        })
      const hosts = [allowed, denied, "10.252.0.1"]
      const open = yield* start("netpolicy-open", [allowed])
      const said = yield* open.use((c) => probe(c, hosts, port))
      assert.deepStrictEqual(said, [`${allowed} hi`, `${denied} OSError 101`, "10.252.0.1 OSError 101"])
      const closed = yield* start("netpolicy-closed", [])
      assert.deepStrictEqual(yield* closed.use((c) => probe(c, [allowed], port)), [`${allowed} OSError 101`])
      // The container's link is in its namespace: it is gone with the container.
      const id = yield* open.use((c) => Effect.succeed(c.id))
      const link = NetPolicy.linkOf(id).host
      assert.include(execFileSync("ip", ["-o", "link", "show", link], { encoding: "utf8" }), link)
      yield* Effect.promise(() => engine.docker.getContainer(id).remove({ force: true }))
      yield* Effect.sleep("1 second")
      assert.throws(() => execFileSync("ip", ["link", "show", link], { stdio: "ignore" }))
    }).pipe(Effect.scoped), { timeout: 120_000 })
})
