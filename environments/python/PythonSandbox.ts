/**
 * The Python code interpreter environment: a sandbox whose interpreter state persists across the calls of one
 * chain (a variable set in one call is visible in the next), with a time limit per call, truncated output, no
 * network, capped memory and pids, a read-only root and a writable tmpfs work dir.
 *
 * Inside the sandbox a small supervisor (`repl_server.py`, standard library only) is PID 1 and owns one long-lived
 * worker interpreter, forked by a zygote (`repl_worker.py`: a fresh program started once, which never sees a
 * request, so that no worker holds anything of an earlier chain and a new one costs a fork). Each call is one
 * request: a JSON line over the supervisor's stdin and stdout (Docker's default `attach` transport, and
 * bubblewrap); with the opt-in Docker `exec` transport, one `exec` of a tiny client, as another user than the code
 * under test, that talks to the supervisor's abstract unix socket (≈ 100 ms of engine CPU per call). A call that
 * runs past its limit, or an interpreter killed by the out-of-memory killer, fails with {@link PythonError} and the
 * next call runs on a fresh interpreter. A container that dies is replaced by the resource manager
 * (`EnvError(Crashed)`, retried by `ResourceManager.withRetryOnCrash`).
 *
 * **What a chain cannot do.** Trace or read the supervisor (it is not dumpable; ptrace is filtered), take its
 * channel over or forge its replies, or leave anything for the next chain: a reset kills every process of the
 * sandbox but the supervisor and the zygote, empties the work dir, `/tmp` and `/dev/shm`, removes IPC objects,
 * puts back limits, priority and affinity a chain changed on them, and checks that all of it held; a sandbox that
 * cannot prove it is clean (or has a writable root) fails its reset with `EnvError(ResetFailed)` and the resource
 * manager destroys it. Processes a cell starts do not outlive the cell, and a `fresh` run (a reward's) runs while
 * the chain's own interpreter is stopped.
 *
 * @since 0.1.0
 */
import { Context, Effect, Schedule, Schema } from "effect"
import { readFileSync } from "node:fs"
import * as Bubblewrap from "../../actors/resources/Bubblewrap.ts"
import * as Docker from "../../actors/resources/Docker.ts"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import { EnvError, envError } from "../../src/Environment.ts"
import * as Resource from "../../src/Resource.ts"

// ===== Models =====

/**
 * The outcome of running one cell. A Python exception is a result (`error` set, traceback in `stderr`), not a
 * failure: the model should read it. `restarted`: the previous interpreter died, so earlier state is gone.
 *
 * @category models
 * @since 0.1.0
 */
export const RunResult = Schema.Struct({
  stdout: Schema.String,
  stderr: Schema.String,
  error: Schema.NullOr(Schema.String),
  truncated: Schema.Boolean,
  restarted: Schema.Boolean
})
export type RunResult = typeof RunResult.Type

/**
 * The cell ran past its time limit.
 *
 * @category errors
 * @since 0.1.0
 */
export class Timeout extends Schema.TaggedError<Timeout>()("Timeout", {
  message: Schema.String,
  /** The cell's time limit. */
  timeoutMs: Schema.Number
}) {}

/**
 * The cell's interpreter was killed (usually out of memory).
 *
 * @category errors
 * @since 0.1.0
 */
export class Killed extends Schema.TaggedError<Killed>()("Killed", {
  message: Schema.String,
  /** What the sandbox said killed it. */
  why: Schema.String
}) {}

/**
 * The cell itself was stopped: it ran past its time limit (`Timeout`) or its interpreter was killed (`Killed`,
 * usually out of memory). The interpreter is restarted; its state is lost. `message` is the reason's; handle
 * reasons with `Effect.catchReason("PythonError", "Timeout", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class PythonError extends Schema.TaggedError<PythonError>()("PythonError", {
  reason: Schema.Union([Timeout, Killed])
}) {
  get isRetryable(): boolean {
    return false
  }
  override get message(): string {
    return this.reason.message
  }
}

/**
 * Per-call options.
 *
 * @category models
 * @since 0.1.0
 */
export interface RunOptions {
  /** Wall-clock limit of the cell (default: the sandbox's). */
  readonly timeoutMillis?: number
  /** Run in a brand-new interpreter that is thrown away afterwards; the chain's state is untouched (rewards). */
  readonly fresh?: boolean
}

/**
 * The sandbox service a chain's tools and rewards use.
 *
 * @category services
 * @since 0.1.0
 */
export class PythonSandbox extends Context.Service<PythonSandbox, {
  readonly run: (code: string, options?: RunOptions) => Effect.Effect<RunResult, PythonError | EnvError>
  /** Kill the interpreter and empty the work dir. */
  readonly reset: Effect.Effect<void, EnvError>
}>()("agentfly/environments/python/PythonSandbox") {}

/**
 * Limits of calls, independent of the sandbox's resource limits.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Default time limit of one call (default 10 s, as AgentFly's). */
  readonly timeoutMillis: number
  /** Characters kept of stdout and of stderr each (default 8192); the rest is counted and marked. */
  readonly maxOutputChars: number
}

const defaultOptions: Options = { timeoutMillis: 10_000, maxOutputChars: 8192 }

// ===== The in-sandbox programs =====

const serverSource = readFileSync(new URL("./repl_server.py", import.meta.url), "utf8")
const workerSource = readFileSync(new URL("./repl_worker.py", import.meta.url), "utf8")

/**
 * The per-call client run by `docker exec`: forwards stdin to the supervisor's abstract socket and prints the
 * reply. It gives up after argv[1] seconds by itself, so an exec needs no `timeout` wrapper process.
 */
const clientSource = [
  "import socket, sys",
  "s = socket.socket(socket.AF_UNIX)",
  "s.settimeout(float(sys.argv[1]))",
  "s.connect('\\0agentfly-repl')",
  "s.sendall(sys.stdin.buffer.read())",
  "s.shutdown(socket.SHUT_WR)",
  "while True:",
  "    chunk = s.recv(65536)",
  "    if not chunk: break",
  "    sys.stdout.buffer.write(chunk)"
].join("\n")

const WORK = "/work"

/**
 * The supervisor's command line: its channel, the work dir, the worker's source and the writable places a reset
 * empties (the spec's tmpfs mounts and `/dev/shm`).
 */
const supervisor = (python: string, spec: Resource.ResourceSpec, channel: string): Array<string> => [
  python,
  "-I",
  "-S",
  "-c",
  serverSource,
  channel,
  WORK,
  workerSource,
  ...new Set([...Object.keys(spec.limits.tmpfs), "/dev/shm"])
]

/** The exec transport's client user: not the sandbox's, so that code under test can neither trace nor pose as it. */
const clientUser = (limits: Resource.Limits): number => (limits.user.split(":")[0] === "65533" ? 65532 : 65533)

// ===== Specs =====

/**
 * A spec for the sandbox with hardened defaults: image `agentfly/python:1`, 512 MiB memory, 64 pids, one CPU,
 * no network, read-only root, a 64 MiB work dir, a 16 MiB `/tmp` and `/dev/shm`, user nobody, one instance per
 * chain.
 *
 * @category constructors
 * @since 0.1.0
 */
export const spec = (input: Partial<Resource.SpecInput> & { readonly kind: "docker" | "bubblewrap" }) =>
  Resource.make({
    name: `python-${input.kind}`,
    image: "agentfly/python:1",
    ...input,
    limits: {
      memoryBytes: 512 * 1024 * 1024,
      pids: 64,
      cpus: 1,
      tmpfs: { [WORK]: 64 * 1024 * 1024, "/tmp": 16 * 1024 * 1024, "/dev/shm": 16 * 1024 * 1024 },
      ...input.limits
    },
    timeouts: { startMillis: 20_000, ...input.timeouts }
  })

// ===== Instances =====

/**
 * One sandbox instance: sends a request to its supervisor and returns the decoded reply.
 *
 * @category models
 * @since 0.1.0
 */
export interface Instance {
  readonly request: (body: object, timeoutMillis: number) => Effect.Effect<unknown, EnvError>
}

const Reply = Schema.Struct({
  stdout: Schema.optionalKey(Schema.String),
  stderr: Schema.optionalKey(Schema.String),
  error: Schema.optionalKey(Schema.NullOr(Schema.String)),
  truncated: Schema.optionalKey(Schema.Boolean),
  restarted: Schema.optionalKey(Schema.Boolean),
  timed_out: Schema.optionalKey(Schema.Boolean),
  killed: Schema.optionalKey(Schema.String),
  ok: Schema.optionalKey(Schema.Boolean),
  dirty: Schema.optionalKey(Schema.String)
})
const decodeReply = Schema.decodeUnknownEffect(Schema.fromJsonString(Reply))

const protocolError = (env: string, method: string, message: string) =>
  envError(env, method, "Crashed", `bad reply from the sandbox: ${message}`)

const parse = (env: string, method: string, raw: string) =>
  Effect.mapError(
    decodeReply(raw),
    (e) => protocolError(env, method, `${e.message} in ${JSON.stringify(raw.slice(0, 200))}`)
  )

/**
 * How long past a cell's own limit the supervisor may take to reply: it kills and reaps what the cell started (a fork
 * bomb's thousands of processes under a pids cap), which a loaded machine slows by seconds (5 s was once exceeded at
 * load 13). A safety net for a supervisor that hangs, not a measure of speed.
 */
const replyGraceMillis = 30_000

/** Runs one cell on an instance. */
const runOn = (env: string, instance: Instance, options: Options) =>
(code: string, run?: RunOptions): Effect.Effect<RunResult, PythonError | EnvError> =>
  Effect.gen(function*() {
    const timeoutMillis = run?.timeoutMillis ?? options.timeoutMillis
    const raw = yield* instance.request({
      op: "run",
      code,
      timeout: timeoutMillis / 1000,
      max_output: options.maxOutputChars,
      fresh: run?.fresh ?? false
    }, timeoutMillis + replyGraceMillis)
    const reply = raw as typeof Reply.Type
    if (reply.timed_out) {
      return yield* new PythonError({
        reason: new Timeout({
          message: `the code ran longer than ${timeoutMillis} ms and was stopped; the interpreter was restarted`,
          timeoutMs: timeoutMillis
        })
      })
    }
    if (reply.killed !== undefined) {
      const why = reply.killed
      return yield* new PythonError({ reason: new Killed({ message: `${why}; the interpreter was restarted`, why }) })
    }
    if (reply.stdout === undefined) return yield* protocolError(env, "run", JSON.stringify(reply))
    return {
      stdout: reply.stdout,
      stderr: reply.stderr ?? "",
      error: reply.error ?? null,
      truncated: reply.truncated ?? false,
      restarted: reply.restarted ?? false
    }
  })

const ping = (instance: Instance) => Effect.asVoid(instance.request({ op: "ping" }, 5_000))

const dirty = (env: string, why: string) =>
  envError(env, "reset", "ResetFailed", `the sandbox cannot prove it is clean: ${why}`)

/** Resets through the supervisor, which answers `ok: true` only once it has checked the sandbox is clean. */
const resetOn = (env: string) => (instance: Instance): Effect.Effect<void, EnvError> =>
  Effect.flatMap(instance.request({ op: "reset" }, 10_000), (raw) => {
    const reply = raw as typeof Reply.Type
    return reply.ok === true ? Effect.void : Effect.fail(dirty(env, reply.dirty ?? JSON.stringify(reply)))
  })

/** A release's reset: only a read-only root can be proven clean, so a writable one is recreated instead. */
const releaseReset = (spec: Resource.ResourceSpec) => (instance: Instance): Effect.Effect<void, EnvError> =>
  spec.limits.readOnlyRoot
    ? resetOn(spec.name)(instance)
    : Effect.fail(dirty(spec.name, "its root is writable (readOnlyRoot: false); it is recreated instead"))

// ===== Docker =====

/**
 * How calls reach a Docker sandbox: `attach` (default): JSON lines over the container's attached stdin/stdout, one
 * stream per container for its whole life (≈ 0.5 ms per call, no engine work but copying); `exec`: one
 * `docker exec` of a small client per call, as the Docker launcher does every action (≈ 100 ms of engine CPU per
 * call, which bounds a 2-core machine to ≈ 20 calls/s whatever the number of chains).
 *
 * Both keep code under test off the channel: the attached stdin/stdout are reachable from inside only through
 * `/proc/1/fd` of the supervisor, which is not dumpable (its `/proc` entries are root's), and a reply is matched by
 * the request id the supervisor echoes; the exec client runs as another user than the code under test and talks
 * to an abstract socket whose peer's uid the supervisor checks (`SandboxAttacks.test.ts` runs on both).
 *
 * @category models
 * @since 0.1.0
 */
export type Transport = "exec" | "attach"

const timeoutError = (env: string, timeoutMillis: number) =>
  envError(env, "request", "Timeout", `no reply in ${timeoutMillis} ms`, { timeoutMs: timeoutMillis })

/** `docker exec`'s status when the runtime could not start the command (nothing ran: safe to try again). */
const notStarted = 126

/**
 * One process per call (`-I -S`: no site import, a faster start); the client bounds its own wait. A client the
 * runtime could not start (126: the container's process cap still full of the previous cell's children, which the
 * supervisor is killing) is started again a few times, 50 ms apart and doubling, within the call's time.
 */
const execInstance = (env: string, container: Docker.Container, user: number): Instance => ({
  request: (body, timeoutMillis) => {
    const start = container.exec(["python3", "-I", "-S", "-c", clientSource, String(timeoutMillis / 1000)], {
      stdin: JSON.stringify(body),
      user: `${user}:${user}`
    })
    const started = start.pipe(
      Effect.repeat({
        while: (result) => result.exitCode === notStarted,
        schedule: Schedule.max([Schedule.exponential(50), Schedule.recurs(5)])
      })
    )
    return started.pipe(
      Effect.timeoutOrElse({
        duration: timeoutMillis + 2_000,
        orElse: () => Effect.fail(timeoutError(env, timeoutMillis))
      }),
      Effect.flatMap((result) =>
        result.exitCode === 0
          ? parse(env, "request", result.stdout)
          : Effect.fail(protocolError(env, "request", `client exited ${result.exitCode}: ${result.stderr}`))
      )
    )
  }
})

/**
 * Requests tagged with an id over the supervisor's stdin and stdout (Docker's attached stream, bubblewrap's
 * pipes); a reply is matched to its request by the id it ends with. Only the supervisor can write there.
 */
const lineInstance = (env: string, channel: Docker.LineChannel): Instance => {
  const pending = new Map<number, (reply: Effect.Effect<string, EnvError>) => void>()
  let nextId = 0
  const gone = () => envError(env, "request", "Crashed", "the sandbox's stdio closed")
  channel.onLine((line) => {
    const id = /"id": (\d+)\}$/.exec(line)?.[1]
    const resume = id === undefined ? undefined : pending.get(Number(id))
    if (resume !== undefined) {
      pending.delete(Number(id))
      resume(Effect.succeed(line))
    }
  })
  channel.onClose(() => {
    for (const resume of pending.values()) resume(Effect.fail(gone()))
    pending.clear()
  })
  return {
    request: (body, timeoutMillis) =>
      Effect.callback<string, EnvError>((resume) => {
        if (!channel.isOpen()) return resume(Effect.fail(gone()))
        const id = nextId++
        pending.set(id, resume)
        channel.send(JSON.stringify({ ...body, id }))
        return Effect.sync(() => void pending.delete(id))
      }).pipe(
        Effect.timeoutOrElse({ duration: timeoutMillis, orElse: () => Effect.fail(timeoutError(env, timeoutMillis)) }),
        Effect.flatMap((raw) => parse(env, "request", raw))
      )
  }
}

/**
 * The sandbox as Docker containers (one per instance); `spec.kind` must be `docker`. Calls go over the
 * containers' attached stdio unless `transport: "exec"` is asked for (see {@link Transport}).
 *
 * @category constructors
 * @since 0.1.0
 */
export const docker = (
  spec: Resource.ResourceSpec,
  options: { readonly transport?: Transport } = {}
): Effect.Effect<Resource.Resource<Instance>, never, Docker.DockerEngine> =>
  Effect.gen(function*() {
    const attach = (options.transport ?? "attach") === "attach"
    const byContainer = new WeakMap<Docker.Container, Instance>()
    const toInstance = (container: Docker.Container): Instance => {
      let instance = byContainer.get(container)
      if (instance === undefined) {
        instance = attach
          ? lineInstance(spec.name, container.stdio!)
          : execInstance(spec.name, container, clientUser(spec.limits))
        byContainer.set(container, instance)
      }
      return instance
    }
    const containers = yield* Docker.launcher({
      cmd: supervisor("python3", spec, attach ? "stdio" : `socket:${clientUser(spec.limits)}`),
      env: ["PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "HOME=/work"],
      workingDir: WORK,
      attachStdio: attach,
      ready: (c) => ping(toInstance(c))
    })
    const instances = new WeakMap<Instance, Docker.Container>()
    return Resource.resource<Instance>(spec, {
      start: (s, id) =>
        Effect.map(containers.start(s, id), (c) => {
          const instance = toInstance(c)
          instances.set(instance, c)
          return instance
        }),
      reset: releaseReset(spec),
      // The container must run and its supervisor answer.
      health: (instance) => Effect.andThen(containers.health(instances.get(instance)!), ping(instance))
    })
  })

// ===== Bubblewrap =====

/**
 * The sandbox as bubblewrap processes, where no Docker engine runs: the host's `/usr` (and its python3) bound
 * read-only, tmpfs work dir, `/tmp` and `/dev/shm`, no network, cgroup memory/pids caps, an unprivileged host
 * user, the seccomp filter; requests as lines over the supervisor's stdin and stdout. `spec.kind` must be
 * `bubblewrap`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const bubblewrap = (spec: Resource.ResourceSpec): Resource.Resource<Instance> => {
  const processes = Bubblewrap.launcher({
    cmd: () => supervisor("/usr/bin/python3", spec, "stdio"),
    env: { PYTHONDONTWRITEBYTECODE: "1", PYTHONUNBUFFERED: "1", HOME: WORK },
    workDir: WORK,
    channel: "stdio"
  })
  const toInstance = (sandbox: Bubblewrap.Sandbox): Instance => lineInstance(spec.name, sandbox.stdio!)
  const sandboxes = new WeakMap<Instance, Bubblewrap.Sandbox>()
  return Resource.resource<Instance>(spec, {
    start: (s, id) =>
      Effect.gen(function*() {
        const sandbox = yield* processes.start(s, id)
        const instance = toInstance(sandbox)
        sandboxes.set(instance, sandbox)
        yield* Effect.retry(ping(instance), { schedule: Bubblewrap.readyPoll, while: () => sandbox.alive() })
        return instance
      }),
    reset: releaseReset(spec),
    health: (instance) => Effect.andThen(processes.health(sandboxes.get(instance)!), ping(instance))
  })
}

// ===== Provider =====

/**
 * The `PythonSandbox` service over a lease: every call goes through the lease, so a crashed sandbox is replaced
 * under the chain (the call fails once with `EnvError(Crashed)`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromLease = (lease: ResourceManager.Lease<Instance>, options: Partial<Options> = {}) => {
  const resolved = { ...defaultOptions, ...options }
  // Losing the lease itself (pool closed, a replacement that failed to start) is an unavailable environment.
  const unavailable = (e: Resource.LeaseError) =>
    envError(lease.resource, "run", "Unavailable", e.message, { cause: e })
  return PythonSandbox.of({
    run: (code, run) =>
      lease.use((instance) => runOn(lease.resource, instance, resolved)(code, run)).pipe(
        Effect.catchTag("LeaseError", (e) => Effect.fail(unavailable(e)))
      ),
    // A sandbox that cannot prove it is clean is replaced: the chain's next call runs on a fresh one.
    reset: lease.use(resetOn(lease.resource)).pipe(
      Effect.tapError((e) => e._tag === "EnvError" && e.reason._tag === "ResetFailed" ? lease.invalidate : Effect.void),
      Effect.catchTag("LeaseError", (e) => Effect.fail(unavailable(e)))
    )
  })
}

/**
 * The `Environment.Provider` of the sandbox: each chain gets the `PythonSandbox` of its leased instance.
 *
 * @category constructors
 * @since 0.1.0
 */
export const provider = (resource: Resource.Resource<Instance>, options: Partial<Options> = {}) =>
  ResourceManager.provider(resource, (lease) => Effect.succeed(Context.make(PythonSandbox, fromLease(lease, options))))

/**
 * The text the model observes for a result: stdout, then stderr, with a note when the interpreter was restarted.
 *
 * @category constructors
 * @since 0.1.0
 */
export const observation = (result: RunResult): string => {
  const parts: Array<string> = []
  if (result.restarted) parts.push("[note: the interpreter was restarted; earlier variables are gone]")
  if (result.stdout !== "") parts.push(result.stdout.replace(/\n$/, ""))
  if (result.stderr !== "") parts.push(result.stderr.replace(/\n$/, ""))
  return parts.length === 0 ? "(no output)" : parts.join("\n")
}
