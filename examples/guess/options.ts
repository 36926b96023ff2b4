/**
 * The guess game with options that a config sets (`Task.withOptions`): how much the call-format term weighs in the
 * reward, and how many turns an episode may take. A config names the module and gives the options beside it:
 *
 *   { "task": { "name": "./options.ts", "options": { "formatWeight": 0, "maxTurns": 6 } } }
 *
 * The options are decoded with the Schema before the task is made: a misspelt key or a value out of range stops
 * the run before anything is written (`TaskError` of reason `Options`, naming the key and, when one is near, the
 * key meant). In code, `yield* task({ formatWeight: 0 })` gives the task itself.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import { toolCallFormat } from "../../environments/rewards/ToolCallFormat.ts"
import { Environment, Reward, Task } from "../../src/index.ts"
import { found, Game, guess, task as plain } from "./task.ts"

/** The options, every one optional: `{}` is the game of `task.ts`. */
export const Options = Schema.Struct({
  /** Weight of the `toolCallFormat` term beside `found` (default 0.2; 0: `found` alone). */
  formatWeight: Schema.optionalKey(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1 }))),
  /** Turns an episode may take (default 5, the task's own). */
  maxTurns: Schema.optionalKey(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 20 })))
})

/** The game for decoded options: the parts of `task.ts`, the reward and the defaults the options ask for. */
export const make = (options: typeof Options.Type) => {
  const weight = options.formatWeight ?? 0.2
  return Task.make("guess", {
    row: plain.row,
    tools: [guess],
    reward: weight === 0 ? found : Reward.combine(`found + ${weight}·format`, [
      { reward: found, weight: 1 },
      { reward: toolCallFormat, weight }
    ]),
    environment: Environment.perChain(Game.layer),
    episode: plain.episode,
    defaults: { ...plain.defaults, maxTurns: options.maxTurns ?? plain.defaults.maxTurns }
  })
}

/** The task as a config names it (`"name": "./options.ts"`, with `options`). */
export const task = Task.withOptions("guess", Options, make)
