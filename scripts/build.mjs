// `npm run build`: the package's JavaScript and declarations in dist/ (tsc with tsconfig.build.json, `.ts` import
// specifiers rewritten to `.js`), the files the code reads at run time beside it (the Python sandbox's sources), and
// the worker-thread entries that, in a clone, load their TypeScript through tsx: in dist/ they import the compiled
// module directly. Plain Node, so building needs no tsx.
//
// `node scripts/build.mjs FOLDER --no-declarations`: the same JavaScript in another folder at the root (the tests' CLI
// runs from `dist-test/`, test/setup/cli.ts), without declarations. A folder at the root keeps the relative paths
// the compiled code reads (`native/build`, the package's node_modules) the same as from dist/.
import { execFileSync } from "node:child_process"
import { copyFileSync, mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const [folder = "dist", ...flags] = process.argv.slice(2)
// A plain name: the folder is removed first, so never a path that could reach outside the clone.
if (!/^[A-Za-z][\w-]*$/.test(folder)) throw new Error(`build: the output folder must be a plain name, not ${folder}`)
const dist = join(root, folder)
const declarations = !flags.includes("--no-declarations")

rmSync(dist, { recursive: true, force: true })
const tsc = join(root, "node_modules/typescript/bin/tsc")
const options = ["--outDir", dist, ...(declarations ? [] : ["--declaration", "false"])]
execFileSync(process.execPath, [tsc, "-p", join(root, "tsconfig.build.json"), ...options], {
  cwd: root,
  stdio: "inherit"
})
const pythonSources = readdirSync(join(root, "environments"), { recursive: true, encoding: "utf8" })
  .filter((file) => file.endsWith(".py"))
  .map((file) => join("environments", file))
for (const asset of pythonSources) {
  mkdirSync(dirname(join(dist, asset)), { recursive: true })
  copyFileSync(join(root, asset), join(dist, asset))
}
for (const worker of ["src/backends/internal/trainerWorker", "actors/internal/engineWorker"]) {
  const name = worker.split("/").at(-1)
  const entry = `// Worker-thread entry: the compiled worker (${worker}.mjs in the sources loads it through tsx).\n`
  writeFileSync(join(dist, `${worker}.mjs`), `${entry}import "./${name}.js"\n`)
}
