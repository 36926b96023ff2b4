/**
 * The `agentfly` program.
 *
 * Every subcommand lives in its own file `cli/<name>.ts` that exports one `Command`; registering it is one line in
 * `subcommands` below. Run with `npm run agentfly -- <subcommand> ...` (or the `agentfly` bin).
 *
 * @since 0.1.0
 */
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Console, Effect } from "effect"
import { CliOutput, Command } from "effect/cli"
import { evaluate } from "./eval.ts"
import { exportCommand } from "./export.ts"
import { gateway } from "./gateway.ts"
import { init } from "./init.ts"
import { initModel } from "./initModel.ts"
import { mcp } from "./mcp.ts"
import { oracle } from "./oracle.ts"
import { serve } from "./serve.ts"
import { report } from "./report.ts"
import { rolloutWorker } from "./rolloutWorker.ts"
import { tokens } from "./tokens.ts"
import { trainer } from "./trainer.ts"
import { train } from "./train.ts"
import { watch } from "./watch.ts"

/**
 * The subcommands of `agentfly`, one line each.
 *
 * @category commands
 * @since 0.1.0
 */
const subcommands = [
  init,
  initModel,
  serve,
  rolloutWorker,
  gateway,
  train,
  trainer,
  evaluate,
  report,
  watch,
  oracle,
  tokens,
  exportCommand,
  mcp
] as const

/**
 * The root command.
 *
 * @category commands
 * @since 0.1.0
 */
export const agentfly = Command.make("agentfly").pipe(
  Command.withDescription("Train language-model agents with reinforcement learning"),
  Command.withSubcommands(subcommands)
)

/**
 * A bad invocation (an unknown flag, a value that does not parse, a missing argument) says only what was wrong and
 * where the usage is, as a bad config does: the default printed the whole help first, which buried the one line
 * that mattered. `--help` and a command without a subcommand still print the help.
 *
 * @category layers
 * @since 0.1.0
 */
export const presenter = CliOutput.layerPresenter({
  present: (event) =>
    event._tag === "InvalidInvocation"
      ? Console.error(
        [...event.errors.map((e) => e.message), `See \`${event.commandPath.join(" ")} --help\`.`].join("\n")
      )
      : CliOutput.defaultPresenter.present(event)
})

Command.run(agentfly, { version: "0.1.0" }).pipe(
  Effect.provide([NodeServices.layer, presenter]),
  NodeRuntime.runMain
)
