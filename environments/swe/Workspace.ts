/**
 * A chain's SWE workspace: a Docker container of its Harbor task's environment, leased from the resource manager
 * for the chain's episode, with the actions the tools take (`shell`, `read`, `edit`, `submit`) and the verifier the
 * reward runs.
 *
 * - **Images.** A task's `environment/` is built once per machine with the engine's builder (no registry: its
 *   `FROM` must be a local image, e.g. the project's `agentfly/python:1`), tagged by the digest of its files, so
 *   tasks with the same environment share an image and a second run builds nothing.
 * - **Containers.** One per chain (`Resource` spec `harbor-<digest>`, scope `chain`, `recreate` on release: an
 *   agent's edits never reach another chain), no network, every capability dropped, seccomp, the task's memory and
 *   CPUs (default 1 GiB, 1 CPU), 256 processes. Actions go to a `sh` supervisor, the container's main process, over
 *   its attached stdio (`transport: "attach"`, default), or one engine `exec` each (`"exec"`), in the task's working
 *   directory.
 * - **Verifier** (Harbor's contract): after the episode the task's `tests/` are copied to `/tests`, `test.sh` runs
 *   (bash, else sh) within the task's verifier timeout, and the reward is the number in
 *   `/logs/verifier/reward.txt` (or `reward.json`'s `reward`). A verifier that writes neither fails typed.
 *
 * @since 0.1.0
 */
import { NodeServices } from "@effect/platform-node"
import { Context, Effect, Scope, Semaphore } from "effect"
import { existsSync } from "node:fs"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as Docker from "../../actors/resources/Docker.ts"
import * as Environment from "../../src/Environment.ts"
import * as Resource from "../../src/Resource.ts"
import * as HarborTask from "./HarborTask.ts"

// ===== Models =====

/**
 * Settings of the workspaces of a run.
 *
 * @category models
 * @since 0.1.0
 */
export interface Settings {
  /** Where rows' relative `task` paths are resolved (default: the working directory). */
  readonly root: string
  /** Most containers at once, over every task (default 16). */
  readonly pool: number
  /** Per `shell` call (default 10 s). */
  readonly shellTimeoutMillis: number
  /** Characters of a command's output or a file the agent is shown (default 2,000). */
  readonly maxOutputChars: number
  /** Actions before the episode ends (default 12). */
  readonly maxSteps: number
  /**
   * How actions reach the container (default `attach`): `attach` sends each as a line to a small `sh` supervisor,
   * the container's main process, over its attached stdio (no engine work per action; the image needs `base64`
   * and `timeout`, as coreutils and busybox have); `exec` makes one engine exec per action (≈ 100 ms of the
   * engine's CPU each).
   */
  readonly transport: "attach" | "exec"
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaultSettings: Settings = {
  root: ".",
  pool: 16,
  shellTimeoutMillis: 10_000,
  maxOutputChars: 2_000,
  maxSteps: 12,
  transport: "attach"
}

/**
 * What the verifier said.
 *
 * @category models
 * @since 0.1.0
 */
export interface Verdict {
  readonly reward: number
  readonly exitCode: number
  /** The end of the verifier's output (stdout and stderr), for the trajectory's record. */
  readonly output: string
}

/**
 * A chain's workspace.
 *
 * @category services
 * @since 0.1.0
 */
export class Workspace extends Context.Service<Workspace, {
  readonly settings: Settings
  /** `sh -c cmd` in the working directory: `exit N` and the output, cut to `maxOutputChars`. */
  readonly shell: (cmd: string) => Effect.Effect<string, Environment.EnvError>
  readonly read: (path: string) => Effect.Effect<string, Environment.EnvError>
  /** Replaces the one occurrence of `old` in the file by `replacement`. */
  readonly edit: (path: string, old: string, replacement: string) => Effect.Effect<string, Environment.EnvError>
  readonly submit: Effect.Effect<string, Environment.EnvError>
  /** The working directory and its files (`ls -R`, the first 40 lines), not counted as a step. */
  readonly overview: Effect.Effect<string, Environment.EnvError>
  readonly state: Effect.Effect<{ readonly steps: number; readonly submitted: boolean }>
  /** Runs the task's verifier in the container. */
  readonly verify: Effect.Effect<Verdict, Environment.EnvError>
}>()("agentfly/environments/swe/Workspace") {}

// ===== Images =====

const building = new Map<string, Promise<void>>()

/**
 * The image of a task's environment, built once per digest (concurrent chains wait for one build).
 *
 * @category constructors
 * @since 0.1.0
 */
export const image = (task: HarborTask.HarborTask): Effect.Effect<string, Environment.EnvError, Docker.DockerEngine> =>
  Effect.flatMap(Docker.DockerEngine, ({ docker }) => {
    const tag = `agentfly-harbor/${task.digest}:1`
    const fail = (message: string) =>
      Environment.envError(`harbor:${task.name}`, "build", "Unavailable", message)
    const build = async () => {
      const exists = await docker.getImage(tag).inspect().then(() => true, () => false)
      if (exists) return
      const stream = await docker.buildImage(
        { context: `${task.folder}/environment`, src: [...task.environment] },
        { t: tag, rm: true, forcerm: true }
      )
      await new Promise<void>((done, reject) =>
        docker.modem.followProgress(stream, (error, output: Array<{ error?: string; errorDetail?: unknown }>) => {
          const failed = output?.find((o) => o.error !== undefined)
          if (error !== null || failed !== undefined) reject(new Error(String(failed?.error ?? error)))
          else done()
        })
      )
    }
    return Effect.tryPromise({
      try: () => {
        let pending = building.get(tag)
        if (pending === undefined) {
          pending = build()
          building.set(tag, pending)
          pending.catch(() => building.delete(tag))
        }
        return pending
      },
      catch: (e) => fail(`building ${task.folder}/environment: ${e instanceof Error ? e.message : String(e)}`)
    }).pipe(Effect.as(tag))
  })

// ===== Workspaces =====

/** `text` cut to `max` characters, saying how much was left out. */
const cut = (text: string, max: number) =>
  text.length <= max ? text : `${text.slice(0, max)}\n[… ${text.length - max} more characters]`

/** Single-quoted for `sh`. */
const quote = (s: string) => `'${s.replace(/'/g, `'"'"'`)}'`

/**
 * The chain's container, leased when the chain first acts (`Effect.cached`): a chain that never acts starts none,
 * and the start-up check's probe chain (a row without a task) gets a workspace whose actions fail.
 *
 * @category models
 * @since 0.1.0
 */
export type Ready = Effect.Effect<
  { readonly task: HarborTask.HarborTask; readonly lease: ResourceManager.Lease<Docker.Container> },
  Environment.EnvError
>

/** One chain's workspace: its container, settings, and the steps taken so far. */
interface State {
  readonly ready: Ready
  readonly settings: Settings
  steps: number
  submitted: boolean
}

const exec = (state: State, cmd: ReadonlyArray<string>, options: Docker.ExecOptions = {}) =>
  Effect.flatMap(state.ready, ({ lease, task }) =>
    lease.use((c) => (c.stdio === undefined ? c.exec(cmd, options) : attached(c.stdio, task.name, cmd, options))).pipe(
      Effect.mapError((e) =>
        e instanceof Environment.EnvError
          ? e
          : Environment.envError(`harbor:${task.name}`, "exec", "Unavailable", e.message, { cause: e })
      )
    ))

const invalid = (state: State, method: string, message: string) =>
  Effect.flatMap(state.ready, ({ task }) =>
    Effect.fail(Environment.envError(`harbor:${task.name}`, method, "InvalidAction", message)))

/** Counts one step of `method`, or fails when the work was submitted or no steps are left. */
const step = (state: State, method: string) =>
  Effect.suspend(() => {
    if (state.submitted) return invalid(state, method, "the work was submitted")
    if (state.steps >= state.settings.maxSteps) {
      return invalid(state, method, `no steps left (${state.settings.maxSteps})`)
    }
    state.steps++
    return Effect.void
  })

const readFile = (state: State, path: string) =>
  Effect.flatMap(exec(state, ["cat", "--", path], { maxOutputBytes: 1 << 20 }), (r) =>
    r.exitCode === 0
      ? Effect.succeed(r.stdout)
      : invalid(state, "read", `cannot read ${path}: ${(r.stderr || r.stdout).trim().replace(/^cat: /, "")}`))

const edit = Effect.fnUntraced(function*(state: State, path: string, old: string, replacement: string) {
  yield* step(state, "edit")
  if (old.length === 0) return yield* invalid(state, "edit", "old is empty: give the exact text to replace")
  const text = yield* readFile(state, path)
  const first = text.indexOf(old)
  if (first === -1) return yield* invalid(state, "edit", `the text to replace is not in ${path}`)
  if (text.indexOf(old, first + 1) !== -1) {
    return yield* invalid(state, "edit", `the text to replace occurs more than once in ${path}: give more of it`)
  }
  const next = text.slice(0, first) + replacement + text.slice(first + old.length)
  const written = yield* exec(state, ["sh", "-c", `cat > ${quote(path)}`], { stdin: next })
  if (written.exitCode !== 0) {
    return yield* invalid(state, "edit", `cannot write ${path}: ${(written.stderr || written.stdout).trim()}`)
  }
  return `edited ${path}`
})

const verify = Effect.fnUntraced(function*(state: State) {
  const { task } = yield* state.ready
  // One exec (the engine spends ≈ 100 ms of CPU on each): the tests written from base64, the verifier run,
  // its exit code and the reward file printed after a marker.
  const run = yield* exec(state, ["sh", "-s"], {
    stdin: verifierScript(task),
    timeoutMillis: task.verifierTimeoutMillis,
    maxOutputBytes: 256 * 1024
  })
  const at = run.stdout.lastIndexOf(marker)
  const tail = at === -1 ? "" : run.stdout.slice(at + marker.length)
  const [exitLine = "", ...rest] = tail.replace(/^\n/, "").split("\n")
  const exitCode = Number(exitLine)
  const output = `${at === -1 ? run.stdout : run.stdout.slice(0, at)}${run.stderr}`.slice(-2_000)
  const reward = parseReward(rest.join("\n"))
  if (reward === undefined) {
    return yield* Environment.envError(
      `harbor:${task.name}`,
      "verify",
      "Crashed",
      `the verifier (exit ${at === -1 ? run.exitCode : exitCode}) wrote no reward to /logs/verifier/reward.txt: ` +
        output.slice(-300)
    )
  }
  return { reward, exitCode, output }
})

/**
 * The workspace over the chain's (lazily leased) container.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (ready: Ready, settings: Settings): Workspace["Service"] => {
  const state: State = { ready, settings, steps: 0, submitted: false }
  return {
    settings,
    shell: (cmd) =>
      Effect.andThen(
        step(state, "shell"),
        Effect.map(
          exec(state, ["sh", "-c", cmd], { timeoutMillis: settings.shellTimeoutMillis, maxOutputBytes: 64 * 1024 }),
          (r) => cut(`exit ${r.exitCode}\n${r.stdout}${r.stderr}`, settings.maxOutputChars)
        )
      ),
    read: (path) =>
      Effect.andThen(
        step(state, "read"),
        Effect.map(readFile(state, path), (text) => cut(text, settings.maxOutputChars))
      ),
    edit: (path, old, replacement) => edit(state, path, old, replacement),
    submit: Effect.andThen(step(state, "submit"), Effect.sync(() => {
      state.submitted = true
      return "submitted"
    })),
    overview: Effect.flatMap(ready, ({ task }) =>
      Effect.map(
        exec(state, ["sh", "-c", "ls -R . | head -40"], { timeoutMillis: settings.shellTimeoutMillis }),
        (r) => cut(`Working directory ${task.workdir}:\n${r.stdout}`, settings.maxOutputChars)
      )),
    state: Effect.sync(() => ({ steps: state.steps, submitted: state.submitted })),
    verify: verify(state)
  }
}

// ===== The attach transport =====

/**
 * The container's main process with the `attach` transport: one request a line (`id timeout command stdin`, the
 * last two base64), run in a subshell in the working directory under `timeout`, stdout and stderr together in a file
 * that is answered as one line (`id exit output`, the output's first 64 KiB base64). One request at a time: a
 * chain acts in turn.
 */
const supervisor = (workdir: string) =>
  [
    "while IFS=' ' read -r id t c i; do",
    "  printf '%s' \"$c\" | base64 -d > /tmp/.agentfly-cmd",
    "  if [ \"$i\" = - ]; then : > /tmp/.agentfly-in; else printf '%s' \"$i\" | base64 -d > /tmp/.agentfly-in; fi",
    `  (cd ${quote(workdir)} && timeout -k 1 "$t" sh /tmp/.agentfly-cmd < /tmp/.agentfly-in > /tmp/.agentfly-out 2>&1)`,
    "  code=$?",
    "  printf '%s %s ' \"$id\" \"$code\"; head -c 65536 /tmp/.agentfly-out | base64 | tr -d '\\n'; printf '\\n'",
    "done"
  ].join("\n")

let nextRequest = 0

/** The pending requests of each channel, answered by one line handler installed with the first request. */
const pendingOf = new WeakMap<Docker.LineChannel, Map<string, (line: string | undefined) => void>>()

const pending = (channel: Docker.LineChannel) => {
  let map = pendingOf.get(channel)
  if (map !== undefined) return map
  const requests = new Map<string, (line: string | undefined) => void>()
  channel.onLine((line) => {
    const id = line.slice(0, line.indexOf(" "))
    const resume = requests.get(id)
    if (resume === undefined) return
    requests.delete(id)
    resume(line)
  })
  channel.onClose(() => {
    for (const resume of requests.values()) resume(undefined)
    requests.clear()
  })
  pendingOf.set(channel, (map = requests))
  return map
}

/** One action over the supervisor: the same result as an exec (stdout and stderr together in `stdout`). */
const attached = (
  channel: Docker.LineChannel,
  name: string,
  cmd: ReadonlyArray<string>,
  options: Docker.ExecOptions
): Effect.Effect<Docker.ExecResult, Environment.EnvError> => {
  const env = `harbor:${name}`
  const seconds = Math.max(1, Math.ceil((options.timeoutMillis ?? 600_000) / 1000))
  const b64 = (text: string) => (text.length === 0 ? "-" : Buffer.from(text).toString("base64"))
  const id = `r${nextRequest++}`
  const request = `${id} ${seconds} ${b64(cmd.map(quote).join(" "))} ${b64(options.stdin ?? "")}`
  const fail = (reason: "Crashed" | "Timeout", message: string) =>
    Environment.envError(env, "exec", reason, message)
  return Effect.callback<Docker.ExecResult, Environment.EnvError>((resume) => {
    if (!channel.isOpen()) return resume(Effect.fail(fail("Crashed", "the container's stdio closed")))
    const requests = pending(channel)
    requests.set(id, (line) => {
      if (line === undefined) return resume(Effect.fail(fail("Crashed", "the container's stdio closed")))
      const [, code, output = ""] = line.split(" ")
      const text = Buffer.from(output, "base64").toString("utf8").slice(0, options.maxOutputBytes ?? 1 << 20)
      resume(Effect.succeed({ stdout: text, stderr: "", exitCode: Number(code) }))
    })
    channel.send(request)
    return Effect.sync(() => void requests.delete(id))
  }).pipe(
    Effect.timeoutOrElse({
      duration: seconds * 1000 + 5_000,
      orElse: () => Effect.fail(fail("Crashed", "the container stopped answering"))
    }),
    Effect.flatMap((r) =>
      r.exitCode === 124 || r.exitCode === 137
        ? Effect.fail(fail("Timeout", `exceeded ${options.timeoutMillis} ms`))
        : Effect.succeed(r)
    )
  )
}

const marker = "\n@@agentfly-verifier@@"

/** The shell script of a verification: the tests written, `test.sh` run, its exit code and the reward printed. */
const verifierScript = (task: HarborTask.HarborTask): string =>
  [
    "mkdir -p /logs/verifier /tests",
    ...[...task.tests].map(([file, contents]) => {
      const path = quote(`/tests/${file}`)
      const encoded = Buffer.from(contents).toString("base64")
      return `mkdir -p "$(dirname ${path})" && printf '%s' '${encoded}' | base64 -d > ${path}`
    }),
    `cd ${quote(task.workdir)}`,
    "if command -v bash >/dev/null; then bash /tests/test.sh; else sh /tests/test.sh; fi",
    "code=$?",
    `printf '${marker.replace("\n", "\\n")}\\n%s\\n' "$code"`,
    "cat /logs/verifier/reward.txt 2>/dev/null || cat /logs/verifier/reward.json 2>/dev/null",
    ""
  ].join("\n")

/**
 * A verifier's reward file: a number (`reward.txt`), or JSON with a numeric `reward` (`reward.json`).
 *
 * @category getters
 * @since 0.1.0
 */
export const parseReward = (text: string): number | undefined => {
  const trimmed = text.trim()
  if (trimmed.length === 0) return undefined
  if (/^-?\d+(\.\d+)?([eE][-+]?\d+)?$/.test(trimmed)) return Number(trimmed)
  try {
    const json = JSON.parse(trimmed) as { reward?: unknown }
    return typeof json.reward === "number" && Number.isFinite(json.reward) ? json.reward : undefined
  } catch {
    return undefined
  }
}

/**
 * The resource spec of a task's containers.
 *
 * @category constructors
 * @since 0.1.0
 */
export const spec = (task: HarborTask.HarborTask, tag: string, settings: Settings) =>
  Resource.make({
    name: `harbor-${task.digest}`,
    kind: "docker",
    image: tag,
    limits: {
      network: "none",
      readOnlyRoot: false,
      tmpfs: { "/tmp": 64 * 1024 * 1024 },
      user: "0:0",
      memoryBytes: task.memoryBytes ?? 1 << 30,
      cpus: task.cpus ?? 1,
      pids: 256
    },
    pool: { max: settings.pool },
    timeouts: { acquireMillis: 300_000, startMillis: 60_000 },
    resetPolicy: "recreate",
    scope: "chain"
  })

/** The provider's state: the run's task folders read and their containers' resources, by path and by digest. */
interface Catalog {
  readonly settings: Settings
  readonly manager: ResourceManager.ResourceManager["Service"]
  readonly engine: Docker.DockerEngine["Service"]
  readonly launchers: Map<string, Resource.Resource<Docker.Container>>
  readonly tasks: Map<string, HarborTask.HarborTask>
  readonly lock: Semaphore.Semaphore
}

/** A task's resource (its image built on first use), one per task digest. */
const resourceOf = (catalog: Catalog, task: HarborTask.HarborTask) =>
  catalog.lock.withPermits(1)(Effect.gen(function*() {
    const known = catalog.launchers.get(task.digest)
    if (known !== undefined) return known
    const tag = yield* image(task)
    const s = yield* Effect.orDie(spec(task, tag, catalog.settings))
    const launcher = yield* Docker.launcher(
      catalog.settings.transport === "attach"
        ? { cmd: ["sh", "-c", supervisor(task.workdir)], workingDir: task.workdir, attachStdio: true }
        : { cmd: ["sleep", "infinity"], workingDir: task.workdir }
    )
    const resource = Resource.resource(s, launcher)
    catalog.launchers.set(task.digest, resource)
    return resource
  })).pipe(Effect.provideService(Docker.DockerEngine, catalog.engine))

// A row's task may come from another machine (a rollout worker's share): `loadRow` keeps it, and every file of
// its folder, inside the root before anything is read, built or run.
const taskOf = (catalog: Catalog, path: string) =>
  Effect.suspend(() => {
    const known = catalog.tasks.get(path)
    if (known !== undefined) return Effect.succeed(known)
    return HarborTask.loadRow(catalog.settings.root, path).pipe(
      Effect.provide(NodeServices.layer),
      Effect.tap((t) => Effect.sync(() => catalog.tasks.set(path, t))),
      Effect.mapError((e) =>
        Environment.envError("harbor", "load", "ResetFailed", `${e.folder}: ${e.message}`, { cause: e })
      )
    )
  })

/** A chain's task and its container's lease, in the chain's `scope`. */
const setupChain = (catalog: Catalog, chain: Environment.ChainInfo, scope: Scope.Scope) =>
  Effect.gen(function*() {
    const path = chain.row?.["task"]
    if (typeof path !== "string") {
      const message = "the row has no task folder (a `task` field)"
      return yield* Environment.envError("harbor", "load", "ResetFailed", message)
    }
    const task = yield* taskOf(catalog, path)
    const resource = yield* resourceOf(catalog, task)
    // In the chain's scope: the container goes back (and is recreated) when the chain ends.
    const lease = yield* Scope.provide(catalog.manager.acquire(resource, chain), scope).pipe(
      Effect.mapError((e) =>
        Environment.envError(`harbor:${task.name}`, "lease", "Unavailable", e.message, { cause: e })
      )
    )
    return { task, lease }
  })

/** The pools' figures over every task's pool: counts add up, waits take the worst. */
const poolFigures = (catalog: Catalog) =>
  Effect.gen(function*() {
    const figures: Record<string, number> = {}
    for (const resource of catalog.launchers.values()) {
      const stats = yield* catalog.manager.stats(resource.spec.name)
      if (stats === undefined) continue
      for (const [k, v] of Object.entries(ResourceManager.poolFigures("harbor", stats))) {
        figures[k] = k.includes("_ms") ? Math.max(figures[k] ?? 0, v) : (figures[k] ?? 0) + v
      }
    }
    return figures
  })

// Every chain runs in a container: an engine that is down fails the run here, saying so, not each chain.
const ping = (engine: Docker.DockerEngine["Service"]) =>
  engine.ping.pipe(
    Effect.mapError((e) =>
      Environment.envError(e.env, e.method, e.reason._tag, `the swe task runs each chain in a container: ${e.message}`)
    )
  )

/**
 * The task's provider: for each chain, its row's task folder (`row.task`, resolved against `settings.root`), the
 * folder's image and a container of it from the resource manager, as the chain's {@link Workspace}. A folder is
 * read and its image built once per run (or machine); a bad folder fails the chain's lease with its reason, and so
 * does a row whose folder or any of its files leads out of the root (`HarborTask.loadRow`: `../`, an absolute
 * path, a symbolic link out).
 *
 * @category constructors
 * @since 0.1.0
 */
export const provider = (
  settings: Settings
): Effect.Effect<
  Environment.Provider<Workspace>,
  Environment.EnvError,
  ResourceManager.ResourceManager | Docker.DockerEngine | Scope.Scope
> =>
  Effect.gen(function*() {
    // A root that is not there fails the run at its start, not every chain after a warm-up.
    if (!existsSync(settings.root)) {
      return yield* Environment.envError(
        "harbor",
        "provider",
        "ResetFailed",
        `the task folders' root ${settings.root} does not exist (task option root: relative to the config ` +
          `file; the working directory when unset)`
      )
    }
    const manager = yield* ResourceManager.ResourceManager
    const engine = yield* Docker.DockerEngine
    yield* ping(engine)
    const catalog: Catalog = {
      settings,
      manager,
      engine,
      launchers: new Map(),
      tasks: new Map(),
      lock: yield* Semaphore.make(1)
    }
    return Environment.make<Workspace>(
      "perChain",
      (chain) =>
        Effect.gen(function*() {
          const setup = setupChain(catalog, chain, yield* Effect.scope)
          return Context.make(Workspace, make(yield* Effect.cached(setup), settings))
        }),
      poolFigures(catalog)
    )
  })
