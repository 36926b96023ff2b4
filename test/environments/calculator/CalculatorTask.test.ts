import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Tasks from "../../../environments/Tasks.ts"
import * as Task from "../../../src/Task.ts"
import { trajectoryOf } from "../../utils/trajectories.ts"

const call = { id: "c", type: "function" as const, function: { name: "calculator", arguments: { expression: "6*7" } } }
const answered = (answer: string) =>
  trajectoryOf([
    { role: "user", content: "What is 6*7?" },
    { role: "assistant", content: "", tool_calls: [call] },
    { role: "tool", tool_call_id: "c", content: "42" },
    { role: "assistant", content: `The answer is ${answer}.` }
  ], { answer: "42" })

const resolve = (ref: Task.Ref) => Task.resolve(ref, { builtins: Tasks.builtins, resolvePath: (p) => p })

describe("the calculator task", () => {
  it.effect("by name: mathEqual alone; with a toolCallFormat weight, the weighted sum", () =>
    Effect.gen(function*() {
      const plain = yield* resolve("calculator")
      assert.strictEqual(plain.reward?.name, "mathEqual")
      assert.deepStrictEqual(plain.tools.map((t) => t.name), ["calculator"])
      const weighted = yield* resolve({ name: "calculator", options: { toolCallFormat: 0.2 } })
      const right = yield* weighted.reward!.evaluate({ trajectory: answered("42") })
      const wrong = yield* weighted.reward!.evaluate({ trajectory: answered("41") })
      assert.strictEqual(right._tag === "Scored" && right.reward, 1.2)
      assert.strictEqual(wrong._tag === "Scored" && wrong.reward, 0.2)
      assert.strictEqual(right.metrics["reward/mathEqual/acc"], 1)
    }))

  it.effect(
    "a module path resolves to its task; a mistyped option, " +
      "an unknown name and a module without a task are typed errors",
    () =>
      Effect.gen(function*() {
        const badOption = yield* Effect.flip(resolve({ name: "calculator", options: { toolCallFormt: 1 } }))
        assert.strictEqual(badOption.reason._tag, "Options")
        assert.include(badOption.message, "toolCallFormt")
        // Reported as a config's keys are: the key, and the option it is near.
        assert.include(badOption.message, `task options: toolCallFormt: unknown key (did you mean "toolCallFormat"?)`)
        const unknown = yield* Effect.flip(resolve("calculater"))
        assert.strictEqual(unknown.reason._tag, "Unknown")
        assert.include(unknown.message, "built-in: calculator")
        assert.include(unknown.reason._tag === "Unknown" ? unknown.reason.known : [], "calculator")
        // The near name, as a config's mistyped key gets it.
        assert.include(unknown.message, `unknown task "calculater" (did you mean "calculator"?) (built-in: `)
        assert.notInclude((yield* Effect.flip(resolve("sudoku"))).message, "did you mean")
        const byPath = yield* Task.resolve("./task.ts", {
          builtins: Tasks.builtins,
          resolvePath: (p) => new URL(p, new URL("../../../examples/guess/", import.meta.url)).pathname
        })
        assert.strictEqual(byPath.name, "guess", "a module path, resolved against the config's folder")
        const noTask = yield* Effect.flip(resolve(new URL("../../utils/trajectories.ts", import.meta.url).pathname))
        assert.strictEqual(noTask.reason._tag, "Module")
        assert.include(noTask.message, "exports no `task`")
      })
  )
})
