/**
 * Harbor task folders (the Terminal-Bench successor's format, which SWE datasets such as Repo2RLEnv emit):
 *
 * ```
 * my-task/
 * ├── task.toml          # [verifier] timeout_sec, [agent] timeout_sec, [environment] cpus, memory_mb / memory, …
 * ├── instruction.md     # what the agent is asked
 * ├── environment/
 * │   └── Dockerfile     # the agent's container (build context: environment/)
 * ├── tests/
 * │   └── test.sh        # the verifier: copied to /tests after the agent, writes /logs/verifier/reward.txt
 * └── solution/
 *     └── solve.sh       # optional reference solution (what Harbor's oracle agent runs)
 * ```
 *
 * `load` reads and checks a folder: a missing file or a malformed `task.toml` (read with `smol-toml`) is a
 * `HarborError` naming the folder and what is wrong, before any container starts.
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
  /** The files of `tests/` (relative path → contents), copied to `/tests` for the verifier. */
  readonly tests: ReadonlyMap<string, string>
  /** `solution/solve.sh`, when present. */
  readonly solution: string | undefined
  readonly verifierTimeoutMillis: number
  readonly agentTimeoutMillis: number
  readonly cpus: number | undefined
  readonly memoryBytes: number | undefined
  /** The working directory the agent starts in (`[environment] workdir`, default `/app`). */
  readonly workdir: string
  /** A digest of `environment/`'s files: tasks with the same environment share an image. */
  readonly digest: string
}

// ===== Reading =====

const Toml = Schema.Struct({
  task: Schema.optionalKey(Schema.Struct({ name: Schema.optionalKey(Schema.String) })),
  verifier: Schema.optionalKey(Schema.Struct({ timeout_sec: Schema.optionalKey(Schema.Number) })),
  agent: Schema.optionalKey(Schema.Struct({ timeout_sec: Schema.optionalKey(Schema.Number) })),
  environment: Schema.optionalKey(Schema.Struct({
    cpus: Schema.optionalKey(Schema.Number),
    memory_mb: Schema.optionalKey(Schema.Number),
    memory: Schema.optionalKey(Schema.String),
    workdir: Schema.optionalKey(Schema.String)
  }))
})

/** `"4G"`, `"512M"`, `"2048"` (MB) as bytes. */
const memoryOf = (text: string): number | undefined => {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([KMG]?)i?B?\s*$/i.exec(text)
  if (m === null) return undefined
  const unit = { "": 1 << 20, K: 1 << 10, M: 1 << 20, G: 1 << 30 }[m[2]!.toUpperCase() as "" | "K" | "M" | "G"]
  return Math.round(Number(m[1]) * unit)
}

/**
 * Reads a task folder. Every path is read through its real path, which must stay inside `options.root` (the task
 * folders' root) or, without one, the folder itself; a path that leads out is a {@link PathEscape}.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fnUntraced(function*(folder: string, options: { readonly root?: string } = {}) {
  const fs = yield* FileSystem.FileSystem
  const fail = (message: string) => new HarborError({ folder, message })
  const base = resolve(options.root ?? folder)
  const root = yield* Effect.orElseSucceed(fs.realPath(base), () => base)
  /** The real path of `rel` in the folder (undefined when it is not there), refused when it leads out of the root. */
  const real = (rel: string) =>
    Effect.gen(function*() {
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
  const read = (path: string, what: string) =>
    Effect.flatMap(real(path), (target) =>
      target === undefined
        ? Effect.fail(fail(`${what} (${path}) is missing`))
        : fs.readFileString(target).pipe(Effect.mapError(() => fail(`${what} (${path}) is missing`))))
  /** Every file under `dir`: its path relative to `dir` and its real path, sorted (undefined without `dir`). */
  const filesUnder = (dir: string) =>
    Effect.gen(function*() {
      const at = yield* real(dir)
      if (at === undefined) return undefined
      const entries = yield* Effect.orElseSucceed(fs.readDirectory(at, { recursive: true }), () => undefined)
      if (entries === undefined) return undefined
      const files: Array<readonly [string, string]> = []
      for (const entry of [...entries].sort()) {
        // Every entry, a link to a directory too, is checked, though only files are kept.
        const target = yield* real(`${dir}/${entry}`)
        if (target === undefined) return yield* fail(`${dir}/${entry} cannot be read (a broken symbolic link?)`)
        const type = yield* fs.stat(target).pipe(Effect.map((s) => s.type), Effect.orElseSucceed(() => "Unknown"))
        if (type === "File") files.push([entry, target])
      }
      return files
    })
  yield* real("")
  const tomlText = yield* read("task.toml", "task.toml")
  const raw = yield* Effect.try({
    try: () => parse(tomlText),
    catch: (e) => fail(`task.toml is not valid TOML: ${e instanceof Error ? e.message.split("\n")[0] : String(e)}`)
  })
  const toml = yield* Schema.decodeUnknownEffect(Toml)(raw).pipe(
    Effect.mapError((e) => fail(`task.toml: ${e.message.replace(/\n\s*/g, " ")}`))
  )
  const instruction = (yield* read("instruction.md", "the instruction")).trim()
  if (instruction.length === 0) return yield* fail("instruction.md is empty")
  yield* read("environment/Dockerfile", "the environment's Dockerfile")
  const environmentFiles = yield* filesUnder("environment")
  if (environmentFiles === undefined) return yield* fail("no environment/")
  const environment = environmentFiles.map(([file]) => file)
  const testFiles = yield* filesUnder("tests")
  if (testFiles === undefined) return yield* fail("no tests/")
  if (!testFiles.some(([file]) => file === "test.sh")) return yield* fail("the verifier (tests/test.sh) is missing")
  const tests = new Map<string, string>()
  for (const [file, target] of testFiles) {
    tests.set(file, yield* fs.readFileString(target).pipe(Effect.mapError(() => fail(`tests/${file} cannot be read`))))
  }
  const solutionAt = yield* real("solution/solve.sh")
  const solution = solutionAt === undefined
    ? undefined
    : yield* Effect.orElseSucceed(fs.readFileString(solutionAt), () => undefined)
  const hash = createHash("sha256")
  for (const [file, target] of environmentFiles) {
    const bytes = yield* fs.readFile(target).pipe(Effect.mapError(() => fail(`environment/${file} cannot be read`)))
    hash.update(file).update("\0").update(bytes).update("\0")
  }
  const env = toml.environment
  const memory = env?.memory_mb !== undefined
    ? env.memory_mb * (1 << 20)
    : env?.memory !== undefined
    ? memoryOf(env.memory)
    : undefined
  if (env?.memory !== undefined && memory === undefined) return yield* fail(`environment.memory "${env.memory}"`)
  const task: HarborTask = {
    folder,
    name: toml.task?.name ?? folder.split("/").filter((p) => p.length > 0).at(-1)!,
    instruction,
    environment,
    tests,
    solution,
    verifierTimeoutMillis: (toml.verifier?.timeout_sec ?? 120) * 1000,
    agentTimeoutMillis: (toml.agent?.timeout_sec ?? 600) * 1000,
    cpus: env?.cpus,
    memoryBytes: memory,
    workdir: env?.workdir ?? "/app",
    digest: hash.digest("hex").slice(0, 16)
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
