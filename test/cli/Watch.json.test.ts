/**
 * What `agentfly train|eval|oracle` print for machines and for people at a terminal: `--json` is one JSON object on
 * stdout (messages on stderr, a failure as `{ ok: false, error }` with exit code 1); a progress bar is drawn only when
 * the output is a terminal (under a pseudo-terminal here, from `script`), and piped output has none.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { existsSync, mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as Oracle from "../../actors/Oracle.ts"
import * as Progress from "../../actors/Progress.ts"
import * as CalculatorData from "../../examples/calculator/generate.ts"
import { task } from "../../examples/guess/task.ts"
import * as SearchData from "../../examples/search/generate.ts"
import { cli } from "../utils/agentfly.ts"

const root = resolve(import.meta.dirname, "../..")

interface Ran {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** `agentfly ARGS…` in a child process, stdout and stderr apart; with `tty`, under a pseudo-terminal (both merged). */
const agentfly = (args: ReadonlyArray<string>, options: { readonly tty?: boolean } = {}) =>
  Effect.callback<Ran>((resume) => {
    const command = [process.execPath, cli, ...args]
    const child = options.tty === true
      ? spawn("script", ["-qefc", command.map((w) => `'${w}'`).join(" "), "/dev/null"], {
        cwd: root,
        stdio: ["ignore", "pipe", "pipe"],
        env: { ...process.env, COLUMNS: "100" }
      })
      : spawn(command[0]!, command.slice(1), { cwd: root, stdio: ["ignore", "pipe", "pipe"] })
    let [stdout, stderr] = ["", ""]
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()))
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()))
    child.on("exit", (code) => resume(Effect.succeed({ code, stdout, stderr })))
    return Effect.sync(() => child.kill("SIGKILL"))
  })

/** The one JSON object stdout holds (and nothing else). */
const onlyJson = (stdout: string): Record<string, any> => {
  const lines = stdout.trim().split("\n")
  assert.strictEqual(lines.length, 1, stdout)
  return JSON.parse(lines[0]!)
}

describe("agentfly --json and progress", () => {
  it("the bar: counts, eta, fitted to the columns; redrawn at most every 100 ms and at the end; cleared", () => {
    assert.strictEqual(
      Progress.formatBar({ label: "eval", unit: "questions", done: 5, total: 10 }, 30, 80),
      "eval ▕███████████████░░░░░░░░░░░░░░░▏ 5/10 questions  0m30s  eta 0m30s"
    )
    assert.isAtMost(Progress.formatBar({ label: "eval", unit: "rows", done: 1, total: 3 }, 1, 40).length, 39)
    const written: Array<string> = []
    let now = 0
    const bar = Progress.bar({ label: "x", unit: "rows", total: 3, write: (t) => written.push(t), now: () => now })
    bar.groupDone()
    now = 50
    bar.groupDone() // within 100 ms of the last draw: not drawn
    now = 60
    bar.groupDone() // the last: always drawn
    assert.strictEqual(written.length, 2)
    assert.include(written[1]!, "3/3 rows")
    bar.done()
    assert.strictEqual(written.at(-1), "\r\x1b[2K")
  })

  it.effect("the rollout runtime tells the listener once per finished group", () =>
    Effect.gen(function*() {
      let groups = 0
      const rows = Array.from({ length: 7 }, (_, i) => ({ question: "Find my number.", secret: i + 1 }))
      const played = yield* Oracle.rollout({ task, rows, policy: () => ({ content: "I give up" }) }).pipe(
        Effect.provideService(Progress.Progress, { groupDone: () => void groups++ })
      )
      assert.strictEqual(played.length, 7)
      assert.strictEqual(groups, 7)
    }))

  it.effect(
    "oracle: --json prints one object; piped output has no bar; a terminal shows one",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "json-oracle-"))
        yield* SearchData.write({ ...SearchData.defaults, train: 4, heldOut: 6, validation: 2, demos: 4, dir })
        const config = join(dir, "search.json")
        writeFileSync(config, JSON.stringify({
          task: "search",
          output: "run",
          model: { path: "model" },
          data: { train: join(dir, "heldout.jsonl"), eval: join(dir, "heldout.jsonl") },
          algorithm: { steps: 1 }
        }))
        const json = yield* agentfly(["oracle", config, "--rows", "5", "--json"])
        assert.strictEqual(json.code, 0, json.stderr)
        const result = onlyJson(json.stdout)
        assert.strictEqual(result.ok, true)
        assert.strictEqual(result.command, "oracle")
        assert.strictEqual(result.rows, 5)
        assert.strictEqual(result.solveRate, 1)
        assert.strictEqual(result.episodes.length, 5)
        assert.isNull(result.failures)

        const piped = yield* agentfly(["oracle", config, "--rows", "5"])
        assert.match(piped.stdout, /^5 rows: solved 100\.0 %/)
        assert.notInclude(piped.stdout + piped.stderr, "▕")
        const terminal = yield* agentfly(["oracle", config, "--rows", "5"], { tty: true })
        assert.include(terminal.stdout, "oracle ▕")
        assert.include(terminal.stdout, "5/5 rows")
        assert.include(terminal.stdout, "5 rows: solved 100.0 %")
      }).pipe(Effect.provide(NodeServices.layer)),
    120_000
  )

  it.live(
    "train and eval: --json is the summary on stdout, the messages on stderr; a failure is { ok: false } and exit 1",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "json-train-"))
        yield* CalculatorData.write({
          dir: join(dir, "data"),
          seed: 4,
          train: 8,
          heldOut: 3,
          validation: 0,
          demos: 0,
          noise: 0
        }).pipe(Effect.provide(NodeServices.layer))
        const config = join(dir, "config.json")
        writeFileSync(config, JSON.stringify({
          seed: 5,
          output: join(dir, "run"),
          model: { path: join(dir, "model"), preset: "tiny", initSeed: 2 },
          data: { train: join(dir, "data", "train.jsonl"), eval: join(dir, "data", "heldout.jsonl") },
          task: "calculator",
          agent: { renderTools: false, maxTurns: 2, numChains: 2, maxNewTokens: 24 },
          algorithm: { steps: 2, groupsPerStep: 2, lr: 0.01, entropyCoef: 0.01, advantage: "reinforce++" },
          eval: { every: 2, temperature: 1 },
          checkpoint: { every: 2 }
        }))
        const trained = yield* agentfly(["train", config, "--json"])
        assert.strictEqual(trained.code, 0, trained.stderr)
        const summary = onlyJson(trained.stdout)
        assert.strictEqual(summary.ok, true)
        assert.strictEqual(summary.command, "train")
        assert.strictEqual(summary.steps, 2)
        assert.strictEqual(summary.trained + summary.skipped + summary.criticOnly, 2)
        assert.isTrue(existsSync(summary.report), summary.report)
        assert.strictEqual(summary.heldOut.last.step, 2)
        assert.isNumber(summary.heldOut.last.figures["eval/accuracy"])
        assert.include(trained.stderr, "report: ")

        const checkpoint = join(dir, "run", "checkpoints", "step-000002")
        const evaluated = yield* agentfly(["eval", config, "--checkpoint", checkpoint, "--json"])
        assert.strictEqual(evaluated.code, 0, evaluated.stderr)
        const figures = onlyJson(evaluated.stdout)
        assert.strictEqual(figures.command, "eval")
        assert.strictEqual(figures.questions, 3)
        // The run's own evaluation at step 2, repeated.
        assert.deepStrictEqual(figures.figures, summary.heldOut.last.figures)
        assert.include(evaluated.stderr, "held-out accuracy")

        const failed = yield* agentfly(["train", join(dir, "missing.json"), "--json"])
        assert.strictEqual(failed.code, 1)
        const error = onlyJson(failed.stdout)
        assert.strictEqual(error.ok, false)
        assert.include(error.error.message, "missing.json")
        assert.include(failed.stderr, "missing.json")
      }),
    240_000
  )
})
