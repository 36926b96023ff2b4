/**
 * The task contract: typed wiring (a task whose tools, reward or episode need a service its environment does not
 * provide does not type-check: the `@ts-expect-error` lines below fail `npm test`'s type check if the error
 * disappears), defaults under a config, and the conversation of a row.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Schema } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Environment from "../../src/Environment.ts"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import * as Tool from "../../src/Tool.ts"

class Game
  extends Context.Service<Game, { readonly guess: (n: number) => Effect.Effect<string> }>()("test/Task/Game")
{}
class Other extends Context.Service<Other, { readonly x: number }>()("test/Task/Other") {}
const gameLayer = Layer.succeed(Game, Game.of({ guess: (n) => Effect.succeed(String(n)) }))
const guess = Tool.make("guess", {
  description: "guess",
  parameters: Schema.Struct({ n: Schema.Int }),
  dependencies: [Game],
  handler: ({ n }) => Effect.flatMap(Game, (g) => g.guess(n))
})
const won = Reward.make("won", { dependencies: [Game], score: () => Effect.succeed(1) })

describe("Task", () => {
  it("typed wiring: the environment must provide every service the tools, the reward and the episode need", () => {
    const wired = Task.make("guess", {
      tools: [guess],
      reward: won,
      environment: Environment.perChain(gameLayer),
      episode: { start: () => Effect.asVoid(Game) }
    })
    assert.deepStrictEqual(wired.needs.map((k) => k.key), ["test/Task/Game"], "declared once, however many use it")

    // @ts-expect-error the tool needs Game and there is no environment
    Task.make("no environment", { tools: [guess] })
    // @ts-expect-error the reward needs Game and there is no environment
    Task.make("no environment for the reward", { reward: won })
    Task.make("wrong environment", {
      tools: [guess],
      // @ts-expect-error the environment provides Other, not Game
      environment: Environment.perChain(Layer.succeed(Other, Other.of({ x: 1 })))
    })
    Task.make("episode needs more", {
      tools: [guess],
      // @ts-expect-error the episode needs Other too
      environment: Environment.perChain(gameLayer),
      episode: { start: () => Effect.asVoid(Other) }
    })
  })

  it("episode.start gets the row Schema's Type: no casts, and a misspelt field does not type-check", () => {
    const typed = Task.make("typed", {
      row: Schema.Struct({ secret: Schema.Int }),
      environment: Environment.perChain(gameLayer),
      episode: {
        start: ({ row }) => {
          // @ts-expect-error `row.secret` is a number (the Schema's Type), not `any` nor `unknown`
          const text: string = row.secret
          return Effect.asVoid(Effect.flatMap(Game, (g) => g.guess(row.secret + text.length)))
        }
      }
    })
    assert.isFunction(typed.episode?.start)
    Task.make("misspelt", {
      row: Schema.Struct({ secret: Schema.Int }),
      // @ts-expect-error `row` is `{ readonly secret: number }`: it has no `secrte`
      episode: { start: ({ row }) => Effect.log(row.secrte) }
    })
    // Without a row Schema, a record of unknowns, as before.
    Task.make("untyped rows", { episode: { start: ({ row }) => Effect.log(row["anything"]) } })
  })

  it("another task's tools, reward and episode can be reused, checked against this task's environment", () => {
    const original = Task.make("original", {
      tools: [guess],
      reward: won,
      environment: Environment.perChain(gameLayer),
      episode: { start: () => Effect.asVoid(Game) }
    })
    const again = Task.make("again", {
      tools: original.tools,
      reward: original.reward,
      environment: Environment.perChain(gameLayer),
      episode: original.episode
    })
    assert.strictEqual(again.episode, original.episode)
    assert.deepStrictEqual(again.needs.map((k) => k.key), ["test/Task/Game"])
    Task.make("reused without its services", {
      // @ts-expect-error the reused episode may use Game (its task's environment), which Other's does not provide
      environment: Environment.perChain(Layer.succeed(Other, Other.of({ x: 1 }))),
      episode: original.episode
    })
    // A part typed `any` (a task typed `Task`, as a module's is) cannot be checked: a type error that names it
    // ("cannot check the services of these parts, typed any": "episode"), not "missing environment services: any".
    Task.make("untyped part", {
      // @ts-expect-error the episode's services are `any`
      environment: Environment.perChain(gameLayer),
      episode: (original as Task.Task).episode
    })
  })

  it(
    "a task reached by name or path gets nothing from its runner: withOptions refuses one whose layer is missing",
    () => {
      class Catalog extends Context.Service<Catalog, { readonly size: number }>()("test/Task/Catalog") {}
      const catalog = Layer.succeed(Catalog, Catalog.of({ size: 3 }))
      // The game's layer needs a Catalog, which only the task's own `layer` can give it.
      const environment = Environment.perChain(
        Layer.effect(Game, Effect.map(Catalog, () => Game.of({ guess: (n) => Effect.succeed(String(n)) })))
      )
      const options = Schema.Struct({})
      const complete = Task.withOptions("complete", options, () =>
        Task.make("complete", { tools: [guess], environment, layer: catalog }))
      assert.isFunction(complete)
      Task.withOptions("no layer", options, () =>
        // @ts-expect-error the environment needs Catalog, and without the task's layer no one provides it
        Task.make("no layer", { tools: [guess], environment }))
    }
  )

  it.effect("a task option of the wrong type is reported with the value given, as a config's keys are", () =>
    Effect.gen(function*() {
      const counted = Task.withOptions("counted", Schema.Struct({ n: Schema.optionalKey(Schema.Int) }), () =>
        Task.make("counted", {}))
      const error = yield* Effect.flip(counted({ n: "3" }))
      assert.strictEqual(error.message, `task options: n: Expected number, got "3"`)
    }))

  it.effect("options given to a task that takes none are refused naming the module, the task and the options", () =>
    Effect.gen(function*() {
      const plain = Task.make("plain", {})
      const error = yield* Effect.flip(Task.instantiate("./plain.ts", plain, { maxTurns: 3, formatWeight: 0 }))
      assert.strictEqual(error.reason._tag, "Options")
      assert.strictEqual(
        error.message,
        `./plain.ts: task "plain" takes no options (made by Task.make, not Task.withOptions), got maxTurns, ` +
          `formatWeight: leave out task.options, or make it with Task.withOptions`
      )
      assert.strictEqual(yield* Task.instantiate("./plain.ts", plain, undefined), plain)
    }))

  it.effect("a make that throws (a path option's missing file) is a TaskError naming the task, not a defect", () =>
    Effect.gen(function*() {
      const options = Schema.Struct({ phrases: Schema.optionalKey(Task.PathOption) })
      const reading = Task.withOptions("reading", options, (o) => {
        if (o.phrases !== undefined) throw new Error(`ENOENT: no such file or directory, open '${o.phrases}'`)
        return Task.make("reading", {})
      })
      const error = yield* Effect.flip(reading({ phrases: "nope.json" }, { resolvePath: (p) => `/configs/${p}` }))
      assert.strictEqual(error._tag, "TaskError")
      assert.strictEqual(error.reason._tag, "Options")
      assert.strictEqual(
        error.message,
        `task options: task "reading" could not be made from its options: ` +
          `ENOENT: no such file or directory, open '/configs/nope.json'`
      )
      assert.deepStrictEqual((yield* reading({})).pathOptions, ["phrases"])
    }))

  it.effect("withOptions resolves the path options before make sees them, and the task names them", () =>
    Effect.gen(function*() {
      const seen: Array<unknown> = []
      const options = Schema.Struct({
        root: Schema.optionalKey(Task.PathOption),
        label: Schema.optionalKey(Schema.String)
      })
      const pathed = Task.withOptions("pathed", options, (o) => (seen.push(o), Task.make("pathed", {})))
      const task = yield* pathed({ root: "folders", label: "folders" }, { resolvePath: (p) => `/configs/${p}` })
      assert.deepStrictEqual(seen, [{ root: "/configs/folders", label: "folders" }])
      assert.deepStrictEqual(task.pathOptions, ["root"])
      const ref = { name: "pathed", options: { root: "folders", label: "folders" } }
      assert.deepStrictEqual(Task.resolvePathOptions(ref, task, (p) => `/configs/${p}`), {
        name: "pathed",
        options: { root: "/configs/folders", label: "folders" }
      })
      assert.deepStrictEqual(Task.make("plain", {}).pathOptions, [])
    }))

  it("defaults fill a config's unset agent keys; the config's own values win", () => {
    const task = Task.make("t", { defaults: { maxTurns: 6, systemPrompt: "Be brief.", temperature: undefined } })
    assert.deepStrictEqual(Task.withDefaults(task, { agent: { maxTurns: 2 }, seed: 1 }), {
      agent: { systemPrompt: "Be brief.", maxTurns: 2 },
      seed: 1
    })
    assert.deepStrictEqual(Task.withDefaults(task, { seed: 1 }), {
      seed: 1,
      agent: { maxTurns: 6, systemPrompt: "Be brief." }
    })
  })

  it("a row's conversation: the task's prompt, else its messages, else the system prompt and question", () => {
    const plain = Task.make("plain", {})
    const row = { index: 0, line: 1, question: "Hi?", fields: { n: 2 } }
    assert.deepStrictEqual(Task.conversation(plain, row, "Sys."), [
      { role: "system", content: "Sys." },
      { role: "user", content: "Hi?" }
    ])
    assert.deepStrictEqual(Task.conversation(plain, { ...row, messages: [{ role: "user", content: "M" }] }, "Sys."), [
      { role: "user", content: "M" }
    ])
    const prompted = Task.make("prompted", {
      row: Schema.Struct({ n: Schema.Int }),
      prompt: (r) => [{ role: "user", content: `n=${r.fields.n}` }]
    })
    assert.deepStrictEqual(Task.conversation(prompted, row, undefined), [{ role: "user", content: "n=2" }])
  })

  it.effect("a module loaded as CommonJS that cannot require its ESM is refused saying how to make it ESM", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "task-cjs-"))
      // A CommonJS module requiring an ES module graph with top-level await: Node refuses it (ERR_REQUIRE_…).
      writeFileSync(join(dir, "task.cjs"), `module.exports = require("./game.mjs")\n`)
      writeFileSync(join(dir, "game.mjs"), `await 0\nexport const task = 1\n`)
      const error = yield* Effect.flip(Task.importModule(join(dir, "task.cjs")))
      assert.strictEqual(error.reason._tag, "Module")
      assert.include(error.message, `cannot load ${join(dir, "task.cjs")}: `)
      assert.include(
        error.message,
        `; it was loaded as CommonJS: a task module must be ESM (name it .mts, or keep it in a folder whose ` +
          `package.json says "type": "module")`
      )
    }))

  it.effect("a module that is not there is refused as 'no such file', not with Node's resolver's words", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "task-missing-"))
      const missing = yield* Effect.flip(Task.importModule(join(dir, "tsak.ts")))
      assert.strictEqual(missing.reason._tag, "Module")
      assert.strictEqual(missing.message, `cannot load ${join(dir, "tsak.ts")}: no such file`)
    }))

  it.effect("a module whose task export is no task is refused naming the module and what it exports", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "task-export-"))
      writeFileSync(join(dir, "named.mjs"), `export const task = { name: "rooms" }\n`)
      writeFileSync(join(dir, "default.mjs"), `export default 3\n`)
      const resolve = (ref: string) =>
        Effect.flip(Task.resolve(ref, { builtins: {}, resolvePath: (p) => join(dir, p) }))
      const named = yield* resolve("./named.mjs")
      assert.strictEqual(named.reason._tag, "Module")
      assert.strictEqual(
        named.message,
        `${join(dir, "named.mjs")}: its \`task\` export is not a task (Task.make) or a Task.withOptions function but ` +
          `an object with keys name`
      )
      assert.include((yield* resolve("./default.mjs")).message, "its `default` export is not a task")
      const inCode = yield* Effect.flip(Task.instantiate("rooms", [], undefined))
      assert.include(inCode.message, "rooms: expected a task (Task.make) or a Task.withOptions function, got an array")
    }))
})
