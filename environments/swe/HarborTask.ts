/**
 * Harbor task folders (the Terminal-Bench successor's format, which SWE datasets such as Repo2RLEnv emit):
 *
 * ```
 * my-task/
 * ├── task.toml          # every field honoured or refused by name (`HarborFields`), Harbor's defaults
 * ├── instruction.md     # what the agent is asked
 * ├── environment/
 * │   └── Dockerfile     # the agent's container (build context: environment/)
 * ├── tests/
 * │   └── test.sh        # the verifier: uploaded byte for byte to /tests after the agent, executed as a
 * │                      # file (its shebang decides the shell); writes /logs/verifier/reward.txt or .json
 * └── solution/
 *     └── solve.sh       # optional reference solution: solution/ is uploaded to /solution, solve.sh executed
 * ```
 *
 * `load` reads and checks a folder: a missing file, a malformed `task.toml` (read with `smol-toml`), a field this
 * runtime refuses or Harbor does not define (`HarborFields`), a step folder that is missing or malformed, or a
 * Docker Compose environment is a `HarborError` naming the folder and what is wrong, before any container starts.
 * Test and solution files are read as bytes (a binary fixture reaches the verifier as it is in the folder).
 *
 * **Paths cannot escape.** A folder's files are what its verifier copies into the container and what its image is
 * built from, and a row's `task` may come from another machine (a rollout worker's share), so every path is checked
 * against its root before anything is read: `loadRow` refuses a row's `task` that is absolute or leads out of the
 * task folders' root by `..`, and `load` reads every file through its real path and refuses one that leads out of
 * the root (the task folders' root; the folder itself when a folder is loaded alone) through a symbolic link — the
 * folder itself, `task.toml`, `instruction.md`, `environment/` and `tests/` (or any file in them),
 * `solution/solve.sh`. Each is a `PathEscape` naming the path, where it leads and the root. Links that stay inside
 * the root are followed (tasks may share files); a linked directory *inside* `environment/` or `tests/` is not
 * descended into, as before.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Option, Schema } from "effect"
import { createHash } from "node:crypto"
import { isAbsolute, resolve } from "node:path"
import { parse } from "smol-toml"
import * as Paths from "../../src/internal/paths.ts"
import * as HarborFields from "./HarborFields.ts"

// ===== Models =====

/**
 * Why a task folder was refused.
 *
 * @category errors
 * @since 0.1.0
 */
export class HarborError extends Schema.TaggedError<HarborError>()("HarborError", {
  folder: Schema.String,
  message: Schema.String
}) {}

/**
 * A path a row or a task folder names that leads out of its root: a row's `task` that is absolute or climbs out
 * with `..`, or a folder or file that is (or lies under) a symbolic link to somewhere outside. Nothing of the
 * folder is copied into a container or run.
 *
 * @category errors
 * @since 0.1.0
 */
export class PathEscape extends Schema.TaggedError<PathEscape>()("PathEscape", {
  /** The task folder as named: a row's `task`, or the folder `load` was given. */
  folder: Schema.String,
  /** The path as named: the row's `task`, or a file or directory relative to the folder. */
  path: Schema.String,
  /** Where it leads (resolved). */
  target: Schema.String,
  /** The root it must stay in (resolved). */
  root: Schema.String,
  message: Schema.String
}) {}

/**
 * A task folder, read.
 *
 * @category models
 * @since 0.1.0
 */
export interface HarborTask {
  readonly folder: string
  /** `[task] name`, else the folder's own name. */
  readonly name: string
  readonly instruction: string
  /** The files of `environment/` (relative paths), the Docker build context. */
  readonly environment: ReadonlyArray<string>
  /** The files of `tests/` (relative path → bytes), uploaded to `/tests` for the verifier. */
  readonly tests: ReadonlyMap<string, Uint8Array>
  /** `solution/solve.sh`'s text, when present. */
  readonly solution: string | undefined
  /** The files of `solution/` (relative path → bytes), uploaded to `/solution` by the oracle. */
  readonly solutionFiles: ReadonlyMap<string, Uint8Array>
  /** `[verifier] timeout_sec` (Harbor's default 600 s). */
  readonly verifierTimeoutMillis: number
  /** `[agent] timeout_sec` (Harbor's default 600 s): actions after it are refused. */
  readonly agentTimeoutMillis: number
  /** `[environment] build_timeout_sec` (Harbor's default 600 s). */
  readonly buildTimeoutMillis: number
  /** `[environment] cpus` (Harbor's default 1). */
  readonly cpus: number
  /** `[environment] memory_mb` or `memory` (Harbor's default 2,048 MB). */
  readonly memoryBytes: number
  /** The working directory (`[environment] workdir`); `undefined`: the image's `WORKDIR`. */
  readonly workdir: string | undefined
  /** `[agent] user`; `undefined`: the image's `USER`. */
  readonly agentUser: string | undefined
  /** `[verifier] user`; `undefined`: the agent's. */
  readonly verifierUser: string | undefined
  /** `[environment] docker_image`: a prebuilt image instead of building `environment/`. */
  readonly dockerImage: string | undefined
  /** `[environment] allow_internet` (and `network_mode`): the run's allow-list applies only when true. */
  readonly allowInternet: boolean
  /** `[environment.env]`, `[verifier.env]`, `[solution.env]`, with `${VAR}` resolved from the host. */
  readonly env: {
    readonly environment: Readonly<Record<string, string>>
    readonly verifier: Readonly<Record<string, string>>
    readonly solution: Readonly<Record<string, string>>
  }
  /** `[metadata] reward_key`: the training key of a multi-key `reward.json`. */
  readonly rewardKey: string | undefined
  /** A multi-step task's steps, in order (empty: a single-step task). */
  readonly steps: ReadonlyArray<Step>
  /** `multi_step_reward_strategy`: `mean` (default) or `final`. */
  readonly stepStrategy: "mean" | "final"
  /** A digest of `environment/`'s files: tasks with the same environment share an image. */
  readonly digest: string
}

/**
 * A step of a multi-step task: `steps/<name>/instruction.md`, its tests (the task's `tests/`, then the step's own
 * over them), its solution, and its `[[steps]]` settings over the task's.
 *
 * @category models
 * @since 0.1.0
 */
export interface Step {
  readonly name: string
  readonly instruction: string
  readonly tests: ReadonlyMap<string, Uint8Array>
  readonly solution: string | undefined
  readonly solutionFiles: ReadonlyMap<string, Uint8Array>
  readonly verifierTimeoutMillis: number
  readonly agentTimeoutMillis: number
  /** `[verifier.env]` with the step's `[steps.verifier] env` over it, resolved. */
  readonly verifierEnv: Readonly<Record<string, string>>
  readonly minReward: number | Readonly<Record<string, number>> | undefined
  readonly contributesToMean: boolean
}

// ===== Reading =====

/**
 * A folder being read: what every step below needs. `base` is the root as given (the folder itself when loaded
 * alone), `root` its real path, which every file's real path must stay inside.
 */
interface Folder {
  readonly fs: FileSystem.FileSystem
  readonly folder: string
  readonly base: string
  readonly root: string
}

const openFolder = Effect.fnUntraced(function*(folder: string, options: { readonly root?: string }) {
  const fs = yield* FileSystem.FileSystem
  const base = resolve(options.root ?? folder)
  const root = yield* Effect.orElseSucceed(fs.realPath(base), () => base)
  return { fs, folder, base, root } satisfies Folder
})

const fail = (at: Folder, message: string) => new HarborError({ folder: at.folder, message })

/** The real path of `rel` in the folder (undefined when it is not there), refused when it leads out of the root. */
const real = Effect.fnUntraced(function*(at: Folder, rel: string) {
  const { base, folder, fs, root } = at
  const named = rel === "" ? folder : `${folder}/${rel}`
  const target = Option.getOrUndefined(yield* Effect.option(fs.realPath(named)))
  if (target === undefined || Paths.isWithin(root, target)) return target
  const what = rel === "" ? "the folder" : rel
  return yield* new PathEscape({
    folder,
    path: rel === "" ? folder : rel,
    target,
    root,
    message: Paths.isWithin(base, resolve(named))
      ? `${what} is a symbolic link (or lies under one) to ${target}, outside the root ${root}`
      : `${what} (${resolve(named)}) lies outside the root ${root}`
  })
})

const read = (at: Folder, path: string, what: string) =>
  Effect.flatMap(real(at, path), (target) =>
    target === undefined
      ? Effect.fail(fail(at, `${what} (${path}) is missing`))
      : at.fs.readFileString(target).pipe(Effect.mapError(() => fail(at, `${what} (${path}) is missing`))))

/** Every file under `dir`: its path relative to `dir` and its real path, sorted (undefined without `dir`). */
const filesUnder = Effect.fnUntraced(function*(at: Folder, dir: string) {
  const dirAt = yield* real(at, dir)
  if (dirAt === undefined) return undefined
  const entries = yield* Effect.orElseSucceed(at.fs.readDirectory(dirAt, { recursive: true }), () => undefined)
  if (entries === undefined) return undefined
  const files: Array<readonly [string, string]> = []
  for (const entry of [...entries].sort()) {
    // Every entry, a link to a directory too, is checked, though only files are kept.
    const target = yield* real(at, `${dir}/${entry}`)
    if (target === undefined) return yield* fail(at, `${dir}/${entry} cannot be read (a broken symbolic link?)`)
    const type = yield* at.fs.stat(target).pipe(Effect.map((s) => s.type), Effect.orElseSucceed(() => "Unknown"))
    if (type === "File") files.push([entry, target])
  }
  return files
})

/** `task.toml`, parsed and read: every field honoured or refused by name (`HarborFields`). */
const readToml = Effect.fnUntraced(function*(at: Folder) {
  const tomlText = yield* read(at, "task.toml", "task.toml")
  const raw = yield* Effect.try({
    try: () => parse(tomlText),
    catch: (e) =>
      fail(at, `task.toml is not valid TOML: ${e instanceof Error ? e.message.split("\n")[0] : String(e)}`)
  })
  const config = HarborFields.read(raw)
  if ("length" in config) return yield* fail(at, `task.toml: ${config.join("; ")}`)
  return config
})

/** `instruction.md`, trimmed; refused when empty (a multi-step task may have none: its first step's is used). */
const readInstruction = Effect.fnUntraced(function*(at: Folder) {
  const instruction = (yield* read(at, "instruction.md", "the instruction")).trim()
  if (instruction.length === 0) return yield* fail(at, "instruction.md is empty")
  return instruction
})

/** The files of `environment/` (relative and real paths), which must hold a `Dockerfile`. */
const readEnvironment = Effect.fnUntraced(function*(at: Folder) {
  yield* read(at, "environment/Dockerfile", "the environment's Dockerfile")
  const files = yield* filesUnder(at, "environment")
  if (files === undefined) return yield* fail(at, "no environment/")
  return files
})

/** The files under `dir` as bytes (relative path → bytes); undefined without `dir`. */
const bytesUnder = Effect.fnUntraced(function*(at: Folder, dir: string) {
  const files = yield* filesUnder(at, dir)
  if (files === undefined) return undefined
  const bytes = new Map<string, Uint8Array>()
  for (const [file, target] of files) {
    const read = at.fs.readFile(target).pipe(Effect.mapError(() => fail(at, `${dir}/${file} cannot be read`)))
    bytes.set(file, yield* read)
  }
  return bytes
})

/** The files of `tests/` (relative path → bytes), which must hold the verifier `test.sh`. */
const readTests = Effect.fnUntraced(function*(at: Folder) {
  const tests = yield* bytesUnder(at, "tests")
  if (tests === undefined) return yield* fail(at, "no tests/")
  if (!tests.has("test.sh")) return yield* fail(at, "the verifier (tests/test.sh) is missing")
  return tests
})

/** `dir/solution/`'s files (none when it is absent) and `solve.sh`'s text (undefined when absent). */
const readSolution = Effect.fnUntraced(function*(at: Folder, dir = "") {
  const files = (yield* bytesUnder(at, `${dir}solution`)) ?? new Map<string, Uint8Array>()
  const solve = files.get("solve.sh")
  return { files, solve: solve === undefined ? undefined : new TextDecoder().decode(solve) }
})

/** A multi-step task's steps, read from `steps/<name>/`, over the task's tests and settings. */
const readSteps = Effect.fnUntraced(function*(
  at: Folder,
  config: HarborFields.Config,
  shared: { readonly tests: ReadonlyMap<string, Uint8Array>; readonly verifierEnv: Readonly<Record<string, string>> }
) {
  const steps: Array<Step> = []
  for (const step of config.steps) {
    const dir = `steps/${step.name}/`
    if ((yield* real(at, `steps/${step.name}`)) === undefined) return yield* fail(at, `${dir} is missing`)
    for (const hook of ["workdir", "environment"]) {
      if ((yield* real(at, `${dir}${hook}`)) !== undefined) {
        return yield* fail(at, `${dir}${hook}/ is refused: a step's setup files and hooks are not run here`)
      }
    }
    const instruction = (yield* read(at, `${dir}instruction.md`, `step ${step.name}'s instruction`)).trim()
    const own = (yield* bytesUnder(at, `${dir}tests`)) ?? new Map<string, Uint8Array>()
    const tests = new Map([...shared.tests, ...own])
    if (!tests.has("test.sh")) {
      return yield* fail(at, `step ${step.name} has no verifier (${dir}tests/test.sh, or tests/test.sh)`)
    }
    const env = HarborFields.resolveEnv({ ...shared.verifierEnv, ...step.verifierEnv }, process.env)
    if (typeof env === "string") return yield* fail(at, `[[steps]] ${step.name} verifier env: ${env}`)
    const solution = yield* readSolution(at, dir)
    steps.push({
      name: step.name,
      instruction,
      tests,
      solution: solution.solve,
      solutionFiles: solution.files,
      verifierTimeoutMillis: (step.verifierTimeoutSec ?? config.verifierTimeoutSec) * 1000,
      agentTimeoutMillis: (step.agentTimeoutSec ?? config.agentTimeoutSec) * 1000,
      verifierEnv: env,
      minReward: step.minReward,
      contributesToMean: step.contributesToMean
    })
  }
  return steps
})

/** Refuses by name a Docker Compose environment (several containers: one a chain here). */
const refuseShapes = Effect.fnUntraced(function*(at: Folder) {
  for (const compose of ["docker-compose.yaml", "docker-compose.yml", "compose.yaml"]) {
    if ((yield* real(at, `environment/${compose}`)) !== undefined) {
      return yield* fail(
        at,
        `environment/${compose} is refused: multi-container environments are not run here (one container a chain)`
      )
    }
  }
})

/** A digest of the environment's files (names and bytes): tasks with the same environment share an image. */
const digestOf = Effect.fnUntraced(function*(at: Folder, files: ReadonlyArray<readonly [string, string]>) {
  const hash = createHash("sha256")
  for (const [file, target] of files) {
    const bytes = yield* at.fs.readFile(target).pipe(
      Effect.mapError(() => fail(at, `environment/${file} cannot be read`))
    )
    hash.update(file).update("\0").update(bytes).update("\0")
  }
  return hash.digest("hex").slice(0, 16)
})

/** The env tables with `${VAR}` resolved from the host; a variable that is not set is refused by name. */
const envOf = (at: Folder, config: HarborFields.Config) =>
  Effect.gen(function*() {
    const resolve = (section: string, table: Readonly<Record<string, string>>) => {
      const resolved = HarborFields.resolveEnv(table, process.env)
      return typeof resolved === "string"
        ? Effect.fail(fail(at, `[${section}.env] ${resolved}`))
        : Effect.succeed(resolved)
    }
    return {
      environment: yield* resolve("environment", config.environmentEnv),
      verifier: yield* resolve("verifier", config.verifierEnv),
      solution: yield* resolve("solution", config.solutionEnv)
    }
  })

/**
 * Reads a task folder. Every path is read through its real path, which must stay inside `options.root` (the task
 * folders' root) or, without one, the folder itself; a path that leads out is a {@link PathEscape}.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fnUntraced(function*(folder: string, options: { readonly root?: string } = {}) {
  const at = yield* openFolder(folder, options)
  yield* real(at, "")
  const toml = yield* readToml(at)
  yield* refuseShapes(at)
  const multiStep = toml.steps.length > 0
  // A multi-step task's instruction is its first step's unless it has one of its own.
  const instruction = multiStep && (yield* real(at, "instruction.md")) === undefined
    ? undefined
    : yield* readInstruction(at)
  // A prebuilt image (`docker_image`) needs no environment/ at all.
  const environmentFiles = toml.dockerImage !== undefined && (yield* real(at, "environment/Dockerfile")) === undefined
    ? []
    : yield* readEnvironment(at)
  const tests = multiStep ? (yield* bytesUnder(at, "tests")) ?? new Map<string, Uint8Array>() : yield* readTests(at)
  const solution = yield* readSolution(at)
  const env = yield* envOf(at, toml)
  const steps = yield* readSteps(at, toml, { tests, verifierEnv: toml.verifierEnv })
  const digest = toml.dockerImage !== undefined && environmentFiles.length === 0
    ? createHash("sha256").update(toml.dockerImage).digest("hex").slice(0, 16)
    : yield* digestOf(at, environmentFiles)
  const task: HarborTask = {
    folder,
    name: toml.name ?? folder.split("/").filter((p) => p.length > 0).at(-1)!,
    instruction: instruction ?? steps[0]!.instruction,
    environment: environmentFiles.map(([file]) => file),
    tests,
    solution: solution.solve,
    solutionFiles: solution.files,
    verifierTimeoutMillis: toml.verifierTimeoutSec * 1000,
    agentTimeoutMillis: toml.agentTimeoutSec * 1000,
    buildTimeoutMillis: toml.buildTimeoutSec * 1000,
    cpus: toml.cpus,
    memoryBytes: Math.round(toml.memoryMb * (1 << 20)),
    workdir: toml.workdir,
    agentUser: toml.agentUser,
    verifierUser: toml.verifierUser,
    dockerImage: toml.dockerImage,
    allowInternet: toml.allowInternet,
    env,
    rewardKey: toml.rewardKey,
    steps,
    stepStrategy: toml.stepStrategy,
    digest
  }
  return task
})

/**
 * Reads the task folder a row names (`task`, relative to `root`), refusing a `task` that is absolute or leads out of
 * `root` with `..` (a {@link PathEscape}, before anything is read), then the folder as {@link load} does under
 * `root`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const loadRow = Effect.fnUntraced(function*(root: string, task: string) {
  const base = resolve(root)
  const folder = resolve(base, task)
  if (isAbsolute(task) || !Paths.isWithin(base, folder)) {
    return yield* new PathEscape({
      folder: task,
      path: task,
      target: folder,
      root: base,
      message: isAbsolute(task)
        ? `the row's task is an absolute path: a row names its folder relative to the task folders' root ${base}`
        : `the row's task leads to ${folder}, outside the task folders' root ${base}`
    })
  }
  return yield* load(folder, { root: base })
})
