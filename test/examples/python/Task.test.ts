/**
 * The python flagship (`examples/python/`) on the real sandbox (Docker, attach transport; image `agentfly/python:1`
 * from `scripts/build-images`): the generator is seeded and its demonstrations' programs print their rows' answers
 * in the sandbox; an oracle policy that copies the list into a program and reads the result back solves every
 * held-out row through the task's own tools, reward and sandbox pool, and a policy that answers without the tool
 * does not; the chains' sandboxes go back to the pool as their episodes end; and the short config trains end to
 * end through `agentfly train` and leaves no container behind.
 *
 * Real time throughout: containers and processes are the subject. The `agentfly train` case takes ≈ 45–60 s on 2
 * cores (a tiny model's warm-up and a few GRPO steps).
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Stream } from "effect"
import { execFileSync, spawn } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as Docker from "../../../actors/resources/Docker.ts"
import * as Rollout from "../../../actors/Rollout.ts"
import { extractAnswer, isEqual } from "../../../environments/math/MathEqual.ts"
import * as PythonSandbox from "../../../environments/python/PythonSandbox.ts"
import * as Generate from "../../../examples/python/generate.ts"
import * as PythonTask from "../../../examples/python/task.ts"
import * as ByteTokenizer from "../../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../../src/ChatTemplate.ts"
import { text } from "../../../src/Message.ts"
import * as Sampler from "../../../src/Sampler.ts"
import * as Tokenizer from "../../../src/Tokenizer.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"
import { cli } from "../../utils/agentfly.ts"

const root = resolve(import.meta.dirname, "../../..")

const tokenizer = Effect.runSync(Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig("")))
const format = ChainFormat.fromTemplate({ tokenizer, template: ChatTemplate.builtinTemplate("qwen2.5") })

/** Generated files under a fresh temporary directory, parsed. */
const generated = (options: Partial<Generate.Options>) =>
  Effect.gen(function*() {
    const dir = options.dir ?? mkdtempSync(join(tmpdir(), "python-data-"))
    yield* Generate.write({ ...Generate.defaults, train: 20, heldOut: 20, validation: 10, demos: 40, ...options, dir })
    const read = (name: string) =>
      readFileSync(join(dir, name), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record<string, any>)
    return { dir, read }
  }).pipe(Effect.provide(NodeServices.layer))

/** Copies the list from the question into a program; once the tool has answered, says its output. */
const oracle = (request: Sampler.GenerateRequest) => {
  const prompt = tokenizer.decode([...request.promptTokenIds])
  const result = /<tool_response>\n(.*)\n<\/tool_response>/.exec(prompt)?.[1]
  if (result !== undefined) return tokenizer.encode(`The answer is ${result}.<|im_end|>`)
  const list = /sum of (\[[\d,]+\])\?/.exec(prompt)![1]
  const call = JSON.stringify({ name: "python", arguments: { code: `print(sum(${list}))` } })
  return tokenizer.encode(`<tool_call>\n${call}\n</tool_call><|im_end|>`)
}

/** Answers at once, without the tool, with the list's expected sum (8 × 54.5). */
const guesser = () => tokenizer.encode("The answer is 436.<|im_end|>")

const rollout = (
  policy: (r: Sampler.GenerateRequest) => Array<number>,
  rows: ReadonlyArray<Rollout.TaskRow>,
  options: PythonTask.Options = {}
) =>
  Rollout.runTask({
    task: PythonTask.make(options),
    rows,
    numChains: 1,
    maxTurns: 2,
    maxConcurrentChains: 8,
    sampling: { temperature: 1, maxTokens: 96, seed: 1 },
    format
  }).pipe(
    Stream.runCollect,
    Effect.map((events) => events.flatMap((e) => (e._tag === "Trajectory" ? [e.trajectory] : []))),
    Effect.provide(Sampler.layerScripted(policy))
  )

const accuracy = (ts: ReadonlyArray<Trajectory.Trajectory>) =>
  ts.filter((t) => t.metrics["reward/mathEqual/acc"] === 1).length / ts.length

/** Containers on this host labelled with a key (and value). */
const containers = (label: string): number =>
  execFileSync("docker", ["ps", "-aq", "--filter", `label=${label}`], { encoding: "utf8" })
    .split("\n").filter((l) => l !== "").length

/**
 * Runs `agentfly train` in a child process; its pid names the containers it starts (`agentfly.pid`), which is why
 * this is not `test/utils/agentfly.ts` (that helper does not return the pid).
 */
const train = (args: ReadonlyArray<string>) =>
  Effect.callback<{ readonly code: number | null; readonly pid: number; readonly output: string }>((resume) => {
    const child = spawn(process.execPath, [cli, "train", ...args], {
      cwd: root,
      stdio: ["ignore", "pipe", "pipe"]
    })
    let output = ""
    child.stdout.on("data", (d: Buffer) => (output += d.toString()))
    child.stderr.on("data", (d: Buffer) => (output += d.toString()))
    child.on("exit", (code) => resume(Effect.succeed({ code, pid: child.pid!, output })))
    return Effect.sync(() => child.kill("SIGTERM"))
  })

describe("python task", () => {
  it.effect("the generator is seeded: the same options write the same bytes, another seed other lists", () =>
    Effect.gen(function*() {
      const files = ["train.jsonl", "heldout.jsonl", "validation.jsonl", "demos.jsonl"]
      const a = yield* generated({ seed: 3, noise: 0.5 })
      const b = yield* generated({ seed: 3, noise: 0.5 })
      const c = yield* generated({ seed: 4, noise: 0.5 })
      for (const f of files) {
        assert.strictEqual(readFileSync(join(a.dir, f), "utf8"), readFileSync(join(b.dir, f), "utf8"), f)
        assert.notStrictEqual(readFileSync(join(a.dir, f), "utf8"), readFileSync(join(c.dir, f), "utf8"), f)
      }
      const lists = files.slice(0, 3).flatMap((f) => a.read(f).map((row) => row["code"] as string))
      assert.strictEqual(new Set(lists).size, lists.length, "the splits' lists are disjoint")
      for (const row of a.read("heldout.jsonl")) {
        assert.match(row["question"], /^What is the sum of \[(\d\d,){7}\d\d\]\?$/)
      }
    }))

  it.live("every demonstration's program prints its row's answer in the sandbox; noisy ones misstate it", () =>
    Effect.gen(function*() {
      const gold = (yield* generated({ seed: 7, noise: 0 })).read("demos.jsonl")
      const noisy = (yield* generated({ seed: 7, noise: 0.5 })).read("demos.jsonl")
      const rows = (yield* generated({ seed: 7, noise: 0 })).read("heldout.jsonl")
      const spec = yield* PythonTask.spec("docker", 1)
      const resource = yield* PythonSandbox.docker(spec, { transport: "attach" })
      const provider = yield* PythonSandbox.provider(resource)
      const context = yield* provider.acquire({ chainId: "demos", groupId: "g" })
      const sandbox = Context.get(context, PythonSandbox.PythonSandbox)
      const run = (code: string) => Effect.map(sandbox.run(code), (r) => r.stdout.trim())
      for (const [i, demo] of gold.entries()) {
        const [system, user, call, tool, final] = demo["messages"]
        assert.strictEqual(system.content, Generate.systemPrompt)
        const code: string = call.tool_calls[0].function.arguments.code
        assert.strictEqual(code, `print(sum(${/(\[[\d,]+\])/.exec(user.content)![1]}))`, "the program copies the list")
        const printed = yield* run(code)
        assert.strictEqual(printed, tool.content, `demo ${i}: the tool's output is what the program prints`)
        assert.isTrue(isEqual(extractAnswer(final.content)!, printed), `demo ${i}: ${final.content}`)
        const misstated = noisy[i]["messages"][4].content as string
        const correct = isEqual(extractAnswer(misstated)!, printed)
        if (!correct) assert.strictEqual(extractAnswer(misstated)!.replace(/\.$/, "").length, printed.length)
      }
      const corrupted = noisy.filter((d, i) => d["messages"][4].content !== gold[i]["messages"][4].content).length
      assert.isTrue(corrupted > 10 && corrupted < 30, `${corrupted} of 40 noisy demonstrations misstate the answer`)
      for (const row of rows) assert.strictEqual(yield* run(row["code"]), row["answer"])
    }).pipe(
      Effect.scoped,
      Effect.provide(Layer.merge(ResourceManager.ResourceManager.layer, Docker.layerWith({ handleSignals: false })))
    ), { timeout: 300_000 })

  it.live("an oracle that runs the program solves every held-out row; answering without the tool does not", () =>
    Effect.gen(function*() {
      const rows = (yield* generated({ seed: 11 })).read("heldout.jsonl") as Array<Rollout.TaskRow>
      const solved = yield* rollout(oracle, rows)
      assert.strictEqual(solved.length, rows.length)
      assert.strictEqual(accuracy(solved), 1)
      for (const t of solved) {
        const observed = t.messages.filter((m) => m.role === "tool").map((m) => text(m.content))
        assert.deepStrictEqual(observed, [t.row?.["answer"]], "one call, whose output is the sum")
      }
      const guessed = yield* rollout(guesser, rows)
      assert.isBelow(accuracy(guessed), 0.1, "the sum is not guessable")
      assert.strictEqual(containers(`${Docker.Labels.pid}=${process.pid}`), 0, "the pool's containers are gone")
    }), { timeout: 300_000 })

  it.live("chains return their sandboxes as episodes end: 12 rows through a pool of 2", () =>
    Effect.gen(function*() {
      const rows = (yield* generated({ seed: 13, heldOut: 12 })).read("heldout.jsonl") as Array<Rollout.TaskRow>
      // With leases held past their chains (an acquire registering its release on the run's scope instead of the
      // chain's), the third chain would wait for a sandbox until `acquireMillis` and the test time out.
      const solved = yield* rollout(oracle, rows, { pool: 2, sandbox: "bubblewrap" })
      assert.strictEqual(accuracy(solved), 1)
    }), { timeout: 300_000 })

  it.live(
    "the short config trains end to end through `agentfly train` and leaves no container behind",
    () =>
      Effect.gen(function*() {
        const data = yield* generated({ train: 200, heldOut: 32, validation: 16, demos: 800 })
        const dir = mkdtempSync(join(tmpdir(), "python-short-"))
        const short = JSON.parse(readFileSync(join(root, "examples/python/short.json"), "utf8"))
        writeFileSync(
          join(dir, "config.json"),
          JSON.stringify({
            ...short,
            output: join(dir, "run"),
            model: { ...short.model, path: join(dir, "model") },
            data: { train: join(data.dir, "train.jsonl"), eval: join(data.dir, "heldout.jsonl") },
            task: { ...short.task, name: join(root, "examples/python/task.ts") },
            warmup: { ...short.warmup, data: join(data.dir, "demos.jsonl") }
          })
        )
        const run = yield* train([join(dir, "config.json")])
        assert.strictEqual(run.code, 0, run.output)
        assert.match(
          run.output,
          /held-out accuracy [\d.]+ ± [\d.]+ \(step 0\) → [\d.]+ ± [\d.]+ \(step \d+\)( \(gain [+-]?[\d.]+, -?[\d.]+ SE\))?;/
        )
        assert.isTrue(existsSync(join(dir, "run", "report.html")))
        const records = readFileSync(join(dir, "run", "metrics.jsonl"), "utf8").trim().split("\n").map((l) =>
          JSON.parse(l) as { phase: string; figures: Record<string, number> }
        )
        const last = records.filter((r) => r.phase === "train").at(-1)!.figures
        assert.isAbove(last["env/python-docker/leases"]!, 0, "the chains leased Docker sandboxes")
        assert.isAbove(records.filter((r) => r.phase === "train" && r.figures["learner/applied"] !== 0).length, 0)
        assert.strictEqual(containers(`${Docker.Labels.pid}=${run.pid}`), 0, "no container of the run is left")
      }),
    { timeout: 300_000 }
  )
})
