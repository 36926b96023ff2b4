/**
 * `agentfly report RUN_DIR [RUN_DIR ...] [--out FILE]`: with one run directory, regenerates its `report.html` from
 * its `metrics.jsonl`, `samples.jsonl` and `config.json` (self-contained: charts and the trajectory viewer, no
 * network); with several, writes one page comparing them (`--out`, default `compare.html` here).
 *
 * @since 0.1.0
 */
import { Console, Effect, FileSystem, Option } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as Report from "../src/Report.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import { exitOnFailure } from "./train.ts"

/**
 * Fails when `path` is a file given where a run's folder belongs; a config file is read for the folder its run
 * wrote.
 *
 * @category constructors
 * @since 0.1.0
 */
export const notAFile = Effect.fnUntraced(function*(path: string) {
  const fs = yield* FileSystem.FileSystem
  const info = yield* Effect.option(fs.stat(path))
  if (info._tag === "None" || info.value.type !== "File") return
  const output = yield* TrainConfig.load(path).pipe(Effect.map((c) => c.output), Effect.option)
  return yield* new Report.ReportError({
    dir: path,
    message: `${path} is a file: give a run's output directory` +
      (output._tag === "Some" ? ` (this config's run writes to ${output.value})` : "")
  })
})

/**
 * @category commands
 * @since 0.1.0
 */
export const report = Command.make(
  "report",
  {
    // Paths, checked here: a config file given for its run gets a sentence naming the run's folder, not the help.
    dirs: Argument.String("run-dir").pipe(
      Argument.withDescription("A run's output directory; several to compare them on one page"),
      Argument.variadic({ min: 1 })
    ),
    out: Flag.String("out").pipe(
      Flag.withDescription("Where a comparison of several runs is written (default compare.html)"),
      Flag.optional
    )
  },
  Effect.fn("report")(function*({ dirs, out }) {
    yield* Effect.gen(function*() {
      yield* Effect.forEach(dirs, notAFile, { discard: true })
      if (dirs.length > 1) {
        const path = yield* Report.writeComparison(dirs, Option.getOrElse(out, () => "compare.html"))
        yield* Console.log(`wrote ${path} (${dirs.length} runs compared)`)
        return
      }
      const dir = dirs[0]!
      if (Option.isSome(out)) {
        return yield* new Report.ReportError({
          dir,
          message: `--out is where a comparison of several runs goes; one run's report is ${dir}/report.html`
        })
      }
      // A folder without a run gets a sentence, not an empty report or a file system error.
      yield* Report.requireRun(dir)
      const { metrics, samples } = yield* Report.read(dir)
      const path = yield* Report.write(dir)
      yield* Console.log(`wrote ${path} (${metrics.length} metric records, ${samples.length} sampled trajectories)`)
    }).pipe(exitOnFailure)
  })
).pipe(Command.withDescription("Regenerate report.html for a training run, or compare several runs on one page"))
