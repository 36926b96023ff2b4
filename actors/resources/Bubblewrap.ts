/**
 * The bubblewrap backend: long-lived sandboxed processes where no Docker engine runs. Each instance is one
 * `bwrap` process with every namespace unshared (only a loopback interface unless the spec asks for the host
 * network), the host's `/usr` bound read-only, a read-only root, size-capped tmpfs mounts, user nobody, all
 * capabilities dropped, and a process group that dies with its parent. Memory and pids are capped by cgroup v1
 * (`/sys/fs/cgroup/{memory,pids}/agentfly/<id>`, needs root); where those cannot be written the instance fails to
 * start rather than run without the limits the spec asked for.
 *
 * One host directory per instance is bound at `/sock` for the instance's unix socket, the only way in.
 *
 * @since 0.1.0
 */
import { Effect, Schedule } from "effect"
import type { Scope } from "effect"
import { spawn } from "node:child_process"
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { EnvError } from "../../src/Environment.ts"
import type * as Resource from "../../src/Resource.ts"

/**
 * A running sandboxed process.
 *
 * @category models
 * @since 0.1.0
 */
export interface Sandbox {
  readonly pid: number
  /** The host directory bound at `/sock` inside the sandbox. */
  readonly socketDir: string
  readonly alive: () => boolean
  /** What the process wrote to stderr (last 4 KiB), for diagnostics. */
  readonly stderr: () => string
}

/**
 * What to run.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The command, given the socket directory as seen inside the sandbox (`/sock`). */
  readonly cmd: (socketDir: string) => ReadonlyArray<string>
  readonly env?: Readonly<Record<string, string>>
  /** The working directory inside the sandbox (one of the spec's tmpfs mounts). */
  readonly workDir: string
}

/**
 * Polls readiness of a freshly started sandbox.
 *
 * @category constructors
 * @since 0.1.0
 */
export const readyPoll = Schedule.spaced("20 millis")

const CGROUP_ROOT = "/sys/fs/cgroup"

const startError = (env: string, message: string) =>
  new EnvError({ env, method: "start", reason: "Unavailable", message })

/** Creates the instance's cgroups and writes its limits; returns the `cgroup.procs` files to join. */
const makeCgroups = (env: string, id: string, limits: Resource.Limits) =>
  Effect.try({
    try: () => {
      const procs: Array<string> = []
      const make = (controller: string, files: Record<string, string>) => {
        const dir = join(CGROUP_ROOT, controller, "agentfly", id)
        mkdirSync(dir, { recursive: true })
        for (const [file, value] of Object.entries(files)) {
          if (existsSync(join(dir, file))) writeFileSync(join(dir, file), value)
        }
        procs.push(join(dir, "cgroup.procs"))
      }
      if (limits.memoryBytes !== undefined) {
        const bytes = String(limits.memoryBytes)
        make("memory", { "memory.limit_in_bytes": bytes, "memory.memsw.limit_in_bytes": bytes })
      }
      if (limits.pids !== undefined) make("pids", { "pids.max": String(limits.pids) })
      return procs
    },
    catch: (e) => startError(env, `cannot set cgroup limits (root and cgroup v1 are needed): ${String(e)}`)
  })

/** Kills what is left in a cgroup; true once the cgroup is removed. */
const killAndRemove = (procs: string): boolean => {
  let pids: Array<number> = []
  try {
    pids = readFileSync(procs, "utf8").split("\n").filter((l) => l !== "").map(Number)
  } catch {
    return true // already gone
  }
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL")
    } catch {
      // already gone
    }
  }
  try {
    rmdirSync(join(procs, ".."))
    return true
  } catch {
    return false // members still dying
  }
}

/** Kills what is left in the cgroups and removes them, waiting (up to ~2 s) for killed members to go. */
const removeCgroups = (procs: ReadonlyArray<string>) =>
  Effect.forEach(procs, (file) =>
    Effect.suspend(() => (killAndRemove(file) ? Effect.void : Effect.fail("busy" as const))).pipe(
      Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 100 }),
      Effect.ignore
    ), { discard: true })

/** The bwrap argument list for a spec. */
export const bwrapArgs = (
  limits: Resource.Limits,
  socketDir: string,
  options: Options
): ReadonlyArray<string> => {
  const [uid, gid] = limits.user.split(":")
  const args = [
    "--unshare-all",
    ...(limits.network === "host" ? ["--share-net"] : []),
    "--die-with-parent",
    "--new-session",
    "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/bin", "/bin",
    "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64",
    "--proc", "/proc",
    "--dev", "/dev"
  ]
  for (const [path, bytes] of Object.entries(limits.tmpfs)) args.push("--size", String(bytes), "--tmpfs", path)
  args.push("--bind", socketDir, "/sock")
  if (limits.readOnlyRoot) args.push("--remount-ro", "/")
  args.push("--chdir", options.workDir, "--uid", uid ?? "65534", "--gid", gid ?? uid ?? "65534", "--cap-drop", "ALL")
  args.push("--clearenv")
  for (const [key, value] of Object.entries({ PATH: "/usr/bin:/bin", ...options.env })) {
    args.push("--setenv", key, value)
  }
  return [...args, "--", ...options.cmd("/sock")]
}

/**
 * The backend: `start` spawns the sandbox (inside its cgroups) and kills it, its cgroups and its socket dir when
 * the scope closes; `health` checks the process is alive. Instances are reset by whatever runs inside them.
 *
 * @category constructors
 * @since 0.1.0
 */
export const backend = (options: Options) => ({
  start: (spec: Resource.ResourceSpec, id: string): Effect.Effect<Sandbox, EnvError, Scope.Scope> =>
    Effect.gen(function*() {
      const socketDir = yield* Effect.acquireRelease(
        Effect.try({
          try: () => {
            const dir = mkdtempSync(join(tmpdir(), `agentfly-${id}-`))
            chmodSync(dir, 0o777) // the sandbox's user creates its socket here
            return dir
          },
          catch: (e) => startError(spec.name, String(e))
        }),
        (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
      )
      const procs = yield* Effect.acquireRelease(makeCgroups(spec.name, id, spec.limits), removeCgroups)
      // A shell joins the cgroups, then becomes bwrap: every process of the sandbox is inside the limits.
      const enter = procs.map((file) => `echo $$ > '${file}'`).join(" && ")
      const script = `${enter === "" ? "" : `${enter} && `}exec bwrap "$@"`
      return yield* Effect.acquireRelease(
        Effect.try({
          try: () => {
            const child = spawn("/bin/sh", ["-c", script, "sh", ...bwrapArgs(spec.limits, socketDir, options)], {
              stdio: ["ignore", "ignore", "pipe"],
              detached: true
            })
            let stderr = ""
            child.stderr.on("data", (chunk: Buffer) => (stderr = (stderr + chunk.toString("utf8")).slice(-4096)))
            child.on("error", () => {})
            const sandbox: Sandbox = {
              pid: child.pid ?? -1,
              socketDir,
              alive: () => child.exitCode === null && child.signalCode === null,
              stderr: () => stderr
            }
            return sandbox
          },
          catch: (e) => startError(spec.name, String(e))
        }),
        (sandbox) =>
          Effect.sync(() => {
            try {
              process.kill(-sandbox.pid, "SIGKILL")
            } catch {
              // already gone
            }
          })
      )
    }),
  health: (sandbox: Sandbox): Effect.Effect<void, EnvError> =>
    sandbox.alive()
      ? Effect.void
      : Effect.fail(
        new EnvError({
          env: "bubblewrap",
          method: "health",
          reason: "Crashed",
          message: `sandbox process ${sandbox.pid} exited: ${sandbox.stderr().slice(-500)}`
        })
      )
})
