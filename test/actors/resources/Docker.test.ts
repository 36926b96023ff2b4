/**
 * The Docker launcher's cleanup on a real engine: a run's labelled containers are gone after SIGTERM (its signal
 * handler removes them) and after SIGKILL (the next run's reaper removes orphans of dead runs). Engine limits are
 * checked on the container's own configuration (the sandboxes' seccomp profile included).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFile, spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import DockerodeClient from "dockerode"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as Docker from "../../../actors/resources/Docker.ts"
import * as Seccomp from "../../../actors/resources/Seccomp.ts"
import * as Resource from "../../../src/Resource.ts"

const holderScript = fileURLToPath(new URL("./fixtures/dockerHolder.ts", import.meta.url))

const labelled = (runId: string) =>
  Effect.callback<number, Error>((resume) => {
    execFile("docker", ["ps", "-aq", "--filter", `label=${Docker.Labels.run}=${runId}`], (error, stdout) =>
      resume(error ? Effect.fail(error) : Effect.succeed(stdout.split("\n").filter((l) => l !== "").length)))
  })

/** Starts the holder run and waits for its run id (its containers are up by then). */
const startHolder = Effect.gen(function*() {
  const child = spawn(process.execPath, ["--import", "tsx", holderScript], { stdio: ["ignore", "pipe", "pipe"] })
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
  }).pipe(Effect.timeout("60 seconds"))
  const exited = Effect.callback<number | null>((resume) => {
    if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.succeed(child.exitCode))
    child.on("exit", (code) => resume(Effect.succeed(code)))
  })
  return { child, runId: (JSON.parse(line) as { runId: string }).runId, exited }
})

describe("Docker reaper", () => {
  it.live("SIGTERM: the interrupted run removes its labelled containers before exiting", () =>
    Effect.gen(function*() {
      const holder = yield* startHolder
      assert.strictEqual(yield* labelled(holder.runId), 2)
      holder.child.kill("SIGTERM")
      yield* holder.exited.pipe(Effect.timeout("30 seconds"))
      assert.strictEqual(yield* labelled(holder.runId), 0, "no labelled container left")
    }), { timeout: 300_000 })

  it.live("SIGKILL: the orphans of the dead run are removed by the reaper of the next run", () =>
    Effect.gen(function*() {
      const holder = yield* startHolder
      assert.strictEqual(yield* labelled(holder.runId), 2)
      holder.child.kill("SIGKILL")
      yield* holder.exited.pipe(Effect.timeout("30 seconds"))
      assert.strictEqual(yield* labelled(holder.runId), 2, "a SIGKILLed run cannot clean up")
      const reaped = yield* Docker.reapOrphans(new DockerodeClient({ socketPath: "/var/run/docker.sock" }))
      assert.isAtLeast(reaped, 2)
      assert.strictEqual(yield* labelled(holder.runId), 0, "no labelled container left")
    }), { timeout: 300_000 })

  it.live("one exec per action: stdout, stderr, exit code, stdin, time limit; a removed container is a crash", () =>
    Effect.gen(function*() {
      const engine = yield* Docker.make({ handleSignals: false })
      const manager = yield* ResourceManager.make()
      const spec = Resource.makeUnsafe({ name: "exec", kind: "docker", image: "agentfly/python:1" })
      const launcher = yield* Docker.launcher({ cmd: ["sleep", "3600"] }).pipe(
        Effect.provideService(Docker.DockerEngine, engine)
      )
      const lease = yield* manager.acquire(Resource.resource(spec, launcher), { chainId: "a", groupId: "g" })
      const result = yield* lease.use((c) => c.exec(["sh", "-c", "echo out; echo err >&2; exit 3"]))
      assert.deepStrictEqual(result, { stdout: "out\n", stderr: "err\n", exitCode: 3 })
      const piped = yield* lease.use((c) => c.exec(["sh", "-c", "cat | tr a-z A-Z"], { stdin: "shout\n" }))
      assert.strictEqual(piped.stdout, "SHOUT\n")
      const slow = yield* Effect.flip(lease.use((c) => c.exec(["sleep", "30"], { timeoutMillis: 1_000 })))
      assert.strictEqual(slow._tag === "EnvError" ? slow.reason._tag : slow._tag, "Timeout")
      const fast = yield* lease.use((c) => c.exec(["true"], { timeoutMillis: 5_000 }))
      assert.strictEqual(fast.exitCode, 0)
      const id = yield* lease.instanceId
      yield* Effect.promise(() =>
        engine.docker.getContainer(`agentfly-${id}-${engine.runId}`.replace(/[^a-zA-Z0-9_.-]/g, "-")).remove({
          force: true
        })
      )
      const gone = yield* Effect.flip(lease.use((c) => c.exec(["true"])))
      assert.isTrue(Resource.isCrash(gone))
    }))

  it.live("every limit of the spec is enforced by the engine's container configuration", () =>
    Effect.gen(function*() {
      const engine = yield* Docker.make({ handleSignals: false })
      const manager = yield* ResourceManager.make()
      const spec = Resource.makeUnsafe({
        name: "limits",
        kind: "docker",
        image: "agentfly/python:1",
        limits: { memoryBytes: 96 * 1024 * 1024, cpus: 0.5, pids: 24, tmpfs: { "/work": 8 * 1024 * 1024 } }
      })
      const launcher = yield* Docker.launcher({ cmd: ["sleep", "3600"] }).pipe(
        Effect.provideService(Docker.DockerEngine, engine)
      )
      const lease = yield* manager.acquire(Resource.resource(spec, launcher), { chainId: "a", groupId: "g" })
      const id = yield* lease.instanceId
      const info = yield* Effect.promise(() =>
        engine.docker.getContainer(`agentfly-${id}-${engine.runId}`.replace(/[^a-zA-Z0-9_.-]/g, "-")).inspect()
      )
      const host = info.HostConfig
      assert.strictEqual(host.Memory, 96 * 1024 * 1024)
      assert.strictEqual(host.MemorySwap, 96 * 1024 * 1024)
      assert.strictEqual(host.NanoCpus, 500_000_000)
      assert.strictEqual(host.PidsLimit, 24)
      assert.strictEqual(host.NetworkMode, "none")
      assert.isTrue(host.ReadonlyRootfs)
      assert.deepStrictEqual(host.CapDrop, ["ALL"])
      assert.deepStrictEqual(host.SecurityOpt, ["no-new-privileges", `seccomp=${Seccomp.dockerProfile()}`])
      assert.strictEqual(host.IpcMode, "private")
      assert.strictEqual(host.LogConfig?.Type, "none")
      assert.strictEqual(host.Tmpfs?.["/work"], "rw,nosuid,nodev,size=8388608,uid=65534,gid=65534")
      assert.strictEqual(info.Config.User, "65534:65534")
      assert.strictEqual(info.Config.Labels[Docker.Labels.run], engine.runId)
      assert.strictEqual(info.Config.Labels[Docker.Labels.resource], "limits")
    }))
})
