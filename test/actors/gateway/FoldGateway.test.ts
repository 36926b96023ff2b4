/**
 * Context folding in gateway episodes: an agent harness that compacts its own history (it sends the question and a
 * summary in place of the turns so far, as OpenHands' condenser or Claude Code's compaction do) is recorded as a
 * rewrite, which is already a new segment: the turns before it are trained once, in the first segment; the summary
 * is prompt in the second (mask 0); and the episode's reward is split over the segments as the context policy's
 * `segmentReward` says, as for a local chain.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Bodies from "../../../actors/gateway/Bodies.ts"
import * as Recorder from "../../../actors/gateway/Recorder.ts"
import * as ContextPolicy from "../../../src/ContextPolicy.ts"
import * as Trajectory from "../../../src/Trajectory.ts"
import { calculatorTool, format, scriptedSampler, tokenizer } from "./fixtures.ts"

type Wire = Record<string, unknown>

const question: ReadonlyArray<Wire> = [
  { role: "system", content: "Use the calculator tool." },
  { role: "user", content: "What is 17*23?" }
]
const summary = "(compacted) 17*23 is 391. Say it."

describe("a gateway episode whose harness compacts its history", () => {
  it.effect("a compaction is a new segment: earlier turns trained once, the summary prompt; rewards per segment", () =>
    Effect.gen(function*() {
      const r = yield* Recorder.make({
        id: "e",
        groupId: "g",
        format,
        sampler: yield* scriptedSampler(3),
        sampling: { temperature: 1, maxTokens: 256 },
        requestSampling: "cap"
      })
      const ask = (messages: ReadonlyArray<Wire>) =>
        Effect.flatMap(Bodies.decodeChat({ messages, tools: [calculatorTool] }), (body) => Recorder.chat(r, body))
      const first = yield* ask(question)
      const result = { role: "tool", tool_call_id: first.toolCalls[0]!.id, content: "391" }
      const second = yield* ask([...question, Bodies.assistantMessage(first), result])
      // The harness compacts: the question and its summary replace the turns so far.
      const third = yield* ask([...question, { role: "user", content: summary }])
      assert.strictEqual(r.rewrites, 1)
      const t = yield* Recorder.trajectory(r, { _tag: "Returned" })
      assert.strictEqual(t.segments.length, 2)
      const [before, after] = t.segments as [Trajectory.Segment, Trajectory.Segment]
      const policyIds = (s: Trajectory.Segment) =>
        s.spans.filter((span) => span.source === "policy").flatMap((span) => span.tokenIds)
      // Each sampled turn is trained once, in the segment where it was sampled.
      assert.deepStrictEqual(policyIds(before), [...first.tokenIds, ...second.tokenIds])
      assert.deepStrictEqual(policyIds(after), third.tokenIds)
      // The summary is in the second segment, and none of its tokens is trained.
      const mask = Trajectory.lossMask(after)
      const text = tokenizer.decode(Array.from(Trajectory.tokenIds(after)))
      assert.include(text, summary)
      const summaryEnd = text.indexOf(summary) + summary.length
      const firstPolicy = after.spans.findIndex((span) => span.source === "policy")
      const untrained = after.spans.slice(0, firstPolicy).reduce((n, span) => n + span.tokenIds.length, 0)
      assert.isAtLeast(tokenizer.decode(Array.from(Trajectory.tokenIds(after)).slice(0, untrained)).length, summaryEnd)
      assert.deepStrictEqual(Array.from(mask.subarray(0, untrained)), Array(untrained).fill(0))
      // The episode's reward split over its two segments, as for a folded local chain.
      const scored = ContextPolicy.withSegmentRewards({ ...t, reward: 1 }, { segmentReward: "uniform", gamma: 0.9 })
      assert.deepStrictEqual(scored.segments.map((s) => s.reward), [0.5, 0.5])
      const length = Trajectory.segmentLength(before) + Trajectory.segmentLength(after)
      const rewards = Trajectory.placeSegmentRewards(scored, new Float64Array(length))
      const lastPolicy = (s: Trajectory.Segment, offset: number) => offset + Trajectory.lossMask(s).lastIndexOf(1)
      assert.strictEqual(rewards[lastPolicy(before, 0)], 0.5)
      assert.strictEqual(rewards[lastPolicy(after, Trajectory.segmentLength(before))], 0.5)
      assert.strictEqual(rewards.reduce((a, x) => a + x, 0), 1)
    }))
})
