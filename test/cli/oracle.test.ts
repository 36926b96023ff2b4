/**
 * `agentfly oracle`: a prebuilt environment's oracle played on a config's held-out rows through the config's own
 * task (here search, with its generated world), solving them; a task without an oracle is a sentence, not a crash.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as OracleCli from "../../cli/oracle.ts"
import * as Generate from "../../examples/search/generate.ts"

describe("agentfly oracle", () => {
  it.effect("plays the task's oracle on the config's held-out rows; a task without one is named", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "oracle-"))
      yield* Generate.write({ ...Generate.defaults, train: 4, heldOut: 12, validation: 2, demos: 4, dir: join(dir, "data") })
      const config = (task: string) => {
        const file = join(dir, `${task}.json`)
        writeFileSync(file, JSON.stringify({
          task,
          output: "run",
          model: { path: "model" },
          data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
          algorithm: { steps: 1 }
        }))
        return file
      }
      const played = yield* OracleCli.play(config("search"), 10)
      assert.strictEqual(played.length, 10)
      assert.isTrue(played.every((t) => t.reward === 1), played.map((t) => t.reward).join(","))
      const none = yield* Effect.flip(OracleCli.play(config("calculator")))
      assert.include((none as Error).message, "task calculator has no oracle here (oracles: search, webshop")
    }).pipe(Effect.provide(NodeServices.layer)), 120_000)
})
