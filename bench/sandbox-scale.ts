/**
 * `npm run bench -- sandbox-scale`
 *
 * How the Python sandbox scales with concurrent chains, per transport (issue 19 part 3): Docker with its default
 * transport (`attach`) and bubblewrap. Each chain leases its own warm sandbox through the resource manager, calls the
 * `python` tool through the tool actor `CALLS` times, then releases it (a reset), as a rollout chain does. Three
 * kinds of call:
 *
 * - `empty`: `pass`, the per-call latency of the path itself (one chain, held lease);
 * - `sleep`: `time.sleep(0.02)`, a call that waits ~20 ms (standing for I/O): 16 chains should overlap the waits
 *   (target ≥ 8× one chain's calls/s);
 * - `arith`: ~5 ms of Python arithmetic (the loop's length is calibrated at start-up on the 1-chain sandbox):
 *   16 chains are bound by the machine's cores (2 here, so at most 2×; target ≥ 1.7×).
 *
 * Every figure is against the 1-chain baseline of the same run: for each round, transport and kind, a 1-chain
 * round then a 16-chain round, so load drifts over both alike; figures are medians of `ROUNDS` rounds. The Docker
 * `exec` transport (the default before this bench) is measured for the empty call's latency only: at ≈ 100 ms of
 * engine CPU per call its scaling is bound by the engine (≈ 1.7×, `BENCHMARKS.md`, resources).
 *
 * `cpuMsPerCallAt16` splits the CPU a call costs at 16 chains into this process (`host`: the tool actor, the lease,
 * the channel), the container `engine` (dockerd, containerd and the shims: shared with any other Docker user of the
 * machine) and the `sandbox` (its cgroups: supervisor, worker, the cell itself): what bounds the arithmetic figure.
 * The load average is recorded at every round because the machine is shared; under load the ratios measure how
 * the scheduler shares the cores more than the sandbox (see `BENCHMARKS.md`).
 *
 * Headline: the worst of the four ratios (2 transports × 2 kinds) divided by its target, so ≥ 1 means all met.
 */
import { Clock, Context, Effect, Layer } from "effect"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { availableParallelism, loadavg } from "node:os"
import { join } from "node:path"
import * as ResourceManager from "../actors/ResourceManager.ts"
import * as Docker from "../actors/resources/Docker.ts"
import * as ToolActor from "../actors/ToolActor.ts"
import * as PythonSandbox from "../environments/python/PythonSandbox.ts"
import { python } from "../environments/python/PythonTool.ts"
import type * as Environment from "../src/Environment.ts"
import type * as Resource from "../src/Resource.ts"

const CHAINS = 16
const ROUNDS = Number(process.env["SCALE_ROUNDS"] ?? 7)
/**
 * Calls per chain per round, by kind: a round of 1 chain lasts ≈ 0.6 s, of 16 chains ≈ 0.7 s (sleep), 4 s (arith).
 */
const CALLS = { sleep: 32, arith: 96 } as const
const LATENCY_CALLS = 200
const TARGETS = { sleep: 8, arith: 1.7 } as const

type Kind = keyof typeof CALLS

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const quantile = (xs: ReadonlyArray<number>, q: number) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length * q)]!

const elapsedMs = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const start = yield* Clock.currentTimeNanos
    yield* effect
    return Number((yield* Clock.currentTimeNanos) - start) / 1e6
  })

interface Target {
  readonly transport: "attach" | "bubblewrap" | "exec"
  readonly resource: Resource.Resource<PythonSandbox.Instance>
  readonly environment: Environment.Provider<PythonSandbox.PythonSandbox, unknown>
}

const makeTarget = (transport: Target["transport"]) =>
  Effect.gen(function*() {
    const name = `bench-scale-${transport}`
    const spec = yield* PythonSandbox.spec({
      kind: transport === "bubblewrap" ? "bubblewrap" : "docker",
      name,
      pool: { max: CHAINS, prewarm: transport === "exec" ? 1 : CHAINS },
      timeouts: { acquireMillis: 120_000, startMillis: 60_000 }
    })
    const resource = transport === "bubblewrap"
      ? PythonSandbox.bubblewrap(spec)
      : yield* PythonSandbox.docker(spec, { transport })
    const manager = yield* ResourceManager.ResourceManager
    yield* manager.open(resource)
    const environment = yield* PythonSandbox.provider(resource)
    return { transport, resource, environment } satisfies Target
  })

/** Waits until `count` sandboxes of the pool are idle (prewarmed). */
const warm = (name: string, count: number) =>
  Effect.gen(function*() {
    const manager = yield* ResourceManager.ResourceManager
    while (((yield* manager.stats(name))?.idle ?? 0) < count) yield* Effect.sleep("100 millis")
  })

// ===== CPU accounting =====

/** CPU seconds of a process and of its reaped children (`/proc/PID/stat` fields 14–17), 0 if it is gone. */
const processCpu = (pid: number | string): number => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    return (Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14])) / 100
  } catch {
    return 0
  }
}

const entries = (dir: string): Array<string> => (existsSync(dir) ? readdirSync(dir) : [])

/** The container engine's processes (dockerd, containerd and its shims): shared with any other Docker user. */
const engineCpu = (): number =>
  entries("/proc").filter((p) => /^\d+$/.test(p)).reduce((sum, pid) => {
    try {
      return /^(dockerd|containerd)/.test(readFileSync(`/proc/${pid}/comm`, "utf8")) ? sum + processCpu(pid) : sum
    } catch {
      return sum
    }
  }, 0)

/** CPU seconds used inside the sandboxes of a pool: the containers' cpuacct, or the bubblewrap cgroups' processes. */
const sandboxCpu = (target: Target, runId: string) =>
  Effect.gen(function*() {
    if (target.transport === "bubblewrap") {
      const root = "/sys/fs/cgroup/pids/agentfly"
      return entries(root).filter((run) => run.startsWith(`run-${process.pid}-`)).flatMap((run) =>
        entries(join(root, run)).filter((id) => id.startsWith(target.resource.spec.name)).flatMap((id) =>
          readFileSync(join(root, run, id, "cgroup.procs"), "utf8").split("\n").filter((l) => l !== "")
        )
      ).reduce((sum, pid) => sum + processCpu(pid), 0)
    }
    const { docker } = yield* Docker.DockerEngine
    const containers = yield* Effect.promise(() =>
      docker.listContainers({
        filters: { label: [`${Docker.Labels.run}=${runId}`, `${Docker.Labels.resource}=${target.resource.spec.name}`] }
      })
    )
    return containers.reduce((sum, c) => {
      const file = `/sys/fs/cgroup/cpuacct/docker/${c.Id}/cpuacct.usage`
      return existsSync(file) ? sum + Number(readFileSync(file, "utf8")) / 1e9 : sum
    }, 0)
  })

/** CPU ms per call of `effect` (which makes `calls` calls): this process, the engine, the sandboxes. */
const cpuPerCall = <A, E, R>(target: Target, runId: string, calls: number, effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const host = process.cpuUsage()
    const engine = engineCpu()
    const sandboxes = yield* sandboxCpu(target, runId)
    const value = yield* effect
    const used = process.cpuUsage(host)
    const perCall = (seconds: number) => (seconds * 1000) / calls
    return {
      value,
      cpu: {
        hostMs: perCall((used.user + used.system) / 1e6),
        engineMs: target.transport === "bubblewrap" ? 0 : perCall(engineCpu() - engine),
        sandboxMs: perCall((yield* sandboxCpu(target, runId)) - sandboxes)
      }
    }
  })

// ===== Rounds =====

const toolCall = (code: string, i: number) => ({
  id: `call_${i}`,
  type: "function" as const,
  function: { name: "python", arguments: { code } }
})

/** `chains` concurrent chains of (lease → `calls` tool calls of `code` → release); calls per second. */
const round = (
  actor: ToolActor.Service<PythonSandbox.PythonSandbox>,
  target: Target,
  chains: number,
  calls: number,
  code: string,
  id: string
) =>
  Effect.gen(function*() {
    const ms = yield* elapsedMs(Effect.forEach(Array.from({ length: chains }, (_, c) => c), (c) =>
      Effect.scoped(Effect.gen(function*() {
        const context = yield* target.environment.acquire({ chainId: `${id}-c${c}`, groupId: id })
        for (let k = 0; k < calls; k++) {
          const result = yield* actor.execute(toolCall(code, k), { context })
          if (result.error !== undefined) return yield* Effect.die(result.error)
        }
      })), { concurrency: "unbounded", discard: true }))
    return (chains * calls) / (ms / 1000)
  })

/** Latencies (ms) of `count` calls of `code` on one held lease. */
const latencies = (target: Target, code: string, count: number) =>
  Effect.scoped(Effect.gen(function*() {
    const context = yield* target.environment.acquire({ chainId: "latency", groupId: "latency" })
    const sandbox = Context.get(context as Context.Context<PythonSandbox.PythonSandbox>, PythonSandbox.PythonSandbox)
    const times: Array<number> = []
    for (let k = 0; k < count; k++) times.push(yield* elapsedMs(sandbox.run(code)))
    return times
  }))

/**
 * The loop length that takes ~5 ms of arithmetic in the sandbox's interpreter: the cell measures its own CPU time
 * (`time.process_time`), so neither the transport nor the time other processes take from it is counted.
 */
const calibrate = (target: Target) =>
  Effect.scoped(Effect.gen(function*() {
    const context = yield* target.environment.acquire({ chainId: "calibrate", groupId: "calibrate" })
    const sandbox = Context.get(context as Context.Context<PythonSandbox.PythonSandbox>, PythonSandbox.PythonSandbox)
    const n = 20_000
    const seconds: Array<number> = []
    for (let k = 0; k < 21; k++) {
      const result = yield* sandbox.run(
        `import time\nt = time.process_time()\nsum(i * i % 7 for i in range(${n}))\nprint(time.process_time() - t)`
      )
      seconds.push(Number(result.stdout))
    }
    return Math.round(n * 0.005 / median(seconds))
  }))

const codeOf = (kind: Kind, n: number) =>
  kind === "sleep" ? "import time\ntime.sleep(0.02)" : `x = sum(i * i % 7 for i in range(${n}))`

interface Rates {
  readonly one: Array<number>
  readonly many: Array<number>
  readonly cpu1: Array<Cpu>
  readonly cpu: Array<Cpu>
}

interface Cpu {
  readonly hostMs: number
  readonly engineMs: number
  readonly sandboxMs: number
}

const cpuMedians = (cpu: ReadonlyArray<Cpu>) => ({
  host: median(cpu.map((c) => c.hostMs)),
  engine: median(cpu.map((c) => c.engineMs)),
  sandbox: median(cpu.map((c) => c.sandboxMs))
})

const summary = (rates: Rates) => ({
  chains1: median(rates.one),
  chains16: median(rates.many),
  ratio: median(rates.many) / median(rates.one),
  // Each round's ratio against the 1-chain round just before it: the spread of the figure under a drifting load.
  roundRatios: rates.many.map((m, i) => m / rates.one[i]!),
  cpuMsPerCallAt1: cpuMedians(rates.cpu1),
  cpuMsPerCallAt16: cpuMedians(rates.cpu),
  // The 16-chain rate if every core ran this path and nothing else: what the CPU a call costs allows.
  cpuBound16: (availableParallelism() * 1000) /
    Object.values(cpuMedians(rates.cpu)).reduce((sum, ms) => sum + ms, 0),
  rounds1: rates.one,
  rounds16: rates.many
})

const figures = Effect.gen(function*() {
  const { runId } = yield* Docker.DockerEngine
  const targets = [yield* makeTarget("attach"), yield* makeTarget("bubblewrap")]
  const exec = yield* makeTarget("exec")
  yield* warm("bench-scale-attach", CHAINS)
  yield* warm("bench-scale-bubblewrap", CHAINS)
  yield* warm("bench-scale-exec", 1)
  const actor = yield* ToolActor.make([python])
  const n = yield* calibrate(targets[0]!)
  const kinds = ["sleep", "arith"] as const
  // One round each way first: the interpreters' first calls and the JIT.
  for (const target of targets) {
    for (const kind of kinds) {
      yield* round(actor, target, 1, CALLS[kind], codeOf(kind, n), `warm-${target.transport}-${kind}-1`)
      yield* round(actor, target, CHAINS, CALLS[kind], codeOf(kind, n), `warm-${target.transport}-${kind}-16`)
    }
  }
  const rates = targets.map(() => ({
    sleep: { one: [], many: [], cpu1: [], cpu: [] } as Rates,
    arith: { one: [], many: [], cpu1: [], cpu: [] } as Rates
  }))
  const loads: Array<number> = []
  for (let r = 0; r < ROUNDS; r++) {
    loads.push(loadavg()[0]!)
    for (let t = 0; t < targets.length; t++) {
      const target = targets[t]!
      for (const kind of kinds) {
        const code = codeOf(kind, n)
        const into = rates[t]![kind]
        const one = yield* cpuPerCall(
          target,
          runId,
          CALLS[kind],
          round(actor, target, 1, CALLS[kind], code, `r${r}-${t}-${kind}-1`)
        )
        into.one.push(one.value)
        into.cpu1.push(one.cpu)
        const many = yield* cpuPerCall(
          target,
          runId,
          CHAINS * CALLS[kind],
          round(actor, target, CHAINS, CALLS[kind], code, `r${r}-${t}-${kind}-16`)
        )
        into.many.push(many.value)
        into.cpu.push(many.cpu)
      }
    }
  }
  const empty = yield* Effect.forEach([...targets, exec], (target) => {
    const count = target.transport === "exec" ? 20 : LATENCY_CALLS
    return Effect.map(cpuPerCall(target, runId, count, latencies(target, "pass", count)), ({ cpu, value }) => ({
      transport: target.transport,
      medianMs: median(value),
      p90Ms: quantile(value, 0.9),
      cpuMsPerCall: cpu
    }))
  })
  const arithCall = yield* latencies(targets[0]!, codeOf("arith", n), 50)
  return {
    transports: Object.fromEntries(targets.map((target, t) => [target.transport, {
      emptyCall: empty.find((l) => l.transport === target.transport)!,
      sleep20ms: summary(rates[t]!.sleep),
      arith5ms: summary(rates[t]!.arith)
    }])),
    exec: { emptyCall: empty.find((l) => l.transport === "exec")! },
    arithCallMedianMs: median(arithCall),
    settings: { chains: CHAINS, calls: CALLS, rounds: ROUNDS, arithLoop: n, targets: TARGETS },
    loadAverageAtRounds: loads
  }
})

export default () =>
  Effect.runPromise(
    Effect.scoped(Effect.gen(function*() {
      const loadBefore = loadavg()[0]!
      const result = yield* figures
      const worst = Math.min(
        ...Object.values(result.transports).flatMap((t) => [
          t.sleep20ms.ratio / TARGETS.sleep,
          t.arith5ms.ratio / TARGETS.arith
        ])
      )
      return {
        headline: {
          metric: "python sandbox scaling, 16 chains / 1, worst of (sleep / 8, arith / 1.7) over attach and bubblewrap",
          value: worst,
          target: 1,
          better: "higher"
        },
        ...result,
        loadAverage: { before: loadBefore, after: loadavg()[0]! }
      } as const
    })).pipe(
      Effect.provide(Layer.merge(ResourceManager.ResourceManager.layer, Docker.layerWith({ handleSignals: true })))
    )
  )
