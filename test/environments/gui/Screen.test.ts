import { describe, expect, it } from "vitest"
import * as Generator from "../../../environments/gui/Generator.ts"
import * as Render from "../../../environments/gui/Render.ts"
import * as Screen from "../../../environments/gui/Screen.ts"
import * as Vision from "../../../environments/gui/Vision.ts"

const rows = Generator.generate(7, 300)
const stateOf = (row: Generator.Row) => Screen.start(row.layout, row.goal, row.maxSteps)

describe("GUI screen rules", () => {
  it("draws the same rows from the same seed, and different rows from another", () => {
    expect(Generator.generate(7, 300)).toEqual(rows)
    expect(Generator.generate(8, 20)).not.toEqual(rows.slice(0, 20))
    expect(new Set(rows.map((r) => r.goal.kind))).toEqual(new Set(["click", "form", "menu"]))
  })

  it("keeps every widget on the screen and apart from the others", () => {
    for (const row of rows) {
      const { width, height } = row.layout
      const rects = [
        ...row.layout.buttons.map((b) => b.rect),
        ...(row.layout.field !== undefined ? [row.layout.field] : []),
        ...(row.layout.menu !== undefined
          ? [row.layout.menu.button.rect, ...row.layout.menu.items.map((i) => i.rect)]
          : [])
      ]
      for (const r of rects) {
        expect(r.x).toBeGreaterThanOrEqual(0)
        expect(r.y).toBeGreaterThanOrEqual(0)
        expect(r.x + r.w).toBeLessThanOrEqual(width)
        expect(r.y + r.h).toBeLessThanOrEqual(height)
      }
      // Plain widgets never overlap (a menu's list is drawn over what is below it only when open).
      const plain = [...row.layout.buttons.map((b) => b.rect), ...(row.layout.field ? [row.layout.field] : [])]
      for (let i = 0; i < plain.length; i++) {
        for (let j = i + 1; j < plain.length; j++) {
          const a = plain[i]!, b = plain[j]!
          expect(a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h).toBe(false)
        }
      }
    }
  })

  it("solves a click goal in one click and fails on another button", () => {
    const row = rows.find((r) => r.goal.kind === "click")!
    const goal = row.goal as { target: string }
    const target = row.layout.buttons.find((b) => b.id === goal.target)!
    const other = row.layout.buttons.find((b) => b.id !== goal.target)!
    expect(Screen.act(stateOf(row), { _tag: "click", ...Screen.centre(target.rect) }).state.outcome).toBe("solved")
    expect(Screen.act(stateOf(row), { _tag: "click", ...Screen.centre(other.rect) }).state.outcome).toBe("failed")
  })

  it("needs the focus before typing, and the right text before OK", () => {
    const row = rows.find((r) => r.goal.kind === "form")!
    const goal = row.goal as { text: string }
    const ok = row.layout.buttons.find((b) => b.id === "ok")!
    let s = stateOf(row)
    const typedBlind = Screen.act(s, { _tag: "type", text: goal.text })
    expect(typedBlind.text).toBe("No field has the focus.")
    expect(typedBlind.state.typed).toBe("")
    s = Screen.act(s, { _tag: "click", ...Screen.centre(row.layout.field!) }).state
    expect(s.focused).toBe(true)
    s = Screen.act(s, { _tag: "type", text: goal.text }).state
    expect(s.typed).toBe(goal.text)
    expect(Screen.act(s, { _tag: "click", ...Screen.centre(ok.rect) }).state.outcome).toBe("solved")
    const wrong = Screen.act(Screen.act(stateOf(row), { _tag: "click", ...Screen.centre(row.layout.field!) }).state, {
      _tag: "type",
      text: "zzz"
    }).state
    expect(Screen.act(wrong, { _tag: "click", ...Screen.centre(ok.rect) }).state.outcome).toBe("failed")
  })

  it("opens the menu before its items can be chosen, and ends at the step limit", () => {
    const row = rows.find((r) => r.goal.kind === "menu")!
    const goal = row.goal as { item: string }
    const item = row.layout.menu!.items.find((i) => i.id === goal.item)!
    const closed = Screen.act(stateOf(row), { _tag: "click", ...Screen.centre(item.rect) })
    expect(closed.state.outcome).toBe(undefined)
    const opened = Screen.act(stateOf(row), { _tag: "click", ...Screen.centre(row.layout.menu!.button.rect) }).state
    expect(opened.menuOpen).toBe(true)
    expect(Screen.act(opened, { _tag: "click", ...Screen.centre(item.rect) }).state.outcome).toBe("solved")
    let s = stateOf(row)
    for (let i = 0; i < row.maxSteps; i++) s = Screen.act(s, { _tag: "type", text: "x" }).state
    expect(s.outcome).toBe("failed")
    expect(s.missed).toBe(row.maxSteps)
  })
})

describe("GUI screens drawn and read back", () => {
  it("draws each button where the layout puts it, readable from the pixels alone", () => {
    for (const row of rows.slice(0, 60)) {
      const pixels = Render.pixels(stateOf(row))
      expect(pixels.rgba.length).toBe(row.layout.width * row.layout.height * 4)
      for (const b of row.layout.buttons) {
        const seen = Vision.button(pixels, b.colour)!
        // The fill lies inside the border: the rect less its one-pixel outline.
        expect(seen).toEqual({ x: b.rect.x + 1, y: b.rect.y + 1, w: b.rect.w - 2, h: b.rect.h - 2 })
      }
      if (row.layout.field !== undefined) {
        const f = row.layout.field
        expect(Vision.field(pixels)).toEqual({ x: f.x + 1, y: f.y + 1, w: f.w - 2, h: f.h - 2 })
        expect(Vision.focused(pixels)).toBe(false)
      }
    }
  })

  it("shows the focus, the typed text and the open menu", () => {
    const form = rows.find((r) => r.goal.kind === "form")!
    const focused = Screen.act(stateOf(form), { _tag: "click", ...Screen.centre(form.layout.field!) }).state
    expect(Vision.focused(Render.pixels(focused))).toBe(true)
    const typed = Screen.act(focused, { _tag: "type", text: "cat" }).state
    expect(Render.png(typed)).not.toEqual(Render.png(focused))
    const menu = rows.find((r) => r.goal.kind === "menu")!
    const goal = menu.goal as { item: Screen.Colour }
    expect(Vision.button(Render.pixels(stateOf(menu)), goal.item)).toBe(undefined)
    const opened = Screen.act(stateOf(menu), { _tag: "click", ...Screen.centre(menu.layout.menu!.button.rect) }).state
    expect(Vision.button(Render.pixels(opened), goal.item)).toBeDefined()
  })

  it("encodes the same PNG bytes for the same state", () => {
    const s = stateOf(rows[0]!)
    const a = Render.png(s)
    expect(a.subarray(1, 4)).toEqual(new Uint8Array([0x50, 0x4e, 0x47]))
    expect(Render.png(s)).toEqual(a)
    expect(Render.dataUrl(s).startsWith("data:image/png;base64,")).toBe(true)
  })
})
