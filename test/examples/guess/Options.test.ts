/**
 * `examples/guess/options.ts`: the guess game with options a config sets (`Task.withOptions`). A config naming the
 * module with options gets the task they ask for (its reward and its defaults, through the CLI's own loader); bad
 * options stop before anything runs, naming the key; the oracle still wins every game through the options' task.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Setup from "../../../cli/setup.ts"
import { task } from "../../../examples/guess/options.ts"
import type * as Message from "../../../src/Message.ts"

const example = resolve(import.meta.dirname, "../../../examples/guess/options.ts")

/** A config file naming the module with `options`, loaded as `agentfly train` loads it. */
const load = (options: unknown) => {
  const dir = mkdtempSync(join(tmpdir(), "guess-options-"))
  const file = join(dir, "config.json")
  writeFileSync(file, JSON.stringify({
    task: { name: example, options },
    output: join(dir, "run"),
    model: { path: join(dir, "model"), preset: "tiny" },
    data: { train: "train.jsonl" },
    algorithm: { steps: 1 }
  }))
  return Setup.load(file).pipe(Effect.provide(NodeServices.layer))
}

/** Bisection over 1…15 from the game's answers (as the README's oracle). */
const bisect: Oracle.Policy = (messages: ReadonlyArray<Message.Message>) => {
  let [lo, hi] = [1, 15]
  for (const [i, m] of messages.entries()) {
    const call = m.role === "assistant" ? m.tool_calls?.[0] : undefined
    const n = Number((call?.function.arguments as { n?: number } | undefined)?.n ?? NaN)
    const said = Oracle.text(messages.slice(i + 1).find((later) => later.role === "user"))
    if (!Number.isNaN(n)) [lo, hi] = said.startsWith("Higher") ? [n + 1, hi] : [lo, n - 1]
  }
  return { toolCalls: [Oracle.call(messages, "guess", { n: Math.floor((lo + hi) / 2) })] }
}

describe("examples/guess/options.ts", () => {
  it.effect("a config's options make the task: the reward's format weight and the episode's turns", () =>
    Effect.gen(function*() {
      const plain = yield* load({})
      assert.strictEqual(plain.task.reward?.name, "found + 0.2·format")
      assert.strictEqual(plain.config.agent.maxTurns, 5)
      const set = yield* load({ formatWeight: 0, maxTurns: 7 })
      assert.strictEqual(set.task.reward?.name, "found")
      assert.strictEqual(set.config.agent.maxTurns, 7)
    }))

  it.effect("bad options stop the run before it starts, naming the key (and the key meant)", () =>
    Effect.gen(function*() {
      const misspelt = yield* Effect.flip(load({ formatWieght: 0 }))
      assert.include(misspelt.message, "formatWieght")
      assert.include(misspelt.message, "formatWeight")
      const range = yield* Effect.flip(load({ maxTurns: 0 }))
      assert.include(range.message, "maxTurns")
    }))

  it.effect("the oracle wins every game through the options' task; without the format term the reward is the win", () =>
    Effect.gen(function*() {
      const made = yield* task({ formatWeight: 0 })
      const rows = Array.from({ length: 15 }, (_, i) => ({ question: "Find my number from 1 to 15.", secret: i + 1 }))
      const games = yield* Oracle.rollout({ task: made, rows, policy: bisect })
      assert.strictEqual(Oracle.solveRate(games), 1)
      assert.isTrue(games.every((t) => t.reward === 1), `${games.map((t) => t.reward)}`)
    }))
})
