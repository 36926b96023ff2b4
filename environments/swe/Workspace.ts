/**
 * A chain's SWE workspace: a Docker container of its Harbor task's environment, leased from the resource manager
 * for the chain's episode, with the actions the tools take (`shell`, `read`, `edit`, `submit`) and the verifier the
 * reward runs.
 *
 * - **Images** (`HarborImage`). A task's `environment/` is built once per machine with the engine's builder (its
 *   `FROM` must be an image the engine has or can pull, e.g. the project's `agentfly/python:1`) within
 *   `[environment] build_timeout_sec`, tagged by the digest of its files, so tasks with the same environment share
 *   an image and a second run builds nothing; `[environment] docker_image` names a prebuilt image instead (local,
 *   else pulled).
 *   An image that cannot be had fails with its name and the engine's reason ({@link prepare} checks a run's tasks
 *   before any chain starts).
 * - **Containers.** One per chain (`Resource` spec `harbor-<digest>`, scope `chain`, `recreate` on release: an
 *   agent's edits never reach another chain), no network but the run's allow-list (`allowHosts`, default none,
 *   for tasks that allow the internet: `Docker.ContainerOptions.allowHosts`), every capability
 *   dropped, seccomp, the task's memory and CPUs (Harbor's defaults: 2,048 MB, 1 CPU), 256 processes, the image's
 *   `USER` (or `[agent] user`) and `WORKDIR` (or `[environment] workdir`), `[environment.env]` in its environment.
 *   Actions go to a `sh` supervisor, the container's main process, over its attached stdio (`transport:
 *   "attach"`, default), or one engine `exec` each (`"exec"`), in the working directory. `/tests`, `/solution` and
 *   `/logs` are tmpfs every user may write. After `[agent] timeout_sec` every action is refused.
 * - **Verifier** (Harbor's contract): after the episode `/tests` and `/logs/verifier` are emptied, the task's
 *   `tests/` uploaded byte for byte, and `/tests/test.sh` executed as a file (its shebang decides the shell; one
 *   without is run by `sh`) from the working directory with `[verifier.env]`, as `[verifier] user` if set, within
 *   the verifier timeout. The reward is `/logs/verifier/reward.txt`'s number, or `reward.json`'s keys
 *   ({@link rewardsOf}, {@link trainingReward}). A verifier that writes neither fails typed.
 *
 * @since 0.1.0
 */
import { NodeServices } from "@effect/platform-node"
import { Clock, Context, Effect, Scope, Semaphore } from "effect"
import { createHash } from "node:crypto"
import { existsSync } from "node:fs"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as Docker from "../../actors/resources/Docker.ts"
import * as Environment from "../../src/Environment.ts"
import * as Resource from "../../src/Resource.ts"
import * as HarborImage from "./HarborImage.ts"
import * as HarborSteps from "./HarborSteps.ts"
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
  /** The training key of a multi-key `reward.json` where a task's `[metadata] reward_key` is unset. */
  readonly rewardKey?: string | undefined
  /**
   * The run's network allow-list (default none): the hosts (IPv4 addresses or names) the containers of tasks that
   * allow the internet (`[environment] allow_internet`, Harbor's default true) may reach, e.g. a package mirror or a
   * proxy; nothing else is reachable. A task that forbids the internet gets none.
   */
  readonly allowHosts?: ReadonlyArray<string> | undefined
  /**
   * A shell command run as root in a layer over every task's image at build time (default none): what verifiers
   * install at verify time, baked in so that they run offline (`HarborImage.baked`).
   */
  readonly bake?: string | undefined
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
  /** The training reward ({@link trainingReward} of `rewards`). */
  readonly reward: number
  /** Every key the verifier wrote (`reward` alone for `reward.txt`). */
  readonly rewards: Readonly<Record<string, number>>
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
  readonly state: Effect.Effect<{ readonly steps: number; readonly submitted: boolean; readonly timedOut: boolean }>
  /** Runs the task's verifier in the container. */
  readonly verify: Effect.Effect<Verdict, Environment.EnvError>
}>()("agentfly/environments/swe/Workspace") {}

// ===== Images =====

/**
 * Checks that every task's image can be had (building or pulling it), before any chain starts: an engine that does
 * not answer is said as the provider says it, and the first image that cannot be had fails with its name and the
 * reason.
 *
 * @category constructors
 * @since 0.1.0
 */
export const prepare = (
  tasks: ReadonlyArray<HarborTask.HarborTask>
): Effect.Effect<void, Environment.EnvError, Docker.DockerEngine> =>
  Effect.andThen(
    Effect.flatMap(Docker.DockerEngine, (engine) => ping(engine)),
    Effect.forEach(tasks, (task) => Effect.flatMap(HarborImage.image(task), (tag) => HarborImage.identity(task, tag)), {
      discard: true
    })
  )

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
  {
    readonly task: HarborTask.HarborTask
    readonly lease: ResourceManager.Lease<Docker.Container>
    readonly identity: HarborImage.Identity
  },
  Environment.EnvError
>

/** One chain's workspace: its container, settings, the steps taken so far and when its first action came. */
interface State {
  readonly ready: Ready
  readonly settings: Settings
  steps: number
  submitted: boolean
  startedAt: number | undefined
  timedOut: boolean
  /** A multi-step task's current step, the results of those verified, whether the trial stops, the last run. */
  stepIndex: number
  readonly stepResults: Array<HarborSteps.StepResult>
  stopped: boolean
  lastRun: { readonly exitCode: number; readonly output: string } | undefined
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

/**
 * Counts one step of `method`, or fails when the work was submitted, no steps are left, or the task's agent
 * timeout (`[agent] timeout_sec`, from the first action) has passed.
 */
const step = (state: State, method: string) =>
  Effect.gen(function*() {
    if (state.submitted) return yield* invalid(state, method, "the work was submitted")
    if (state.steps >= state.settings.maxSteps) {
      return yield* invalid(state, method, `no steps left (${state.settings.maxSteps})`)
    }
    const { task } = yield* state.ready
    const now = yield* Clock.currentTimeMillis
    state.startedAt ??= now
    const allowed = task.steps[state.stepIndex]?.agentTimeoutMillis ?? task.agentTimeoutMillis
    if (now - state.startedAt > allowed) {
      state.timedOut = true
      const limit = allowed / 1000
      return yield* invalid(state, method, `the agent's time is up ([agent] timeout_sec ${limit})`)
    }
    state.steps++
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

/** What one verifier run is given: the tests, the env, the time limit (the task's, or a step's). */
interface Verification {
  readonly tests: ReadonlyMap<string, Uint8Array>
  readonly env: Readonly<Record<string, string>>
  readonly timeoutMillis: number
}

/** The verification of a single-step task, or of a multi-step task's current step. */
const verificationOf = (task: HarborTask.HarborTask, state: State): Verification => {
  const step = task.steps[state.stepIndex]
  return step === undefined
    ? { tests: task.tests, env: task.env.verifier, timeoutMillis: task.verifierTimeoutMillis }
    : { tests: step.tests, env: step.verifierEnv, timeoutMillis: step.verifierTimeoutMillis }
}

/** One verifier run: every key it wrote and the training reward of them. */
const runVerifier = Effect.fnUntraced(function*(state: State) {
  const { task, lease, identity: who } = yield* state.ready
  const verification = verificationOf(task, state)
  // One exec (the engine spends ≈ 100 ms of CPU on each): the tests written from base64, the verifier run,
  // its exit code and the reward file printed after a marker. A verifier user other than the container's runs as
  // an engine exec as that user (the files are written world-readable on a tmpfs every user may write).
  const options = {
    stdin: verifierScript(verification, who),
    timeoutMillis: verification.timeoutMillis,
    maxOutputBytes: 256 * 1024
  }
  const run = task.verifierUser === undefined || task.verifierUser === who.user
    ? yield* exec(state, ["sh", "-s"], options)
    : yield* lease.use((c) => c.exec(["sh", "-s"], { ...options, user: task.verifierUser! })).pipe(
      Effect.mapError((e) =>
        e instanceof Environment.EnvError
          ? e
          : Environment.envError(`harbor:${task.name}`, "verify", "Unavailable", e.message, { cause: e })
      )
    )
  const at = run.stdout.lastIndexOf(marker)
  const tail = at === -1 ? "" : run.stdout.slice(at + marker.length)
  const [exitLine = "", ...rest] = tail.replace(/^\n/, "").split("\n")
  const exitCode = Number(exitLine)
  const output = `${at === -1 ? run.stdout : run.stdout.slice(0, at)}${run.stderr}`.slice(-2_000)
  const rewards = rewardsOf(rest.join("\n"))
  if (rewards === undefined) {
    return yield* Environment.envError(
      `harbor:${task.name}`,
      "verify",
      "Crashed",
      `the verifier (exit ${at === -1 ? run.exitCode : exitCode}) wrote no reward to /logs/verifier/reward.txt ` +
        `or reward.json: ` + output.slice(-300)
    )
  }
  const reward = trainingReward(rewards, task.rewardKey ?? state.settings.rewardKey)
  if (typeof reward === "string") return yield* Environment.envError(`harbor:${task.name}`, "verify", "Crashed", reward)
  return { reward, rewards, exitCode, output }
})

/**
 * The verdict at the episode's end: the task's verifier; for a multi-step task, the current step verified (when
 * the episode ended before its `submit`) and the trial reward of every step's (`HarborSteps`).
 */
const verify = Effect.fnUntraced(function*(state: State) {
  const { task } = yield* state.ready
  if (task.steps.length === 0) return yield* runVerifier(state)
  let last = state.lastRun
  if (!state.submitted) last = yield* verifyStep(state)
  const reward = HarborSteps.trialReward(task, state.stepResults)
  return {
    reward,
    rewards: HarborSteps.figures(state.stepResults),
    exitCode: last?.exitCode ?? 0,
    output: last?.output ?? ""
  }
})

/** Verifies a multi-step task's current step and records it; true in `stop` when the trial stops there. */
const verifyStep = Effect.fnUntraced(function*(state: State) {
  const { task } = yield* state.ready
  const run = yield* runVerifier(state)
  const step = task.steps[state.stepIndex]!
  const result = { name: step.name, reward: run.reward, rewards: run.rewards }
  state.stepResults.push(result)
  state.lastRun = run
  state.stopped = HarborSteps.stops(step, result) || state.stepIndex + 1 >= task.steps.length
  return run
})

/**
 * `submit`: the work is done. A multi-step task's step is verified at once: the trial goes on with the next step's
 * instruction as the answer (the agent is not shown the step's reward, as in Harbor), or ends (the last step, or a
 * reward below the step's `min_reward`).
 */
const submit = Effect.fnUntraced(function*(state: State) {
  yield* step(state, "submit")
  const { task } = yield* state.ready
  if (task.steps.length === 0) {
    state.submitted = true
    return "submitted"
  }
  const done = task.steps[state.stepIndex]!
  yield* verifyStep(state)
  if (state.stopped) {
    state.submitted = true
    return state.stepIndex + 1 >= task.steps.length
      ? `submitted: step ${done.name} was the last`
      : `submitted: the task stops after step ${done.name}`
  }
  state.stepIndex++
  state.startedAt = undefined
  const next = task.steps[state.stepIndex]!
  return `Step ${done.name} is done. Next step, ${next.name}:\n${next.instruction}`
})

/**
 * The workspace over the chain's (lazily leased) container.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (ready: Ready, settings: Settings): Workspace["Service"] => {
  const state: State = {
    ready,
    settings,
    steps: 0,
    submitted: false,
    startedAt: undefined,
    timedOut: false,
    stepIndex: 0,
    stepResults: [],
    stopped: false,
    lastRun: undefined
  }
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
    submit: submit(state),
    overview: Effect.flatMap(ready, ({ identity: who }) =>
      Effect.map(
        exec(state, ["sh", "-c", "ls -R . | head -40"], { timeoutMillis: settings.shellTimeoutMillis }),
        (r) => cut(`Working directory ${who.workdir}:\n${r.stdout}`, settings.maxOutputChars)
      )),
    state: Effect.sync(() => ({ steps: state.steps, submitted: state.submitted, timedOut: state.timedOut })),
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

/** `sh` lines writing `files` (bytes, base64 in the script) under `dir`, emptied first. */
export const uploadLines = (dir: string, files: ReadonlyMap<string, Uint8Array>): Array<string> => [
  `mkdir -p ${quote(dir)} && find ${quote(dir)} -mindepth 1 -delete 2>/dev/null`,
  ...[...files].map(([file, contents]) => {
    const path = quote(`${dir}/${file}`)
    const encoded = Buffer.from(contents).toString("base64")
    return `mkdir -p "$(dirname ${path})" && printf '%s' '${encoded}' | base64 -d > ${path}`
  })
]

/** `export K='V'` lines of an env table. */
export const exportLines = (env: Readonly<Record<string, string>>): Array<string> =>
  Object.entries(env).map(([k, v]) => `export ${k}=${quote(v)}`)

/**
 * The shell script of a verification: `/tests` and `/logs/verifier` emptied, the tests written byte for byte,
 * `test.sh` executed as a file with `[verifier.env]`, its exit code and the reward file printed.
 */
const verifierScript = (verification: Verification, who: HarborImage.Identity): string =>
  [
    ...uploadLines("/tests", verification.tests),
    "mkdir -p /logs/verifier && find /logs/verifier -mindepth 1 -delete 2>/dev/null",
    "chmod -R a+rX /tests; chmod a+x /tests/test.sh",
    ...exportLines(verification.env),
    `cd ${quote(who.workdir)}`,
    "/tests/test.sh",
    "code=$?",
    `printf '${marker.replace("\n", "\\n")}\\n%s\\n' "$code"`,
    "cat /logs/verifier/reward.txt 2>/dev/null || cat /logs/verifier/reward.json 2>/dev/null",
    ""
  ].join("\n")

/**
 * A verifier's rewards, as Harbor reads them: `reward.txt`'s number as `{ reward }`, or `reward.json`'s numeric
 * keys (any names: Harbor's multi-reward verifiers write e.g. `{ correctness, performance }`; booleans count 1 / 0).
 * `undefined` when the text is neither, or the JSON holds no number.
 *
 * @category getters
 * @since 0.1.0
 */
export const rewardsOf = (text: string): Readonly<Record<string, number>> | undefined => {
  const trimmed = text.trim()
  if (trimmed.length === 0) return undefined
  if (/^-?\d+(\.\d+)?([eE][-+]?\d+)?$/.test(trimmed)) return { reward: Number(trimmed) }
  try {
    const json = JSON.parse(trimmed) as unknown
    if (typeof json !== "object" || json === null || Array.isArray(json)) return undefined
    const out: Record<string, number> = {}
    for (const [key, value] of Object.entries(json)) {
      if (typeof value === "number" && Number.isFinite(value)) out[key] = value
      else if (typeof value === "boolean") out[key] = value ? 1 : 0
    }
    return Object.keys(out).length === 0 ? undefined : out
  } catch {
    return undefined
  }
}

/**
 * The training reward of a verifier's rewards: the key the task (`[metadata] reward_key`) or the run (option
 * `rewardKey`) names; else `reward` when the verifier wrote it; else the mean of every key. A named key the
 * verifier did not write is a sentence naming it and the keys it wrote.
 *
 * @category getters
 * @since 0.1.0
 */
export const trainingReward = (
  rewards: Readonly<Record<string, number>>,
  key: string | undefined
): number | string => {
  if (key !== undefined) {
    const value = rewards[key]
    return value !== undefined
      ? value
      : `the reward key ${key} is not among the verifier's (${Object.keys(rewards).join(", ")})`
  }
  if (rewards["reward"] !== undefined) return rewards["reward"]
  const values = Object.values(rewards)
  return values.reduce((a, b) => a + b, 0) / values.length
}

/**
 * A verifier's single reward ({@link rewardsOf} and {@link trainingReward} without a key).
 *
 * @category getters
 * @since 0.1.0
 */
export const parseReward = (text: string): number | undefined => {
  const rewards = rewardsOf(text)
  if (rewards === undefined) return undefined
  const reward = trainingReward(rewards, undefined)
  return typeof reward === "number" ? reward : undefined
}

/**
 * The resource spec of a task's containers.
 *
 * @category constructors
 * @since 0.1.0
 */
export const spec = (task: HarborTask.HarborTask, tag: string, settings: Settings, who: HarborImage.Identity) =>
  Resource.make({
    name: `harbor-${containerKey(task)}`,
    kind: "docker",
    image: tag,
    limits: {
      network: "none",
      readOnlyRoot: false,
      tmpfs: { "/tmp": 64 * 1024 * 1024 },
      user: who.user,
      memoryBytes: task.memoryBytes,
      cpus: task.cpus,
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
  readonly launchers: Map<
    string,
    { readonly resource: Resource.Resource<Docker.Container>; readonly identity: HarborImage.Identity }
  >
  readonly tasks: Map<string, HarborTask.HarborTask>
  readonly lock: Semaphore.Semaphore
}

/**
 * What tells tasks' containers apart: the image (the environment's digest) and what a container is started with
 * (`[environment.env]`, `[agent] user`, `[environment] workdir`, whether the allow-list applies): tasks alike in
 * all share a pool.
 */
const containerKey = (task: HarborTask.HarborTask): string => {
  const started = task.agentUser === undefined && task.workdir === undefined &&
      Object.keys(task.env.environment).length === 0
    ? task.digest
    : `${task.digest}-${
      createHash("sha256").update(JSON.stringify([task.env.environment, task.agentUser, task.workdir])).digest("hex")
        .slice(0, 8)
    }`
  // A task that forbids the internet never shares a pool with one the run's allow-list applies to.
  return task.allowInternet ? started : `${started}-offline`
}

/** A task's resource (its image built on first use), one per {@link containerKey}. */
const resourceOf = (catalog: Catalog, task: HarborTask.HarborTask) =>
  catalog.lock.withPermits(1)(Effect.gen(function*() {
    const known = catalog.launchers.get(containerKey(task))
    if (known !== undefined) return known
    const base = yield* HarborImage.image(task)
    const who = yield* HarborImage.identity(task, base)
    const bake = catalog.settings.bake
    const tag = bake === undefined ? base : yield* HarborImage.baked(task, base, bake)
    const s = yield* Effect.orDie(spec(task, tag, catalog.settings, who))
    const allowHosts = task.allowInternet ? (catalog.settings.allowHosts ?? []) : []
    const common = {
      workingDir: who.workdir,
      allowHosts,
      env: Object.entries(task.env.environment).map(([k, v]) => `${k}=${v}`),
      sharedTmpfs: { "/tests": 256 << 20, "/solution": 256 << 20, "/logs": 64 << 20 }
    }
    const launcher = yield* Docker.launcher(
      catalog.settings.transport === "attach"
        ? { ...common, cmd: ["sh", "-c", supervisor(who.workdir)], attachStdio: true }
        : { ...common, cmd: ["sleep", "infinity"] }
    )
    const resource = { resource: Resource.resource(s, launcher), identity: who }
    catalog.launchers.set(containerKey(task), resource)
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
    const { resource, identity: who } = yield* resourceOf(catalog, task)
    // In the chain's scope: the container goes back (and is recreated) when the chain ends.
    const lease = yield* Scope.provide(catalog.manager.acquire(resource, chain), scope).pipe(
      Effect.mapError((e) =>
        Environment.envError(`harbor:${task.name}`, "lease", "Unavailable", e.message, { cause: e })
      )
    )
    return { task, lease, identity: who }
  })

/** The pools' figures over every task's pool: counts add up, waits take the worst. */
const poolFigures = (catalog: Catalog) =>
  Effect.gen(function*() {
    const figures: Record<string, number> = {}
    for (const { resource } of catalog.launchers.values()) {
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
