/**
 * Vitest's global setup: the compiled CLI the tests run, `dist-test/` (`node scripts/build.mjs dist-test`), built when
 * a source is newer than it. Compiled, as an installed package runs it: through tsx, each of the suite's few hundred
 * commands spent ≈ 1.4 s of start-up in tsx's loader hooks (≈ 3 s of CPU on a 2-core machine). The clone's own bin,
 * through tsx, runs the docs' transcripts (test/docs) and what only a clone says (test/cli/task.test.ts).
 */
import { execFileSync } from "node:child_process"
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs"
import { join, resolve } from "node:path"

const root = resolve(import.meta.dirname, "../..")
const folder = join(root, "dist-test")
const stamp = join(folder, ".sources")

/** What the build reads: the compiled folders, the compiler's settings and the build script. */
const inputs = ["src", "actors", "environments", "cli", "tsconfig.json", "tsconfig.build.json", "scripts/build.mjs"]

/** The newest modification time among the build's inputs, in milliseconds. */
const newestSource = (): number => {
  let newest = 0
  for (const input of inputs) {
    const path = join(root, input)
    const files = statSync(path).isDirectory()
      ? readdirSync(path, { recursive: true, encoding: "utf8" }).map((file) => join(path, file))
      : [path]
    for (const file of files) newest = Math.max(newest, statSync(file).mtimeMs)
  }
  return newest
}

export default function setup(): void {
  const sources = newestSource()
  if (existsSync(stamp) && Number(readFileSync(stamp, "utf8")) >= sources) return
  execFileSync(process.execPath, [join(root, "scripts/build.mjs"), "dist-test", "--no-declarations"], {
    cwd: root,
    stdio: "inherit"
  })
  // The sources' time as read before the build: an edit made during it is newer, and builds again next run.
  writeFileSync(stamp, String(sources))
}
