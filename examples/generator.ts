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
import { resolve } from "node:path"
import { pathToFileURL } from "node:url"

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

/** A value typed as its default: a number must be finite; a string is taken as it is. */
const read = (key: string, text: string, current: unknown): { readonly ok: unknown } | { readonly error: string } => {
  if (typeof current !== "number") return { ok: text }
  const n = Number(text)
  if (text.trim() === "" || !Number.isFinite(n)) return { error: `${key} must be a number, got ${JSON.stringify(text)}` }
  return { ok: n }
}

/**
 * Runs `write` when the module at `moduleUrl` is the script Node was started with (not when it is imported).
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
  const options = parseArgs(process.argv.slice(2), defaults)
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
