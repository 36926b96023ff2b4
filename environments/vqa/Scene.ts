/**
 * Visual QA scenes: a seeded generator of small pictures (coloured circles, squares and triangles on a plain
 * background, one shape per cell of a 4 × 4 grid so that none touch) and a counting question about them ("How many
 * red circles are in the picture?"), rendered to PNG with `@napi-rs/canvas`. The truth (which shapes, where) is the
 * scene itself; `count` reads the answer back from the pixels alone, which is how the oracle answers.
 *
 * @since 0.1.0
 */
import { createCanvas, Image as CanvasImage } from "@napi-rs/canvas"
import * as Sampling from "../../src/Sampling.ts"

/**
 * The shapes' colours (pure, far apart, so that a pixel's colour names its shape's).
 *
 * @category constants
 * @since 0.1.0
 */
export const colours = { red: [220, 30, 30], green: [30, 160, 50], blue: [30, 80, 220] } as const
export type Colour = keyof typeof colours

/**
 * @category constants
 * @since 0.1.0
 */
export const kinds = ["circle", "square", "triangle"] as const
export type Kind = (typeof kinds)[number]

/**
 * One shape: its kind, colour and grid cell.
 *
 * @category models
 * @since 0.1.0
 */
export interface Shape {
  readonly kind: Kind
  readonly colour: Colour
  readonly cell: number
}

/**
 * A scene: its size, its shapes, and the question's kind and colour with the true count.
 *
 * @category models
 * @since 0.1.0
 */
export interface Scene {
  readonly seed: number
  readonly size: number
  readonly shapes: ReadonlyArray<Shape>
  readonly asked: { readonly kind: Kind; readonly colour: Colour }
  readonly answer: number
}

const grid = 4
const background = "#f4f1ea"

const pick = <A>(rng: () => number, items: ReadonlyArray<A>): A => items[Math.floor(rng() * items.length)]!

/**
 * The scene of a seed: 0–3 shapes of the asked kind and colour (each count equally likely), then 1–4 other shapes,
 * in distinct cells of a 4 × 4 grid over a `size`-pixel square (default 64: the `tiny-vl` tower's 16 tokens).
 *
 * @category constructors
 * @since 0.1.0
 */
export const generate = (seed: number, size = 64): Scene => {
  const rng = Sampling.mulberry32(seed)
  const colourNames = Object.keys(colours) as Array<Colour>
  const asked = { kind: pick(rng, kinds), colour: pick(rng, colourNames) }
  const answer = Math.floor(rng() * 4)
  const others = 1 + Math.floor(rng() * 4)
  const cells = Array.from({ length: grid * grid }, (_, i) => i)
  for (let i = cells.length - 1; i > 0; i--) {
    const j = Math.floor(rng() * (i + 1))
    ;[cells[i], cells[j]] = [cells[j]!, cells[i]!]
  }
  const shapes: Array<Shape> = []
  for (let i = 0; i < answer; i++) shapes.push({ ...asked, cell: cells[i]! })
  for (let i = 0; i < others; i++) {
    let shape: Omit<Shape, "cell">
    do shape = { kind: pick(rng, kinds), colour: pick(rng, colourNames) }
    while (shape.kind === asked.kind && shape.colour === asked.colour)
    shapes.push({ ...shape, cell: cells[answer + i]! })
  }
  return { seed, size, shapes, asked, answer }
}

/**
 * The question of a scene.
 *
 * @category getters
 * @since 0.1.0
 */
export const question = (scene: Scene): string =>
  `How many ${scene.asked.colour} ${scene.asked.kind}s are in the picture? Answer with a number.`

/**
 * The scene as PNG bytes (deterministic: the same seed gives the same bytes).
 *
 * @category constructors
 * @since 0.1.0
 */
export const render = (scene: Scene): Buffer => {
  const canvas = createCanvas(scene.size, scene.size)
  const context = canvas.getContext("2d")
  context.fillStyle = background
  context.fillRect(0, 0, scene.size, scene.size)
  const cell = scene.size / grid
  const r = cell * 0.38
  for (const shape of scene.shapes) {
    const cx = (shape.cell % grid + 0.5) * cell
    const cy = (Math.floor(shape.cell / grid) + 0.5) * cell
    const [red, green, blue] = colours[shape.colour]
    context.fillStyle = `rgb(${red},${green},${blue})`
    context.beginPath()
    if (shape.kind === "circle") context.arc(cx, cy, r, 0, Math.PI * 2)
    else if (shape.kind === "square") context.rect(cx - r, cy - r, 2 * r, 2 * r)
    else {
      context.moveTo(cx, cy - r)
      context.lineTo(cx + r, cy + r)
      context.lineTo(cx - r, cy + r)
      context.closePath()
    }
    context.fill()
  }
  return canvas.toBuffer("image/png")
}

/**
 * The scene as a `data:` URL.
 *
 * @category constructors
 * @since 0.1.0
 */
export const dataUrl = (scene: Scene): string => `data:image/png;base64,${render(scene).toString("base64")}`

/**
 * A dataset row: the question, the answer as text, the seed (the picture is rendered from it).
 *
 * @category constructors
 * @since 0.1.0
 */
export const row = (seed: number) => {
  const scene = generate(seed)
  return { question: question(scene), answer: String(scene.answer), seed }
}

/**
 * Counts the shapes of a kind and colour in a picture from its pixels alone: each connected region of pixels of
 * that colour is a shape, and its fill of its bounding box says which (a square fills it, a circle π/4 of it, a
 * triangle half).
 *
 * @category getters
 * @since 0.1.0
 */
export const count = (png: Uint8Array, kind: Kind, colour: Colour): number => {
  const image = new CanvasImage()
  image.src = Buffer.from(png)
  const canvas = createCanvas(image.width, image.height)
  const context = canvas.getContext("2d")
  context.drawImage(image, 0, 0)
  const { data, height, width } = context.getImageData(0, 0, image.width, image.height)
  const [red, green, blue] = colours[colour]
  const near = (p: number) =>
    Math.abs(data[p * 4]! - red) + Math.abs(data[p * 4 + 1]! - green) + Math.abs(data[p * 4 + 2]! - blue) < 30
  const seen = new Uint8Array(width * height)
  let found = 0
  for (let start = 0; start < width * height; start++) {
    if (seen[start] === 1 || !near(start)) continue
    const region = flood(start, width, height, near, seen)
    const fill = region.pixels / (region.width * region.height)
    const shape: Kind = fill > 0.9 ? "square" : fill > 0.65 ? "circle" : "triangle"
    if (shape === kind && region.pixels >= 12) found++
  }
  return found
}

/** The connected region (4-neighbours) of `near` pixels from `start`: its pixel count and bounding box. */
const flood = (
  start: number,
  width: number,
  height: number,
  near: (p: number) => boolean,
  seen: Uint8Array
): { readonly pixels: number; readonly width: number; readonly height: number } => {
  const stack = [start]
  seen[start] = 1
  let pixels = 0
  let [x0, y0, x1, y1] = [width, height, 0, 0]
  while (stack.length > 0) {
    const p = stack.pop()!
    const x = p % width
    const y = Math.floor(p / width)
    pixels++
    ;[x0, y0, x1, y1] = [Math.min(x0, x), Math.min(y0, y), Math.max(x1, x), Math.max(y1, y)]
    for (const q of [x > 0 ? p - 1 : -1, x < width - 1 ? p + 1 : -1, y > 0 ? p - width : -1, p + width]) {
      if (q >= 0 && q < width * height && seen[q] === 0 && near(q)) {
        seen[q] = 1
        stack.push(q)
      }
    }
  }
  return { pixels, width: x1 - x0 + 1, height: y1 - y0 + 1 }
}
