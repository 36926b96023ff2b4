/**
 * `npm run bench -- household`
 *
 * The household environment through the runtime against a bare loop, the same episodes both ways: 64 held-out rows
 * (all six ALFWorld types, the default world size) played by the oracle (`Solver.oracle`), one chain a row.
 *
 * - `runtime`: `Rollout.runTaskChat` with 64 concurrent chains: the chain fibers, the episode protocol, the byte
 *   tokenizer and the Qwen2.5 template rendering every turn into the trajectory, the reward;
 * - `bare`: a loop calling the same functions directly: `World.generate`, the oracle's `decide(beliefs(...))` on
 *   the same (opening, command, answer) history, `Engine.act` and `Engine.status`, the answer cut to 300 characters;
 * - `transcript`: the bare loop plus what any token-level rollout pays, and nothing else of the runtime: every
 *   command and answer appended to a `TrajectoryBuilder` (the byte tokenizer, the Qwen2.5 template; a turn through
 *   `Effect.runSync`, ≈ 1 µs). Its ratio to the bare loop bounds `runtime / bare` for any runtime that keeps
 *   token transcripts.
 *
 * Environment steps per second each way; headline: runtime / bare (target ≥ 0.67). Also the environment's own
 * latency per action (`Engine.act` + `Engine.status`, p50 / p99 in microseconds) and the oracle's per decision,
 * so that the bare loop's cost is visible. Medians of `ROUNDS` alternating rounds after `WARMUP_ROUNDS` untimed
 * ones; the load average is reported because the machine is shared.
 */
import { Effect } from "effect"
import { loadavg } from "node:os"
import { performance } from "node:perf_hooks"
import * as Data from "../environments/household/Data.ts"
import * as Engine from "../environments/household/Engine.ts"
import { truncate } from "../environments/household/Household.ts"
import * as HouseholdTask from "../environments/household/HouseholdTask.ts"
import * as Solver from "../environments/household/Solver.ts"
import * as World from "../environments/household/World.ts"
import * as ByteTokenizer from "../src/ByteTokenizer.ts"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import * as Tokenizer from "../src/Tokenizer.ts"
import * as TrajectoryBuilder from "../src/TrajectoryBuilder.ts"

const CHAINS = 64
const ROUNDS = 15
/** Untimed rounds of each side first: a round lasts ≈ 0.1 s, so the first ones measure V8's compiler. */
const WARMUP_ROUNDS = 10

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const quantile = (xs: Array<number>, q: number) => xs.sort((a, b) => a - b)[Math.floor(q * (xs.length - 1))]!

const rows = Data.rows({ ...Data.defaults, heldOut: CHAINS, train: 0, validation: 0, demos: 0 }).heldOut
const task = HouseholdTask.make("household")

/** One round through the runtime: steps per second and the solve rate. */
const runtime = Effect.gen(function*() {
  const start = performance.now()
  const trajectories = yield* Data.rollout(task, Solver.oracle, rows)
  const seconds = (performance.now() - start) / 1000
  const steps = trajectories.reduce((n, t) => n + t.metrics["reward/solved/steps"]!, 0)
  return { stepsPerSecond: steps / seconds, steps, solved: trajectories.filter((t) => t.reward === 1).length }
})

const tokenizer = Effect.runSync(Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig("")))
const template = ChatTemplate.builtinTemplate("qwen2.5")

/**
 * One round of the bare loop; with `timings`, each action's and decision's latency (µs) is recorded; with
 * `transcript`, every turn is also appended to a token-level transcript (the `transcript` side).
 */
const bare = (timings?: { readonly act: Array<number>; readonly decide: Array<number> }, transcript = false) => {
  const start = performance.now()
  let steps = 0
  let solved = 0
  for (const row of rows) {
    const world = World.generate(row)
    const opening = HouseholdTask.opening(row, row.question)
    let builder = transcript
      ? Effect.runSync(TrajectoryBuilder.start({
        tokenizer,
        template,
        messages: HouseholdTask.prompt({ question: row.question, fields: row }, task.defaults.systemPrompt)
      }))
      : undefined
    const pairs: Array<readonly [string, string]> = []
    let status: Engine.Status = "open"
    while (status === "open" && pairs.length < row.maxSteps) {
      const t0 = performance.now()
      const command = Solver.decide(Solver.beliefs(opening, pairs))
      const t1 = performance.now()
      const outcome = Engine.act(world, command)
      status = Engine.status(world)
      const text = truncate(outcome.text, 300)
      const t2 = performance.now()
      if (timings !== undefined) {
        timings.decide.push((t1 - t0) * 1000)
        timings.act.push((t2 - t1) * 1000)
      }
      if (builder !== undefined) builder = Effect.runSync(appendTurn(builder, command, text))
      pairs.push([command, text])
    }
    steps += pairs.length
    if (status === "solved") solved++
  }
  return { stepsPerSecond: steps / ((performance.now() - start) / 1000), steps, solved }
}

const appendTurn = (builder: TrajectoryBuilder.TrajectoryBuilder, command: string, answer: string) =>
  Effect.flatMap(
    TrajectoryBuilder.appendAssistant(builder, { role: "assistant", content: command }),
    (next) => TrajectoryBuilder.appendObservations(next, [{ role: "user", content: answer }])
  )

const figures = Effect.gen(function*() {
    const loadBefore = loadavg()[0]!
    // Warm-up: the JIT and the template's first renders.
    for (let r = 0; r < WARMUP_ROUNDS; r++) {
      yield* runtime
      bare()
      bare(undefined, true)
    }
    const through: Array<number> = []
    const direct: Array<number> = []
    const transcribed: Array<number> = []
    let last = { runtime: { steps: 0, solved: 0 }, bare: { steps: 0, solved: 0 } }
    for (let r = 0; r < ROUNDS; r++) {
      const a = yield* runtime
      const b = bare()
      transcribed.push(bare(undefined, true).stepsPerSecond)
      through.push(a.stepsPerSecond)
      direct.push(b.stepsPerSecond)
      last = { runtime: a, bare: b }
    }
    const timings = { act: [] as Array<number>, decide: [] as Array<number> }
    for (let r = 0; r < 10; r++) bare(timings)
    const ratio = median(through) / median(direct)
    return {
      headline: {
        metric: `household env steps/s: runtime (runTaskChat, ${CHAINS} chains, oracle) / bare loop`,
        value: ratio,
        target: 0.67,
        better: "higher" as const
      },
      runtime: { ...last.runtime, stepsPerSecond: median(through), rounds: through },
      bare: { ...last.bare, stepsPerSecond: median(direct), rounds: direct },
      transcript: {
        stepsPerSecond: median(transcribed),
        ratioToBare: median(transcribed) / median(direct),
        rounds: transcribed
      },
      envLatencyUs: { p50: quantile(timings.act, 0.5), p99: quantile(timings.act, 0.99), actions: timings.act.length },
      oracleDecisionUs: { p50: quantile(timings.decide, 0.5), p99: quantile(timings.decide, 0.99) },
      settings: {
        chains: CHAINS,
        rounds: ROUNDS,
        warmupRounds: WARMUP_ROUNDS,
        world: World.defaultSpec.household,
        template: "qwen2.5"
      },
      loadAverage: { before: loadBefore, after: loadavg()[0]! }
    }
  })

export default () => Effect.runPromise(figures)
