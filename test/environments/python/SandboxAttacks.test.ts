/**
 * The Python sandbox attacked from inside, one suite over its three transports: Docker `exec`, Docker `attach` and
 * bubblewrap. Each test has a pool of one sandbox of its own, so that its chains meet the same instance after a
 * reset: what one chain leaves behind (processes, files, IPC objects, a hijacked channel) is what the next chain
 * would meet, and an attack that wins poisons no other test. The programs are in `fixtures/attacks.ts`.
 *
 * Real time throughout (`excludeTestServices`): processes, containers and time limits are the subject.
 */
import { assert, layer } from "@effect/vitest"
import DockerodeClient from "dockerode"
import { Effect, Layer } from "effect"
import { execFile, spawn } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as Bubblewrap from "../../../actors/resources/Bubblewrap.ts"
import * as Docker from "../../../actors/resources/Docker.ts"
import * as PythonSandbox from "../../../environments/python/PythonSandbox.ts"
import * as Resource from "../../../src/Resource.ts"
import * as Attacks from "./fixtures/attacks.ts"

// A secret in the trainer's environment: nothing in a sandbox may read it.
const secret = `agentfly-secret-${process.pid}-${Math.random().toString(36).slice(2)}`
process.env["AGENTFLY_ATTACK_SECRET"] = secret

const Env = Layer.merge(ResourceManager.ResourceManager.layer, Docker.layerWith({ handleSignals: false }))
const holderScript = fileURLToPath(new URL("./fixtures/sandboxHolder.ts", import.meta.url))

type Transport = "exec" | "attach" | "bubblewrap"

const resourceFor = (transport: Transport, spec: Resource.ResourceSpec) =>
  transport === "bubblewrap"
    ? Effect.succeed(PythonSandbox.bubblewrap(spec))
    : PythonSandbox.docker(spec, { transport })

const specFor = (transport: Transport, name: string, limits: Partial<Resource.Limits> = {}) =>
  Resource.makeUnsafe({
    ...Effect.runSync(PythonSandbox.spec({
      kind: transport === "bubblewrap" ? "bubblewrap" : "docker",
      name,
      limits: { memoryBytes: 256 * 1024 * 1024, pids: 48, ...limits }
    })),
    pool: { min: 0, max: 1, prewarm: 0 }
  })

/** Every process on the host whose root has `/work/<probe>`, with the uids of its `Uid:` line and its NSpid. */
const hostViewOf = (probe: string) => {
  const found: Array<{ pid: number; nsPid: number; uids: Array<number>; fileUid: number; fileGid: number }> = []
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue
    try {
      const file = statSync(`/proc/${name}/root/work/${probe}`)
      const status = readFileSync(`/proc/${name}/status`, "utf8")
      const uids = /^Uid:\s+(.*)$/m.exec(status)![1]!.split(/\s+/).map(Number)
      const nsPid = Number(/^NSpid:\s+(.*)$/m.exec(status)![1]!.split(/\s+/).at(-1))
      found.push({ pid: Number(name), nsPid, uids, fileUid: file.uid, fileGid: file.gid })
    } catch {
      // not a sandbox process, or gone
    }
  }
  return found
}

/** The agentfly cgroups (two levels under `agentfly/` of each v1 controller) whose path contains `needle`. */
const cgroupsWith = (needle: string) => {
  const found: Array<string> = []
  for (const controller of ["memory", "pids"]) {
    const root = `/sys/fs/cgroup/${controller}/agentfly`
    if (!existsSync(root)) continue
    for (const a of readdirSync(root, { withFileTypes: true })) {
      if (!a.isDirectory()) continue
      if (a.name.includes(needle)) found.push(join(root, a.name))
      for (const b of readdirSync(join(root, a.name), { withFileTypes: true })) {
        if (b.isDirectory() && join(a.name, b.name).includes(needle)) found.push(join(root, a.name, b.name))
      }
    }
  }
  return found
}

const labelled = (runId: string) =>
  Effect.callback<number, Error>((resume) => {
    execFile("docker", ["ps", "-aq", "--filter", `label=${Docker.Labels.run}=${runId}`], (error, stdout) =>
      resume(error ? Effect.fail(error) : Effect.succeed(stdout.split("\n").filter((l) => l !== "").length)))
  })

/** Starts a holder run (in its own TMPDIR) and waits until its sandbox answers. */
const startHolder = (transport: Transport, name: string, tmp: string) =>
  Effect.gen(function*() {
    const child = spawn(process.execPath, ["--import", "tsx", holderScript, transport, name], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, TMPDIR: tmp }
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => child.kill("SIGKILL")))
    const line = yield* Effect.callback<string, Error>((resume) => {
      let out = ""
      let err = ""
      child.stdout.on("data", (d: Buffer) => {
        out += d.toString()
        if (out.includes("\n")) resume(Effect.succeed(out.split("\n")[0]!))
      })
      child.stderr.on("data", (d: Buffer) => (err += d.toString()))
      child.on("exit", (code) => resume(Effect.fail(new Error(`holder exited ${code}: ${err}`))))
    }).pipe(Effect.timeout("90 seconds"))
    const exited = Effect.callback<void>((resume) => {
      if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
      child.on("exit", () => resume(Effect.void))
    })
    return { child, exited, ...(JSON.parse(line) as { runId: string; pid: number }) }
  })

for (const transport of ["exec", "attach", "bubblewrap"] as const) {
  /**
   * A pool of one sandbox of its own, closed with the test (a test that an attack wins does not poison the next);
   * the function returned leases its only instance for one chain.
   */
  const pool = (slug: string, limits: Partial<Resource.Limits> = {}) =>
    Effect.gen(function*() {
      const manager = yield* ResourceManager.ResourceManager
      const spec = specFor(transport, `attack-${transport}-${slug}`, limits)
      yield* Effect.addFinalizer(() => manager.close(spec.name))
      return <X, EX, RX>(
        chainId: string,
        body: (sandbox: PythonSandbox.PythonSandbox["Service"]) => Effect.Effect<X, EX, RX>
      ) =>
        Effect.scoped(Effect.gen(function*() {
          const lease = yield* manager.acquire(yield* resourceFor(transport, spec), { chainId, groupId: "g" })
          const result = yield* body(PythonSandbox.fromLease(lease, { timeoutMillis: 10_000, maxOutputChars: 1 << 16 }))
          return { result, instance: yield* lease.instanceId }
        }))
    })

  const stdout = (sandbox: PythonSandbox.PythonSandbox["Service"], code: string) =>
    Effect.map(sandbox.run(code), (r) => r.stdout)
  const json = (sandbox: PythonSandbox.PythonSandbox["Service"], code: string) =>
    Effect.map(sandbox.run(code), (r) => JSON.parse(r.stdout) as Record<string, any>)

  layer(Env, { timeout: 300_000, excludeTestServices: true })(`attacks on the Python sandbox (${transport})`, (it) => {
    it.effect("a setsid daemon survives neither its cell nor the reset; the supervisor answers the next chain", () =>
      Effect.gen(function*() {
        const chain = yield* pool("daemon")
        const a = yield* chain("daemon-a", (sandbox) =>
          Effect.gen(function*() {
            assert.strictEqual(yield* stdout(sandbox, Attacks.daemon), "daemon started\n")
            // Time for the daemon to try everything once.
            yield* stdout(sandbox, "import time\ntime.sleep(1)")
            return yield* stdout(sandbox, Attacks.strays)
          }))
        assert.strictEqual(a.result, "[]\n", "the daemon is killed with the cell that started it")
        const b = yield* chain("daemon-b", (sandbox) =>
          Effect.gen(function*() {
            const answer = yield* stdout(sandbox, "print(6 * 7)")
            const fresh = yield* Effect.map(sandbox.run("print(6 * 7)", { fresh: true }), (r) => r.stdout)
            return { answer, fresh, strays: yield* stdout(sandbox, Attacks.strays) }
          }))
        assert.strictEqual(b.instance, a.instance, "the same sandbox, reset")
        assert.deepStrictEqual(b.result, { answer: "42\n", fresh: "42\n", strays: "[]\n" })
      }))

    it.effect("a thread left running in the interpreter can neither forge, inject nor take over the channel", () =>
      Effect.gen(function*() {
        const chain = yield* pool("thread")
        const { result } = yield* chain("thread", (sandbox) =>
          Effect.gen(function*() {
            yield* stdout(sandbox, "kept = 7")
            assert.strictEqual(yield* stdout(sandbox, Attacks.spoofingThread), "thread started\n")
            const answers: Array<string> = []
            for (let i = 0; i < 3; i++) {
              answers.push(yield* stdout(sandbox, "import time\ntime.sleep(0.2)\nprint(6 * 7)"))
            }
            const fresh = yield* Effect.map(sandbox.run("print(6 * 7)", { fresh: true }), (r) => r.stdout)
            const state = yield* stdout(
              sandbox,
              "import os, threading\nprint(kept, threading.active_count() > 1)\n" +
                "print(open('/work/attack.log').read() if os.path.exists('/work/attack.log') else '', end='')"
            )
            return { answers, fresh, state }
          }))
        assert.deepStrictEqual(result, { answers: ["42\n", "42\n", "42\n"], fresh: "42\n", state: "7 True\n" })
      }))

    it.effect("the next chain finds the work dir, /tmp, /dev/shm, SysV IPC and message queues empty", () =>
      Effect.gen(function*() {
        const chain = yield* pool("files")
        const a = yield* chain("files-a", (sandbox) => stdout(sandbox, Attacks.leaveState))
        assert.strictEqual(a.result, "[True, True, True, True]\n")
        const b = yield* chain("files-b", (sandbox) => json(sandbox, Attacks.leftState))
        assert.strictEqual(b.instance, a.instance, "the same sandbox, reset")
        assert.deepStrictEqual(b.result, {
          "/dev/mqueue": [],
          "/dev/shm": [],
          "/tmp": [],
          "/work": [],
          "sysv msg": [],
          "sysv sem": [],
          "sysv shm": []
        })
      }))

    it.effect("limits, priority and CPU affinity a chain sets on the sandbox's processes do not reach the next", () =>
      Effect.gen(function*() {
        const chain = yield* pool("attributes")
        const fresh = yield* chain("attributes-0", (sandbox) => json(sandbox, Attacks.attributes))
        // Soft limits and affinity of the supervisor can be put back; the helpers are replaced: the same sandbox.
        const a1 = yield* chain("attributes-a1", (sandbox) => stdout(sandbox, Attacks.tamper(false)))
        assert.include(a1.result, "'supervisor'", a1.result)
        const b1 = yield* chain("attributes-b1", (sandbox) => json(sandbox, Attacks.attributes))
        assert.strictEqual(b1.instance, a1.instance, "the same sandbox, reset")
        assert.deepStrictEqual(b1.result, fresh.result)
        // A hard limit or a priority cannot be put back: the sandbox is replaced.
        const a2 = yield* chain("attributes-a2", (sandbox) => stdout(sandbox, Attacks.tamper(true)))
        assert.include(a2.result, "'supervisor'", a2.result)
        const b2 = yield* chain("attributes-b2", (sandbox) => json(sandbox, Attacks.attributes))
        assert.notStrictEqual(b2.instance, a2.instance, "a new sandbox")
        assert.deepStrictEqual(b2.result, fresh.result)
      }))

    it.effect("user code can neither trace the supervisor nor read its memory, environment or descriptors", () =>
      Effect.gen(function*() {
        const chain = yield* pool("trace")
        const { result } = yield* chain("trace", (sandbox) => json(sandbox, Attacks.traceSupervisor))
        assert.deepStrictEqual(result, {
          "PTRACE_ATTACH": "EPERM",
          "PTRACE_SEIZE": "EPERM",
          "environ": "EACCES",
          "fd/": "EACCES",
          "fd/0": "EACCES",
          "fd/1": "EACCES",
          "fd/2": "EACCES",
          "mem": "EACCES",
          "process_vm_readv": "EPERM"
        })
      }))

    it.effect("nothing of the trainer's environment is readable in the sandbox", () =>
      Effect.gen(function*() {
        const chain = yield* pool("environ")
        const { result } = yield* chain("environ", (sandbox) => stdout(sandbox, Attacks.environments))
        assert.include(result, "PYTHONDONTWRITEBYTECODE", "the sandbox's own environment is read")
        assert.notInclude(result, secret)
        assert.notInclude(result, "AGENTFLY_ATTACK_SECRET")
      }))

    it.effect("user code and the files it writes belong to an unprivileged host uid, never root", () =>
      Effect.gen(function*() {
        const chain = yield* pool("owner")
        const probe = `owner-probe-${Math.random().toString(36).slice(2)}`
        const { result } = yield* chain("owner", (sandbox) =>
          Effect.gen(function*() {
            const pid = yield* stdout(sandbox, `import os\nopen('/work/${probe}', 'w').write('x')\nprint(os.getpid())`)
            // Seen from the host, while the sandbox still runs.
            return { pid: Number(pid), host: hostViewOf(probe) }
          }))
        const worker = result.host.filter((p) => p.nsPid === result.pid)
        assert.strictEqual(worker.length, 1, JSON.stringify(result.host))
        assert.notInclude(worker[0]!.uids, 0, "the interpreter's host uids")
        assert.notStrictEqual(worker[0]!.fileUid, 0, "the file's host owner")
        assert.notStrictEqual(worker[0]!.fileGid, 0, "the file's host group")
      }))

    it.effect("no new user or mount namespaces, no mounts", () =>
      Effect.gen(function*() {
        const chain = yield* pool("userns")
        const { result } = yield* chain("userns", (sandbox) => json(sandbox, Attacks.namespaces))
        for (const [attempt, outcome] of Object.entries(result)) assert.notStrictEqual(outcome, "ok", attempt)
      }))

    it.effect("a seccomp filter denies what Docker's default profile denies", () =>
      Effect.gen(function*() {
        const chain = yield* pool("seccomp")
        const { result } = yield* chain("seccomp", (sandbox) => json(sandbox, Attacks.seccomp))
        assert.strictEqual(result["mode"], "2", "a seccomp filter is installed")
        for (const [call, outcome] of Object.entries(result)) {
          if (call !== "mode") assert.strictEqual(outcome, "EPERM", call)
        }
      }))

    it.effect("every writable mount has a size cap (ENOSPC, not the OOM killer); nothing else is writable", () =>
      Effect.gen(function*() {
        const chain = yield* pool("sizes")
        const { result } = yield* chain("sizes", (sandbox) =>
          Effect.all({ fill: json(sandbox, Attacks.fillMounts), outside: json(sandbox, Attacks.writeOutside) }))
        for (const [dir, [mib, why]] of Object.entries(result.fill as Record<string, [number, string]>)) {
          assert.strictEqual(why, "ENOSPC", dir)
          assert.isAtMost(mib, 64, dir)
        }
        const outside = result.outside as Record<string, string>
        for (const path of ["/evil", "/etc/evil", "/usr/evil", "/dev/evil", "/var/evil"]) {
          assert.notStrictEqual(outside[path], "written", path)
        }
        for (const path of ["/work/ok", "/tmp/ok", "/dev/shm/ok"]) assert.strictEqual(outside[path], "written", path)
      }))

    it.effect("no network: only loopback, the host's Redis and outside addresses unreachable", () =>
      Effect.gen(function*() {
        const chain = yield* pool("net")
        const { result } = yield* chain("net", (sandbox) => stdout(sandbox, Attacks.network))
        assert.strictEqual(result, "['lo']\nConnectionRefusedError\nOSError\n")
      }))

    it.effect("fork bomb: the pids cap stops it, the time limit cleans it up, the next call works", () =>
      Effect.gen(function*() {
        const chain = yield* pool("forks")
        const { result } = yield* chain("forks", (sandbox) =>
          Effect.gen(function*() {
            const counted = Number((yield* stdout(sandbox, Attacks.countForks)).trim())
            const bomb = yield* Effect.flip(sandbox.run(
              "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
              { timeoutMillis: 2_000 }
            ))
            return {
              counted,
              bomb: bomb._tag === "PythonError" ? bomb.reason._tag : bomb._tag,
              after: yield* stdout(sandbox, "print('alive')")
            }
          }))
        assert.isBelow(result.counted, 48)
        assert.strictEqual(result.bomb, "Timeout")
        assert.strictEqual(result.after, "alive\n")
      }))

    it.effect("memory bomb: OOM-killed (typed), loop: stopped at the time limit; the next call runs fresh", () =>
      Effect.gen(function*() {
        const chain = yield* pool("memory")
        const { result } = yield* chain("memory", (sandbox) =>
          Effect.gen(function*() {
            const memory = yield* Effect.flip(
              sandbox.run("x = bytearray(1024 * 1024 * 1024)", { timeoutMillis: 20_000 })
            )
            const loop = yield* Effect.flip(sandbox.run("while True:\n    pass", { timeoutMillis: 1_000 }))
            const after = yield* sandbox.run("print(1 + 1)")
            return {
              memory: memory._tag === "PythonError" ? memory.reason._tag : memory._tag,
              loop: loop._tag === "PythonError" ? loop.reason._tag : loop._tag,
              after: [after.stdout, after.restarted]
            }
          }))
        assert.deepStrictEqual(result, { memory: "Killed", loop: "Timeout", after: ["2\n", true] })
      }))

    it.effect("output floods: a child's flood reaches no reply or log, the cell's own output is truncated", () =>
      Effect.gen(function*() {
        const chain = yield* pool("flood")
        const { result } = yield* chain("flood", (sandbox) =>
          Effect.all([
            sandbox.run("import os\nos.system('yes | head -c 50000000')\nprint('after')"),
            sandbox.run("print('a' * 200000)")
          ]))
        assert.strictEqual(result[0].stdout, "after\n")
        assert.isTrue(result[1].truncated)
        assert.isAtMost(result[1].stdout.length, (1 << 16) + 100)
      }))

    it.effect("a sandbox that cannot prove it is clean (a writable root) is not reused", () =>
      Effect.gen(function*() {
        const manager = yield* ResourceManager.ResourceManager
        const chain = yield* pool("rw", { readOnlyRoot: false })
        if (transport === "bubblewrap") {
          // bubblewrap's root is an unsized tmpfs: a writable one is refused outright.
          const refused = yield* Effect.flip(chain("rw-a", (sandbox) => sandbox.run("pass")))
          assert.strictEqual(refused._tag, "LeaseError")
          assert.include(refused.message, "readOnlyRoot")
          return
        }
        const a = yield* chain("rw-a", (sandbox) => stdout(sandbox, "open('/var/tmp/left', 'w').write('a')"))
        const b = yield* chain(
          "rw-b",
          (sandbox) => stdout(sandbox, "import os\nprint(os.path.exists('/var/tmp/left'))")
        )
        assert.strictEqual(b.result, "False\n")
        assert.notStrictEqual(b.instance, a.instance, "a new sandbox")
        assert.isAtLeast((yield* manager.stats(`attack-${transport}-rw`))!.recreations, 1)
      }))

    it.effect("after the trainer is killed (SIGKILL), the next run's reaper leaves nothing of its sandboxes", () =>
      Effect.scoped(Effect.gen(function*() {
        const name = `held-${transport}-${process.pid}`
        const tmp = mkdtempSync(join(tmpdir(), "attack-holder-"))
        yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(tmp, { recursive: true, force: true })))
        const holder = yield* startHolder(transport, name, tmp)
        holder.child.kill("SIGKILL")
        yield* holder.exited.pipe(Effect.timeout("30 seconds"))
        if (transport === "bubblewrap") {
          // An empty cgroup in the layout of earlier versions (`agentfly/<id>`, no owner recorded) goes too.
          const legacy = `/sys/fs/cgroup/pids/agentfly/legacy-${process.pid}`
          mkdirSync(legacy, { recursive: true })
          yield* Bubblewrap.reapOrphans
          assert.isFalse(existsSync(legacy), "no empty cgroup of an earlier layout left")
          yield* Effect.sleep("200 millis")
          assert.deepStrictEqual(cgroupsWith(name), [], "no cgroup left")
          assert.deepStrictEqual(cgroupsWith(`run-${holder.pid}-`), [], "no cgroup of the run left")
          assert.deepStrictEqual(readdirSync(tmp).filter((f) => f.startsWith("agentfly-")), [], "no directory left")
        } else {
          yield* Docker.reapOrphans(new DockerodeClient({ socketPath: "/var/run/docker.sock" }))
          assert.strictEqual(yield* labelled(holder.runId), 0, "no container left")
        }
      })), 300_000)
  })
}
