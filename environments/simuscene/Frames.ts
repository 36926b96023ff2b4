/**
 * Frames of a simulation, drawn with `@napi-rs/canvas`: the balls at four moments (a quarter, half, three quarters
 * and all of the steps), side by side in one strip. The agent is shown its own simulation's strip; the reward
 * compares its frames with the reference's by the overlap of the balls' pixels (intersection over union).
 *
 * @since 0.1.0
 */
import { createCanvas } from "@napi-rs/canvas"
import { Result } from "effect"
import * as Images from "../../src/Image.ts"
import type * as Scene from "./Scene.ts"

/**
 * The side of one frame in pixels.
 *
 * @category constants
 * @since 0.1.0
 */
export const side = 32

const moments = (steps: number): ReadonlyArray<number> =>
  [0.25, 0.5, 0.75, 1].map((share) => Math.max(1, Math.round(share * steps)) - 1)

const drawStrip = (scene: Scene.Scene, paths: Scene.Trajectories) => {
  const canvas = createCanvas(side * 4, side)
  const g = canvas.getContext("2d")
  g.fillStyle = "#ffffff"
  g.fillRect(0, 0, side * 4, side)
  const scale = side / Math.max(scene.width, scene.height)
  moments(scene.steps).forEach((at, k) => {
    g.strokeStyle = "#c0c0c0"
    g.strokeRect(k * side + 0.5, 0.5, side - 1, side - 1)
    g.fillStyle = "#000000"
    for (const ball of scene.balls) {
      const p = paths[ball.name]?.[at]
      if (p === undefined) continue
      g.beginPath()
      g.arc(k * side + p[0] * scale, side - p[1] * scale, Math.max(1, ball.radius * scale), 0, 2 * Math.PI)
      g.fill()
    }
  })
  return { canvas, g }
}

/**
 * The strip as PNG bytes.
 *
 * @category getters
 * @since 0.1.0
 */
export const png = (scene: Scene.Scene, paths: Scene.Trajectories): Uint8Array =>
  new Uint8Array(drawStrip(scene, paths).canvas.toBuffer("image/png"))

/** Which pixels a ball covers (dark enough), frame by frame. */
const mask = (scene: Scene.Scene, paths: Scene.Trajectories): Uint8Array => {
  const data = drawStrip(scene, paths).g.getImageData(0, 0, side * 4, side).data
  const out = new Uint8Array(side * 4 * side)
  for (let i = 0; i < out.length; i++) out[i] = data[i * 4]! < 128 ? 1 : 0
  return out
}

/**
 * The frames' overlap with the reference's: intersection over union of the balls' pixels over the four frames
 * (1 when they coincide, 0 when no ball pixel is shared).
 *
 * @category getters
 * @since 0.1.0
 */
export const overlap = (scene: Scene.Scene, agent: Scene.Trajectories, reference: Scene.Trajectories): number => {
  const a = mask(scene, agent)
  const b = mask(scene, reference)
  let inter = 0
  let union = 0
  for (let i = 0; i < a.length; i++) {
    inter += a[i]! & b[i]!
    union += a[i]! | b[i]!
  }
  return union === 0 ? 1 : inter / union
}

/**
 * The strip as a `data:` URL.
 *
 * @category getters
 * @since 0.1.0
 */
export const dataUrl = (scene: Scene.Scene, paths: Scene.Trajectories): string =>
  // Known to the runtime by its text from here on: a template counts its tokens without reading it again.
  Result.getOrThrow(Images.encodedDataUrl(png(scene, paths), { width: side * 4, height: side }))
