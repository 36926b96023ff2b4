/**
 * Chess puzzles: the seeded generator writes unique mates in one and two (checked here with `chess.js` alone, not
 * with the generator's own search), a Lichess CSV reads and replays (a bad line is refused with its number), and
 * the board follows Lichess's rules: the line's move or any mate is right, another legal move fails the puzzle, a
 * move that is not legal is refused and the puzzle goes on, partial credit for a longer puzzle failed late.
 */
import { assert, describe, it } from "@effect/vitest"
import { Chess } from "chess.js"
import * as Board from "../../../environments/chess/Board.ts"
import * as Puzzle from "../../../environments/chess/Puzzle.ts"

const puzzles = Puzzle.generate({ seed: 11, count: 24, mateIn2Share: 0.4 })

/** Every legal move of the side to move, played and taken back: the SANs whose position is checkmate. */
const mating = (chess: Chess) =>
  chess.moves().filter((san) => {
    chess.move(san)
    const mate = chess.isCheckmate()
    chess.undo()
    return mate
  })

/** Lichess's own sample line (database.lichess.org): a 3-move "crushing" puzzle, not a mate. */
const lichessSample = "00008,r6k/pp2r2p/4Rp1Q/3p4/8/1N1P2R1/PqP2bPP/7K b - - 0 24,f2g3 e6e7 b2b1 b3c1 b1c1 h6c1,1913," +
  "75,94,6230,crushing hangingPiece long middlegame,https://lichess.org/787zsVup/black#48,"

describe("chess puzzles", () => {
  it("the generator is seeded and writes distinct positions of both kinds", () => {
    assert.deepStrictEqual(Puzzle.generate({ seed: 11, count: 24, mateIn2Share: 0.4 }), puzzles)
    assert.notDeepEqual(Puzzle.generate({ seed: 12, count: 6 }), puzzles.slice(0, 6))
    assert.strictEqual(new Set(puzzles.map((p) => p.fen)).size, puzzles.length)
    const twos = puzzles.filter((p) => p.themes?.[0] === "mateIn2")
    assert.strictEqual(twos.length, Math.round(24 * 0.4))
    for (const p of puzzles) {
      assert.strictEqual(p.question, p.themes?.[0] === "mateIn2" ? "Mate in 2." : "Mate in 1.")
      assert.strictEqual(p.moves.length, p.themes?.[0] === "mateIn2" ? 4 : 2)
    }
  })

  it("a mate in one has exactly one mating move, the line's; a mate in two has one key, and every reply loses", () => {
    for (const p of puzzles) {
      const chess = new Chess(p.fen)
      chess.move(p.moves[0]!)
      if (p.moves.length === 2) {
        const mates = mating(chess)
        assert.lengthOf(mates, 1, p.fen)
        assert.strictEqual(chess.move(mates[0]!).lan, p.moves[1])
        continue
      }
      assert.lengthOf(mating(chess), 0, `${p.puzzleId}: no mate in one`)
      const keys = chess.moves().filter((first) => {
        chess.move(first)
        const replies = chess.moves()
        const forced = replies.length > 0 && replies.every((reply) => {
          chess.move(reply)
          const ok = mating(chess).length > 0
          chess.undo()
          return ok
        })
        chess.undo()
        return forced
      })
      assert.lengthOf(keys, 1, `${p.puzzleId}: one key`)
      assert.strictEqual(chess.move(keys[0]!).lan, p.moves[1])
      chess.move(p.moves[2]!)
      chess.move(p.moves[3]!)
      assert.isTrue(chess.isCheckmate(), `${p.puzzleId}: the line ends in mate`)
    }
  })

  it("reads Lichess's CSV: header skipped, every line replayed, a bad line refused with its number", () => {
    const header = "PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,GameUrl,OpeningTags"
    const rows = Puzzle.fromLichessCsv(`${header}\n${lichessSample}\n`)
    assert.isArray(rows)
    const [row] = rows as Array<Puzzle.Line>
    assert.strictEqual(row!.puzzleId, "00008")
    assert.deepStrictEqual(row!.moves, ["f2g3", "e6e7", "b2b1", "b3c1", "b1c1", "h6c1"])
    assert.strictEqual(row!.rating, 1913)
    assert.deepStrictEqual(row!.themes, ["crushing", "hangingPiece", "long", "middlegame"])
    assert.strictEqual(row!.question, "Find the best 3 moves.")
    const illegal = Puzzle.fromLichessCsv(`${header}\n${lichessSample}\n${lichessSample.replace("e6e7", "e6e9")}`)
    assert.instanceOf(illegal, Puzzle.PuzzleError)
    assert.strictEqual((illegal as Puzzle.PuzzleError).line, 3)
    assert.match((illegal as Puzzle.PuzzleError).message, /^00008: move 2 \(e6e9\) is not legal/)
    const badFen = Puzzle.fromLichessCsv("x1,not a fen,e2e4 e7e5,1500")
    assert.match((badFen as Puzzle.PuzzleError).message, /^x1: bad FEN "not a fen"/)
  })

  it(
    "the board: the line's move is right and the reply comes at once; a wrong legal move fails; partial credit",
    () => {
      const row = (Puzzle.fromLichessCsv(lichessSample) as Array<Puzzle.Line>)[0]!
      const settings = Board.defaultSettings
      // A line of three moves gets 7 actions by default (`Board.limits`); 6 here, as the task option sets it.
      assert.strictEqual((Board.start(row) as { state: Board.State }).state.maxSteps, 7)
      const started = Board.start(row, "board", 6)
      assert.isObject(started)
      const { state, text } = started as { state: Board.State; text: string }
      assert.match(
        text,
        /^Black played Bxg3\. White to move\.\nFEN: r6k\/pp2r2p\/4Rp1Q\/3p4\/8\/1N1P2b1\/PqP3PP\/7K w /
      )
      // Not legal, not understood, empty: refused, counted, the puzzle goes on.
      for (const m of ["Ke9", "castle", "", "e2e4"]) {
        const refused = Board.act(state, settings, { _tag: "move", move: m })
        assert.isFalse(refused.ok, m)
      }
      assert.strictEqual(state.refused, 4)
      assert.isUndefined(Board.ended(state, settings))
      const first = Board.act(state, settings, { _tag: "move", move: "Rxe7" })
      assert.deepStrictEqual(first.ok, true)
      assert.match((first as { text: string }).text, /^Rxe7 is right\. Black played Qb1\+\. White to move\./)
      const wrong = Board.act(state, settings, { _tag: "move", move: "Kh2" })
      assert.isFalse(wrong.ok, "Kh2 walks into a pawn while in check: refused, the sixth action")
      assert.strictEqual(Board.ended(state, settings), "out_of_steps")
      assert.closeTo(Board.score(state), 0.5 * (1 / 3), 1e-12)

      const again = (Board.start(row) as { state: Board.State }).state
      Board.act(again, settings, { _tag: "move", move: "e6e7" })
      const failed = Board.act(again, settings, { _tag: "move", move: "Qc1" })
      assert.isTrue(failed.ok)
      assert.match((failed as { text: string }).text, /^Qc1 is wrong: the solution was Nc1\. Puzzle failed\./)
      assert.strictEqual(Board.ended(again, settings), "failed")
      assert.isFalse(Board.act(again, settings, { _tag: "move", move: "Nc1" }).ok, "nothing after the end")

      const solved = (Board.start(row) as { state: Board.State }).state
      for (const m of ["Rxe7", "Nc1", "Qxc1+"]) Board.act(solved, settings, { _tag: "move", move: m })
      assert.strictEqual(Board.ended(solved, settings), "solved")
      assert.strictEqual(Board.score(solved), 1)
    }
  )

  it("any mate is right, as on Lichess, and a bad row is refused at the start", () => {
    // After a6, White mates with Qd8# or Re8#: the line lists one, the other is right too.
    const fen = "6k1/p4ppp/8/8/8/8/5PPP/3QR1K1 b - - 0 1"
    const row = { fen, moves: ["a7a6", "d1d8"] }
    const { state } = Board.start(row) as { state: Board.State }
    const other = Board.act(state, Board.defaultSettings, { _tag: "move", move: "Re8#" })
    assert.isTrue(other.ok)
    assert.strictEqual(Board.ended(state, Board.defaultSettings), "solved")
    assert.match(String(Board.start({ fen: "8/8", moves: ["a1a2", "a2a3"] })), /^bad FEN "8\/8"/)
    assert.match(String(Board.start({ fen, moves: ["a1a2", "d1d8"] })), /opponent's move a1a2 is not legal/)
  })
})
