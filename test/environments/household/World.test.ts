/**
 * The household world generator and the engine, without the runtime: worlds are pure functions of their row that
 * hold what their goal needs and do not start solved; every command does what it says or is refused with a typed
 * reason; `admissible` lists exactly the commands the engine accepts; the science dynamics (heat, cold, circuits,
 * growth) and irreversible failures; rows and goals are checked by their Schemas.
 */
import { assert, describe, it } from "@effect/vitest"
import { Schema } from "effect"
import * as Engine from "../../../environments/household/Engine.ts"
import * as Goal from "../../../environments/household/Goal.ts"
import * as HouseholdTask from "../../../environments/household/HouseholdTask.ts"
import * as World from "../../../environments/household/World.ts"
import * as Sampling from "../../../src/Sampling.ts"

const types = [...Goal.householdTypes, ...Goal.scienceTypes]

/** Worlds of every type, several sizes. */
const worlds = (n: number, spec: World.Spec = {}) => {
  const next = Sampling.mulberry32(99)
  return Array.from({ length: n }, (_, i) => {
    const goal = Goal.sample(types[i % types.length]!, next)
    return { goal, seed: 1000 + i, world: World.generate({ seed: 1000 + i, goal, world: spec }) }
  })
}

/** A world built by hand-picked goal, for the engine cases. */
const world = (goal: Goal.Goal, seed = 5, spec: World.Spec = { open: 1 }) => World.generate({ seed, goal, world: spec })

/** Walks to the receptacle holding `id` and returns that receptacle's id. */
const goToThing = (w: World.World, id: string): string => {
  const at = w.things[id]!.at
  Engine.act(w, `go to ${at}`)
  return at
}

describe("household world", () => {
  it("a world is a pure function of its row: same row, same world; another seed, another world", () => {
    for (const { goal, seed, world } of worlds(30)) {
      assert.deepStrictEqual(World.generate({ seed, goal }), World.generate({ seed, goal }))
      assert.deepStrictEqual(world, World.generate({ seed, goal, world: {} }))
      const other = World.generate({ seed: seed + 1, goal })
      assert.notDeepEqual({ r: other.receptacles, t: other.things }, { r: world.receptacles, t: world.things })
    }
  })

  it("every world holds what its goal needs, does not start solved, and keeps its size", () => {
    for (const spec of [{}, { rooms: 2, receptacles: 6, distractors: 4 }, { rooms: 3, receptacles: 3, open: 1 }]) {
      for (const { goal, world } of worlds(200, spec)) {
        assert.strictEqual(Engine.status(world), "open", JSON.stringify(goal))
        assert.strictEqual(world.rooms.length, spec.rooms ?? 1)
        for (const room of world.rooms) assert.isAtLeast(room.receptacles.length, spec.receptacles ?? 3)
        const kinds = new Set(Object.values(world.things).map((t) => t.kind))
        const receptacles = new Set(Object.values(world.receptacles).map((r) => r.kind))
        assert.isTrue(kinds.has(goal.object), `${goal.type}: its object exists`)
        if (goal.target !== undefined) assert.isTrue(receptacles.has(goal.target), `${goal.type}: its target exists`)
        const needs: Record<string, ReadonlyArray<string>> = {
          clean: ["sinkbasin"], heat: ["microwave"], cool: ["fridge"], measure: ["red box", "blue box"],
          grow: ["flower pot"]
        }
        for (const need of needs[goal.type] ?? []) assert.isTrue(receptacles.has(need), `${goal.type} needs ${need}`)
        if (goal.type === "look") assert.isTrue(kinds.has("desklamp"))
        if (goal.type === "circuit") assert.isTrue(kinds.has("battery") && kinds.has("wire"))
        if (goal.type === "grow") assert.isTrue(kinds.has("soil") && kinds.has("watering can"))
        if (goal.type === "measure") assert.isTrue(kinds.has("thermometer"))
        if (goal.type === "phase") assert.isTrue(receptacles.has(goal.change === "freeze" ? "freezer" : "stove"))
        // Contents and locations agree.
        for (const t of Object.values(world.things)) assert.include(world.receptacles[t.at]!.contents, t.id)
      }
    }
  })

  it("the opening describes the start room and the goal in a few hundred bytes", () => {
    for (const { goal, seed } of worlds(50)) {
      const text = HouseholdTask.opening({ seed, goal })
      assert.match(text, /^You are in the [a-z]+\. You see [^.]+\.\nYour task is to: .+$/)
      assert.isBelow(text.length, 300)
    }
  })

  it("goals and rows are checked by their Schemas: impossible goals are refused with what is wrong", () => {
    const decode = Schema.decodeUnknownExit(HouseholdTask.Row)
    const ok = { seed: 1, goal: { type: "heat", object: "egg", target: "countertop" } }
    assert.isTrue(decode(ok)._tag === "Success")
    const refused = (goal: unknown, expected: RegExp) => {
      const exit = decode({ seed: 1, goal })
      assert.strictEqual(exit._tag, "Failure", JSON.stringify(goal))
      assert.match(String(exit), expected)
    }
    refused({ type: "heat", object: "book", target: "countertop" }, /heat goal's object is one of/)
    refused({ type: "pick", object: "apple" }, /needs "target"/)
    refused({ type: "pick", object: "apple", target: "toilet" }, /no room holds both/)
    refused({ type: "phase", object: "wax", change: "boil" }, /to boil, the object is one of/)
    refused({ type: "circuit", object: "apple" }, /device/)
    refused({ type: "dance", object: "apple" }, /\["goal"\]\["type"\]/)
    assert.strictEqual(decode({ ...ok, world: { rooms: 9 } })._tag, "Failure")
  })
})

describe("household engine", () => {
  it("ALFWorld's commands: go to, open, take, heat, put; each answered in words, the goal reached", () => {
    const w = world({ type: "heat", object: "egg", target: "countertop" }, 3, {})
    const at = w.things["egg 1"]!.at
    assert.match(Engine.act(w, `go to ${at}`).text, new RegExp(`^You arrive at ${at}\\.`))
    if (!w.receptacles[at]!.open) assert.match(Engine.act(w, `open ${at}`).text, /^You open .*In it: .*egg 1/)
    assert.strictEqual(Engine.act(w, `take egg 1 from ${at}`).text, `You take egg 1 from ${at}.`)
    assert.strictEqual(Engine.act(w, "inventory").text, "You carry egg 1.")
    Engine.act(w, "go to microwave 1")
    assert.strictEqual(Engine.act(w, "heat egg 1 with microwave 1").text, "You heat egg 1 with microwave 1.")
    assert.match(Engine.act(w, "examine egg 1").text, /^Egg 1: hot\.$/)
    Engine.act(w, "go to countertop 1")
    assert.strictEqual(Engine.status(w), "open")
    assert.strictEqual(Engine.act(w, "> Put the egg 1 in/on countertop 1.").text, "You put egg 1 on countertop 1.")
    assert.strictEqual(Engine.status(w), "solved")
  })

  it("commands that do nothing are refused with a typed reason and a clear answer, never a throw", () => {
    const w = world({ type: "pick", object: "apple", target: "countertop" }, 8, {})
    const refused = (line: string, reason: Engine.Reason, text: RegExp) => {
      const out = Engine.act(w, line)
      assert.strictEqual(out.reason, reason, `${line}: ${out.text}`)
      assert.match(out.text, /^Nothing happens: /)
      assert.match(out.text, text)
    }
    refused("dance wildly", "Unparsed", /"dance wildly" is not a command \(say help\)/)
    refused("", "Unparsed", /not a command/)
    refused("go to the moon", "NotHere", /you see no moon here/)
    refused("take apple 1 from countertop 1", "NotHere", /you are not at countertop 1/)
    refused("put apple 1 in countertop 1", "NotHolding", /you are not carrying apple 1/)
    refused("heat apple 1 with microwave 1", "NotHolding", /not carrying/)
    const closed = Object.values(w.receptacles).find((r) => !r.open)!
    Engine.act(w, `go to ${closed.id}`)
    refused(`go to ${closed.id}`, "NoEffect", /already/)
    refused(`take apple 1 from ${closed.id}`, "Closed", /is closed/)
    Engine.act(w, `open ${closed.id}`)
    refused(`open ${closed.id}`, "NoEffect", /open already/)
    Engine.act(w, "go to countertop 1")
    refused("open countertop 1", "NotAllowed", /does not open/)
    refused("use countertop 1", "NotAllowed", /cannot use/)
    // Refusals do not reveal things the agent cannot see: an unseen apple reads like a missing pear.
    const apple = Engine.act(w, "examine apple 1").text.replace("apple 1", "X")
    assert.strictEqual(apple, Engine.act(w, "examine pear 9").text.replace("pear 9", "X"))
  })

  it("hands hold one object in the household (ALFWorld), four in the science rooms", () => {
    const w = world({ type: "two", object: "apple", target: "countertop" }, 4, { open: 1 })
    const first = goToThing(w, "apple 1")
    Engine.act(w, `take apple 1 from ${first}`)
    goToThing(w, "apple 2")
    const out = Engine.act(w, `take apple 2 from ${w.things["apple 2"]!.at}`)
    assert.strictEqual(out.reason, "HandsFull")
    assert.strictEqual(world({ type: "circuit", object: "motor" }).capacity, 4)
  })

  it("admissible lists exactly the commands the engine accepts, on random walks through every task type", () => {
    const next = Sampling.mulberry32(7)
    for (const { world: w } of worlds(60, { rooms: 2 })) {
      for (let step = 0; step < 25; step++) {
        const commands = Engine.admissible(w)
        assert.includeMembers(commands, ["look", "inventory", "wait"])
        for (const line of commands) {
          const checked = Engine.check(w, Engine.parse(line)!)
          assert.strictEqual(typeof checked, "function", line)
        }
        const line = commands[Math.floor(next() * commands.length)]!
        assert.isUndefined(Engine.act(w, line).reason, line)
      }
    }
  })

  it("a stove that is on boils water in four ticks; a freezer freezes it; what the agent sees is told", () => {
    const w = world({ type: "phase", object: "water", change: "boil" }, 11)
    const at = goToThing(w, "water 1")
    Engine.act(w, `take water 1 from ${at}`)
    Engine.act(w, "go to stove 1")
    assert.match(Engine.act(w, "look").text, /You are at stove 1\./)
    Engine.act(w, "put water 1 on stove 1")
    assert.strictEqual(Engine.act(w, "use stove 1").text, "You turn on stove 1.")
    const told = [Engine.act(w, "wait").text, Engine.act(w, "wait").text, Engine.act(w, "wait").text]
    assert.deepStrictEqual(told.slice(0, 2), ["You wait.", "You wait."])
    assert.strictEqual(told[2], "You wait. The water 1 boils.")
    assert.strictEqual(Engine.status(w), "solved")
    assert.match(Engine.act(w, "examine stove 1").text, /It is on\. On it: water 1 \(gas\)\./)

    const cold = world({ type: "phase", object: "juice", change: "freeze" }, 12)
    const from = goToThing(cold, "juice 1")
    Engine.act(cold, `take juice 1 from ${from}`)
    Engine.act(cold, "go to freezer 1")
    // The tick of the command itself: 4 °C → −6 °C, below juice's −2.
    assert.strictEqual(
      Engine.act(cold, "put juice 1 in freezer 1").text,
      "You put juice 1 in freezer 1. The juice 1 freezes."
    )
    assert.strictEqual(Engine.status(cold), "solved")
  })

  it("a measured thing boxed by its reading solves the task; boxed unmeasured or in the wrong box fails it", () => {
    const goal: Goal.Goal = { type: "measure", object: "tea", threshold: 30, above: "red box", below: "blue box" }
    const solve = (box: "red box" | "blue box", measure: boolean) => {
      const w = world(goal, 21)
      const thermometer = goToThing(w, "thermometer 1")
      Engine.act(w, `take thermometer 1 from ${thermometer}`)
      const at = goToThing(w, "tea 1")
      if (measure) {
        assert.match(Engine.act(w, "use thermometer 1 on tea 1").text, /^The thermometer 1 reads \d+ degrees\.$/)
      }
      Engine.act(w, `take tea 1 from ${at}`)
      Engine.act(w, `go to ${box} 1`)
      Engine.act(w, `put tea 1 in ${box} 1`)
      return Engine.status(w)
    }
    // Tea is 45–90 °C: above 30.
    assert.strictEqual(solve("red box", true), "solved")
    assert.strictEqual(solve("blue box", true), "failed")
    assert.strictEqual(solve("red box", false), "failed")
  })

  it("a device runs once it closes a loop through the battery; a seed sprouts in watered soil", () => {
    const w = world({ type: "circuit", object: "light bulb" }, 2)
    for (const id of ["battery 1", "wire 1", "light bulb 1"]) Engine.act(w, `take ${id} from ${goToThing(w, id)}`)
    assert.strictEqual(Engine.act(w, "connect battery 1 to wire 1").text, "You connect battery 1 to wire 1.")
    assert.strictEqual(Engine.act(w, "connect battery 1 to wire 1").reason, "NoEffect")
    Engine.act(w, "connect wire 1 to light bulb 1")
    assert.strictEqual(Engine.status(w), "open")
    assert.strictEqual(
      Engine.act(w, "connect light bulb 1 to battery 1").text,
      "You connect light bulb 1 to battery 1. The light bulb 1 turns on."
    )
    assert.strictEqual(Engine.status(w), "solved")
    assert.strictEqual(Engine.act(w, "connect wire 1 to battery 1").reason, "NoEffect")
    assert.match(Engine.act(w, "disconnect wire 1 from light bulb 1").text, /The light bulb 1 turns off\./)

    const g = world({ type: "grow", object: "pea seed" }, 6)
    for (const id of ["pea seed 1", "watering can 1"]) Engine.act(g, `take ${id} from ${goToThing(g, id)}`)
    const pot = g.things["soil 1"]!.at
    Engine.act(g, `go to ${pot}`)
    assert.strictEqual(Engine.act(g, `take soil 1 from ${pot}`).reason, "NotAllowed")
    Engine.act(g, `put pea seed 1 in ${pot}`)
    Engine.act(g, "wait")
    assert.strictEqual(g.things["pea seed 1"]!.growth, 0, "no water, no growth")
    Engine.act(g, `use watering can 1 on ${pot}`)
    assert.strictEqual(Engine.act(g, "wait").text, "You wait. The pea seed 1 sprouts.")
    assert.strictEqual(Engine.status(g), "solved")
  })

  it("help lists the command forms; look names the room, its receptacles and exits", () => {
    const w = world({ type: "pick", object: "book", target: "shelf" }, 1, { rooms: 2 })
    assert.strictEqual(Engine.act(w, "help").text, Engine.help)
    const look = Engine.act(w, "look").text
    assert.match(look, /^You are in the [a-z]+\. You see [^.]+\. Exits: [a-z]+\.$/)
    const exit = /Exits: ([a-z]+)\./.exec(look)![1]!
    assert.match(Engine.act(w, `go to ${exit}`).text, new RegExp(`^You are in the ${exit}\\.`))
    assert.match(Engine.act(w, "admissible").text, /^You can: look, inventory, wait, go to /)
  })
})
