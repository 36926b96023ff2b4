/**
 * The GUI task's world, pure: a screen of widgets (buttons, a text field, a menu), the goal a row sets, and what a
 * `click(x, y)` or `type(text)` does to it. Rendering (`Render.ts`) and the tools (`GuiTask.ts`) are built on it;
 * nothing here draws or reads pixels, so the rules are tested on their own.
 *
 * Three kinds of goal, each a few actions long:
 * - `click`: "Click the red button." — one click inside the named button;
 * - `form`: "Type cat in the box, then press OK." — click the field (it takes the focus), type the word, press OK;
 * - `menu`: "Open the menu and choose blue." — click Menu (its list opens below it), click the named item.
 *
 * An episode ends solved when the goal is met, failed when a button other than the goal's is pressed, else after
 * the step limit (`Row.maxSteps`).
 *
 * @since 0.1.0
 */
import { Schema } from "effect"

// ===== Models =====

/**
 * A rectangle in screen pixels (top-left corner, size).
 *
 * @category models
 * @since 0.1.0
 */
export const Rect = Schema.Struct({ x: Schema.Int, y: Schema.Int, w: Schema.Int, h: Schema.Int })
export type Rect = typeof Rect.Type

/**
 * The colours a widget can have, by name (the names the goals use).
 *
 * @category constants
 * @since 0.1.0
 */
export const palette = {
  red: "#e6194b",
  green: "#3cb44b",
  blue: "#4363d8",
  yellow: "#ffe119",
  purple: "#911eb4",
  orange: "#f58231"
} as const
export type Colour = keyof typeof palette

/**
 * The colour names, in a fixed order.
 *
 * @category constants
 * @since 0.1.0
 */
export const colours = Object.keys(palette) as ReadonlyArray<Colour>

/**
 * A button: its label, colour and place. `id` is what goals and the oracle name.
 *
 * @category models
 * @since 0.1.0
 */
export const Button = Schema.Struct({
  id: Schema.String,
  label: Schema.String,
  colour: Schema.Literals(colours),
  rect: Rect
})
export type Button = typeof Button.Type

/**
 * A screen as a row describes it: its size, its buttons, an optional text field, an optional menu (a button that
 * opens a list of items under it) and its backdrop.
 *
 * @category models
 * @since 0.1.0
 */
export const Layout = Schema.Struct({
  width: Schema.Int.check(Schema.isBetween({ minimum: 16, maximum: 1024 })),
  height: Schema.Int.check(Schema.isBetween({ minimum: 16, maximum: 1024 })),
  buttons: Schema.Array(Button),
  field: Schema.optionalKey(Rect),
  menu: Schema.optionalKey(Schema.Struct({ button: Button, items: Schema.Array(Button) })),
  /** The background: plain grey (the default), or a faint 2-D gradient that shows where on the screen a pixel is. */
  backdrop: Schema.optionalKey(Schema.Literals(["plain", "gradient"]))
})
export type Layout = typeof Layout.Type

/**
 * What the row asks for.
 *
 * @category models
 * @since 0.1.0
 */
export const Goal = Schema.Union([
  Schema.Struct({ kind: Schema.Literal("click"), target: Schema.String }),
  Schema.Struct({ kind: Schema.Literal("form"), text: Schema.String, submit: Schema.String }),
  Schema.Struct({ kind: Schema.Literal("menu"), item: Schema.String })
])
export type Goal = typeof Goal.Type

/**
 * The state of one episode's screen.
 *
 * @category models
 * @since 0.1.0
 */
export interface State {
  readonly layout: Layout
  readonly goal: Goal
  readonly maxSteps: number
  readonly steps: number
  readonly focused: boolean
  readonly typed: string
  readonly menuOpen: boolean
  readonly outcome: "solved" | "failed" | undefined
  /** Actions that changed nothing (a click on the background, typing with no focus). */
  readonly missed: number
  /** The best {@link alignment} of the episode's clicks so far (0 before any click). */
  readonly aligned?: number
}

/**
 * An action of the agent.
 *
 * @category models
 * @since 0.1.0
 */
export type Action =
  | { readonly _tag: "click"; readonly x: number; readonly y: number }
  | { readonly _tag: "type"; readonly text: string }

// ===== Rules =====

/**
 * A fresh episode on a layout.
 *
 * @category constructors
 * @since 0.1.0
 */
export const start = (layout: Layout, goal: Goal, maxSteps: number): State => ({
  layout,
  goal,
  maxSteps,
  steps: 0,
  focused: false,
  typed: "",
  menuOpen: false,
  outcome: undefined,
  missed: 0
})

/**
 * Whether a point lies in a rectangle (edges included).
 *
 * @category getters
 * @since 0.1.0
 */
export const inside = (r: Rect, x: number, y: number): boolean => x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h

/**
 * The buttons a click can press now: the menu's items while it is open (they lie over what is below them), then
 * the menu button and the plain buttons.
 *
 * @category getters
 * @since 0.1.0
 */
export const pressable = (state: State): ReadonlyArray<Button> => {
  const menu = state.layout.menu
  return [
    ...(menu !== undefined && state.menuOpen ? menu.items : []),
    ...(menu !== undefined ? [menu.button] : []),
    ...state.layout.buttons
  ]
}

/**
 * What an action does, with the sentence the agent reads beside the new screen.
 *
 * @category combinators
 * @since 0.1.0
 */
export const act = (state: State, action: Action): { readonly state: State; readonly text: string } => {
  if (state.outcome !== undefined) return { state, text: "The episode is over." }
  const next = { ...state, steps: state.steps + 1 }
  const done = (s: State): State =>
    s.outcome === undefined && s.steps >= s.maxSteps ? { ...s, outcome: "failed" } : s
  if (action._tag === "type") {
    if (!state.focused) return { state: done({ ...next, missed: next.missed + 1 }), text: "No field has the focus." }
    return { state: done({ ...next, typed: next.typed + action.text }), text: `Typed ${JSON.stringify(action.text)}.` }
  }
  const { x, y } = action
  const aligned = Math.max(state.aligned ?? 0, alignment(state, x, y))
  const hit = pressable(state).find((b) => inside(b.rect, x, y))
  if (hit !== undefined) return press({ ...next, aligned }, hit, done)
  const field = state.layout.field
  if (field !== undefined && inside(field, x, y)) {
    return { state: done({ ...next, aligned, focused: true, menuOpen: false }), text: "The field has the focus." }
  }
  return {
    state: done({ ...next, aligned, focused: false, menuOpen: false, missed: next.missed + 1 }),
    text: `Nothing at (${x}, ${y}).`
  }
}

const press = (
  state: State,
  button: Button,
  done: (s: State) => State
): { readonly state: State; readonly text: string } => {
  const menu = state.layout.menu
  if (menu !== undefined && button.id === menu.button.id) {
    return { state: done({ ...state, menuOpen: !state.menuOpen, focused: false }), text: `Pressed ${button.label}.` }
  }
  const outcome = goalMet(state, button) ? "solved" : "failed"
  return { state: { ...state, outcome, menuOpen: false }, text: `Pressed ${button.label}.` }
}

/** Whether pressing `button` now meets the goal. */
const goalMet = (state: State, button: Button): boolean => {
  const goal = state.goal
  switch (goal.kind) {
    case "click":
      return button.id === goal.target
    case "form":
      return button.id === goal.submit && state.typed === goal.text
    case "menu":
      return button.id === goal.item
  }
}

/**
 * How well a click lines up with a click goal's target: 1/2 when it falls within the target's columns, 1/2 when
 * within its rows (1 inside it), 0 for the other goals. Partial credit for each coordinate, so that a reward built
 * on it (`GuiTask`'s `alignment` option) tells a policy which of its two numbers was right.
 *
 * @category getters
 * @since 0.1.0
 */
export const alignment = (state: State, x: number, y: number): number => {
  const goal = state.goal
  if (goal.kind !== "click") return 0
  const target = state.layout.buttons.find((b) => b.id === goal.target)
  if (target === undefined) return 0
  const { rect: r } = target
  return (x >= r.x && x < r.x + r.w ? 0.5 : 0) + (y >= r.y && y < r.y + r.h ? 0.5 : 0)
}

/**
 * The episode's score: 1 when solved, else 0.
 *
 * @category getters
 * @since 0.1.0
 */
export const score = (state: State): number => (state.outcome === "solved" ? 1 : 0)

/**
 * The centre of a rectangle (where the oracle clicks).
 *
 * @category getters
 * @since 0.1.0
 */
export const centre = (r: Rect): { readonly x: number; readonly y: number } => ({
  x: r.x + Math.floor(r.w / 2),
  y: r.y + Math.floor(r.h / 2)
})
