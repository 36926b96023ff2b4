/**
 * Seeded rows of the GUI task: a layout, a goal and the question that states it. The same seed gives the same
 * rows on every machine (`Sampling.rng`); the screen is drawn from the row when an episode starts.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as Sampling from "../../src/Sampling.ts"
import * as Screen from "./Screen.ts"

// ===== Models =====

/**
 * A row's fields besides its question: what the task decodes when an episode starts.
 *
 * @category models
 * @since 0.1.0
 */
export const Fields = Schema.Struct({
  layout: Screen.Layout,
  goal: Screen.Goal,
  maxSteps: Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 64 }))
})
export type Fields = typeof Fields.Type

/**
 * A row of the task's data: the question that states the goal, and the fields.
 *
 * @category models
 * @since 0.1.0
 */
export const Row = Schema.Struct({ question: Schema.String, ...Fields.fields })
export type Row = typeof Row.Type

/**
 * The goal kinds a generator draws from.
 *
 * @category models
 * @since 0.1.0
 */
export type Kind = Screen.Goal["kind"]

/**
 * The generator's settings: screen size, goal kinds, and the step limit beyond each kind's shortest solution.
 *
 * @category models
 * @since 0.1.0
 */
export interface Settings {
  readonly width: number
  readonly height: number
  readonly kinds: ReadonlyArray<Kind>
  /** Steps allowed beyond the shortest solution (a missed click can be retried). */
  readonly slack: number
  /**
   * Snap widgets to a grid of square cells of this many pixels (a widget fills its cell but a 1-pixel margin, a field
   * three cells, each centre a cell's centre); unset: anywhere. A cell of 16 pixels is one merged token of the
   * `tiny-vl` tower (8-pixel patches merged 2 × 2), so a target is one token and its centre one of few coordinates.
   */
  readonly grid?: number | undefined
  /**
   * Buttons on a click goal's screen, one of these counts drawn per row (default 3, 1 to 6). One button asks only
   * where it is; three also ask which it is: a warm-up on both teaches the first part before the second.
   */
  readonly buttons?: ReadonlyArray<number> | undefined
  /** The screens' backdrop (`Screen.Layout.backdrop`; default plain, the field left out of the rows). */
  readonly backdrop?: "plain" | "gradient" | undefined
}

/**
 * 64 × 64 screens (16 merged patches for a tower of 8-pixel patches merged 2 × 2), every kind, one spare step.
 *
 * @category constants
 * @since 0.1.0
 */
export const defaults: Settings = { width: 64, height: 64, kinds: ["click", "form", "menu"], slack: 1 }

/**
 * The shortest solution's length per kind.
 *
 * @category constants
 * @since 0.1.0
 */
export const shortest: Readonly<Record<Kind, number>> = { click: 1, form: 3, menu: 2 }

const words = ["cat", "dog", "sun", "box", "red", "map", "tea", "key", "cup", "pen"] as const

// ===== Generation =====

/**
 * `count` rows from a seed.
 *
 * @category constructors
 * @since 0.1.0
 */
export const generate = (seed: number, count: number, settings: Settings = defaults): Array<Row> => {
  const rng = Sampling.rng(seed)
  const rows: Array<Row> = []
  for (let i = 0; i < count; i++) rows.push(row(rng, settings))
  return rows
}

const pick = <A>(rng: Sampling.Rng, items: ReadonlyArray<A>): A => items[Math.floor(rng.next() * items.length)]!

const shuffled = <A>(rng: Sampling.Rng, items: ReadonlyArray<A>): Array<A> => {
  const out = [...items]
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rng.next() * (i + 1))
    ;[out[i], out[j]] = [out[j]!, out[i]!]
  }
  return out
}

/**
 * Button size for a screen: a quarter of the width by a sixth of the height, at least 8 × 6 (three buttons cover
 * ≈ 12 % of a 64 × 64 screen: a random click rarely lands on the goal's).
 */
const buttonSize = (s: Settings) => ({
  w: Math.max(8, Math.floor(s.width / 4)),
  h: Math.max(6, Math.floor(s.height / 6))
})

const overlaps = (a: Screen.Rect, b: Screen.Rect): boolean =>
  a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h

/** A free place for a `w × h` rectangle, by rejection (a 1-pixel gap from everything taken). */
const place = (
  rng: Sampling.Rng,
  s: Settings,
  w: number,
  h: number,
  taken: ReadonlyArray<Screen.Rect>
): Screen.Rect => {
  for (let attempt = 0; attempt < 200; attempt++) {
    const rect = { x: Math.floor(rng.next() * (s.width - w + 1)), y: Math.floor(rng.next() * (s.height - h + 1)), w, h }
    const padded = { x: rect.x - 1, y: rect.y - 1, w: w + 2, h: h + 2 }
    if (!taken.some((t) => overlaps(padded, t))) return rect
  }
  // A grid fallback: a crowded small screen still gets a layout (checked by the tests at the default size).
  const cols = Math.floor(s.width / (w + 1))
  const index = taken.length
  return { x: (index % cols) * (w + 1), y: Math.floor(index / cols) * (h + 1), w, h }
}

const button = (id: string, colour: Screen.Colour, rect: Screen.Rect, label: string = colour): Screen.Button => ({
  id,
  label,
  colour,
  rect
})

const row = (rng: Sampling.Rng, s: Settings): Row => {
  const kind = pick(rng, s.kinds)
  const maxSteps = shortest[kind] + s.slack
  const drawn = s.grid !== undefined ? gridRow(rng, s, s.grid, kind, maxSteps) : placedRow(rng, s, kind, maxSteps)
  return s.backdrop === undefined ? drawn : { ...drawn, layout: { ...drawn.layout, backdrop: s.backdrop } }
}

const placedRow = (rng: Sampling.Rng, s: Settings, kind: Kind, maxSteps: number): Row => {
  switch (kind) {
    case "click":
      return clickRow(rng, s, maxSteps)
    case "form":
      return formRow(rng, s, maxSteps)
    case "menu":
      return menuRow(rng, s, maxSteps)
  }
}

/** A click screen's number of buttons: 3, or one of `buttons` (drawn only then: default rows stay as they were). */
const buttonCount = (rng: Sampling.Rng, s: Settings): number => (s.buttons === undefined ? 3 : pick(rng, s.buttons))

const clickRow = (rng: Sampling.Rng, s: Settings, maxSteps: number): Row => {
  const size = buttonSize(s)
  const chosen = shuffled(rng, Screen.colours).slice(0, buttonCount(rng, s))
  const taken: Array<Screen.Rect> = []
  const buttons = chosen.map((colour) => {
    const rect = place(rng, s, size.w, size.h, taken)
    taken.push(rect)
    return button(colour, colour, rect)
  })
  const target = pick(rng, chosen)
  return {
    question: `Click the ${target} button.`,
    layout: { width: s.width, height: s.height, buttons },
    goal: { kind: "click", target },
    maxSteps
  }
}

const formRow = (rng: Sampling.Rng, s: Settings, maxSteps: number): Row => {
  const size = buttonSize(s)
  const field = place(rng, s, Math.floor(s.width * 0.6), size.h, [])
  const ok = place(rng, s, size.w, size.h, [field])
  const cancel = place(rng, s, size.w, size.h, [field, ok])
  const text = pick(rng, words)
  return {
    question: `Type ${text} in the box, then press OK.`,
    layout: {
      width: s.width,
      height: s.height,
      buttons: [button("ok", "green", ok, "OK"), button("cancel", "red", cancel, "No")],
      field
    },
    goal: { kind: "form", text, submit: "ok" },
    maxSteps
  }
}

const menuRow = (rng: Sampling.Rng, s: Settings, maxSteps: number): Row => {
  const size = buttonSize(s)
  const items = shuffled(rng, Screen.colours.filter((c) => c !== "purple")).slice(0, 3)
  // The menu button sits in the top half so its list (three items under it) fits on the screen.
  const x = Math.floor(rng.next() * (s.width - size.w + 1))
  const y = Math.floor(rng.next() * Math.max(1, s.height - 4 * size.h))
  const menuButton = button("menu", "purple", { x, y, w: size.w, h: size.h }, "Menu")
  const list = items.map((colour, i) => button(colour, colour, { x, y: y + (i + 1) * size.h, w: size.w, h: size.h }))
  const item = pick(rng, items)
  return {
    question: `Open the menu and choose ${item}.`,
    layout: { width: s.width, height: s.height, buttons: [], menu: { button: menuButton, items: list } },
    goal: { kind: "menu", item },
    maxSteps
  }
}

// ===== On a grid =====

/**
 * A widget `span` cells wide at cell `(col, r)`: a 1-pixel margin left and right, `cell - 6` pixels tall (at least
 * 6) and centred in the cell, so its centre is the middle cell's centre.
 */
const cellRect = (cell: number, col: number, r: number, span = 1): Screen.Rect => {
  const h = Math.max(6, cell - 6)
  return { x: col * cell + 1, y: r * cell + Math.floor((cell - h) / 2), w: span * cell - 2, h }
}

const gridRow = (rng: Sampling.Rng, s: Settings, cell: number, kind: Kind, maxSteps: number): Row => {
  const cols = Math.floor(s.width / cell), rowsOf = Math.floor(s.height / cell)
  if (cols < 3 || rowsOf < 4) {
    throw new Error(`a ${s.width} × ${s.height} screen has ${cols} × ${rowsOf} cells of ${cell}: at least 3 × 4 needed`)
  }
  const cells = shuffled(rng, Array.from({ length: cols * rowsOf }, (_, i) => [i % cols, Math.floor(i / cols)] as const))
  const screen = { width: s.width, height: s.height }
  switch (kind) {
    case "click": {
      const chosen = shuffled(rng, Screen.colours).slice(0, buttonCount(rng, s))
      const buttons = chosen.map((colour, i) => button(colour, colour, cellRect(cell, cells[i]![0], cells[i]![1])))
      const target = pick(rng, chosen)
      return {
        question: `Click the ${target} button.`,
        layout: { ...screen, buttons },
        goal: { kind: "click", target },
        maxSteps
      }
    }
    case "form": {
      const [fc, fr] = [Math.floor(rng.next() * (cols - 2)), Math.floor(rng.next() * rowsOf)]
      const free = cells.filter(([c, r]) => r !== fr || c < fc || c > fc + 2)
      const text = pick(rng, words)
      return {
        question: `Type ${text} in the box, then press OK.`,
        layout: {
          ...screen,
          buttons: [
            button("ok", "green", cellRect(cell, free[0]![0], free[0]![1]), "OK"),
            button("cancel", "red", cellRect(cell, free[1]![0], free[1]![1]), "No")
          ],
          field: cellRect(cell, fc, fr, 3)
        },
        goal: { kind: "form", text, submit: "ok" },
        maxSteps
      }
    }
    case "menu": {
      const items = shuffled(rng, Screen.colours.filter((c) => c !== "purple")).slice(0, 3)
      const [mc, mr] = [Math.floor(rng.next() * cols), Math.floor(rng.next() * (rowsOf - 3))]
      const item = pick(rng, items)
      return {
        question: `Open the menu and choose ${item}.`,
        layout: {
          ...screen,
          buttons: [],
          menu: {
            button: button("menu", "purple", cellRect(cell, mc, mr), "Menu"),
            items: items.map((colour, i) => button(colour, colour, cellRect(cell, mc, mr + i + 1)))
          }
        },
        goal: { kind: "menu", item },
        maxSteps
      }
    }
  }
}
