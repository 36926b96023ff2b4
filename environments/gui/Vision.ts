/**
 * Reading a GUI screen from its pixels alone, as the oracle does: where each palette colour's button is, where the
 * text field is and whether it has the focus. Nothing here knows the row: an oracle built on it proves every goal
 * solvable from what the agent is shown.
 *
 * @since 0.1.0
 */
import * as Render from "./Render.ts"
import * as Screen from "./Screen.ts"

const rgb = (hex: string): readonly [number, number, number] => [
  parseInt(hex.slice(1, 3), 16),
  parseInt(hex.slice(3, 5), 16),
  parseInt(hex.slice(5, 7), 16)
]

/**
 * The bounding box of the pixels of exactly one colour, or `undefined` when none has it.
 *
 * @category getters
 * @since 0.1.0
 */
export const box = (pixels: Render.Pixels, hex: string): Screen.Rect | undefined => {
  const [r, g, b] = rgb(hex)
  let x0 = Infinity, y0 = Infinity, x1 = -1, y1 = -1
  const { width, height, rgba } = pixels
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const i = (y * width + x) * 4
      if (rgba[i] !== r || rgba[i + 1] !== g || rgba[i + 2] !== b) continue
      if (x < x0) x0 = x
      if (y < y0) y0 = y
      if (x > x1) x1 = x
      if (y > y1) y1 = y
    }
  }
  return x1 < 0 ? undefined : { x: x0, y: y0, w: x1 - x0 + 1, h: y1 - y0 + 1 }
}

/**
 * The box of a palette colour's button (its fill), or `undefined` when it is not on the screen.
 *
 * @category getters
 * @since 0.1.0
 */
export const button = (pixels: Render.Pixels, colour: Screen.Colour): Screen.Rect | undefined =>
  box(pixels, Screen.palette[colour])

/**
 * The text field's box (the one pure white on a screen), or `undefined`.
 *
 * @category getters
 * @since 0.1.0
 */
export const field = (pixels: Render.Pixels): Screen.Rect | undefined => box(pixels, Render.chrome.field)

/**
 * Whether the field shows the focus border.
 *
 * @category getters
 * @since 0.1.0
 */
export const focused = (pixels: Render.Pixels): boolean => box(pixels, Render.chrome.focus) !== undefined
