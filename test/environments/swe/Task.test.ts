/**
 * The SWE task through the rollout runtime, on the real Docker engine (`Oracle.rollout`: the task's tools, a
 * container per chain from the resource manager, the episode, Harbor's verifier as the reward): Harbor's oracle
 * (the folders' `solve.sh`) solves every generated task, one per bug; submitting at once scores 0; malformed and
 * refused actions are typed error observations while the episode goes on; chains on the same task never see each
 * other's edits; a container killed under a chain is a typed crash, not a hang; a folder whose image cannot be
 * built fails its chains typed and the run goes on; no container outlives its chain.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import { execFileSync } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Oracle from "../../../actors/Oracle.ts"
import * as TaskRuntime from "../../../actors/TaskRuntime.ts"
import * as Tasks from "../../../environments/Tasks.ts"
import * as BugFix from "../../../environments/swe/BugFix.ts"
import * as HarborOracle from "../../../environments/swe/HarborOracle.ts"
import * as HarborTask from "../../../environments/swe/HarborTask.ts"
import * as SweTask from "../../../environments/swe/SweTask.ts"
import type { Conversation } from "../../../src/Message.ts"
import * as Task from "../../../src/Task.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"

const generated = BugFix.generate(7, BugFix.bugs.length)
const root = mkdtempSync(join(tmpdir(), "swe-task-"))
const loaded = Effect.runPromise(
  Effect.gen(function*() {
    yield* BugFix.write(root, generated)
    return yield* Effect.forEach(generated, (t) => HarborTask.load(`${root}/${t.name}`))
  }).pipe(Effect.provide(NodeServices.layer))
)
const rows = generated.map((t) => ({ question: t.instruction, task: t.name }))
const task = SweTask.make({ root, pool: 8 })

const tools = (t: Trajectory.Trajectory) => t.messages.filter((m) => m.role === "tool").map(Oracle.text)

/** A policy that plays a fixed list of calls, then stops. */
const scripted = (script: ReadonlyArray<readonly [string, Record<string, unknown>]>) => (messages: Conversation) => {
  const step = script[messages.filter((m) => m.role === "assistant").length]
  return step === undefined ? { content: "done" } : { toolCalls: [Oracle.call(messages, step[0], step[1])] }
}

/** The containers this test process created that are still on the engine (other test files run beside it). */
const containers = () =>
  execFileSync("docker", ["ps", "-aq", "--filter", `label=agentfly.pid=${process.pid}`], { encoding: "utf8" }).trim()

describe("swe task (Harbor folders, Docker)", () => {
  it.effect("Harbor's oracle solves every task (one per bug); submitting at once scores 0", () =>
    Effect.gen(function*() {
      const tasks = yield* Effect.promise(() => loaded)
      const solved = yield* Oracle.rollout({ task, rows, policy: HarborOracle.oracle(tasks) })
      assert.strictEqual(solved.length, BugFix.bugs.length)
      for (const t of solved) {
        assert.strictEqual(t.reward, 1, `${t.row?.["task"]}: ${t.error ?? tools(t).join(" | ")}`)
        assert.strictEqual(t.episodeEnd, "submitted")
        assert.strictEqual(t.metrics["reward/harbor/verifier_exit"], 0)
        assert.match(Oracle.text(t.messages[2]), /^Working directory \/app:\n\.:\ntextutil\.py/)
      }
      const idle = yield* Oracle.rollout({ task, rows, policy: HarborOracle.idle })
      assert.deepStrictEqual(idle.map((t) => t.reward), rows.map(() => 0), "the planted bugs fail their tests")
      assert.isTrue(idle.every((t) => t.metrics["reward/harbor/submitted"] === 1))
      assert.strictEqual(containers(), "", "no container outlived its chain")
    }), { timeout: 300_000 })

  it.effect("malformed and refused actions are typed error observations; the episode goes on", () =>
    Effect.gen(function*() {
      const [t] = yield* Oracle.rollout({
        task: SweTask.make({ root, shellTimeoutMillis: 1_000 }),
        rows: rows.slice(0, 1),
        policy: scripted([
          ["rm", { cmd: "ls" }],
          ["shell", { command: "ls" }],
          ["read", { path: "missing.py" }],
          ["edit", { path: "textutil.py", old: "no such text", new: "x" }],
          ["edit", { path: "textutil.py", old: "return", new: "x" }],
          ["shell", { cmd: "sleep 30" }],
          ["shell", { cmd: "python3 -c 'print(6 * 7)'" }],
          ["submit", {}]
        ])
      })
      const seen = tools(t!)
      assert.lengthOf(seen, 8)
      assert.match(seen[0]!, /^Error: unknown tool "rm"/)
      assert.match(seen[1]!, /^Error: invalid arguments for tool "shell"/)
      assert.match(seen[2]!, /^Error: cannot read missing\.py: .*No such file/)
      assert.match(seen[3]!, /^Error: the text to replace is not in textutil\.py/)
      assert.match(seen[4]!, /^Error: the text to replace occurs more than once in textutil\.py/)
      assert.match(seen[5]!, /^Error: .*exceeded 1000 ms/)
      assert.strictEqual(seen[6]!, "exit 0\n42\n")
      assert.strictEqual(seen[7]!, "submitted")
      assert.strictEqual(t!.episodeEnd, "submitted")
      assert.strictEqual(t!.reward, 0)
    }), { timeout: 300_000 })

  it.effect("chains on the same task have their own containers", () =>
    Effect.gen(function*() {
      const tasks = yield* Effect.promise(() => loaded)
      const fixer = HarborOracle.oracle(tasks)
      // Two rows on one task folder: the first asks its instruction (the oracle fixes it), the second only submits.
      const policy = (messages: Conversation) =>
        Oracle.text(messages[1]) === "Just submit." ? HarborOracle.idle(messages) : fixer(messages)
      const [fixed, idle] = yield* Oracle.rollout({
        task,
        rows: [rows[2]!, { question: "Just submit.", task: rows[2]!.task }],
        policy
      })
      assert.deepStrictEqual([fixed!.reward, idle!.reward], [1, 0], "the fix stayed in its own container")
      // Both chains append a line and count the lines: each sees its own pristine copy plus one.
      const counted = yield* Oracle.rollout({
        task,
        rows: [rows[2]!, rows[2]!, rows[2]!],
        policy: scripted([["shell", { cmd: "echo '# note' >> textutil.py && wc -l < textutil.py" }], ["submit", {}]])
      })
      const counts = counted.map((t) => tools(t)[0])
      assert.strictEqual(new Set(counts).size, 1, counts.join(" | "))
    }), { timeout: 300_000 })

  it.effect("a container killed under a chain is a typed crash; a folder that cannot build fails its chains only", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const killer = (messages: Conversation) => {
        const turn = messages.filter((m) => m.role === "assistant").length
        if (turn === 0) return { toolCalls: [Oracle.call(messages, "shell", { cmd: "hostname" })] }
        if (turn === 1) {
          execFileSync("docker", ["kill", Oracle.text(messages.at(-1)).split("\n")[1]!])
          return { toolCalls: [Oracle.call(messages, "shell", { cmd: "hostname" })] }
        }
        if (turn === 2) return { toolCalls: [Oracle.call(messages, "shell", { cmd: "hostname" })] }
        return { toolCalls: [Oracle.call(messages, "submit", {})] }
      }
      const [t] = yield* Oracle.rollout({ task, rows: rows.slice(0, 1), policy: killer })
      const seen = tools(t!)
      // The call that found the container dead is told so (its work is lost); the next runs on a fresh container.
      assert.match(seen[1]!, /^Error: .*(is not running|stdio closed)/)
      assert.match(seen[2]!, /^exit 0\n[0-9a-f]{12}\n$/)
      assert.notStrictEqual(seen[2], seen[0], "a new container")
      assert.strictEqual(t!.episodeEnd, "submitted")
      assert.strictEqual(t!.reward, 0, "the fresh container holds the unfixed task")
      // A folder whose Dockerfile names an image that does not exist: its chain fails typed, the other solves.
      const bad = `${root}/broken`
      yield* fs.makeDirectory(`${bad}/environment`, { recursive: true })
      yield* fs.makeDirectory(`${bad}/tests`, { recursive: true })
      yield* fs.writeFileString(`${bad}/task.toml`, "[task]\nname = \"broken\"\n")
      yield* fs.writeFileString(`${bad}/instruction.md`, "Nothing to do.\n")
      yield* fs.writeFileString(`${bad}/environment/Dockerfile`, "FROM agentfly/no-such-image:0\n")
      yield* fs.writeFileString(`${bad}/tests/test.sh`, "echo 1 > /logs/verifier/reward.txt\n")
      const tasks = yield* Effect.promise(() => loaded)
      const both = yield* Oracle.rollout({
        task,
        rows: [{ question: "Nothing to do.", task: "broken" }, rows[3]!],
        policy: HarborOracle.oracle(tasks)
      })
      assert.strictEqual(both[1]!.reward, 1)
      assert.strictEqual(both[0]!.reward, 0)
      assert.isTrue(both[0]!.masked, "an environment that never started does not train")
      assert.match(
        both[0]!.error!,
        /^EnvFailed: episode start: the image agentfly-harbor\/\w+:1 \(built from .*broken\/environment\) cannot be had/
      )
      assert.strictEqual(containers(), "", "no container outlived its chain")
    }).pipe(Effect.provide(NodeServices.layer)), { timeout: 300_000 })

  it.effect("actions go over the container's attached stdio (no engine exec); the exec transport runs the same", () =>
    Effect.gen(function*() {
      const tasks = yield* Effect.promise(() => loaded)
      const execs: Array<string> = []
      // Asks the container's name, then counts the engine's execs in it, then solves the task as the oracle does.
      const fixer = HarborOracle.oracle(tasks)
      const policy = (messages: Conversation) => {
        const turn = messages.filter((m) => m.role === "assistant").length
        if (turn === 0) return { toolCalls: [Oracle.call(messages, "shell", { cmd: "hostname" })] }
        if (turn === 1) {
          const id = Oracle.text(messages.at(-1)).split("\n")[1]!
          // The engine's exec_start events in this container since it was created.
          const events = execFileSync("docker", [
            "events",
            "--since",
            execFileSync("docker", ["inspect", "-f", "{{.Created}}", id], { encoding: "utf8" }).trim(),
            "--until",
            new Date().toISOString(),
            "--filter",
            `container=${id}`,
            "--filter",
            "event=exec_start",
            "--format",
            "x"
          ], { encoding: "utf8" })
          execs.push(String(events.split("\n").filter((l) => l === "x").length))
        }
        return fixer(messages.filter((_, i) => i < 3 || i > 4))
      }
      const viaStdio = yield* Oracle.rollout({ task, rows: rows.slice(0, 2), policy })
      const viaExec = yield* Oracle.rollout({
        task: SweTask.make({ root, transport: "exec" }),
        rows: rows.slice(0, 2),
        policy
      })
      assert.deepStrictEqual(viaStdio.map((t) => t.reward), [1, 1])
      assert.deepStrictEqual(viaExec.map((t) => t.reward), [1, 1])
      assert.deepStrictEqual(execs.slice(0, 2), ["0", "0"], "attach: no exec in the container")
      assert.isTrue(execs.slice(2).every((n) => Number(n) >= 2), `exec: one per action (${execs.slice(2)})`)
    }), { timeout: 300_000 })

  it.effect("resolves as the built-in task swe, with options checked strictly", () =>
    Effect.gen(function*() {
      const resolve = (ref: Task.Ref) => Task.resolve(ref, { builtins: Tasks.builtins, resolvePath: (p) => p })
      const named = yield* resolve({ name: "swe", options: { root, toolCallFormat: 0.2 } })
      assert.strictEqual(named.reward?.name, "harbor + 0.2·toolCallFormat")
      assert.deepStrictEqual(named.tools.map((t) => t.name), ["shell", "read", "edit", "submit"])
      assert.strictEqual((yield* Effect.flip(resolve({ name: "swe", options: { pool: 0 } }))).reason._tag, "Options")
      // A config's root is relative to the config file: it resolves where the config's other paths do.
      const fromConfig = yield* Task.resolve({ name: "swe", options: { root: "swe-task-folders" } }, {
        builtins: Tasks.builtins,
        resolvePath: (p) => join(root, "..", p)
      })
      const runtime = yield* Effect.flip(TaskRuntime.make(fromConfig))
      // A root that is not there stops the run at its start (it failed every chain after the warm-up before).
      assert.strictEqual(runtime.reason._tag, "Environment")
      assert.include(runtime.message, `the task folders' root ${join(root, "..", "swe-task-folders")} does not exist`)
      const there = yield* Task.resolve({ name: "swe", options: { root: root.split("/").at(-1)! } }, {
        builtins: Tasks.builtins,
        resolvePath: (p) => join(root, "..", p)
      })
      const solved = yield* Oracle.rollout({
        task: there as Task.Task,
        rows: rows.slice(0, 1),
        policy: HarborOracle.oracle(yield* Effect.promise(() => loaded))
      })
      assert.strictEqual(solved[0]!.reward, 1, "the folders found under the resolved root")
    }).pipe(Effect.scoped), { timeout: 300_000 })
})
