/**
 * `agentfly report RUN_DIR`: regenerates `report.html` in a run directory from its `metrics.jsonl`,
 * `samples.jsonl` and `config.json` (self-contained: charts and the trajectory viewer, no network).
 *
 * @since 0.1.0
 */
import { Console, Effect } from "effect"
import { Argument, Command } from "effect/cli"
import * as Report from "../src/Report.ts"
import { exitOnFailure } from "./train.ts"

/**
 * @category commands
 * @since 0.1.0
 */
export const report = Command.make(
  "report",
  { dir: Argument.Directory("run-dir").pipe(Argument.withDescription("The run's output directory")) },
  Effect.fn("report")(function*({ dir }) {
    yield* Effect.gen(function*() {
      // A folder without a run gets a sentence, not an empty report or a file system error.
      yield* Report.requireRun(dir)
      const { metrics, samples } = yield* Report.read(dir)
      const path = yield* Report.write(dir)
      yield* Console.log(`wrote ${path} (${metrics.length} metric records, ${samples.length} sampled trajectories)`)
    }).pipe(exitOnFailure)
  })
).pipe(Command.withDescription("Regenerate report.html for a training run"))
