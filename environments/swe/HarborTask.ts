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
 * @since 0.1.0
 */
import { Effect, FileSystem, Schema } from "effect"
import { createHash } from "node:crypto"
import { parse } from "smol-toml"

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

/** Every file under `dir`, as paths relative to it, sorted. */
const filesUnder = (fs: FileSystem.FileSystem, dir: string) =>
  Effect.map(fs.readDirectory(dir, { recursive: true }), (entries) => entries)
    .pipe(
      Effect.flatMap((entries) =>
        Effect.filter(entries, (entry) => Effect.map(fs.stat(`${dir}/${entry}`), (s) => s.type === "File"))
      ),
      Effect.map((files) => [...files].sort())
    )

/**
 * Reads a task folder.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fnUntraced(function*(folder: string) {
  const fs = yield* FileSystem.FileSystem
  const fail = (message: string) => new HarborError({ folder, message })
  const read = (path: string, what: string) =>
    fs.readFileString(`${folder}/${path}`).pipe(Effect.mapError(() => fail(`${what} (${path}) is missing`)))
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
  const environment = yield* filesUnder(fs, `${folder}/environment`).pipe(Effect.mapError(() => fail("no environment/")))
  const testFiles = yield* filesUnder(fs, `${folder}/tests`).pipe(Effect.mapError(() => fail("no tests/")))
  if (!testFiles.includes("test.sh")) return yield* fail("the verifier (tests/test.sh) is missing")
  const tests = new Map<string, string>()
  for (const file of testFiles) tests.set(file, yield* read(`tests/${file}`, "a test file"))
  const solution = yield* Effect.orElseSucceed(fs.readFileString(`${folder}/solution/solve.sh`), () => undefined)
  const hash = createHash("sha256")
  for (const file of environment) {
    hash.update(file).update("\0").update(yield* fs.readFile(`${folder}/environment/${file}`)).update("\0")
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
