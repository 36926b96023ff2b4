/**
 * Scripted players of the SimuScene task, through the same tool and episode as a model:
 *
 * - {@link oracle}: reads the scene from the question's words alone ({@link parse}) and writes the program that
 *   simulates it as the words say ({@link program}), so its score proves every scene solvable from its description;
 * - {@link noise}: a program that prints positions drawn at random in the box, the baseline that must score ≈ 0.
 *
 * @since 0.1.0
 */
import * as Oracle from "../../actors/Oracle.ts"
import type { Conversation } from "../../src/Message.ts"
import * as Scene from "./Scene.ts"

const number = String.raw`(-?\d+(?:\.\d+)?)`

/**
 * The scene a description states, or `undefined` when the words are not a scene's.
 *
 * @category getters
 * @since 0.1.0
 */
export const parse = (text: string): Scene.Scene | undefined => {
  const box = new RegExp(`A box ${number} wide and ${number} high`).exec(text)
  const forces = new RegExp(`Gravity ${number} down, wind ${number} along x`).exec(text)
  const bounce = new RegExp(`restitution ${number}`).exec(text)
  const time = new RegExp(`Simulate (\\d+) steps of dt ${number}`).exec(text)
  const ball = new RegExp(
    `Ball (\\w+) \\(radius ${number}\\) starts at \\(${number}, ${number}\\) with velocity \\(${number}, ${number}\\)`,
    "g"
  )
  const balls = [...text.matchAll(ball)].map((m) => ({
    name: m[1]!,
    radius: Number(m[2]),
    x: Number(m[3]),
    y: Number(m[4]),
    vx: Number(m[5]),
    vy: Number(m[6])
  }))
  if (box === null || forces === null || bounce === null || time === null || balls.length === 0) return undefined
  return {
    width: Number(box[1]),
    height: Number(box[2]),
    gravity: Number(forces[1]),
    wind: Number(forces[2]),
    restitution: Number(bounce[1]),
    steps: Number(time[1]),
    dt: Number(time[2]),
    balls
  }
}

/**
 * The Python program that simulates a scene as its words say (the reference's steps, in the same order).
 *
 * @category getters
 * @since 0.1.0
 */
export const program = (scene: Scene.Scene): string => {
  const balls = scene.balls.map((b) => `"${b.name}":[${b.radius},${b.x},${b.y},${b.vx},${b.vy}]`).join(",")
  return [
    "import json",
    `W,g,w,e,dt,n=${scene.width},${scene.gravity},${scene.wind},${scene.restitution},${scene.dt},${scene.steps}`,
    `out={}`,
    `for k,(r,x,y,vx,vy) in {${balls}}.items():`,
    "  p=[]",
    "  for _ in range(n):",
    "    vx=vx+w*dt;vy=vy-g*dt;x=x+vx*dt;y=y+vy*dt",
    "    if y<r:y=r;vy=-vy*e",
    "    if x<r:x=r;vx=-vx*e",
    "    if x>W-r:x=W-r;vx=-vx*e",
    "    p.append([x,y])",
    "  out[k]=p",
    "print(json.dumps(out))"
  ].join("\n")
}

const question = (messages: Conversation): string => Oracle.text(messages.find((m) => m.role === "user"))

/**
 * The oracle: the program of the scene it reads.
 *
 * @category constructors
 * @since 0.1.0
 */
export const oracle: Oracle.Policy = (messages) => {
  const scene = parse(question(messages))
  return scene === undefined
    ? { content: "I cannot read the scene." }
    : { toolCalls: [Oracle.call(messages, "simulate", { code: program(scene) })] }
}

/**
 * The noise baseline: well-formed output, positions drawn at random in the box.
 *
 * @category constructors
 * @since 0.1.0
 */
export const noise: Oracle.Policy = (messages) => {
  const scene = parse(question(messages))
  if (scene === undefined) return { content: "I cannot read the scene." }
  const names = scene.balls.map((b) => `"${b.name}"`).join(",")
  const code = [
    "import json, random",
    "random.seed(1)",
    `print(json.dumps({k: [[random.uniform(0, ${scene.width}), random.uniform(0, ${scene.height})] ` +
    `for _ in range(${scene.steps})] for k in [${names}]}))`
  ].join("\n")
  return { toolCalls: [Oracle.call(messages, "simulate", { code })] }
}
