/**
 * `agentfly oracle CONFIG [--rows N]`: plays a prebuilt environment's oracle on a config's held-out rows, through the
 * config's own task (its tools, environment, episode and reward, with the config's task options), and prints the
 * solve rate, the mean reward and one episode as the model would see it: the quickest look at an environment, and
 * the proof that its tasks are solvable and its reward right.
 *
 * Oracles: `search`, `webshop`, `chess`, `household`, `science`, and `swe`: Harbor's oracle agent
 * (`environments/swe/HarborOracle.ts`), which runs each row's task folder's `solution/solve.sh` in the chain's
 * container and submits; it needs the Docker engine, and says so at once when the engine does not answer. A task of
 * your own plays the `oracle` (an `Oracle.Policy`) its module exports beside `task`: the module run directly
 * (`agentfly oracle my-task.ts`) or the one a config's `task` names.
 *
 * @since 0.1.0
 */
import { Console, Effect, Path } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as Oracle from "../actors/Oracle.ts"
import * as Train from "../actors/Train.ts"
import * as RolloutFigures from "../src/RolloutFigures.ts"
import * as ChessOracle from "../environments/chess/ChessOracle.ts"
import * as Solver from "../environments/household/Solver.ts"
import * as SearchOracle from "../environments/search/SearchOracle.ts"
import * as HarborOracle from "../environments/swe/HarborOracle.ts"
import * as HarborTask from "../environments/swe/HarborTask.ts"
import * as SweTask from "../environments/swe/SweTask.ts"
import * as ShopOracle from "../environments/webshop/ShopOracle.ts"
import * as Dataset from "../src/Dataset.ts"
import type * as Message from "../src/Message.ts"
import * as Task from "../src/Task.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import type * as TrainConfig from "../src/TrainConfig.ts"
import * as Setup from "./setup.ts"
import { exitOnFailure } from "./train.ts"

/**
 * The oracle of each built-in task that has one.
 *
 * @category constants
 * @since 0.1.0
 */
export const oracles: Readonly<Record<string, Oracle.Policy>> = {
  search: SearchOracle.oracle,
  webshop: ShopOracle.policy(),
  chess: ChessOracle.oracle,
  household: Solver.oracle,
  science: Solver.oracle
}

/**
 * The swe task's oracle for the rows it plays: Harbor's oracle agent over their task folders (each row's `task`,
 * under the config's `root` task option, relative to the config file, as the task resolves it), read and checked
 * before any container starts.
 */
const sweOracle = Effect.fn("cli.oracle.swe")(function*(
  file: string,
  ref: Task.Ref | undefined,
  rows: ReadonlyArray<Readonly<Record<string, unknown>>>
) {
  const path = yield* Path.Path
  const root = typeof ref === "object" && typeof ref.options?.["root"] === "string"
    ? path.resolve(path.dirname(path.resolve(file)), ref.options["root"])
    : path.resolve(SweTask.settings({}).root)
  const folders = [...new Set(rows.map((r) => String(r["task"])))]
  const tasks = yield* Effect.forEach(folders, (folder) =>
    HarborTask.loadRow(root, folder).pipe(
      Effect.mapError((e) => new Error(`${folder}: ${e.message} (task option root: ${root})`))
    ))
  return HarborOracle.oracle(tasks)
})

/**
 * The oracle's trajectories on the first `rows` held-out rows of the config at `file`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const play = Effect.fn("cli.oracle.play")(function*(file: string, rows = 100) {
  const { task, config, source } = yield* Setup.load(file)
  const own = yield* moduleOracle(source, config.task)
  const names = [...Object.keys(oracles), "swe"]
  if (own === undefined && !names.includes(task.name)) {
    return yield* Effect.fail(
      new Error(
        `task ${task.name} has no oracle here (the prebuilt ones: ${names.join(", ")}); a task of your own plays the ` +
          "`oracle` (an Oracle.Policy) its module exports beside `task`, or from code: Oracle.rollout({ task, rows, " +
          "policy }) (README: Write your own environment, An oracle)"
      )
    )
  }
  if (config.data.eval === undefined) return yield* Effect.fail(new Error(`${file}: data.eval names no held-out rows`))
  // Checked as `train` and `eval` check them: the task's row Schema and the fields its reward reads.
  const onInvalid = config.data.onInvalidRow
  const data = yield* Dataset.load(config.data.eval, { onInvalid, fields: task.row, from: "data.eval" }).pipe(
    Effect.flatMap((ds) => Train.checkRewardFields(task, ds, onInvalid))
  )
  const played = data.rows.slice(0, rows).map((r) => ({ question: r.question, ...r.fields }))
  const policy = own ?? (task.name === "swe" ? yield* sweOracle(file, config.task, played) : oracles[task.name]!)
  return yield* Oracle.rollout({ task, rows: played, policy })
})

/**
 * The `oracle` a task's module exports: the config file's own (a module run directly), else the module its `task`
 * names; undefined when neither exports one. An `oracle` that is not a function is refused by name.
 */
const moduleOracle = Effect.fn("cli.oracle.module")(function*(source: TrainConfig.Source, ref: Task.Ref | undefined) {
  const path = yield* Path.Path
  const name = ref === undefined ? undefined : Task.refName(ref)
  const named: Record<string, unknown> = name !== undefined && Task.isModulePath(name)
    ? yield* Task.importModule(path.resolve(source.dir, name))
    : {}
  const own: Readonly<Record<string, unknown>> = source.exports
  const exported = own["oracle"] ?? named["oracle"]
  if (exported === undefined) return undefined
  if (typeof exported !== "function") {
    return yield* Effect.fail(
      new Error(`the task's module exports an \`oracle\` that is not a function (an Oracle.Policy)`)
    )
  }
  return exported as Oracle.Policy
})

/**
 * An episode as the model saw it, a line a message: its role, its text and its tool calls (name and arguments, as
 * the model wrote them).
 *
 * @category getters
 * @since 0.1.0
 */
export const episodeText = (messages: ReadonlyArray<Message.Message>): string =>
  messages.map((m) => {
    const calls = m.role === "assistant"
      ? (m.tool_calls ?? []).map((c) => `${c.function.name} ${JSON.stringify(c.function.arguments)}`)
      : []
    return `${m.role}: ${[Oracle.text(m), ...calls].filter((part) => part !== "").join(" ")}`
  }).join("\n")

/**
 * The sentence `agentfly eval` and `agentfly oracle` add for failed trajectories: how many failed for the
 * infrastructure's reasons, the most frequent one and the first such error. A policy's own failures (a tool call cut
 * by max tokens: `ParseFailed`) are its score, said by the invalid tool-call rate, so alone they add nothing.
 *
 * @category getters
 * @since 0.1.0
 */
export const failureSentence = (
  trajectories: ReadonlyArray<Trajectory.Trajectory>
): { readonly sentence: string; readonly first: string } | undefined => {
  const failures = RolloutFigures.infrastructureFailures(trajectories)
  const first = failures.reason === undefined ? undefined : RolloutFigures.firstFailure(trajectories, failures.reason)
  if (first === undefined) return undefined
  const count = Math.round(failures.share * failures.total)
  return {
    sentence: `; ${count} of ${failures.total} trajectories failed (${failures.reason}), counted as wrong; ` +
      `first: ${first}`,
    first
  }
}

/**
 * What `agentfly oracle` prints: the solve rate and mean reward, with the failed trajectories said as `agentfly eval`
 * says them (an episode's `step` or a reward that threw would otherwise read as an oracle that loses), then the
 * first episode as the model would see it.
 *
 * @category getters
 * @since 0.1.0
 */
export const summary = (trajectories: ReadonlyArray<Trajectory.Trajectory>): string => {
  const mean = trajectories.reduce((s, t) => s + t.reward, 0) / Math.max(1, trajectories.length)
  const line = `${trajectories.length} rows: solved ${(Oracle.solveRate(trajectories) * 100).toFixed(1)} %, mean ` +
    `reward ${mean.toFixed(3)}${failureSentence(trajectories)?.sentence ?? ""}\n`
  return trajectories[0] === undefined ? line : `${line}\n${episodeText(trajectories[0].messages)}`
}

/**
 * @category commands
 * @since 0.1.0
 */
export const oracle = Command.make(
  "oracle",
  {
    config: Argument.String("config").pipe(
      Argument.withDescription("A config of a prebuilt environment's task, or of a task whose module exports `oracle`")
    ),
    rows: Flag.Int("rows").pipe(
      Flag.withDescription("Held-out rows to play (default 100)"),
      Flag.withDefault(100),
      Flag.filter((n) => n >= 1, (n) => `--rows must be at least 1, got ${n}`)
    )
  },
  Effect.fn("oracle")(function*({ config, rows }) {
    yield* Effect.gen(function*() {
      yield* Console.log(summary(yield* play(config, rows)))
    }).pipe(exitOnFailure)
  })
).pipe(Command.withDescription("Play a task's oracle (prebuilt, or its module's `oracle`) on a config's held-out rows"))
