/**
 * The GUI task's learnable variant: widgets snapped to a grid of merged-token cells (`Generator.Settings.grid`), a
 * chosen number of buttons on click screens (`buttons`), and the first screen before the question (the task option
 * `screenFirst`). The oracle still solves every row from the pixels alone, random clicks still almost never do,
 * and the probe's helpers (`examples/gui/probe.ts`) swap screens without touching the actions.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Pretrain from "../../../examples/gui/pretrain.ts"
import * as Probe from "../../../examples/gui/probe.ts"
import * as Generator from "../../../environments/gui/Generator.ts"
import * as GuiOracle from "../../../environments/gui/GuiOracle.ts"
import * as GuiTask from "../../../environments/gui/GuiTask.ts"
import * as Render from "../../../environments/gui/Render.ts"
import * as Screen from "../../../environments/gui/Screen.ts"
import type { Conversation, Message } from "../../../src/Message.ts"

const cell = 16
const grid: Generator.Settings = { ...Generator.defaults, grid: cell }
const rows = Generator.generate(21, 240, grid)

const widgets = (row: Generator.Row): ReadonlyArray<Screen.Rect> => [
  ...row.layout.buttons.map((b) => b.rect),
  ...(row.layout.field !== undefined ? [row.layout.field] : []),
  ...(row.layout.menu !== undefined ? [row.layout.menu.button.rect, ...row.layout.menu.items.map((i) => i.rect)] : [])
]

const overlap = (a: Screen.Rect, b: Screen.Rect) => a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h

const imageCount = (m: Message) => (typeof m.content === "string" ? 0 : m.content.filter((p) => p.type === "image_url").length)

describe("GUI task on a grid", () => {
  it("puts every widget's centre on a cell's centre, on the screen, apart from the others", () => {
    assert.deepStrictEqual(Generator.generate(21, 240, grid), rows)
    assert.deepStrictEqual(new Set(rows.map((r) => r.goal.kind)), new Set(["click", "form", "menu"]))
    for (const row of rows) {
      const rects = widgets(row)
      for (const r of rects) {
        const c = Screen.centre(r)
        assert.deepStrictEqual([c.x % cell, c.y % cell], [cell / 2, cell / 2], JSON.stringify(r))
        assert.isTrue(r.x >= 0 && r.y >= 0 && r.x + r.w <= 64 && r.y + r.h <= 64, JSON.stringify(r))
      }
      for (let i = 0; i < rects.length; i++) {
        for (let j = i + 1; j < rects.length; j++) assert.isFalse(overlap(rects[i]!, rects[j]!), JSON.stringify(row))
      }
    }
    // Defaults without a grid are unchanged by the new settings.
    assert.deepStrictEqual(Generator.generate(7, 50), Generator.generate(7, 50, { ...Generator.defaults }))
  })

  it("draws the click screens' button counts from the list given", () => {
    const mixed = Generator.generate(3, 200, { ...grid, kinds: ["click"], buttons: [1, 3] })
    assert.deepStrictEqual(new Set(mixed.map((r) => r.layout.buttons.length)), new Set([1, 3]))
    for (const r of mixed) {
      const target = (r.goal as { target: string }).target
      assert.isTrue(r.layout.buttons.some((b) => b.id === target))
    }
    assert.throws(() => Generator.generate(1, 1, { ...Generator.defaults, width: 32, grid: 16 }), /3 × 4/)
  })

  it.effect("screenFirst: the first screen precedes the question; the oracle solves every row, random clicks not", () =>
    Effect.gen(function*() {
      const task = GuiTask.make({ screenFirst: true })
      const played = yield* Oracle.rollout({ task, rows: rows.slice(0, 120), policy: GuiOracle.oracle })
      assert.strictEqual(Oracle.solveRate(played), 1)
      const click = played.find((_, i) => rows[i]!.goal.kind === "click")!
      const user = click.messages.find((m) => m.role === "user")!
      assert.deepStrictEqual(typeof user.content === "string" ? [] : user.content.map((p) => p.type), [
        "image_url",
        "text"
      ])
      // Solved in one click: the only screen is the question's.
      assert.deepStrictEqual(click.messages.map(imageCount).reduce((a, b) => a + b, 0), 1)
      const noise = yield* Oracle.rollout({ task, rows, policy: GuiOracle.noise })
      assert.isBelow(Oracle.solveRate(noise), 0.1)
    }), { timeout: 600_000 })

  it.effect("gradient backdrop: the background shows the position; the oracle still reads every screen", () =>
    Effect.gen(function*() {
      const shaded = Generator.generate(22, 90, { ...grid, backdrop: "gradient" })
      const row = shaded.find((r) => r.goal.kind === "click")!
      const pixels = Render.pixels(Screen.start(row.layout, row.goal, row.maxSteps))
      // Cells' corners are never covered (1-pixel margins): each shows the gradient's colour there.
      for (const [x, y] of [[0, 0], [16, 32], [63, 63]] as const) {
        const i = (y * 64 + x) * 4
        assert.deepStrictEqual([...pixels.rgba.slice(i, i + 3)], [...Render.gradientAt(x, y, 64, 64)])
      }
      const task = GuiTask.make({ screenFirst: true })
      assert.strictEqual(Oracle.solveRate(yield* Oracle.rollout({ task, rows: shaded, policy: GuiOracle.oracle })), 1)
      assert.isBelow(Oracle.solveRate(yield* Oracle.rollout({ task, rows: shaded, policy: GuiOracle.noise })), 0.1)
    }), { timeout: 600_000 })

  it("the pretraining sequence trains the coordinates, and the colour when one button leaves no doubt", () => {
    const one = Generator.generate(4, 1, { ...grid, kinds: ["click"], buttons: [1] })[0]!
    const three = Generator.generate(4, 1, { ...grid, kinds: ["click"] })[0]!
    const centre = (row: Generator.Row) => Screen.centre(row.layout.buttons.find((b) => b.id === (row.goal as { target: string }).target)!.rect)
    const a = Pretrain.answer(one), b = Pretrain.answer(three)
    assert.strictEqual(a.text, `${(one.goal as { target: string }).target} ${centre(one).x} ${centre(one).y}`)
    assert.strictEqual(a.trained, a.text.length)
    assert.strictEqual(b.trained, `${centre(three).x} ${centre(three).y}`.length)
    const form = Generator.generate(4, 20, grid).find((r) => r.goal.kind === "form")!
    assert.throws(() => Pretrain.answer(form), /click rows/)
  })

  it("the probe swaps screens between conversations and keeps their actions", () => {
    const conversation = (url: string, x: number): Conversation => [
      { role: "user", content: [{ type: "image_url", image_url: { url } }, { type: "text", text: "Click" }] },
      { role: "assistant", content: `${x}` }
    ]
    const rotated = Probe.rotateScreens([conversation("data:a", 1), conversation("data:b", 2)])
    assert.deepStrictEqual(rotated, [conversation("data:b", 1), conversation("data:a", 2)])
    assert.deepStrictEqual(Probe.meanSe([1, 3]), { mean: 2, se: 1 })
    assert.deepStrictEqual(Probe.meanSe([5]), { mean: 5, se: 0 })
  })
})
