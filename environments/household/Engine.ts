/**
 * The engine: ALFWorld's text commands (and a few of ScienceWorld's) over a {@link World.World}, one command a
 * step, each answered in words. It mutates the world it is given (one world per chain).
 *
 * Commands: `look`, `inventory`, `go to X` (a receptacle of this room, or another room), `open X`, `close X`,
 * `take X from Y`, `put X in/on Y`, `examine X`, `use X` (a desklamp, a stove), `use X on Y` (a thermometer, a
 * watering can), `heat X with Y`, `cool X with Y`, `clean X with Y`, `connect X to Y`, `disconnect X from Y`,
 * `wait`, `help` (the forms) and `admissible` (every command that would do something now, as ALFWorld's
 * admissible commands).
 *
 * **A command that does nothing** is answered `Nothing happens: <why>.` and typed with a {@link Reason}; it never
 * throws. Every command, valid or not, takes one tick of the clock: a stove that is on heats what is on it by
 * 25 °C a tick (up to 250), a fridge cools what is in it by 10 °C a tick down to 4, a freezer down to −18; a seed
 * in a watered flower pot with soil sprouts after two ticks. Changes the agent can see (a substance in its hands or
 * where it stands) are told after the command's own answer ("The water 1 boils."). Elsewhere nothing warms or cools
 * by itself (no drift to room temperature), so a measured temperature stays true.
 *
 * Each command is checked before it runs ({@link check}), so that `admissible` lists exactly the commands that
 * would not be refused.
 *
 * @since 0.1.0
 */
import * as Catalog from "./Catalog.ts"
import type * as Goal from "./Goal.ts"
import * as World from "./World.ts"

// ===== Models =====

/**
 * Why a command did nothing:
 * - `Unparsed`: not a command (`help` lists them);
 * - `NotHere`: the thing or receptacle named is not where the agent is (or does not exist: the two read the
 *   same, so that refusals do not reveal unseen things);
 * - `Closed`: the receptacle is closed;
 * - `HandsFull`: the agent carries as much as it can;
 * - `NotHolding`: the command needs the agent to carry that object;
 * - `NotAllowed`: the command does not apply to that thing (taking a desklamp, heating with a sink);
 * - `NoEffect`: it is so already (opening what is open, going where the agent is).
 *
 * @category models
 * @since 0.1.0
 */
export type Reason = "Unparsed" | "NotHere" | "Closed" | "HandsFull" | "NotHolding" | "NotAllowed" | "NoEffect"

/**
 * What a command did: its answer, and the reason when it did nothing.
 *
 * @category models
 * @since 0.1.0
 */
export interface Outcome {
  readonly text: string
  readonly reason?: Reason | undefined
}

/**
 * A parsed command.
 *
 * @category models
 * @since 0.1.0
 */
export type Command =
  | { readonly verb: "look" | "inventory" | "help" | "admissible" | "wait" }
  | { readonly verb: "go" | "open" | "close" | "examine" | "use"; readonly x: string }
  | {
    readonly verb: "take" | "put" | "apply" | "heat" | "cool" | "clean" | "connect" | "disconnect"
    readonly x: string
    readonly y: string
  }

/**
 * The state of the goal: reached, lost for good (a measured thing put in the wrong box), or still open.
 *
 * @category models
 * @since 0.1.0
 */
export type Status = "solved" | "failed" | "open"

// ===== Parsing =====

const forms: ReadonlyArray<readonly [RegExp, (m: RegExpExecArray) => Command]> = [
  [/^(?:look|l)$/, () => ({ verb: "look" })],
  [/^(?:inventory|inv|i)$/, () => ({ verb: "inventory" })],
  [/^help$/, () => ({ verb: "help" })],
  [/^(?:admissible|admissible commands)$/, () => ({ verb: "admissible" })],
  [/^wait$/, () => ({ verb: "wait" })],
  [/^go to (.+)$/, (m) => ({ verb: "go", x: m[1]! })],
  [/^open (.+)$/, (m) => ({ verb: "open", x: m[1]! })],
  [/^close (.+)$/, (m) => ({ verb: "close", x: m[1]! })],
  [/^examine (.+)$/, (m) => ({ verb: "examine", x: m[1]! })],
  [/^take (.+?) from (.+)$/, (m) => ({ verb: "take", x: m[1]!, y: m[2]! })],
  [/^put (.+?) (?:in\/on|in|on|into|onto) (.+)$/, (m) => ({ verb: "put", x: m[1]!, y: m[2]! })],
  [/^use (.+?) on (.+)$/, (m) => ({ verb: "apply", x: m[1]!, y: m[2]! })],
  [/^use (.+)$/, (m) => ({ verb: "use", x: m[1]! })],
  [/^(heat|cool|clean) (.+?) with (.+)$/, (m) => ({ verb: m[1] as "heat", x: m[2]!, y: m[3]! })],
  [/^connect (.+?) (?:to|with|and) (.+)$/, (m) => ({ verb: "connect", x: m[1]!, y: m[2]! })],
  [/^disconnect (.+?) from (.+)$/, (m) => ({ verb: "disconnect", x: m[1]!, y: m[2]! })]
]

const article = /^(?:the|a|an|some) /

/**
 * The command a line of text says (case, spaces, a leading `>` and a final period do not matter), or undefined.
 *
 * @category constructors
 * @since 0.1.0
 */
export const parse = (line: string): Command | undefined => {
  const input = line.trim().toLowerCase().replace(/^>\s*/, "").replace(/[.!]+$/, "").replace(/\s+/g, " ")
  for (const [re, make] of forms) {
    const m = re.exec(input)
    if (m === null) continue
    const command = make(m)
    if (!("x" in command)) return command
    const x = command.x.replace(article, "")
    return "y" in command ? { ...command, x, y: command.y.replace(article, "") } : { ...command, x }
  }
  return undefined
}

/**
 * The command forms, as `help` lists them.
 *
 * @category constants
 * @since 0.1.0
 */
export const help = "Commands: look, inventory, go to X, open X, close X, take X from Y, put X in/on Y, " +
  "examine X, use X, use X on Y, heat X with Y, cool X with Y, clean X with Y, connect X to Y, " +
  "disconnect X from Y, wait, admissible, help."

// ===== Checking =====

type Checked = { readonly reason: Reason; readonly detail: string } | (() => string)

const no = (reason: Reason, detail: string): Checked => ({ reason, detail })

const cap = (s: string) => s.charAt(0).toUpperCase() + s.slice(1)

/** A receptacle's state and contents, as told on arrival or on opening. */
const contents = (world: World.World, r: World.Receptacle): string => {
  const state = World.kindOf(r).role === "stove" ? ` It is ${r.active ? "on" : "off"}.` : ""
  if (!r.open) return `${state} It is closed.`
  if (r.contents.length === 0) return `${state} It is empty.`
  const seen = r.contents.map((id) => World.label(world.things[id]!)).join(", ")
  return `${state} ${cap(World.kindOf(r).prep)} it: ${seen}.`
}

/** The thing named, if the agent can reach it: carried, or in/on the open receptacle it stands at. */
const reachable = (world: World.World, id: string): World.Thing | undefined => {
  const thing = world.things[id]
  if (thing === undefined) return undefined
  if (thing.at === "inventory") return thing
  return thing.at === world.at && world.receptacles[thing.at]!.open ? thing : undefined
}

/** The receptacle named, if the agent stands at it. */
const standingAt = (world: World.World, id: string): World.Receptacle | undefined =>
  world.at === id ? world.receptacles[id] : undefined

const notHere = (name: string) => no("NotHere", `you see no ${name} here`)

/** The refusal of a command at a receptacle the agent does not stand at (or that is not in this room). */
const away = (world: World.World, id: string): Checked =>
  world.receptacles[id]?.room === world.room ? no("NotHere", `you are not at ${id}`) : notHere(id)

const carried = (world: World.World, id: string): World.Thing | undefined =>
  world.things[id]?.at === "inventory" ? world.things[id] : undefined

const checkGo = (world: World.World, x: string): Checked => {
  const room = world.rooms.find((r) => r.name === x)
  if (room !== undefined) {
    if (room.name === world.room) return no("NoEffect", `you are in the ${x} already`)
    return () => {
      world.room = room.name
      world.at = undefined
      return World.describeRoom(world)
    }
  }
  const r = world.receptacles[x]
  if (r === undefined || r.room !== world.room) return notHere(x)
  if (world.at === x) return no("NoEffect", `you are at ${x} already`)
  return () => {
    world.at = x
    return `You arrive at ${x}.${contents(world, r)}`
  }
}

const checkOpenClose = (world: World.World, x: string, open: boolean): Checked => {
  const r = standingAt(world, x)
  if (r === undefined) return away(world, x)
  if (!World.kindOf(r).openable) return no("NotAllowed", `${x} does not open`)
  if (r.open === open) return no("NoEffect", `${x} is ${open ? "open" : "closed"} already`)
  return () => {
    r.open = open
    return open ? `You open ${x}.${contents(world, r)}` : `You close ${x}.`
  }
}

const checkTake = (world: World.World, x: string, y: string): Checked => {
  const r = standingAt(world, y)
  if (r === undefined) return away(world, y)
  if (!r.open) return no("Closed", `${y} is closed`)
  const thing = world.things[x]
  if (thing === undefined || thing.at !== y) return no("NotHere", `you see no ${x} ${World.kindOf(r).prep} ${y}`)
  if (Catalog.objectKind(thing.kind).fixed === true) return no("NotAllowed", `you cannot take ${x}`)
  if (world.inventory.length >= world.capacity) return no("HandsFull", `your hands are full`)
  return () => {
    r.contents.splice(r.contents.indexOf(x), 1)
    thing.at = "inventory"
    world.inventory.push(x)
    return `You take ${x} from ${y}.`
  }
}

const checkPut = (world: World.World, x: string, y: string): Checked => {
  const thing = carried(world, x)
  if (thing === undefined) return no("NotHolding", `you are not carrying ${x}`)
  const r = standingAt(world, y)
  if (r === undefined) return away(world, y)
  if (!r.open) return no("Closed", `${y} is closed`)
  return () => {
    world.inventory.splice(world.inventory.indexOf(x), 1)
    thing.at = y
    r.contents.push(x)
    r.contents.sort(World.byName)
    return `You put ${x} ${World.kindOf(r).prep} ${y}.`
  }
}

const describeThing = (thing: World.Thing): string => {
  const facts = [thing.clean ? "clean" : "", thing.hot ? "hot" : "", thing.cold ? "cool" : ""].filter((f) => f !== "")
  const role = Catalog.objectKind(thing.kind).role
  if (role === "battery" || role === "wire" || role === "device") {
    facts.push(thing.links.length === 0 ? "not connected" : `connected to ${thing.links.join(", ")}`)
  }
  return facts.length === 0 ? `There is nothing special about ${World.label(thing)}.` :
    `${cap(World.label(thing))}: ${facts.join(", ")}.`
}

const checkExamine = (world: World.World, x: string): Checked => {
  const thing = reachable(world, x)
  if (thing !== undefined) return () => describeThing(thing)
  const r = standingAt(world, x)
  if (r !== undefined) return () => `${cap(x)}.${contents(world, r)}`
  return away(world, x)
}

const checkUse = (world: World.World, x: string): Checked => {
  const r = standingAt(world, x)
  if (r !== undefined && World.kindOf(r).role === "stove") {
    return () => {
      r.active = !r.active
      return `You turn ${r.active ? "on" : "off"} ${x}.`
    }
  }
  const thing = reachable(world, x)
  if (thing === undefined) return r !== undefined ? no("NotAllowed", `you cannot use ${x}`) : notHere(x)
  if (Catalog.objectKind(thing.kind).role !== "lamp") return no("NotAllowed", `you cannot use ${x} by itself`)
  return () => {
    thing.on = !thing.on
    return `You turn ${thing.on ? "on" : "off"} ${x}.`
  }
}

const checkApply = (world: World.World, x: string, y: string): Checked => {
  const tool = carried(world, x)
  if (tool === undefined) return no("NotHolding", `you are not carrying ${x}`)
  const role = Catalog.objectKind(tool.kind).role
  if (role === "thermometer") {
    const thing = reachable(world, y)
    if (thing === undefined || thing.id === x) return notHere(y)
    return () => {
      thing.measured = true
      return `The ${x} reads ${Math.round(thing.temp)} degrees.`
    }
  }
  if (role === "water") {
    const pot = standingAt(world, y)
    if (pot === undefined) return away(world, y)
    if (World.kindOf(pot).role !== "pot") return no("NotAllowed", `only a flower pot is watered`)
    return () => {
      pot.watered = true
      return `You water ${y}.`
    }
  }
  return no("NotAllowed", `${x} is not a tool`)
}

const appliances = { heat: "microwave", cool: "fridge", clean: "sink" } as const

const checkTreat = (world: World.World, verb: "heat" | "cool" | "clean", x: string, y: string): Checked => {
  const thing = carried(world, x)
  if (thing === undefined) return no("NotHolding", `you are not carrying ${x}`)
  const r = standingAt(world, y)
  if (r === undefined) return away(world, y)
  const needed = appliances[verb]
  if (World.kindOf(r).role !== needed) {
    return no("NotAllowed", `you ${verb} with a ${needed === "sink" ? "sinkbasin" : needed}`)
  }
  return () => {
    if (verb === "clean") thing.clean = true
    else if (verb === "heat") [thing.hot, thing.cold] = [true, false]
    else [thing.hot, thing.cold] = [false, true]
    return `You ${verb} ${x} with ${y}.`
  }
}

const isComponent = (thing: World.Thing) => {
  const role = Catalog.objectKind(thing.kind).role
  return role === "battery" || role === "wire" || role === "device"
}

const checkConnect = (world: World.World, x: string, y: string, connect: boolean): Checked => {
  const a = reachable(world, x)
  const b = reachable(world, y)
  if (a === undefined) return notHere(x)
  if (b === undefined) return notHere(y)
  if (a === b || !isComponent(a)) return no("NotAllowed", `${x} has no terminals to connect to ${y}`)
  if (!isComponent(b)) return no("NotAllowed", `${y} has no terminals to connect`)
  const linked = a.links.includes(y)
  if (!connect) {
    if (!linked) return no("NoEffect", `${x} is not connected to ${y}`)
    return () => {
      a.links.splice(a.links.indexOf(y), 1)
      b.links.splice(b.links.indexOf(x), 1)
      return `You disconnect ${x} from ${y}.${power(world)}`
    }
  }
  if (linked) return no("NoEffect", `${x} is connected to ${y} already`)
  const full = [a, b].find((t) => t.links.length >= 2)
  if (full !== undefined) return no("NotAllowed", `both terminals of ${full.id} are in use`)
  return () => {
    a.links.push(y)
    b.links.push(x)
    return `You connect ${x} to ${y}.${power(world)}`
  }
}

/** Whether a device closes a loop through a battery (every component has two terminals). */
const powered = (world: World.World, device: World.Thing): boolean => {
  if (device.links.length < 2) return false
  let previous = device.id
  let current = device.links[0]!
  let battery = false
  for (let guard = 0; guard < 64; guard++) {
    if (current === device.id) return battery
    const thing = world.things[current]!
    if (Catalog.objectKind(thing.kind).role === "battery") battery = true
    if (thing.links.length < 2) return false
    const next = thing.links[0] === previous ? thing.links[1]! : thing.links[0]!
    previous = current
    current = next
  }
  return false
}

/** Recomputes which devices run; tells the ones that changed. */
const power = (world: World.World): string => {
  let told = ""
  for (const thing of Object.values(world.things)) {
    if (Catalog.objectKind(thing.kind).role !== "device") continue
    const on = powered(world, thing)
    if (on !== thing.on) told += ` The ${thing.id} turns ${on ? "on" : "off"}.`
    thing.on = on
  }
  return told
}

/**
 * Checks a command against the world: a refusal (with its reason), or the function that runs it and returns its
 * answer.
 *
 * @category getters
 * @since 0.1.0
 */
export const check = (world: World.World, command: Command): Checked => {
  switch (command.verb) {
    case "look":
      return () => World.describeRoom(world) + (world.at === undefined ? "" : ` You are at ${world.at}.`)
    case "inventory":
      return () => {
        const carrying = world.inventory.map((id) => World.label(world.things[id]!))
        return carrying.length === 0 ? "You carry nothing." : `You carry ${carrying.join(", ")}.`
      }
    case "help":
      return () => help
    case "admissible":
      return () => `You can: ${admissible(world).join(", ")}.`
    case "wait":
      return () => "You wait."
    case "go":
      return checkGo(world, command.x)
    case "open":
    case "close":
      return checkOpenClose(world, command.x, command.verb === "open")
    case "examine":
      return checkExamine(world, command.x)
    case "use":
      return checkUse(world, command.x)
    case "take":
      return checkTake(world, command.x, command.y)
    case "put":
      return checkPut(world, command.x, command.y)
    case "apply":
      return checkApply(world, command.x, command.y)
    case "heat":
    case "cool":
    case "clean":
      return checkTreat(world, command.verb, command.x, command.y)
    case "connect":
    case "disconnect":
      return checkConnect(world, command.x, command.y, command.verb === "connect")
  }
}

// ===== Time =====

const changes: Record<string, string> = {
  "solid>liquid": "melts",
  "liquid>gas": "boils",
  "solid>gas": "boils",
  "liquid>solid": "freezes",
  "gas>liquid": "condenses",
  "gas>solid": "freezes"
}

/** The temperature a receptacle drives its contents to, and by how much a tick. */
const thermal = (r: World.Receptacle): ((t: number) => number) | undefined => {
  switch (World.kindOf(r).role) {
    case "stove":
      return r.active ? (t) => Math.min(t + 25, Math.max(t, 250)) : undefined
    case "fridge":
      return (t) => (t > 4 ? Math.max(t - 10, 4) : t)
    case "freezer":
      return (t) => (t > -18 ? Math.max(t - 10, -18) : t)
    default:
      return undefined
  }
}

/**
 * One tick of the clock: heat and cold sources change their contents' temperatures, seeds grow. Returns what the
 * agent sees happen.
 *
 * @category combinators
 * @since 0.1.0
 */
export const tick = (world: World.World): string => {
  world.tick++
  let told = ""
  for (const r of Object.values(world.receptacles)) {
    if (r.contents.length === 0) continue
    const drive = thermal(r)
    const grows = World.kindOf(r).role === "pot" && r.watered &&
      r.contents.some((id) => Catalog.objectKind(world.things[id]!.kind).role === "soil")
    const seen = world.at === r.id && r.open
    for (const id of r.contents) {
      const thing = world.things[id]!
      if (drive !== undefined) {
        const before = World.phase(thing)
        thing.temp = drive(thing.temp)
        const after = World.phase(thing)
        if (seen && before !== after) told += ` The ${id} ${changes[`${before}>${after}`]}.`
      }
      if (grows && Catalog.objectKind(thing.kind).role === "seed") {
        thing.growth++
        if (seen && thing.growth === 2) told += ` The ${id} sprouts.`
      }
    }
  }
  return told
}

/**
 * Runs one command (a line of text): its answer, then what the tick that follows shows. A refusal is an outcome
 * with a reason, never an error.
 *
 * @category combinators
 * @since 0.1.0
 */
export const act = (world: World.World, line: string): Outcome => {
  const command = parse(line)
  const checked = command === undefined
    ? no("Unparsed", `"${line.trim().slice(0, 40)}" is not a command (say help)`)
    : check(world, command)
  const answer: Outcome = typeof checked === "function"
    ? { text: checked() }
    : { text: `Nothing happens: ${checked.detail}.`, reason: checked.reason }
  const seen = tick(world)
  return seen === "" ? answer : { ...answer, text: answer.text + seen }
}

// ===== Admissible commands =====

/**
 * Every command that would do something now (ALFWorld's admissible commands), in a fixed order.
 *
 * @category getters
 * @since 0.1.0
 */
export const admissible = (world: World.World): Array<string> => {
  const room = World.currentRoom(world)
  const candidates: Array<string> = ["look", "inventory", "wait"]
  for (const id of room.receptacles) candidates.push(`go to ${id}`)
  for (const r of world.rooms) candidates.push(`go to ${r.name}`)
  const at = world.at === undefined ? undefined : world.receptacles[world.at]!
  const here = at === undefined || !at.open ? [] : at.contents
  const reach = [...world.inventory, ...here]
  if (at !== undefined) {
    candidates.push(`open ${at.id}`, `close ${at.id}`, `examine ${at.id}`, `use ${at.id}`)
    for (const id of here) candidates.push(`take ${id} from ${at.id}`)
    for (const id of world.inventory) {
      candidates.push(`put ${id} ${World.kindOf(at).prep} ${at.id}`)
      for (const verb of ["heat", "cool", "clean"]) candidates.push(`${verb} ${id} with ${at.id}`)
      candidates.push(`use ${id} on ${at.id}`)
    }
  }
  for (const id of reach) {
    candidates.push(`examine ${id}`, `use ${id}`)
    for (const other of reach) {
      if (other === id) continue
      candidates.push(`use ${id} on ${other}`, `disconnect ${id} from ${other}`)
      if (id < other) candidates.push(`connect ${id} to ${other}`)
    }
  }
  return candidates.filter((line) => typeof check(world, parse(line)!) === "function")
}

// ===== Goal =====

const phaseOf = { melt: "liquid", boil: "gas", freeze: "solid" } as const

const holds = (world: World.World, kind: string, target: string, flag?: "clean" | "hot" | "cold") =>
  Object.values(world.things).some((t) =>
    t.kind === kind && t.at !== "inventory" && world.receptacles[t.at]!.kind === target &&
    (flag === undefined || t[flag])
  )

/**
 * Where the world stands with its goal.
 *
 * @category getters
 * @since 0.1.0
 */
export const status = (world: World.World, goal: Goal.Goal = world.goal): Status => {
  const reached = (ok: boolean): Status => (ok ? "solved" : "open")
  const named = world.things[`${goal.object} 1`]
  switch (goal.type) {
    case "pick":
      return reached(holds(world, goal.object, goal.target!))
    case "clean":
      return reached(holds(world, goal.object, goal.target!, "clean"))
    case "heat":
      return reached(holds(world, goal.object, goal.target!, "hot"))
    case "cool":
      return reached(holds(world, goal.object, goal.target!, "cold"))
    case "two":
      return reached(Object.values(world.receptacles).some((r) =>
        r.kind === goal.target && r.contents.filter((id) => world.things[id]!.kind === goal.object).length >= 2
      ))
    case "look": {
      const at = world.at === undefined ? undefined : world.receptacles[world.at]!
      const lit = at !== undefined &&
        at.contents.some((id) => Catalog.objectKind(world.things[id]!.kind).role === "lamp" && world.things[id]!.on)
      return reached(lit && world.inventory.some((id) => world.things[id]!.kind === goal.object))
    }
    case "phase":
      return reached(named !== undefined && World.phase(named) === phaseOf[goal.change!])
    case "measure": {
      if (named === undefined || named.at === "inventory") return "open"
      const box = world.receptacles[named.at]!.kind
      if (box !== "red box" && box !== "blue box") return "open"
      const right = named.temp > goal.threshold! ? goal.above : goal.below
      return named.measured && box === right ? "solved" : "failed"
    }
    case "circuit":
      return reached(named?.on === true)
    case "grow":
      return reached(named !== undefined && named.growth >= 2)
  }
}
