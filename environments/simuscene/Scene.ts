/**
 * SimuScene-style scenes, pure: balls in a box under gravity and a wind, bouncing off the floor and the walls;
 * the words that describe a scene to the agent; the reference simulation; and the trajectory score that compares
 * an agent's simulation with it. The agent's program prints `{"<ball>": [[x, y], …], …}`: each ball's position
 * after every step.
 *
 * The reference integrates as the words say (semi-implicit Euler: velocity first, then position; a ball whose
 * edge passes the floor or a wall is put back on it and its velocity across it reversed and scaled by the
 * restitution). The same steps in Python give the same doubles, so a faithful program scores 1.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as Sampling from "../../src/Sampling.ts"

// ===== Models =====

/**
 * A ball: its name, radius, initial position and velocity (metres, metres a second).
 *
 * @category models
 * @since 0.1.0
 */
export const Ball = Schema.Struct({
  name: Schema.String,
  radius: Schema.Number,
  x: Schema.Number,
  y: Schema.Number,
  vx: Schema.Number,
  vy: Schema.Number
})
export type Ball = typeof Ball.Type

/**
 * A scene: the box (width × height, floor at y = 0), the forces (gravity down, a horizontal wind acceleration),
 * the restitution of the floor and walls, and the time step and number of steps to simulate.
 *
 * @category models
 * @since 0.1.0
 */
export const SceneSpec = Schema.Struct({
  width: Schema.Number,
  height: Schema.Number,
  gravity: Schema.Number,
  wind: Schema.Number,
  restitution: Schema.Number,
  dt: Schema.Number,
  steps: Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 400 })),
  balls: Schema.Array(Ball).check(Schema.isMinLength(1))
})
export type Scene = typeof SceneSpec.Type

/**
 * Positions of every ball after every step, by ball name.
 *
 * @category models
 * @since 0.1.0
 */
export type Trajectories = Readonly<Record<string, ReadonlyArray<readonly [number, number]>>>

// ===== Words =====

const num = (v: number): string => String(v)

/**
 * The scene in words: what the agent reads (every number the simulation needs, and the output format).
 *
 * @category getters
 * @since 0.1.0
 */
export const describe = (scene: Scene): string => {
  const balls = scene.balls.map((b) =>
    `Ball ${b.name} (radius ${num(b.radius)}) starts at (${num(b.x)}, ${num(b.y)}) with velocity ` +
    `(${num(b.vx)}, ${num(b.vy)}).`
  )
  return [
    `A box ${num(scene.width)} wide and ${num(scene.height)} high, floor at y = 0.`,
    ...balls,
    `Gravity ${num(scene.gravity)} down, wind ${num(scene.wind)} along x.`,
    `Floor and walls bounce with restitution ${num(scene.restitution)}.`,
    `Simulate ${scene.steps} steps of dt ${num(scene.dt)}: velocity first, then position.`,
    `Print JSON {name: [[x, y] after each step]}.`
  ].join("\n")
}

// ===== Simulation =====

/**
 * One ball's step: velocity, then position, then the floor and walls (semi-implicit Euler).
 *
 * @category getters
 * @since 0.1.0
 */
export const step = (scene: Scene, s: { x: number; y: number; vx: number; vy: number }, radius: number) => {
  let { x, y, vx, vy } = s
  vx = vx + scene.wind * scene.dt
  vy = vy - scene.gravity * scene.dt
  x = x + vx * scene.dt
  y = y + vy * scene.dt
  if (y < radius) {
    y = radius
    vy = -vy * scene.restitution
  }
  if (x < radius) {
    x = radius
    vx = -vx * scene.restitution
  }
  if (x > scene.width - radius) {
    x = scene.width - radius
    vx = -vx * scene.restitution
  }
  return { x, y, vx, vy }
}

/**
 * The reference simulation.
 *
 * @category getters
 * @since 0.1.0
 */
export const simulate = (scene: Scene): Trajectories => {
  const out: Record<string, Array<readonly [number, number]>> = {}
  for (const ball of scene.balls) {
    let s = { x: ball.x, y: ball.y, vx: ball.vx, vy: ball.vy }
    const path: Array<readonly [number, number]> = []
    for (let i = 0; i < scene.steps; i++) {
      s = step(scene, s, ball.radius)
      path.push([s.x, s.y])
    }
    out[ball.name] = path
  }
  return out
}

// ===== Score =====

/**
 * How close positions must be to count (a share of the box's larger side): 2 %.
 *
 * @category constants
 * @since 0.1.0
 */
export const tolerance = 0.02

/**
 * What an agent's output must look like, checked before scoring: one list per ball, one `[x, y]` per step.
 * Returns the reason it does not, or `undefined`.
 *
 * @category getters
 * @since 0.1.0
 */
export const checkShape = (scene: Scene, printed: unknown): string | undefined => {
  if (typeof printed !== "object" || printed === null || Array.isArray(printed)) {
    return "the output is not a JSON object keyed by ball name"
  }
  const record = printed as Record<string, unknown>
  for (const ball of scene.balls) {
    const path = record[ball.name]
    if (!Array.isArray(path)) return `no list for ball ${ball.name}`
    if (path.length !== scene.steps) return `ball ${ball.name} has ${path.length} positions, not ${scene.steps}`
    const bad = path.findIndex((p) => !Array.isArray(p) || p.length !== 2 || !p.every(Number.isFinite))
    if (bad >= 0) return `ball ${ball.name}'s position ${bad} is not [x, y] numbers`
  }
  return undefined
}

/**
 * The trajectory score: the share of (ball, step) positions within {@link tolerance} of the reference's.
 *
 * @category getters
 * @since 0.1.0
 */
export const trajectoryScore = (scene: Scene, agent: Trajectories, reference: Trajectories = simulate(scene)) => {
  const limit = tolerance * Math.max(scene.width, scene.height)
  let close = 0
  let total = 0
  for (const ball of scene.balls) {
    const mine = agent[ball.name] ?? []
    reference[ball.name]!.forEach(([x, y], i) => {
      const p = mine[i]
      total++
      if (p !== undefined && Math.hypot(p[0] - x, p[1] - y) <= limit) close++
    })
  }
  return total === 0 ? 0 : close / total
}

// ===== Generation =====

const names = ["a", "b"] as const

// `+ 0` turns −0 into 0: the words say "0", and the scene they give back must be the same.
const round = (v: number, digits: number) => Number(v.toFixed(digits)) + 0

/**
 * `count` scenes from a seed: one or two balls in a 10 × 10 box, gravity 0–9.8, a wind in −2…2, restitution
 * 0.5–0.9, 20–40 steps of 0.05 s.
 *
 * @category constructors
 * @since 0.1.0
 */
export const generate = (seed: number, count: number): Array<Scene> => {
  const rng = Sampling.rng(seed)
  const u = (lo: number, hi: number, digits = 1) => round(lo + rng.next() * (hi - lo), digits)
  return Array.from({ length: count }, () => {
    const n = rng.next() < 0.5 ? 1 : 2
    return {
      width: 10,
      height: 10,
      gravity: u(0, 9.8),
      wind: u(-2, 2),
      restitution: u(0.5, 0.9),
      dt: 0.05,
      steps: 20 + Math.floor(rng.next() * 21),
      balls: names.slice(0, n).map((name) => ({
        name,
        radius: u(0.3, 0.8),
        x: u(1, 9),
        y: u(1, 9),
        vx: u(-4, 4),
        vy: u(-4, 4)
      }))
    }
  })
}
