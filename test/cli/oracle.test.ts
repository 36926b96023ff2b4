/**
 * `agentfly oracle`: a prebuilt environment's oracle played on a config's held-out rows through the config's own
 * task (here search, with its generated world), solving them; a task of your own plays the `oracle` its module
 * exports; a task without an oracle is a sentence, not a crash.
 * The swe task's oracle (Harbor's: each folder's `solve.sh`, then submit) on the real Docker engine, which the
 * suite's global setup starts; from the command line, an engine that is not running or does not answer is said at
 * once, in a sentence, with exit code 1.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as OracleCli from "../../cli/oracle.ts"
import * as Puzzle from "../../environments/chess/Puzzle.ts"
import * as BugFix from "../../environments/swe/BugFix.ts"
import * as Generate from "../../examples/search/generate.ts"
import { cli } from "../utils/agentfly.ts"

const root = resolve(import.meta.dirname, "../..")

/** `dir/NAME.json`: a config of `task` whose held-out rows are `data/heldout.jsonl`. */
const configOf = (dir: string, name: string, task: unknown) => {
  const file = join(dir, `${name}.json`)
  writeFileSync(file, JSON.stringify({
    task,
    output: "run",
    model: { path: "model" },
    data: { train: "data/heldout.jsonl", eval: "data/heldout.jsonl" },
    algorithm: { steps: 1 }
  }))
  return file
}

/** Three generated bug-fix tasks as Harbor folders under `dir/data/tasks`, and their rows. */
const sweData = (dir: string) =>
  Effect.gen(function*() {
    const tasks = BugFix.generate(3, 3, "heldout")
    yield* BugFix.write(join(dir, "data", "tasks"), tasks)
    const rows = tasks.map((t) => JSON.stringify({ question: t.instruction, task: `tasks/${t.name}` }))
    writeFileSync(join(dir, "data", "heldout.jsonl"), rows.join("\n") + "\n")
    return configOf(dir, "swe", { name: "swe", options: { root: "data" } })
  })

/** `agentfly oracle ARGS…` in a child process with `env` added to its environment. */
const oracleCommand = (args: ReadonlyArray<string>, env: Record<string, string>) =>
  Effect.callback<{ readonly code: number | null; readonly output: string }>((resume) => {
    const child = spawn(process.execPath, [cli, "oracle", ...args], {
      cwd: root,
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"]
    })
    let output = ""
    child.stdout.on("data", (d: Buffer) => (output += d.toString()))
    child.stderr.on("data", (d: Buffer) => (output += d.toString()))
    child.on("exit", (code) => resume(Effect.succeed({ code, output })))
    return Effect.sync(() => child.kill("SIGKILL"))
  })

describe("agentfly oracle", () => {
  it.effect(
    "plays the task's oracle on the config's held-out rows; a task without one is named",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "oracle-"))
        yield* Generate.write({
          ...Generate.defaults,
          train: 4,
          heldOut: 12,
          validation: 2,
          demos: 4,
          dir: join(dir, "data")
        })
        const config = (task: string) => configOf(dir, task, task)
        const played = yield* OracleCli.play(config("search"), 10)
        assert.strictEqual(played.length, 10)
        assert.isTrue(played.every((t) => t.reward === 1), played.map((t) => t.reward).join(","))
        const none = yield* Effect.flip(OracleCli.play(config("calculator")))
        assert.include(
          (none as Error).message,
          "task calculator has no oracle here (the prebuilt ones: search, webshop"
        )
        assert.include((none as Error).message, "Oracle.rollout({ task, rows, policy })")
        assert.include((none as Error).message, "science, vqa, gui, simuscene, swe)")
      }).pipe(Effect.provide(NodeServices.layer)),
    120_000
  )

  it.effect(
    "a task of your own plays the oracle its module exports; an oracle that is not a function is named",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "oracle-own-"))
        mkdirSync(join(dir, "data"))
        const rows = Array.from(
          { length: 15 },
          (_, i) => JSON.stringify({ question: "Find my number.", secret: i + 1 })
        )
        writeFileSync(join(dir, "data", "heldout.jsonl"), rows.join("\n") + "\n")
        const module = (oracle: string) => `
import * as Oracle from "${root}/actors/Oracle.ts"
export { task } from "${root}/examples/guess/task.ts"
export const oracle = ${oracle}`
      // Bisection from the game's answers (the README's oracle).
      writeFileSync(join(dir, "mine.mts"), module(`(messages) => {
  let [lo, hi] = [1, 15]
  for (const [i, m] of messages.entries()) {
    const n = Number(m.role === "assistant" ? m.tool_calls?.[0]?.function.arguments?.n ?? NaN : NaN)
    const said = Oracle.text(messages.slice(i + 1).find((later) => later.role === "user"))
    if (!Number.isNaN(n)) [lo, hi] = said.startsWith("Higher") ? [n + 1, hi] : [lo, n - 1]
  }
  return { toolCalls: [Oracle.call(messages, "guess", { n: Math.floor((lo + hi) / 2) })] }
}`))
      const played = yield* OracleCli.play(configOf(dir, "mine", "./mine.mts"), 15)
      assert.strictEqual(played.length, 15)
      assert.isTrue(played.every((t) => t.episodeEnd === "solved"), played.map((t) => t.episodeEnd).join(","))
      assert.match(OracleCli.summary(played), /^15 rows: solved 100\.0 %, mean reward \d\.\d{3}\n\nsystem: /)
      // The module run directly (its own `config` beside `task` and `oracle`).
      const config = {
        output: "run",
        model: { path: "model" },
        data: { train: "data/heldout.jsonl", eval: "data/heldout.jsonl" },
        algorithm: { steps: 1 }
      }
      const mine = readFileSync(join(dir, "mine.mts"), "utf8")
      writeFileSync(join(dir, "direct.mts"), `${mine}\nexport const config = ${JSON.stringify(config)}\n`)
      const direct = yield* OracleCli.play(join(dir, "direct.mts"), 4)
      assert.deepStrictEqual(direct.map((t) => t.episodeEnd), ["solved", "solved", "solved", "solved"])
      writeFileSync(join(dir, "odd.mts"), module(`"bisect"`))
      const odd = yield* Effect.flip(OracleCli.play(configOf(dir, "odd", "./odd.mts"), 1))
      assert.include((odd as Error).message, "exports an `oracle` that is not a function")
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.live("an episode whose step throws is said in the summary, not read as an oracle that loses", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "oracle-broken-"))
      mkdirSync(join(dir, "data"))
      const rows = [3, 8, 12].map((secret) => JSON.stringify({ question: "Find my number.", secret }))
      writeFileSync(join(dir, "data", "heldout.jsonl"), rows.join("\n") + "\n")
      writeFileSync(join(dir, "broken.mts"), `
import * as Oracle from "${root}/actors/Oracle.ts"
import { Environment, Task } from "${root}/src/index.ts"
import { found, Game, guess, task as plain } from "${root}/examples/guess/task.ts"
export const task = Task.make("broken-guess", {
  row: plain.row, tools: [guess], reward: found, environment: Environment.perChain(Game.layer),
  episode: { start: plain.episode.start, step: () => { throw new Error("boom in my step") } },
  defaults: plain.defaults
})
export const oracle = (messages) => ({ toolCalls: [Oracle.call(messages, "guess", { n: 8 })] })`
        )
        const played = yield* OracleCli.play(configOf(dir, "broken", "./broken.mts"), 3)
        const text = OracleCli.summary(played)
        assert.include(
          text,
          "3 rows: solved 0.0 %, mean reward 0.000; 3 of 3 trajectories failed (ChainDefect), counted as wrong; " +
            "first: ChainDefect: Error: boom in my step\n"
        )
      }).pipe(Effect.provide(NodeServices.layer)),
    120_000
  )

  it.effect(
    "swe: Harbor's oracle solves every held-out task in its own container (Docker)",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "oracle-swe-"))
        const config = yield* sweData(dir)
        const played = yield* OracleCli.play(config, 3)
        assert.strictEqual(played.length, 3)
        for (const t of played) {
          assert.strictEqual(t.reward, 1, `${t.row?.["task"]}: ${t.error}`)
          assert.strictEqual(t.episodeEnd, "submitted")
        }
        // A row whose folder is not there is named before any container starts.
        writeFileSync(
          join(dir, "data", "heldout.jsonl"),
          JSON.stringify({ question: "Fix it.", task: "tasks/nope" }) + "\n"
        )
        const missing = yield* Effect.flip(OracleCli.play(config, 1))
        assert.include((missing as Error).message, "tasks/nope: task.toml (task.toml) is missing")
      }).pipe(Effect.provide(NodeServices.layer)),
    300_000
  )

  it.live(
    "swe from the command line: an engine that is not running, or does not answer, is said with exit 1",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "oracle-nodocker-"))
        const config = yield* sweData(dir).pipe(Effect.provide(NodeServices.layer))
        const absent = yield* oracleCommand([config, "--rows", "1"], { DOCKER_HOST: `unix://${dir}/absent.sock` })
        assert.strictEqual(absent.code, 1, absent.output)
        assert.include(
          absent.output,
          `the swe task runs each chain in a container: ` +
            `the Docker engine at ${dir}/absent.sock is not running or does not answer`
        )
        // A socket that takes connections and never answers (a hung engine): said after the ping's 5 s, not a hang.
        const socket = join(dir, "hung.sock")
        const hung = yield* Effect.acquireUseRelease(
          Effect.callback<ReturnType<typeof createServer>>((resume) => {
            const server = createServer(() => {})
            server.listen(socket, () => resume(Effect.succeed(server)))
          }),
          () => oracleCommand([config, "--rows", "1"], { DOCKER_HOST: `unix://${socket}` }),
          (server) => Effect.sync(() => server.close())
        )
        assert.strictEqual(hung.code, 1, hung.output)
        assert.include(
          hung.output,
          `the Docker engine at ${socket} is not running or does not answer (no answer in 5 s)`
        )
        // That it does not wait on the engine is what the message says: the ping gave up after 5 s (a hang would run
        // into this test's timeout). No wall-clock bound: two command starts take minutes on a loaded machine.
      }),
    600_000
  )
})

describe("agentfly oracle on chess", () => {
  it.effect(
    "plays each row's own line (a Lichess file's long lines included); below 100 % it says per theme what it solved",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "oracle-chess-"))
        mkdirSync(join(dir, "data"))
        const sample = Puzzle.fromLichessCsv(
          readFileSync(join(root, "examples/chess/lichess-sample.csv"), "utf8")
        ) as Array<Puzzle.Line>
        // The longest lines first, so that the first rows need more than a mate in two's budgets.
        const rows = [...sample].sort((a, b) => b.moves.length - a.moves.length).slice(0, 12)
        writeFileSync(join(dir, "data", "heldout.jsonl"), rows.map((r) => JSON.stringify(r)).join("\n") + "\n")
        const config = configOf(dir, "chess", { name: "chess", options: { view: "fen" } })
        const played = yield* OracleCli.playRows(config, 12)
        assert.isTrue(played.trajectories.every((t) => t.episodeEnd === "solved"))
        const all = OracleCli.summary(played.trajectories, played.rows)
        assert.match(all, /^12 rows: solved 100\.0 %, mean reward 1\.000\n\n/)
        assert.notInclude(all, "by theme")
        // One row missed: its themes (and only those) are below 100 %.
        const missed = played.trajectories.map((t, i) => (i === 0 ? { ...t, reward: 0, metrics: {} } : t))
        const below = OracleCli.themesBelow(missed, played.rows)
        assert.deepStrictEqual(new Set(below.map((b) => b.theme)), new Set(rows[0]!.themes))
        assert.include(OracleCli.summary(missed, played.rows), `below 100 % by theme: `)
        assert.match(OracleCli.summary(missed, played.rows), /veryLong \d+\/\d+ \(\d+\.\d %\)/)
      }).pipe(Effect.provide(NodeServices.layer)),
    240_000
  )
})
