import { assert, describe, it } from "@effect/vitest"
import { Cause, Context, Effect, Exit, Fiber, Layer, Logger, Schedule, Schema, Stream } from "effect"
import { TestClock } from "effect/testing"
import * as Oracle from "../../actors/Oracle.ts"
import * as Rollout from "../../actors/Rollout.ts"
import * as TaskRuntime from "../../actors/TaskRuntime.ts"
import * as Environment from "../../src/Environment.ts"
import * as Reward from "../../src/Reward.ts"
import * as Sampler from "../../src/Sampler.ts"
import * as Task from "../../src/Task.ts"
import * as Tool from "../../src/Tool.ts"
import { charFormat, turn } from "./fixtures/charFormat.ts"

class Counter extends Context.Service<Counter, { readonly n: number }>()("test/TaskRuntime/Counter") {}

const counted = Tool.make("counted", {
  description: "reads the counter",
  dependencies: [Counter],
  handler: () => Effect.map(Counter, (c) => String(c.n))
})

describe("TaskRuntime", () => {
  it.effect("a hung tool without a timeout becomes a Timeout observation after the run's default", () =>
    Effect.gen(function*() {
      const hang = Tool.make("hang", { description: "never returns", handler: () => Effect.never })
      const runtime = yield* TaskRuntime.make(Task.make("hung", { tools: [hang] }), { toolTimeout: "30 seconds" })
      const call = { id: "c1", type: "function" as const, function: { name: "hang", arguments: {} } }
      const fiber = yield* Effect.forkChild(runtime.tools.executeTurn([call], Context.empty()))
      yield* TestClock.adjust("29 seconds")
      assert.isUndefined(fiber.pollUnsafe(), "still waiting before the default timeout")
      yield* TestClock.adjust("2 seconds")
      const turn = yield* Fiber.join(fiber)
      assert.strictEqual(turn.messages.length, 1)
      assert.strictEqual((turn.messages[0] as { readonly is_error?: boolean }).is_error, true)
      assert.match(String(turn.messages[0]!.content), /timed out after 30s/)
      assert.deepStrictEqual(turn.errors, ["Timeout"])
    }))

  it.effect("a task whose tools cannot be built (two of one name) fails at start naming the task", () =>
    Effect.gen(function*() {
      const echo = Tool.make("echo", {
        description: "Echo",
        parameters: Schema.Struct({}),
        handler: () => Effect.succeed("")
      })
      const error = yield* Effect.flip(TaskRuntime.make(Task.make("doubled", { tools: [echo, echo] })))
      assert.strictEqual(error.reason._tag, "Module")
      assert.strictEqual(error.message, `task "doubled": two tools are named "echo"`)
    }))

  it.effect(
    "a task assembled without its environment fails at start, naming the missing service, before any chain",
    () =>
      Effect.gen(function*() {
        // As a task loaded from untyped parts would be: the type check that `Task.make` does is bypassed.
        const untyped = Task.make("untyped", { tools: [counted] } as never) as Task.Task
        let sampled = 0
        const error = yield* Effect.flip(
          Rollout.runTask({
            task: untyped,
            rows: [{ question: "go" }],
            numChains: 2,
            maxTurns: 1,
            sampling: { temperature: 1, maxTokens: 8 },
            format: charFormat
          }).pipe(
            Stream.runDrain,
            Effect.provide(Sampler.layerScripted(() => {
              sampled++
              return turn("hi")
            }))
          )
        )
        assert.strictEqual(error._tag, "TaskError")
        assert.strictEqual((error as Task.TaskError).reason._tag, "MissingServices")
        assert.include(error.message, "test/TaskRuntime/Counter")
        assert.include(error.message, "the task has no environment")
        assert.strictEqual(sampled, 0)
      })
  )

  it.effect(
    "an environment without a service the reward declares fails the start check; one that cannot start too",
    () =>
      Effect.gen(function*() {
        class Other extends Context.Service<Other, { readonly x: number }>()("test/TaskRuntime/Other") {}
        const reads = Reward.make("reads", { dependencies: [Counter], score: () => Effect.succeed(1) })
        const wrong = Task.make("wrong", {
          reward: reads,
          environment: Environment.perChain(Layer.succeed(Other, Other.of({ x: 1 })))
        } as never) as Task.Task
        const missing = yield* Effect.flip(TaskRuntime.make(wrong))
        assert.strictEqual(missing.reason._tag, "MissingServices")
        assert.include(missing.message, "its environment lacks them")
        // The services are a fact of the reason, caught by its tag.
        const services = yield* TaskRuntime.make(wrong).pipe(
          Effect.as([]),
          Effect.catchReason("TaskError", "MissingServices", (reason) => Effect.succeed(reason.services))
        )
        assert.deepStrictEqual(services, ["test/TaskRuntime/Counter"])
        // A layer that fails, or dies (throws): the same typed error naming the task, not a defect of the run.
        for (
          const [name, build, why] of [
            ["broken", Effect.fail(new Error("engine down")), "engine down"],
            ["dying", Effect.die(new Error("layer boom")), "layer boom"]
          ] as const
        ) {
          const task = Task.make(name, {
            tools: [counted],
            environment: Environment.perChain(Layer.effect(Counter, build))
          })
          const down = yield* Effect.flip(TaskRuntime.make(task))
          assert.strictEqual(down.reason._tag, "Environment")
          assert.strictEqual(down.message, `the environment of task "${name}" could not start: ${why}`)
          assert.strictEqual((down.reason.cause as Error).message, why) // what the layer failed or died with
        }
      })
  )

  it.effect("an environment built without a service it asks for fails at start, naming the task and the service", () =>
    Effect.gen(function*() {
      // The environment's layer needs a Catalog that only the task's `layer` would provide, and the layer was left
      // out; as a module loaded by the CLI is, the task is untyped (`Task<never>` by assertion), so this is the start
      // check's to catch, not a chain's defect.
      class Catalog extends Context.Service<Catalog, { readonly size: number }>()("test/TaskRuntime/Catalog") {}
      const counterLayer = Layer.effect(Counter, Effect.map(Catalog, (c) => Counter.of({ n: c.size })))
      const untyped = (name: string, parts: object) => Task.make(name, parts as never) as unknown as Task.Task
      const tasks = [
        // A provider built once for the run (its build asks for Catalog) ...
        untyped("shared", { tools: [counted], environment: Environment.shared(counterLayer) }),
        // ... and one built per chain for an episode whose tools declare nothing (the probe's lease asks for it).
        untyped("episodic", {
          environment: Environment.perChain(counterLayer),
          episode: { start: () => Effect.asVoid(Counter) }
        })
      ]
      for (const task of tasks) {
        const exit = yield* Effect.exit(
          Oracle.rollout({ task, rows: [{ question: "go" }], policy: () => ({ content: "done" }) })
        )
        assert.isTrue(Exit.isFailure(exit))
        const error = Exit.isFailure(exit) ? Cause.squash(exit.cause) : undefined
        assert.instanceOf(error, Task.TaskError, `${task.name}: a typed error, not a defect`)
        assert.strictEqual((error as Task.TaskError).reason._tag, "MissingServices")
        assert.strictEqual(
          (error as Task.TaskError).message,
          `task "${task.name}": its environment needs test/TaskRuntime/Catalog, but neither the task's layer nor ` +
            `the run provides it`
        )
      }
    }))

  it.effect("the row Schema decodes every row before a chain starts; the prompt comes from the task", () =>
    Effect.gen(function*() {
      const prompts: Array<string> = []
      const task = Task.make("prompted", {
        row: Schema.Struct({ n: Schema.Int }),
        prompt: (row, system) => [{ role: "user", content: `${system}: ${row.fields.n}` }],
        defaults: { systemPrompt: "count" }
      })
      const events = yield* Rollout.runTask({
        task,
        rows: [{ n: 3 }],
        numChains: 1,
        maxTurns: 1,
        sampling: { temperature: 1, maxTokens: 8 },
        format: charFormat
      }).pipe(
        Stream.runCollect,
        Effect.provide(Sampler.layerScripted((request) => {
          prompts.push(String.fromCharCode(...request.promptTokenIds))
          return turn("ok")
        }))
      )
      assert.include(prompts[0]!, "<user>count: 3")
      assert.strictEqual(events.filter((e) => e._tag === "Group").length, 1)
    }))

  it.effect("episode.start gets the row as the task's row Schema decodes it, typed as its Type", () =>
    Effect.gen(function*() {
      const seen: Array<number> = []
      const task = Task.make("decoded", {
        row: Schema.Struct({ code: Schema.NumberFromString }),
        // No cast: `row.code` is a number (the Schema's Type), as the rows' strings decode to.
        episode: { start: ({ row }) => Effect.sync(() => void seen.push(row.code + 1)) }
      })
      yield* Rollout.runTask({
        task,
        rows: [{ question: "go", code: "41" }],
        numChains: 1,
        maxTurns: 1,
        sampling: { temperature: 1, maxTokens: 8 },
        format: charFormat
      }).pipe(Stream.runDrain, Effect.provide(Sampler.layerScripted(() => turn("done"))))
      assert.deepStrictEqual(seen, [42])
    }))

  it.effect("a failing episode start is logged once with its cause, the task, the row and the error", () => {
    const logs: Array<{ message: string; cause: boolean }> = []
    const collector = Logger.make((o) =>
      void logs.push({
        message: (o.message as ReadonlyArray<unknown>).map(String).join(" "),
        cause: o.cause.reasons.length > 0
      })
    )
    return Effect.gen(function*() {
      class Lock extends Context.Service<Lock, {
        readonly reset: (code: number) => Effect.Effect<void, Environment.EnvError>
      }>()("test/TaskRuntime/Lock") {}
      const noDial = (code: number) =>
        Environment.envError("lock", "reset", "ResetFailed", `no dial ${code}`)
      const lock = Layer.succeed(
        Lock,
        Lock.of({ reset: (code) => (code < 1000 ? Effect.void : Effect.fail(noDial(code))) })
      )
      const task = Task.make("lock", {
        row: Schema.Struct({ id: Schema.String, code: Schema.Int }),
        environment: Environment.perChain(lock),
        episode: { start: ({ row }) => Effect.flatMap(Lock, (l) => l.reset(row.code)) }
      })
      // As the trainer does: one runtime for the run, its ports given to every batch's rollout.
      const runtime = yield* TaskRuntime.make(task)
      const batch = (codes: ReadonlyArray<number>) =>
        Rollout.run({
          rows: codes.map((code, i) => ({ messages: [{ role: "user" as const, content: "open" }], id: `r${i}`, code })),
          numChains: 2,
          maxTurns: 1,
          sampling: { temperature: 1, maxTokens: 8 },
          format: charFormat,
          tools: runtime.tools,
          environment: runtime.environment,
          episode: runtime.episode
        }).pipe(Stream.runCollect, Effect.provide(Sampler.layerScripted(() => turn("hi"))))
      const events = yield* batch([123, 4321, 5555])
      const failed = events.flatMap((e) => (e._tag === "Trajectory" && e.trajectory.masked ? [e.trajectory] : []))
      assert.strictEqual(failed.length, 4, "two rows × two chains, masked")
      assert.strictEqual(logs.length, 1, "said once")
      assert.isTrue(logs[0]!.cause, "with its cause")
      assert.include(logs[0]!.message, `the episode start of task "lock" failed for row 1 (group`)
      assert.include(logs[0]!.message, "no dial 4321")
      assert.include(logs[0]!.message, `row: {"id":"r1","code":4321}`)
      assert.include(logs[0]!.message, "failed: its chain ends, EnvFailed", "a typed failure is EnvFailed")
      yield* TestClock.adjust("30 seconds")
      yield* batch([9999])
      assert.strictEqual(logs.length, 2)
      // The three after the first, and the one that found 30 s gone by (the next is counted for the next line).
      assert.match(
        logs[1]!.message,
        /^the episode start of task "lock" failed 4 more times in the last 30s; last: row 0 /
      )
    }).pipe(Effect.provideService(Logger.CurrentLoggers, new Set([collector])))
  })

  /** One "open" row through the task's runtime, the policy answering "hi": the trajectories. */
  const rollOpen = (task: Task.Task<never>, shape: { readonly numChains: number; readonly maxTurns: number }) =>
    Effect.gen(function*() {
      const runtime = yield* TaskRuntime.make(task)
      const events = yield* Rollout.run({
        rows: [{ messages: [{ role: "user" as const, content: "open" }] }],
        ...shape,
        sampling: { temperature: 1, maxTokens: 8 },
        format: charFormat,
        tools: runtime.tools,
        environment: runtime.environment,
        episode: runtime.episode,
        restart: Schedule.recurs(0) // the chain's restarts would wait on the test clock
      }).pipe(Stream.runCollect, Effect.provide(Sampler.layerScripted(() => turn("hi"))))
      return events.flatMap((e) => (e._tag === "Trajectory" ? [e.trajectory] : []))
    })

  it.effect("an episode start that throws is logged as the ChainDefect its chain records, not as EnvFailed", () => {
    const logs: Array<string> = []
    const collector = Logger.make((o) => void logs.push((o.message as ReadonlyArray<unknown>).map(String).join(" ")))
    return Effect.gen(function*() {
      const task = Task.make("rusty", {
        episode: {
          start: () =>
            Effect.sync(() => {
              throw new Error("lock rusted")
            })
        }
      })
      const failed = yield* rollOpen(task, { numChains: 1, maxTurns: 1 })
      assert.strictEqual(failed[0]!.errorReason, "ChainDefect")
      assert.include(logs[0]!, `the episode start of task "rusty" failed for row 0`)
      assert.include(logs[0]!, "died (a defect, not an EnvError): its chain ends, ChainDefect")
      assert.notInclude(logs[0]!, "EnvFailed")
    }).pipe(Effect.provideService(Logger.CurrentLoggers, new Set([collector])))
  })

  it.effect("an episode step that fails or throws is logged with its cause, as the chain classifies it", () => {
    const logs: Array<{ message: string; cause: boolean }> = []
    const collector = Logger.make((o) =>
      void logs.push({
        message: (o.message as ReadonlyArray<unknown>).map(String).join(" "),
        cause: o.cause.reasons.length > 0
      })
    )
    const roll = (task: Task.Task<never>) => rollOpen(task, { numChains: 2, maxTurns: 2 })
    return Effect.gen(function*() {
      // A bug in the user's step: thrown inside its Effect, or before it returns one.
      const inside = () =>
        Effect.sync(() => {
          throw new Error("dial fell off")
        })
      const before = () => {
        throw new Error("dial fell off")
      }
      for (const step of [inside, before]) {
        logs.length = 0
        const failed = yield* roll(Task.make("rusty", { episode: { step } }))
        assert.deepStrictEqual(failed.map((t) => t.errorReason), ["ChainDefect", "ChainDefect"])
        assert.strictEqual(logs.length, 1, "said once")
        assert.isTrue(logs[0]!.cause, "with its cause (the stack)")
        assert.include(logs[0]!.message, `the episode step of task "rusty" failed after turn 1: dial fell off`)
        assert.include(logs[0]!.message, "died (a defect, not an EnvError): its chain ends, ChainDefect")
      }
      // A typed failure: EnvFailed.
      logs.length = 0
      const jammed = Environment.envError("lock", "step", "Crashed", "jammed")
      const failed = yield* roll(Task.make("jammed", { episode: { step: () => Effect.fail(jammed) } }))
      assert.deepStrictEqual(failed.map((t) => t.errorReason), ["EnvFailed", "EnvFailed"])
      assert.strictEqual(logs.length, 1)
      assert.include(logs[0]!.message, `the episode step of task "jammed" failed after turn 1: jammed`)
      assert.include(logs[0]!.message, "failed: its chain ends, EnvFailed")
    }).pipe(Effect.provideService(Logger.CurrentLoggers, new Set([collector])))
  })

  it.effect("each chain's environment is released when the chain ends, not when the run does", () =>
    Effect.gen(function*() {
      let live = 0
      let most = 0
      const environment = Environment.make<Counter>("perChain", () =>
        Effect.acquireRelease(
          Effect.sync(() => {
            most = Math.max(most, ++live)
            return Context.make(Counter, Counter.of({ n: live }))
          }),
          () => Effect.sync(() => void live--)
        ))
      const task = Task.make("leases", { tools: [counted], environment })
      yield* Rollout.runTask({
        task,
        rows: [{ question: "a" }, { question: "b" }, { question: "c" }, { question: "d" }],
        numChains: 1,
        maxConcurrentChains: 1,
        maxTurns: 1,
        sampling: { temperature: 1, maxTokens: 8 },
        format: charFormat
      }).pipe(Stream.runDrain, Effect.provide(Sampler.layerScripted(() => turn("done"))))
      assert.strictEqual(most, 1, "one chain at a time holds one instance (the start check's probe released too)")
      assert.strictEqual(live, 0)
    }))
})
