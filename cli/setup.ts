/**
 * What `agentfly train` and `agentfly eval` share: a config file's task and config.
 *
 * The task comes from the config module itself when it exports `task` (`agentfly train my-task.ts`), or from the
 * config's `task` key: a built-in name (`environments/Tasks.ts`) or a module path relative to the config. The
 * task's defaults fill the config's unset `agent` keys, and command-line overrides go through the same Schema as
 * the file (an override is validated like the key it replaces).
 *
 * @since 0.1.0
 */
import { Effect, Path, Schema } from "effect"
import * as Train from "../actors/Train.ts"
import * as Tasks from "../environments/Tasks.ts"
import * as Task from "../src/Task.ts"
import * as TrainConfig from "../src/TrainConfig.ts"

/**
 * Overrides from the command line (`Train.Overrides`: `--output` is relative to the working directory, a config's own
 * paths to the config).
 *
 * @category models
 * @since 0.1.0
 */
export type Overrides = Train.Overrides

const configError = (file: string, message: string) =>
  new TrainConfig.ConfigError({ source: file, reason: "Invalid", issues: [message] })

const asRecord = (u: unknown): Record<string, unknown> =>
  typeof u === "object" && u !== null && !Array.isArray(u) ? (u as Record<string, unknown>) : {}

/**
 * The task of a read config: its module's `task` export, or its `task` key resolved.
 *
 * @category constructors
 * @since 0.1.0
 */
export const taskOf = (
  source: TrainConfig.Source
): Effect.Effect<Task.Task, TrainConfig.ConfigError | Task.TaskError, Path.Path> =>
  Effect.gen(function*() {
    const path = yield* Path.Path
    const rawRef = asRecord(source.raw)["task"]
    const ref = rawRef === undefined ? undefined : yield* Schema.decodeUnknownEffect(Task.Ref)(rawRef).pipe(
      Effect.mapError(() => {
        // `{ name, options }` whose options are not an object: say so, not that the whole key is wrong.
        const options = asRecord(rawRef)["options"]
        return typeof rawRef === "object" && rawRef !== null && "name" in rawRef && options !== undefined &&
            asRecord(options) !== options
          ? configError(
            source.file,
            `task.options: expected an object of the task's options, got ${JSON.stringify(options)}`
          )
          : configError(source.file, `task: expected a task name, a module path or { name, options }`)
      })
    )
    const exported = source.exports["task"]
    if (exported !== undefined) {
      return yield* Task.instantiate(
        ref === undefined ? source.file : Task.refName(ref),
        exported,
        typeof ref === "object" ? ref.options : undefined,
        { resolvePath: (p) => path.resolve(source.dir, p) }
      )
    }
    if (ref === undefined) {
      // A config written before tasks held the tools and the reward: say what became of its keys.
      const old = ["tools", "reward"].filter((key) => key in asRecord(source.raw))
      return yield* configError(
        source.file,
        `task: missing (a built-in task: ${Object.keys(Tasks.builtins).join(", ")}; or a module path such as ` +
          `"./task.ts"; or run a module that exports \`task\`)` +
          (old.length === 0 ? "" : `; ${old.join(" and ")} ${old.length === 1 ? "is" : "are"} no longer config ` +
            `keys: a task holds its tools and its reward, so name the task that has them (e.g. task: "calculator") ` +
            `and remove ${old.length === 1 ? "it" : "them"}`)
      )
    }
    return yield* Task.resolve(ref, { builtins: Tasks.builtins, resolvePath: (p) => path.resolve(source.dir, p) })
  })

/**
 * Loads a config file and its task, with the task's defaults and the command line's overrides; `source` is the file
 * as read (a module's other exports, e.g. its `oracle`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fn("cli.setup.load")(function*(file: string, overrides: Overrides = {}) {
  const source = yield* TrainConfig.read(file)
  const task = yield* taskOf(source)
  const config = yield* Train.configOf(task, source, overrides)
  return { task, config, source }
})
