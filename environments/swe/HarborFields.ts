/**
 * Every field of Harbor's `task.toml`, honoured or refused by name when a folder loads: no field is ignored
 * silently. The table follows Harbor's task format (https://harborframework.com/docs/task-format) and its
 * `TaskConfig` model (`harbor.models.task.config`): its defaults are Harbor's (verifier 600 s, agent 600 s, build
 * 600 s, 1 CPU, 2,048 MB of memory, 10,240 MB of storage, no GPU, `allow_internet = true`).
 *
 * - **Honoured**: read and acted on (see {@link Config}); `[metadata]`, `[task]`'s description, authors and keywords,
 *   and `source` are metadata, kept as Harbor keeps them (nothing to act on).
 * - **Refused**: a value this runtime cannot give as Harbor would (a GPU, a healthcheck, MCP servers, a skills
 *   folder, a task's own allow-list, a disk cap other than Harbor's default, a separate verifier environment,
 *   artifacts), and any field Harbor does not define: the folder fails to load with a `HarborError` naming
 *   `[section] field` and why. Multi-step tasks (`[[steps]]`) run as `HarborSteps` says.
 *
 * `allow_internet` is honoured through the run's network allow-list (the swe task option `allowHosts`, default
 * none): a task that allows the internet (Harbor's default) reaches the hosts the run allows and nothing else, so
 * by default it runs offline; one that forbids it (`allow_internet = false`, `network_mode = "no-network"`) reaches
 * nothing whatever the run allows.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"

// ===== Models =====

/**
 * Harbor's defaults, as its task format documents them.
 *
 * @category constants
 * @since 0.1.0
 */
export const harborDefaults = {
  verifierTimeoutSec: 600,
  agentTimeoutSec: 600,
  buildTimeoutSec: 600,
  cpus: 1,
  memoryMb: 2048,
  storageMb: 10240,
  gpus: 0,
  allowInternet: true
} as const

/**
 * A `task.toml`, read: what the runtime acts on.
 *
 * @category models
 * @since 0.1.0
 */
export interface Config {
  readonly name: string | undefined
  readonly verifierTimeoutSec: number
  readonly agentTimeoutSec: number
  readonly buildTimeoutSec: number
  readonly cpus: number
  readonly memoryMb: number
  /** `[environment] docker_image`: a prebuilt image instead of `environment/Dockerfile`. */
  readonly dockerImage: string | undefined
  /** `[environment] allow_internet` (and `network_mode = "no-network"`, which forbids it). */
  readonly allowInternet: boolean
  /** `[environment] workdir`: else the image's `WORKDIR`. */
  readonly workdir: string | undefined
  /** `[agent] user`: else the image's `USER`. */
  readonly agentUser: string | undefined
  /** `[verifier] user`: else the agent's. */
  readonly verifierUser: string | undefined
  readonly environmentEnv: Readonly<Record<string, string>>
  readonly verifierEnv: Readonly<Record<string, string>>
  readonly solutionEnv: Readonly<Record<string, string>>
  /** `[metadata] reward_key`: the key of a multi-key `reward.json` that is the training reward. */
  readonly rewardKey: string | undefined
  /** `[[steps]]`, in order (empty: a single-step task). */
  readonly steps: ReadonlyArray<StepConfig>
  /** `multi_step_reward_strategy`: the trial reward of a multi-step task (default `mean`). */
  readonly stepStrategy: "mean" | "final"
}

/**
 * A step of a multi-step task, as `[[steps]]` declares it.
 *
 * @category models
 * @since 0.1.0
 */
export interface StepConfig {
  readonly name: string
  /** Below it (a number, or a number per reward key), the trial stops after this step. */
  readonly minReward: number | Readonly<Record<string, number>> | undefined
  readonly contributesToMean: boolean
  readonly agentTimeoutSec: number | undefined
  readonly verifierTimeoutSec: number | undefined
  readonly verifierEnv: Readonly<Record<string, string>>
}

/**
 * What a field is: honoured (read into {@link Config}), metadata (kept, nothing to do), or refused unless its value
 * is one the runtime gives as Harbor would (`accept` says which, `why` why not otherwise).
 *
 * @category models
 * @since 0.1.0
 */
export type Field =
  | { readonly _tag: "honoured"; readonly what: string }
  | { readonly _tag: "metadata" }
  | { readonly _tag: "refused"; readonly accept: (value: unknown) => boolean; readonly why: string }

const honoured = (what: string): Field => ({ _tag: "honoured", what })
const metadata: Field = { _tag: "metadata" }
const refused = (why: string, accept: (value: unknown) => boolean = () => false): Field => ({
  _tag: "refused",
  accept,
  why
})
const empty = (v: unknown) => v === undefined || v === null || (Array.isArray(v) && v.length === 0)
const noNetwork = (v: unknown) => v === undefined || v === "no-network"
const onlyNoNetwork = "only \"no-network\" is available: the run's allow-list (option allowHosts) decides"
const noPhaseList = "an allow-list per phase is not supported: the run's allow-list (option allowHosts) decides"

/**
 * The table: every section and field Harbor's task format defines, and what this runtime does with it.
 *
 * @category constants
 * @since 0.1.0
 */
export const fields: Readonly<Record<string, Readonly<Record<string, Field>>>> = {
  "": {
    schema_version: metadata,
    version: metadata,
    source: metadata,
    task: honoured("[task] name names the task; its other keys are metadata"),
    metadata: honoured("arbitrary; reward_key names the training key of a multi-key reward.json"),
    verifier: honoured("section"),
    agent: honoured("section"),
    environment: honoured("section"),
    solution: honoured("section"),
    steps: honoured("multi-step tasks: steps/<name>/ (instruction, tests, solution), a reward per step"),
    multi_step_reward_strategy: honoured("\"mean\" (default here) or \"final\": the trial reward of the steps'"),
    artifacts: refused("files copied out after a trial are not collected here (the trajectory is the record)", empty)
  },
  task: { name: honoured("the task's name"), description: metadata, authors: metadata, keywords: metadata },
  verifier: {
    timeout_sec: honoured("the verifier's time limit (default 600 s)"),
    env: honoured("variables test.sh sees"),
    user: honoured("the user test.sh runs as (default: the agent's)"),
    network_mode: refused(onlyNoNetwork, noNetwork),
    allowed_hosts: refused(noPhaseList, empty),
    environment: refused("a separate verifier environment is not supported: the verifier runs in the agent's")
  },
  agent: {
    timeout_sec: honoured("the episode's time limit (default 600 s): later actions are refused"),
    user: honoured("the user the container runs as (default: the image's USER)"),
    network_mode: refused(onlyNoNetwork, noNetwork),
    allowed_hosts: refused(noPhaseList, empty)
  },
  environment: {
    build_timeout_sec: honoured("the image build's time limit (default 600 s)"),
    docker_image: honoured("a prebuilt image instead of environment/Dockerfile"),
    cpus: honoured("CPUs (default 1)"),
    memory_mb: honoured("memory (default 2,048 MB)"),
    memory: honoured("memory, as \"4G\" / \"512M\" (deprecated by Harbor for memory_mb)"),
    storage_mb: refused(
      "the engine here cannot cap a container's disk: only Harbor's default, 10240, is accepted",
      (v) => v === undefined || v === harborDefaults.storageMb
    ),
    storage: refused(
      "the engine here cannot cap a container's disk: only Harbor's default, \"10G\", is accepted",
      (v) => v === undefined || (typeof v === "string" && /^\s*10\s*G\s*$/i.test(v))
    ),
    gpus: refused("no GPU is given to containers here", (v) => v === undefined || v === 0),
    gpu_types: refused("no GPU is given to containers here", empty),
    tpu: refused("no TPU is given to containers here"),
    allow_internet: honoured("through the run's allow-list (option allowHosts, default none); false: nothing"),
    network_mode: refused(onlyNoNetwork, noNetwork),
    allowed_hosts: refused("a task's own allow-list is not supported: the run's (option allowHosts) decides", empty),
    mcp_servers: refused("MCP servers for the agent are not started here", empty),
    env: honoured("variables the container (agent and verifier) sees; ${VAR} and ${VAR:-default} from the host"),
    skills_dir: refused("a skills folder is not given to the agent here"),
    healthcheck: refused("a healthcheck before the agent starts is not run here"),
    workdir: honoured("the working directory (default: the image's WORKDIR)")
  },
  solution: { env: honoured("variables solve.sh sees") },
  "[steps]": {
    name: honoured("the step's folder, steps/<name>/"),
    min_reward: honoured("a number, or a number per reward key: below it the trial stops after this step"),
    contributes_to_mean: honoured("false: the step is verified but left out of the mean"),
    agent: honoured("timeout_sec: the step's time limit (default: the task's)"),
    verifier: honoured("timeout_sec and env: the step's verifier (default: the task's)"),
    healthcheck: refused("a healthcheck before the step is not run here")
  },
  "[steps] agent": { timeout_sec: honoured("the step's agent time limit") },
  "[steps] verifier": {
    timeout_sec: honoured("the step's verifier time limit"),
    env: honoured("variables the step's test.sh sees (over [verifier.env])")
  }
}

// ===== Reading =====

/**
 * A field as `task.toml`'s readers name it: `key` at the top, `[section] key`, `[[steps]] key`,
 * `[[steps]] agent key`.
 *
 * @category getters
 * @since 0.1.0
 */
export const fieldName = (section: string, key: string): string =>
  section === ""
    ? key
    : section.startsWith("[steps]")
    ? ["[[steps]]", section.slice("[steps]".length).trim(), key].filter((p) => p !== "").join(" ")
    : `[${section}] ${key}`

const isTable = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof Date)

/** The refusals of a parsed `task.toml`: each a sentence naming `[section] field`; empty when it is all honoured. */
export const refusals = (toml: Readonly<Record<string, unknown>>): ReadonlyArray<string> => {
  const out: Array<string> = []
  const check = (section: string, table: Readonly<Record<string, unknown>>) => {
    const known = fields[section] ?? {}
    const where = (key: string) => fieldName(section, key)
    for (const [key, value] of Object.entries(table)) {
      const field = known[key]
      if (field === undefined) out.push(`${where(key)} is not a field of Harbor's task.toml`)
      else if (field._tag === "refused" && !field.accept(value)) out.push(`${where(key)} is refused: ${field.why}`)
    }
  }
  check("", toml)
  for (const section of ["task", "verifier", "agent", "environment", "solution"]) {
    const table = toml[section]
    if (table !== undefined && !isTable(table)) out.push(`[${section}] must be a table`)
    else if (table !== undefined) check(section, table)
  }
  const steps = toml["steps"]
  if (steps !== undefined && !(Array.isArray(steps) && steps.every(isTable))) out.push("steps must be [[steps]] tables")
  else if (steps !== undefined) {
    for (const step of steps as ReadonlyArray<Record<string, unknown>>) {
      check("[steps]", step)
      for (const sub of ["agent", "verifier"]) {
        const table = step[sub]
        if (table !== undefined && !isTable(table)) out.push(`[steps.${sub}] must be a table`)
        else if (table !== undefined) check(`[steps] ${sub}`, table)
      }
    }
  }
  const strategy = toml["multi_step_reward_strategy"]
  if (strategy !== undefined && strategy !== "mean" && strategy !== "final") {
    out.push(`multi_step_reward_strategy must be "mean" or "final", got ${JSON.stringify(strategy)}`)
  }
  return out
}

const Env = Schema.Record(Schema.String, Schema.String)
const User = Schema.Union([Schema.String, Schema.Int])

/** The honoured fields' types (refusals are checked first, so the refused ones are absent or accepted here). */
const Toml = Schema.Struct({
  task: Schema.optionalKey(Schema.Struct({ name: Schema.optionalKey(Schema.String) })),
  metadata: Schema.optionalKey(Schema.Struct({ reward_key: Schema.optionalKey(Schema.String) })),
  verifier: Schema.optionalKey(Schema.Struct({
    timeout_sec: Schema.optionalKey(Schema.Number),
    env: Schema.optionalKey(Env),
    user: Schema.optionalKey(User)
  })),
  agent: Schema.optionalKey(Schema.Struct({
    timeout_sec: Schema.optionalKey(Schema.NullOr(Schema.Number)),
    user: Schema.optionalKey(User)
  })),
  environment: Schema.optionalKey(Schema.Struct({
    build_timeout_sec: Schema.optionalKey(Schema.Number),
    docker_image: Schema.optionalKey(Schema.String),
    cpus: Schema.optionalKey(Schema.Number),
    memory_mb: Schema.optionalKey(Schema.Number),
    memory: Schema.optionalKey(Schema.String),
    allow_internet: Schema.optionalKey(Schema.Boolean),
    network_mode: Schema.optionalKey(Schema.String),
    env: Schema.optionalKey(Env),
    workdir: Schema.optionalKey(Schema.String)
  })),
  solution: Schema.optionalKey(Schema.Struct({ env: Schema.optionalKey(Env) })),
  multi_step_reward_strategy: Schema.optionalKey(Schema.Literals(["mean", "final"])),
  steps: Schema.optionalKey(Schema.Array(Schema.Struct({
    name: Schema.String.check(Schema.isPattern(/^[A-Za-z0-9][A-Za-z0-9._-]*$/)),
    min_reward: Schema.optionalKey(Schema.Union([Schema.Number, Schema.Record(Schema.String, Schema.Number)])),
    contributes_to_mean: Schema.optionalKey(Schema.Boolean),
    agent: Schema.optionalKey(Schema.Struct({ timeout_sec: Schema.optionalKey(Schema.Number) })),
    verifier: Schema.optionalKey(Schema.Struct({
      timeout_sec: Schema.optionalKey(Schema.Number),
      env: Schema.optionalKey(Env)
    }))
  })))
})

/** `"4G"`, `"512M"`, `"2048"` (MB) as MB, as Harbor reads `memory`. */
export const megabytesOf = (text: string): number | undefined => {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([KMG]?)i?B?\s*$/i.exec(text)
  if (m === null) return undefined
  const unit = { "": 1, K: 1 / 1024, M: 1, G: 1024 }[m[2]!.toUpperCase() as "" | "K" | "M" | "G"]
  return Number(m[1]) * unit
}

/**
 * Reads a parsed `task.toml`: its {@link Config}, or the sentences saying what is refused or malformed (each naming
 * its field).
 *
 * @category constructors
 * @since 0.1.0
 */
export const read = (toml: Readonly<Record<string, unknown>>): Config | ReadonlyArray<string> => {
  const refused = refusals(toml)
  if (refused.length > 0) return refused
  const decoded = Schema.decodeUnknownExit(Toml)(toml, { onExcessProperty: "ignore" })
  if (decoded._tag === "Failure") return [`task.toml: ${String(decoded.cause).replace(/\n\s*/g, " ")}`]
  const t = decoded.value
  const env = t.environment
  const memoryMb = env?.memory_mb ?? (env?.memory === undefined ? harborDefaults.memoryMb : megabytesOf(env.memory))
  if (memoryMb === undefined) return [`[environment] memory "${env?.memory}" is not a size like "4G" or "512M"`]
  const user = (u: string | number | undefined) => (u === undefined ? undefined : String(u))
  return {
    name: t.task?.name,
    verifierTimeoutSec: t.verifier?.timeout_sec ?? harborDefaults.verifierTimeoutSec,
    agentTimeoutSec: t.agent?.timeout_sec ?? harborDefaults.agentTimeoutSec,
    buildTimeoutSec: env?.build_timeout_sec ?? harborDefaults.buildTimeoutSec,
    cpus: env?.cpus ?? harborDefaults.cpus,
    memoryMb,
    dockerImage: env?.docker_image,
    allowInternet: (env?.allow_internet ?? harborDefaults.allowInternet) && env?.network_mode !== "no-network",
    workdir: env?.workdir,
    agentUser: user(t.agent?.user),
    verifierUser: user(t.verifier?.user),
    environmentEnv: env?.env ?? {},
    verifierEnv: t.verifier?.env ?? {},
    solutionEnv: t.solution?.env ?? {},
    rewardKey: t.metadata?.reward_key,
    steps: (t.steps ?? []).map((step) => ({
      name: step.name,
      minReward: step.min_reward,
      contributesToMean: step.contributes_to_mean ?? true,
      agentTimeoutSec: step.agent?.timeout_sec,
      verifierTimeoutSec: step.verifier?.timeout_sec,
      verifierEnv: step.verifier?.env ?? {}
    })),
    stepStrategy: t.multi_step_reward_strategy ?? "mean"
  }
}

/**
 * Harbor's `${VAR}` and `${VAR:-default}` in an env table's values, from `host` (the host's environment); a
 * variable that is unset without a default is an error naming it.
 *
 * @category getters
 * @since 0.1.0
 */
export const resolveEnv = (
  table: Readonly<Record<string, string>>,
  host: Readonly<Record<string, string | undefined>>
): Record<string, string> | string => {
  const out: Record<string, string> = {}
  for (const [key, value] of Object.entries(table)) {
    let missing: string | undefined
    out[key] = value.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}/g, (_, name: string, fallback?: string) => {
      const got = host[name]
      if (got !== undefined && got !== "") return got
      if (fallback !== undefined) return fallback
      missing ??= name
      return ""
    })
    if (missing !== undefined) return `${key} needs the host variable ${missing}, which is not set`
  }
  return out
}
