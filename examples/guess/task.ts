/**
 * Guess the number: an environment that speaks. Each chain plays its own game (a per-chain environment), reset with
 * its row's secret; the agent guesses with the `guess` tool, the game answers every guess ("Higher." / "Lower.",
 * spans of source `env`) and ends the episode when the number is found or the guesses run out.
 *
 *   npx tsx examples/guess/generate.ts && npx agentfly train examples/guess/task.ts
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer, Ref, Schema } from "effect"
import * as Oracle from "../../actors/Oracle.ts"
import { Environment, Reward, Task, Tool } from "../../src/index.ts"
import { toolCallFormat } from "../../environments/rewards/ToolCallFormat.ts"

/** The numbers are 1…15: binary search finds any of them in at most 4 guesses. */
export const maxGuesses = 4

interface State {
  readonly secret: number
  readonly guesses: ReadonlyArray<number>
}

/** The environment: one game, its state in the layer's scope (one copy per chain). */
export class Game extends Context.Service<Game, {
  readonly reset: (secret: number) => Effect.Effect<void>
  readonly guess: (n: number) => Effect.Effect<void>
  readonly state: Effect.Effect<State>
}>()("examples/guess/Game") {
  static readonly layer = Layer.effect(
    Game,
    Effect.map(Ref.make<State>({ secret: 0, guesses: [] }), (state) =>
      Game.of({
        reset: (secret) => Ref.set(state, { secret, guesses: [] }),
        guess: (n) => Ref.update(state, (s) => ({ ...s, guesses: [...s.guesses, n] })),
        state: Ref.get(state)
      }))
  )
}

const solved = (s: State) => s.guesses.includes(s.secret)

/** The agent's one action. The game answers after the turn (see `episode.step`). */
export const guess = Tool.make("guess", {
  description: "Guess the secret number",
  parameters: Schema.Struct({ n: Schema.Int }),
  dependencies: [Game],
  handler: ({ n }) => Effect.flatMap(Game, (game) => Effect.as(game.guess(n), ""))
})

/** 1 when the number was found within the guesses allowed. */
export const found = Reward.make("found", {
  dependencies: [Game],
  score: () =>
    Effect.map(Effect.flatMap(Game, (game) => game.state), (s) => {
      const win = solved(s) && s.guesses.indexOf(s.secret) < maxGuesses
      return { reward: win ? 1 : 0, metrics: { acc: win ? 1 : 0, guesses: s.guesses.length } }
    })
})

export const task = Task.make("guess", {
  row: Schema.Struct({ secret: Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 15 })) }),
  tools: [guess],
  // A small term for well-formed calls keeps RL from trading the call format for lucky guesses.
  reward: Reward.combine("found + 0.2·format", [{ reward: found, weight: 1 }, { reward: toolCallFormat, weight: 0.2 }]),
  environment: Environment.perChain(Game.layer),
  episode: {
    start: ({ row }) => Effect.flatMap(Game, (game) => game.reset(row.secret)),
    step: ({ observations }) =>
      Effect.map(Effect.flatMap(Game, (game) => game.state), (s) => {
        const last = s.guesses.at(-1)!
        if (solved(s)) return { end: "solved" }
        if (s.guesses.length >= maxGuesses) return { messages: ["No guesses left."], end: "out_of_guesses" }
        // A turn without a valid call (no call, or one that failed to parse) is answered with the rules.
        if (!observations.some((m) => m.role === "tool" && m.is_error !== true)) return { messages: ["Call guess."] }
        return { messages: [last < s.secret ? "Higher." : "Lower."] }
      })
  },
  defaults: { systemPrompt: "Find my number from 1 to 15.", renderTools: false, maxTurns: 5, maxNewTokens: 48 }
})

/**
 * The oracle `agentfly oracle` plays (and the README shows): bisection over 1…15 from the game's answers so far
 * ("Higher." / "Lower."), one `guess` call a turn. It wins every game within the guesses allowed.
 */
export const oracle: Oracle.Policy = (messages) => {
  let [lo, hi] = [1, 15]
  for (const [i, m] of messages.entries()) {
    // Its arguments are `unknown`: the model wrote them.
    const call = m.role === "assistant" ? m.tool_calls?.[0] : undefined
    const n = Number((call?.function.arguments as { n?: number } | undefined)?.n ?? NaN)
    const said = Oracle.text(messages.slice(i + 1).find((later) => later.role === "user"))
    if (!Number.isNaN(n)) [lo, hi] = said.startsWith("Higher") ? [n + 1, hi] : [lo, n - 1]
  }
  return { toolCalls: [Oracle.call(messages, "guess", { n: Math.floor((lo + hi) / 2) })] }
}

export { config } from "./config.ts"
