import { describe, expect, it } from "vitest"
import * as Frames from "../../../environments/simuscene/Frames.ts"
import * as Scene from "../../../environments/simuscene/Scene.ts"
import * as SimuSceneOracle from "../../../environments/simuscene/SimuSceneOracle.ts"

const scenes = Scene.generate(3, 500)

describe("SimuScene scenes", () => {
  it("says every number of a scene in words, and the words give the scene back", () => {
    for (const scene of scenes) expect(SimuSceneOracle.parse(Scene.describe(scene))).toEqual(scene)
    expect(SimuSceneOracle.parse("A ball falls.")).toBe(undefined)
  })

  it("keeps balls in the box, and a bounce loses energy as the restitution says", () => {
    for (const scene of scenes.slice(0, 100)) {
      const paths = Scene.simulate(scene)
      for (const ball of scene.balls) {
        for (const [x, y] of paths[ball.name]!) {
          expect(y).toBeGreaterThanOrEqual(ball.radius)
          expect(x).toBeGreaterThanOrEqual(ball.radius)
          expect(x).toBeLessThanOrEqual(scene.width - ball.radius)
        }
      }
    }
    const drop = { ...scenes[0]!, wind: 0, gravity: 9.8, restitution: 0.5, dt: 0.05 }
    const next = Scene.step(drop, { x: 5, y: 0.5, vx: 0, vy: -4 }, 0.5)
    expect(next.y).toBe(0.5)
    expect(next.vy).toBeCloseTo(0.5 * (4 + 9.8 * 0.05), 12)
  })

  it("scores the reference 1, a ball left at its start low, and a wrong shape is named", () => {
    const scene = scenes.find((s) => s.balls.length === 2)!
    const reference = Scene.simulate(scene)
    expect(Scene.trajectoryScore(scene, reference)).toBe(1)
    expect(Frames.overlap(scene, reference, reference)).toBe(1)
    const still = Object.fromEntries(
      scene.balls.map((b) => [b.name, reference[b.name]!.map(() => [b.x, b.y] as const)])
    )
    expect(Scene.trajectoryScore(scene, still)).toBeLessThan(0.5)
    expect(Frames.overlap(scene, still, reference)).toBeLessThan(0.5)
    expect(Scene.checkShape(scene, reference)).toBe(undefined)
    expect(Scene.checkShape(scene, [1, 2])).toMatch(/not a JSON object/)
    expect(Scene.checkShape(scene, { a: reference["a"] })).toMatch(/no list for ball b/)
    expect(Scene.checkShape(scene, { ...reference, a: reference["a"]!.slice(1) })).toMatch(/positions, not/)
    expect(Scene.checkShape(scene, { ...reference, b: [["x", 1], ...reference["b"]!.slice(1)] })).toMatch(/position 0/)
  })

  it("draws frames of the same bytes for the same paths", () => {
    const scene = scenes[1]!
    const paths = Scene.simulate(scene)
    expect(Frames.png(scene, paths)).toEqual(Frames.png(scene, paths))
    expect(Frames.dataUrl(scene, paths).startsWith("data:image/png;base64,")).toBe(true)
  })
})
