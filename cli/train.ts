/**
 * `agentfly train CONFIG [--resume [--force-resume]] [--seed N] [--output DIR] [--steps N]`: the main job. Loads the config and its
 * task (`cli/setup.ts`: a built-in name, a module path, or the config module's own `task` export), the model
 * folder (initialising it from `model.preset` when missing) and the datasets; runs the SFT
 * warm-up and the RL loop (`actors/Trainer.ts`) on the local policy (`actors/LocalPolicy.ts`); shows a progress bar
 * on a terminal (plain lines otherwise); writes `metrics.jsonl`, `samples.jsonl`, the journal, checkpoints and
 * `report.html` in the output directory; and ends with held-out accuracy and invalid tool-call rate before and
 * after RL.
 *
 * @since 0.1.0
 */
import { Console, Effect, FileSystem, Option } from "effect"
import type { Scope } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as LocalPolicy from "../actors/LocalPolicy.ts"
import * as Metrics from "../actors/Metrics.ts"
import * as ResourceManager from "../actors/ResourceManager.ts"
import * as Trainer from "../actors/Trainer.ts"
import * as Dataset from "../src/Dataset.ts"
import * as DiskFull from "../src/internal/diskFull.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Report from "../src/Report.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import * as Setup from "./setup.ts"

const usage = (message: string) =>
  new TrainConfig.ConfigError({ source: "config", reason: "Invalid", issues: [message] })

/**
 * Options of a training run from the command line.
 *
 * @category models
 * @since 0.1.0
 */
export interface RunOptions {
  readonly config: string
  readonly resume?: boolean
  /** Resume although the config differs from the run's recorded one (the changes are printed). */
  readonly forceResume?: boolean | undefined
  readonly seed?: number | undefined
  readonly output?: string | undefined
  readonly steps?: number | undefined
  /** Where progress goes (default: stderr, as a bar on a terminal). */
  readonly write?: ((text: string) => void) | undefined
  readonly tty?: boolean | undefined
}

/**
 * Runs `agentfly train`: everything but argument parsing. Returns the run summary and the report's path.
 *
 * @category constructors
 * @since 0.1.0
 */
export const run = Effect.fn("cli.train")(function*(
  options: RunOptions
): Effect.fn.Return<
  { readonly summary: Trainer.Summary; readonly report: string; readonly config: TrainConfig.TrainConfig },
  unknown,
  FileSystem.FileSystem | import("effect").Path.Path | Scope.Scope
> {
  const fs = yield* FileSystem.FileSystem
  const { task, config: requested } = yield* Setup.load(options.config, options)
  const write = options.write ?? ((text: string) => void process.stderr.write(text))
  const tty = options.tty ?? process.stderr.isTTY === true
  const say = (text: string) => Effect.sync(() => write(text + "\n"))

  // Datasets first: a bad row stops the run before anything is written.
  const onInvalid = requested.data.onInvalidRow
  const fields = task.row
  const train = yield* Dataset.load(requested.data.train, { onInvalid, fields })
  const evalSet = requested.data.eval === undefined
    ? undefined
    : yield* Dataset.load(requested.data.eval, { onInvalid, fields })
  const demos = requested.warmup === undefined
    ? undefined
    : yield* Dataset.load(requested.warmup.data, { onInvalid, kind: "conversation" })
  const validation = requested.warmup?.stopAt === undefined
    ? undefined
    : yield* Dataset.load(requested.warmup.stopAt.data, { onInvalid, fields })
  for (const ds of [train, evalSet, demos, validation]) {
    for (const issue of ds?.skipped ?? []) yield* say(`skipped ${ds!.name}:${issue.line}: ${issue.message}`)
  }

  // Model folder (initialised from the preset when missing).
  if (!(yield* fs.exists(`${requested.model.path}/config.json`))) {
    const preset = requested.model.preset
    if (preset === undefined || !(preset in ModelConfig.presets)) {
      return yield* usage(`model.path ${requested.model.path} has no model and model.preset is not a known preset`)
    }
    yield* say(`initialising ${requested.model.path} from preset ${preset} (seed ${requested.model.initSeed})`)
    yield* ModelFolder.init(requested.model.path, {
      preset: preset as ModelConfig.PresetName,
      seed: requested.model.initSeed
    })
  }
  const folder = yield* ModelFolder.load(requested.model.path)
  const config = LocalPolicy.onModel(folder, requested)

  yield* fs.makeDirectory(config.output, { recursive: true })
  const display = Metrics.display({ write, tty, columns: process.stderr.columns ?? 100, everySteps: 5 })
  yield* say(
    `training ${folder.name} on task ${task.name}, ${train.rows.length} rows (${config.mode}, ` +
      `${config.algorithm.steps} steps, seed ${config.seed}) → ${config.output}`
  )
  const summary = yield* Trainer.run({
    task,
    config,
    format: Setup.formatOf(config, folder),
    train,
    eval: evalSet,
    demos,
    validation,
    resume: options.resume === true,
    forceResume: options.forceResume === true,
    notice: say,
    tokenText: (id) => folder.tokenizer.decode([id]),
    display
  }).pipe(
    Effect.provide(LocalPolicy.layer(folder, config)),
    // What a task's environment may need from the run: pools of sandboxes and other leased resources.
    Effect.provide(ResourceManager.ResourceManager.layer),
    Effect.ensuring(display.done)
  )
  const report = yield* Report.write(config.output).pipe(
    Effect.mapError((e) =>
      DiskFull.isDiskFull(e)
        ? new Trainer.TrainerError({
          reason: "DiskFull",
          message: `${DiskFull.marker}: could not write the report under ${config.output}; free space, then ` +
            `\`agentfly report\` or --resume`
        })
        : e
    )
  )
  // The whole run's figures (a resumed run's summary holds only its own).
  const records = (yield* Report.read(config.output)).metrics
  const evals = records.filter((m) => m.phase === "eval")
  const steps = new Map(records.filter((m) => m.phase === "train").map((m) => [m.step, m.figures]))
  const trained = [...steps.values()].filter((f) => f["learner/applied"] !== 0).length
  const first = evals[0]
  const last = evals.at(-1)
  if (first !== undefined && last !== undefined) {
    const f = (x: number | undefined) => (x === undefined ? "–" : x.toFixed(3))
    const se = (x: number | undefined) => (x === undefined ? "" : ` ± ${x.toFixed(3)}`)
    const before = first.figures["eval/accuracy"]
    const after = last.figures["eval/accuracy"]
    const afterSe = last.figures["eval/accuracy_se"]
    // The gain in standard errors of the final figure: what tells a real gain from evaluation noise.
    const gain = before === undefined || after === undefined || afterSe === undefined || afterSe === 0 ||
        last === first
      ? ""
      : ` (gain ${after >= before ? "+" : ""}${(after - before).toFixed(3)}, ${((after - before) / afterSe).toFixed(1)} SE)`
    yield* say(
      `held-out accuracy ${f(before)}${se(first.figures["eval/accuracy_se"])} (step ${first.step}) → ` +
        `${f(after)}${se(afterSe)} (step ${last.step})${gain}; invalid tool-call rate ` +
        `${f(first.figures["eval/invalid_tool_call_rate"])} → ${f(last.figures["eval/invalid_tool_call_rate"])}`
    )
  }
  yield* say(
    `trained ${trained} of ${steps.size} steps` +
      (steps.size > trained ? ` (${steps.size - trained} skipped: no learning signal, every group's rewards equal)` : "")
  )
  yield* say(`report: ${report}`)
  if (trained === 0 && steps.size > 0) {
    return yield* new Trainer.TrainerError({
      reason: "Learner",
      message: `no step trained: every group's rewards were equal in all ${steps.size} steps (see ${report})`
    })
  }
  return { summary, report, config }
})

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
      Argument.withDescription("The run's config (.json, .yaml) naming its task, or a task module (.ts) exporting task and config")
    ),
    resume: Flag.Boolean("resume").pipe(
      Flag.withDescription("Continue from the newest intact checkpoint in the output directory"),
      Flag.withDefault(false)
    ),
    forceResume: Flag.Boolean("force-resume").pipe(
      Flag.withDescription("With --resume: continue although the config (seed, steps, ...) differs from the run's"),
      Flag.withDefault(false)
    ),
    seed: Flag.Int("seed").pipe(Flag.withDescription("Override the config's seed"), Flag.optional),
    output: Flag.String("output").pipe(Flag.withDescription("Override the output directory"), Flag.optional),
    steps: Flag.Int("steps").pipe(Flag.withDescription("Override algorithm.steps"), Flag.optional)
  },
  Effect.fn("train")(function*(args) {
    yield* Effect.scoped(run({
      config: args.config,
      resume: args.resume || args.forceResume,
      forceResume: args.forceResume,
      seed: Option.getOrUndefined(args.seed),
      output: Option.getOrUndefined(args.output),
      steps: Option.getOrUndefined(args.steps)
    })).pipe(exitOnFailure)
  })
).pipe(Command.withDescription("Train an agent by RL (optional SFT warm-up), with checkpoints, resume and a report"))
