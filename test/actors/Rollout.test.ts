import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Fiber, Ref, Schedule, Schema, Stream } from "effect"
import { TestClock } from "effect/testing"
import fc from "fast-check"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as Rollout from "../../actors/Rollout.ts"
import * as RewardActor from "../../actors/RewardActor.ts"
import * as RolloutChain from "../../actors/RolloutChain.ts"
import type * as ChainPorts from "../../src/ChainPorts.ts"
import * as ToolActor from "../../actors/ToolActor.ts"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Environment from "../../src/Environment.ts"
import type { Message } from "../../src/Message.ts"
import * as Reward from "../../src/Reward.ts"
import * as RolloutError from "../../src/RolloutError.ts"
import * as Sampler from "../../src/Sampler.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import * as Tool from "../../src/Tool.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import { charFormat, decode, turn } from "./fixtures/charFormat.ts"
import * as RolloutFigures from "../../src/RolloutFigures.ts"

// ===== Fixtures =====

/** Turn 1 calls `add` twice in parallel (3 and 4); turn 2 answers 5. */
const sumTurns = [
  turn(`Let me add.\nCALL add {"a":1,"b":2}\nCALL add {"a":2,"b":2}`),
  turn(`CALL answer {"value":5}`)
]

/** The task of a chain (its user message) and how many assistant turns it has had, read from the prompt. */
const situation = (request: Sampler.GenerateRequest) => {
  const prompt = decode(request.promptTokenIds)
  const task = /<user>(.*)\n/.exec(prompt)?.[1] ?? ""
  const turnIndex = prompt.split("<assistant>").length - 2
  return { task, turnIndex, prompt }
}

/** A scripted sampler that plays, for each task, a list of assistant turns (token ids). */
const scripted = (
  turns: Record<string, ReadonlyArray<Sampler.ScriptedCompletion | "hang">>,
  options?: Sampler.ScriptedOptions & { readonly hang?: Deferred.Deferred<void> | undefined }
) =>
  Sampler.layerScripted((request) => {
    const { task, turnIndex } = situation(request)
    const next = turns[task]?.[turnIndex] ?? turn("I give up")
    if (next === "hang") return Effect.never
    return next
  }, options)

/** Tool calls interrupted while running (the `hang` tool never returns). */
let interruptedToolCalls = 0

const tools = (log?: Array<string>): ChainPorts.ToolRunner => ({
  schemas: [{ type: "function", function: { name: "add" } }, { type: "function", function: { name: "answer" } }],
  executeTurn: (calls) =>
    Effect.gen(function*() {
      let inFlight = 0
      let peak = 0
      const messages = yield* Effect.forEach(calls, (call) =>
        Effect.gen(function*() {
          inFlight++
          peak = Math.max(peak, inFlight)
          yield* Effect.yieldNow
          inFlight--
          const args = call.function.arguments as Record<string, number>
          switch (call.function.name) {
            case "add":
              return { role: "tool" as const, content: String(args.a! + args.b!), tool_call_id: call.id }
            case "answer":
              return { role: "tool" as const, content: `answer: ${args.value}`, tool_call_id: call.id }
            case "flood": // a tool whose output alone overruns any small budget (a 1,000-digit result)
              return { role: "tool" as const, content: "9".repeat(args.n!), tool_call_id: call.id }
            case "crash":
              return yield* Effect.die(new Error("tool bug"))
            case "hang":
              return yield* Effect.never.pipe(Effect.onInterrupt(() => Effect.sync(() => interruptedToolCalls++)))
            case "envfail":
              return yield* new RolloutError.RolloutError({ reason: "EnvFailed", message: "sandbox crashed" })
            default:
              return {
                role: "tool" as const,
                content: `unknown tool ${call.function.name}`,
                tool_call_id: call.id,
                is_error: true
              }
          }
        }), { concurrency: "unbounded" })
      log?.push(`peak:${peak}`)
      return { messages, terminal: calls.some((c) => c.function.name === "answer") }
    })
})

const exactReward: ChainPorts.Scorer = (trajectory) =>
  Effect.succeed({
    reward: Trajectory.finalResponse(trajectory) === "answer: 5" ? 1 : 0,
    status: "scored",
    metrics: { "reward/exact/acc": Trajectory.finalResponse(trajectory) === "answer: 5" ? 1 : 0 }
  })

const sampling: Sampler.SamplingParams = { temperature: 1, maxTokens: 200 }

const base = {
  numChains: 1,
  maxTurns: 4,
  sampling,
  format: charFormat,
  tools: tools(),
  reward: exactReward,
  runId: "r",
  retry: Schedule.recurs(3),
  restart: Schedule.recurs(2)
} satisfies Partial<Rollout.Options>

const user = (task: string): ReadonlyArray<Message> => [{ role: "user", content: task }]

const trajectories = (events: ReadonlyArray<Rollout.Event>) =>
  events.flatMap((e) => (e._tag === "Trajectory" ? [e.trajectory] : []))

const runAll = (options: Rollout.Options) => Stream.runCollect(Rollout.run(options))

// ===== Tests =====

describe("Rollout.run", () => {
  it.effect("multi-turn with parallel tool calls: exact tokens, logprobs and versions in the trajectory", () =>
    Effect.gen(function*() {
      const log: Array<string> = []
      const events = yield* runAll({ ...base, tools: tools(log), messages: user("sum") })
      const [t] = trajectories(events)
      assert.isDefined(t)
      const traj = t!
      assert.strictEqual(traj.termination, "answer")
      assert.strictEqual(traj.reward, 1)
      assert.strictEqual(traj.rewardStatus, "scored")
      assert.strictEqual(traj.metrics["reward/exact/acc"], 1)
      assert.strictEqual(traj.metrics.turns, 2)
      assert.strictEqual(traj.metrics.tool_calls, 3)
      assert.deepStrictEqual(log, ["peak:2", "peak:1"], "the two calls of turn 1 ran at the same time")
      assert.deepStrictEqual(
        traj.messages.map((m) => m.role),
        ["user", "assistant", "tool", "tool", "assistant", "tool"]
      )
      assert.deepStrictEqual(traj.messages.slice(2, 4).map((m) => m.content), ["3", "4"])
      // Token-in/token-out: the policy spans are exactly what the sampler returned.
      const segment = traj.segments[0]!
      const policy = segment.spans.filter((s) => s.source === "policy")
      assert.deepStrictEqual(policy.map((s) => s.tokenIds), [sumTurns[0], sumTurns[1]])
      for (const span of policy) {
        assert.deepStrictEqual(span.logprobs, span.tokenIds.map((id, i) => Sampler.scriptedLogprob(id, i)))
        assert.strictEqual(span.policyVersion, 9)
      }
      const mask = Trajectory.lossMask(segment)
      assert.strictEqual(mask.reduce((a, b) => a + b, 0), sumTurns[0]!.length + sumTurns[1]!.length)
      assert.strictEqual(traj.metrics.tokens_generated, sumTurns[0]!.length + sumTurns[1]!.length)
      // The trajectory satisfies the schema.
      assert.isTrue(Schema.is(Trajectory.Trajectory)(traj))
      const group = events.find((e) => e._tag === "Group")
      assert.strictEqual(group?._tag === "Group" && group.group.trajectories.length, 1)
    }).pipe(Effect.provide(scripted({ sum: sumTurns }, { policyVersion: 9 }))))

  it.effect("every termination reason", () =>
    Effect.gen(function*() {
      const requests: Array<Sampler.GenerateRequest> = []
      const layer = Sampler.layerScripted((request) => {
        requests.push(request)
        const { task, turnIndex } = situation(request)
        switch (task) {
          case "answer":
            return turn(`CALL answer {"value":5}`)
          case "talk":
            return turn("just text")
          case "loop":
            return turn(`CALL add {"a":${turnIndex},"b":1}`)
          case "long":
            return turn("x".repeat(500))
          case "ramble":
            return [...Array(300).fill(120)]
          case "budget":
            return turn(`CALL add {"a":1,"b":1}`)
          case "flood":
            return turn(`CALL flood {"n":1000}`)
          default:
            return Sampler.samplerError("BadRequest", "prompt too long")
        }
      })
      const run = (task: string, extra?: Partial<Rollout.Options>) =>
        runAll({ ...base, messages: user(task), ...extra }).pipe(
          Effect.map((events) => trajectories(events)[0]!),
          Effect.provide(layer)
        )
      assert.strictEqual((yield* run("answer")).termination, "answer")
      assert.strictEqual((yield* run("talk")).termination, "no_tool_call")
      const loop = yield* run("loop", { maxTurns: 3 })
      assert.strictEqual(loop.termination, "max_turns")
      assert.strictEqual(loop.metrics.turns, 3)
      assert.strictEqual((yield* run("ramble")).termination, "stop")
      assert.strictEqual((yield* run("oops")).termination, "error")
      // The context budget caps max tokens: a turn cut by it ends the chain with context_length.
      requests.length = 0
      const long = yield* run("long", { maxContextTokens: 250 })
      assert.strictEqual(long.termination, "context_length")
      assert.isBelow(requests[0]!.sampling.maxTokens, 200)
      assert.strictEqual(requests[0]!.promptTokenIds.length + requests[0]!.sampling.maxTokens, 250)
      // A budget used up by observations ends the chain before sampling.
      const budget = yield* run("budget", { maxContextTokens: 150, maxTurns: 50 })
      assert.strictEqual(budget.termination, "context_length")
      assert.strictEqual(Trajectory.segmentLength(budget.segments[0]!), 150, "cut to the budget")
      // A tool output past the budget ends the chain, and the trajectory is cut to the budget (no sequence is
      // longer than the model's positions) while the messages keep the whole output for the reward.
      requests.length = 0
      const flood = yield* run("flood", { maxContextTokens: 300, maxTurns: 50 })
      assert.strictEqual(flood.termination, "context_length")
      assert.strictEqual(requests.length, 1, "no turn sampled after the overrun")
      const segment = flood.segments[0]!
      assert.strictEqual(Trajectory.segmentLength(segment), 300)
      assert.deepStrictEqual(segment.spans.at(-1)!.source, "tool")
      const policy = segment.spans.filter((s) => s.source === "policy")
      assert.strictEqual(policy.length, 1, "the sampled turn is kept whole")
      assert.strictEqual(policy[0]!.logprobs!.length, policy[0]!.tokenIds.length)
      assert.strictEqual(flood.messages.find((m) => m.role === "tool")!.content, "9".repeat(1000))
    }))

  it.effect(
    "a turn cut inside a tool call made a failed call: counted, said in the trajectory, invalid in the figures",
    () =>
      Effect.gen(function*() {
        // A real template and parser (Qwen2.5, hermes): the model opens a call and runs out of tokens in it.
        const tokenizer = yield* Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig(""))
        const format = ChainFormat.fromTemplate({ tokenizer, template: ChatTemplate.builtinTemplate("qwen2.5") })
        const layer = Sampler.layerScripted((request) => {
          const prompt = tokenizer.decode(request.promptTokenIds)
          return tokenizer.encode(
            prompt.includes("prose") ? "Let me think about it" : `Let me add.\n<tool_call>\n{"name": "add", "argu`
          )
        })
        const run = (task: string, extra?: Partial<Rollout.Options>) =>
          runAll({ ...base, format, messages: user(task), ...extra }).pipe(
            Effect.map((events) => trajectories(events)[0]!),
            Effect.provide(layer)
          )
        const cut = yield* run("call")
        assert.strictEqual(cut.termination, "stop", "the chain ended because the turn was cut")
        assert.strictEqual(cut.metrics["tool_errors/ParseFailed"], 1)
        assert.strictEqual(cut.errorReason, "ParseFailed")
        assert.match(
          cut.error!,
          /^ParseFailed: the turn was cut by max tokens inside a tool call: <tool_call> is never/
        )
        assert.isFalse(cut.masked, "a policy's failure: scored and trained on, as a malformed call is")
        assert.strictEqual(cut.rewardStatus, "scored")
        // Cut by the context budget instead (a few tokens short of the whole turn): the same failed call, a
        // context_length ending.
        const full = yield* run("call", { maxContextTokens: Trajectory.segmentLength(cut.segments[0]!) - 4 })
        assert.strictEqual(full.termination, "context_length")
        assert.strictEqual(full.metrics["tool_errors/ParseFailed"], 1)
        assert.include(full.error!, "cut by the context budget inside a tool call")
        // A turn cut in prose made no call.
        const prose = yield* run("prose")
        assert.strictEqual(prose.termination, "stop")
        assert.isUndefined(prose.metrics["tool_errors/ParseFailed"])
        assert.isUndefined(prose.error)
        // The trainer's figures read it as an invalid call and a ParseFailed failure, not an infrastructure one.
        const figures = RolloutFigures.rolloutFigures(
          [{ groupId: "g", rowIndex: 0, trajectories: [cut, full, prose] }],
          {
            prefix: "rollout",
            tools: ["add", "answer"]
          }
        )
        assert.closeTo(figures["rollout/invalid_tool_call_rate"]!, 2 / 3, 1e-12)
        assert.strictEqual(figures["rollout/tool_errors/ParseFailed"], 2)
        assert.strictEqual(figures["rollout/failures/ParseFailed"], 2)
        assert.strictEqual(figures["rollout/failure_share"], 0)
      })
  )

  it.effect("group assembly: numChains trajectories per row, in chain order, with row fields", () =>
    Effect.gen(function*() {
      const stats = RolloutChain.makeStats()
      const events = yield* runAll({
        ...base,
        numChains: 4,
        maxConcurrentChains: 3,
        rows: [
          { messages: user("sum"), answer: "5" },
          { messages: user("talk"), answer: "x" },
          { messages: user("sum"), answer: "5" }
        ],
        stats
      })
      const groups = events.flatMap((e) => (e._tag === "Group" ? [e.group] : []))
      assert.strictEqual(groups.length, 3)
      assert.strictEqual(trajectories(events).length, 12)
      for (const group of groups) {
        assert.strictEqual(group.groupId, `r-g${group.rowIndex}`)
        const chainIds = [0, 1, 2, 3].map((c) => `${group.groupId}-c${c}`)
        assert.deepStrictEqual(group.trajectories.map((t) => t.chainId), chainIds)
        assert.isTrue(group.trajectories.every((t) => t.groupId === group.groupId))
        assert.strictEqual(group.trajectories[0]!.row?.answer, group.rowIndex === 1 ? "x" : "5")
      }
      assert.deepStrictEqual(groups.find((g) => g.rowIndex === 1)!.trajectories.map((t) => t.reward), [0, 0, 0, 0])
      const metrics = RolloutChain.metrics(stats)
      assert.strictEqual(metrics["rollout/chains_finished"], 12)
      assert.strictEqual(metrics["rollout/chains_in_flight"], 0)
      assert.strictEqual(metrics["rollout/groups"], 3)
      assert.strictEqual(metrics["rollout/termination/answer"], 8)
      assert.strictEqual(metrics["rollout/termination/no_tool_call"], 4)
      assert.strictEqual(metrics["rollout/tool_calls/add"], 16)
      assert.strictEqual(metrics["rollout/tool_calls/answer"], 8)
      assert.strictEqual(metrics["rollout/turns"], 20)
      assert.isAbove(metrics["rollout/tokens_generated"]!, 0)
    }).pipe(Effect.provide(scripted({ sum: sumTurns, talk: [turn("hello")] }))))

  it.effect("sampler latency is measured on the Clock, per chain and per run", () =>
    Effect.gen(function*() {
      const stats = RolloutChain.makeStats()
      const layer = Sampler.layerScripted((request) =>
        Effect.sleep(situation(request).turnIndex === 0 ? 100 : 300).pipe(
          Effect.as(sumTurns[situation(request).turnIndex]!)
        )
      )
      const fiber = yield* runAll({ ...base, messages: user("sum"), stats }).pipe(
        Effect.provide(layer),
        Effect.forkChild
      )
      yield* TestClock.adjust(100)
      yield* TestClock.adjust(300)
      const [t] = trajectories(yield* Fiber.join(fiber))
      assert.strictEqual(t!.metrics.sampler_latency_ms, 400)
      assert.strictEqual(RolloutChain.metrics(stats)["rollout/sampler_latency_ms"], 200)
      assert.strictEqual(RolloutChain.metrics(stats)["rollout/sampler_calls"], 2)
    }))

  it.effect("sampling seeds differ per chain and are reproducible", () =>
    Effect.gen(function*() {
      const seeds: Array<number | undefined> = []
      yield* runAll({
        ...base,
        numChains: 3,
        rows: [{ messages: user("a") }, { messages: user("b") }],
        sampling: { ...sampling, seed: 100 }
      })
        .pipe(Effect.provide(Sampler.layerScripted((request) => {
          seeds.push(request.sampling.seed)
          return turn("done")
        })))
      assert.deepStrictEqual([...seeds].sort(), [100, 101, 102, 103, 104, 105])
    }))
})

describe("Rollout.run error policies", () => {
  it.effect("retry: transient sampler failures are retried, then the chain goes on", () =>
    Effect.gen(function*() {
      let calls = 0
      const layer = Sampler.layerScripted(() =>
        ++calls <= 2 ? Sampler.samplerError("Overloaded", "429") : turn("fine")
      )
      const stats = RolloutChain.makeStats()
      const [t] = trajectories(yield* runAll({ ...base, messages: user("x"), stats }).pipe(Effect.provide(layer)))
      assert.strictEqual(t!.termination, "no_tool_call")
      assert.isFalse(t!.masked)
      assert.strictEqual(calls, 3)
      assert.strictEqual(stats.errors.get("SamplerTransient"), undefined, "retried errors that recover are not counted")
    }))

  it.effect("retry exhausted: afterRetry (mask) applies", () =>
    Effect.gen(function*() {
      const layer = Sampler.layerScripted(() => Sampler.samplerError("Timeout", "slow"))
      const [t] = trajectories(yield* runAll({ ...base, messages: user("x") }).pipe(Effect.provide(layer)))
      assert.strictEqual(t!.termination, "error")
      assert.isTrue(t!.masked)
      assert.strictEqual(t!.rewardStatus, "failed")
      assert.include(t!.error!, "SamplerTransient")
    }))

  it.effect("feedback: a malformed tool call is shown to the model, which then recovers", () =>
    Effect.gen(function*() {
      const [t] = trajectories(yield* runAll({ ...base, messages: user("fix") }))
      assert.strictEqual(t!.termination, "answer")
      assert.strictEqual(t!.reward, 1)
      const feedback = t!.messages[2]!
      assert.strictEqual(feedback.role, "tool")
      assert.isTrue(feedback.role === "tool" && feedback.is_error === true)
      assert.include(String(feedback.content), "not JSON")
    }).pipe(Effect.provide(scripted({
      fix: [turn("CALL add {oops"), turn(`CALL answer {"value":5}`)]
    }))))

  it.effect("feedback for a failing tool turns the error into observations", () =>
    Effect.gen(function*() {
      const [t] = trajectories(
        yield* runAll({ ...base, messages: user("env"), policies: { overrides: { EnvFailed: "feedback" } } })
      )
      assert.strictEqual(t!.termination, "answer")
      assert.include(String(t!.messages[2]!.content), "sandbox crashed")
    }).pipe(Effect.provide(scripted({
      env: [turn(`CALL envfail {}`), turn(`CALL answer {"value":5}`)]
    }))))

  it.effect("zero_reward: a failing reward scores 0 and keeps the trajectory in the baseline", () =>
    Effect.gen(function*() {
      const [t] = trajectories(yield* runAll({
        ...base,
        messages: user("sum"),
        reward: () => Effect.fail(new RolloutError.RolloutError({ reason: "RewardFailed", message: "judge down" }))
      }))
      assert.strictEqual(t!.reward, 0)
      assert.strictEqual(t!.rewardStatus, "scored")
      assert.isFalse(t!.masked)
      assert.strictEqual(t!.termination, "answer")
      assert.include(t!.error!, "judge down")
    }).pipe(Effect.provide(scripted({ sum: sumTurns }))))

  it.effect("mask: a crashed environment masks the trajectory; its siblings are unaffected", () =>
    Effect.gen(function*() {
      const events = yield* runAll({ ...base, rows: [{ messages: user("env") }, { messages: user("sum") }] })
      const [bad, good] = [0, 1].map((row) => events.find((e) => e._tag === "Group" && e.group.rowIndex === row))
      const badT = bad?._tag === "Group" ? bad.group.trajectories[0]! : undefined
      const goodT = good?._tag === "Group" ? good.group.trajectories[0]! : undefined
      assert.isTrue(badT!.masked)
      assert.strictEqual(badT!.termination, "error")
      assert.include(badT!.error!, "EnvFailed")
      assert.isFalse(goodT!.masked)
      assert.strictEqual(goodT!.reward, 1)
    }).pipe(Effect.provide(scripted({ env: [turn(`CALL envfail {}`)], sum: sumTurns }))))

  it.effect("drop_group: the whole group is dropped and reported", () =>
    Effect.gen(function*() {
      const events = yield* runAll({
        ...base,
        numChains: 2,
        rows: [{ messages: user("env") }, { messages: user("sum") }],
        policies: { overrides: { EnvFailed: "drop_group" } }
      })
      const dropped = events.filter((e) => e._tag === "GroupDropped")
      assert.strictEqual(dropped.length, 1)
      assert.strictEqual(dropped[0]!._tag === "GroupDropped" && dropped[0]!.rowIndex, 0)
      const groups = events.filter((e) => e._tag === "Group")
      assert.deepStrictEqual(groups.map((g) => g._tag === "Group" && g.group.rowIndex), [1])
    }).pipe(Effect.provide(scripted({ env: [turn(`CALL envfail {}`)], sum: sumTurns }))))

  it.effect("abort_run: a backend without token ids fails the run with a typed error", () =>
    Effect.gen(function*() {
      const layer = Sampler.layerScripted(() => Sampler.samplerError("NoTokenIds", "chat api"))
      const error = yield* Effect.flip(runAll({ ...base, numChains: 4, rows: [{ messages: user("x") }] }).pipe(
        Effect.provide(layer)
      ))
      assert.strictEqual(error._tag, "RolloutError")
      assert.strictEqual(error._tag === "RolloutError" && error.reason, "SamplerUnusable")
    }))

  it.effect("invalid options fail with a SchemaError before any chain starts", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(runAll({ ...base, numChains: 0, messages: user("x") }))
      assert.strictEqual(error._tag, "SchemaError")
      const noRows = yield* Effect.flip(runAll({ ...base, rows: [] }))
      assert.strictEqual(noRows._tag, "SchemaError")
      const badMessages = yield* Effect.flip(runAll({ ...base, rows: [{ messages: [{ role: "robot" } as never] }] }))
      assert.strictEqual(badMessages._tag, "SchemaError")
    }).pipe(Effect.provide(scripted({}))))
})

describe("Rollout.run supervision", () => {
  it.effect("a chain defect is restarted and, when restarts run out, masked; siblings finish normally", () =>
    Effect.gen(function*() {
      const stats = RolloutChain.makeStats()
      const events = yield* runAll({
        ...base,
        numChains: 3,
        rows: [{ messages: user("crash") }, { messages: user("sum") }],
        stats
      })
      const groups = events.flatMap((e) => (e._tag === "Group" ? [e.group] : []))
      assert.strictEqual(groups.length, 2)
      const crashed = groups.find((g) => g.rowIndex === 0)!.trajectories
      assert.isTrue(crashed.every((t) => t.masked && t.termination === "error" && t.error!.startsWith("ChainDefect")))
      const fine = groups.find((g) => g.rowIndex === 1)!.trajectories
      assert.deepStrictEqual(fine.map((t) => t.reward), [1, 1, 1])
      assert.strictEqual(stats.restarts, 6, "2 restarts for each of the 3 crashing chains")
    }).pipe(Effect.provide(scripted({ crash: [turn(`CALL crash {}`)], sum: sumTurns }))))

  it.effect("a defect that does not recur is healed by a restart", () =>
    Effect.gen(function*() {
      let crashes = 0
      const layer = Sampler.layerScripted((request) => {
        const { turnIndex } = situation(request)
        if (turnIndex === 0 && crashes++ === 0) return Effect.die("sampler bug")
        return turnIndex === 0 ? sumTurns[0]! : sumTurns[1]!
      })
      const [t] = trajectories(yield* runAll({ ...base, messages: user("sum") }).pipe(Effect.provide(layer)))
      assert.strictEqual(t!.reward, 1)
      assert.isFalse(t!.masked)
    }))
})

// A counting in-process environment: every acquire and release is recorded.
class Lease extends Context.Service<Lease, { readonly id: number }>()("test/Lease") {}

const countingEnvironment = Effect.gen(function*() {
  const counts = yield* Ref.make({ acquired: 0, released: 0 })
  const provider = Environment.make<Lease>("perChain", () =>
    Effect.acquireRelease(
      Ref.modify(counts, (c) => [c.acquired, { ...c, acquired: c.acquired + 1 }]),
      () => Ref.update(counts, (c) => ({ ...c, released: c.released + 1 }))
    ).pipe(Effect.map((id) => Context.make(Lease, { id }))))
  return { counts, provider }
})

describe("Rollout.run interruption and back-pressure", () => {
  it.effect("interrupting a run mid-flight interrupts every chain and releases every lease", () =>
    Effect.gen(function*() {
      const { counts, provider } = yield* countingEnvironment
      const started = yield* Deferred.make<void>()
      const layer = Sampler.layerScripted((request) => {
        const { task } = situation(request)
        // "quick" chains finish; "stuck" chains wait forever inside the sampler.
        if (task === "quick") return turn("done")
        return Deferred.succeed(started, undefined).pipe(Effect.andThen(Effect.never))
      })
      const stats = RolloutChain.makeStats()
      const fiber = yield* Stream.runCollect(Rollout.run({
        ...base,
        numChains: 4,
        maxConcurrentChains: 8,
        rows: [{ messages: user("quick") }, { messages: user("stuck") }, { messages: user("stuck") }],
        environment: provider,
        stats
      })).pipe(Effect.provide(layer), Effect.forkChild)
      yield* Deferred.await(started)
      for (let i = 0; i < 10; i++) yield* Effect.yieldNow
      const during = yield* Ref.get(counts)
      assert.strictEqual(during.acquired, 12)
      assert.strictEqual(during.released, 4, "the quick group is done")
      assert.strictEqual(stats.chainsInFlight, 8)
      yield* Fiber.interrupt(fiber)
      const after = yield* Ref.get(counts)
      assert.deepStrictEqual(after, { acquired: 12, released: 12 })
      assert.strictEqual(stats.chainsInFlight, 0)
    }))

  it.effect("interrupting a run interrupts pending tool calls and releases their chains' leases", () =>
    Effect.gen(function*() {
      const { counts, provider } = yield* countingEnvironment
      interruptedToolCalls = 0
      const stats = RolloutChain.makeStats()
      const fiber = yield* Stream.runCollect(Rollout.run({
        ...base,
        numChains: 3,
        rows: [{ messages: user("hang") }],
        environment: provider,
        stats
      })).pipe(Effect.provide(scripted({ hang: [turn(`CALL hang {}\nCALL hang {}`)] })), Effect.forkChild)
      for (let i = 0; i < 20; i++) yield* Effect.yieldNow
      assert.strictEqual(stats.chainsInFlight, 3)
      assert.deepStrictEqual(yield* Ref.get(counts), { acquired: 3, released: 0 })
      yield* Fiber.interrupt(fiber)
      assert.strictEqual(interruptedToolCalls, 6)
      assert.deepStrictEqual(yield* Ref.get(counts), { acquired: 3, released: 3 })
    }))

  it.effect("a consumer that stops early (Stream.take) releases every lease", () =>
    Effect.gen(function*() {
      const { counts, provider } = yield* countingEnvironment
      const events = yield* Rollout.run({
        ...base,
        numChains: 2,
        maxConcurrentChains: 4,
        rows: Array.from({ length: 10 }, () => ({ messages: user("sum") })),
        environment: provider
      }).pipe(Stream.take(3), Stream.runCollect)
      assert.strictEqual(events.length, 3)
      const after = yield* Ref.get(counts)
      assert.strictEqual(after.acquired, after.released)
      assert.isBelow(after.acquired, 20)
    }).pipe(Effect.provide(scripted({ sum: sumTurns }))))

  it.effect("back-pressure: a slow consumer bounds the chains in flight and the chains started", () =>
    Effect.gen(function*() {
      const stats = RolloutChain.makeStats()
      const pulled = yield* Ref.make(0)
      const gate = yield* Deferred.make<void>()
      const fiber = yield* Rollout.run({
        ...base,
        numChains: 2,
        maxConcurrentChains: 4,
        bufferSize: 2,
        rows: Array.from({ length: 50 }, () => ({ messages: user("talk") })),
        stats
      }).pipe(
        // The consumer takes one event, then stalls until the gate opens.
        Stream.runForEach(() => Ref.update(pulled, (n) => n + 1).pipe(Effect.andThen(Deferred.await(gate)))),
        Effect.forkChild
      )
      for (let i = 0; i < 50; i++) yield* Effect.yieldNow
      assert.strictEqual(yield* Ref.get(pulled), 1)
      // Chains block on the full buffer while holding their slots: no chain beyond the first few starts.
      assert.isAtMost(stats.chainsStarted, 4 + 2 + 2)
      assert.isAtMost(stats.chainsInFlight, 4)
      const startedWhileStalled = stats.chainsStarted
      for (let i = 0; i < 50; i++) yield* Effect.yieldNow
      assert.strictEqual(stats.chainsStarted, startedWhileStalled)
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(fiber)
      assert.strictEqual(stats.chainsFinished, 100)
      assert.strictEqual(yield* Ref.get(pulled), 150, "100 trajectories + 50 groups")
    }).pipe(Effect.provide(scripted({ talk: [turn("hi")] }))))

  it.effect("policy versions move with the sampler during a run (async training)", () =>
    Effect.gen(function*() {
      const version = yield* Ref.make(1)
      const layer = Sampler.layerScripted((request) => {
        const { turnIndex } = situation(request)
        return turnIndex === 1 ? Ref.set(version, 2).pipe(Effect.as(sumTurns[1]!)) : sumTurns[0]!
      }, { policyVersion: Ref.get(version) })
      const [t] = trajectories(yield* runAll({ ...base, messages: user("sum") }).pipe(Effect.provide(layer)))
      const versions = t!.segments[0]!.spans.flatMap((s) => (s.source === "policy" ? [s.policyVersion] : []))
      assert.deepStrictEqual(versions, [1, 2])
      assert.strictEqual(Trajectory.oldestPolicyVersion(t!), 1)
    }))
})

describe("Rollout.run with the ToolActor and RewardActor", () => {
  it.effect("runs real tools against each chain's own environment and scores with the reward actor", () =>
    Effect.gen(function*() {
      const { counts, provider } = yield* countingEnvironment
      const WhoAmI = Tool.make("whoami", {
        description: "The id of this chain's environment",
        dependencies: [Lease],
        handler: () =>
          Effect.gen(function*() {
            const lease = yield* Lease
            return `lease ${lease.id}`
          })
      })
      const Answer = Tool.make("answer", {
        description: "Give the final answer",
        parameters: Schema.Struct({ value: Schema.Number }),
        terminal: true,
        handler: ({ value }) => Effect.succeed(String(value))
      })
      const actor = yield* ToolActor.make([WhoAmI, Answer])
      const Exact = Reward.make("exact", {
        row: Schema.Struct({ answer: Schema.String }),
        score: ({ response, row }) => Effect.succeed(response === row.answer ? 1 : 0)
      })
      const rewardActor = yield* RewardActor.make(Exact, { onError: "drop" })
      const layer = Sampler.layerScripted((request) => {
        const { turnIndex } = situation(request)
        return turnIndex === 0
          ? turn(`CALL whoami {}\nCALL answer {"value":5}`)
          : turn("done")
      })
      const events = yield* runAll({
        ...base,
        numChains: 3,
        rows: [{ messages: user("go"), answer: "5" }, { messages: user("go"), answer: "6" }],
        tools: ToolActor.toPort(actor),
        reward: RewardActor.toPort(rewardActor),
        environment: provider
      }).pipe(Effect.provide(layer))
      const all = trajectories(events)
      assert.strictEqual(all.length, 6)
      assert.isTrue(all.every((t) => t.termination === "answer"))
      // Each chain saw its own lease.
      const leaseIds = all.map((t) => String(t.messages.find((m) => m.role === "tool")!.content))
      assert.strictEqual(new Set(leaseIds).size, 6)
      assert.deepStrictEqual(
        all.map((t) => [t.row?.answer, t.reward]).sort(),
        [["5", 1], ["5", 1], ["5", 1], ["6", 0], ["6", 0], ["6", 0]]
      )
      assert.isTrue(all.every((t) => t.metrics["reward/exact/reward"] === t.reward))
      assert.deepStrictEqual(yield* Ref.get(counts), { acquired: 6, released: 6 })
    }))

  it.effect("a tool with failureMode error: a crashed environment masks, a plain failure is fed back", () =>
    Effect.gen(function*() {
      const Step = Tool.make("step", {
        description: "Act in the environment",
        parameters: Schema.Struct({ crash: Schema.Boolean }),
        failure: Environment.EnvError,
        failureMode: "error",
        handler: ({ crash }) =>
          Effect.fail(
            crash
              ? Environment.envError("test", "step", "Crashed", "container died")
              : Environment.envError("test", "step", "InvalidAction", "no such move")
          )
      })
      const Answer = Tool.make("answer", {
        description: "Give the final answer",
        parameters: Schema.Struct({ value: Schema.Number }),
        terminal: true,
        handler: ({ value }) => Effect.succeed(String(value))
      })
      const tools = ToolActor.toPort(yield* ToolActor.make([Step, Answer]))
      const layer = scripted({
        crash: [turn(`CALL step {"crash":true}`)],
        invalid: [turn(`CALL step {"crash":false}`), turn(`CALL answer {"value":5}`)]
      })
      const events = yield* runAll({
        ...base,
        rows: [{ messages: user("crash") }, { messages: user("invalid") }],
        tools,
        reward: undefined
      }).pipe(Effect.provide(layer))
      const byTask = (task: string) => trajectories(events).find((t) => t.messages[0]!.content === task)!
      assert.isTrue(byTask("crash").masked)
      assert.include(byTask("crash").error!, "EnvFailed")
      assert.strictEqual(byTask("invalid").termination, "answer")
      assert.include(String(byTask("invalid").messages[2]!.content), "no such move")
    }))
})

describe("Rollout.run invariants (property)", () => {
  const Behaviour = fc.constantFrom("answer", "talk", "loop", "crash", "envfail", "reject", "transient")
  const Case = fc.record({
    rows: fc.integer({ min: 1, max: 5 }),
    numChains: fc.integer({ min: 1, max: 4 }),
    maxConcurrentChains: fc.integer({ min: 1, max: 6 }),
    bufferSize: fc.integer({ min: 1, max: 4 }),
    envPolicy: fc.constantFrom("mask", "drop_group", "feedback") as fc.Arbitrary<RolloutError.Policy>,
    behaviours: fc.array(Behaviour, { minLength: 20, maxLength: 20 })
  })

  it.effect("every chain ends exactly once; every row yields one group or one drop; leases balance", () =>
    Effect.gen(function*() {
      for (const c of fc.sample(Case, { numRuns: 40, seed: 42 })) {
        const { counts, provider } = yield* countingEnvironment
        const stats = RolloutChain.makeStats()
        // Chain k of the run (k = row × numChains + chain) plays behaviours[k], read off its sampling seed.
        const behaviourOf = (request: Sampler.GenerateRequest) => c.behaviours[request.sampling.seed! % 20]!
        let transientFailures = 0
        const layer = Sampler.layerScripted((request) => {
          const { turnIndex } = situation(request)
          switch (behaviourOf(request)) {
            case "answer":
              return sumTurns[Math.min(turnIndex, 1)]!
            case "talk":
              return turn("hello")
            case "loop":
              return turn(`CALL add {"a":1,"b":${turnIndex}}`)
            case "crash":
              return turn(`CALL crash {}`)
            case "envfail":
              return turnIndex === 0 ? turn(`CALL envfail {}`) : turn("ok")
            case "reject":
              return Sampler.samplerError("BadRequest", "no")
            case "transient":
              return transientFailures++ % 2 === 0
                ? Sampler.samplerError("ServerError", "503")
                : turn("recovered")
          }
        })
        const events = yield* runAll({
          ...base,
          numChains: c.numChains,
          maxConcurrentChains: c.maxConcurrentChains,
          bufferSize: c.bufferSize,
          maxTurns: 3,
          rows: Array.from({ length: c.rows }, (_, i) => ({ messages: user(`row ${i}`) })),
          sampling: { ...sampling, seed: 0 },
          environment: provider,
          policies: { overrides: { EnvFailed: c.envPolicy } },
          restart: Schedule.recurs(1),
          stats
        }).pipe(Effect.provide(layer))
        const all = trajectories(events)
        const total = c.rows * c.numChains
        assert.strictEqual(all.length, total)
        assert.strictEqual(new Set(all.map((t) => t.trajectoryId)).size, total)
        for (let row = 0; row < c.rows; row++) {
          const ends = events.filter((e) =>
            (e._tag === "Group" && e.group.rowIndex === row) || (e._tag === "GroupDropped" && e.rowIndex === row)
          )
          assert.strictEqual(ends.length, 1, `row ${row} ends once`)
          const chainsOfRow = Array.from({ length: c.numChains }, (_, k) => c.behaviours[(row * c.numChains + k) % 20]!)
          const shouldDrop = c.envPolicy === "drop_group" && chainsOfRow.includes("envfail")
          assert.strictEqual(ends[0]!._tag, shouldDrop ? "GroupDropped" : "Group")
          // A group comes after all of its trajectories.
          const at = events.indexOf(ends[0]!)
          const mine = events.flatMap((e, i) => (e._tag === "Trajectory" && e.rowIndex === row ? [i] : []))
          assert.strictEqual(mine.length, c.numChains)
          assert.isTrue(mine.every((i) => i < at))
          if (ends[0]!._tag === "Group") {
            ends[0]!.group.trajectories.forEach((t, k) => {
              const expectMasked = chainsOfRow[k] === "crash" || chainsOfRow[k] === "reject" ||
                (chainsOfRow[k] === "envfail" && c.envPolicy === "mask")
              assert.strictEqual(t.masked, expectMasked, `${chainsOfRow[k]} masked`)
              assert.isTrue(Schema.is(Trajectory.Trajectory)(t))
            })
          }
        }
        const leases = yield* Ref.get(counts)
        assert.strictEqual(leases.acquired, leases.released)
        assert.strictEqual(stats.chainsInFlight, 0)
        assert.strictEqual(stats.chainsFinished, total)
      }
    }))
})
