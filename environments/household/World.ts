/**
 * A world: rooms of receptacles (some opened and closed), objects in or on them, the agent (its room, the
 * receptacle it stands at, what it carries) and a clock. {@link generate} builds one from a row (its `seed`, its
 * {@link Goal.Goal} and an optional size {@link Spec}): a pure, seeded function, so that every chain of a group
 * faces the same world and a row is the whole of its episode's data.
 *
 * The generator guarantees the goal can be reached: the goal's objects, the receptacles, appliances and tools it
 * needs exist, and the goal does not hold at the start. What the agent sees of the world is the engine's business
 * (`Engine.ts`); a world is plain mutable data, owned by one chain.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as Sampling from "../../src/Sampling.ts"
import * as Catalog from "./Catalog.ts"
import * as Goal from "./Goal.ts"

// ===== Models =====

/**
 * @category models
 * @since 0.1.0
 */
export interface Receptacle {
  readonly id: string
  readonly kind: string
  readonly room: string
  open: boolean
  /** A stove that is on. */
  active: boolean
  /** A flower pot that was watered. */
  watered: boolean
  readonly contents: Array<string>
}

/**
 * An object. `at` is the id of the receptacle it is in or on, or `"inventory"`.
 *
 * @category models
 * @since 0.1.0
 */
export interface Thing {
  readonly id: string
  readonly kind: string
  at: string
  /** °C. */
  temp: number
  clean: boolean
  hot: boolean
  cold: boolean
  /** A desklamp that is on; a device that is powered. */
  on: boolean
  /** Its temperature was read with a thermometer. */
  measured: boolean
  /** Ticks a seed has grown (a sprout from 2). */
  growth: number
  /** The components it is connected to (two terminals: at most 2). */
  readonly links: Array<string>
}

/**
 * @category models
 * @since 0.1.0
 */
export interface Room {
  readonly name: string
  readonly receptacles: ReadonlyArray<string>
}

/**
 * @category models
 * @since 0.1.0
 */
export interface World {
  readonly goal: Goal.Goal
  readonly rooms: ReadonlyArray<Room>
  readonly receptacles: Record<string, Receptacle>
  readonly things: Record<string, Thing>
  /** The room the agent is in, and the receptacle it stands at (none: the middle of the room). */
  room: string
  at: string | undefined
  readonly inventory: Array<string>
  /** How many objects the agent can carry (ALFWorld: 1). */
  readonly capacity: number
  tick: number
}

/**
 * The size of a world: rooms, receptacles per room, distractor objects, and the chance that a receptacle that
 * opens starts open (ALFWorld: 0).
 *
 * @category models
 * @since 0.1.0
 */
export const Spec = Schema.Struct({
  rooms: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 3 }))),
  receptacles: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 3, maximum: 12 }))),
  distractors: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 12 }))),
  open: Schema.optionalKey(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1 })))
})
export type Spec = typeof Spec.Type

/**
 * The sizes of worlds whose row gives none: small, so that an episode fits a tiny policy's context.
 *
 * @category constants
 * @since 0.1.0
 */
export const defaultSpec: Readonly<Record<"household" | "science", Required<Spec>>> = {
  household: { rooms: 1, receptacles: 4, distractors: 2, open: 0 },
  science: { rooms: 1, receptacles: 4, distractors: 1, open: 0 }
}

/**
 * A row's world: its seed, goal and size.
 *
 * @category models
 * @since 0.1.0
 */
export interface Source {
  readonly seed: number
  readonly goal: Goal.Goal
  readonly world?: Spec | undefined
}

// ===== Generation =====

/** Receptacle kinds a world may hold only one of. */
const unique = new Set(["microwave", "fridge", "sinkbasin", "stove", "freezer", "red box", "blue box"])

/** Receptacles an object is never placed in or on at the start (they would change it, or decide a goal). */
const noStart = new Set(["stove", "red box", "blue box", "flower pot"])

interface Draw {
  readonly next: () => number
  readonly pick: <A>(xs: ReadonlyArray<A>) => A
}

const draw = (seed: number): Draw => {
  const next = Sampling.mulberry32(seed)
  return { next, pick: (xs) => xs[Math.floor(next() * xs.length)]! }
}

/** The main room of a goal (its appliances and target are there) and the receptacle kinds it needs. */
const mainRoom = (goal: Goal.Goal, d: Draw): { readonly room: string; readonly needs: Array<string> } => {
  switch (goal.type) {
    case "phase": {
      const start = Catalog.phaseStarts[goal.change!].find((s) => s.substance === goal.object)!
      return { room: "science kitchen", needs: [goal.change === "freeze" ? "freezer" : "stove", d.pick(start.keep)] }
    }
    case "measure":
      return {
        room: "science kitchen",
        needs: ["red box", "blue box", d.pick(["counter", "cupboard", "shelf", "table"])]
      }
    case "circuit":
      return { room: "workshop", needs: ["workbench"] }
    case "grow":
      return { room: "greenhouse", needs: ["flower pot"] }
    default: {
      const room = d.pick(Goal.roomsFor(goal))
      const kinds = Catalog.rooms[room]!.receptacles
      const appliance = { clean: ["sinkbasin"], heat: ["microwave"], cool: ["fridge"] } as Record<string, Array<string>>
      const stand = goal.type === "look" ? [d.pick(Catalog.lampStands.filter((k) => kinds.includes(k)))] : []
      const target = goal.target === undefined ? [] : [goal.target]
      return { room, needs: [...target, ...(appliance[goal.type] ?? []), ...stand] }
    }
  }
}

/** The receptacle kinds of a room: what it needs, then kinds drawn from the room's own up to `count`. */
const roomKinds = (
  room: string,
  needs: ReadonlyArray<string>,
  count: number,
  avoid: ReadonlySet<string>,
  d: Draw
): Array<string> => {
  const kinds = [...new Set(needs)]
  const pool = Catalog.rooms[room]!.receptacles
  // Worlds larger than one `count` hold repeats (cabinet 1, cabinet 2), never of a unique appliance.
  for (let tries = 0; kinds.length < count && tries < 100; tries++) {
    const kind = d.pick(pool)
    if (!(unique.has(kind) && kinds.includes(kind))) kinds.push(kind)
  }
  // Somewhere for the goal's objects to start (not where the goal wants them).
  if (kinds.every((k) => avoid.has(k))) kinds.push(d.pick(pool.filter((k) => !avoid.has(k))))
  return kinds
}

const makeThing = (id: string, kind: string, at: string, temp = 20): Thing => ({
  id,
  kind,
  at,
  temp,
  clean: false,
  hot: false,
  cold: false,
  on: false,
  measured: false,
  growth: 0,
  links: []
})

/** Numbers instances per kind: `cabinet 1`, `cabinet 2`, ... */
const numbering = () => {
  const counts = new Map<string, number>()
  return (kind: string) => {
    const n = (counts.get(kind) ?? 0) + 1
    counts.set(kind, n)
    return `${kind} ${n}`
  }
}

/**
 * Sorts ids the way a person lists them: by kind, then by number (`drawer 2` before `drawer 10`).
 *
 * @category getters
 * @since 0.1.0
 */
export const byName = (a: string, b: string): number => {
  const [, ka = a, na = "0"] = /^(.*) (\d+)$/.exec(a) ?? []
  const [, kb = b, nb = "0"] = /^(.*) (\d+)$/.exec(b) ?? []
  return ka === kb ? Number(na) - Number(nb) : ka < kb ? -1 : 1
}

/**
 * The world of a row. Pure: the same row always builds the same world.
 *
 * @category constructors
 * @since 0.1.0
 */
export const generate = (source: Source): World => {
  const d = draw(source.seed)
  const { goal } = source
  const family = Goal.familyOf(goal.type)
  const spec = { ...defaultSpec[family], ...source.world }
  const main = mainRoom(goal, d)
  const others = Object.keys(Catalog.rooms).filter((r) => r !== main.room && Catalog.rooms[r]!.family === family)
  const roomKindsInOrder = [main.room]
  while (roomKindsInOrder.length < spec.rooms) {
    roomKindsInOrder.push(d.pick(others.filter((r) => !roomKindsInOrder.includes(r))))
  }
  const id = numbering()
  const receptacles: Record<string, Receptacle> = {}
  const rooms: Array<Room> = roomKindsInOrder.map((kind, i) => {
    const name = Catalog.roomName(kind)
    const count = Math.max(spec.receptacles, i === 0 ? main.needs.length + 1 : 0)
    const avoid = new Set([...noStart, ...(i === 0 && goal.target !== undefined ? [goal.target] : [])])
    const ids = roomKinds(kind, i === 0 ? main.needs : [], count, avoid, d)
      .map((k) => {
        const r: Receptacle = {
          id: id(k),
          kind: k,
          room: name,
          open: false,
          active: false,
          watered: false,
          contents: []
        }
        receptacles[r.id] = r
        return r.id
      })
    return { name, receptacles: ids.sort(byName) }
  })
  const things: Record<string, Thing> = {}
  const world: World = {
    goal,
    rooms,
    receptacles,
    things,
    room: rooms[0]!.name,
    at: undefined,
    inventory: [],
    capacity: family === "household" ? 1 : 4,
    tick: 0
  }
  const all = Object.values(receptacles)
  const place = (kind: string, where: ReadonlyArray<Receptacle>, temp?: number) => {
    const r = d.pick(where)
    const thing = makeThing(id(kind), kind, r.id, temp)
    things[thing.id] = thing
    r.contents.push(thing.id)
    return thing
  }
  const anywhere = all.filter((r) => !noStart.has(r.kind))
  placeGoal(world, goal, d, place, anywhere)
  const goalKinds = new Set(Object.values(things).map((t) => t.kind))
  const distractors = roomKindsInOrder.flatMap((r) => Catalog.rooms[r]!.objects).filter((k) => !goalKinds.has(k))
  for (let i = 0; i < spec.distractors && distractors.length > 0; i++) place(d.pick(distractors), anywhere)
  for (const r of all) {
    r.open = !Catalog.receptacles[r.kind]!.openable || d.next() < spec.open
    r.contents.sort(byName)
  }
  return world
}

/** Places what the goal is about, where it does not already hold. */
const placeGoal = (
  world: World,
  goal: Goal.Goal,
  d: Draw,
  place: (kind: string, where: ReadonlyArray<Receptacle>, temp?: number) => Thing,
  anywhere: ReadonlyArray<Receptacle>
): void => {
  const all = Object.values(world.receptacles)
  const ofKind = (kinds: ReadonlyArray<string>) => all.filter((r) => kinds.includes(r.kind))
  switch (goal.type) {
    case "pick":
    case "clean":
    case "heat":
    case "cool":
    case "two": {
      const sources = anywhere.filter((r) => r.kind !== goal.target)
      place(goal.object, sources)
      if (goal.type === "two") place(goal.object, sources)
      return
    }
    case "look":
      place("desklamp", ofKind(Catalog.lampStands).filter((r) => r.room === world.rooms[0]!.name))
      place(goal.object, anywhere)
      return
    case "phase": {
      const start = Catalog.phaseStarts[goal.change!].find((s) => s.substance === goal.object)!
      place(goal.object, ofKind(start.keep), start.temp)
      return
    }
    case "measure": {
      const range = Catalog.measured.find((m) => m.kind === goal.object)!
      // Never within 5 degrees of the threshold: the reading decides, not the thermometer's rounding.
      const temps = Array.from({ length: range.max - range.min + 1 }, (_, i) => range.min + i)
        .filter((t) => Math.abs(t - goal.threshold!) >= 5)
      const neutral = anywhere.filter((r) => r.kind !== "fridge" && r.kind !== "freezer")
      place(goal.object, neutral, d.pick(temps))
      place("thermometer", anywhere)
      return
    }
    case "circuit":
      for (const kind of ["battery", "wire", goal.object]) place(kind, anywhere)
      return
    case "grow": {
      place("soil", ofKind(["flower pot"]))
      place(goal.object, anywhere)
      place("watering can", anywhere)
      return
    }
  }
}

// ===== Getters =====

/**
 * The receptacle kind's facts.
 *
 * @category getters
 * @since 0.1.0
 */
export const kindOf = (r: Receptacle): Catalog.ReceptacleKind => Catalog.receptacles[r.kind]!

/**
 * The phase of a substance, or undefined for things whose phase is not tracked.
 *
 * @category getters
 * @since 0.1.0
 */
export const phase = (thing: Thing): "solid" | "liquid" | "gas" | undefined => {
  const { melts, boils } = Catalog.objectKind(thing.kind)
  if (melts === undefined) return undefined
  return thing.temp < melts ? "solid" : boils !== undefined && thing.temp >= boils ? "gas" : "liquid"
}

/**
 * How a thing is listed: its id, and its state where it has one (`water 1 (solid)`, `desklamp 1 (on)`).
 *
 * @category getters
 * @since 0.1.0
 */
export const label = (thing: Thing): string => {
  const role = Catalog.objectKind(thing.kind).role
  const state = phase(thing) ??
    (role === "lamp" || role === "device" ? (thing.on ? "on" : undefined) : undefined) ??
    (role === "seed" && thing.growth >= 2 ? "sprout" : undefined)
  return state === undefined ? thing.id : `${thing.id} (${state})`
}

/**
 * The room the agent is in.
 *
 * @category getters
 * @since 0.1.0
 */
export const currentRoom = (world: World): Room => world.rooms.find((r) => r.name === world.room)!

/**
 * What the agent sees of the room it is in (ALFWorld's opening line): its receptacles and the other rooms.
 *
 * @category getters
 * @since 0.1.0
 */
export const describeRoom = (world: World): string => {
  const room = currentRoom(world)
  const exits = world.rooms.filter((r) => r.name !== room.name).map((r) => r.name)
  return `You are in the ${room.name}. You see ${room.receptacles.join(", ")}.` +
    (exits.length === 0 ? "" : ` Exits: ${exits.join(", ")}.`)
}
