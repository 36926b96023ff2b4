/**
 * The command line of the examples' seeded data generators: `npx tsx examples/NAME/generate.ts [OUT_DIR] [SEED]
 * [NOISE] [--OPTION VALUE ...]` runs the generator's `write` with its defaults and these overrides, and logs the
 * counts written. `--OPTION` names any other key of the generator's defaults (`--kind sums`, `--heldOut 300`); its
 * value is read as the default's type, and an unknown key or a bad value stops the command, naming it.
 *
 * @since 0.1.0
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import type { FileSystem } from "effect"
import { relative, resolve } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"

/**
 * Reads `[OUT_DIR] [SEED] [NOISE] [--OPTION VALUE ...]` over `defaults`: positional arguments first, then named
 * ones, each typed as its default. Returns the options or the message that explains the first bad argument.
 *
 * @category constructors
 * @since 0.1.0
 */
export const parseArgs = <O extends { readonly dir: string; readonly seed: number; readonly noise: number }>(
  argv: ReadonlyArray<string>,
  defaults: O
): O | string => {
  const positional = ["dir", "seed", "noise"] as const
  const options: Record<string, unknown> = { ...defaults }
  let i = 0
  for (; i < argv.length && !argv[i]!.startsWith("--"); i++) {
    const key = positional[i]
    if (key === undefined) return `unexpected argument ${argv[i]} (named options are --KEY VALUE)`
    const value = read(key, argv[i]!, defaults[key])
    if ("error" in value) return value.error
    options[key] = value.ok
  }
  for (; i < argv.length; i += 2) {
    const key = argv[i]!.slice(2)
    if (!argv[i]!.startsWith("--") || !(key in defaults)) {
      return `unknown option ${argv[i]} (known: ${Object.keys(defaults).map((k) => `--${k}`).join(", ")})`
    }
    if (argv[i + 1] === undefined) return `--${key} needs a value`
    const value = read(key, argv[i + 1]!, (defaults as Record<string, unknown>)[key])
    if ("error" in value) return value.error
    options[key] = value.ok
  }
  return options as O
}

/**
 * A value typed as its default: a number must be finite (a count, a whole number ≥ 0; `noise`, a probability); a
 * list is comma-separated (`--types pick,clean`); an object is JSON (`--world '{"receptacles":4}'`); a string is
 * taken as it is.
 */
const read = (key: string, text: string, current: unknown): { readonly ok: unknown } | { readonly error: string } => {
  if (Array.isArray(current)) {
    const items = text.split(",").map((item) => item.trim()).filter((item) => item !== "")
    if (items.length === 0) return { error: `--${key} needs a comma-separated list, got ${JSON.stringify(text)}` }
    if (typeof current[0] !== "number") return { ok: items }
    const numbers = items.map(Number)
    return numbers.every(Number.isFinite)
      ? { ok: numbers }
      : { error: `--${key} must be numbers, got ${JSON.stringify(text)}` }
  }
  if (typeof current === "object" && current !== null) {
    try {
      const parsed: unknown = JSON.parse(text)
      if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) return { ok: parsed }
    } catch {
      // Reported below.
    }
    return {
      error: `--${key} must be a JSON object such as ${JSON.stringify(JSON.stringify(current))}, ` +
        `got ${JSON.stringify(text)}`
    }
  }
  if (typeof current !== "number") return { ok: text }
  const n = Number(text)
  if (text.trim() === "" || !Number.isFinite(n)) {
    return { error: `${key} must be a number, got ${JSON.stringify(text)}` }
  }
  if (key === "noise") {
    return n < 0 || n > 1 ? { error: `noise is a probability: expected 0 to 1, got ${n}` } : { ok: n }
  }
  if (Number.isInteger(current) && current >= 0 && !(Number.isInteger(n) && n >= 0)) {
    return { error: `${key} must be a whole number ≥ 0, got ${JSON.stringify(text)}` }
  }
  return { ok: n }
}

/**
 * The usage line and every option with its default.
 *
 * @category getters
 * @since 0.1.0
 */
export const usage = (script: string, defaults: Readonly<Record<string, unknown>>): string =>
  [
    `usage: npx tsx ${script} [OUT_DIR] [SEED] [NOISE] [--OPTION VALUE ...]`,
    "options (lists comma-separated, objects as JSON):",
    ...Object.entries(defaults).map(([key, value]) => `  --${key} ${JSON.stringify(value)}`)
  ].join("\n")

/**
 * A generator's default `OUT_DIR`, `dir` taken relative to the generator's own module (`data` beside its
 * `generate.ts`), as a path from `cwd`: the command writes the folder its configs name from wherever it is run. An
 * `OUT_DIR` given on the command line is relative to the working directory, as any path argument is.
 *
 * @category getters
 * @since 0.1.0
 */
export const besideModule = (moduleUrl: string, dir: string, cwd = process.cwd()): string =>
  relative(cwd, fileURLToPath(new URL(dir, moduleUrl))) || "."

/**
 * Runs `write` when the module at `moduleUrl` is the script Node was started with (not when it is imported).
 * `defaults.dir` is relative to that module (`besideModule`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const main = <O extends { readonly seed: number; readonly noise: number }>(
  moduleUrl: string,
  defaults: O & { readonly dir: string },
  write: (options: O & { readonly dir: string }) => Effect.Effect<unknown, unknown, FileSystem.FileSystem>
): void => {
  if (process.argv[1] === undefined || moduleUrl !== pathToFileURL(resolve(process.argv[1])).href) return
  const home = { ...defaults, dir: besideModule(moduleUrl, defaults.dir) }
  if (process.argv.includes("--help") || process.argv.includes("-h")) {
    console.log(usage(relative(process.cwd(), process.argv[1]), home))
    process.exit(0)
  }
  const options = parseArgs(process.argv.slice(2), home)
  if (typeof options === "string") {
    console.error(options)
    process.exit(2)
  }
  write(options).pipe(
    Effect.tap((counts) => Effect.log(`wrote ${JSON.stringify(counts)} to ${options.dir}`)),
    // A bad option is the user's, not a bug: its message alone, no stack.
    Effect.catch((e) =>
      Effect.sync(() => {
        console.error(e instanceof Error ? e.message : String(e))
        process.exit(2)
      })
    ),
    Effect.provide(NodeServices.layer),
    NodeRuntime.runMain
  )
}
