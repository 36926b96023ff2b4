/**
 * Draws a GUI screen with `@napi-rs/canvas` (Skia, prebuilt for every platform npm serves) and the DejaVu Sans font
 * shipped by `dejavu-fonts-ttf`, so the same state gives the same pixels on every machine, fonts installed or not.
 *
 * @since 0.1.0
 */
import { createCanvas, GlobalFonts, Image } from "@napi-rs/canvas"
import type { SKRSContext2D } from "@napi-rs/canvas"
import { Result } from "effect"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import * as Images from "../../src/Image.ts"
import * as Screen from "./Screen.ts"

const family = "AgentflyGuiSans"
let registered = false

/** Registers the shipped font once a process (Skia keeps it for the process's life). */
const registerFont = (): void => {
  if (registered) return
  const root = dirname(createRequire(import.meta.url).resolve("dejavu-fonts-ttf/package.json"))
  GlobalFonts.registerFromPath(join(root, "ttf", "DejaVuSans.ttf"), family)
  registered = true
}

/**
 * The background, borders and field colours.
 *
 * @category constants
 * @since 0.1.0
 */
export const chrome = { background: "#f0f0f0", border: "#202020", field: "#ffffff", focus: "#0a64ff" } as const

/**
 * The `gradient` backdrop's colour at a pixel: red grows with the column, green with the row, blue fixed, each in
 * 176–239 — never a palette colour, the field's white or the focus blue, so the oracle reads the screen as before.
 * A screen position is then in the pixels themselves, which a tower without absolute positions (2-D rotary only)
 * otherwise lacks.
 *
 * @category getters
 * @since 0.1.0
 */
export const gradientAt = (
  x: number,
  y: number,
  width: number,
  height: number
): readonly [number, number, number] => [176 + Math.floor((64 * x) / width), 176 + Math.floor((64 * y) / height), 208]

const fillGradient = (g: SKRSContext2D, width: number, height: number) => {
  const image = g.createImageData(width, height)
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const [r, gr, b] = gradientAt(x, y, width, height)
      const i = (y * width + x) * 4
      image.data[i] = r
      image.data[i + 1] = gr
      image.data[i + 2] = b
      image.data[i + 3] = 255
    }
  }
  g.putImageData(image, 0, 0)
}

// Labels are never pure white: the field's #ffffff is the one pure white on a screen (the oracle finds it by that).
const textOn = (colour: Screen.Colour): string => (colour === "yellow" || colour === "orange" ? "#000000" : "#f8f8f8")

/**
 * A screen's pixels, as RGBA bytes, row by row.
 *
 * @category models
 * @since 0.1.0
 */
export interface Pixels {
  readonly width: number
  readonly height: number
  readonly rgba: Uint8ClampedArray
}

const draw = (state: Screen.State) => {
  registerFont()
  const { width, height } = state.layout
  const canvas = createCanvas(width, height)
  const g = canvas.getContext("2d")
  if (state.layout.backdrop === "gradient") fillGradient(g, width, height)
  else {
    g.fillStyle = chrome.background
    g.fillRect(0, 0, width, height)
  }
  const fontPx = Math.max(6, Math.floor(height / 10))
  g.font = `${fontPx}px ${family}`
  g.textBaseline = "middle"
  const field = state.layout.field
  if (field !== undefined) {
    g.fillStyle = chrome.field
    g.fillRect(field.x, field.y, field.w, field.h)
    g.strokeStyle = state.focused ? chrome.focus : chrome.border
    g.lineWidth = 1
    g.strokeRect(field.x + 0.5, field.y + 0.5, field.w - 1, field.h - 1)
    g.fillStyle = "#000000"
    g.fillText(state.typed, field.x + 2, field.y + field.h / 2, field.w - 4)
  }
  const menu = state.layout.menu
  const buttons = [
    ...state.layout.buttons,
    ...(menu !== undefined ? [menu.button] : []),
    ...(menu !== undefined && state.menuOpen ? menu.items : [])
  ]
  for (const b of buttons) {
    g.fillStyle = Screen.palette[b.colour]
    g.fillRect(b.rect.x, b.rect.y, b.rect.w, b.rect.h)
    g.strokeStyle = chrome.border
    g.strokeRect(b.rect.x + 0.5, b.rect.y + 0.5, b.rect.w - 1, b.rect.h - 1)
    g.fillStyle = textOn(b.colour)
    g.fillText(b.label, b.rect.x + 2, b.rect.y + b.rect.h / 2, b.rect.w - 4)
  }
  return { canvas, g }
}

/**
 * The screen as a PNG file's bytes.
 *
 * @category getters
 * @since 0.1.0
 */
export const png = (state: Screen.State): Uint8Array => new Uint8Array(draw(state).canvas.toBuffer("image/png"))

/**
 * The screen's RGBA pixels (what the oracle reads, and what the tests check).
 *
 * @category getters
 * @since 0.1.0
 */
export const pixels = (state: Screen.State): Pixels => {
  const { width, height } = state.layout
  return { width, height, rgba: draw(state).g.getImageData(0, 0, width, height).data }
}

/**
 * A `data:` URL of the screen, as an `image_url` content part carries it.
 *
 * @category getters
 * @since 0.1.0
 */
export const dataUrl = (state: Screen.State): string =>
  // Known to the runtime by its text from here on: a chain's template counts its tokens without reading it again.
  Result.getOrThrow(Images.encodedDataUrl(png(state), state.layout))

/**
 * The pixels of a PNG (or JPEG) file's bytes, decoded by Skia: what an oracle reads from an image it was shown.
 *
 * @category constructors
 * @since 0.1.0
 */
export const decode = (bytes: Uint8Array): Pixels => {
  const image = new Image()
  image.src = Buffer.from(bytes)
  const canvas = createCanvas(image.width, image.height)
  const g = canvas.getContext("2d")
  g.drawImage(image, 0, 0)
  return { width: image.width, height: image.height, rgba: g.getImageData(0, 0, image.width, image.height).data }
}
