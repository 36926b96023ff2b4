/**
 * A chain's chess puzzle: the position, the solution line still to play, and what the solver did. Pure functions
 * over a `State` (`start`, `act`, `ended`) and the per-chain {@link Board} service the tools, the reward and the
 * episode share (`Environment.perChain(layer)`).
 *
 * Lichess's rules: the solver must play the line's move, or any checkmate; a legal move that is neither fails the
 * puzzle (the episode ends `"failed"`); after a right move the opponent's reply from the line is played at once and
 * narrated; the last right move solves it (`"solved"`). A move that is not legal or not understood (`Nf9`, `e9`,
 * `castle`) is refused with an `Error: …` observation and the puzzle goes on; every action counts towards
 * `maxSteps` (`"out_of_steps"`), by default the puzzle's own ({@link limits}: from the length of its line).
 *
 * @since 0.1.0
 */
import { Chess } from "chess.js"
import { Context, Effect, Layer } from "effect"
import type { Scope } from "effect"
import * as Environment from "../../src/Environment.ts"
import type * as Puzzle from "./Puzzle.ts"

// ===== Models =====

/**
 * How positions are shown: `board` (FEN and an 8×8 diagram, white at the bottom) or `fen` alone (shortest).
 *
 * @category models
 * @since 0.1.0
 */
export type View = "board" | "fen"

/**
 * @category models
 * @since 0.1.0
 */
export interface Settings {
  readonly view: View
  /**
   * Actions (moves, refused ones included, and `legal` / `board` calls) before the episode ends; `undefined`: each
   * puzzle's own, derived from its line ({@link limits}).
   */
  readonly maxSteps?: number | undefined
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaultSettings: Settings = { view: "board", maxSteps: undefined }

/**
 * The limits a puzzle of `solverMoves` moves gets by default: `maxSteps` = max(6, moves + 4) actions (every move,
 * a look at the legal moves and three mistakes or looks more) and `maxTurns` = max(4, moves + 2) assistant turns.
 * A mate in one or two keeps the fixed limits it always had (6 and 4); a Lichess line of five moves gets 9 and 7,
 * so a puzzle is never unsolvable for its length alone.
 *
 * @category getters
 * @since 0.1.0
 */
export const limits = (solverMoves: number): { readonly maxSteps: number; readonly maxTurns: number } => ({
  maxSteps: Math.max(6, solverMoves + 4),
  maxTurns: Math.max(4, solverMoves + 2)
})

/**
 * The solver's moves of a row: every other move of `moves` after the opponent's first.
 *
 * @category getters
 * @since 0.1.0
 */
export const rowSolverMoves = (row: Pick<Puzzle.Row, "moves">): number => Math.ceil((row.moves.length - 1) / 2)

/**
 * One chain's puzzle. `chess` is mutated in place by `act` (one chain, one fiber).
 *
 * @category models
 * @since 0.1.0
 */
export interface State {
  readonly chess: Chess
  /** The solution line after the opponent's first move (solver, opponent, solver, ...). */
  readonly line: ReadonlyArray<string>
  /** Index in `line` of the solver's next move. */
  next: number
  /** Solver moves that matched the line (or mated). */
  correct: number
  steps: number
  refused: number
  /** The actions this puzzle allows (the settings', else {@link limits} of its line). */
  readonly maxSteps: number
  outcome: "solved" | "failed" | undefined
}

/**
 * An action of the tools.
 *
 * @category models
 * @since 0.1.0
 */
export type Action =
  | { readonly _tag: "move"; readonly move: string }
  | { readonly _tag: "legal" }
  | { readonly _tag: "board" }

/**
 * What an action did: the observation, or why it was refused.
 *
 * @category models
 * @since 0.1.0
 */
export type Outcome = { readonly ok: true; readonly text: string } | { readonly ok: false; readonly error: string }

// ===== Rendering =====

const side = (chess: Chess) => (chess.turn() === "w" ? "White" : "Black")

/**
 * The position as the solver reads it: side to move, FEN and (view `board`) the diagram.
 *
 * @category getters
 * @since 0.1.0
 */
export const position = (chess: Chess, view: View): string => {
  const head = `${side(chess)} to move.\nFEN: ${chess.fen()}`
  if (view === "fen") return head
  const rows = chess.board().map((rank, r) =>
    `${8 - r} ${rank.map((sq) => (sq === null ? "." : sq.color === "w" ? sq.type.toUpperCase() : sq.type)).join(" ")}`
  )
  return `${head}\n${rows.join("\n")}\n  a b c d e f g h`
}

/**
 * The solver's moves of the line: every other move from the first.
 *
 * @category getters
 * @since 0.1.0
 */
export const solverMoves = (state: Pick<State, "line">): number => Math.ceil(state.line.length / 2)

// ===== Transitions =====

/**
 * The puzzle's start: the opponent's move played on the FEN. Fails with the reason on a bad FEN or move (rows
 * are checked when loaded, so only a row built by hand gets here).
 *
 * @category constructors
 * @since 0.1.0
 */
export const start = (
  row: Pick<Puzzle.Row, "fen" | "moves">,
  view: View = "board",
  maxSteps?: number | undefined
): { state: State; text: string } | string => {
  let chess: Chess
  try {
    chess = new Chess(row.fen)
  } catch (e) {
    return `bad FEN "${row.fen}": ${e instanceof Error ? e.message : String(e)}`
  }
  let opening: string
  try {
    opening = chess.move(row.moves[0]!).san
  } catch {
    return `the opponent's move ${row.moves[0]} is not legal in ${row.fen}`
  }
  const state: State = {
    chess,
    line: row.moves.slice(1),
    next: 0,
    correct: 0,
    steps: 0,
    refused: 0,
    maxSteps: maxSteps ?? limits(rowSolverMoves(row)).maxSteps,
    outcome: undefined
  }
  const mover = chess.turn() === "w" ? "Black" : "White"
  return { state, text: `${mover} played ${opening}. ${position(chess, view)}` }
}

/** A move the solver wrote, as `chess.js` reads it (SAN `Qh7#`, `Nbd2`; UCI `d1h5`, `e7e8q`; `0-0` as `O-O`). */
const normalise = (text: string): string => text.trim().replace(/^0-0-0/, "O-O-O").replace(/^0-0/, "O-O")

/**
 * Applies an action. Mutates `state`; a refused action only counts a step.
 *
 * @category combinators
 * @since 0.1.0
 */
export const act = (state: State, settings: Settings, action: Action): Outcome => {
  if (state.outcome !== undefined) return { ok: false, error: `the puzzle is over (${state.outcome})` }
  if (state.steps >= state.maxSteps) return { ok: false, error: `no steps left (${state.maxSteps})` }
  state.steps++
  const chess = state.chess
  if (action._tag === "legal") return { ok: true, text: `Legal moves: ${chess.moves().join(" ")}` }
  if (action._tag === "board") return { ok: true, text: position(chess, settings.view) }
  const text = normalise(action.move)
  let played: ReturnType<Chess["move"]>
  try {
    if (text.length === 0) throw new Error("empty")
    played = chess.move(text)
  } catch {
    state.refused++
    return { ok: false, error: `${action.move} is not a legal move for ${side(chess)} (legal lists the legal moves)` }
  }
  const expected = state.line[state.next]
  if (played.lan !== expected && !chess.isCheckmate()) {
    state.outcome = "failed"
    const right = new Chess(played.before)
    return { ok: true, text: `${played.san} is wrong: the solution was ${right.move(expected!).san}. Puzzle failed.` }
  }
  state.correct++
  if (chess.isCheckmate() || state.next + 1 >= state.line.length) {
    state.outcome = "solved"
    return { ok: true, text: `${played.san}: ${chess.isCheckmate() ? "checkmate, puzzle" : "puzzle"} solved.` }
  }
  const reply = chess.move(state.line[state.next + 1]!)
  state.next += 2
  return {
    ok: true,
    text: `${played.san} is right. ${side(chess) === "White" ? "Black" : "White"} played ${reply.san}. ` +
      position(chess, settings.view)
  }
}

/**
 * Why the episode is over, or `undefined` while it goes on.
 *
 * @category getters
 * @since 0.1.0
 */
export const ended = (state: State, _settings?: Settings): "solved" | "failed" | "out_of_steps" | undefined =>
  state.outcome ?? (state.steps >= state.maxSteps ? "out_of_steps" : undefined)

/**
 * The puzzle's score: 1 when solved, else half the share of the solver's moves that were right (Lichess-style
 * partial credit for a longer puzzle failed late; 0 for a mate in one missed).
 *
 * @category getters
 * @since 0.1.0
 */
export const score = (state: State): number =>
  state.outcome === "solved" ? 1 : 0.5 * (state.correct / solverMoves(state))

// ===== Service =====

/**
 * A chain's puzzle as a service: reset with a row, the tools' actions, and the state (read by the reward and
 * the episode).
 *
 * @category services
 * @since 0.1.0
 */
export class Board extends Context.Service<Board, {
  readonly settings: Settings
  readonly reset: (row: Pick<Puzzle.Row, "fen" | "moves">) => Effect.Effect<string, Environment.EnvError>
  readonly act: (action: Action) => Effect.Effect<string, Environment.EnvError>
  readonly state: Effect.Effect<State | undefined>
}>()("agentfly/environments/chess/Board") {}

const invalid = (method: string, message: string, reason: "InvalidAction" | "ResetFailed" = "InvalidAction") =>
  Environment.envError("chess", method, reason, message)

/**
 * One puzzle per build (use with `Environment.perChain`).
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (settings: Settings = defaultSettings): Layer.Layer<Board> =>
  Layer.sync(Board, () => {
    let state: State | undefined
    return Board.of({
      settings,
      reset: (row) =>
        Effect.suspend(() => {
          const started = start(row, settings.view, settings.maxSteps)
          if (typeof started === "string") return Effect.fail(invalid("reset", started, "ResetFailed"))
          state = started.state
          return Effect.succeed(started.text)
        }),
      act: (action) =>
        Effect.suspend(() => {
          if (state === undefined) return Effect.fail(invalid(action._tag, "no puzzle: the episode was not started"))
          const outcome = act(state, settings, action)
          return outcome.ok ? Effect.succeed(outcome.text) : Effect.fail(invalid(action._tag, outcome.error))
        }),
      state: Effect.sync(() => state)
    })
  })

/**
 * The task's provider: a fresh board per chain, counted in a run's metrics (`env/chess/boards`,
 * `env/chess/open`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const provider = (
  settings: Settings = defaultSettings
): Effect.Effect<Environment.Provider<Board, never, never>, never, Scope.Scope> =>
  Effect.sync(() =>
    Environment.counted(Environment.perChain(layer(settings)), { started: "env/chess/boards", open: "env/chess/open" })
  )
