/**
 * Writes the chess task's data: `train.jsonl`, `heldout.jsonl` and `validation.jsonl` (puzzles with their
 * questions, disjoint positions) and `demos.jsonl` (the oracle's solved puzzles, rolled out through the task's own
 * tools, environment and reward by `Oracle.rollout`, for the SFT warm-up). Seeded: the same options always write
 * the same bytes.
 *
 *   npx tsx examples/chess/generate.ts [OUT_DIR] [SEED] [NOISE] [--mateIn2Share 0.3] [--view fen] [--lichess FILE.csv]
 *
 * Puzzles are generated (`Puzzle.generate`: mates in one and two from seeded random games), or, with `--lichess`,
 * read from a Lichess puzzle CSV (`lichess_db_puzzle.csv` or any part of it; every line is replayed, a bad one
 * stops the command naming its line) and shuffled by `SEED` into the splits (held-out, validation, then
 * demonstrations and training from the rest). The oracle plays each puzzle's own line (`ChessOracle.forRows`), so
 * from a Lichess file every puzzle whose episode fits the task's default budgets (a line of up to two moves with
 * `--view fen`, three with diagrams) becomes a demonstration. `NOISE` is the share of demonstrations that list the
 * legal moves (`legal {}`) before moving (with `--view fen` they no longer fit 512 tokens: keep it 0 there).
 * `--view fen` plays the demonstrations with the task option `view: "fen"` (no diagram: half the tokens), which a
 * run must then set too.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem } from "effect"
import * as Oracle from "../../actors/Oracle.ts"
import * as ChessOracle from "../../environments/chess/ChessOracle.ts"
import * as ChessTask from "../../environments/chess/ChessTask.ts"
import * as Puzzle from "../../environments/chess/Puzzle.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as Sampling from "../../src/Sampling.ts"
import { main } from "../generator.ts"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly dir: string
  readonly seed: number
  readonly noise: number
  readonly train: number
  readonly heldOut: number
  readonly validation: number
  /** Puzzles the oracle plays for demonstrations (those it solves within the budgets are written). */
  readonly demos: number
  readonly mateIn2Share: number
  /** A Lichess puzzle CSV to read instead of generating ("" for none). */
  readonly lichess: string
  /** The task's `view` the demonstrations are played with (`board` or `fen`): a run must pass the same. */
  readonly view: string
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Options, "dir"> = {
  seed: 2026,
  noise: 0,
  train: 1000,
  heldOut: 200,
  validation: 100,
  demos: 500,
  mateIn2Share: 0.3,
  lichess: "",
  view: "board"
}

/** Splits a Lichess file's puzzles: shuffled by the seed, held-out and validation first, the rest shared. */
const fromFile = Effect.fnUntraced(function*(options: Options) {
  const fs = yield* FileSystem.FileSystem
  const read = Puzzle.fromLichessCsv(yield* fs.readFileString(options.lichess))
  if (read instanceof Puzzle.PuzzleError) {
    return yield* Effect.fail(new Error(`${options.lichess}:${read.line}: ${read.message}`))
  }
  const next = Sampling.mulberry32(options.seed)
  const keyed = read.map((row) => [next(), row] as const).sort((a, b) => a[0] - b[0]).map(([, row]) => row)
  let at = 0
  const take = (n: number) => keyed.slice(at, (at += n))
  const heldOut = take(options.heldOut), validation = take(options.validation), demos = take(options.demos)
  return { heldOut, validation, demos, train: take(options.train) }
})

/**
 * Generates (or reads) and writes the four files under `options.dir` (created if missing); returns the rows
 * written per file.
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("chess.generate.write")(function*(options: Options) {
  const sets = options.lichess === ""
    ? Puzzle.splits({ seed: options.seed, mateIn2Share: options.mateIn2Share }, options)
    : yield* fromFile(options)
  if (options.view !== "board" && options.view !== "fen") {
    return yield* Effect.fail(new Error(`view must be board or fen, got ${JSON.stringify(options.view)}`))
  }
  const task = ChessTask.make({ view: options.view })
  const played = yield* Oracle.rollout({
    task,
    rows: sets.demos,
    policy: ChessOracle.forRows(sets.demos, { look: options.noise })
  })
  const budget = task.defaults.maxContextTokens ?? Number.POSITIVE_INFINITY
  const length = Oracle.contextLength()
  const solved = Oracle.demonstrations(played).filter((demo) => length(demo.messages) <= budget)
  return yield* Dataset.writeSplits(options.dir, {
    train: sets.train,
    heldOut: sets.heldOut,
    validation: sets.validation,
    demos: solved
  })
})

main(import.meta.url, { ...defaults, dir: "data" }, write)
