/**
 * The command line of the examples' seeded data generators: `npx tsx examples/NAME/generate.ts [OUT_DIR] [SEED]
 * [NOISE]` runs the generator's `write` with its defaults and these three overrides, and logs the counts written.
 *
 * @since 0.1.0
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import type { FileSystem } from "effect"
import { resolve } from "node:path"
import { pathToFileURL } from "node:url"

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
  const dir = process.argv[2] ?? defaults.dir
  const seed = process.argv[3] === undefined ? defaults.seed : Number(process.argv[3])
  const noise = process.argv[4] === undefined ? defaults.noise : Number(process.argv[4])
  write({ ...defaults, dir, seed, noise }).pipe(
    Effect.tap((counts) => Effect.log(`wrote ${JSON.stringify(counts)} to ${dir}`)),
    Effect.provide(NodeServices.layer),
    NodeRuntime.runMain
  )
}
