/**
 * The oracle of the household and science tasks: a scripted agent that reads only what a model reads (the
 * opening, its own commands and the environment's answers) and explores as a model would. It never sees the
 * row's seed or the generated world: what is inside a closed drawer it learns by going there and opening it, the
 * temperature of the tea by reading a thermometer. So a solved episode proves the task solvable from the text,
 * and the reward right, not merely that the generator placed things where the oracle expected them.
 *
 * It rebuilds its beliefs from the whole conversation at every turn ({@link beliefs}), then plans the next command
 * from them ({@link decide}): fetch what the goal is about (exploring receptacles in the order the room lists them,
 * then other rooms), treat it (clean, heat, cool; a stove or freezer and waiting; a thermometer; a circuit; soil
 * and water), put it where the goal wants it. Commands are ALFWorld's (`put X in/on Y`).
 *
 * @since 0.1.0
 */
import * as Oracle from "../../actors/Oracle.ts"
import type * as Message from "../../src/Message.ts"
import { commandOf } from "./HouseholdTask.ts"

// ===== Beliefs =====

/**
 * What the agent knows of its world, from the text alone.
 *
 * @category models
 * @since 0.1.0
 */
export interface Beliefs {
  readonly task: string
  room: string
  readonly rooms: Map<string, ReadonlyArray<string>>
  at: string | undefined
  /** The contents last seen in each receptacle, or `closed`. */
  readonly seen: Map<string, Array<string> | "closed">
  readonly carrying: Array<string>
  /** Things cleaned, heated, cooled; switched on; measured (°C); receptacles watered; connected pairs. */
  readonly treated: Set<string>
  readonly on: Set<string>
  readonly readings: Map<string, number>
  readonly watered: Set<string>
  readonly links: Set<string>
  readonly visited: Set<string>
}

const kindOf = (id: string) => id.replace(/ \d+$/, "")
const strip = (label: string) => label.replace(/ \([^)]*\)$/, "")
const list = (s: string) => s.split(", ").map(strip)

/** Reads a room description (`You are in the kitchen. You see a, b. Exits: c.`). */
const readRoom = (b: Beliefs, text: string): boolean => {
  const m = /^You are in the (.+?)\. You see ([^.]+)\.(?: Exits: ([^.]+)\.)?/.exec(text)
  if (m === null) return false
  b.room = m[1]!
  b.visited.add(b.room)
  b.rooms.set(b.room, list(m[2]!))
  for (const exit of m[3] === undefined ? [] : list(m[3])) if (!b.rooms.has(exit)) b.rooms.set(exit, [])
  return true
}

/** Reads what a receptacle holds, from an arrival or an opening. */
const readContents = (b: Beliefs, r: string, text: string): void => {
  if (/ It is on\./.test(text)) b.on.add(r)
  if (/ It is off\./.test(text)) b.on.delete(r)
  const m = /(?:In|On) it: ([^.]+)\./.exec(text)
  b.seen.set(r, / It is closed\./.test(text) ? "closed" : m === null ? [] : list(m[1]!))
}

const remove = (xs: Array<string>, x: string) => {
  const i = xs.indexOf(x)
  if (i >= 0) xs.splice(i, 1)
}

/** Updates the beliefs with one command and its answer. */
const read = (b: Beliefs, command: string, answer: string): void => {
  if (answer.startsWith("Nothing happens")) return
  if (readRoom(b, answer)) {
    if (command.startsWith("go to")) b.at = undefined
    return
  }
  let m: RegExpExecArray | null
  if ((m = /^You arrive at (.+?)\./.exec(answer)) !== null) {
    b.at = m[1]!
    return readContents(b, b.at, answer)
  }
  if ((m = /^You open (.+?)\./.exec(answer)) !== null) return readContents(b, m[1]!, answer)
  if ((m = /^You close (.+?)\./.exec(answer)) !== null) return void b.seen.set(m[1]!, "closed")
  if ((m = /^You take (.+) from (.+?)\./.exec(answer)) !== null) {
    b.carrying.push(m[1]!)
    const held = b.seen.get(m[2]!)
    if (Array.isArray(held)) remove(held, m[1]!)
    return
  }
  if ((m = /^You put (.+) (?:in|on) (.+?)\./.exec(answer)) !== null) {
    remove(b.carrying, m[1]!)
    const held = b.seen.get(m[2]!)
    if (Array.isArray(held)) held.push(m[1]!)
    return
  }
  if ((m = /^You (?:clean|heat|cool) (.+) with /.exec(answer)) !== null) return void b.treated.add(m[1]!)
  if ((m = /^You turn (on|off) (.+?)\./.exec(answer)) !== null) {
    return void (m[1] === "on" ? b.on.add(m[2]!) : b.on.delete(m[2]!))
  }
  if ((m = /^The .+ reads (-?\d+) degrees\./.exec(answer)) !== null) {
    return void b.readings.set(/ on (.+)$/.exec(command)![1]!, Number(m[1]))
  }
  if ((m = /^You water (.+?)\./.exec(answer)) !== null) return void b.watered.add(m[1]!)
  if ((m = /^You connect (.+) to (.+?)\./.exec(answer)) !== null) return void b.links.add(`${m[1]}|${m[2]}`)
}

/**
 * The beliefs a conversation supports: the opening (the first user message), then each command and the answer
 * that followed it.
 *
 * @category constructors
 * @since 0.1.0
 */
export const beliefs = (opening: string, history: ReadonlyArray<readonly [string, string]>): Beliefs => {
  const b: Beliefs = {
    task: /Your task is to: (.+)$/m.exec(opening)?.[1] ?? "",
    room: "",
    rooms: new Map(),
    at: undefined,
    seen: new Map(),
    carrying: [],
    treated: new Set(),
    on: new Set(),
    readings: new Map(),
    watered: new Set(),
    links: new Set(),
    visited: new Set()
  }
  readRoom(b, opening)
  for (const [command, answer] of history) read(b, command, answer)
  return b
}

// ===== Planning =====

/** The receptacle whose contents are unknown that the agent should look into next, or a room to go to. */
const explore = (b: Beliefs): string => {
  // Where the task says to put things is looked into last: things to fetch are rarely there already.
  const named = (r: string) => b.task.includes(r) || new RegExp(`\\b${kindOf(r)}\\.$`).test(b.task)
  const here = [...(b.rooms.get(b.room) ?? [])].sort((x, y) => Number(named(x)) - Number(named(y)))
  const unknown = here.find((r) => b.seen.get(r) === undefined || b.seen.get(r) === "closed")
  if (unknown !== undefined) return b.at === unknown ? `open ${unknown}` : `go to ${unknown}`
  const room = [...b.rooms.entries()].find(([r, rs]) =>
    r !== b.room && (!b.visited.has(r) || rs.some((x) => b.seen.get(x) === undefined || b.seen.get(x) === "closed"))
  )?.[0]
  return room === undefined ? "look" : `go to ${room}`
}

/** Gets to a receptacle (another room first if need be) and opens it. */
const approach = (b: Beliefs, r: string): string | undefined => {
  if (b.at !== r) {
    if ((b.rooms.get(b.room) ?? []).includes(r)) return `go to ${r}`
    const room = [...b.rooms.entries()].find(([, rs]) => rs.includes(r))?.[0]
    return room === undefined ? explore(b) : `go to ${room}`
  }
  return b.seen.get(r) === "closed" ? `open ${r}` : undefined
}

/** Where a thing was last seen. */
const whereIs = (b: Beliefs, matches: (id: string) => boolean): readonly [string, string] | undefined => {
  for (const [r, contents] of b.seen) {
    if (contents === "closed") continue
    const id = contents.find(matches)
    if (id !== undefined) return [r, id]
  }
  return undefined
}

/** Brings a thing into the agent's hands: takes it where it was seen, or explores. */
const fetch = (b: Beliefs, matches: (id: string) => boolean): string => {
  const found = whereIs(b, matches)
  if (found === undefined) return explore(b)
  const [r, id] = found
  return approach(b, r) ?? `take ${id} from ${r}`
}

/** A known receptacle of a kind: in this room first. */
const receptacle = (b: Beliefs, kind: string, skip: (r: string) => boolean = () => false): string | undefined => {
  const rooms = [b.rooms.get(b.room) ?? [], ...[...b.rooms.values()]]
  return rooms.flat().find((r) => kindOf(r) === kind && !skip(r))
}

/** Puts a carried thing in/on a receptacle of a kind (exploring for one if none is known yet). */
const deliver = (b: Beliefs, id: string, r: string | undefined): string =>
  r === undefined ? explore(b) : approach(b, r) ?? `put ${id} in/on ${r}`

const treatments = { clean: ["clean", "sinkbasin"], hot: ["heat", "microwave"], cool: ["cool", "fridge"] } as const

const household = (b: Beliefs): string | undefined => {
  const m = /^put (?:(two) (.+)|an? (?:(clean|hot|cool) )?(.+)) (?:in|on) (.+)\.$/.exec(b.task)
  if (m !== null) {
    const kind = m[2] ?? m[4]!
    const two = m[1] !== undefined
    const treatment = m[3] as "clean" | "hot" | "cool" | undefined
    const holdsOne = (r: string) => {
      const contents = b.seen.get(r)
      return Array.isArray(contents) && contents.some((id) => kindOf(id) === kind)
    }
    // Two of a kind go to one receptacle: the one that holds the first.
    const target = (two ? receptacle(b, m[5]!, (r) => !holdsOne(r)) : undefined) ?? receptacle(b, m[5]!)
    const placed = target === undefined ? [] : (b.seen.get(target) ?? [])
    const held = b.carrying.find((id) => kindOf(id) === kind)
    if (held === undefined) {
      return fetch(b, (id) => kindOf(id) === kind && !(two && Array.isArray(placed) && placed.includes(id)))
    }
    if (treatment !== undefined && !b.treated.has(held)) {
      const [verb, appliance] = treatments[treatment]
      const r = receptacle(b, appliance!)
      return r === undefined ? explore(b) : b.at === r ? `${verb} ${held} with ${r}` : approach(b, r)!
    }
    return deliver(b, held, target)
  }
  const look = /^look at an? (.+) under the desklamp\.$/.exec(b.task)
  if (look !== null) {
    const held = b.carrying.find((id) => kindOf(id) === look[1])
    if (held === undefined) return fetch(b, (id) => kindOf(id) === look[1])
    const lamp = whereIs(b, (id) => kindOf(id) === "desklamp")
    if (lamp === undefined) return explore(b)
    return approach(b, lamp[0]) ?? `use ${lamp[1]}`
  }
  return undefined
}

const phase = (b: Beliefs, change: string, id: string): string => {
  const source = receptacle(b, change === "freeze" ? "freezer" : "stove")
  if (source === undefined) return explore(b)
  const contents = b.seen.get(source)
  if (Array.isArray(contents) && contents.includes(id)) {
    if (change !== "freeze" && !b.on.has(source)) return approach(b, source) ?? `use ${source}`
    return approach(b, source) ?? "wait"
  }
  if (!b.carrying.includes(id)) return fetch(b, (x) => x === id)
  return deliver(b, id, source)
}

const measure = (b: Beliefs, id: string, threshold: number, above: string, below: string): string => {
  const thermometer = b.carrying.find((x) => kindOf(x) === "thermometer")
  if (thermometer === undefined) return fetch(b, (x) => kindOf(x) === "thermometer")
  const reading = b.readings.get(id)
  if (reading === undefined) {
    if (b.carrying.includes(id)) return `use ${thermometer} on ${id}`
    const found = whereIs(b, (x) => x === id)
    if (found === undefined) return explore(b)
    return approach(b, found[0]) ?? `use ${thermometer} on ${id}`
  }
  if (!b.carrying.includes(id)) return fetch(b, (x) => x === id)
  return deliver(b, id, reading > threshold ? above : below)
}

const circuit = (b: Beliefs, parts: ReadonlyArray<string>): string => {
  const missing = parts.filter((p) => !b.carrying.includes(p))
  if (missing.length > 0) {
    const known = missing.find((p) => whereIs(b, (x) => x === p) !== undefined)
    return fetch(b, (x) => x === (known ?? missing[0]))
  }
  const [battery, wire, device] = parts as [string, string, string]
  const pairs: ReadonlyArray<readonly [string, string]> = [[battery, wire], [wire, device], [device, battery]]
  const next = pairs.find(([x, y]) => !b.links.has(`${x}|${y}`))
  return next === undefined ? "wait" : `connect ${next[0]} to ${next[1]}`
}

const grow = (b: Beliefs, seed: string): string => {
  const can = b.carrying.find((x) => kindOf(x) === "watering can")
  const pot = receptacle(b, "flower pot", (r) => {
    const contents = b.seen.get(r)
    return contents !== undefined && (contents === "closed" || !contents.some((x) => kindOf(x) === "soil"))
  })
  const planted = pot !== undefined && (b.seen.get(pot) as Array<string> | undefined)?.includes(seed) === true
  if (!planted && !b.carrying.includes(seed)) return fetch(b, (x) => x === seed)
  if (can === undefined) return fetch(b, (x) => kindOf(x) === "watering can")
  if (pot === undefined) return explore(b)
  const there = approach(b, pot)
  if (there !== undefined) return there
  // A pot not yet looked into: arriving shows whether it holds soil.
  if (!(b.seen.get(pot) as Array<string>).some((x) => kindOf(x) === "soil")) return explore(b)
  if (!planted) return `put ${seed} in/on ${pot}`
  return b.watered.has(pot) ? "wait" : `use ${can} on ${pot}`
}

const measureGoal = new RegExp(
  "^measure the temperature of the (.+)\\. If it is above (\\d+) degrees, put it in the (.+), else in the (.+)\\.$"
)

const science = (b: Beliefs): string | undefined => {
  let m: RegExpExecArray | null
  if ((m = /^(melt|boil|freeze) the (.+)\.$/.exec(b.task)) !== null) return phase(b, m[1]!, m[2]!)
  if ((m = measureGoal.exec(b.task)) !== null) {
    return measure(b, m[1]!, Number(m[2]), m[3]!, m[4]!)
  }
  if ((m = /^turn on the (.+): connect it to the (.+) and the (.+)\.$/.exec(b.task)) !== null) {
    return circuit(b, [m[2]!, m[3]!, m[1]!])
  }
  if ((m = /^make the (.+) sprout: plant it in soil and water it\.$/.exec(b.task)) !== null) return grow(b, m[1]!)
  return undefined
}

/**
 * The next command, from the beliefs (`look` when the task is not understood).
 *
 * @category getters
 * @since 0.1.0
 */
export const decide = (b: Beliefs): string => household(b) ?? science(b) ?? "look"

// ===== Policy =====

/**
 * The opening and the (command, answer) pairs of a conversation.
 *
 * @category getters
 * @since 0.1.0
 */
export const history = (messages: Message.Conversation): {
  readonly opening: string
  readonly pairs: Array<readonly [string, string]>
} => {
  const first = messages.findIndex((m) => m.role === "user")
  const pairs: Array<readonly [string, string]> = []
  for (let i = first + 1; i < messages.length; i++) {
    const m = messages[i]!
    if (m.role !== "assistant") continue
    const answer = messages[i + 1]
    pairs.push([commandOf(m), answer?.role === "user" ? Oracle.text(answer) : ""])
  }
  return { opening: Oracle.text(messages[first]), pairs }
}

/**
 * The oracle as a scripted policy for `Rollout.runTaskChat`: one command a turn.
 *
 * @category constructors
 * @since 0.1.0
 */
export const oracle: Oracle.Policy = (messages) => {
  const { opening, pairs } = history(messages)
  return { content: decide(beliefs(opening, pairs)) }
}
