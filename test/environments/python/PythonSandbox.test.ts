/**
 * The Python sandbox on a real Docker engine (image `agentfly/python:1`, built by `scripts/build-images`):
 * persistence within a chain, isolation between chains, the user, reset, crash replacement, the tool, labels.
 * Escapes and attacks on every transport are in `SandboxAttacks.test.ts`.
 * Real time throughout (`excludeTestServices`): the engine, the time limits and the readiness polls are the subject.
 */
import { assert, layer } from "@effect/vitest"
import { Context, Effect, Layer, Scope } from "effect"
import { execFile, execFileSync } from "node:child_process"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as Docker from "../../../actors/resources/Docker.ts"
import * as ToolActor from "../../../actors/ToolActor.ts"
import * as PythonSandbox from "../../../environments/python/PythonSandbox.ts"
import { python } from "../../../environments/python/PythonTool.ts"
import * as Resource from "../../../src/Resource.ts"

const Env = Layer.merge(ResourceManager.ResourceManager.layer, Docker.layerWith({ handleSignals: false }))

/** The docker CLI, without blocking the event loop (a synchronous call would freeze every fiber). */
const dockerCli = (args: ReadonlyArray<string>) =>
  Effect.callback<string, Error>((resume) => {
    const child = execFile("docker", args, { timeout: 300_000 }, (error, stdout) =>
      resume(error ? Effect.fail(error) : Effect.succeed(stdout)))
    return Effect.sync(() => child.kill())
  })

const labelled = (runId: string): number =>
  execFileSync("docker", ["ps", "-aq", "--filter", `label=${Docker.Labels.run}=${runId}`], { encoding: "utf8" })
    .split("\n").filter((l) => l !== "").length

for (const transport of ["exec", "attach"] as const) {
  const spec = Effect.runSync(PythonSandbox.spec({
    kind: "docker",
    name: `python-test-${transport}`,
    limits: { memoryBytes: 128 * 1024 * 1024, pids: 32 },
    pool: { max: 3 }
  }))

  /** A chain's sandbox for the length of `f`. */
  const withSandbox = <A, E, R>(
    chainId: string,
    f: (sandbox: PythonSandbox.PythonSandbox["Service"]) => Effect.Effect<A, E, R>,
    options?: { readonly timeoutMillis?: number }
  ) =>
    Effect.scoped(Effect.gen(function*() {
      const resource = yield* PythonSandbox.docker(spec, { transport })
      const provider = yield* PythonSandbox.provider(resource, options)
      const context = yield* provider.acquire({ chainId, groupId: "g" })
      return yield* f(Context.get(context, PythonSandbox.PythonSandbox))
    }))

  layer(Env, { timeout: 300_000, excludeTestServices: true })(`PythonSandbox on Docker (${transport})`, (it) => {
    it.effect("state persists across calls within a chain; another chain does not see it", () =>
      Effect.gen(function*() {
        const [first, second, other] = yield* withSandbox("a", (a) =>
          Effect.gen(function*() {
            const first = yield* a.run("x = 41\ndef f(n):\n    return n * 2\nx + 1")
            const second = yield* a.run("print(f(x))")
            const other = yield* withSandbox("b", (b) => b.run("'x' in globals()"))
            return [first, second, other]
          }))
        assert.strictEqual(first.stdout, "42\n")
        assert.strictEqual(second.stdout, "82\n")
        assert.strictEqual(other.stdout, "False\n", "chain b is isolated from chain a")
      }))

    it.effect("exceptions are results with a traceback of the cell only; output is truncated with a marker", () =>
      withSandbox("c", (sandbox) =>
        Effect.gen(function*() {
          const failed = yield* sandbox.run("1/0")
          assert.strictEqual(failed.error, "ZeroDivisionError: division by zero")
          assert.include(failed.stderr, "ZeroDivisionError")
          const long = yield* sandbox.run("print('a' * 20000)")
          assert.isTrue(long.truncated)
          assert.match(long.stdout, /\n\[\.\.\. truncated: \d+ more characters\]$/)
          assert.isBelow(long.stdout.length, 8300)
        }), { timeoutMillis: 5_000 }))

    it.effect("runs as nobody with no capabilities, no new privileges", () =>
      withSandbox("d", (sandbox) =>
        Effect.gen(function*() {
          const r = yield* sandbox.run(
            "import os\nstatus = open('/proc/self/status').read()\n" +
              "print(os.getuid(), [l.split()[1] for l in status.splitlines()" +
              " if l.startswith(('CapEff', 'NoNewPrivs'))])"
          )
          assert.strictEqual(r.stdout, "65534 ['0000000000000000', '1']\n")
        })))

    it.effect("a released sandbox is reset before the next chain gets it (no variables, no files)", () =>
      Effect.gen(function*() {
        const manager = yield* ResourceManager.ResourceManager
        const single = Resource.makeUnsafe({
          ...spec,
          name: `python-single-${transport}`,
          pool: { ...spec.pool, max: 1 }
        })
        const resource = yield* PythonSandbox.docker(single, { transport })
        const run = (chainId: string, code: string) =>
          Effect.scoped(Effect.gen(function*() {
            const lease = yield* manager.acquire(resource, { chainId, groupId: "g" })
            const result = yield* PythonSandbox.fromLease(lease).run(code)
            return [yield* lease.instanceId, result.stdout] as const
          }))
        const [first] = yield* run("a", "secret = 7\nopen('/work/notes.txt', 'w').write('x')")
        const [second, out] = yield* run(
          "b",
          "import os\nprint('secret' in globals(), os.path.exists('/work/notes.txt'))"
        )
        assert.strictEqual(second, first, "the same container was reused")
        assert.strictEqual(out, "False False\n")
      }))

    it.effect("a container killed mid-lease (docker kill) is replaced and the chain's step retried", () =>
      Effect.gen(function*() {
        const manager = yield* ResourceManager.ResourceManager
        const engine = yield* Docker.DockerEngine
        const killSpec = Resource.makeUnsafe({ ...spec, name: `python-kill-${transport}` })
        const resource = yield* PythonSandbox.docker(killSpec, { transport })
        const kill = (instanceId: string) =>
          dockerCli(["kill", `agentfly-${instanceId}-${engine.runId}`.replace(/[^a-zA-Z0-9_.-]/g, "-")])
        yield* Effect.scoped(Effect.gen(function*() {
          const lease = yield* manager.acquire(resource, { chainId: "k", groupId: "g" })
          const sandbox = PythonSandbox.fromLease(lease)
          yield* sandbox.run("x = 1")
          const before = yield* lease.instanceId
          yield* kill(before)
          const step = sandbox.run("print('step ran')")
          const crashed = yield* Effect.flip(step)
          assert.isTrue(Resource.isCrash(crashed), "the holder gets a typed EnvError(Crashed)")
          yield* kill(yield* lease.instanceId)
          const retried = yield* ResourceManager.withRetryOnCrash(step)
          assert.strictEqual(retried.stdout, "step ran\n")
          assert.notStrictEqual(yield* lease.instanceId, before)
        }))
        const stats = yield* manager.stats(`python-kill-${transport}`)
        assert.isAtLeast(stats!.failures, 2)
        assert.strictEqual(stats!.unhealthy, 0)
      }))

    it.effect("the python tool through the tool actor: state persists, a timeout is an observation", () =>
      Effect.scoped(Effect.gen(function*() {
        const resource = yield* PythonSandbox.docker(spec, { transport })
        const provider = yield* PythonSandbox.provider(resource, { timeoutMillis: 1_000 })
        const context = yield* provider.acquire({ chainId: "tool", groupId: "g" })
        const actor = yield* ToolActor.make([python])
        const call = (id: string, code: string) =>
          actor.execute({ id, type: "function", function: { name: "python", arguments: { code } } }, { context })
        yield* call("1", "total = sum(range(10))")
        const ok = yield* call("2", "total")
        assert.strictEqual(ok.message.content, "45")
        const slow = yield* call("3", "while True: pass")
        assert.isDefined(slow.error)
        assert.include(String(slow.message.content), "ran longer than 1000 ms")
        // The tool error's cause is the sandbox's own error, with the limit it ran past.
        const stopped = slow.error?.reason.cause as PythonSandbox.PythonError
        assert.strictEqual(stopped.reason._tag === "Timeout" && stopped.reason.timeoutMs, 1_000)
        // A reward can re-run the agent's code in the same sandbox, fresh or against the chain's state.
        const sandbox = Context.get(context, PythonSandbox.PythonSandbox)
        yield* call("4", "def square(n):\n    return n * n")
        const check = yield* sandbox.run("assert square(12) == 144\nprint('pass')")
        assert.strictEqual(check.stdout, "pass\n")
        const fresh = yield* sandbox.run("print('square' in globals())", { fresh: true })
        assert.strictEqual(fresh.stdout, "False\n")
      })))

    it.effect("the run's containers carry its label and are removed when the engine's scope closes", () =>
      Effect.gen(function*() {
        const scope = yield* Scope.make()
        const engine = yield* Docker.make({ handleSignals: false }).pipe(Scope.provide(scope))
        const manager = yield* ResourceManager.make().pipe(Scope.provide(scope))
        const scopeSpec = Resource.makeUnsafe({ ...spec, name: `python-scope-${transport}` })
        const resource = yield* PythonSandbox.docker(scopeSpec, { transport }).pipe(
          Effect.provideService(Docker.DockerEngine, engine)
        )
        yield* manager.acquire(resource, { chainId: "s", groupId: "g" }).pipe(Scope.provide(scope))
        assert.strictEqual(labelled(engine.runId), 1)
        yield* Scope.close(scope, { _tag: "Success", value: undefined } as never)
        assert.strictEqual(labelled(engine.runId), 0)
      }))
  })
}

layer(Env, { timeout: 300_000, excludeTestServices: true })("PythonSandbox on Docker (default transport)", (it) => {
  it.effect("calls go over the container's attached stdio: no exec is ever made in it", () =>
    Effect.scoped(Effect.gen(function*() {
      const spec = yield* PythonSandbox.spec({
        kind: "docker",
        name: "python-test-default",
        limits: { memoryBytes: 128 * 1024 * 1024, pids: 32 }
      })
      const provider = yield* PythonSandbox.provider(yield* PythonSandbox.docker(spec))
      const context = yield* provider.acquire({ chainId: "d", groupId: "g" })
      const result = yield* Context.get(context, PythonSandbox.PythonSandbox).run("print(6 * 7)")
      assert.strictEqual(result.stdout, "42\n")
      const { runId } = yield* Docker.DockerEngine
      const id = (yield* dockerCli([
        "ps",
        "-q",
        "--filter",
        `label=${Docker.Labels.run}=${runId}`,
        "--filter",
        `label=${Docker.Labels.resource}=${spec.name}`
      ])).trim()
      const [config, execs] = (yield* dockerCli(["inspect", "-f", "{{.Config.OpenStdin}} {{len .ExecIDs}}", id]))
        .trim().split(" ")
      assert.strictEqual(config, "true", "the supervisor's stdin is attached")
      assert.strictEqual(execs, "0", "no docker exec ran in the container")
    })))
})
