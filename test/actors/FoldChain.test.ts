/**
 * Context folding in a rollout chain, through the real Qwen tokenizer and the Qwen2.5 template: a chain whose context
 * nears its budget drops its oldest turns, or folds them into a summary the policy writes (a folding turn) or a tool
 * writes, and goes on in a new segment. The segments and masks are checked token by token against fresh renders:
 * every sampled id is trained exactly once (in the segment where it was sampled), and what a fold kept or
 * summarised is prompt (mask 0) in the segment after it. Without a policy nothing changes.
 */
import { assert, layer } from "@effect/vitest"
import { Effect, Schedule, Schema } from "effect"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as RolloutChain from "../../actors/RolloutChain.ts"
import * as ToolActor from "../../actors/ToolActor.ts"
import type * as ChainPorts from "../../src/ChainPorts.ts"
import * as ContextPolicy from "../../src/ContextPolicy.ts"
import * as Environment from "../../src/Environment.ts"
import type * as Message from "../../src/Message.ts"
import * as Sampler from "../../src/Sampler.ts"
import * as Tool from "../../src/Tool.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import { Add, Answer } from "../utils/arithmeticTools.ts"
import { Qwen } from "../utils/qwen.ts"

const call = (name: string, args: string) => `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`

/** Seven turns: six additions, then the answer. */
const turns = [
  ...Array.from({ length: 6 }, (_, i) => call("add", `{"a": ${i}, "b": 1}`)),
  call("answer", `{"value": 6}`)
]
const summaryText = "I added 0+1 up to 3+1."

/** What the summary tool was called with. */
const summarized: Array<string> = []
const Recap = Tool.make("recap", {
  description: "Summarise the earlier turns",
  parameters: Schema.Struct({ text: Schema.String }),
  success: Schema.String,
  handler: ({ text }) =>
    Effect.sync(() => {
      summarized.push(text)
      return `recap of ${text.split("\n").length} messages`
    })
})

const prompt: ReadonlyArray<Message.Message> = [
  { role: "system", content: "Add, then answer." },
  { role: "user", content: "Add the numbers." }
]
const budget = 220

layer(Qwen.layer)("a chain with a context policy", (it) => {
  const setup = Effect.gen(function*() {
    const { tokenizer, qwen25 } = yield* Qwen
    const format = ChainFormat.fromTemplate({ tokenizer, template: qwen25 })
    const imEnd = tokenizer.tokenToId("<|im_end|>")!
    const ids = (text: string) => [...tokenizer.encode(text), imEnd]
    const actor = yield* ToolActor.make([Add, Answer, Recap])
    // No schemas in the prompt: short turns, so that a few of them fill the budget.
    const tools: ChainPorts.ToolRunner = { ...ToolActor.toPort(actor), schemas: [] }
    /** Every sampled completion, in order: what the trajectory must train, each exactly once. */
    const sampled: Array<ReadonlyArray<number>> = []
    const summaries = { count: 0 }
    const sampler = yield* Sampler.makeScripted((request) => {
      const text = tokenizer.decode(request.promptTokenIds)
      // A folding turn is asked for by the instruction, the last user message before the generation prompt.
      const asked = text.endsWith(`${ContextPolicy.defaultInstruction}<|im_end|>\n<|im_start|>assistant\n`)
      const done = sampled.length - summaries.count
      if (asked) summaries.count++
      const out = ids(asked ? summaryText : turns[done] ?? "done")
      // What the chain gets: cut at the request's `maxTokens` (the budget left), as the scripted sampler cuts it.
      sampled.push(out.slice(0, request.sampling.maxTokens))
      return out
    })
    const config = (context: ContextPolicy.Encoded | undefined, reward = 1): RolloutChain.Config => ({
      turnSource: { _tag: "Tokens", sampler },
      format,
      tools,
      reward: () => Effect.succeed({ reward, status: "scored" }),
      environment: Environment.none as unknown as Environment.Provider<any, any, never>,
      sampling: { temperature: 1, maxTokens: 64 },
      maxTurns: 12,
      maxContextTokens: budget,
      retry: Schedule.recurs(0),
      stats: RolloutChain.makeStats(),
      ...(context === undefined ? {} : { context: ContextPolicy.makeUnsafe(context) })
    })
    const run = (context: ContextPolicy.Encoded | undefined, reward?: number) =>
      Effect.suspend(() => {
        sampled.length = 0
        summaries.count = 0
          return runChain(context, reward)
      })
    const runChain = (context: ContextPolicy.Encoded | undefined, reward?: number) =>
      Effect.map(
        RolloutChain.run({ trajectoryId: "t", groupId: "g", chainId: "c", messages: prompt }, config(context, reward)),
        (outcome) => outcome.trajectory
      )
    const render = (messages: ReadonlyArray<Message.Message>) =>
      Effect.map(qwen25.render(messages, { tools: [], addGenerationPrompt: true, variables: {} }), (text) =>
        Array.from(tokenizer.encode(text)))
    return { tokenizer, sampled, run, render }
  })

  /** The ids of a segment's spans of `source`, in order. */
  const idsOf = (segment: Trajectory.Segment, source: Trajectory.Source) =>
    segment.spans.filter((s) => s.source === source).flatMap((s) => s.tokenIds)

  it.effect("without a policy the chain ends at the budget; none is the same chain, token for token", () =>
    Effect.gen(function*() {
      const { run, sampled } = yield* setup
      const plain = yield* run(undefined)
      const plainSampled = sampled.slice()
      const none = yield* run({ policy: "none" })
      assert.strictEqual(plain.termination, "context_length")
      assert.strictEqual(plain.segments.length, 1)
      assert.deepStrictEqual(none.segments, plain.segments)
      assert.deepStrictEqual(none.messages, plain.messages)
      assert.deepStrictEqual(sampled, plainSampled)
      // Nothing of folding shows without a policy: no `folds` metric, no segment rewards.
      assert.isUndefined(plain.metrics["folds"])
      assert.isFalse(Trajectory.hasSegmentRewards(plain))
    }))

  it.effect("drop: the oldest turns go, the chain reaches its answer; each sampled id is trained exactly once", () =>
    Effect.gen(function*() {
      const { run, render, sampled } = yield* setup
      const t = yield* run({ policy: "drop", at: 0.6, keepTurns: 1 })
      assert.strictEqual(t.termination, "answer")
      const folds = t.metrics["folds"]!
      assert.isAtLeast(folds, 1)
      assert.strictEqual(t.segments.length, folds + 1)
      // The policy tokens of all segments, in order, are exactly the sampled completions: none lost, none twice.
      assert.deepStrictEqual(t.segments.flatMap((s) => idsOf(s, "policy")), sampled.flat())
      for (const segment of t.segments) {
        assert.isAtMost(Trajectory.segmentLength(segment), budget)
        const mask = Trajectory.lossMask(segment)
        assert.strictEqual(mask.reduce((a, m) => a + m, 0), idsOf(segment, "policy").length)
      }
      // The segment after a fold starts with the render of the prompt and the last turn kept: all of it prompt.
      const [first, second] = t.segments as [Trajectory.Segment, Trajectory.Segment]
      const keptAt = first.messageCount - 2
      const turnIndex = t.messages.slice(0, keptAt).filter((m) => m.role === "assistant").length
      const contextIds = yield* render([
        ...prompt,
        { role: "assistant", content: turns[turnIndex]! },
        t.messages[keptAt + 1]!
      ])
      const head = second.spans[0]!
      assert.strictEqual(head.source, "prompt")
      assert.deepStrictEqual(head.tokenIds, contextIds)
      const headMask = Array.from(Trajectory.lossMask(second).subarray(0, contextIds.length))
      assert.deepStrictEqual(headMask, contextIds.map(() => 0))
      // The message view keeps every message: the rewards and logs see the whole episode.
      assert.strictEqual(t.messages.filter((m) => m.role === "assistant").length, turns.length)
    }))

  it.effect("fold: the policy's summary is a folding turn, trained where written; after it, prompt", () =>
    Effect.gen(function*() {
      const { run, render, sampled, tokenizer } = yield* setup
      const t = yield* run({ policy: "fold", at: 0.6, keepTurns: 0, summaryTokens: 32 })
      assert.strictEqual(t.termination, "answer")
      assert.isAtLeast(t.metrics["folds"]!, 1)
      const [first, second] = t.segments
      // The first segment ends with the instruction (env, mask 0) and the folding turn (policy, trained).
      const policy = idsOf(first!, "policy")
      const summaryIds = [...tokenizer.encode(summaryText), tokenizer.tokenToId("<|im_end|>")!]
      assert.deepStrictEqual(policy.slice(-summaryIds.length), summaryIds)
      const env = tokenizer.decode(idsOf(first!, "env"))
      assert.include(env, ContextPolicy.defaultInstruction)
      // The second segment starts with the prompt and the summary, rendered afresh, none of it trained.
      const expected = yield* render([...prompt, { role: "user", content: ContextPolicy.summaryPrefix + summaryText }])
      assert.deepStrictEqual(second!.spans[0]!.tokenIds, expected)
      assert.strictEqual(second!.spans[0]!.source, "prompt")
      assert.deepStrictEqual(t.segments.flatMap((s) => idsOf(s, "policy")), sampled.flat())
    }))

  it.effect("tool: the summary tool reads the folded turns and writes the summary; nothing extra is sampled", () =>
    Effect.gen(function*() {
      const { run, render, sampled } = yield* setup
      summarized.length = 0
      const t = yield* run({ policy: "tool", tool: "recap", toolArgument: "text", at: 0.6, keepTurns: 0 })
      assert.strictEqual(t.termination, "answer")
      assert.strictEqual(summarized.length, t.metrics["folds"])
      assert.match(summarized[0]!, /^assistant: <tool_call>/)
      assert.strictEqual(sampled.length, turns.length, "no folding turn: the tool wrote the summary")
      const lines = summarized[0]!.split("\n").length
      const summary = `${ContextPolicy.summaryPrefix}recap of ${lines} messages`
      const expected = yield* render([...prompt, { role: "user", content: summary }])
      assert.deepStrictEqual(t.segments[1]!.spans[0]!.tokenIds, expected)
    }))

  it.effect("a fold that would remove nothing does not happen; after maxFolds the chain ends at the budget", () =>
    Effect.gen(function*() {
      const { run } = yield* setup
      const keepAll = yield* run({ policy: "drop", at: 0.6, keepTurns: 100 })
      assert.deepStrictEqual([keepAll.metrics["folds"], keepAll.termination, keepAll.segments.length], [
        0,
        "context_length",
        1
      ])
      const often = yield* run({ policy: "drop", at: 0.4 })
      assert.strictEqual(often.termination, "answer")
      assert.isAtLeast(often.metrics["folds"]!, 2)
      const once = yield* run({ policy: "drop", at: 0.4, maxFolds: 1 })
      assert.deepStrictEqual([once.metrics["folds"], once.termination, once.segments.length], [1, "context_length", 2])
    }))

  it.effect("segment rewards: the reward is split over the segments as configured; last keeps it on the last", () =>
    Effect.gen(function*() {
      const { run } = yield* setup
      const last = yield* run({ policy: "drop", at: 0.6 }, 1)
      const n = last.segments.length
      assert.isAtLeast(n, 2)
      assert.deepStrictEqual(last.segments.map((s) => s.reward), [...Array(n - 1).fill(0), 1])
      const uniform = yield* run({ policy: "drop", at: 0.6, segmentReward: "uniform" }, 1)
      assert.deepStrictEqual(uniform.segments.map((s) => s.reward), Array(n).fill(1 / n))
      const geometric = yield* run({ policy: "drop", at: 0.6, segmentReward: "geometric", gamma: 0.5 }, 1)
      const discounted = Array.from({ length: n }, (_, k) => 0.5 ** (n - 1 - k))
      assert.deepStrictEqual(geometric.segments.map((s) => s.reward), discounted)
      // A reward that scores the segments itself replaces the split; a wrong count masks the trajectory, saying so.
      const segmentRewards = last.segments.map(() => 2)
      const own = RolloutChain.applyScore(last, { reward: 1, status: "scored", segmentRewards })
      assert.deepStrictEqual(own.segments.map((s) => s.reward), Array(n).fill(2))
      const wrong = RolloutChain.applyScore(last, { reward: 1, status: "scored", segmentRewards: [1] })
      assert.deepStrictEqual([wrong.masked, wrong.rewardStatus, wrong.errorReason], [true, "failed", "RewardFailed"])
      assert.include(wrong.error, `of a trajectory of ${n}`)
    }))
})
