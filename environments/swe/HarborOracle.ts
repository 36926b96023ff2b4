/**
 * Scripted players of the SWE task, run by the rollout machinery (`Oracle.rollout`) through the same tools,
 * containers and verifier as a model:
 *
 * - {@link oracle}: Harbor's oracle agent: with the `shell` tool, uploads the task's `solution/` to `/solution`
 *   byte for byte and executes `/solution/solve.sh` as a file (its shebang decides the shell) with
 *   `[solution.env]`, from the working directory (after reading a file first, with `look`), then submits. It
 *   finds the task by its instruction (the row's question), so it proves each task solvable in its own container
 *   and the verifier right;
 * - {@link idle}: submits at once: the baseline that must score 0 (the planted bug is still there).
 *
 * @since 0.1.0
 */
import * as Oracle from "../../actors/Oracle.ts"
import type { Conversation } from "../../src/Message.ts"
import type * as HarborTask from "./HarborTask.ts"
import * as Workspace from "./Workspace.ts"

/**
 * The shell command that plays a task's solution as Harbor's oracle agent does: `solution/` uploaded to
 * `/solution`, `solve.sh` made executable and executed with `[solution.env]` (undefined without `solve.sh`).
 *
 * @category getters
 * @since 0.1.0
 */
export const solutionCommand = (
  task: HarborTask.HarborTask,
  step?: HarborTask.Step
): string | undefined => {
  const { solution, solutionFiles } = step ?? task
  return solution === undefined ? undefined : [
    `here=$(pwd)`,
    ...Workspace.uploadLines("/solution", solutionFiles),
    "chmod -R a+rX /solution; chmod a+x /solution/solve.sh",
    ...Workspace.exportLines(task.env.solution),
    `cd "$here" && /solution/solve.sh`
  ].join("\n")
}

/**
 * The oracle's calls for a task: its solution and `submit`; for a multi-step task, each step's solution
 * (`steps/<name>/solution/solve.sh`) and `submit`, in order (undefined where a solution is missing).
 */
const planOf = (task: HarborTask.HarborTask): ReadonlyArray<readonly [string, Record<string, unknown>]> | undefined => {
  const commands = task.steps.length === 0
    ? [solutionCommand(task)]
    : task.steps.map((step) => solutionCommand(task, step))
  if (commands.some((c) => c === undefined)) return undefined
  return commands.flatMap((cmd) => [["shell", { cmd }] as const, ["submit", {}] as const])
}

/**
 * The oracle over the given tasks: the solution of the task whose instruction the conversation asks, then
 * `submit` (a multi-step task: each step's, in order). A task without a solution (or a step without one), or an
 * instruction it does not know, gets a reply without a call.
 *
 * @category constructors
 * @since 0.1.0
 */
export const oracle = (
  tasks: ReadonlyArray<HarborTask.HarborTask>,
  options: { readonly look?: string | undefined } = {}
): Oracle.Policy => {
  const byInstruction = new Map(tasks.map((t) => [t.instruction, planOf(t)]))
  const plan = (calls: ReadonlyArray<readonly [string, Record<string, unknown>]>) => [
    ...(options.look === undefined ? [] : [["read", { path: options.look }] as const]),
    ...calls
  ]
  return (messages: Conversation) => {
    const question = Oracle.text(messages.find((m) => m.role === "user")).trim()
    const calls = byInstruction.get(question)
    if (calls === undefined) return { content: "I do not know this task." }
    const next = plan(calls)[messages.filter((m) => m.role === "assistant").length]
    return next === undefined ? { content: "done" } : { toolCalls: [Oracle.call(messages, next[0], next[1])] }
  }
}

/**
 * Submits at once.
 *
 * @category constants
 * @since 0.1.0
 */
export const idle: Oracle.Policy = (messages) => ({ toolCalls: [Oracle.call(messages, "submit", {})] })
