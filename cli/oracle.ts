/**
 * `agentfly oracle CONFIG [--rows N]`: plays a prebuilt environment's oracle on a config's held-out rows, through the
 * config's own task (its tools, environment, episode and reward, with the config's task options), and prints the
 * solve rate, the mean reward and one episode as the model would see it: the quickest look at an environment, and
 * the proof that its tasks are solvable and its reward right. Below 100 %, it says per row theme (a row's `themes`,
 * e.g. Lichess's `mateIn3`, `long`) what was solved, the themes solved least first.
 *
 * The chess oracle plays each row's own solution line (`ChessOracle.forRows`), within the turn and context budgets
 * of the rows' longest line (the task option `longestLine`, set from the rows when the config leaves it out).
 *
 * Oracles: `search`, `webshop`, `chess`, `household`, `science`, `vqa` (counts the picture's shapes from its
 * pixels), `gui` (reads the screen's pixels), `simuscene` (writes the program the scene's words describe), and `swe`: Harbor's oracle agent
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
import * as Progress from "../actors/Progress.ts"
import * as Docker from "../actors/resources/Docker.ts"
import * as Train from "../actors/Train.ts"
import * as RolloutFigures from "../src/RolloutFigures.ts"
import * as ChessOracle from "../environments/chess/ChessOracle.ts"
import * as ChessTask from "../environments/chess/ChessTask.ts"
import * as GuiOracle from "../environments/gui/GuiOracle.ts"
import type * as Puzzle from "../environments/chess/Puzzle.ts"
import * as Solver from "../environments/household/Solver.ts"
import * as SearchOracle from "../environments/search/SearchOracle.ts"
import * as HarborOracle from "../environments/swe/HarborOracle.ts"
import * as HarborTask from "../environments/swe/HarborTask.ts"
import * as SweTask from "../environments/swe/SweTask.ts"
import * as Workspace from "../environments/swe/Workspace.ts"
import * as SimuSceneOracle from "../environments/simuscene/SimuSceneOracle.ts"
import * as VqaTask from "../environments/vqa/VqaTask.ts"
import * as ShopOracle from "../environments/webshop/ShopOracle.ts"
import * as Dataset from "../src/Dataset.ts"
import type * as Message from "../src/Message.ts"
import * as Task from "../src/Task.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import type * as TrainConfig from "../src/TrainConfig.ts"
import * as Setup from "./setup.ts"
import * as Json from "./json.ts"
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
  science: Solver.oracle,
  vqa: VqaTask.oracle,
  gui: GuiOracle.oracle,
  simuscene: SimuSceneOracle.oracle
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
  // Every image first: one that cannot be had is named with the reason, not a failed chain per row.
  yield* Workspace.prepare(tasks).pipe(Effect.provide(Docker.DockerEngine.layer))
  return HarborOracle.oracle(tasks)
})

/**
 * The chess task fitted to the rows it plays: the config's options, with `longestLine` from the rows when the config
 * leaves it out (so that a Lichess line of five moves is not cut by a mate in two's budgets), and its oracle, which
 * plays each row's own line.
 */
const chessOracle = (ref: Task.Ref | undefined, rows: ReadonlyArray<Readonly<Record<string, unknown>>>) => {
  const lines = rows as unknown as ReadonlyArray<Puzzle.Row>
  const options = typeof ref === "object" && ref.options !== undefined ? ref.options : {}
  const fitted = ChessTask.make({
    ...(options as ChessTask.Options),
    longestLine: (options as ChessTask.Options).longestLine ?? Math.max(2, ChessTask.longestLine(lines))
  })
  return { task: fitted, policy: ChessOracle.forRows(lines) }
}

/**
 * The oracle's trajectories on the first `rows` held-out rows of the config at `file`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const play = Effect.fn("cli.oracle.play")(function*(file: string, rows = 100) {
  return (yield* playRows(file, rows)).trajectories
})

/**
 * The oracle's trajectories on the first `rows` held-out rows of the config at `file`, with the rows they played.
 *
 * @category constructors
 * @since 0.1.0
 */
export const playRows = Effect.fn("cli.oracle.playRows")(function*(file: string, rows = 100) {
  const { task: configured, config, source } = yield* Setup.load(file)
  let task = configured
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
  let policy = own
  if (policy === undefined && task.name === "chess") ({ task, policy } = chessOracle(config.task, played))
  policy ??= task.name === "swe" ? yield* sweOracle(file, config.task, played) : oracles[task.name]!
  const trajectories = yield* Oracle.rollout({ task, rows: played, policy })
    .pipe(Progress.withBar({ label: "oracle", unit: "rows", total: played.length }))
  return { trajectories, rows: played }
})

/**
 * What was solved per theme (a row's `themes`), for the themes below 100 %: least solved first, then the most
 * rows; `[]` when every theme is at 100 % or the rows carry no themes.
 *
 * @category getters
 * @since 0.1.0
 */
export const themesBelow = (
  trajectories: ReadonlyArray<Trajectory.Trajectory>,
  rows: ReadonlyArray<Readonly<Record<string, unknown>>>
): ReadonlyArray<{ readonly theme: string; readonly solved: number; readonly rows: number }> => {
  const counts = new Map<string, { solved: number; rows: number }>()
  trajectories.forEach((t, i) => {
    const themes = rows[i]?.["themes"]
    if (!Array.isArray(themes)) return
    const solved = Oracle.solveRate([t]) === 1 ? 1 : 0
    for (const theme of new Set(themes.map(String))) {
      const c = counts.get(theme) ?? { solved: 0, rows: 0 }
      counts.set(theme, { solved: c.solved + solved, rows: c.rows + 1 })
    }
  })
  return [...counts.entries()].filter(([, c]) => c.solved < c.rows)
    .map(([theme, c]) => ({ theme, ...c }))
    .sort((a, b) => a.solved / a.rows - b.solved / b.rows || b.rows - a.rows || a.theme.localeCompare(b.theme))
}

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
export const summary = (
  trajectories: ReadonlyArray<Trajectory.Trajectory>,
  rows: ReadonlyArray<Readonly<Record<string, unknown>>> = []
): string => {
  const mean = trajectories.reduce((s, t) => s + t.reward, 0) / Math.max(1, trajectories.length)
  const below = themesBelow(trajectories, rows)
  const themes = below.length === 0 ? "" : `below 100 % by theme: ${
    below.map((b) => `${b.theme} ${b.solved}/${b.rows} (${(100 * b.solved / b.rows).toFixed(1)} %)`).join(", ")
  }\n`
  const line = `${trajectories.length} rows: solved ${(Oracle.solveRate(trajectories) * 100).toFixed(1)} %, mean ` +
    `reward ${mean.toFixed(3)}${failureSentence(trajectories)?.sentence ?? ""}\n${themes}`
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
    ),
    json: Json.flag
  },
  Effect.fn("oracle")(function*({ config, rows, json }) {
    yield* Effect.gen(function*() {
      const played = yield* playRows(config, rows).pipe(Json.printed(json, (p) => Json.oracleJson(p.trajectories)))
      if (!json) yield* Console.log(summary(played.trajectories, played.rows))
    }).pipe(exitOnFailure)
  })
).pipe(Command.withDescription("Play a task's oracle (prebuilt, or its module's `oracle`) on a config's held-out rows"))
