/**
 * Scripted players of the chess task, run by the rollout machinery (`Oracle.rollout`) through the same tools and
 * episode as a model:
 *
 * - {@link forRows}: the oracle of `agentfly oracle` and of the demonstrations: plays each row's own solution line
 *   (Lichess's puzzles have one: the line is the answer key), looked up by the position the environment showed, so
 *   it solves every row whose line replays, mates and non-mates of any length, through the same tools and episode
 *   as a model; a position that no row's line reaches falls back to {@link oracle}'s search;
 * - {@link oracle}: reads the latest position (`FEN: …`) the environment showed and searches it: a mate in one,
 *   else the first move of a forced mate in two (`Puzzle.matesInTwo`). It never reads a row, so solving a
 *   generated puzzle proves it solvable from what the agent sees (for a generated puzzle both oracles play the same
 *   moves: its line *is* the search's);
 * - {@link noise}: a legal move drawn at random (seeded by the position): the baseline that must score ≈ 0.
 *
 * @since 0.1.0
 */
import { Chess } from "chess.js"
import * as Oracle from "../../actors/Oracle.ts"
import type { Conversation } from "../../src/Message.ts"
import * as Sampling from "../../src/Sampling.ts"
import * as Puzzle from "./Puzzle.ts"

/**
 * The latest position shown in the conversation (the opening or a move's answer), or `undefined`.
 *
 * @category getters
 * @since 0.1.0
 */
export const latestFen = (messages: Conversation): string | undefined => {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i]!
    if (m.role === "assistant" || m.role === "system") continue
    const found = /FEN: (\S+ [wb] \S+ \S+ \d+ \d+)/.exec(Oracle.text(m))
    if (found !== null) return found[1]
  }
  return undefined
}

const hash = (text: string): number => {
  let h = 2166136261
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619)
  return h >>> 0
}

/**
 * The oracle's move in a position: a mate in one, else a mate in two's first move, else `undefined`.
 *
 * @category getters
 * @since 0.1.0
 */
export const solve = (fen: string): string | undefined => {
  const chess = new Chess(fen)
  return Puzzle.matesInOne(chess)[0] ?? Puzzle.matesInTwo(chess)[0]
}

/**
 * The oracle with a share `look` of its puzzles (drawn by the position) started by listing the legal moves
 * (`legal {}`) before the first move: variety for demonstrations. `look` 0 is {@link oracle}.
 *
 * @category constructors
 * @since 0.1.0
 */
export const oracleWith = (options: { readonly look: number }): Oracle.Policy => policyOf(solve, options.look)

/** A policy playing `moveOf` the latest position, after a look at the legal moves in a share `look` of puzzles. */
const policyOf = (moveOf: (fen: string) => string | undefined, look: number): Oracle.Policy => (messages) => {
  const fen = latestFen(messages)
  if (fen === undefined) return { content: "I see no position." }
  const first = !messages.some((m) => m.role === "assistant")
  if (first && look > 0 && Sampling.mulberry32(hash(fen))() < look) {
    return { toolCalls: [Oracle.call(messages, "legal", {})] }
  }
  const found = moveOf(fen)
  return found === undefined
    ? { content: "I see no mate." }
    : { toolCalls: [Oracle.call(messages, "move", { m: found })] }
}

/**
 * The solver's moves of rows by the position the solver faces (the full FEN after the opponent's first move and
 * after each of its replies), in SAN. Two rows reaching the same position with different moves keep the first
 * row's (Lichess keeps one solution a position, so real files do not differ there).
 *
 * @category constructors
 * @since 0.1.0
 */
export const lineMoves = (rows: ReadonlyArray<Pick<Puzzle.Row, "fen" | "moves">>): ReadonlyMap<string, string> => {
  const moves = new Map<string, string>()
  for (const row of rows) {
    if (Puzzle.replay(row.fen, row.moves) !== undefined) continue
    const chess = new Chess(row.fen)
    for (const [k, uci] of row.moves.entries()) {
      const fen = chess.fen()
      const san = chess.move(uci).san
      if (k % 2 === 1 && !moves.has(fen)) moves.set(fen, san)
    }
  }
  return moves
}

/**
 * The oracle of rows: each row's own solution line, by the latest position shown ({@link lineMoves}); elsewhere the
 * search of {@link oracle}. `look` as in {@link oracleWith}.
 *
 * @category constructors
 * @since 0.1.0
 */
export const forRows = (
  rows: ReadonlyArray<Pick<Puzzle.Row, "fen" | "moves">>,
  options: { readonly look?: number | undefined } = {}
): Oracle.Policy => {
  const moves = lineMoves(rows)
  return policyOf((fen) => moves.get(fen) ?? solve(fen), options.look ?? 0)
}

/**
 * The oracle: the searched move through `move`, or no call (the turn ends the episode) when it finds none.
 *
 * @category constructors
 * @since 0.1.0
 */
export const oracle: Oracle.Policy = oracleWith({ look: 0 })

/**
 * A random legal move, the same for the same position.
 *
 * @category constructors
 * @since 0.1.0
 */
export const noise: Oracle.Policy = (messages) => {
  const fen = latestFen(messages)
  if (fen === undefined) return { content: "?" }
  const moves = new Chess(fen).moves()
  const move = moves[Math.floor(Sampling.mulberry32(hash(fen))() * moves.length)]!
  return { toolCalls: [Oracle.call(messages, "move", { m: move })] }
}
