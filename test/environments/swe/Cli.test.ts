/**
 * SWE tasks through the real command line, on the real Docker engine: the seeded generator (Harbor folders, rows
 * that name them, demonstrations that are the oracle's verified fixes; the same options write the same bytes), then
 * the shipped short config (`examples/swe/short.json`: the built-in task `swe`, the small policy, a short warm-up
 * and two RL steps, a container per chain) through `agentfly train`, and its last checkpoint through `agentfly
 * eval`. No container outlives its step (`env/harbor/in_use` is 0 in every record).
 *
 * Real time: the child processes are the subject. The train case takes ≈ 40 s on 2 idle cores.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Generate from "../../../examples/swe/generate.ts"
import { agentfly, evalCheckpoint, metricsOf, shortConfig } from "../../utils/agentfly.ts"

const generated = (options: Partial<Generate.Options>) =>
  Effect.gen(function*() {
    const dir = mkdtempSync(join(tmpdir(), "swe-data-"))
    yield* Generate.write({ ...Generate.defaults, train: 8, heldOut: 4, validation: 2, demos: 8, ...options, dir })
    const read = (name: string) =>
      readFileSync(join(dir, name), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record<string, any>)
    return { dir, read, text: (name: string) => readFileSync(join(dir, name), "utf8") }
  }).pipe(Effect.provide(NodeServices.layer))

describe("swe from the command line", () => {
  it.live("the generator is seeded; demonstrations are verified fixes", () =>
    Effect.gen(function*() {
      const a = yield* generated({ seed: 5, noise: 0.5 })
      const b = yield* generated({ seed: 5, noise: 0.5 })
      for (const f of ["train.jsonl", "heldout.jsonl", "validation.jsonl", "demos.jsonl"]) {
        assert.strictEqual(a.text(f), b.text(f), f)
      }
      assert.strictEqual(
        readFileSync(join(a.dir, "tasks/heldout-0/tests/test_outputs.py"), "utf8"),
        readFileSync(join(b.dir, "tasks/heldout-0/tests/test_outputs.py"), "utf8")
      )
      const heldOut = a.read("heldout.jsonl")
      assert.deepStrictEqual(heldOut.map((r) => r["task"]), [
        "tasks/heldout-0",
        "tasks/heldout-1",
        "tasks/heldout-2",
        "tasks/heldout-3"
      ])
      assert.isTrue(heldOut.every((r) => existsSync(join(a.dir, r["task"], "task.toml"))))
      const demos = a.read("demos.jsonl")
      assert.lengthOf(demos, 8, "the oracle fixed every demonstration task")
      for (const demo of demos) {
        const messages: Array<Record<string, any>> = demo["messages"]
        assert.strictEqual(messages.at(-1)!["content"], "submitted")
        const calls = messages.filter((m) => m["role"] === "assistant").map((m) => m["tool_calls"][0].function.name)
        assert.include([["shell", "submit"].join(), ["read", "shell", "submit"].join()], calls.join())
      }
      assert.isTrue(demos.some((d) => d["messages"][3].tool_calls[0].function.name === "read"), "noise: reads first")
    }), { timeout: 300_000 })

  it.live(
    "the short config trains through `agentfly train` and its checkpoint evaluates with `agentfly eval`",
    () =>
      Effect.gen(function*() {
        const data = yield* generated({ seed: 1 })
        const dir = mkdtempSync(join(tmpdir(), "swe-short-"))
        const config = shortConfig("swe", data.dir, dir)
        const written = JSON.parse(readFileSync(config, "utf8"))
        writeFileSync(
          config,
          JSON.stringify({
            ...written,
            task: { ...written.task, options: { ...written.task.options, root: data.dir } }
          })
        )
        const run = yield* agentfly(["train", config])
        assert.strictEqual(run.code, 0, run.output)
        assert.match(run.output, /on task swe/)
        assert.match(run.output, /held-out accuracy [\d.]+ ± [\d.]+ \(step 0\) → [\d.]+ ± [\d.]+ \(step 2\)/)
        const train = metricsOf(join(dir, "run")).filter((r) => r.phase === "train")
        assert.lengthOf(train, 2)
        assert.isTrue(train.every((r) => r.figures["learner/applied"] === 1), "both RL steps reached the learner")
        assert.isAbove(train.at(-1)!.figures["env/harbor/leases"]!, 3, "the chains leased containers")
        assert.isTrue(train.every((r) => r.figures["env/harbor/in_use"] === 0), "no container outlived its step")
        const evaluated = yield* evalCheckpoint(config, dir, "step-000002")
        assert.strictEqual(evaluated.code, 0, evaluated.output)
        assert.strictEqual(evaluated.result!.questions, 4)
      }),
    { timeout: 300_000 }
  )
})
