/**
 * Oracle policies through the rollout machinery (`Rollout.runTaskChat`): the guess game's bisecting oracle, written
 * against messages, wins every game through the task's tool, episode and reward; its trajectories become SFT
 * demonstrations that keep the env messages; a policy that never calls the tool wins none.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Stream } from "effect"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as Oracle from "../../actors/Oracle.ts"
import * as Rollout from "../../actors/Rollout.ts"
import { task } from "../../examples/guess/task.ts"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import type { Trajectory } from "../../src/Trajectory.ts"

const tokenizer = Effect.runSync(Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig("")))
const format = ChainFormat.fromTemplate({ tokenizer, template: ChatTemplate.builtinTemplate("qwen2.5") })

const bisect: Oracle.Policy = (messages) => {
  let lo = 1
  let hi = 15
  messages.forEach((m, i) => {
    const g = m.role === "assistant"
      ? (m.tool_calls?.[0]?.function.arguments as { n: number } | undefined)?.n
      : undefined
    if (g === undefined) return
    const answer = messages.slice(i + 1).map(Oracle.text).find((t) => t === "Higher." || t === "Lower.")
    if (answer === "Higher.") lo = g + 1
    else hi = g - 1
  })
  return { toolCalls: [Oracle.call(messages, "guess", { n: Math.floor((lo + hi) / 2) })] }
}

const rollout = (
  policy: Oracle.Policy,
  options: { readonly task?: typeof task; readonly renderTools?: boolean } = {}
) =>
  Rollout.runTaskChat({
    task: options.task ?? task,
    renderTools: options.renderTools,
    rows: Array.from({ length: 15 }, (_, i) => ({ secret: i + 1 })),
    numChains: 2,
    maxTurns: 6,
    sampling: { temperature: 1, maxTokens: 48, seed: 1 },
    format
  }).pipe(
    Stream.runCollect,
    Effect.map((events) => events.flatMap((e) => (e._tag === "Trajectory" ? [e.trajectory] : []))),
    Effect.provide(Oracle.layer(policy))
  )

describe("Oracle", () => {
  it.effect("a bisecting oracle solves every game through the task's tool, episode and reward", () =>
    Effect.gen(function*() {
      const trajectories = yield* rollout(bisect)
      assert.strictEqual(trajectories.length, 30)
      assert.strictEqual(Oracle.solveRate(trajectories, 1), 1)
      assert.isTrue(trajectories.every((t) => t.termination === "episode_end" && t.episodeEnd === "solved"))
      // Chat-mode trajectories carry no logprobs: never trained by the policy gradient.
      assert.isTrue(trajectories.every((t) => t.trainable === false))
      const demos = Oracle.demonstrations(trajectories)
      assert.strictEqual(demos.length, 30)
      // The game's answers stay in the demonstrations (the warm-up masks them: source env).
      assert.isTrue(demos.some((d) => d.messages.some((m) => Oracle.text(m) === "Lower.")))
      assert.isTrue(demos.some((d) => d.messages.some((m) => Oracle.text(m) === "Higher.")))
    }))

  it.effect("the tools' schemas are in the prompt unless the task's defaults or the options leave them out", () =>
    Effect.gen(function*() {
      const prompt = (trajectories: ReadonlyArray<Trajectory>) =>
        tokenizer.decode(trajectories[0]!.segments[0]!.spans.find((s) => s.source === "prompt")!.tokenIds)
      const loud = { ...task, defaults: { ...task.defaults, renderTools: true } }
      const guess = "\"name\": \"guess\""
      assert.strictEqual(task.defaults.renderTools, false)
      assert.notInclude(prompt(yield* rollout(bisect)), guess)
      assert.include(prompt(yield* rollout(bisect, { task: loud })), guess)
      assert.include(prompt(yield* rollout(bisect, { renderTools: true })), guess)
      assert.notInclude(prompt(yield* rollout(bisect, { task: loud, renderTools: false })), "# Tools")
    }))

  it.effect("a row that does not match the task's row Schema fails the rollout, named by its index", () =>
    Effect.gen(function*() {
      const error = yield* Rollout.runTaskChat({
        task,
        rows: [{ secret: 3 }, { secret: "three" }],
        numChains: 1,
        maxTurns: 2,
        sampling: { temperature: 1, maxTokens: 48 },
        format
      }).pipe(Stream.runCollect, Effect.provide(Oracle.layer(bisect)), Effect.flip)
      assert.strictEqual(error._tag, "DatasetError")
      assert.include(error.message, "rows[1]: ")
      assert.include(error.message, "secret")
    }))

  it.effect("a policy that never calls the tool solves nothing", () =>
    Effect.gen(function*() {
      const trajectories = yield* rollout(() => ({ content: "I give up." }))
      assert.strictEqual(Oracle.solveRate(trajectories, 1), 0)
      assert.deepStrictEqual(Oracle.demonstrations(trajectories), [])
    }))

  it.effect("a solved game with a call its tool refused is no demonstration (the warm-up would refuse it)", () =>
    Effect.gen(function*() {
      // Bisection, after a first call whose argument the tool's Schema refuses: the games are still won.
      const bad = { n: "x" }
      const sloppy: Oracle.Policy = (messages) =>
        messages.some((m) => m.role === "assistant")
          ? bisect(messages.filter((m) => m.role !== "assistant" || m.tool_calls?.[0]?.function.arguments !== bad))
          : { toolCalls: [Oracle.call(messages, "guess", bad)] }
      const trajectories = yield* rollout(sloppy)
      assert.strictEqual(Oracle.solveRate(trajectories, 1), 1)
      assert.isTrue(trajectories.every((t) => t.messages.some((m) => m.role === "tool" && m.is_error === true)))
      assert.deepStrictEqual(Oracle.demonstrations(trajectories), [])
    }))

  it.effect("a solved game counts as a run's accuracy counts it: a partial-credit reward with acc 1 is solved", () =>
    Effect.gen(function*() {
      const [won] = yield* rollout(bisect)
      // A hint's penalty: the game was won (acc 1) for a reward below 1; and a reward of 1 whose acc says lost.
      const hinted: Trajectory = { ...won!, reward: 0.7, metrics: { "reward/found/acc": 1 } }
      const lost: Trajectory = { ...won!, reward: 1, metrics: { "reward/found/acc": 0 } }
      assert.strictEqual(Oracle.solveRate([hinted, lost]), 0.5)
      assert.deepStrictEqual(Oracle.demonstrations([hinted, lost]), [{ messages: hinted.messages }])
      // A threshold counts rewards alone, and a predicate decides as the task's own `correct` would.
      assert.strictEqual(Oracle.solveRate([hinted, lost], 1), 0.5)
      assert.deepStrictEqual(Oracle.demonstrations([hinted, lost], 1), [{ messages: lost.messages }])
      assert.strictEqual(Oracle.solveRate([hinted, lost], (t) => t.reward > 0.5), 1)
    }))
})
