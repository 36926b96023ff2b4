/**
 * `npm run bench -- resources`
 *
 * The resource manager and its backends, each against a baseline measured in the same run:
 *
 * - `lease`: acquire + release of a warm in-process instance through `ResourceManager` (sharing key, health check
 *   on acquire, reset on release, metrics), vs `Pool.get` of effect's own `Pool` (no keys, no checks).
 * - `docker exec`: one `exec` of `true` in a warm sandbox container, vs the Python sandbox's call on the opt-in
 *   `exec` transport (one exec of the client + the supervisor + the persistent interpreter), vs the same call over
 *   the container's attached stdio (`attach`, the default), vs under bubblewrap.
 * - `redis`: acquire + release of a global lease (two Lua scripts), vs a `PING`.
 * - `chains`: 16 concurrent chains of (lease → 5 `python` calls → release) through the manager on warm Docker
 *   sandboxes with the `exec` transport, vs 1 chain; throughput in calls per second (and the same with the
 *   attach transport and on
 *   bubblewrap sandboxes). The rollout
 *   runtime's own chains add sampling on top; this measures the environment side alone.
 *
 * Headline: chains-16 throughput / chains-1 throughput (target ≥ 2: the sandbox path must scale past one core's
 * worth of waiting). Figures are medians of a few rounds.
 */
import { Clock, Context, Effect, Layer, Pool } from "effect"
import { readdirSync, readFileSync } from "node:fs"
import { loadavg } from "node:os"
import * as ResourceManager from "../actors/ResourceManager.ts"
import * as Docker from "../actors/resources/Docker.ts"
import * as InProcess from "../actors/resources/InProcess.ts"
import * as Redis from "../actors/resources/Redis.ts"
import * as PythonSandbox from "../environments/python/PythonSandbox.ts"
import * as Resource from "../src/Resource.ts"
import { redisServer } from "../test/utils/redisServer.ts"

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/** Mean time per iteration of `effect` over `n` sequential runs, in milliseconds. */
const perCall = <A, E, R>(n: number, effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const start = yield* Clock.currentTimeNanos
    for (let i = 0; i < n; i++) yield* effect
    return Number((yield* Clock.currentTimeNanos) - start) / 1e6 / n
  })

const rounds = <E, R>(k: number, round: Effect.Effect<number, E, R>) =>
  Effect.map(Effect.forEach(Array.from({ length: k }), () => round), median)

class Noop extends Context.Service<Noop, { readonly n: number }>()("bench/Noop") {}

const leaseFigures = Effect.gen(function*() {
  const manager = yield* ResourceManager.ResourceManager
  const resource = InProcess.resource(
    Resource.makeUnsafe({ name: "noop", kind: "in-process", pool: { max: 1, prewarm: 1 } }),
    Layer.succeed(Noop, Noop.of({ n: 0 })),
    { reset: () => Effect.void }
  )
  const owner = { chainId: "c", groupId: "g" }
  const lease = Effect.scoped(manager.acquire(resource, owner))
  yield* lease
  const pool = yield* Pool.make({ acquire: Effect.succeed(1), size: 1 })
  const get = Effect.scoped(Pool.get(pool))
  yield* get
  const n = 2_000
  const managerMs = yield* rounds(5, perCall(n, lease))
  const poolMs = yield* rounds(5, perCall(n, get))
  return { managerUs: managerMs * 1000, effectPoolUs: poolMs * 1000, ratio: managerMs / poolMs }
})

const sandboxSpec = (kind: "docker" | "bubblewrap", name: string, max: number) =>
  PythonSandbox.spec({
    kind,
    name,
    pool: { max, prewarm: max },
    limits: { memoryBytes: 256 * 1024 * 1024, pids: 64 },
    timeouts: { acquireMillis: 120_000, startMillis: 60_000 }
  })

/** Waits until `count` instances of the pool are idle (prewarmed). */
const warm = (name: string, count: number) =>
  Effect.gen(function*() {
    const manager = yield* ResourceManager.ResourceManager
    while (((yield* manager.stats(name))?.idle ?? 0) < count) yield* Effect.sleep("100 millis")
  })

const execFigures = Effect.gen(function*() {
  const manager = yield* ResourceManager.ResourceManager
  const owner = { chainId: "exec", groupId: "g" }
  const rawLauncher = yield* Docker.launcher({ cmd: ["sleep", "3600"] })
  const raw = Resource.resource(
    Resource.makeUnsafe({ name: "raw", kind: "docker", image: "agentfly/python:1", pool: { max: 1 } }),
    rawLauncher
  )
  const rawLease = yield* manager.acquire(raw, owner)
  const rawMs = yield* rounds(3, perCall(20, rawLease.use((c) => c.exec(["true"]))))

  const docker = yield* PythonSandbox.docker(yield* sandboxSpec("docker", "py-exec", 1), { transport: "exec" })
  const pyLease = yield* manager.acquire(docker, owner)
  const py = PythonSandbox.fromLease(pyLease)
  yield* py.run("x = 0")
  const pythonMs = yield* rounds(3, perCall(20, py.run("x += 1")))

  const attached = yield* PythonSandbox.docker(yield* sandboxSpec("docker", "py-attach", 1), { transport: "attach" })
  const atLease = yield* manager.acquire(attached, owner)
  const at = PythonSandbox.fromLease(atLease)
  yield* at.run("x = 0")
  const attachMs = yield* rounds(3, perCall(50, at.run("x += 1")))

  const bwrap = PythonSandbox.bubblewrap(yield* sandboxSpec("bubblewrap", "py-bwrap", 1))
  const bwLease = yield* manager.acquire(bwrap, owner)
  const bw = PythonSandbox.fromLease(bwLease)
  yield* bw.run("x = 0")
  const bwrapMs = yield* rounds(3, perCall(50, bw.run("x += 1")))
  return {
    dockerExecTrueMs: rawMs,
    pythonCallDockerMs: pythonMs,
    pythonCallDockerAttachMs: attachMs,
    pythonCallBubblewrapMs: bwrapMs,
    pythonDockerVsExec: pythonMs / rawMs,
    bubblewrapVsDocker: bwrapMs / pythonMs
  }
})

const redisFigures = Effect.gen(function*() {
  const server = yield* redisServer
  const redis = yield* Redis.connect(server.url)
  const coordinator = Redis.make(redis, { ttlMillis: 10_000 })
  const lease = Effect.scoped(
    coordinator.acquire({ resource: "bench", cap: 4, waitMillis: 1_000, onLost: () => Effect.void })
  )
  const ping = Effect.promise(() => redis.ping())
  yield* lease
  const leaseMs = yield* rounds(5, perCall(300, lease))
  const pingMs = yield* rounds(5, perCall(300, ping))
  return { leaseRoundTripMs: leaseMs, pingMs, ratio: leaseMs / pingMs }
})

const CALLS = 5

/**
 * CPU time (ms) used so far by the container engine: dockerd, containerd and the shims, with their reaped children
 * (runc, exec'd processes). Read from /proc; 0 where it cannot be read.
 */
const engineCpuMs = (): number => {
  let ticks = 0
  for (const pid of readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
      const comm = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"))
      if (!/^(dockerd|containerd)/.test(comm)) continue
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
      ticks += Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14])
    } catch {
      // the process ended
    }
  }
  return ticks * 10 // USER_HZ = 100
}

/** `chains` concurrent chains, each leasing its own sandbox for CALLS python calls; calls per second. */
const chainThroughput = (resource: Resource.Resource<PythonSandbox.Instance>, chains: number, round: number) =>
  Effect.gen(function*() {
    const manager = yield* ResourceManager.ResourceManager
    const start = yield* Clock.currentTimeMillis
    yield* Effect.forEach(Array.from({ length: chains }, (_, i) => i), (i) =>
      Effect.scoped(Effect.gen(function*() {
        const lease = yield* manager.acquire(resource, { chainId: `r${round}-c${i}`, groupId: `r${round}` })
        const sandbox = PythonSandbox.fromLease(lease)
        yield* sandbox.run("total = 0")
        for (let k = 1; k < CALLS; k++) yield* sandbox.run(`total += sum(range(${k * 1000}))\nprint(total)`)
      })), { concurrency: "unbounded", discard: true })
    const seconds = ((yield* Clock.currentTimeMillis) - start) / 1000
    return (chains * CALLS) / seconds
  })

const chainFigures = Effect.gen(function*() {
  const docker = yield* PythonSandbox.docker(yield* sandboxSpec("docker", "py-chains", 16), { transport: "exec" })
  const manager = yield* ResourceManager.ResourceManager
  yield* manager.open(docker)
  yield* warm("py-chains", 16)
  let round = 0
  const cpuBefore = engineCpuMs()
  const one = yield* rounds(3, Effect.suspend(() => chainThroughput(docker, 1, round++)))
  // Engine CPU per call (3 rounds of 1 chain × CALLS calls): what bounds throughput on a machine of few cores.
  const engineCpuPerCallMs = (engineCpuMs() - cpuBefore) / (3 * CALLS)
  const sixteen = yield* rounds(3, Effect.suspend(() => chainThroughput(docker, 16, round++)))
  yield* manager.close("py-chains")
  // The same chains on Docker with the `attach` transport (no exec per call).
  const attached = yield* PythonSandbox.docker(yield* sandboxSpec("docker", "py-chains-attach", 16), {
    transport: "attach"
  })
  yield* manager.open(attached)
  yield* warm("py-chains-attach", 16)
  const atOne = yield* rounds(3, Effect.suspend(() => chainThroughput(attached, 1, round++)))
  const atSixteen = yield* rounds(3, Effect.suspend(() => chainThroughput(attached, 16, round++)))
  yield* manager.close("py-chains-attach")
  // The same chains on bubblewrap sandboxes (no engine in the path).
  const bwrap = PythonSandbox.bubblewrap(yield* sandboxSpec("bubblewrap", "py-chains-bwrap", 16))
  yield* manager.open(bwrap)
  yield* warm("py-chains-bwrap", 16)
  const bwOne = yield* rounds(3, Effect.suspend(() => chainThroughput(bwrap, 1, round++)))
  const bwSixteen = yield* rounds(3, Effect.suspend(() => chainThroughput(bwrap, 16, round++)))
  return {
    chains1CallsPerSecond: one,
    chains16CallsPerSecond: sixteen,
    ratio: sixteen / one,
    engineCpuPerCallMs,
    /** The most calls per second the engine's CPU per call allows on 2 cores. */
    engineBoundCallsPerSecondOn2Cores: 2000 / engineCpuPerCallMs,
    dockerAttach: { chains1CallsPerSecond: atOne, chains16CallsPerSecond: atSixteen, ratio: atSixteen / atOne },
    bubblewrap: { chains1CallsPerSecond: bwOne, chains16CallsPerSecond: bwSixteen, ratio: bwSixteen / bwOne }
  }
})

export default () =>
  Effect.runPromise(
    Effect.scoped(Effect.gen(function*() {
      const loadBefore = loadavg()[0]!
      const lease = yield* leaseFigures
      const exec = yield* execFigures
      const redis = yield* redisFigures
      const chains = yield* chainFigures
      return {
        headline: {
          metric: "python chains: 16 concurrent / 1 (calls/s)",
          value: chains.ratio,
          target: 2,
          better: "higher"
        },
        lease,
        exec,
        redis,
        chains,
        loadAverage: { before: loadBefore, after: loadavg()[0]! }
      } as const
    })).pipe(
      Effect.provide(Layer.merge(ResourceManager.ResourceManager.layer, Docker.layerWith({ handleSignals: true })))
    )
  )
