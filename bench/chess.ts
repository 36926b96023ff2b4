/**
 * `npm run bench -- chess`
 *
 * The chess task through the runtime against a bare loop, the same episodes both ways: 256 held-out puzzles of the
 * generator (30 % mates in two), one chain a puzzle, 64 chains at once (as the web-shop bench: a round's fixed cost,
 * building the task's runtime, is then spread as a run spreads it).
 *
 * - `runtime`: `Oracle.rollout` with 64 concurrent chains: the chain fibers, the task's tools through the tool actor,
 *   per-chain boards from the provider, the episode protocol, the byte tokenizer and the Qwen2.5 template rendering
 *   every turn into the trajectory, the reward;
 * - `bare`: a loop calling the same functions directly: `Board.start`, the policy's move from the position, and
 *   `Board.act` until `Board.ended`.
 *
 * Two policies: the `oracle` (a mate search per move: ≈ 0.2 ms for a mate in one, ≈ 10 ms for a mate in two's first
 * move) and `random` (a random legal move: one `chess.js` move listing, ≈ 150 µs), which shows the runtime's cost
 * against a cheaper step. Environment steps (moves) per second each way; headline: runtime ÷ bare with the random
 * policy (the cheaper step: the harder case; #16's target for environments, ≥ 0.67). Also the board's own latency
 * per action (`move`, `legal`; p50 / p99 in µs) and the generator's puzzles per second by kind. Medians of `ROUNDS`
 * alternating rounds after one untimed round of each side; the load average is reported because the machine is
 * shared.
 */
import { Chess } from "chess.js"
import { Effect } from "effect"
import { loadavg } from "node:os"
import { performance } from "node:perf_hooks"
import * as Oracle from "../actors/Oracle.ts"
import * as Board from "../environments/chess/Board.ts"
import * as ChessOracle from "../environments/chess/ChessOracle.ts"
import * as ChessTask from "../environments/chess/ChessTask.ts"
import * as Puzzle from "../environments/chess/Puzzle.ts"
import * as Sampling from "../src/Sampling.ts"

const CHAINS = 64
const PUZZLES = 256
const ROUNDS = 7

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const quantile = (xs: Array<number>, q: number) => xs.sort((a, b) => a - b)[Math.floor(q * (xs.length - 1))]!

const rows = Puzzle.splits({ seed: 4, mateIn2Share: 0.3 }, { train: 0, heldOut: PUZZLES, validation: 0, demos: 0 })
  .heldOut
const task = ChessTask.make()
const settings = Board.defaultSettings

/** The random policy's move in a position, as `ChessOracle.noise` draws it. */
const randomMove = (fen: string): string => {
  const moves = new Chess(fen).moves()
  let h = 2166136261
  for (let i = 0; i < fen.length; i++) h = Math.imul(h ^ fen.charCodeAt(i), 16777619)
  return moves[Math.floor(Sampling.mulberry32(h >>> 0)() * moves.length)]!
}

const policies = {
  oracle: { chat: ChessOracle.oracle, move: (fen: string) => ChessOracle.solve(fen) },
  random: { chat: ChessOracle.noise, move: randomMove }
} as const

/** One round through the runtime: moves per second. */
const runtime = (policy: keyof typeof policies) =>
  Effect.gen(function*() {
    const start = performance.now()
    const played = yield* Oracle.rollout({ task, rows, policy: policies[policy].chat, concurrency: CHAINS })
    const seconds = (performance.now() - start) / 1000
    const steps = played.reduce((n, t) => n + t.metrics["reward/chess/steps"]!, 0)
    return { stepsPerSecond: steps / seconds, steps, solved: played.filter((t) => t.reward === 1).length }
  })

/** One round of the bare loop; with `timings`, each `move` and `legal` action's latency (µs). */
const bare = (
  policy: keyof typeof policies,
  timings?: { readonly move: Array<number>; readonly legal: Array<number> }
) => {
  const start = performance.now()
  let steps = 0
  let solved = 0
  for (const row of rows) {
    const { state } = Board.start(row) as { state: Board.State }
    while (Board.ended(state, settings) === undefined) {
      const move = policies[policy].move(state.chess.fen())
      if (move === undefined) break
      const t0 = performance.now()
      Board.act(state, settings, { _tag: "move", move })
      const t1 = performance.now()
      steps++
      if (timings !== undefined) {
        timings.move.push((t1 - t0) * 1000)
        const probe = Board.start(row) as { state: Board.State }
        const t2 = performance.now()
        Board.act(probe.state, settings, { _tag: "legal" })
        timings.legal.push((performance.now() - t2) * 1000)
      }
    }
    if (state.outcome === "solved") solved++
  }
  return { stepsPerSecond: steps / ((performance.now() - start) / 1000), steps, solved }
}

const side = (policy: keyof typeof policies) =>
  Effect.gen(function*() {
    yield* runtime(policy)
    bare(policy)
    const through: Array<number> = []
    const direct: Array<number> = []
    let last = { runtime: { steps: 0, solved: 0 }, bare: { steps: 0, solved: 0 } }
    for (let r = 0; r < ROUNDS; r++) {
      const a = yield* runtime(policy)
      const b = bare(policy)
      through.push(a.stepsPerSecond)
      direct.push(b.stepsPerSecond)
      last = { runtime: a, bare: b }
    }
    return {
      ratio: median(through) / median(direct),
      runtime: { ...last.runtime, stepsPerSecond: median(through), rounds: through },
      bare: { ...last.bare, stepsPerSecond: median(direct), rounds: direct }
    }
  })

const generation = (kind: "mateIn1" | "mateIn2", count: number) => {
  const start = performance.now()
  Puzzle.generate({ seed: 77, count, mateIn2Share: kind === "mateIn2" ? 1 : 0 })
  return count / ((performance.now() - start) / 1000)
}

const figures = Effect.gen(function*() {
  const loadBefore = loadavg()[0]!
  const random = yield* side("random")
  const oracle = yield* side("oracle")
  const timings = { move: [] as Array<number>, legal: [] as Array<number> }
  for (let r = 0; r < 5; r++) bare("oracle", timings)
  return {
    headline: {
      metric: `chess moves/s: runtime (Oracle.rollout, ${CHAINS} chains, random legal moves) / bare loop`,
      value: random.ratio,
      target: 0.67,
      better: "higher" as const
    },
    random,
    oracle,
    boardLatencyUs: {
      move: { p50: quantile(timings.move, 0.5), p99: quantile(timings.move, 0.99), actions: timings.move.length },
      legal: { p50: quantile(timings.legal, 0.5), p99: quantile(timings.legal, 0.99), actions: timings.legal.length }
    },
    generatorPuzzlesPerSecond: { mateIn1: generation("mateIn1", 30), mateIn2: generation("mateIn2", 10) },
    settings: {
      chains: CHAINS,
      puzzles: PUZZLES,
      rounds: ROUNDS,
      mateIn2Share: 0.3,
      template: "qwen2.5",
      view: settings.view
    },
    loadAverage: { before: loadBefore, after: loadavg()[0]! }
  }
})

export default () => Effect.runPromise(figures)
