/**
 * The GUI task through the rollout runtime (`Oracle.rollout`: the task's own tools, per-chain screens, episode and
 * reward): the oracle, which reads only the pixels it is shown, solves every held-out row; random clicks score
 * ≈ 0; bad actions come back as observations or typed errors while the episode goes on; 64 concurrent chains never
 * see each other's screens; every turn shows the new screen as an image part.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Generator from "../../../environments/gui/Generator.ts"
import * as GuiOracle from "../../../environments/gui/GuiOracle.ts"
import * as GuiTask from "../../../environments/gui/GuiTask.ts"
import * as Render from "../../../environments/gui/Render.ts"
import * as Screen from "../../../environments/gui/Screen.ts"
import * as Tasks from "../../../environments/Tasks.ts"
import type { Conversation } from "../../../src/Message.ts"
import * as Task from "../../../src/Task.ts"

const heldOut = Generator.generate(11, 200)
const task = GuiTask.make()

const scripted = (script: ReadonlyArray<readonly [string, Record<string, unknown>]>) => (messages: Conversation) => {
  const step = script[messages.filter((m) => m.role === "assistant").length]
  return step === undefined ? { content: "done" } : { toolCalls: [Oracle.call(messages, step[0], step[1])] }
}

const images = (messages: Conversation) =>
  messages.flatMap((m) => (typeof m.content === "string" ? [] : m.content.filter((p) => p.type === "image_url")))

describe("GUI task", () => {
  it.effect("the pixel-reading oracle solves every held-out row; random clicks almost never do", () =>
    Effect.gen(function*() {
      const played = yield* Oracle.rollout({ task, rows: heldOut, policy: GuiOracle.oracle })
      const missed = played.flatMap((t, i) => (t.episodeEnd === "solved" ? [] : [i]))
      assert.deepStrictEqual(missed, [])
      assert.strictEqual(Oracle.solveRate(played), 1)
      // Each kind in its shortest number of actions.
      for (const [i, t] of played.entries()) {
        assert.strictEqual(t.metrics["reward/gui/steps"], Generator.shortest[heldOut[i]!.goal.kind])
      }
      const noise = yield* Oracle.rollout({ task, rows: heldOut, policy: GuiOracle.noise })
      assert.isBelow(Oracle.solveRate(noise), 0.1)
    }), { timeout: 600_000 })

  it.effect("shows the first screen and a new one after every action, until the episode ends", () =>
    Effect.gen(function*() {
      const row = heldOut.find((r) => r.goal.kind === "form")!
      const [t] = yield* Oracle.rollout({ task, rows: [row], policy: GuiOracle.oracle })
      // Start, then after the field click and the typing; the OK press ends it without another screen.
      assert.lengthOf(images(t!.messages), 3)
      const tools = t!.messages.filter((m) => m.role === "tool").map(Oracle.text)
      const word = (row.goal as { text: string }).text
      assert.deepStrictEqual(tools.slice(0, 2), ["The field has the focus.", `Typed ${JSON.stringify(word)}.`])
      assert.strictEqual(t!.episodeEnd, "solved")
      assert.strictEqual(t!.reward, 1)
    }), { timeout: 600_000 })

  it.effect("bad actions: typing without the focus, bad arguments, a wrong button; a silent turn ends it", () =>
    Effect.gen(function*() {
      const row = heldOut.find((r) => r.goal.kind === "click")!
      const goal = row.goal as { target: string }
      const wrong = row.layout.buttons.find((b) => b.id !== goal.target)!
      const [t] = yield* Oracle.rollout({
        task,
        rows: [row],
        policy: scripted([["type", { text: "hi" }], ["click", { x: "left" }], ["click", Screen.centre(wrong.rect)]])
      })
      const tools = t!.messages.filter((m) => m.role === "tool").map(Oracle.text)
      assert.strictEqual(tools[0], "No field has the focus.")
      assert.match(tools[1]!, /x/)
      assert.strictEqual(t!.episodeEnd, "failed")
      assert.strictEqual(t!.reward, 0)
      assert.strictEqual(t!.metrics["reward/gui/missed"], 1)
      const [silent] = yield* Oracle.rollout({ task, rows: [row], policy: () => ({ content: "I will not click." }) })
      assert.strictEqual(silent!.episodeEnd, "no_action")
    }), { timeout: 600_000 })

  it.effect("the alignment term credits a missed click's right column or row; accuracy stays the success", () =>
    Effect.gen(function*() {
      const rows = Generator.generate(13, 1, { ...Generator.defaults, kinds: ["click"], buttons: [1] })
      const row = rows[0]!
      const { rect } = row.layout.buttons[0]!
      const beside = { x: rect.x + rect.w, y: rect.y }
      const miss = { x: beside.x >= row.layout.width ? rect.x - 1 : beside.x, y: rect.y } // in its rows only
      const shaped = GuiTask.make({ alignment: 0.5 })
      const [half] = yield* Oracle.rollout({ task: shaped, rows, policy: scripted([["click", miss]]) })
      assert.strictEqual(half!.metrics["reward/gui_aligned/aligned"], 0.5)
      assert.strictEqual(half!.reward, 0.25)
      assert.strictEqual(Oracle.solveRate([half!]), 0)
      const twice = scripted([["click", miss], ["click", { x: rect.x, y: rect.y }]])
      const [hit] = yield* Oracle.rollout({ task: shaped, rows, policy: twice })
      assert.strictEqual(hit!.reward, 1.5)
      assert.strictEqual(Oracle.solveRate([hit!]), 1)
      const far = { x: miss.x, y: rect.y + rect.h >= row.layout.height ? rect.y - 1 : rect.y + rect.h }
      assert.strictEqual(Screen.alignment(Screen.start(row.layout, row.goal, 2), far.x, far.y), 0)
      const refused = yield* Effect.flip(
        Task.resolve({ name: "gui", options: { alignment: 0.6 } }, { builtins: Tasks.builtins, resolvePath: (p) => p })
      )
      assert.strictEqual(refused.reason._tag, "Options")
    }), { timeout: 600_000 })

  it.effect("64 concurrent chains keep their own screens", () =>
    Effect.gen(function*() {
      const rows = Generator.generate(12, 64, { ...Generator.defaults, kinds: ["form"] })
      const played = yield* Oracle.rollout({ task, rows, policy: GuiOracle.oracle, concurrency: 64 })
      assert.strictEqual(Oracle.solveRate(played), 1)
      for (const [i, t] of played.entries()) {
        const typed = t.messages.filter((m) => m.role === "tool").map(Oracle.text)[1]
        assert.strictEqual(typed, `Typed ${JSON.stringify((rows[i]!.goal as { text: string }).text)}.`)
      }
    }), { timeout: 600_000 })

  it.effect("resolves by name, and the oracle reads the screens the task draws", () =>
    Effect.gen(function*() {
      const resolve = (ref: Task.Ref) => Task.resolve(ref, { builtins: Tasks.builtins, resolvePath: (p) => p })
      const named = yield* resolve({ name: "gui", options: { toolCallFormat: 0.1 } })
      assert.strictEqual(named.name, "gui")
      assert.deepStrictEqual(named.tools.map((t) => t.name), ["click", "type"])
      const refused = yield* Effect.flip(resolve({ name: "gui", options: { toolCallFormat: -1 } }))
      assert.strictEqual(refused.reason._tag, "Options")
      const bad = yield* Effect.flip(Schema.decodeUnknownEffect(Generator.Fields)({ ...heldOut[0]!, maxSteps: 0 }))
      assert.match(bad.message, /maxSteps/)
      const state = Screen.start(heldOut[0]!.layout, heldOut[0]!.goal, heldOut[0]!.maxSteps)
      const shown = GuiTask.screenMessage(state)
      assert.deepStrictEqual(GuiOracle.latestImage([shown]), Render.png(state))
    }))
})
