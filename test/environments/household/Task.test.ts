/**
 * The household and science tasks through the rollout machinery (`Rollout.runTaskChat`, the byte tokenizer and the
 * Qwen2.5 template): the oracle, which reads only the conversation, solves held-out rows of every task type through
 * the task's own episode and reward; random agents score near 0; bad commands and tool calls are answered, typed,
 * and never end a chain early; chains never share a world and every world is released with its chain; episodes end
 * with a reason; the seeded generator writes the same bytes and its demonstrations are solved episodes.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Data from "../../../environments/household/Data.ts"
import type * as Goal from "../../../environments/household/Goal.ts"
import { Household } from "../../../environments/household/Household.ts"
import * as HouseholdTask from "../../../environments/household/HouseholdTask.ts"
import * as Solver from "../../../environments/household/Solver.ts"
import * as Dataset from "../../../src/Dataset.ts"
import * as Environment from "../../../src/Environment.ts"
import * as Sampling from "../../../src/Sampling.ts"
import * as Task from "../../../src/Task.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"

const household = HouseholdTask.make("household")
const science = HouseholdTask.make("science")

const heldOut = (family: "household" | "science", n: number, world?: Data.Options["world"]) =>
  Data.rows({ ...Data.defaults, family, heldOut: n, train: 0, validation: 0, demos: 0, world }).heldOut

const solved = (ts: ReadonlyArray<Trajectory.Trajectory>) => Oracle.solveRate(ts, 1)
const typeOf = (t: Trajectory.Trajectory) => (t.row?.["goal"] as Goal.Goal).type
const envTexts = (t: Trajectory.Trajectory) => t.messages.slice(2).filter((m) => m.role === "user").map(Oracle.text)

/** Asks for the admissible commands, then plays one of them at random (ALFWorld's random baseline). */
const randomAdmissible: Oracle.Policy = (messages) => {
  const last = Oracle.text(Oracle.last(messages, "user"))
  const listed = /^You can: (.+)\.$/.exec(last)?.[1]?.split(", ")
  if (listed === undefined) return { content: "admissible" }
  const next = Sampling.mulberry32(messages.length * 7919 + last.length)
  return { content: listed[Math.floor(next() * listed.length)] }
}

/** A policy that yields before every reply, so that chains interleave turn by turn (a synchronous one runs each
 * chain to its end before the next starts). */
const interleaved = (policy: Oracle.Policy): Oracle.Policy => (messages) =>
  Effect.flatMap(Effect.yieldNow, () => {
    const reply = policy(messages)
    return Effect.isEffect(reply) ? reply : Effect.succeed(reply)
  })

/** Words, not commands. */
const babble: Oracle.Policy = (messages) => ({
  content: ["hello", "I win", "", "take everything"][messages.length % 4]
})

describe("household task", () => {
  it.effect("the oracle solves ≥ 95% of held-out household rows of each of ALFWorld's six types", () =>
    Effect.gen(function*() {
      const rows = heldOut("household", 120)
      const ts = yield* Data.rollout(household, Solver.oracle, rows)
      assert.strictEqual(ts.length, rows.length)
      assert.isAtLeast(solved(ts), 0.95)
      for (const type of ["pick", "look", "clean", "heat", "cool", "two"]) {
        const of = ts.filter((t) => typeOf(t) === type)
        assert.strictEqual(of.length, 20)
        assert.isAtLeast(solved(of), 0.9, type)
        for (const t of of.filter((t) => t.reward === 1)) assert.strictEqual(t.metrics[`reward/solved/acc_${type}`], 1)
      }
      for (const t of ts.filter((t) => t.reward === 1)) {
        assert.strictEqual(t.termination, "episode_end")
        assert.strictEqual(t.episodeEnd, "solved")
        assert.strictEqual(t.metrics["reward/solved/refused"], 0, "the oracle never issues a refused command")
        assert.strictEqual(t.metrics["reward/solved/steps"], t.messages.filter((m) => m.role === "assistant").length)
        // The environment's answers are spans of source env, never the policy's.
        const env = t.segments.flatMap((s) => s.spans.filter((span) => span.source === "env"))
        assert.isAbove(env.length, 0)
        assert.isTrue(env.every((span) => span.logprobs === undefined))
      }
    }))

  it.effect(
    "the oracle solves ≥ 95% of held-out science rows (phase, measure, circuit, grow) and of two-room worlds",
    () =>
      Effect.gen(function*() {
        const sci = yield* Data.rollout(science, Solver.oracle, heldOut("science", 80))
        assert.isAtLeast(solved(sci), 0.95)
        for (const type of ["phase", "measure", "circuit", "grow"]) {
          assert.isAtLeast(solved(sci.filter((t) => typeOf(t) === type)), 0.9, type)
        }
        const big = { rooms: 2, receptacles: 4, distractors: 3 }
        const rooms = yield* Data.rollout(household, Solver.oracle, heldOut("household", 36, big))
        assert.isAtLeast(solved(rooms), 0.95)
        assert.isTrue(rooms.some((t) => envTexts(t).some((text) => /^You are in the /.test(text))), "it walked rooms")
      })
  )

  it.effect("random agents score near 0: random admissible commands, and words that are not commands", () =>
    Effect.gen(function*() {
      // 20 steps: 10 random commands, each read off an admissible list.
      const rows = [...heldOut("household", 30), ...heldOut("science", 20)].map((r) => ({ ...r, maxSteps: 20 }))
      const h = yield* Data.rollout(household, randomAdmissible, rows.slice(0, 30))
      const s = yield* Data.rollout(science, randomAdmissible, rows.slice(30))
      assert.isBelow(solved(h), 0.1, `random admissible, household: ${solved(h)}`)
      assert.isBelow(solved(s), 0.1, `random admissible, science: ${solved(s)}`)
      const words = yield* Data.rollout(household, babble, rows.slice(0, 20))
      assert.strictEqual(solved(words), 0)
      for (const t of words) {
        assert.strictEqual(t.episodeEnd, "out_of_steps")
        assert.strictEqual(t.metrics["reward/solved/refused"], t.metrics["reward/solved/steps"])
      }
    }))

  it.effect("bad commands and tool calls are answered with typed refusals; the chain goes on to its step limit", () =>
    Effect.gen(function*() {
      const row = { ...heldOut("household", 1)[0]!, maxSteps: 4 }
      let turn = 0
      const bad: Oracle.Policy = (messages) => {
        turn++
        if (turn === 1) return { toolCalls: [Oracle.call(messages, "act", { cmd: "look" })] }
        if (turn === 2) return { content: "dance with the robot" }
        if (turn === 3) return { content: "" }
        return { content: "Thinking it over.\n> take unicorn 1 from cloud 1" }
      }
      const [t] = yield* Data.rollout(household, bad, [row])
      assert.strictEqual(t!.termination, "episode_end")
      assert.strictEqual(t!.episodeEnd, "out_of_steps")
      assert.strictEqual(t!.reward, 0)
      const tool = t!.messages.find((m) => m.role === "tool")!
      assert.isTrue(tool.is_error === true)
      assert.match(Oracle.text(tool), /unknown tool "act"/)
      const said = envTexts(t!)
      assert.match(
        said[0]!,
        /^Nothing happens: "" is not a command \(say help\)\.$/,
        "a turn of tool calls says no command"
      )
      assert.match(said[1]!, /"dance with the robot" is not a command/)
      assert.match(said[2]!, /not a command/)
      assert.strictEqual(said[3], "Nothing happens: you see no cloud 1 here. You are out of steps.")
      assert.strictEqual(t!.metrics["reward/solved/refused"], 4)
    }))

  it.effect("chains never share a world: four chains of a row and many rows at once each solve their own", () =>
    Effect.gen(function*() {
      const rows = heldOut("household", 24)
      const ts = yield* Data.rollout(household, interleaved(Solver.oracle), rows, { numChains: 4 })
      assert.strictEqual(ts.length, 96)
      assert.strictEqual(solved(ts), solved(yield* Data.rollout(household, Solver.oracle, rows)))
      // Taking a thing in one chain's world would leave it missing in another's: the chains of a row, which face
      // the same world, take the same steps and tell the same story.
      for (let r = 0; r < rows.length; r++) {
        const group = ts.slice(4 * r, 4 * r + 4)
        for (const t of group) assert.deepStrictEqual(envTexts(t), envTexts(group[0]!))
      }
    }))

  it.effect("every chain's world is built when the chain starts and released when it ends", () =>
    Effect.gen(function*() {
      const live = { built: 0, released: 0, peak: 0 }
      const counted = Layer.effectDiscard(Effect.acquireRelease(
        Effect.sync(() => {
          live.built++
          live.peak = Math.max(live.peak, live.built - live.released)
        }),
        () => Effect.sync(() => live.released++)
      ))
      const task = Task.make("household-counted", {
        row: HouseholdTask.Row,
        prompt: HouseholdTask.prompt,
        reward: HouseholdTask.solved,
        environment: Environment.perChain(Layer.merge(Household.layer(300), counted)),
        episode: HouseholdTask.episode(HouseholdTask.defaultMaxSteps),
        defaults: household.defaults
      })
      const ts = yield* Data.rollout(task, interleaved(Solver.oracle), heldOut("household", 40), { numChains: 2 })
      assert.strictEqual(ts.length, 80)
      // One more than the chains: the start check's probe chain (`TaskRuntime`), released too.
      assert.strictEqual(live.built, 81)
      assert.strictEqual(live.released, 81, "no world outlives its chain")
      assert.isAbove(live.peak, 40, "chains ran concurrently")
    }))

  it.effect("a user's own rows (a seed and a goal, no size) load through the task's row Schema and are solved", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "household-user-"))
      const rows = [
        {
          question: "put a clean knife in drawer.",
          seed: 12,
          goal: { type: "clean", object: "knife", target: "drawer" }
        },
        { question: "freeze the milk 1.", seed: 13, goal: { type: "phase", object: "milk", change: "freeze" } }
      ]
      writeFileSync(join(dir, "mine.jsonl"), rows.map((r) => JSON.stringify(r)).join("\n") + "\n")
      const loaded = yield* Dataset.load(join(dir, "mine.jsonl"), { fields: household.row })
      assert.strictEqual(loaded.rows.length, 2)
      const ts = yield* Data.rollout(household, Solver.oracle, rows)
      assert.strictEqual(solved(ts), 1)
      writeFileSync(
        join(dir, "bad.jsonl"),
        JSON.stringify({ question: "x", seed: 1, goal: { type: "heat", object: "book", target: "desk" } }) + "\n"
      )
      const error = yield* Effect.flip(Dataset.load(join(dir, "bad.jsonl"), { fields: household.row }))
      assert.strictEqual(error.reason._tag === "InvalidRow" && error.reason.line, 1)
      assert.match(error.message, /heat goal's object/)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("the generator is seeded; its splits never share a world; its demos are the oracle's solved episodes", () =>
    Effect.gen(function*() {
      const options = { ...Data.defaults, train: 30, heldOut: 12, validation: 6, demos: 24, maxContextTokens: 900 }
      const write = (seed: number) => {
        const dir = mkdtempSync(join(tmpdir(), "household-data-"))
        return Effect.as(Data.write({ ...options, seed, dir }), dir)
      }
      const [a, b, c] = [yield* write(5), yield* write(5), yield* write(6)]
      const files = ["train.jsonl", "heldout.jsonl", "validation.jsonl", "demos.jsonl"]
      const read = (dir: string, f: string) => readFileSync(join(dir, f), "utf8")
      for (const f of files) {
        assert.strictEqual(read(a, f), read(b, f), f)
        assert.notStrictEqual(read(a, f), read(c, f), f)
      }
      const seeds = files.slice(0, 3).flatMap((f) => read(a, f).trim().split("\n").map((l) => JSON.parse(l).seed))
      assert.strictEqual(new Set(seeds).size, seeds.length)
      const demos = read(a, "demos.jsonl").trim().split("\n").map((l) => JSON.parse(l) as { messages: Array<any> })
      assert.isAtLeast(demos.length, 18, "most oracle episodes fit 900 tokens")
      for (const { messages } of demos) {
        assert.strictEqual(messages[0].content, HouseholdTask.systemPrompts.household)
        assert.match(messages[1].content, /^You are in the .*\nYour task is to: /)
        const roles = messages.slice(2).map((m) => m.role)
        assert.deepStrictEqual(roles, roles.map((_, i) => (i % 2 === 0 ? "assistant" : "user")))
        assert.isTrue(messages.filter((m) => m.role === "assistant").every((m) => /^[a-z]/.test(m.content)))
      }
    }).pipe(Effect.provide(NodeServices.layer)))
})
