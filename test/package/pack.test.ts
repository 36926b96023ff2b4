/**
 * The package as a user gets it: `npm pack` (which builds dist/), the tarball installed into a fresh TypeScript
 * project (Node 20, the strict tsconfig `tsc --init` writes) from the npm registry and its cache only, a task of the
 * user's own type-checked there against the package's declarations, the starter `npx agentfly init` writes
 * type-checked, solved by its oracle and trained a few steps with `npx agentfly train`, all through the installed
 * package's compiled `bin` (no sources, no tsx of the user's).
 */
import { assert, describe, it } from "@effect/vitest"
import { spawnSync } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"

const root = resolve(import.meta.dirname, "../..")
const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as {
  readonly name: string
  readonly devDependencies: Readonly<Record<string, string>>
}

/**
 * The environment of a user's shell: none of the `npm_…` variables that `npm test` or `npx vitest` set for this
 * process (the repository's own `.npmrc` settings among them: its onnxruntime-node switch must not help the install).
 */
const userEnv = {
  ...Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.toLowerCase().startsWith("npm_"))),
  npm_config_audit: "false",
  npm_config_fund: "false",
  npm_config_update_notifier: "false"
}

/**
 * Runs a command; its output (stdout, then stderr: a run's progress goes there) is returned, or with `stdout` its
 * stdout alone, and a failure throws with the whole of it (the test's message).
 */
const run = (command: string, args: ReadonlyArray<string>, cwd: string, stdout = false): string => {
  const done = spawnSync(command, args, { cwd, encoding: "utf8", maxBuffer: 64 * 1024 * 1024, env: userEnv })
  const output = `${done.stdout}${done.stderr}`
  if (done.status !== 0) {
    throw new Error(`${command} ${args.join(" ")} (in ${cwd}) exited ${done.status ?? done.signal}:\n${output}`)
  }
  return stdout ? done.stdout : output
}

/** The strict tsconfig a new user has: what TypeScript 7's `tsc --init` writes, checking one file without output. */
const newUserTsconfig = {
  compilerOptions: {
    module: "nodenext",
    target: "esnext",
    types: [],
    noUncheckedIndexedAccess: true,
    exactOptionalPropertyTypes: true,
    strict: true,
    verbatimModuleSyntax: true,
    isolatedModules: true,
    noUncheckedSideEffectImports: true,
    moduleDetection: "force",
    skipLibCheck: true,
    noEmit: true
  },
  include: ["echo.ts"]
}

/** The user's own task, importing the package's three entry points as the docs show them. */
const echoTask = `import { Effect, Schema } from "effect"
import { Reward, Task, Tool, Trajectory } from "${manifest.name}"
import { ToolCallFormat } from "${manifest.name}/environments"
import { Oracle } from "${manifest.name}/testing"

export const shout = Tool.make("shout", {
  description: "Upper-case a word",
  parameters: Schema.Struct({ word: Schema.String }),
  handler: ({ word }) => Effect.succeed(word.toUpperCase())
})

const loud = Reward.make("loud", {
  row: Schema.Struct({ word: Schema.String }),
  score: ({ trajectory, row }) =>
    Effect.succeed(Trajectory.lastAssistantText(trajectory) === row.word.toUpperCase() ? 1 : 0)
})

export const task = Task.make("echo", {
  row: Schema.Struct({ word: Schema.String }),
  tools: [shout],
  reward: Reward.combine("loud + format", [
    { reward: loud, weight: 1 },
    { reward: ToolCallFormat.toolCallFormat, weight: 0.1 }
  ]),
  defaults: { systemPrompt: "Shout the word.", maxTurns: 2 }
})

export const oracle: Oracle.Policy = (messages: Oracle.Conversation) => {
  const shouted = Oracle.last(messages, "tool")
  return shouted === undefined
    ? { toolCalls: [Oracle.call(messages, "shout", { word: Oracle.text(Oracle.last(messages, "user")) })] }
    : { content: Oracle.text(shouted) }
}
`

describe("the npm package", () => {
  it("packs, installs from the registry into a fresh project, type-checks a task and the starter, trains", () => {
    const dir = mkdtempSync(join(tmpdir(), "agentfly-pack-"))
    try {
      const packJson = run("npm", ["pack", "--json", "--pack-destination", dir], root, true)
      const packed = JSON.parse(packJson) as ReadonlyArray<{
        readonly filename: string
        readonly files: ReadonlyArray<{ readonly path: string }>
      }>
      const { filename, files } = packed[0]!
      const paths = files.map((f) => f.path)
      // What runs, and the guides, nothing else: compiled code and declarations, the command, the docs a user
      // follows (docs/, the changelog), the one C source built at install, no other sources or tests.
      assert.include(paths, "bin/agentfly.mjs")
      assert.include(paths, "docs/install.md")
      assert.include(paths, "dist/cli/main.js")
      assert.include(paths, "dist/src/index.d.ts")
      assert.include(paths, "dist/environments/python/repl_server.py")
      assert.include(paths, "native/kernels.c") // the native kernels, built at install (`native/build.mjs`)
      const shipped =
        /^(dist\/|bin\/|docs\/[\w-]+\.md$|native\/(kernels\.c|build\.mjs)$|package\.json$|(README|CHANGELOG)\.md$)/
      const strays = paths.filter((p) =>
        !shipped.test(p) ||
        /(?<!\.d)\.ts$/.test(p)
      )
      assert.deepStrictEqual(strays, [])

      const project = join(dir, "my-agents")
      mkdirSync(project)
      writeFileSync(join(project, "package.json"), `{ "name": "my-agents", "private": true, "type": "module" }\n`)
      // The one line docs/install.md asks for: onnxruntime-node's CPU binaries ship in its npm package; its install
      // script would otherwise fetch CUDA libraries from NuGet (the GPU path, the user's explicit choice).
      writeFileSync(join(project, ".npmrc"), "onnxruntime-node-install=skip\n")
      run("npm", [
        "install",
        "--prefer-offline",
        join(dir, filename),
        `typescript@${manifest.devDependencies["typescript"]}`,
        `@types/node@${manifest.devDependencies["@types/node"]}`
      ], project)
      assert.isTrue(existsSync(join(project, "node_modules", manifest.name, "dist/cli/main.js")))
      assert.isFalse(existsSync(join(project, "node_modules", manifest.name, "cli")))
      // The install script built the native kernels with this machine's compiler and Node's headers.
      assert.isTrue(existsSync(join(project, "node_modules", manifest.name, "native/build/kernels.node")))

      // A task of the user's own, checked by the new user's strict tsconfig against the package's declarations.
      writeFileSync(join(project, "tsconfig.json"), JSON.stringify(newUserTsconfig, null, 2))
      writeFileSync(join(project, "echo.ts"), echoTask)
      run("npx", ["tsc", "-p", "."], project)

      // The starter: written, its data generated, type-checked, solved by its oracle, trained.
      const init = run("npx", ["agentfly", "init", "my-task"], project)
      assert.include(init, "generated my-task/data/")
      assert.deepStrictEqual(readdirSync(join(project, "my-task", "data")).sort(), [
        "demos.jsonl",
        "heldout.jsonl",
        "train.jsonl"
      ])
      run("npx", ["tsc", "-p", "my-task"], project)
      const oracle = run("npx", ["agentfly", "oracle", "my-task/config.json", "--rows", "20"], project)
      assert.match(oracle, /solved 100\.0 %/)

      const configPath = join(project, "my-task", "config.json")
      const config = JSON.parse(readFileSync(configPath, "utf8")) as Record<string, Record<string, unknown>>
      // A few steps of each phase (the starter's defaults take minutes): enough warm-up that some answers are right,
      // so that the GRPO groups differ and the two steps train (a run that trains no step fails).
      writeFileSync(configPath, JSON.stringify({
        ...config,
        warmup: { ...config["warmup"], steps: 40 },
        algorithm: { ...config["algorithm"], steps: 2 },
        eval: { every: 2, size: 8 },
        checkpoint: { every: 2 }
      }))
      const trained = run("npx", ["agentfly", "train", "my-task/config.json"], project)
      assert.match(trained, /\[train\] step 2\/2/)
      const output = join(project, "my-task", "runs", "my-task")
      const records = readFileSync(join(output, "metrics.jsonl"), "utf8").trim().split("\n")
        .map((line) => JSON.parse(line) as { readonly phase?: string; readonly step?: number })
      assert.isTrue(records.some((r) => r.step === 2), `no record of step 2 in ${output}/metrics.jsonl`)
      assert.isTrue(existsSync(join(output, "report.html")))
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 15 * 60_000)
})
