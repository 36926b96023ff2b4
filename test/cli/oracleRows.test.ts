/**
 * `agentfly oracle` checks the held-out rows when it loads them, as `train` and `eval` do: a row without a field the
 * task's reward reads stops it before any episode, naming the file's line and the reward, instead of every episode
 * of that row scoring 0 with a warning.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as OracleCli from "../../cli/oracle.ts"

const fixture = resolve(import.meta.dirname, "fixtures/answerTask.ts")

/** A config of the fixture's task whose held-out rows are `rows`. */
const configWith = (rows: ReadonlyArray<Record<string, unknown>>) => {
  const dir = mkdtempSync(join(tmpdir(), "oracle-rows-"))
  writeFileSync(join(dir, "heldout.jsonl"), rows.map((r) => JSON.stringify(r)).join("\n") + "\n")
  const file = join(dir, "config.json")
  writeFileSync(file, JSON.stringify({
    task: fixture,
    output: "run",
    model: { path: "model" },
    data: { train: "heldout.jsonl", eval: "heldout.jsonl" },
    algorithm: { steps: 1 }
  }))
  return file
}

describe("agentfly oracle's rows", () => {
  it.effect("a row without a field the reward reads stops the oracle at load, naming the line and the reward", () =>
    Effect.gen(function*() {
      const file = configWith([{ question: "yes", answer: "yes" }, { question: "no" }])
      const error = yield* Effect.flip(OracleCli.play(file))
      assert.strictEqual((error as { readonly _tag?: string })._tag, "DatasetError")
      assert.include(error.message, "heldout.jsonl:2")
      assert.include(error.message, `reward "said" reads`)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("rows that hold the fields are played and scored", () =>
    Effect.gen(function*() {
      const file = configWith([{ question: "yes", answer: "yes" }, { question: "no", answer: "no" }])
      const games = yield* OracleCli.play(file)
      assert.deepStrictEqual(games.map((t) => t.reward), [1, 1])
    }).pipe(Effect.provide(NodeServices.layer)))
})
