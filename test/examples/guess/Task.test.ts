/**
 * The guess-the-number task through the real rollout machinery (`Rollout.runTask`, the byte-level tokenizer and the
 * Qwen2.5 template with Hermes tool calls): an oracle policy that reads the game's answers from its prompt and
 * bisects wins every held-out game within the guesses allowed; a policy that guesses at random rarely does; the
 * game speaks in `env` spans that are never trained on, ends episodes with a reason, and keeps one state per chain.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Stream } from "effect"
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as Rollout from "../../../actors/Rollout.ts"
import * as Generate from "../../../examples/guess/generate.ts"
import * as Oracle from "../../../actors/Oracle.ts"
import { maxGuesses, oracle as bisect, task } from "../../../examples/guess/task.ts"
import * as ByteTokenizer from "../../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../../src/ChatTemplate.ts"
import * as Sampler from "../../../src/Sampler.ts"
import * as Sampling from "../../../src/Sampling.ts"
import * as Tokenizer from "../../../src/Tokenizer.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"

const tokenizer = Effect.runSync(Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig("")))
const format = ChainFormat.fromTemplate({ tokenizer, template: ChatTemplate.builtinTemplate("qwen2.5") })
const call = (n: number) =>
  tokenizer.encode(`<tool_call>\n{"name": "guess", "arguments": {"n": ${n}}}\n</tool_call><|im_end|>`)

/** The oracle: bisects 1…15 using the answers ("Higher." / "Lower.") the game gave so far, read from the prompt. */
const oracle = (request: Sampler.GenerateRequest) => {
  const prompt = tokenizer.decode([...request.promptTokenIds])
  const guesses = [...prompt.matchAll(/"n": (\d+)/g)].map((m) => Number(m[1]))
  const answers = [...prompt.matchAll(/(Higher|Lower)\./g)].map((m) => m[1])
  let lo = 1
  let hi = 15
  guesses.forEach((g, i) => (answers[i] === "Higher" ? (lo = g + 1) : (hi = g - 1)))
  return call(Math.floor((lo + hi) / 2))
}

/** A policy that guesses uniformly at random, seeded per request. */
const noise = (request: Sampler.GenerateRequest) =>
  call(1 + Math.floor(Sampling.mulberry32(request.sampling.seed ?? 0)() * 15))

const rollout = (
  policy: (r: Sampler.GenerateRequest) => Array<number>,
  rows: ReadonlyArray<Rollout.TaskRow>,
  numChains = 1
) =>
  Rollout.runTask({
    task,
    rows,
    numChains,
    maxTurns: 6,
    sampling: { temperature: 1, maxTokens: 48, seed: 5 },
    format
  }).pipe(
    Stream.runCollect,
    Effect.map((events) => events.flatMap((e) => (e._tag === "Trajectory" ? [e.trajectory] : []))),
    Effect.provide(Sampler.layerScripted(policy))
  )

const heldOut = Effect.gen(function*() {
  const dir = mkdtempSync(join(tmpdir(), "guess-"))
  yield* Generate.write({ ...Generate.defaults, dir, train: 10, heldOut: 120, validation: 1, demos: 20 }, "Find it.")
  return readFileSync(join(dir, "heldout.jsonl"), "utf8").trim().split("\n").map((l) =>
    JSON.parse(l) as Rollout.TaskRow
  )
}).pipe(Effect.provide(NodeServices.layer))

const won = (t: Trajectory.Trajectory) => t.metrics["reward/found/acc"] === 1
const wins = (ts: ReadonlyArray<Trajectory.Trajectory>) => ts.filter(won).length / ts.length

describe("guess the number", () => {
  it.effect("the oracle wins every held-out game within the guesses allowed; random guessing rarely does", () =>
    Effect.gen(function*() {
      const rows = yield* heldOut
      const solved = yield* rollout(oracle, rows)
      assert.strictEqual(wins(solved), 1)
      assert.isTrue(solved.every((t) => t.termination === "episode_end" && t.episodeEnd === "solved"))
      assert.isTrue(solved.every((t) => t.metrics["reward/found/guesses"]! <= maxGuesses))
      const random = yield* rollout(noise, rows)
      assert.isBelow(wins(random), 0.5, "4 random guesses of 15 find the number at most 4/15 of the time, plus repeats")
      assert.isTrue(random.filter((t) => !won(t)).every((t) => t.episodeEnd === "out_of_guesses"))
      // Every call was well formed: the reward is the win plus the whole format term.
      assert.isTrue(solved.every((t) => Math.abs(t.reward - 1.2) < 1e-9), `${solved.map((t) => t.reward)}`)
    }))

  it.effect("the game speaks in env spans (masked); every chain has its own game, reset with its row", () =>
    Effect.gen(function*() {
      // Two rows, 3 chains each: chain k of a row bisects, so all of them win, each against its own row's secret.
      const trajectories = yield* rollout(oracle, [{ question: "Guess my number.", secret: 3 }, {
        question: "Guess my number.",
        secret: 14
      }], 3)
      assert.strictEqual(trajectories.length, 6)
      for (const t of trajectories) {
        assert.isTrue(won(t))
        const env = t.segments.flatMap((s) => s.spans.filter((span) => span.source === "env"))
        // Spans are cut at the template's special tokens: the role name before a message is in the same piece.
        const said = env.map((span) => tokenizer.decode([...span.tokenIds]).replace(/^user\n/, "")).join("")
        // secret 3: 8 → Lower, 4 → Lower, 2 → Higher, 3; secret 14: 8 → Higher, 12 → Higher, 14.
        assert.strictEqual(said, t.row?.["secret"] === 3 ? "Lower.Lower.Higher." : "Higher.Higher.")
        assert.isFalse(
          t.segments.some((s) => s.spans.some((span) => span.source === "env" && span.logprobs !== undefined))
        )
      }
    }))

  it.effect("a row whose secret is out of range is refused before any chain starts", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(rollout(oracle, [{ question: "Guess my number.", secret: 99 }]))
      assert.strictEqual(error._tag, "DatasetError")
      assert.include(error.message, "rows[0]: ")
    }))

  it.effect("the module's own oracle (what agentfly oracle plays) solves every secret from 1 to 15", () =>
    Effect.gen(function*() {
      const rows = Array.from({ length: 15 }, (_, i) => ({ question: "Find my number.", secret: i + 1 }))
      const games = yield* Oracle.rollout({ task, rows, policy: bisect })
      assert.strictEqual(games.length, 15)
      assert.strictEqual(Oracle.solveRate(games), 1, games.map((t) => t.episodeEnd).join(","))
      assert.isTrue(games.every((t) => t.metrics["reward/found/guesses"]! <= maxGuesses))
    }))
})
