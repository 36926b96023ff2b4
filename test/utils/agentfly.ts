/** Runs the `agentfly` CLI in a child process, as a user would. */
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { resolve } from "node:path"

const root = resolve(import.meta.dirname, "../..")

/**
 * Runs `agentfly ARGS…` from the repository root and collects its output; `killWhen` is polled every 20 ms and,
 * once true, the child gets SIGKILL. Interrupting the effect kills the child.
 */
export const agentfly = (args: ReadonlyArray<string>, killWhen?: () => boolean) =>
  Effect.callback<{ readonly code: number | null; readonly signal: string | null; readonly output: string }>(
    (resume) => {
      const child = spawn(process.execPath, ["--import", "tsx", "cli/main.ts", ...args], {
        cwd: root,
        stdio: ["ignore", "pipe", "pipe"]
      })
      let output = ""
      child.stdout.on("data", (d: Buffer) => (output += d.toString()))
      child.stderr.on("data", (d: Buffer) => (output += d.toString()))
      const timer = killWhen === undefined ? undefined : setInterval(() => {
        if (killWhen()) child.kill("SIGKILL")
      }, 20)
      child.on("exit", (code, signal) => {
        if (timer !== undefined) clearInterval(timer)
        resume(Effect.succeed({ code, signal, output }))
      })
      return Effect.sync(() => child.kill("SIGKILL"))
    }
  )
