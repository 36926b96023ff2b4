/**
 * The bubblewrap launcher: long-lived sandboxed processes where no Docker engine runs. Each instance is one `bwrap`
 * process, started with an empty environment as the spec's unprivileged user on the host (never root: bwrap then
 * needs unprivileged user namespaces), with every namespace unshared (only a loopback interface unless the spec
 * asks for the host network) and no further user namespaces (`--disable-userns`), the command as PID 1 of its
 * PID namespace, the host's `/usr` bound read-only, a read-only root and `/dev`, size-capped tmpfs mounts
 * (`/dev/shm` included), a private mqueue, all capabilities dropped, no new privileges, the sandboxes' seccomp
 * filter (`Seccomp.ts`, loaded through `--seccomp`), and a process that dies with its parent.
 *
 * Memory, pids and CPU are capped by cgroup v1 (`/sys/fs/cgroup/{memory,pids,cpu}/agentfly/run-<pid>-<start>/<id>`,
 * needs root); where those cannot be written the instance fails to start rather than run without the limits the
 * spec asked for. The CPU cgroup also schedules the sandboxes as one group (`agentfly`), as Docker's `docker`
 * group does its containers: without it every sandbox, a session of its own, would weigh as much as the trainer.
 * The cgroups (and socket directories) of a run that died without cleaning up (SIGKILL) are removed by
 * {@link reapOrphans}, which every run does once before its first sandbox, as Docker's launcher reaps its orphans.
 *
 * Two channels into the sandbox: `stdio` (lines over the command's stdin and stdout: nothing on the host's file
 * system, and nothing code in the sandbox can reach when the command is not dumpable) or `socket` (one host
 * directory per instance bound at `/sock`, writable by the sandbox's user).
 *
 * @since 0.1.0
 */
import { Effect, Schedule } from "effect"
import type { Scope } from "effect"
import { spawn } from "node:child_process"
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
  writeFileSync
} from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { EnvError, envError } from "../../src/Environment.ts"
import type * as Resource from "../../src/Resource.ts"
import * as Lines from "./internal/lineChannel.ts"
import * as Seccomp from "./Seccomp.ts"

/**
 * A running sandboxed process.
 *
 * @category models
 * @since 0.1.0
 */
export interface Sandbox {
  readonly pid: number
  /** The host directory bound at `/sock` inside the sandbox (channel `socket`); empty with the `stdio` channel. */
  readonly socketDir: string
  /** The command's stdin and stdout as lines (channel `stdio`). */
  readonly stdio: Lines.LineChannel | undefined
  readonly alive: () => boolean
  /** What the process wrote to stderr (last 4 KiB), for diagnostics. */
  readonly stderr: () => string
}

/**
 * What to run.
 *
 * **Gotchas**
 *
 * With the `socket` channel the socket directory is writable by the sandbox's user: code in the sandbox can
 * replace a socket there with its own. Use `stdio` for a channel that code cannot reach.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The command, given the socket directory as seen inside the sandbox (`/sock`; empty with `stdio`). */
  readonly cmd: (socketDir: string) => ReadonlyArray<string>
  readonly env?: Readonly<Record<string, string>>
  /** The working directory inside the sandbox (one of the spec's tmpfs mounts). */
  readonly workDir: string
  /** `socket` (default): a host directory bound at `/sock`; `stdio`: lines over the command's stdin/stdout. */
  readonly channel?: "socket" | "stdio"
}

/**
 * Polls readiness of a freshly started sandbox.
 *
 * @category constructors
 * @since 0.1.0
 */
export const readyPoll = Schedule.spaced("20 millis")

const CGROUP_ROOT = "/sys/fs/cgroup"
const CONTROLLERS = ["memory", "pids", "cpu"] as const
/** The CFS period of a CPU cap, in µs (the kernel's default); the quota is `cpus` periods. */
const CFS_PERIOD_US = 100_000
/** `/dev/shm`'s size when the spec gives none (Docker's default). */
const DEFAULT_SHM_BYTES = 64 * 1024 * 1024

const startError = (env: string, message: string) =>
  envError(env, "start", "Unavailable", message)

// ===== Runs =====

/** The start time of a process in clock ticks since boot (field 22 of its stat), or undefined if it is gone. */
const startTimeOf = (pid: number): string | undefined => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]
  } catch {
    return undefined
  }
}

/** This run's name in cgroup and directory names: its pid and start time (a reused pid has another start). */
const runName = `run-${process.pid}-${startTimeOf(process.pid) ?? "0"}`

/** Whether the run named `name` (`run-<pid>-<start>`) is still alive. */
const runAlive = (name: string): boolean => {
  const match = /^run-(\d+)-(\d+)$/.exec(name)
  return match === null || startTimeOf(Number(match[1])) === match[2]
}

// ===== Cgroups =====

/** Creates the instance's cgroups and writes its limits; returns the `cgroup.procs` files to join. */
const makeCgroups = (env: string, id: string, limits: Resource.Limits) =>
  Effect.try({
    try: () => {
      const procs: Array<string> = []
      const make = (controller: string, files: Record<string, string>) => {
        const dir = join(CGROUP_ROOT, controller, "agentfly", runName, id)
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
      if (limits.cpus !== undefined) {
        const quota = String(Math.max(1_000, Math.round(limits.cpus * CFS_PERIOD_US)))
        make("cpu", { "cpu.cfs_period_us": String(CFS_PERIOD_US), "cpu.cfs_quota_us": quota })
      }
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
  } catch {
    return false // members still dying
  }
  // The run's own directory goes with its last instance: a clean exit leaves no empty cgroup behind. (Sync calls
  // on one thread: no instance of this run can be made between the check and the removal.)
  try {
    rmdirSync(join(procs, "..", ".."))
  } catch {
    // other instances of the run are still there
  }
  return true
}

/** Kills what is left in the cgroups and removes them, waiting (up to ~2 s) for killed members to go. */
const removeCgroups = (procs: ReadonlyArray<string>) =>
  Effect.forEach(procs, (file) =>
    Effect.suspend(() => (killAndRemove(file) ? Effect.void : Effect.fail("busy" as const))).pipe(
      Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 100 }),
      Effect.ignore
    ), { discard: true })

const entries = (dir: string): Array<string> => {
  try {
    return readdirSync(dir)
  } catch {
    return []
  }
}

/**
 * Removes what dead runs left: the cgroups under `agentfly/run-<pid>-<start>` of every controller (killing any
 * process still in them) and the `agentfly-run-<pid>-<start>-*` socket directories in the temporary directory,
 * for every run whose process is gone; and the empty cgroups directly under `agentfly/` that earlier versions left
 * (`agentfly/<id>`, no owner recorded: only removed when no process is in them). Returns how many cgroups were
 * removed.
 *
 * @category constructors
 * @since 0.1.0
 */
export const reapOrphans: Effect.Effect<number> = Effect.gen(function*() {
  let reaped = 0
  for (const controller of CONTROLLERS) {
    const root = join(CGROUP_ROOT, controller, "agentfly")
    for (const run of entries(root).filter((name) => name.startsWith("run-") && !runAlive(name))) {
      const procs = entries(join(root, run)).map((name) => join(root, run, name, "cgroup.procs")).filter(existsSync)
      yield* removeCgroups(procs)
      reaped += procs.length
      yield* Effect.sync(() => {
        try {
          rmdirSync(join(root, run))
        } catch {
          // a member would not die: the next reap tries again
        }
      })
    }
    for (const legacy of entries(root).filter((name) => !name.startsWith("run-"))) {
      const procs = join(root, legacy, "cgroup.procs")
      yield* Effect.sync(() => {
        try {
          if (readFileSync(procs, "utf8").trim() !== "") return
          rmdirSync(join(root, legacy))
          reaped++
        } catch {
          // not a cgroup, or gone
        }
      })
    }
  }
  yield* Effect.sync(() => {
    for (const name of entries(tmpdir())) {
      const run = /^agentfly-(run-\d+-\d+)-/.exec(name)?.[1]
      if (run !== undefined && !runAlive(run)) rmSync(join(tmpdir(), name), { recursive: true, force: true })
    }
  })
  return reaped
})

/** Whether this process has reaped yet: once, before its first sandbox. */
let reaped = false

// ===== Arguments =====

/** The sandbox's user as numbers; never root. */
const userOf = (limits: Resource.Limits): { readonly uid: number; readonly gid: number } | undefined => {
  const [uid, gid] = limits.user.split(":")
  if (uid === undefined || !/^\d+$/.test(uid) || (gid !== undefined && !/^\d+$/.test(gid))) return undefined
  const user = { uid: Number(uid), gid: Number(gid ?? uid) }
  return user.uid === 0 || user.gid === 0 ? undefined : user
}

/**
 * The bwrap argument list for a spec (the seccomp program is read from descriptor 3).
 *
 * @category constructors
 * @since 0.1.0
 */
export const bwrapArgs = (
  limits: Resource.Limits,
  socketDir: string | undefined,
  options: Options
): ReadonlyArray<string> => {
  const [uid, gid] = limits.user.split(":")
  const args = [
    "--unshare-all",
    "--unshare-user",
    ...(limits.network === "host" ? ["--share-net"] : []),
    "--disable-userns",
    "--as-pid-1",
    "--die-with-parent",
    "--new-session",
    "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/bin", "/bin",
    "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64",
    "--proc", "/proc",
    "--dev", "/dev",
    "--size", String(limits.tmpfs["/dev/shm"] ?? DEFAULT_SHM_BYTES), "--tmpfs", "/dev/shm",
    "--mqueue", "/dev/mqueue",
    "--remount-ro", "/dev"
  ]
  for (const [path, bytes] of Object.entries(limits.tmpfs)) {
    if (path !== "/dev/shm") args.push("--size", String(bytes), "--tmpfs", path)
  }
  if (socketDir !== undefined) args.push("--bind", socketDir, "/sock")
  args.push("--remount-ro", "/")
  args.push("--chdir", options.workDir, "--uid", uid ?? "65534", "--gid", gid ?? uid ?? "65534", "--cap-drop", "ALL")
  args.push("--seccomp", "3", "--clearenv")
  for (const [key, value] of Object.entries({ PATH: "/usr/bin:/bin", ...options.env })) {
    args.push("--setenv", key, value)
  }
  return [...args, "--", ...options.cmd(socketDir === undefined ? "" : "/sock")]
}

// ===== Launcher =====

/** A socket directory for one instance, named after this run so that a reaper can tell whose it is. */
const makeSocketDir = (env: string, id: string) =>
  Effect.acquireRelease(
    Effect.try({
      try: () => {
        const dir = mkdtempSync(join(tmpdir(), `agentfly-${runName}-${id.replace(/[^a-zA-Z0-9_.-]/g, "-")}-`))
        chmodSync(dir, 0o777) // the sandbox's user creates its socket here
        return dir
      },
      catch: (e) => startError(env, String(e))
    }),
    (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
  )

/** Spawns bwrap: a root shell joins the cgroups, then becomes bwrap as the unprivileged user, with no environment. */
const spawnSandbox = (
  spec: Resource.ResourceSpec,
  user: { readonly uid: number; readonly gid: number },
  procs: ReadonlyArray<string>,
  socketDir: string | undefined,
  options: Options,
  filter: Buffer
): Sandbox => {
  const enter = procs.map((file) => `echo $$ > '${file}'`).join(" && ")
  const become = `exec setpriv --reuid=${user.uid} --regid=${user.gid} --clear-groups --nnp bwrap "$@"`
  const stdio = options.channel === "stdio"
  const child = spawn("/bin/sh", ["-c", enter === "" ? become : `${enter} && ${become}`, "sh", ...bwrapArgs(
    spec.limits,
    socketDir,
    options
  )], {
    stdio: [stdio ? "pipe" : "ignore", stdio ? "pipe" : "ignore", "pipe", "pipe"],
    detached: true,
    env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" }
  })
  const seccomp = child.stdio[3] as NodeJS.WritableStream & { on: (e: string, f: () => void) => void }
  seccomp.on("error", () => {})
  seccomp.end(filter)
  let stderr = ""
  child.stderr!.on("data", (chunk: Buffer) => (stderr = (stderr + chunk.toString("utf8")).slice(-4096)))
  child.on("error", () => {})
  let lines: Lines.LineChannel | undefined
  if (stdio) {
    child.stdin!.on("error", () => {})
    const channel = Lines.make(child.stdout!, (text) => void child.stdin!.write(text))
    child.on("exit", channel.closed)
    lines = channel
  }
  return {
    pid: child.pid ?? -1,
    socketDir: socketDir ?? "",
    stdio: lines,
    alive: () => child.exitCode === null && child.signalCode === null,
    stderr: () => stderr
  }
}

/**
 * The launcher: `start` spawns the sandbox (inside its cgroups) and kills it, its cgroups and its socket dir when
 * the scope closes; `health` checks the process is alive. Instances are reset by whatever runs inside them.
 *
 * @category constructors
 * @since 0.1.0
 */
export const launcher = (options: Options) => ({
  start: (spec: Resource.ResourceSpec, id: string): Effect.Effect<Sandbox, EnvError, Scope.Scope> =>
    Effect.gen(function*() {
      const user = userOf(spec.limits)
      if (user === undefined) {
        return yield* startError(spec.name, `limits.user must be a numeric, non-root uid:gid (got ${spec.limits.user})`)
      }
      if (!spec.limits.readOnlyRoot) {
        return yield* startError(spec.name, "bubblewrap needs readOnlyRoot: true (its root is an unsized tmpfs)")
      }
      const filter = Seccomp.bpf()
      if (filter === undefined) {
        return yield* startError(spec.name, `no seccomp filter for ${process.arch}; refusing to start without one`)
      }
      if (!reaped) {
        reaped = true
        yield* reapOrphans
      }
      const socketDir = options.channel === "stdio" ? undefined : yield* makeSocketDir(spec.name, id)
      const procs = yield* Effect.acquireRelease(makeCgroups(spec.name, id, spec.limits), removeCgroups)
      return yield* Effect.acquireRelease(
        Effect.try({
          try: () => spawnSandbox(spec, user, procs, socketDir, options, filter),
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
        envError(
          "bubblewrap",
          "health",
          "Crashed",
          `sandbox process ${sandbox.pid} exited: ${sandbox.stderr().slice(-500)}`
        )
      )
})
