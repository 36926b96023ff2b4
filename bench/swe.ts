/**
 * `npm run bench -- swe`
 *
 * The SWE task on the real Docker engine: Harbor's oracle (`solve.sh` through `shell`, then `submit`, then the
 * verifier) on 16 generated bug-fix tasks through the runtime (`Oracle.rollout`: a container per chain from the
 * resource manager, recreated after each episode), with 1 chain at a time and with 8 at once. Images are built
 * before the timed rounds (once per machine). Headline: episodes per second with 8 chains ÷ with 1 (this
 * benchmark's own target 2: an episode is mostly waiting on the engine — container start, three execs, removal —
 * so chains should overlap beyond the two cores' compute). Also the latency of the pieces, timed alone on one
 * container: start (create + start + first exec), an empty `shell` exec, the verifier (copy the tests, run
 * `test.sh`, read the reward), removal; p50 / p99 in ms.
 *
 * What bounds it: per episode, the CPU seconds of this process and of the engine's daemons (`dockerd`,
 * `containerd`, from `/proc/<pid>/stat`; the per-container shims and runc are not counted, so the engine's share is
 * a lower bound), and the machine's busy share of its cores (`/proc/stat`) during the 8-chain rounds: when the
 * cores are busy (this machine is shared), more chains cannot add throughput.
 */
import { NodeServices } from "@effect/platform-node"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { mkdtempSync, readdirSync, readFileSync } from "node:fs"
import { cpus, loadavg, tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import * as Oracle from "../actors/Oracle.ts"
import * as ResourceManager from "../actors/ResourceManager.ts"
import * as Docker from "../actors/resources/Docker.ts"
import * as BugFix from "../environments/swe/BugFix.ts"
import * as HarborOracle from "../environments/swe/HarborOracle.ts"
import * as HarborTask from "../environments/swe/HarborTask.ts"
import * as SweTask from "../environments/swe/SweTask.ts"
import * as Workspace from "../environments/swe/Workspace.ts"

const TASKS = 16
const ROUNDS = 3
const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const quantile = (xs: ReadonlyArray<number>, q: number) =>
  [...xs].sort((a, b) => a - b)[Math.floor(q * (xs.length - 1))]!

/** CPU seconds (user + system) of the engine's daemons, from `/proc` (0 where `/proc` cannot be read). */
const engineCpuSeconds = (): number => {
  let ticks = 0
  for (const pid of readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
      const comm = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"))
      if (comm !== "dockerd" && comm !== "containerd") continue
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
      ticks += Number(fields[11]) + Number(fields[12])
    } catch {
      // A process that ended between the listing and the read.
    }
  }
  return ticks / 100
}

/** The machine's busy and total CPU ticks (`/proc/stat`'s first line). */
const machineTicks = (): { readonly busy: number; readonly total: number } => {
  const [, ...values] = readFileSync("/proc/stat", "utf8").split("\n")[0]!.trim().split(/\s+/)
  const n = values.map(Number)
  const total = n.reduce((a, b) => a + b, 0)
  return { busy: total - n[3]! - (n[4] ?? 0), total }
}

const root = mkdtempSync(join(tmpdir(), "bench-swe-"))
const generated = BugFix.generate(11, TASKS)
const rows = generated.map((t) => ({ question: t.instruction, task: t.name }))

const figures = Effect.gen(function*() {
  const loadBefore = loadavg()[0]!
  yield* BugFix.write(root, generated)
  const tasks = yield* Effect.forEach(generated, (t) => HarborTask.load(`${root}/${t.name}`))
  const task = SweTask.make({ root, pool: 8 })
  const policy = HarborOracle.oracle(tasks)
  const round = (concurrency: number) =>
    Effect.gen(function*() {
      const start = performance.now()
      const [engine0, node0, machine0] = [engineCpuSeconds(), process.cpuUsage(), machineTicks()]
      const played = yield* Oracle.rollout({ task, rows, policy, concurrency })
      const node = process.cpuUsage(node0)
      const machine1 = machineTicks()
      const solved = played.filter((t) => t.reward === 1).length
      return {
        episodesPerSecond: TASKS / ((performance.now() - start) / 1000),
        solved,
        cpuSecondsPerEpisode: {
          engine: (engineCpuSeconds() - engine0) / TASKS,
          node: (node.user + node.system) / 1e6 / TASKS
        },
        machineBusy: (machine1.busy - machine0.busy) / Math.max(1, machine1.total - machine0.total)
      }
    })
  yield* round(8) // builds the images
  const one: Array<number> = [], eight: Array<number> = []
  let solved = { one: 0, eight: 0 }
  const cpu = { one: [] as Array<number>, eight: [] as Array<number>, busy: [] as Array<number> }
  const cpuNode = { one: [] as Array<number>, eight: [] as Array<number> }
  for (let r = 0; r < ROUNDS; r++) {
    const a = yield* round(1)
    const b = yield* round(8)
    one.push(a.episodesPerSecond)
    eight.push(b.episodesPerSecond)
    solved = { one: a.solved, eight: b.solved }
    cpu.one.push(a.cpuSecondsPerEpisode.engine)
    cpu.eight.push(b.cpuSecondsPerEpisode.engine)
    cpuNode.one.push(a.cpuSecondsPerEpisode.node)
    cpuNode.eight.push(b.cpuSecondsPerEpisode.node)
    cpu.busy.push(b.machineBusy)
  }

  // The pieces, on one task's containers, through the same workspace code.
  const settings = { ...Workspace.defaultSettings, root }
  const timings = {
    startMs: [] as Array<number>,
    execMs: [] as Array<number>,
    verifyMs: [] as Array<number>,
    removeMs: [] as Array<number>
  }
  const layer = Layer.mergeAll(ResourceManager.ResourceManager.layer, Docker.DockerEngine.layer)
  yield* Effect.scoped(Effect.gen(function*() {
    const provider = yield* Workspace.provider(settings)
    for (let i = 0; i < 8; i++) {
      const scope = yield* Scope.make()
      const t0 = performance.now()
      const context = yield* Scope.provide(
        provider.acquire({ chainId: `c${i}`, groupId: `g${i}`, rowIndex: i, row: rows[0]!, seed: 0 }),
        scope
      )
      const workspace = Context.get(context as Context.Context<Workspace.Workspace>, Workspace.Workspace)
      yield* workspace.overview
      const t1 = performance.now()
      for (let k = 0; k < 5; k++) {
        const e0 = performance.now()
        yield* workspace.shell("true")
        timings.execMs.push(performance.now() - e0)
      }
      const v0 = performance.now()
      yield* workspace.verify
      const v1 = performance.now()
      yield* Scope.close(scope, Exit.void)
      timings.startMs.push(t1 - t0)
      timings.verifyMs.push(v1 - v0)
      timings.removeMs.push(performance.now() - v1)
    }
  })).pipe(Effect.provide(layer))
  const summary = (xs: Array<number>) => ({ p50: quantile(xs, 0.5), p99: quantile(xs, 0.99), n: xs.length })
  return {
    headline: {
      metric: "swe episodes/s (Harbor oracle, Docker): 8 chains at once / 1 chain",
      value: median(eight) / median(one),
      target: 2,
      better: "higher" as const
    },
    oneChain: { episodesPerSecond: median(one), rounds: one, solved: solved.one },
    eightChains: { episodesPerSecond: median(eight), rounds: eight, solved: solved.eight },
    latencyMs: {
      start: summary(timings.startMs),
      emptyShell: summary(timings.execMs),
      verify: summary(timings.verifyMs),
      release: summary(timings.removeMs)
    },
    bound: {
      cores: cpus().length,
      cpuSecondsPerEpisode: {
        engineOneChain: median(cpu.one),
        engineEightChains: median(cpu.eight),
        nodeOneChain: median(cpuNode.one),
        nodeEightChains: median(cpuNode.eight)
      },
      machineBusyEightChains: median(cpu.busy)
    },
    settings: { tasks: TASKS, rounds: ROUNDS, image: "agentfly/python:1" },
    loadAverage: { before: loadBefore, after: loadavg()[0]! }
  }
}).pipe(Effect.provide(NodeServices.layer))

export default () => Effect.runPromise(figures)
