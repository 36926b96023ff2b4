/**
 * `npm run bench -- sandbox`
 *
 * How long the Python sandbox's reset takes (what every release of a chain's sandbox costs before the next chain
 * can have it), on the three transports: Docker `exec`, Docker `attach` and bubblewrap. One warm instance per
 * transport, started by its launcher; each cycle runs one cell that leaves state behind (a variable, a file in the
 * work dir and in `/tmp`), then times `launcher.reset` alone, then the next chain's first cell (`print(1)`: what
 * the reset left ready, or did not). `dirty`: the reset after a cell that also leaves a detached (`setsid`)
 * background process and 8 MiB in `/dev/shm`. Cycles alternate between transports, so that
 * the shared machine's load drifts over all of them alike; figures are medians and 90th percentiles in ms.
 *
 * Headline: the attach transport's median reset time (Docker's default transport).
 */
import { Clock, Effect, Layer } from "effect"
import { loadavg } from "node:os"
import * as Docker from "../actors/resources/Docker.ts"
import * as PythonSandbox from "../environments/python/PythonSandbox.ts"
import type * as Resource from "../src/Resource.ts"

const CYCLES = 30

const quantile = (xs: ReadonlyArray<number>, q: number) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length * q)]!

const cell = [
  "x = 1",
  "open('/work/notes.txt', 'w').write('x' * 1000)",
  "open('/tmp/scratch.txt', 'w').write('y' * 1000)"
].join("\n")

/** Also a detached background process (it exits by itself after 3 s) and 8 MiB in /dev/shm. */
const dirtyCell = [
  cell,
  "import os",
  "open('/dev/shm/blob', 'wb').write(b'z' * (8 << 20))",
  "if os.fork() == 0:",
  "    os.setsid()",
  "    if os.fork() == 0:",
  "        import time",
  "        time.sleep(3)",
  "    os._exit(0)",
  "os.wait()"
].join("\n")

const run = (instance: PythonSandbox.Instance, code: string) =>
  instance.request({ op: "run", code, timeout: 10, max_output: 8192, fresh: false }, 15_000)

const spec = (kind: "docker" | "bubblewrap", name: string) =>
  PythonSandbox.spec({ kind, name, limits: { memoryBytes: 256 * 1024 * 1024, pids: 64 } })

interface Target {
  readonly transport: string
  readonly resource: Resource.Resource<PythonSandbox.Instance>
}

const figures = Effect.gen(function*() {
  const targets: Array<Target> = [
    {
      transport: "exec",
      resource: yield* PythonSandbox.docker(yield* spec("docker", "bench-reset-exec"), { transport: "exec" })
    },
    {
      transport: "attach",
      resource: yield* PythonSandbox.docker(yield* spec("docker", "bench-reset-attach"), { transport: "attach" })
    },
    { transport: "bubblewrap", resource: PythonSandbox.bubblewrap(yield* spec("bubblewrap", "bench-reset-bwrap")) }
  ]
  const instances = yield* Effect.forEach(targets, (t) => t.resource.launcher.start(t.resource.spec, `${t.transport}-0`))
  const times = targets.map(() => ({
    clean: [] as Array<number>,
    dirty: [] as Array<number>,
    first: [] as Array<number>
  }))
  const timed = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.gen(function*() {
      const start = yield* Clock.currentTimeNanos
      yield* effect
      return Number((yield* Clock.currentTimeNanos) - start) / 1e6
    })
  const timeReset = (i: number) => timed(targets[i]!.resource.launcher.reset(instances[i]!))
  // Two warm-up cycles each (first interpreters, the JIT).
  for (let w = 0; w < 2; w++) {
    for (let i = 0; i < targets.length; i++) yield* Effect.andThen(run(instances[i]!, cell), timeReset(i))
  }
  for (let c = 0; c < CYCLES; c++) {
    for (let i = 0; i < targets.length; i++) {
      yield* run(instances[i]!, cell)
      times[i]!.clean.push(yield* timeReset(i))
      times[i]!.first.push(yield* timed(run(instances[i]!, "print(1)")))
      yield* run(instances[i]!, dirtyCell)
      times[i]!.dirty.push(yield* timeReset(i))
    }
  }
  return Object.fromEntries(targets.map((t, i) => [t.transport, {
    resetMedianMs: quantile(times[i]!.clean, 0.5),
    resetP90Ms: quantile(times[i]!.clean, 0.9),
    firstCellAfterResetMedianMs: quantile(times[i]!.first, 0.5),
    dirtyResetMedianMs: quantile(times[i]!.dirty, 0.5),
    dirtyResetP90Ms: quantile(times[i]!.dirty, 0.9)
  }]))
})

export default () =>
  Effect.runPromise(
    Effect.scoped(Effect.gen(function*() {
      const loadBefore = loadavg()[0]!
      const result = yield* figures
      return {
        headline: {
          metric: "python sandbox reset, median ms (Docker attach)",
          value: result["attach"]!.resetMedianMs,
          target: 100,
          better: "lower"
        },
        ...result,
        settings: { cycles: CYCLES },
        loadAverage: { before: loadBefore, after: loadavg()[0]! }
      } as const
    })).pipe(Effect.provide(Layer.mergeAll(Docker.layerWith({ handleSignals: true }))))
  )
