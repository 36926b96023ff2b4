/**
 * The `python` tool inside real rollouts (`Rollout.run` with a scripted sampler): each chain gets its own
 * sandbox from the resource manager through the `Environment.Provider` contract, interpreter state carries from
 * one turn to the next, chains are isolated, and every lease is released when the run ends. Bubblewrap sandboxes
 * (no engine needed; the Docker path is covered by `PythonSandbox.test.ts`). Real time: processes are the subject.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schedule, Stream } from "effect"
import * as Rollout from "../../../actors/Rollout.ts"
import * as ResourceManager from "../../../actors/ResourceManager.ts"
import * as ToolActor from "../../../actors/ToolActor.ts"
import * as PythonSandbox from "../../../environments/python/PythonSandbox.ts"
import { python } from "../../../environments/python/PythonTool.ts"
import * as Sampler from "../../../src/Sampler.ts"
import { text } from "../../../src/Message.ts"
import { charFormat, decode, turn } from "../../actors/fixtures/charFormat.ts"

/** Chain k stores k in turn 1, reads it back in turn 2 (checking no other chain's value is visible), then stops. */
const sampler = Sampler.layerScripted((request) => {
  const prompt = decode(request.promptTokenIds)
  const k = /<user>chain (\d+)\n/.exec(prompt)?.[1] ?? "?"
  const turnIndex = prompt.split("<assistant>").length - 2
  if (turnIndex === 0) {
    return turn(`CALL python {"code":"mine = ${k}\\nimport os\\n_ = open('k.txt','w').write('${k}')"}`)
  }
  if (turnIndex === 1) {
    const files = "[f for f in os.listdir('.') if not f.startswith('.')] == ['k.txt']"
    return turn(`CALL python {"code":"print(mine, open('k.txt').read(), ${files})"}`)
  }
  return turn("done")
})

describe("python tool in rollouts", () => {
  it.live("8 concurrent chains each keep their own interpreter across turns; leases are released at the end", () =>
    Effect.gen(function*() {
      const manager = yield* ResourceManager.ResourceManager
      const spec = yield* PythonSandbox.spec({ kind: "bubblewrap", name: "python-rollout", pool: { max: 8 } })
      const environment = yield* PythonSandbox.provider(PythonSandbox.bubblewrap(spec))
      const tools = ToolActor.toPort(yield* ToolActor.make([python]))
      const events = yield* Rollout.run({
        rows: Array.from({ length: 8 }, (_, k) => ({ messages: [{ role: "user" as const, content: `chain ${k}` }] })),
        numChains: 1,
        maxTurns: 4,
        maxConcurrentChains: 8,
        sampling: { temperature: 1, maxTokens: 400 },
        format: charFormat,
        tools,
        environment,
        runId: "py",
        restart: Schedule.recurs(0)
      }).pipe(Stream.runCollect, Effect.provide(sampler))
      const trajectories = events.flatMap((e) => (e._tag === "Trajectory" ? [e] : []))
      assert.strictEqual(trajectories.length, 8)
      for (const { rowIndex, trajectory } of trajectories) {
        const toolText = trajectory.messages.filter((m) => m.role === "tool").map((m) => text(m.content)).join("\n")
        assert.include(toolText, `${rowIndex} ${rowIndex} True`, `chain ${rowIndex} sees its own state only`)
      }
      const stats = yield* manager.stats("python-rollout")
      assert.strictEqual(stats!.leased, 0, "every lease released")
      assert.strictEqual(stats!.acquires, 8)
      assert.strictEqual(stats!.starts, 8)
    }).pipe(Effect.provide(ResourceManager.ResourceManager.layer)), { timeout: 300_000 })
})
