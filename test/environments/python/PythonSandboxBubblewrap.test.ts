/**
 * The Python sandbox under bubblewrap (no Docker engine): the host's python3 bound read-only, cgroup v1 limits.
 * Escapes and attacks on every transport are in `SandboxAttacks.test.ts`.
 * Real time throughout: time limits and process deaths are the subject.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Context, Effect } from "effect"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as PythonSandbox from "../../../environments/python/PythonSandbox.ts"

const spec = Effect.runSync(PythonSandbox.spec({
  kind: "bubblewrap",
  name: "python-bwrap-test",
  limits: { memoryBytes: 128 * 1024 * 1024, pids: 32 }
}))
const resource = PythonSandbox.bubblewrap(spec)

/** This process's cgroups (`agentfly/run-<pid>-<start>/<instance>`) of the resource `name`. */
const cgroupsOf = (name: string) =>
  ["memory", "pids", "cpu"].flatMap((controller) => {
    const root = `/sys/fs/cgroup/${controller}/agentfly`
    const runs = existsSync(root) ? readdirSync(root).filter((r) => r.startsWith(`run-${process.pid}-`)) : []
    return runs.flatMap((run) =>
      readdirSync(join(root, run)).filter((i) => i.startsWith(name)).map((i) => join(root, run, i))
    )
  })

const withSandbox = <A, E, R>(
  chainId: string,
  f: (sandbox: PythonSandbox.PythonSandbox["Service"]) => Effect.Effect<A, E, R>,
  options?: { readonly timeoutMillis?: number }
) =>
  Effect.scoped(Effect.gen(function*() {
    const provider = yield* PythonSandbox.provider(resource, options)
    const context = yield* provider.acquire({ chainId, groupId: "g" })
    return yield* f(Context.get(context, PythonSandbox.PythonSandbox))
  }))

layer(ResourceManager.ResourceManager.layer, { timeout: 300_000, excludeTestServices: true })(
  "PythonSandbox on bubblewrap",
  (it) => {
    it.effect("state persists within a chain and not across chains; runs as nobody in the work dir", () =>
      Effect.gen(function*() {
        const [a, b] = yield* withSandbox("a", (sandbox) =>
          Effect.gen(function*() {
            yield* sandbox.run("import os\nn = 20")
            const a = yield* sandbox.run("print(n + 1, os.getuid(), os.getcwd())")
            const b = yield* withSandbox("b", (other) => other.run("'n' in globals()"))
            return [a, b]
          }))
        assert.strictEqual(a.stdout, "21 65534 /work\n")
        assert.strictEqual(b.stdout, "False\n")
      }))

    it.effect("sys.exit() ends its cell, saying so; the interpreter and its variables stay", () =>
      Effect.gen(function*() {
        const [exited, after] = yield* withSandbox("exit", (sandbox) =>
          Effect.gen(function*() {
            const exited = yield* sandbox.run("kept = 5\nprint('before')\nimport sys\nsys.exit(3)")
            return [exited, yield* sandbox.run("kept")]
          }))
        assert.strictEqual(PythonSandbox.observation(exited), "before\nSystemExit: 3")
        assert.strictEqual(after.stdout, "5\n")
        assert.isFalse(after.restarted)
      }))

    it.effect("the spec's CPU share is a cap: a cell spinning past it is throttled", () =>
      Effect.gen(function*() {
        const slow = yield* PythonSandbox.spec({
          kind: "bubblewrap",
          name: "python-bwrap-cpu",
          limits: { memoryBytes: 128 * 1024 * 1024, pids: 32, cpus: 0.2 }
        })
        const [cgroup] = yield* Effect.scoped(Effect.gen(function*() {
          const provider = yield* PythonSandbox.provider(PythonSandbox.bubblewrap(slow))
          const context = yield* provider.acquire({ chainId: "cpu", groupId: "g" })
          // 0.3 s of CPU at 20 ms per 100 ms period: throttled in most of the periods it runs in.
          yield* Context.get(context, PythonSandbox.PythonSandbox).run(
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
          )
          return cgroupsOf(slow.name).filter((dir) => dir.includes("/cpu/"))
        }))
        assert.isDefined(cgroup, "the sandbox has a cpu cgroup")
        assert.strictEqual(readFileSync(join(cgroup!, "cpu.cfs_quota_us"), "utf8").trim(), "20000")
        const throttled = Number(/nr_throttled (\d+)/.exec(readFileSync(join(cgroup!, "cpu.stat"), "utf8"))?.[1])
        assert.isAbove(throttled, 0)
      }))

    it.effect("the sandbox's cgroups are removed when its instance is destroyed", () =>
      Effect.gen(function*() {
        const manager = yield* ResourceManager.ResourceManager
        yield* withSandbox("d", (sandbox) => sandbox.run("pass"))
        assert.isNotEmpty(cgroupsOf(spec.name), "the sandbox had cgroups")
        yield* manager.close(spec.name)
        yield* Effect.sleep("300 millis")
        const stats = yield* manager.stats(spec.name)
        assert.strictEqual(stats!.idle + stats!.leased + stats!.starting, 0)
        assert.deepStrictEqual(cgroupsOf(spec.name), [])
      }))
  }
)

describe("PythonSandbox on bubblewrap, after the run", () => {
  it.live("a run that closes its pools leaves no cgroup of its own behind, not even an empty one", () =>
    Effect.gen(function*() {
      const runDirs = () =>
        ["memory", "pids", "cpu"].flatMap((controller) => {
          const root = `/sys/fs/cgroup/${controller}/agentfly`
          return existsSync(root) ? readdirSync(root).filter((r) => r.startsWith(`run-${process.pid}-`)) : []
        })
      const out = yield* withSandbox("closing", (sandbox) => sandbox.run("print(6 * 7)")).pipe(
        Effect.provide(ResourceManager.ResourceManager.layer)
      )
      assert.strictEqual(out.stdout, "42\n")
      assert.deepStrictEqual(runDirs(), [], "the run's cgroup directories are gone with its last sandbox")
    }), 300_000)
})
