/** Runs the `agentfly` CLI in a child process, as a user would. */
import { Effect } from "effect"
import { spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { readFileSync, writeFileSync } from "node:fs"
import { join, resolve } from "node:path"

const root = resolve(import.meta.dirname, "../..")

/**
 * The compiled `agentfly` program, as `node CLI ARGS…` runs it (built by test/setup/cli.ts): what an installed package
 * runs, without tsx's start-up.
 */
export const cli = join(root, "dist-test", "cli", "main.js")

/** The clone's `agentfly` program on its TypeScript sources, as `npx agentfly` runs it there (through tsx). */
const sourceCli = ["--import", "tsx", join(root, "cli", "main.ts")]

/** Runs `node ARGV…` from the repository root (see `agentfly`). */
const run = (argv: ReadonlyArray<string>, killWhen?: () => boolean, signal: NodeJS.Signals = "SIGKILL") =>
  Effect.callback<{ readonly code: number | null; readonly signal: string | null; readonly output: string }>(
    (resume) => {
      const child = spawn(process.execPath, argv, {
        cwd: root,
        stdio: ["ignore", "pipe", "pipe"]
      })
      let output = ""
      child.stdout.on("data", (d: Buffer) => (output += d.toString()))
      child.stderr.on("data", (d: Buffer) => (output += d.toString()))
      const timer = killWhen === undefined ? undefined : setInterval(() => {
        if (killWhen()) {
          clearInterval(timer)
          child.kill(signal)
        }
      }, 20)
      child.on("exit", (code, signal) => {
        if (timer !== undefined) clearInterval(timer)
        resume(Effect.succeed({ code, signal, output }))
      })
      return Effect.sync(() => child.kill("SIGKILL"))
    }
  )

/**
 * Runs `agentfly ARGS…` (compiled) from the repository root and collects its output; `killWhen` is polled every 20 ms
 * and, once true, the child gets `signal` (default SIGKILL), once. Interrupting the effect kills the child.
 */
export const agentfly = (args: ReadonlyArray<string>, killWhen?: () => boolean, signal: NodeJS.Signals = "SIGKILL") =>
  run([cli, ...args], killWhen, signal)

/** `agentfly`, run from the clone's TypeScript sources: for what only a clone says (how to link its node_modules). */
export const agentflyFromSources = (args: ReadonlyArray<string>) => run([...sourceCli, ...args])

/**
 * Writes `dir/config.json`: the shipped config `examples/NAME/short.json` pointed at freshly generated data in
 * `data` (train, held-out and demos) and at a model and run under `dir`; returns its path.
 */
export const shortConfig = (name: string, data: string, dir: string, file = "short.json"): string => {
  const short = JSON.parse(readFileSync(resolve(root, "examples", name, file), "utf8"))
  const config = join(dir, "config.json")
  writeFileSync(
    config,
    JSON.stringify({
      ...short,
      output: join(dir, "run"),
      model: { ...short.model, path: join(dir, "model") },
      data: { train: join(data, "train.jsonl"), eval: join(data, "heldout.jsonl") },
      warmup: { ...short.warmup, data: join(data, "demos.jsonl") }
    })
  )
  return config
}

/** The records of a run's `metrics.jsonl`. */
export const metricsOf = (
  output: string
): ReadonlyArray<{ readonly phase: string; readonly figures: Record<string, number> }> =>
  readFileSync(join(output, "metrics.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l))

/**
 * `agentfly eval CONFIG --checkpoint DIR/run/checkpoints/STEP --output DIR/eval.json`: the command's exit and
 * output, and the written result when it succeeded.
 */
export const evalCheckpoint = (config: string, dir: string, step: string) =>
  Effect.map(
    agentfly([
      "eval",
      config,
      "--checkpoint",
      join(dir, "run", "checkpoints", step),
      "--output",
      join(dir, "eval.json")
    ]),
    (run) => ({
      ...run,
      result: run.code === 0
        ? JSON.parse(readFileSync(join(dir, "eval.json"), "utf8")) as Record<string, any>
        : undefined
    })
  )

/**
 * `agentfly COMMAND ARGS…` (`serve`, `rollout-worker`, `trainer`) in a child process for the life of the scope: the
 * child, its API root once it says it listens (`… at http://HOST:PORT/v1`; or what `ready` captures), and its output
 * so far.
 */
export const startCommand = (command: string, args: ReadonlyArray<string>, ready = /at (http:\/\/\S+\/v1)/) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly child: ChildProcess; readonly url: string; readonly output: () => string }, Error>(
      (resume) => {
        const child = spawn(process.execPath, [cli, command, ...args], {
          cwd: root,
          stdio: ["ignore", "pipe", "pipe"]
        })
        let text = ""
        child.stdout.on("data", (chunk: Buffer) => {
          text += chunk.toString()
          const url = ready.exec(text)?.[1]
          if (url !== undefined) resume(Effect.succeed({ child, url, output: () => text }))
        })
        child.stderr.on("data", (chunk: Buffer) => (text += chunk.toString()))
        child.on("exit", (code) => resume(Effect.fail(new Error(`${command} exited with ${code}: ${text}`))))
        return Effect.sync(() => child.kill("SIGKILL"))
      }
    ),
    ({ child }) => Effect.sync(() => child.kill("SIGKILL"))
  )

/**
 * A short run of the calculator task on the tiny preset (data in `data/`, the model in `model/`, relative to the
 * config file), four chains a row and a 4-step warm-up; `rest` adds or replaces top-level sections, `agent` agent keys.
 */
export const calculatorRun = (rest: Record<string, unknown>, agent: Record<string, unknown> = {}) => ({
  model: { path: "model", preset: "tiny", initSeed: 3 },
  data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
  task: "calculator",
  agent: {
    systemPrompt: "Use the calculator tool.",
    renderTools: false,
    maxTurns: 2,
    numChains: 4,
    maxNewTokens: 24,
    maxContextTokens: 256,
    ...agent
  },
  warmup: { data: "data/demos.jsonl", steps: 4, batchSize: 8, lr: 0.003 },
  ...rest
})
