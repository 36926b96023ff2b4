/**
 * Goals: what a row asks of its world. ALFWorld's six household task types and four ScienceWorld-style ones, as
 * one flat Schema (a `type`, the `object` kind it is about and the fields its type reads), checked against the
 * catalog so that a user's row naming an impossible goal is refused with its line when the data is loaded.
 *
 * | type      | asks                                                        | fields                          |
 * |-----------|-------------------------------------------------------------|---------------------------------|
 * | `pick`    | put an `object` in/on a `target`                            | `target`                        |
 * | `look`    | look at an `object` under a desklamp (hold it, lamp on)     |                                 |
 * | `clean`   | clean an `object` at a sinkbasin, put it in/on a `target`   | `target`                        |
 * | `heat`    | heat it with a microwave, then put it                       | `target`                        |
 * | `cool`    | cool it with a fridge, then put it                          | `target`                        |
 * | `two`     | put two `object`s in/on one `target`                        | `target`                        |
 * | `phase`   | melt / boil / freeze the substance `object 1` (stove, freezer) | `change`                     |
 * | `measure` | read `object 1`'s temperature, box it by `threshold`        | `threshold`, `above`, `below`   |
 * | `circuit` | power the device `object 1` (battery 1, wire 1)             |                                 |
 * | `grow`    | make the seed `object 1` sprout (soil, water, time)         |                                 |
 *
 * Household goals name kinds (any apple, any countertop), as ALFWorld's do; science goals name the instance `1`
 * of their kind, which the world generator always creates.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as Catalog from "./Catalog.ts"

// ===== Models =====

/**
 * The household task types (ALFWorld's six).
 *
 * @category constants
 * @since 0.1.0
 */
export const householdTypes = ["pick", "look", "clean", "heat", "cool", "two"] as const

/**
 * The science task types.
 *
 * @category constants
 * @since 0.1.0
 */
export const scienceTypes = ["phase", "measure", "circuit", "grow"] as const

/**
 * @category models
 * @since 0.1.0
 */
export const TaskType = Schema.Literals([...householdTypes, ...scienceTypes])
export type TaskType = typeof TaskType.Type

/**
 * @category models
 * @since 0.1.0
 */
export const Change = Schema.Literals(["melt", "boil", "freeze"])
export type Change = typeof Change.Type

const Fields = Schema.Struct({
  type: TaskType,
  object: Schema.String,
  target: Schema.optionalKey(Schema.String),
  change: Schema.optionalKey(Change),
  threshold: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 10, maximum: 80 }))),
  above: Schema.optionalKey(Schema.Literals(["red box", "blue box"])),
  below: Schema.optionalKey(Schema.Literals(["red box", "blue box"]))
})

/**
 * A goal.
 *
 * @category models
 * @since 0.1.0
 */
export type Goal = typeof Fields.Type

/**
 * The household rooms a goal can be set in: those holding its object and target (and its appliance).
 *
 * @category getters
 * @since 0.1.0
 */
export const roomsFor = (goal: Goal): Array<string> =>
  Object.entries(Catalog.rooms).filter(([, room]) => {
    if (room.family !== "household" || !room.objects.includes(goal.object)) return false
    if (goal.target !== undefined && !room.receptacles.includes(goal.target)) return false
    if (goal.type === "clean") return room.receptacles.includes("sinkbasin")
    if (goal.type === "heat") return room.receptacles.includes("microwave")
    if (goal.type === "cool") return room.receptacles.includes("fridge")
    if (goal.type === "look") return Catalog.lampStands.some((k) => room.receptacles.includes(k))
    return true
  }).map(([name]) => name)

/** What is wrong with a goal, or nothing. */
const problems = (goal: Goal): Array<string> => {
  const t = goal.type
  const needs = (field: keyof Goal, present: boolean) => (present ? [] : [`a ${t} goal needs "${field}"`])
  switch (t) {
    case "pick":
    case "two":
    case "clean":
    case "heat":
    case "cool":
    case "look": {
      const issues = needs("target", t === "look" ? true : goal.target !== undefined)
      if (issues.length > 0) return issues
      if (goal.target !== undefined && !Catalog.targets.includes(goal.target)) {
        return [`unknown target "${goal.target}" (one of ${Catalog.targets.join(", ")})`]
      }
      if (t !== "pick" && t !== "two" && !(Catalog.taskObjects[t] as ReadonlyArray<string>).includes(goal.object)) {
        return [`a ${t} goal's object is one of ${Catalog.taskObjects[t].join(", ")}`]
      }
      return roomsFor(goal).length > 0 ? [] : [`no room holds both a ${goal.object} and what a ${t} goal needs`]
    }
    case "phase": {
      if (goal.change === undefined) return needs("change", false)
      const kinds = Catalog.phaseStarts[goal.change].map((s) => s.substance as string)
      return kinds.includes(goal.object) ? [] : [`to ${goal.change}, the object is one of ${kinds.join(", ")}`]
    }
    case "measure": {
      const issues = [...needs("threshold", goal.threshold !== undefined), ...needs("above", goal.above !== undefined)]
      if (issues.length > 0 || goal.below === undefined || goal.below === goal.above) {
        return [...issues, `a measure goal needs "below", the other box`]
      }
      return Catalog.measured.some((m) => m.kind === goal.object) ? [] : [
        `a measure goal's object is one of ${Catalog.measured.map((m) => m.kind).join(", ")}`
      ]
    }
    case "circuit":
      return Catalog.objectKind(goal.object).role === "device" ? [] : [`a circuit goal's object is a device`]
    case "grow":
      return Catalog.objectKind(goal.object).role === "seed" ? [] : [`a grow goal's object is a seed`]
  }
}

/**
 * The goal Schema, checked against the catalog.
 *
 * @category models
 * @since 0.1.0
 */
export const Goal = Fields.check(Schema.makeFilter<Goal>(problems))

/**
 * The family of a task type.
 *
 * @category getters
 * @since 0.1.0
 */
export const familyOf = (type: TaskType): "household" | "science" =>
  (householdTypes as ReadonlyArray<string>).includes(type) ? "household" : "science"

// ===== Text =====

const article = (kind: string) => (/^[aeiou]/.test(kind) ? `an ${kind}` : `a ${kind}`)
const prep = (kind: string) => Catalog.receptacles[kind]?.prep ?? "on"

/**
 * The goal in words, as the agent reads it after "Your task is to: " (ALFWorld's phrasing for the household).
 *
 * @category getters
 * @since 0.1.0
 */
export const text = (goal: Goal): string => {
  const { object: k, target = "" } = goal
  switch (goal.type) {
    case "pick":
      return `put ${article(k)} ${prep(target)} ${target}.`
    case "two":
      return `put two ${k} ${prep(target)} ${target}.`
    case "clean":
    case "heat":
    case "cool": {
      const adjective = { clean: "clean", heat: "hot", cool: "cool" }[goal.type]
      return `put ${article(adjective)} ${k} ${prep(target)} ${target}.`
    }
    case "look":
      return `look at ${article(k)} under the desklamp.`
    case "phase":
      return `${goal.change} the ${k} 1.`
    case "measure":
      return `measure the temperature of the ${k} 1. If it is above ${goal.threshold} degrees, put it in the ` +
        `${goal.above} 1, else in the ${goal.below} 1.`
    case "circuit":
      return `turn on the ${k} 1: connect it to the battery 1 and the wire 1.`
    case "grow":
      return `make the ${k} 1 sprout: plant it in soil and water it.`
  }
}

// ===== Sampling =====

const pick = <A>(next: () => number, xs: ReadonlyArray<A>): A => xs[Math.floor(next() * xs.length)]!

/** Every household goal of a type (each room's objects and targets), computed once per type. */
const householdGoals = (() => {
  const cache = new Map<TaskType, ReadonlyArray<Goal>>()
  return (type: TaskType): ReadonlyArray<Goal> => {
    const cached = cache.get(type)
    if (cached !== undefined) return cached
    const goals = Object.values(Catalog.rooms).filter((r) => r.family === "household").flatMap((room) =>
      room.objects.flatMap((object) =>
        (type === "look" ? [undefined] : room.receptacles.filter((r) => Catalog.targets.includes(r))).map((target) => ({
          type,
          object,
          ...(target === undefined ? {} : { target })
        }))
      )
    ).filter((goal) => problems(goal).length === 0)
    cache.set(type, goals)
    return goals
  }
})()

/**
 * A random goal of a type, drawn with `next` (uniform in [0, 1)).
 *
 * @category constructors
 * @since 0.1.0
 */
export const sample = (type: TaskType, next: () => number): Goal => {
  if (familyOf(type) === "household") return pick(next, householdGoals(type))
  switch (type) {
    case "phase": {
      const change = pick(next, Change.literals)
      const starts: ReadonlyArray<{ readonly substance: string }> = Catalog.phaseStarts[change]
      return { type, object: pick(next, starts).substance, change }
    }
    case "measure": {
      const above = pick(next, ["red box", "blue box"] as const)
      return {
        type,
        object: pick(next, Catalog.measured).kind,
        threshold: 10 * (2 + Math.floor(next() * 5)),
        above,
        below: above === "red box" ? "blue box" : "red box"
      }
    }
    case "circuit":
      return { type, object: pick(next, ["light bulb", "buzzer", "motor"]) }
    default:
      return { type, object: pick(next, ["bean seed", "pea seed", "sunflower seed"]) }
  }
}
