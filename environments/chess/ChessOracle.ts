/**
 * Scripted players of the chess task, run by the rollout machinery (`Oracle.rollout`) through the same tools and
 * episode as a model:
 *
 * - {@link oracle}: reads the latest position (`FEN: …`) the environment showed and searches it: a mate in one,
 *   else the first move of a forced mate in two (`Puzzle.matesInTwo`). It never reads the row's solution, so
 *   solving a puzzle proves it solvable from what the agent sees, and the reward right;
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
export const oracleWith = (options: { readonly look: number }): Oracle.Policy => (messages) => {
  const fen = latestFen(messages)
  if (fen === undefined) return { content: "I see no position." }
  const first = !messages.some((m) => m.role === "assistant")
  if (first && options.look > 0 && Sampling.mulberry32(hash(fen))() < options.look) {
    return { toolCalls: [Oracle.call(messages, "legal", {})] }
  }
  const found = solve(fen)
  return found === undefined
    ? { content: "I see no mate." }
    : { toolCalls: [Oracle.call(messages, "move", { m: found })] }
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
