/**
 * The chess-puzzle task (AgentFly's `chess_puzzle`, on Lichess's puzzle format): the opponent's move is played on
 * the row's position, and the agent must find the solution with the tools `move {m}`, `legal {}` and `board {}`;
 * scored 1 when solved, partial credit for a longer puzzle failed late (`Board.score`).
 *
 * - Each chain has its own board (`Board.provider`, per chain); the episode starts by resetting it with the row
 *   (its narration joins the prompt) and ends when the puzzle is solved (`episodeEnd: "solved"`), failed
 *   (`"failed"`: a legal move that is not the solution) or out of steps (`"out_of_steps"`).
 * - Rows: `{ question, puzzleId, fen, moves, themes?, rating? }` (`Puzzle.Row`), from `examples/chess/generate.ts`
 *   (generated, or converted from a Lichess CSV). A row whose moves do not replay is refused when the data loads.
 *
 * Options (`{ "name": "chess", "options": { … } }`): `view` (`"board"`, default: FEN and a diagram; `"fen"`:
 * the FEN alone), `maxSteps` (default: each puzzle's own, `Board.limits` of its line: 6 for a mate in one or two),
 * `longestLine` (the solver moves of the data's longest line, default 2: the task's default turn and context
 * budgets fit it, {@link defaults}) and `toolCallFormat`, the weight of a tool-call format term added to the score
 * (default 0).
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import * as Environment from "../../src/Environment.ts"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import * as Tool from "../../src/Tool.ts"
import * as ToolCallFormat from "../rewards/ToolCallFormat.ts"
import * as Board from "./Board.ts"
import * as Puzzle from "./Puzzle.ts"

// ===== Models =====

/**
 * The task's options.
 *
 * @category models
 * @since 0.1.0
 */
export const Options = Schema.Struct({
  view: Schema.optionalKey(Schema.Literals(["board", "fen"])),
  maxSteps: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
  longestLine: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 64 }))),
  toolCallFormat: Schema.optionalKey(Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)))
})
export type Options = typeof Options.Type

/**
 * Replays of rows already checked, by FEN and moves (the latest 10,000): `chess.js` takes ≈ 150 µs a move, and
 * `Rollout.runTask` checks its rows on every call (a run checks its files once, when it loads them).
 */
const replayed = new Map<string, string | true>()

const replayOnce = (fen: string, moves: ReadonlyArray<string>): string | true => {
  const key = `${fen}|${moves.join(" ")}`
  const known = replayed.get(key)
  if (known !== undefined) return known
  const verdict = Puzzle.replay(fen, moves) ?? true
  replayed.set(key, verdict)
  if (replayed.size > 10_000) replayed.delete(replayed.keys().next().value!)
  return verdict
}

/**
 * A row's fields, checked when the data loads: the moves must replay on the FEN.
 *
 * @category models
 * @since 0.1.0
 */
export const Row = Puzzle.Row.check(Schema.makeFilter((row) => replayOnce(row.fen, row.moves)))

/**
 * The one-line system prompt.
 *
 * @category constants
 * @since 0.1.0
 */
export const systemPrompt = "Solve the chess puzzle: move, legal, board."

/**
 * The agent settings the task suggests for a view and the data's longest line (`longestLine` solver moves, default
 * 2): a mate in two takes two moves, a look at the legal moves and a mistake fit in `maxTurns` 4; a longer line gets
 * `Board.limits(longestLine).maxTurns` (its moves and two more). In tokens of the byte-level tokenizer (measured on
 * the shipped Lichess sample, `examples/chess/lichess-sample.csv`), a line of n solver moves takes ≈ 110 + 195·n
 * with FENs alone and ≈ 100 + 360·n with diagrams: 512 hold a mate in two with FENs (the `tiny` preset's 512
 * positions) and 2,048 a line of three with diagrams; a longer line gets 256·(n + 1) or 512·(n + 1), room for a
 * look at the legal moves (≈ 150) besides.
 *
 * @category constants
 * @since 0.1.0
 */
export const defaults = (view: Board.View = "board", longestLine = 2): Task.Defaults => ({
  systemPrompt,
  renderTools: false,
  maxTurns: Board.limits(longestLine).maxTurns,
  // A move call is ≈ 70 byte-level tokens (`<tool_call>` and its JSON): 48 cut every turn short.
  maxNewTokens: 96,
  maxContextTokens: view === "board"
    ? (longestLine <= 3 ? 2048 : 512 * (longestLine + 1))
    : (longestLine <= 2 ? 512 : 256 * (longestLine + 1))
})

/**
 * The solver moves of the longest line among rows (at least 1): the `longestLine` option that fits them.
 *
 * @category getters
 * @since 0.1.0
 */
export const longestLine = (rows: ReadonlyArray<Pick<Puzzle.Row, "moves">>): number =>
  rows.reduce((n, row) => Math.max(n, Board.rowSolverMoves(row)), 1)

// ===== Tools =====

const act = (action: Board.Action) => Effect.flatMap(Board.Board, (board) => board.act(action))

/**
 * `move {m}`: a move in SAN (`Qh7#`, `Nbd2`, `O-O`) or UCI (`d1h5`, `e7e8q`).
 *
 * @category tools
 * @since 0.1.0
 */
export const move = Tool.make("move", {
  description: "Play a move, in SAN (Qh7#) or UCI (d1h7)",
  parameters: Schema.Struct({ m: Schema.String }),
  failure: Environment.EnvError,
  dependencies: [Board.Board],
  handler: ({ m }) => act({ _tag: "move", move: m })
})

/**
 * `legal {}`: the legal moves, in SAN.
 *
 * @category tools
 * @since 0.1.0
 */
export const legal = Tool.make("legal", {
  description: "List the legal moves",
  failure: Environment.EnvError,
  dependencies: [Board.Board],
  handler: () => act({ _tag: "legal" })
})

/**
 * `board {}`: the position again.
 *
 * @category tools
 * @since 0.1.0
 */
export const board = Tool.make("board", {
  description: "Show the position",
  failure: Environment.EnvError,
  dependencies: [Board.Board],
  handler: () => act({ _tag: "board" })
})

/**
 * The three tools.
 *
 * @category constants
 * @since 0.1.0
 */
export const tools = [move, legal, board] as const

// ===== Reward =====

/**
 * The puzzle's score (`Board.score`) with `reward/chess/{solved,correct,refused,steps}`.
 *
 * @category rewards
 * @since 0.1.0
 */
export const puzzle = Reward.make("chess", {
  dependencies: [Board.Board],
  score: () =>
    Effect.map(Effect.flatMap(Board.Board, (b) => b.state), (state) =>
      state === undefined
        ? { reward: 0, metrics: { solved: 0, correct: 0, refused: 0, steps: 0 } }
        : {
          reward: Board.score(state),
          metrics: {
            solved: state.outcome === "solved" ? 1 : 0,
            correct: state.correct,
            refused: state.refused,
            steps: state.steps
          }
        })
})

/**
 * The reward of a format weight: the puzzle's score, or `score + w·toolCallFormat`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const reward = (formatWeight: number) =>
  ToolCallFormat.withFormat(puzzle, formatWeight)

// ===== Task =====

/**
 * The board settings of the options.
 *
 * @category getters
 * @since 0.1.0
 */
export const settings = (options: Options): Board.Settings => ({
  view: options.view ?? Board.defaultSettings.view,
  maxSteps: options.maxSteps
})

/**
 * The task with its options.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (options: Options = {}): Task.Task => {
  const set = settings(options)
  return Task.make("chess", {
    description: "Solve chess puzzles (Lichess format): mates in one and two, or your own puzzle file",
    row: Row,
    tools,
    reward: reward(options.toolCallFormat ?? 0),
    environment: Board.provider(set),
    episode: {
      start: ({ row }) =>
        Effect.flatMap(Board.Board, (b) => Effect.map(b.reset(row), (text) => [text])),
      step: () =>
        Effect.flatMap(Board.Board, (b) =>
          Effect.map(b.state, (state) => {
            const end = state === undefined ? undefined : Board.ended(state, set)
            return end === undefined ? undefined : { end }
          }))
    },
    defaults: defaults(set.view, options.longestLine ?? 2)
  })
}

/**
 * The task as a config names it (`"task": "chess"`, with optional options).
 *
 * @category constructors
 * @since 0.1.0
 */
export const task = Task.withOptions("chess", Options, make)
