/**
 * The Python sandbox under bubblewrap (no Docker engine): the host's python3 bound read-only, cgroup v1 limits.
 * Real time throughout: time limits and process deaths are the subject.
 */
import { assert, layer } from "@effect/vitest"
import { Context, Effect } from "effect"
import { existsSync } from "node:fs"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as PythonSandbox from "../../../environments/python/PythonSandbox.ts"

const spec = Effect.runSync(PythonSandbox.spec({
  kind: "bubblewrap",
  name: "python-bwrap-test",
  limits: { memoryBytes: 128 * 1024 * 1024, pids: 32 }
}))
const resource = PythonSandbox.bubblewrap(spec)

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

layer(ResourceManager.ResourceManager.layer, { timeout: 60_000, excludeTestServices: true })(
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

    it.effect("escapes contained: network, read-only root, infinite loop, memory bomb, fork bomb", () =>
      withSandbox("c", (sandbox) =>
        Effect.gen(function*() {
          const net = yield* sandbox.run([
            "import socket",
            "for addr in [('127.0.0.1', 6390), ('10.0.0.1', 80)]:",
            "    s = socket.socket()",
            "    s.settimeout(1)",
            "    try:",
            "        s.connect(addr)",
            "        print('CONNECTED')",
            "    except OSError as e:",
            "        print(type(e).__name__)"
          ].join("\n"))
          assert.strictEqual(net.stdout, "ConnectionRefusedError\nOSError\n")

          const fs = yield* sandbox.run([
            "for path in ['/evil', '/usr/evil', '/work/ok', '/tmp/ok']:",
            "    try:",
            "        open(path, 'w').write('x')",
            "        print(path, 'written')",
            "    except OSError as e:",
            "        print(path, e.strerror)"
          ].join("\n"))
          assert.strictEqual(
            fs.stdout,
            "/evil Read-only file system\n/usr/evil Read-only file system\n/work/ok written\n/tmp/ok written\n"
          )

          const loop = yield* Effect.flip(sandbox.run("while True:\n    pass", { timeoutMillis: 1_000 }))
          assert.strictEqual(loop._tag === "PythonError" ? loop.reason : loop._tag, "Timeout")

          const memory = yield* Effect.flip(sandbox.run("x = bytearray(1024 * 1024 * 1024)"))
          assert.strictEqual(memory._tag === "PythonError" ? memory.reason : memory._tag, "Killed")

          const forks = yield* sandbox.run([
            "import os, time",
            "n = 0",
            "for _ in range(200):",
            "    try:",
            "        if os.fork() == 0:",
            "            time.sleep(30)",
            "            os._exit(0)",
            "        n += 1",
            "    except OSError:",
            "        break",
            "print(n)"
          ].join("\n"))
          assert.isBelow(Number(forks.stdout.trim()), 32)

          const after = yield* sandbox.run("print('alive')")
          assert.strictEqual(after.stdout, "alive\n")
        })))

    it.effect("the sandbox's cgroups are removed when its instance is destroyed", () =>
      Effect.gen(function*() {
        const manager = yield* ResourceManager.ResourceManager
        yield* withSandbox("d", (sandbox) => sandbox.run("pass"))
        yield* manager.close(spec.name)
        yield* Effect.sleep("300 millis")
        const stats = yield* manager.stats(spec.name)
        assert.strictEqual(stats!.idle + stats!.leased + stats!.starting, 0)
        for (let i = 0; i < stats!.starts; i++) {
          assert.isFalse(existsSync(`/sys/fs/cgroup/memory/agentfly/${spec.name}-${i}`))
          assert.isFalse(existsSync(`/sys/fs/cgroup/pids/agentfly/${spec.name}-${i}`))
        }
      }))
  }
)
