/**
 * `agentfly train CONFIG [--resume [--force-resume]] [--overwrite] [--seed N] [--output DIR] [--steps N]`: the main
 * job. Loads the config and its task (`cli/setup.ts`: a built-in name, a module path, or the config module's own
 * `task` export) and runs it with `Train.runConfig` (`actors/Train.ts`: datasets, model folder, the SFT warm-up and
 * the RL loop on the local policy, `metrics.jsonl`, samples, the journal, checkpoints and `report.html`, then
 * held-out accuracy and invalid tool-call rate before and after RL); a progress bar on a terminal, plain lines
 * otherwise.
 *
 * @since 0.1.0
 */
import { Console, Effect, FileSystem, Option } from "effect"
import { isAbsolute, relative, resolve } from "node:path"
import type { Scope } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as Resume from "../actors/Resume.ts"
import * as Train from "../actors/Train.ts"
import * as Json from "./json.ts"
import * as Setup from "./setup.ts"

/**
 * Options of a training run from the command line.
 *
 * @category models
 * @since 0.1.0
 */
export interface RunOptions extends Train.RunOptions, Setup.Overrides {
  readonly config: string
}

/**
 * Runs `agentfly train`: everything but argument parsing. Returns the run summary and the report's path.
 *
 * @category constructors
 * @since 0.1.0
 */
export const run = Effect.fn("cli.train")(function*(
  options: RunOptions
): Effect.fn.Return<Train.Result, unknown, FileSystem.FileSystem | import("effect").Path.Path | Scope.Scope> {
  const { task, config } = yield* Setup.load(options.config, options)
  const write = options.write ?? ((text: string) => void process.stderr.write(text))
  // Said at once: a big model's learner threads can take a while to finish the onnxruntime call they are in.
  const onSignal = (signal: NodeJS.Signals) =>
    write(`${signal}: stopping (the learner's threads first finish the onnxruntime call they are in)\n`)
  yield* Effect.acquireRelease(
    Effect.sync(() => (process.once("SIGINT", onSignal), process.once("SIGTERM", onSignal))),
    () => Effect.sync(() => (process.off("SIGINT", onSignal), process.off("SIGTERM", onSignal)))
  )
  return yield* Train.runConfig(task, config, { ...options, source: options.config }).pipe(
    // Ctrl-C or SIGTERM: what was saved and the command that continues the run.
    Effect.onInterrupt(() =>
      Resume.interruptedNote(config).pipe(
        Effect.flatMap((note) => Effect.sync(() => write(`${note}\nto resume: ${resumeCommand(options)}\n`)))
      )
    )
  )
})

/** A word as a POSIX shell reads it back. */
const shellWord = (word: string): string => /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`

/**
 * How the user ran this command, to repeat it: `agentfly` when it came from PATH (npx, npm link), the script's path
 * when it was run by path (`/path/to/agentfly/bin/agentfly.mjs`, from a folder outside the clone), relative to the
 * working directory when it is inside it.
 *
 * @category getters
 * @since 0.1.0
 */
export const commandName = (script: string | undefined = process.argv[1], cwd = process.cwd()): string => {
  if (script === undefined || !script.endsWith("agentfly.mjs")) return "agentfly"
  const absolute = isAbsolute(script) ? script : resolve(cwd, script)
  const inside = relative(cwd, absolute)
  return inside.startsWith("..") || isAbsolute(inside) ? absolute : `./${inside}`
}

/**
 * The command that resumes a run started with these options.
 *
 * @category getters
 * @since 0.1.0
 */
export const resumeCommand = (options: RunOptions): string =>
  [
    `${shellWord(commandName())} train`,
    shellWord(options.config),
    "--resume",
    ...(options.output === undefined ? [] : ["--output", shellWord(options.output)]),
    ...(options.seed === undefined ? [] : ["--seed", String(options.seed)]),
    ...(options.steps === undefined ? [] : ["--steps", String(options.steps)])
  ].join(" ")

/**
 * Ends a command's expected failures (a bad config, a bad dataset row, a corrupt checkpoint, ...) with their message
 * on stderr and exit code 1.
 *
 * @category combinators
 * @since 0.1.0
 */
export const exitOnFailure = <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A | void, never, R> =>
  Effect.catch(self, (e) =>
    Console.error(e instanceof Error ? e.message : String(e)).pipe(
      Effect.andThen(Effect.sync(() => void (process.exitCode = 1)))
    ))

/**
 * @category commands
 * @since 0.1.0
 */
export const train = Command.make(
  "train",
  {
    config: Argument.String("config").pipe(
      Argument.withDescription(
        "The run's config (.json, .yaml) naming its task, or a task module (.ts) exporting task and config"
      )
    ),
    resume: Flag.Boolean("resume").pipe(
      Flag.withDescription("Continue from the newest intact checkpoint in the output directory"),
      Flag.withDefault(false)
    ),
    forceResume: Flag.Boolean("force-resume").pipe(
      Flag.withDescription("With --resume: continue although the config (seed, steps, ...) differs from the run's"),
      Flag.withDefault(false)
    ),
    overwrite: Flag.Boolean("overwrite").pipe(
      Flag.withDescription("Start over in an output directory that holds an earlier run (its files are replaced)"),
      Flag.withDefault(false)
    ),
    seed: Flag.Int("seed").pipe(Flag.withDescription("Override the config's seed"), Flag.optional),
    output: Flag.String("output").pipe(Flag.withDescription("Override the output directory"), Flag.optional),
    steps: Flag.Int("steps").pipe(Flag.withDescription("Override algorithm.steps"), Flag.optional),
    json: Json.flag
  },
  Effect.fn("train")(function*(args) {
    yield* Effect.scoped(run({
      config: args.config,
      resume: args.resume || args.forceResume,
      forceResume: args.forceResume,
      overwrite: args.overwrite,
      seed: Option.getOrUndefined(args.seed),
      output: Option.getOrUndefined(args.output),
      steps: Option.getOrUndefined(args.steps)
    })).pipe(Json.printed(args.json, Json.trainJson), exitOnFailure)
  })
).pipe(Command.withDescription("Train an agent by RL (optional SFT warm-up), with checkpoints, resume and a report"))
