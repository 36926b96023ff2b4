/**
 * `agentfly init DIR`: a starter task folder that type-checks and trains as it is — a task (`task.ts`: a tool, a
 * reward and an oracle), its generator (`generate.ts`: rows, and the oracle's solved games as the warm-up's
 * demonstrations), a run config (`config.json`), a five-line README, and the `package.json` and `tsconfig.json` that
 * make the folder an ES module checked strictly. The data is generated once here, so `agentfly train DIR/config.json`
 * runs next.
 *
 * @since 0.1.0
 */
import { Console, Effect, FileSystem, Path, Schema } from "effect"
import { Argument, Command } from "effect/cli"
import { pathToFileURL } from "node:url"
import { importUserModule } from "../src/internal/userModule.ts"
import { exitOnFailure } from "./train.ts"

/**
 * Why `agentfly init` wrote nothing: the folder already holds files, or its name cannot be a task's name.
 *
 * @category errors
 * @since 0.1.0
 */
export class InitError extends Schema.TaggedError<InitError>()("InitError", {
  dir: Schema.String,
  message: Schema.String
}) {}

/**
 * The package a starter imports, as it is published (`package.json`'s name).
 *
 * @category constants
 * @since 0.1.0
 */
export const packageName = "agentfly-ts"

/** The task's name: the folder's, kept to what a run's name and a metric key read well with. */
const taskName = (dir: string): string | undefined => {
  const name = dir.replace(/\/+$/, "").split("/").at(-1) ?? ""
  return /^[A-Za-z0-9][\w.-]*$/.test(name) ? name : undefined
}

const taskModule = (name: string) => `/**
 * ${name}: the agent adds two integers with the \`add\` tool, then replies with the sum. A starting point: change the
 * row, the tools, the reward (and keep the oracle able to solve it), then \`npx tsx generate.ts\` and
 * \`npx agentfly train config.json\`.
 */
import { Effect, Schema } from "effect"
import { Reward, Task, Tool, Trajectory } from "${packageName}"
import { Oracle } from "${packageName}/testing"

/** The agent's tool: its parameters are a Schema, so a malformed call is answered with what was wrong. */
export const add = Tool.make("add", {
  description: "Add two integers",
  parameters: Schema.Struct({ a: Schema.Int, b: Schema.Int }),
  handler: ({ a, b }) => Effect.succeed(String(a + b))
})

/** 1 when the last reply is the row's sum (\`acc\` is the accuracy the run reports). */
export const correct = Reward.make("correct", {
  row: Schema.Struct({ answer: Schema.Int }),
  score: ({ trajectory, row }) => {
    const right = Trajectory.lastAssistantText(trajectory).trim() === String(row.answer)
    return Effect.succeed({ reward: right ? 1 : 0, metrics: { acc: right ? 1 : 0 } })
  }
})

export const task = Task.make("${name}", {
  row: Schema.Struct({ a: Schema.Int, b: Schema.Int, answer: Schema.Int }),
  tools: [add],
  reward: correct,
  defaults: {
    systemPrompt: "Add the two numbers with the add tool, then reply with the sum only.",
    renderTools: false,
    maxTurns: 2,
    maxNewTokens: 64
  }
})

/** The oracle (\`npx agentfly oracle config.json\`): calls \`add\` on the question's numbers, then says the result. */
export const oracle: Oracle.Policy = (messages: Oracle.Conversation) => {
  const result = Oracle.last(messages, "tool")
  if (result !== undefined) return { content: Oracle.text(result) }
  const [a = 0, b = 0] = (Oracle.text(Oracle.last(messages, "user")).match(/-?\\d+/g) ?? []).map(Number)
  return { toolCalls: [Oracle.call(messages, "add", { a, b })] }
}
`

const generatorModule = () => `/**
 * Writes data/: \`train.jsonl\` and \`heldout.jsonl\` (rows: the question, and the fields the reward reads) and
 * \`demos.jsonl\` (the oracle's solved games, the warm-up's demonstrations). Seeded: the same bytes every time.
 *
 *   npx tsx generate.ts
 */
import { Effect } from "effect"
import { mkdirSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { Sampling } from "${packageName}"
import { Oracle } from "${packageName}/testing"
import { oracle, task } from "./task.ts"

const rows = (n: number, next: () => number) =>
  Array.from({ length: n }, () => {
    const [a, b] = [Math.floor(next() * 10), Math.floor(next() * 10)]
    return { question: \`What is \${a} + \${b}?\`, a, b, answer: a + b }
  })

const jsonl = (values: ReadonlyArray<unknown>) => values.map((v) => JSON.stringify(v)).join("\\n") + "\\n"

/** Generates the three files under \`dir\`; resolves to how many lines each holds. */
export const generate = (dir: string) =>
  Effect.runPromise(Effect.gen(function*() {
    const next = Sampling.mulberry32(2026)
    const [train, heldOut, games] = [rows(400, next), rows(50, next), rows(300, next)]
    const demos = Oracle.demonstrations(yield* Oracle.rollout({ task, rows: games, policy: oracle }))
    mkdirSync(dir, { recursive: true })
    writeFileSync(join(dir, "train.jsonl"), jsonl(train))
    writeFileSync(join(dir, "heldout.jsonl"), jsonl(heldOut))
    writeFileSync(join(dir, "demos.jsonl"), jsonl(demos))
    return { train: train.length, heldOut: heldOut.length, demos: demos.length }
  }))

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  console.log(await generate(join(import.meta.dirname, "data")))
}
`

/** The run config: the tiny preset from scratch, a short warm-up on the oracle's games, then GRPO. */
const config = (name: string) => ({
  task: "./task.ts",
  seed: 1,
  output: `runs/${name}`,
  model: { path: "runs/model", preset: "tiny", initSeed: 1 },
  data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
  agent: { numChains: 4, maxContextTokens: 384, temperature: 1 },
  warmup: { data: "data/demos.jsonl", steps: 300, lr: 0.002, batchSize: 8 },
  algorithm: { steps: 20, groupsPerStep: 4, lr: 0.0003 },
  eval: { every: 10, size: 50 },
  checkpoint: { every: 10 }
})

const readme = (name: string) => `# ${name}
An agentfly task: \`task.ts\` (tool, reward, oracle), \`generate.ts\` (its data), \`config.json\` (the run).
- \`npx tsx generate.ts\` writes \`data/\` again; \`npx tsc -p .\` type-checks the folder.
- \`npx agentfly oracle config.json\` plays the oracle; \`npx agentfly train config.json\` trains (into \`runs/\`).
- Guides: \`node_modules/${packageName}/README.md\` and \`node_modules/${packageName}/docs/\`.
`

/** Strict, as a new TypeScript project is, plus what a folder of \`.ts\` modules run by tsx needs. */
const tsconfig = {
  compilerOptions: {
    target: "es2022",
    module: "nodenext",
    strict: true,
    exactOptionalPropertyTypes: true,
    noUncheckedIndexedAccess: true,
    verbatimModuleSyntax: true,
    allowImportingTsExtensions: true,
    noEmit: true,
    skipLibCheck: true,
    types: ["node"]
  },
  include: ["*.ts"]
}

/**
 * The starter's files, by path relative to its folder (`name` is the task's name).
 *
 * @category constructors
 * @since 0.1.0
 */
export const files = (name: string): Readonly<Record<string, string>> => ({
  "task.ts": taskModule(name),
  "generate.ts": generatorModule(),
  "config.json": `${JSON.stringify(config(name), null, 2)}\n`,
  "README.md": readme(name),
  "package.json": `${JSON.stringify({ name, private: true, type: "module" }, null, 2)}\n`,
  "tsconfig.json": `${JSON.stringify(tsconfig, null, 2)}\n`,
  ".gitignore": "runs/\n"
})

/**
 * Writes the starter into `dir` (created; refused when it holds anything) and generates its data by running its own
 * `generate.ts`. Returns the files written and the generator's counts, or why generating failed (the files stay).
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("init.write")(function*(dir: string) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const name = taskName(path.resolve(dir))
  if (name === undefined) {
    return yield* new InitError({ dir, message: `${dir}: a task folder's name is letters, digits, '.', '-', '_'` })
  }
  const held = yield* fs.readDirectory(dir).pipe(Effect.orElseSucceed(() => []))
  if (held.length > 0) {
    const entries = `${held.length} ${held.length === 1 ? "entry" : "entries"}`
    return yield* new InitError({ dir, message: `${dir} already holds ${entries}: give a new or empty folder` })
  }
  yield* fs.makeDirectory(dir, { recursive: true })
  const written = files(name)
  for (const [file, text] of Object.entries(written)) yield* fs.writeFileString(path.join(dir, file), text)
  const generator = pathToFileURL(path.resolve(dir, "generate.ts")).href
  const generate = (module: Record<string, unknown>) =>
    (module["generate"] as (dir: string) => Promise<Record<string, number>>)(path.resolve(dir, "data"))
  const data = yield* Effect.tryPromise(() => importUserModule(generator).then(generate)).pipe(Effect.result)
  return { name, files: Object.keys(written), data }
})

/**
 * @category commands
 * @since 0.1.0
 */
export const init = Command.make(
  "init",
  { dir: Argument.String("dir").pipe(Argument.withDescription("The new task's folder (its name is the task's)")) },
  Effect.fn("init")(function*({ dir }) {
    yield* Effect.gen(function*() {
      const made = yield* write(dir)
      yield* Console.log(`wrote ${dir}/: ${made.files.join(", ")}`)
      if (made.data._tag === "Success") {
        const counts = Object.entries(made.data.success).map(([split, n]) => `${n} ${split}`).join(", ")
        yield* Console.log(`generated ${dir}/data/: ${counts}\nnext: npx agentfly train ${dir}/config.json`)
      } else {
        const cause = made.data.failure
        const why = cause instanceof Error && cause.cause instanceof Error ? cause.cause.message : String(cause)
        yield* Console.error(
          `could not generate ${dir}/data/ (${why}): is ${packageName} installed in this project? ` +
            `Then run \`npx tsx generate.ts\` in ${dir}`
        )
        process.exitCode = 1
      }
    }).pipe(exitOnFailure)
  })
).pipe(Command.withDescription("Write a starter task folder (task, generator with an oracle, config, README)"))
