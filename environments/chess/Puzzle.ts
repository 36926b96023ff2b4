/**
 * Chess puzzles in Lichess's format, a seeded generator of them, and the small mate search both use.
 *
 * A puzzle is Lichess's (`lichess_db_puzzle.csv`): `fen` is the position *before* the opponent's last move, and
 * `moves` (UCI) starts with that move, then alternates the solver's moves and the opponent's replies. The solver
 * plays every other move from the second; any checkmating move is also right (Lichess accepts alternative mates).
 *
 * Nothing is downloaded: `generate` plays seeded random games (captures and checks drawn more often) and keeps the
 * positions whose side to move has a **unique** mate in one, or a unique first move of a forced mate in two (every
 * reply allows a mate), as Lichess keeps only puzzles with one solution. A user's own Lichess CSV reads with
 * {@link fromLichessCsv}. Rules, move generation and notation are `chess.js` (BSD-2-Clause), not ours.
 *
 * @since 0.1.0
 */
import { Chess } from "chess.js"
import { Schema } from "effect"
import * as Sampling from "../../src/Sampling.ts"

// ===== Models =====

/**
 * The fields of a puzzle row (`question` is the row's user message: "Mate in 2.").
 *
 * @category models
 * @since 0.1.0
 */
export const Row = Schema.Struct({
  /** Lichess's `PuzzleId`, or `g<seed>-<n>` for generated puzzles. */
  puzzleId: Schema.String,
  /** The position before the opponent's move (`moves[0]`). */
  fen: Schema.String,
  /** UCI moves: the opponent's move, then the solution line (solver, opponent, solver, ...). */
  moves: Schema.Array(Schema.String).check(Schema.isMinLength(2)),
  themes: Schema.optionalKey(Schema.Array(Schema.String)),
  rating: Schema.optionalKey(Schema.Number)
})
export type Row = typeof Row.Type

/**
 * A puzzle with its question, as a dataset line.
 *
 * @category models
 * @since 0.1.0
 */
export type Line = Row & { readonly question: string }

/**
 * The kinds the generator writes.
 *
 * @category models
 * @since 0.1.0
 */
export type Kind = "mateIn1" | "mateIn2"

// ===== Search =====

/**
 * The checkmating moves of the side to move (SAN; `chess.js` marks them with `#`).
 *
 * @category getters
 * @since 0.1.0
 */
export const matesInOne = (chess: Chess): Array<string> => chess.moves().filter((san) => san.endsWith("#"))

/**
 * The first moves of a forced mate in two: moves that do not mate at once, after which the opponent has a legal
 * reply and every reply allows a mate. Each candidate stops at its first reply without one.
 *
 * @category getters
 * @since 0.1.0
 */
export const matesInTwo = (chess: Chess): Array<string> => {
  const keys: Array<string> = []
  for (const first of chess.moves()) {
    if (first.endsWith("#")) continue
    chess.move(first)
    const replies = chess.moves()
    let forced = replies.length > 0
    for (const reply of replies) {
      chess.move(reply)
      const mates = matesInOne(chess).length
      chess.undo()
      if (mates === 0) {
        forced = false
        break
      }
    }
    chess.undo()
    if (forced) keys.push(first)
  }
  return keys
}

/**
 * The reply that leaves the fewest mates (the stubbornest defence; the first in `chess.js`'s order on a tie) and a
 * mate after it, once `key` was played. `undefined` when a reply has no mate (not a mate in two).
 *
 * @category getters
 * @since 0.1.0
 */
export const defence = (chess: Chess): { readonly reply: string; readonly mate: string } | undefined => {
  let best: { reply: string; mate: string; count: number } | undefined
  for (const reply of chess.moves()) {
    chess.move(reply)
    const mates = matesInOne(chess)
    chess.undo()
    if (mates.length === 0) return undefined
    if (best === undefined || mates.length < best.count) best = { reply, mate: mates[0]!, count: mates.length }
  }
  return best === undefined ? undefined : { reply: best.reply, mate: best.mate }
}

/** The UCI form of a SAN move in `chess`'s position (the move is not kept). */
const uci = (chess: Chess, san: string): string => {
  const move = chess.move(san)
  chess.undo()
  return move.lan
}

// ===== Generation =====

/**
 * Generator settings: how many puzzles, the share of mates in two, the seed.
 *
 * @category models
 * @since 0.1.0
 */
export interface Spec {
  readonly seed: number
  readonly count: number
  /** Share of mates in two (default 0.3); the rest are mates in one. */
  readonly mateIn2Share?: number | undefined
}

/**
 * The question a puzzle's row asks.
 *
 * @category getters
 * @since 0.1.0
 */
export const question = (row: Pick<Row, "themes" | "moves">): string => {
  const mate = row.themes?.find((t) => /^mateIn\d$/.test(t))
  if (mate !== undefined) return `Mate in ${mate.slice(6)}.`
  return row.moves.length <= 2 ? "Find the best move." : `Find the best ${Math.floor(row.moves.length / 2)} moves.`
}

/** A draw from an array. */
const pick = <A>(xs: ReadonlyArray<A>, next: () => number): A => xs[Math.floor(next() * xs.length)]!

/**
 * Seeded puzzles, distinct positions, in the order found. Random games from the initial position (a capture is
 * drawn with probability 0.35 and a check with 0.25 when there is one, so that games reach mating positions), each
 * of one kind drawn at random (`mateIn2Share`), one puzzle a game. From the 9th move on, a position where the side
 * to move can mate is a candidate: kept as a mate in one when it has exactly one mating move, or, two plies back,
 * as a mate in two when that position has exactly one first move of a forced mate in two. The same spec always
 * gives the same puzzles.
 *
 * @category constructors
 * @since 0.1.0
 */
export const generate = (spec: Spec): Array<Line> => {
  const next = Sampling.mulberry32(spec.seed)
  const share = spec.mateIn2Share ?? 0.3
  const wanted2 = Math.round(spec.count * share)
  const out: Array<Line> = []
  const seen = new Set<string>()
  let twos = 0
  while (out.length < spec.count) {
    // One kind a game, one puzzle a game: positions of one game are alike.
    const kind: Kind = twos < wanted2 && (out.length - twos >= spec.count - wanted2 || next() < share)
      ? "mateIn2"
      : "mateIn1"
    const chess = new Chess()
    for (let ply = 0; ply < 160; ply++) {
      const moves = chess.moves()
      if (moves.length === 0) break
      // `chess.js` marks mating moves with `#`, so a mate in one costs nothing to spot; a mate in two is searched
      // for only where the game reached a mate in one two plies later (searching every position costs ≈ 10 ms).
      if (ply >= 16 && moves.some((m) => m.endsWith("#"))) {
        const back = kind === "mateIn1" ? [] : [chess.undo()!, chess.undo()!]
        const found = candidate(chess, kind)
        const key = chess.fen().split(" ").slice(0, 4).join(" ")
        if (found !== undefined && !seen.has(key)) {
          seen.add(key)
          const last = chess.undo()!
          const row: Row = {
            puzzleId: `g${spec.seed}-${out.length}`,
            fen: chess.fen(),
            moves: [last.lan, ...found],
            themes: [kind]
          }
          out.push({ question: question(row), ...row })
          if (kind === "mateIn2") twos++
          break
        }
        for (const move of back.reverse()) chess.move(move.san)
      }
      const captures = moves.filter((m) => m.includes("x"))
      const checks = moves.filter((m) => m.endsWith("+"))
      const r = next()
      const move = r < 0.35 && captures.length > 0
        ? pick(captures, next)
        : r < 0.6 && checks.length > 0
        ? pick(checks, next)
        : pick(moves, next)
      chess.move(move)
    }
  }
  return out
}

/** The solution line (UCI) of a position of the kind, when it has exactly one solution. */
const candidate = (chess: Chess, kind: Kind): ReadonlyArray<string> | undefined => {
  const ones = matesInOne(chess)
  if (kind === "mateIn1") return ones.length === 1 ? [uci(chess, ones[0]!)] : undefined
  if (ones.length > 0) return undefined
  const keys = matesInTwo(chess)
  if (keys.length !== 1) return undefined
  const key = uci(chess, keys[0]!)
  chess.move(keys[0]!)
  const line = defence(chess)
  const result = line === undefined ? undefined : [key, uci(chess, line.reply)]
  if (result !== undefined && line !== undefined) {
    chess.move(line.reply)
    result.push(uci(chess, line.mate))
    chess.undo()
  }
  chess.undo()
  return result
}

// ===== Lichess =====

/**
 * Why a Lichess CSV line was refused.
 *
 * @category errors
 * @since 0.1.0
 */
export class PuzzleError extends Schema.TaggedError<PuzzleError>()("PuzzleError", {
  line: Schema.Number,
  message: Schema.String
}) {}

/**
 * Reads Lichess's puzzle CSV (`PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,GameUrl,
 * OpeningTags`; a header line is skipped) into rows. Every line is checked by replaying its moves: a bad FEN or
 * an illegal move is refused with its line number, as a `PuzzleError`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromLichessCsv = (text: string): Array<Line> | PuzzleError => {
  const out: Array<Line> = []
  const lines = text.split(/\r?\n/)
  for (let i = 0; i < lines.length; i++) {
    const fields = lines[i]!.split(",")
    if (fields.length < 3 || (i === 0 && fields[0] === "PuzzleId")) continue
    const [puzzleId, fen, moveText, rating, , , , themeText] = fields
    const moves = moveText!.trim().split(/\s+/).filter((m) => m.length > 0)
    const themes = (themeText ?? "").trim().split(/\s+/).filter((t) => t.length > 0)
    const checked = replay(fen!, moves)
    if (checked !== undefined) return new PuzzleError({ line: i + 1, message: `${puzzleId}: ${checked}` })
    const row: Row = {
      puzzleId: puzzleId!,
      fen: fen!,
      moves,
      ...(themes.length > 0 ? { themes } : {}),
      ...(rating !== undefined && rating !== "" && Number.isFinite(Number(rating)) ? { rating: Number(rating) } : {})
    }
    out.push({ question: question(row), ...row })
  }
  return out
}

/**
 * Why a puzzle does not replay (a bad FEN, an illegal move, too few moves), or `undefined` when it does.
 *
 * @category getters
 * @since 0.1.0
 */
export const replay = (fen: string, moves: ReadonlyArray<string>): string | undefined => {
  if (moves.length < 2) return `needs the opponent's move and at least one solution move, got ${moves.length}`
  let chess: Chess
  try {
    chess = new Chess(fen)
  } catch (e) {
    return `bad FEN "${fen}": ${e instanceof Error ? e.message : String(e)}`
  }
  for (const [k, move] of moves.entries()) {
    try {
      chess.move(move)
    } catch {
      return `move ${k + 1} (${move}) is not legal`
    }
  }
  return undefined
}

/**
 * Train, held-out, validation and demonstration puzzles, disjoint: one generation, cut in that order.
 *
 * @category constructors
 * @since 0.1.0
 */
export const splits = (
  spec: Omit<Spec, "count">,
  counts: { readonly train: number; readonly heldOut: number; readonly validation: number; readonly demos: number }
) => {
  const all = generate({ ...spec, count: counts.train + counts.heldOut + counts.validation + counts.demos })
  // `generate` draws the kind of each game at random, so every cut holds both kinds.
  let at = 0
  const take = (n: number) => all.slice(at, (at += n))
  return {
    heldOut: take(counts.heldOut),
    validation: take(counts.validation),
    demos: take(counts.demos),
    train: take(counts.train)
  }
}
