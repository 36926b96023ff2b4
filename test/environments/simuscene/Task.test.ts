/**
 * The SimuScene task through the rollout runtime, with bubblewrap Python sandboxes (real processes): the oracle,
 * which reads only the scene's words, writes programs that score 1 on every held-out scene; random positions score
 * ≈ 0; a failing program, one printing no JSON and one of the wrong shape come back as observations and the agent
 * gets another turn; the frames of the agent's simulation close the episode as an image.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Scene from "../../../environments/simuscene/Scene.ts"
import * as SimuSceneOracle from "../../../environments/simuscene/SimuSceneOracle.ts"
import * as SimuSceneTask from "../../../environments/simuscene/SimuSceneTask.ts"
import type { Conversation } from "../../../src/Message.ts"

const task = SimuSceneTask.make({ sandbox: "bubblewrap", pool: 8, showFrames: true })
const rows = Scene.generate(21, 40).map((scene) => ({ question: Scene.describe(scene), scene }))

const scripted = (codes: ReadonlyArray<string>) => (messages: Conversation) => {
  const code = codes[messages.filter((m) => m.role === "assistant").length]
  return code === undefined ? { content: "done" } : { toolCalls: [Oracle.call(messages, "simulate", { code })] }
}

describe("SimuScene task", () => {
  it.live("the oracle scores 1 on every held-out scene; random positions score ≈ 0", () =>
    Effect.gen(function*() {
      const played = yield* Oracle.rollout({ task, rows, policy: SimuSceneOracle.oracle, concurrency: 8 })
      assert.deepStrictEqual(played.map((t) => t.reward), rows.map(() => 1))
      assert.isTrue(played.every((t) => t.episodeEnd === "submitted"))
      assert.isTrue(played.every((t) => t.metrics["reward/simuscene/trajectory"] === 1))
      const noise = yield* Oracle.rollout({ task, rows, policy: SimuSceneOracle.noise, concurrency: 8 })
      const mean = noise.reduce((n, t) => n + t.reward, 0) / noise.length
      assert.isBelow(mean, 0.05)
      assert.isTrue(noise.every((t) => t.metrics["reward/simuscene/submitted"] === 1))
    }), { timeout: 900_000 })

  it.live("a failing program, no JSON, the wrong shape: told why, another turn; the frames end the episode", () =>
    Effect.gen(function*() {
      const row = rows.find((r) => r.scene.balls.length === 2)!
      const [failing] = yield* Oracle.rollout({
        task,
        rows: [row],
        policy: scripted(["raise ValueError('boom')", "print('hello')"])
      })
      const told = failing!.messages.filter((m) => m.role === "tool").map(Oracle.text)
      assert.match(told[0]!, /^Error: the program failed: ValueError: boom/)
      assert.strictEqual(told[1], "Error: the program printed no JSON.")
      assert.strictEqual(failing!.reward, 0)
      assert.strictEqual(failing!.metrics["reward/simuscene/attempts"], 2)
      const [shaped] = yield* Oracle.rollout({
        task,
        rows: [row],
        policy: scripted(['print(\'{"a": []}\')', SimuSceneOracle.program(row.scene)])
      })
      const second = shaped!.messages.filter((m) => m.role === "tool").map(Oracle.text)
      assert.match(second[0]!, /^Error: ball a has 0 positions/)
      assert.strictEqual(shaped!.reward, 1)
      const last = shaped!.messages.at(-1)!
      assert.isTrue(Array.isArray(last.content) && last.content[0]!.type === "image_url")
    }), { timeout: 900_000 })
})
