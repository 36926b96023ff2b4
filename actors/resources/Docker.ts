/**
 * The Docker launcher (dockerode): long-lived sandbox containers, one `exec` per action.
 *
 * Every limit of the spec is enforced by the engine: memory (swap capped at the same value), CPU, pids,
 * `NetworkMode: none`, a private IPC namespace, a read-only root with uid-owned tmpfs mounts (and `/dev/shm` of
 * the spec's size), all capabilities dropped, `no-new-privileges`, a non-root user, and the sandboxes' seccomp
 * filter (`Seccomp.ts`: Docker's default profile without io_uring and ptrace). Containers carry labels
 * (`agentfly.run`, `agentfly.pid`, `agentfly.host`, `agentfly.resource`) so the {@link reapOrphans reaper} can
 * find what a dead run left behind:
 * {@link DockerEngine.layer} reaps at start-up, removes this run's containers at shutdown, and on SIGINT/SIGTERM.
 *
 * Images are built locally without a registry (`scripts/build-images`).
 *
 * @since 0.1.0
 */
import type Dockerode from "dockerode"
import DockerodeClient from "dockerode"
import { Clock, Context, Effect, Layer, Random, Schedule } from "effect"
import type { Scope } from "effect"
import { hostname } from "node:os"
import { PassThrough } from "node:stream"
import { EnvError, envError } from "../../src/Environment.ts"
import type * as Resource from "../../src/Resource.ts"
import * as Lines from "./internal/lineChannel.ts"
import * as NetPolicy from "./internal/netPolicy.ts"
import * as Seccomp from "./Seccomp.ts"

// ===== Engine =====

/**
 * Label keys on every container this runtime creates.
 *
 * @category models
 * @since 0.1.0
 */
export const Labels = {
  managed: "agentfly.managed",
  run: "agentfly.run",
  pid: "agentfly.pid",
  host: "agentfly.host",
  resource: "agentfly.resource"
} as const

/**
 * A Docker client plus the id of this run (the label its containers carry).
 *
 * @category services
 * @since 0.1.0
 */
export class DockerEngine extends Context.Service<DockerEngine, {
  readonly docker: Dockerode
  readonly runId: string
  /**
   * Succeeds when the engine answers within 5 seconds; else an `EnvError` ("Unavailable") saying that it is not
   * running and where it was looked for: what a run checks before its first container, instead of failing every
   * chain (or waiting on an engine that does not answer).
   */
  readonly ping: Effect.Effect<void, EnvError>
}>()("agentfly/actors/resources/DockerEngine") {
  /**
   * The engine at {@link socketPath}: reaps orphans of dead runs now, removes this run's containers when the
   * layer's scope closes and when the process gets SIGINT or SIGTERM.
   *
   * @category layers
   * @since 0.1.0
   */
  static readonly layer: Layer.Layer<DockerEngine> = Layer.effect(DockerEngine, Effect.suspend(() => make()))
}

/**
 * The local engine's socket: `DOCKER_HOST` when it names a unix socket (`unix:///run/user/1000/docker.sock`, a
 * rootless engine), else `/var/run/docker.sock`.
 *
 * @category getters
 * @since 0.1.0
 */
export const socketPath = (): string => {
  const host = process.env["DOCKER_HOST"]
  return host !== undefined && host.startsWith("unix://") ? host.slice("unix://".length) : "/var/run/docker.sock"
}

/**
 * Builds the engine service (see {@link DockerEngine.layer}).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fnUntraced(function*(options?: {
  readonly socketPath?: string
  /** Install SIGINT/SIGTERM handlers that remove this run's containers before the process exits (default true). */
  readonly handleSignals?: boolean
}) {
  const socket = options?.socketPath ?? socketPath()
  const docker = new DockerodeClient({ socketPath: socket })
  const now = yield* Clock.currentTimeMillis
  const salt = yield* Random.nextIntBetween(0, 1 << 30)
  const runId = `${hostname()}-${process.pid}-${now.toString(36)}-${salt.toString(36)}`
  // Whether the engine ever answered: one that did not (not running, or hung) holds no container of this run, and
  // neither reaping nor the clean-up waits long on it.
  let answered = false
  const heard = Effect.tap(() => Effect.sync(() => void (answered = true)))
  yield* Effect.ignore(reapOrphans(docker).pipe(heard, Effect.timeout("5 seconds")))
  yield* Effect.addFinalizer(() =>
    Effect.ignore(answered ? removeRun(docker, runId) : removeRun(docker, runId).pipe(Effect.timeout("2 seconds")))
  )
  if (options?.handleSignals ?? true) {
    // Closing scopes is the normal path; this covers a process killed by a signal before its scopes close.
    const onSignal = (signal: NodeJS.Signals) => {
      process.off("SIGINT", onSignal)
      process.off("SIGTERM", onSignal)
      void Effect.runPromise(Effect.ignore(removeRun(docker, runId))).then(() => {
        if (process.listenerCount(signal) === 0) process.kill(process.pid, signal)
      })
    }
    yield* Effect.acquireRelease(
      Effect.sync(() => (process.on("SIGINT", onSignal), process.on("SIGTERM", onSignal))),
      () => Effect.sync(() => (process.off("SIGINT", onSignal), process.off("SIGTERM", onSignal)))
    )
  }
  const down = (why: string) =>
    envError(
      "docker",
      "ping",
      "Unavailable",
      `the Docker engine at ${socket} is not running or does not answer (${why}): start it (dockerd, or ` +
        "systemctl start docker), or point DOCKER_HOST at its socket"
    )
  const ping = Effect.tryPromise({
    // The typings leave ping's options out; dockerode takes `abortSignal` there as in its other calls.
    try: (signal) =>
      (docker as unknown as { ping: (options: { abortSignal: AbortSignal }) => Promise<unknown> }).ping({
        abortSignal: signal
      }),
    catch: (e) => down(e instanceof Error ? e.message : String(e))
  }).pipe(
    heard,
    Effect.timeoutOrElse({ duration: "5 seconds", orElse: () => Effect.fail(down("no answer in 5 s")) }),
    Effect.asVoid
  )
  return DockerEngine.of({ docker, runId, ping })
})

const engineError = (env: string, method: string, cause: unknown): EnvError => {
  const status = (cause as { statusCode?: number })?.statusCode
  const message = cause instanceof Error ? cause.message : String(cause)
  // 404: the container is gone; 409: it exists but is not running. Either way its state is lost.
  const gone = status === 404 || status === 409 || /is not running|No such container/i.test(message)
  return envError(env, method, gone ? "Crashed" : "Unavailable", message, { cause })
}

const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as { code?: string }).code === "EPERM"
  }
}

/**
 * Removes labelled containers whose run is dead: created on this host by a process that no longer exists.
 * Returns how many were removed.
 *
 * @category constructors
 * @since 0.1.0
 */
export const reapOrphans: (docker: Dockerode) => Effect.Effect<number, EnvError> = Effect.fn("Docker.reapOrphans")(
  function*(docker: Dockerode) {
    const containers = yield* Effect.tryPromise({
      // Aborted when interrupted (a timeout): an open request to an engine that does not answer keeps Node alive.
      try: (signal) =>
        docker.listContainers({ all: true, filters: { label: [`${Labels.managed}=1`] }, abortSignal: signal }),
      catch: (e) => engineError("docker", "reapOrphans", e)
    })
    const host = hostname()
    const orphans = containers.filter((c) => {
      const pid = Number(c.Labels[Labels.pid])
      return c.Labels[Labels.host] === host && Number.isInteger(pid) && pid > 0 && !isAlive(pid)
    })
    yield* Effect.forEach(orphans, (c) => removeContainer(docker, c.Id), { concurrency: 8, discard: true })
    return orphans.length
  }
)

/**
 * Removes every container of one run.
 *
 * @category constructors
 * @since 0.1.0
 */
export const removeRun: (docker: Dockerode, runId: string) => Effect.Effect<number, EnvError> = Effect.fn(
  "Docker.removeRun"
)(
  function*(docker: Dockerode, runId: string) {
    const containers = yield* Effect.tryPromise({
      try: (signal) =>
        docker.listContainers({ all: true, filters: { label: [`${Labels.run}=${runId}`] }, abortSignal: signal }),
      catch: (e) => engineError("docker", "removeRun", e)
    })
    yield* Effect.forEach(containers, (c) => removeContainer(docker, c.Id), { concurrency: 8, discard: true })
    return containers.length
  }
)

const removeContainer = (docker: Dockerode, id: string): Effect.Effect<void> =>
  Effect.ignore(Effect.tryPromise(() => docker.getContainer(id).remove({ force: true, v: true })))

// ===== Containers =====

/**
 * The result of one exec: output (capped), exit code.
 *
 * @category models
 * @since 0.1.0
 */
export interface ExecResult {
  readonly stdout: string
  readonly stderr: string
  readonly exitCode: number
}

/**
 * A running sandbox container.
 *
 * @category models
 * @since 0.1.0
 */
export interface Container {
  readonly id: string
  readonly name: string
  /**
   * Runs `cmd` in the container (one exec), feeding `stdin`, as `user` (default: the container's). Past
   * `timeoutMillis` the process is stopped by `timeout` inside the container and the call fails with
   * `EnvError(Timeout)`. A container that is gone fails with `EnvError(Crashed)`.
   */
  readonly exec: (cmd: ReadonlyArray<string>, options?: ExecOptions) => Effect.Effect<ExecResult, EnvError>
  /** Whether the container is running, and whether the kernel OOM-killed its main process. */
  readonly inspect: Effect.Effect<{ readonly running: boolean; readonly oomKilled: boolean }, EnvError>
  /** The main process's stdin/stdout as lines, when the container was started with `attachStdio`. */
  readonly stdio: LineChannel | undefined
}

/**
 * Options of one exec.
 *
 * @category models
 * @since 0.1.0
 */
export interface ExecOptions {
  readonly stdin?: string
  readonly timeoutMillis?: number
  readonly maxOutputBytes?: number
  /** `uid:gid` (or a name) to run as instead of the container's user. */
  readonly user?: string
}

/**
 * Lines to and from a container's main process over one attached stream (no exec per message).
 *
 * @category models
 * @since 0.1.0
 */
export type LineChannel = Lines.LineChannel

/**
 * How the launcher runs a resource's containers.
 *
 * @category models
 * @since 0.1.0
 */
export interface ContainerOptions {
  /** The main process (PID 1); it must stay up. */
  readonly cmd: ReadonlyArray<string>
  readonly env?: ReadonlyArray<string>
  readonly workingDir?: string
  /** Polled after start until it succeeds (bounded by the spec's `startMillis`). */
  readonly ready?: (container: Container) => Effect.Effect<void, EnvError>
  readonly reset?: (container: Container) => Effect.Effect<void, EnvError>
  /** Default: the container is running. */
  readonly health?: (container: Container) => Effect.Effect<void, EnvError>
  /** Attach to the main process's stdin/stdout before it starts (`Container.stdio`). */
  readonly attachStdio?: boolean
  /**
   * Extra tmpfs mounts (path → bytes) that every user may write, sticky as `/tmp` is (mode 1777): places a
   * container's own user, whoever it is (an image's `USER` by name), must be able to write, such as Harbor's
   * `/tests` and `/logs`.
   */
  readonly sharedTmpfs?: Readonly<Record<string, number>>
  /**
   * The network allow-list of a container without a network (`limits.network: "none"`): the hosts (IPv4 addresses
   * or names) it may reach, and nothing else (a veth with one route per host; `internal/netPolicy.ts`). Empty or
   * absent: loopback only. Needs `ip` and `nsenter` on the host, run as root.
   */
  readonly allowHosts?: ReadonlyArray<string>
}

/**
 * The engine-side form of a spec's limits.
 *
 * @category constructors
 * @since 0.1.0
 */
export const hostConfig = (limits: Resource.Limits): Dockerode.HostConfig => {
  const [uid, gid] = limits.user.split(":")
  const owner = uid !== undefined && /^\d+$/.test(uid) ? `,uid=${uid},gid=${gid ?? uid}` : ""
  const tmpfs: Record<string, string> = {}
  for (const [path, bytes] of Object.entries(limits.tmpfs)) {
    // The engine mounts /dev/shm itself (64 MiB unless told): its size is `ShmSize`.
    if (path !== "/dev/shm") tmpfs[path] = `rw,nosuid,nodev,size=${bytes}${owner}`
  }
  const shm = limits.tmpfs["/dev/shm"]
  return {
    NetworkMode: limits.network === "none" ? "none" : "host",
    IpcMode: "private",
    ...(shm !== undefined ? { ShmSize: shm } : {}),
    ...(limits.memoryBytes !== undefined ? { Memory: limits.memoryBytes, MemorySwap: limits.memoryBytes } : {}),
    ...(limits.cpus !== undefined ? { NanoCpus: Math.round(limits.cpus * 1e9) } : {}),
    ...(limits.pids !== undefined ? { PidsLimit: limits.pids } : {}),
    ReadonlyRootfs: limits.readOnlyRoot,
    CapDrop: ["ALL"],
    SecurityOpt: ["no-new-privileges", `seccomp=${Seccomp.dockerProfile()}`],
    Tmpfs: tmpfs,
    // A sandbox's output is read per exec; an engine log on the host would be a disk nobody caps.
    LogConfig: { Type: "none", Config: {} },
    AutoRemove: false
  }
}

/** Routes from a started container to the allowed hosts only (removed with the container's namespace). */
const allowNetwork = (handle: Dockerode.Container, env: string, hosts: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const info = yield* Effect.tryPromise({ try: () => handle.inspect(), catch: (e) => engineError(env, "start", e) })
    const addresses = yield* NetPolicy.resolveHosts(hosts)
    yield* NetPolicy.attach(info.State.Pid, info.Id, addresses)
  }).pipe(
    Effect.mapError((e) =>
      e instanceof EnvError ? e : envError(env, "start", "Unavailable", `the network allow-list: ${e.message}`)
    )
  )

/** `config` with `shared` added as world-writable (sticky) tmpfs mounts. */
const withSharedTmpfs = (
  config: Dockerode.HostConfig,
  shared: Readonly<Record<string, number>> | undefined
): Dockerode.HostConfig => {
  if (shared === undefined) return config
  const tmpfs: Record<string, string> = { ...config.Tmpfs }
  for (const [path, bytes] of Object.entries(shared)) tmpfs[path] = `rw,exec,nosuid,nodev,size=${bytes},mode=1777`
  return { ...config, Tmpfs: tmpfs }
}

const execIn = (docker: Dockerode, handle: Dockerode.Container, env: string) =>
(
  cmd: ReadonlyArray<string>,
  options?: ExecOptions
): Effect.Effect<ExecResult, EnvError> => {
  const limit = options?.maxOutputBytes ?? 1 << 20
  const timeout = options?.timeoutMillis
  // `timeout` (coreutils or busybox in the image) stops the process inside the container: TERM, then KILL 1 s later.
  const full = timeout === undefined ? [...cmd] : ["timeout", "-k", "1", String(Math.ceil(timeout / 1000)), ...cmd]
  const run = Effect.callback<ExecResult, EnvError>((resume) => {
    const stdin = options?.stdin
    const fail = (e: unknown) => resume(Effect.fail(engineError(env, "exec", e)))
    // One chain with one `catch`: a failure at any stage (e.g. `start` on a container being removed) resumes the
    // effect with a typed error instead of escaping as an unhandled rejection.
    void handle.exec({
      Cmd: full,
      AttachStdout: true,
      AttachStderr: true,
      AttachStdin: stdin !== undefined,
      ...(options?.user !== undefined ? { User: options.user } : {})
    })
      .then((exec) =>
        exec.start({ hijack: true, stdin: stdin !== undefined }).then((stream) => {
          const out = capture(limit)
          const err = capture(limit)
          docker.modem.demuxStream(stream, out.sink, err.sink)
          stream.on("error", fail)
          stream.on("end", () => {
            exec.inspect().then(
              (info) =>
                resume(Effect.succeed({ stdout: out.text(), stderr: err.text(), exitCode: info.ExitCode ?? -1 })),
              fail
            )
          })
          if (stdin !== undefined) stream.end(stdin)
        })
      )
      .catch(fail)
  })
  if (timeout === undefined) return run
  const timedOut = () => envError(env, "exec", "Timeout", `exceeded ${timeout} ms`, { timeoutMs: timeout })
  return Effect.gen(function*() {
    const started = yield* Clock.currentTimeMillis
    const result = yield* Effect.timeoutOrElse(run, {
      duration: timeout + 2_000,
      orElse: () => Effect.fail(timedOut())
    })
    const elapsed = (yield* Clock.currentTimeMillis) - started
    // 124: `timeout` stopped it; 137 past the limit: it ignored TERM and was killed.
    if (result.exitCode === 124 || (result.exitCode === 137 && elapsed >= timeout)) return yield* timedOut()
    return result
  })
}

/** A byte sink keeping at most `limit` bytes. */
const capture = (limit: number) => {
  const chunks: Array<Buffer> = []
  let kept = 0
  const sink = new PassThrough()
  sink.on("data", (chunk: Buffer) => {
    if (kept >= limit) return
    const piece = chunk.subarray(0, limit - kept)
    chunks.push(piece)
    kept += piece.length
  })
  return { sink, text: () => Buffer.concat(chunks).toString("utf8") }
}

/**
 * A launcher whose instances are containers of `spec.image`, run as `options` says.
 *
 * @category constructors
 * @since 0.1.0
 */
export const launcher = (
  options: ContainerOptions
): Effect.Effect<Resource.Launcher<Container>, never, DockerEngine> =>
  Effect.map(DockerEngine, ({ docker, runId }) => ({
    start: (spec: Resource.ResourceSpec, instanceId: string): Effect.Effect<Container, EnvError, Scope.Scope> =>
      Effect.gen(function*() {
        const name = `agentfly-${instanceId}-${runId}`.replace(/[^a-zA-Z0-9_.-]/g, "-")
        const handle = yield* Effect.acquireRelease(
          Effect.tryPromise({
            try: () =>
              docker.createContainer({
                name,
                Image: spec.image!,
                Cmd: [...options.cmd],
                ...(options.env ? { Env: [...options.env] } : {}),
                User: spec.limits.user,
                ...(options.workingDir ? { WorkingDir: options.workingDir } : {}),
                ...(options.attachStdio
                  ? { OpenStdin: true, StdinOnce: false, AttachStdin: true, AttachStdout: true, Tty: false }
                  : {}),
                NetworkDisabled: spec.limits.network === "none",
                HostConfig: withSharedTmpfs(hostConfig(spec.limits), options.sharedTmpfs),
                Labels: {
                  [Labels.managed]: "1",
                  [Labels.run]: runId,
                  [Labels.pid]: String(process.pid),
                  [Labels.host]: hostname(),
                  [Labels.resource]: spec.name
                }
              }),
            catch: (e) => engineError(spec.name, "start", e)
          }),
          (c) => removeContainer(docker, c.id)
        )
        const stdio = options.attachStdio ? yield* attachLines(docker, handle, spec.name) : undefined
        yield* Effect.tryPromise({ try: () => handle.start(), catch: (e) => engineError(spec.name, "start", e) })
        if (options.allowHosts !== undefined && options.allowHosts.length > 0) {
          yield* allowNetwork(handle, spec.name, options.allowHosts)
        }
        const container = makeContainer(docker, handle, name, spec.name, stdio)
        if (options.ready) {
          // Until the main process answers; the manager's `startMillis` bounds the wait.
          yield* Effect.retry(options.ready(container), readyPoll)
        }
        return container
      }),
    reset: options.reset ?? (() => Effect.void),
    health: options.health ?? ((c: Container) =>
      Effect.flatMap(c.inspect, (s) =>
        s.running
          ? Effect.void
          : Effect.fail(envError(c.name, "health", "Crashed", "not running"))))
  }))

const readyPoll = Schedule.spaced("20 millis")

/** Attaches to the (not yet started) main process: lines in on stdin, lines out of stdout. */
const attachLines = (docker: Dockerode, handle: Dockerode.Container, env: string) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => handle.attach({ stream: true, stdin: true, stdout: true, stderr: true, hijack: true }),
      catch: (e) => engineError(env, "attach", e)
    }).pipe(Effect.map((stream) => {
      const out = new PassThrough()
      docker.modem.demuxStream(stream, out, new PassThrough())
      const channel = Lines.make(out, (text) => void stream.write(text))
      stream.on("end", channel.closed)
      stream.on("close", channel.closed)
      stream.on("error", channel.closed)
      return { channel, destroy: () => (stream as unknown as { destroy?: () => void }).destroy?.() }
    })),
    ({ destroy }) => Effect.sync(destroy)
  ).pipe(Effect.map(({ channel }): LineChannel => channel))

const makeContainer = (
  docker: Dockerode,
  handle: Dockerode.Container,
  name: string,
  env: string,
  stdio?: LineChannel
): Container => ({
  stdio,
  id: handle.id,
  name,
  exec: execIn(docker, handle, env),
  inspect: Effect.tryPromise({
    try: () => handle.inspect(),
    catch: (e) => engineError(env, "inspect", e)
  }).pipe(Effect.map((info) => ({ running: info.State.Running, oomKilled: info.State.OOMKilled })))
})

/**
 * Docker without the signal handlers and the start-up reap, for tests that manage their own engine.
 *
 * @category layers
 * @since 0.1.0
 */
export const layerWith = (options: Parameters<typeof make>[0]): Layer.Layer<DockerEngine> =>
  Layer.effect(DockerEngine, make(options))
