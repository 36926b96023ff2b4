/**
 * The chess task through the rollout runtime (`Oracle.rollout`: `Rollout.runTaskChat` with the task's own tools,
 * per-chain boards, episode and reward; Qwen2.5's template on the byte-level tokenizer): the oracle, which searches
 * only the positions it is shown, solves every held-out puzzle; random legal moves score ≈ 0; malformed and refused
 * actions come back as typed error observations while the episode goes on; a Lichess puzzle of three moves is
 * played through with the opponent's replies, and a miss earns partial credit; 64 concurrent chains never see each
 * other's boards; no board outlives its chain. The task resolves by name with options.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema, Stream } from "effect"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Rollout from "../../../actors/Rollout.ts"
import * as TaskRuntime from "../../../actors/TaskRuntime.ts"
import { readFileSync } from "node:fs"
import * as Board from "../../../environments/chess/Board.ts"
import * as ChessOracle from "../../../environments/chess/ChessOracle.ts"
import * as ChessTask from "../../../environments/chess/ChessTask.ts"
import * as Puzzle from "../../../environments/chess/Puzzle.ts"
import * as Tasks from "../../../environments/Tasks.ts"
import type { Conversation } from "../../../src/Message.ts"
import * as Task from "../../../src/Task.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"

const heldOut =
  Puzzle.splits({ seed: 5, mateIn2Share: 0.3 }, { train: 0, heldOut: 64, validation: 0, demos: 0 }).heldOut
const task = ChessTask.make()

const tools = (t: Trajectory.Trajectory) => t.messages.filter((m) => m.role === "tool").map(Oracle.text)

/** A policy that plays a fixed list of calls, then stops. */
const scripted = (script: ReadonlyArray<readonly [string, Record<string, unknown>]>) => (messages: Conversation) => {
  const step = script[messages.filter((m) => m.role === "assistant").length]
  return step === undefined ? { content: "done" } : { toolCalls: [Oracle.call(messages, step[0], step[1])] }
}

const lichess = (Puzzle.fromLichessCsv(
  "00008,r6k/pp2r2p/4Rp1Q/3p4/8/1N1P2R1/PqP2bPP/7K b - - 0 24,f2g3 e6e7 b2b1 b3c1 b1c1 h6c1,1913,75,94,6230," +
    "crushing hangingPiece long middlegame,https://lichess.org/787zsVup/black#48,"
) as Array<Puzzle.Line>)

/** The shipped sample of real Lichess rows (mates in one to five, non-mate lines of up to seven moves). */
const sample = Puzzle.fromLichessCsv(
  readFileSync(new URL("../../../examples/chess/lichess-sample.csv", import.meta.url), "utf8")
) as Array<Puzzle.Line>

describe("chess task to the end of the line", () => {
  it.effect("the oracle plays each row's own line: 100 % of the shipped Lichess sample, whatever its theme", () =>
    Effect.gen(function*() {
      assert.lengthOf(sample, 239)
      const longest = ChessTask.longestLine(sample)
      assert.strictEqual(longest, 7)
      const fitted = ChessTask.make({ view: "fen", longestLine: longest })
      const played = yield* Oracle.rollout({ task: fitted, rows: sample, policy: ChessOracle.forRows(sample) })
      const missed = played.flatMap((t, i) => (t.episodeEnd === "solved" ? [] : [`${sample[i]!.puzzleId}`]))
      assert.deepStrictEqual(missed, [])
      assert.strictEqual(Oracle.solveRate(played), 1)
      // Non-mates end when the line does; the row's own moves were played, the last one solving it.
      const i = sample.findIndex((row) => !(row.themes ?? []).includes("mate") && row.moves.length >= 9)
      assert.strictEqual(played[i]!.metrics["reward/chess/correct"], Board.rowSolverMoves(sample[i]!))
      // The search alone (mates in one and two) misses the long and the non-mate rows: the line is the key.
      const searched = yield* Oracle.rollout({ task: fitted, rows: sample, policy: ChessOracle.oracle })
      assert.isBelow(Oracle.solveRate(searched), 0.6)
    }), { timeout: 900_000 })

  it.effect("on generated puzzles the line oracle is 100 % and plays the search oracle's very moves", () =>
    Effect.gen(function*() {
      const byLine = yield* Oracle.rollout({ task, rows: heldOut, policy: ChessOracle.forRows(heldOut) })
      const bySearch = yield* Oracle.rollout({ task, rows: heldOut, policy: ChessOracle.oracle })
      assert.strictEqual(Oracle.solveRate(byLine), 1)
      assert.deepStrictEqual(byLine.map((t) => t.messages), bySearch.map((t) => t.messages))
    }), { timeout: 900_000 })

  it("default limits follow the line: a mate in one or two keeps 6 steps and 4 turns; a longer line gets more", () => {
    assert.deepStrictEqual([1, 2].map(Board.limits), [{ maxSteps: 6, maxTurns: 4 }, { maxSteps: 6, maxTurns: 4 }])
    assert.deepStrictEqual(Board.limits(5), { maxSteps: 9, maxTurns: 7 })
    const long = sample.find((row) => Board.rowSolverMoves(row) === 6)!
    const started = Board.start(long) as { state: Board.State }
    assert.strictEqual(started.state.maxSteps, 10)
    assert.strictEqual((Board.start(long, "board", 3) as { state: Board.State }).state.maxSteps, 3, "option wins")
    assert.deepStrictEqual(ChessTask.defaults("fen"), ChessTask.defaults("fen", 2), "longestLine defaults to 2")
    assert.strictEqual(ChessTask.defaults("fen").maxTurns, 4)
    assert.strictEqual(ChessTask.defaults("fen").maxContextTokens, 512)
    assert.strictEqual(ChessTask.defaults("board").maxContextTokens, 2048)
    assert.deepStrictEqual(
      [ChessTask.defaults("fen", 7).maxTurns, ChessTask.defaults("fen", 7).maxContextTokens],
      [9, 2048]
    )
    assert.strictEqual(ChessTask.defaults("board", 7).maxContextTokens, 4096)
  })

  it.effect("a line of six moves is solvable under its derived limits, and cut by a mate in two's turn budget", () =>
    Effect.gen(function*() {
      const long = sample.filter((row) => Board.rowSolverMoves(row) === 6).slice(0, 3)
      const cut = yield* Oracle.rollout({ task, rows: long, policy: ChessOracle.forRows(long) })
      assert.isTrue(cut.every((t) => t.termination === "max_turns" && t.reward < 1), "4 turns cannot hold 6 moves")
      const fitted = ChessTask.make({ longestLine: 6 })
      const played = yield* Oracle.rollout({ task: fitted, rows: long, policy: ChessOracle.forRows(long) })
      assert.deepStrictEqual(played.map((t) => t.episodeEnd), ["solved", "solved", "solved"])
    }), { timeout: 900_000 })
})

describe("chess task", () => {
  it.effect("the oracle solves every held-out puzzle (mates in one and two) from what it is shown", () =>
    Effect.gen(function*() {
      const played = yield* Oracle.rollout({ task, rows: heldOut, policy: ChessOracle.oracle })
      assert.strictEqual(played.length, 64)
      assert.strictEqual(Oracle.solveRate(played), 1)
      for (const [i, t] of played.entries()) {
        assert.strictEqual(t.termination, "episode_end")
        assert.strictEqual(t.episodeEnd, "solved")
        assert.strictEqual(t.metrics["reward/chess/solved"], 1)
        // 64 chains ran at once: each was shown its own puzzle, and its moves were its own line's (or mates).
        const opening = Oracle.text(t.messages[2])
        const board = new (yield* Effect.promise(() => import("chess.js"))).Chess(heldOut[i]!.fen)
        board.move(heldOut[i]!.moves[0]!)
        assert.include(opening, `FEN: ${board.fen()}`)
        assert.strictEqual(t.metrics["reward/chess/steps"], heldOut[i]!.moves.length / 2)
        assert.match(tools(t).at(-1)!, /#: checkmate, puzzle solved\.$/)
      }
    }), { timeout: 240_000 })

  it.effect("the oracle that lists the legal moves first (the generator's NOISE) solves every puzzle too", () =>
    Effect.gen(function*() {
      const rows = heldOut.slice(0, 16)
      const played = yield* Oracle.rollout({ task, rows, policy: ChessOracle.oracleWith({ look: 1 }) })
      assert.strictEqual(Oracle.solveRate(played), 1)
      for (const [i, t] of played.entries()) {
        assert.match(tools(t)[0]!, /^Legal moves: /)
        assert.strictEqual(t.metrics["reward/chess/steps"], 1 + rows[i]!.moves.length / 2)
      }
    }), { timeout: 900_000 })

  it.effect("random legal moves score ≈ 0", () =>
    Effect.gen(function*() {
      const played = yield* Oracle.rollout({ task, rows: heldOut, policy: ChessOracle.noise })
      assert.strictEqual(played.length, 64)
      const mean = played.reduce((a, t) => a + t.reward, 0) / played.length
      assert.isBelow(mean, 0.1, `mean reward ${mean}`)
      // A random legal move is the one mate of a mate in one with a chance of 1 in the number of legal moves (≈ 30).
      assert.isAtMost(Oracle.solveRate(played), 0.1)
      assert.isTrue(played.some((t) => t.episodeEnd === "failed"), "wrong moves fail the puzzle")
    }), { timeout: 900_000 })

  it.effect(
    "malformed and refused actions are typed error observations; the episode goes on",
    () =>
      Effect.gen(function*() {
        const row = heldOut.find((p) => p.moves.length === 2)!
        const policy = scripted([
          ["castle", {}],
          ["move", { move: "e4" }],
          ["move", { m: "Ke9" }],
          ["legal", {}]
        ])
        const [t] = yield* Oracle.rollout({ task: ChessTask.make({ maxSteps: 8 }), rows: [row], policy })
        const seen = tools(t!)
        assert.lengthOf(seen, 4)
        assert.match(seen[0]!, /^Error: unknown tool "castle"/)
        assert.match(seen[1]!, /^Error: invalid arguments for tool "move"/)
        assert.match(seen[2]!, /^Error: Ke9 is not a legal move for (White|Black) \(legal lists the legal moves\)/)
        assert.match(seen[3]!, /^Legal moves: /)
        assert.deepStrictEqual(t!.messages.filter((m) => m.role === "tool").map((m) => m.is_error === true), [
          true,
          true,
          true,
          false
        ])
        // The script ran out after four turns (maxTurns 4): nothing was solved, nothing failed.
        assert.strictEqual(t!.termination, "max_turns")
        assert.strictEqual(t!.reward, 0)
        assert.strictEqual(t!.metrics["reward/chess/refused"], 1)
        assert.strictEqual(t!.metrics["reward/chess/steps"], 2, "format errors never reached the board")
      }),
    { timeout: 300_000 }
  )

  it.effect(
    "a Lichess puzzle of three moves: the replies are played; a miss after one right move earns 1/6",
    () =>
      Effect.gen(function*() {
        const lichessTask = ChessTask.make()
        const [solved] = yield* Oracle.rollout({
          task: lichessTask,
          rows: lichess,
          policy: scripted([["move", { m: "Rxe7" }], ["move", { m: "b3c1" }], ["move", { m: "Qxc1+" }]])
        })
        assert.strictEqual(solved!.reward, 1)
        assert.strictEqual(solved!.episodeEnd, "solved")
        assert.deepStrictEqual(tools(solved!).map((o) => o.split(".")[0]), [
          "Rxe7 is right",
          "Nc1 is right",
          "Qxc1: puzzle solved"
        ])
        assert.match(tools(solved!)[0]!, /Black played Qb1\+\. White to move\.\nFEN: \S+/)
        const [missed] = yield* Oracle.rollout({
          task: lichessTask,
          rows: lichess,
          policy: scripted([["move", { m: "Rxe7" }], ["move", { m: "Qc1" }]])
        })
        assert.strictEqual(missed!.episodeEnd, "failed")
        assert.closeTo(missed!.reward, 1 / 6, 1e-12)
        assert.strictEqual(missed!.metrics["reward/chess/correct"], 1)
      }),
    { timeout: 300_000 }
  )

  it.effect(
    "no board outlives its chain: every chain's board is closed when it ends or is interrupted",
    () =>
      Effect.gen(function*() {
        const runtime = yield* TaskRuntime.make(task, { renderTools: false })
        const rows = heldOut.slice(0, 40).map((row) => ({
          ...row,
          messages: [
            { role: "system" as const, content: ChessTask.systemPrompt },
            { role: "user" as const, content: row.question }
          ]
        }))
        const options = {
          rows,
          numChains: 1,
          maxTurns: 4,
          maxContextTokens: 2048,
          maxConcurrentChains: 16,
          sampling: { temperature: 1, maxTokens: 48, seed: 1 },
          format: Oracle.byteFormat(),
          tools: runtime.tools,
          reward: runtime.reward,
          environment: runtime.environment,
          episode: runtime.episode
        }
        const events = yield* Stream.runCollect(Rollout.runChat(options))
        assert.strictEqual(events.filter((e) => e._tag === "Trajectory").length, 40)
        // The start check's probe chain is the one extra board.
        assert.deepStrictEqual(yield* runtime.environmentStats, { "env/chess/boards": 41, "env/chess/open": 0 })
        yield* Stream.runCollect(Stream.take(Rollout.runChat(options), 5))
        const after = yield* runtime.environmentStats
        assert.isAbove(after["env/chess/boards"]!, 46)
        assert.strictEqual(after["env/chess/open"], 0)
      }).pipe(Effect.provide(Oracle.layer(ChessOracle.oracle))),
    { timeout: 300_000 }
  )

  it.effect("resolves as the built-in task chess, with options checked strictly; bad rows are refused on load", () =>
    Effect.gen(function*() {
      const resolve = (ref: Task.Ref) => Task.resolve(ref, { builtins: Tasks.builtins, resolvePath: (p) => p })
      const named = yield* resolve({ name: "chess", options: { view: "fen", toolCallFormat: 0.2 } })
      assert.strictEqual(named.name, "chess")
      assert.strictEqual(named.reward?.name, "chess + 0.2·toolCallFormat")
      assert.deepStrictEqual(named.tools.map((t) => t.name), ["move", "legal", "board"])
      assert.strictEqual(named.defaults.maxContextTokens, 512)
      assert.strictEqual((yield* resolve("chess")).defaults.maxContextTokens, 2048)
      const refused = (options: Record<string, unknown>) =>
        Effect.map(Effect.flip(resolve({ name: "chess", options })), (e) => e.reason._tag)
      assert.strictEqual(yield* refused({ view: "ascii" }), "Options")
      assert.strictEqual(yield* refused({ maxSteps: 0 }), "Options")
      const decode = Schema.decodeUnknownEffect(ChessTask.Row)
      const good = heldOut[0]!
      assert.deepStrictEqual((yield* decode(good)).moves, good.moves)
      const bad = yield* Effect.flip(decode({ ...good, moves: [good.moves[0], "a1a8"] }))
      assert.match(bad.message, /move 2 \(a1a8\) is not legal/)
    }))
})
