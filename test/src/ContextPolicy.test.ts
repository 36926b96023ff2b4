/**
 * Context policies as pure functions: the policy's decoding (defaults, the errors that name what is wrong), the
 * folded context (prompt, summary, kept turns), AgentFly's segment-reward decomposition, where segment rewards land
 * in the learner's token rewards, and the advantage each segment gets under the configured estimator.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Result } from "effect"
import * as Advantage from "../../src/Advantage.ts"
import * as ContextPolicy from "../../src/ContextPolicy.ts"
import type * as Message from "../../src/Message.ts"
import * as Task from "../../src/Task.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as Trajectory from "../../src/Trajectory.ts"

const minimal = {
  output: "runs/x",
  model: { path: "model", preset: "tiny" },
  data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
  task: "calculator",
  algorithm: { steps: 10 }
}

const configError = (input: unknown) =>
  Effect.map(Effect.result(TrainConfig.decode(input)), (r) => {
    assert.isTrue(Result.isFailure(r), "expected a failure")
    return (r as Result.Failure<unknown, TrainConfig.ConfigError>).failure.message
  })

describe("ContextPolicy: the policy a config writes", () => {
  it.effect("a run config has no context policy unless it names one; a named one gets every default", () =>
    Effect.gen(function*() {
      const plain = yield* TrainConfig.decode(minimal)
      assert.isUndefined(plain.agent.context)
      const drop = yield* TrainConfig.decode({ ...minimal, agent: { context: { policy: "drop" } } })
      assert.deepStrictEqual(drop.agent.context, {
        policy: "drop",
        at: 0.75,
        keepTurns: 1,
        instruction: ContextPolicy.defaultInstruction,
        summaryTokens: 64,
        segmentReward: "last",
        gamma: 0.9,
        maxFolds: 100
      })
    }))

  it.effect("a task suggests a policy in its defaults; the config's own wins", () =>
    Effect.gen(function*() {
      const task = Task.make("long", { defaults: { context: { policy: "fold", at: 0.5 } } })
      const suggested = yield* TrainConfig.decode(Task.withDefaults(task, minimal))
      assert.deepStrictEqual([suggested.agent.context?.policy, suggested.agent.context?.at], ["fold", 0.5])
      const config = { ...minimal, agent: { context: { policy: "drop" } } }
      const own = yield* TrainConfig.decode(Task.withDefaults(task, config))
      assert.deepStrictEqual([own.agent.context?.policy, own.agent.context?.at], ["drop", 0.75])
    }))

  it.effect("bad policies are refused with the key that is wrong", () =>
    Effect.gen(function*() {
      const tool = yield* configError({ ...minimal, agent: { context: { policy: "tool" } } })
      assert.include(tool, "context.tool")
      const at = yield* configError({ ...minimal, agent: { context: { policy: "drop", at: 0 } } })
      assert.include(at, "at")
      const kind = yield* configError({ ...minimal, agent: { context: { policy: "compress" } } })
      assert.include(kind, "policy")
      assert.throws(() => ContextPolicy.makeUnsafe({ policy: "fold", segmentReward: "halves" as "last" }))
    }))
})

const sys: Message.Message = { role: "system", content: "s" }
const user: Message.Message = { role: "user", content: "u" }
const turn = (i: number): Array<Message.Message> => [
  { role: "assistant", content: `a${i}` },
  { role: "tool", content: `t${i}`, tool_call_id: `c${i}` }
]

describe("ContextPolicy: the folded context", () => {
  const history = [sys, user, ...turn(1), ...turn(2), ...turn(3)]

  it("keeps the prompt and the last turns; a summary goes between them, replacing an earlier one", () => {
    assert.deepStrictEqual(ContextPolicy.folded(history, 2, 1, undefined), [sys, user, ...turn(3)])
    assert.deepStrictEqual(ContextPolicy.folded(history, 2, 2, undefined), [sys, user, ...turn(2), ...turn(3)])
    const summary: Message.Message = { role: "user", content: `${ContextPolicy.summaryPrefix}did 1 and 2` }
    assert.deepStrictEqual(ContextPolicy.folded(history, 2, 1, " did 1 and 2 "), [sys, user, summary, ...turn(3)])
    // The next fold of that context: the earlier summary is folded too, the new one takes its place.
    const again = [sys, user, summary, ...turn(3), ...turn(4)]
    const newer: Message.Message = { role: "user", content: `${ContextPolicy.summaryPrefix}did 1 to 3` }
    assert.deepStrictEqual(ContextPolicy.folded(again, 2, 1, "did 1 to 3"), [sys, user, newer, ...turn(4)])
    assert.deepStrictEqual(ContextPolicy.folded(history, 2, 0, "all"), [sys, user, {
      role: "user",
      content: `${ContextPolicy.summaryPrefix}all`
    }])
  })

  it("keptFrom: nothing to fold when the prompt is followed by no more turns than are kept", () => {
    assert.strictEqual(ContextPolicy.keptFrom([sys, user, ...turn(1)], 2, 1), 2)
    assert.strictEqual(ContextPolicy.keptFrom(history, 2, 1), 6)
    assert.strictEqual(ContextPolicy.keptFrom(history, 2, 0), history.length)
    assert.strictEqual(ContextPolicy.foldedText(history, 2, 1), "assistant: a1\ntool: t1\nassistant: a2\ntool: t2")
  })

  it("due: at the configured share of the budget, never without a policy or a budget", () => {
    const drop = ContextPolicy.makeUnsafe({ policy: "drop", at: 0.5 })
    assert.isFalse(ContextPolicy.due(drop, 99, 200))
    assert.isTrue(ContextPolicy.due(drop, 100, 200))
    assert.isFalse(ContextPolicy.due(drop, 1_000, undefined))
    assert.isFalse(ContextPolicy.due(ContextPolicy.makeUnsafe({ policy: "none" }), 1_000, 200))
  })
})

describe("ContextPolicy: segment rewards (AgentFly's REWARD_DECOMPOSITION)", () => {
  it("last, broadcast, uniform and geometric split a reward over n segments as AgentFly does", () => {
    assert.deepStrictEqual(ContextPolicy.decompose(2, 3, "last", 0.9), [0, 0, 2])
    assert.deepStrictEqual(ContextPolicy.decompose(2, 3, "broadcast", 0.9), [2, 2, 2])
    assert.deepStrictEqual(ContextPolicy.decompose(3, 3, "uniform", 0.9), [1, 1, 1])
    assert.deepStrictEqual(ContextPolicy.decompose(1, 3, "geometric", 0.5), [0.25, 0.5, 1])
    assert.deepStrictEqual(ContextPolicy.decompose(1, 1, "last", 0.9), [1])
  })
})

// ===== Where segment rewards land, and the advantages they give =====

const span = (source: Trajectory.Source, n: number): Trajectory.Span => ({ source, tokenIds: Array(n).fill(7) })

/** A trajectory of two segments: [prompt 2, policy 3, tool 1] then [prompt 3, policy 2, template 1]. */
const twoSegments = (reward: number, rewards?: readonly [number, number]): Trajectory.Trajectory => ({
  trajectoryId: "t",
  groupId: "g",
  chainId: "c",
  messages: [],
  segments: [
    { spans: [span("prompt", 2), span("policy", 3), span("tool", 1)], messageCount: 4 },
    { spans: [span("prompt", 3), span("policy", 2), span("template", 1)], messageCount: 6 }
  ].map((s, k) => (rewards === undefined ? s : { ...s, reward: rewards[k]! })),
  termination: "answer",
  reward,
  rewardStatus: "scored",
  metrics: {},
  trainable: true,
  masked: false
})

describe("Trajectory.placeSegmentRewards: each segment's reward on its last policy token", () => {
  it("two segments: on tokens 4 and 10 of the concatenated row; last equals the unsegmented outcome reward", () => {
    const out = Trajectory.placeSegmentRewards(twoSegments(1, [0.25, 0.75]), new Float64Array(12))
    assert.deepStrictEqual(Array.from(out), [0, 0, 0, 0, 0.25, 0, 0, 0, 0, 0, 0.75, 0])
    // `last` puts the whole reward where the learner puts an unsegmented trajectory's: its last policy token.
    const last = Trajectory.placeSegmentRewards(twoSegments(1, [0, 1]), new Float64Array(12))
    assert.deepStrictEqual(Array.from(last), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0])
  })

  it("a segment without a policy token passes its reward to the last one before it (or the next one)", () => {
    const t = twoSegments(1)
    const lead: Trajectory.Trajectory = {
      ...t,
      segments: [{ spans: [span("prompt", 2)], messageCount: 2, reward: 0.5 }, { ...t.segments[0]!, reward: 0.25 }]
    }
    const leading = Trajectory.placeSegmentRewards(lead, new Float64Array(8))
    assert.deepStrictEqual(Array.from(leading), [0, 0, 0, 0, 0, 0, 0.75, 0])
    const trail: Trajectory.Trajectory = {
      ...t,
      segments: [{ ...t.segments[0]!, reward: 0.25 }, { spans: [span("prompt", 2)], messageCount: 2, reward: 0.5 }]
    }
    const trailing = Trajectory.placeSegmentRewards(trail, new Float64Array(8))
    assert.deepStrictEqual(Array.from(trailing), [0, 0, 0, 0, 0.75, 0, 0, 0])
  })
})

describe("advantages per segment: as the configured estimator says", () => {
  /** A group of two folded trajectories, their segment rewards placed as the learner places them. */
  const input = (a: Trajectory.Trajectory, b: Trajectory.Trajectory): Advantage.Input => {
    const length = 12
    const tokenRewards = new Float64Array(2 * length)
    const responseMask = new Uint8Array(2 * length)
    ;[a, b].forEach((t, row) => {
      Trajectory.placeSegmentRewards(t, tokenRewards, row * length)
      responseMask.set(Trajectory.lossMask(t.segments[0]!), row * length)
      responseMask.set(Trajectory.lossMask(t.segments[1]!), row * length + 6)
    })
    return { batch: 2, length, tokenRewards, responseMask, groupIndex: Int32Array.of(0, 0) }
  }
  const policyCells = (row: number) => [2, 3, 4, 9, 10].map((t) => row * 12 + t)

  it.effect("grpo: a trajectory's segments share one advantage, from the sum of its segment rewards", () =>
    Effect.gen(function*() {
      const group = input(twoSegments(1, [0.5, 0.5]), twoSegments(0, [0, 0]))
      const { advantages } = yield* Advantage.compute("grpo", group)
      const a = policyCells(0).map((i) => advantages[i]!)
      const b = policyCells(1).map((i) => advantages[i]!)
      assert.isTrue(a.every((x) => Math.abs(x - 1 / Math.SQRT2) < 1e-6), `got ${a}`)
      assert.isTrue(b.every((x) => Math.abs(x + 1 / Math.SQRT2) < 1e-6), `got ${b}`)
    }))

  it.effect("reinforce++: each segment's return is its own reward and the later ones' (reward-to-go, γ = 1)", () =>
    Effect.gen(function*() {
      const group = input(twoSegments(1, [0.25, 0.75]), twoSegments(1, [1, 0]))
      const { returns } = yield* Advantage.compute("reinforce++", group)
      assert.deepStrictEqual(policyCells(0).map((i) => returns[i]!), [1, 1, 1, 0.75, 0.75])
      assert.deepStrictEqual(policyCells(1).map((i) => returns[i]!), [1, 1, 1, 0, 0])
      // γ < 1 discounts across segments too: the first segment's last token gets γ²·0.75 + 0.25 (two steps on).
      const later = input(twoSegments(1, [0.25, 0.75]), twoSegments(0))
      const discounted = yield* Advantage.compute("reinforce++", later, { gamma: 0.5 })
      assert.closeTo(discounted.returns[4]!, 0.25 + 0.5 * 0.5 * 0.75, 1e-12)
    }))
})
