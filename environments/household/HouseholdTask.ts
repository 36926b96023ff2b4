/**
 * The household task (ALFWorld's six task types) and the science task (ScienceWorld-style: change a substance's
 * state, measure a temperature, build a circuit, grow a seed), two tasks over one engine.
 *
 * **Interface: plain text, as ALFWorld agents speak.** The policy's whole reply is its command (`go to drawer 1`;
 * with several lines, the last one; a leading `>` or `Action:` is dropped). The environment answers every turn in
 * its own voice (`episode.step`: a user message of source `env`, never trained on) and ends the episode with
 * `solved`, `failed` (an irreversible mistake: a measured thing in the wrong box) or `out_of_steps` (the row's
 * step limit, default 30). No tool call: a Hermes call costs ≈ 60 bytes more per step than the command it
 * carries, about as much as the answer, and these episodes are many short steps on a byte-level policy with a
 * 512–1024 token context.
 *
 * **Rows** hold the world, not its description: `seed`, `goal` (see `Goal.ts`), an optional size `world` and
 * `maxSteps`, plus the `question` (the goal in words). The prompt is ALFWorld's opening: the room as the agent sees
 * it, then `Your task is to: ...`, built from the row by the seeded generator (`World.generate`), which also builds
 * the chain's world when the episode starts. What is in closed receptacles is found by exploring.
 *
 * **Reward**: 1 when the goal is reached, else 0. No progress shaping: every step is on the way or not, and a
 * partial-credit term would pay for wandering. Metrics: `acc`, `steps`, `refused` (commands that did nothing) and
 * `acc_<type>` for the row's task type. The one optional term, `validCommands` (how many commands parsed and
 * how many the world accepted, weighted ≤ 0.5), plays the role of the other tasks' tool-call format term for a
 * cold policy.
 *
 * Options (`{ "name": "household", "options": { ... } }`): `maxObservation`, the characters of an answer kept
 * (default 300); `maxSteps`, the step limit of rows that set none; `validCommands`, that term's weight (default 0).
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import * as Environment from "../../src/Environment.ts"
import type * as Message from "../../src/Message.ts"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import * as Goal from "./Goal.ts"
import { Household } from "./Household.ts"
import * as World from "./World.ts"

// ===== Models =====

/**
 * A row's fields.
 *
 * @category models
 * @since 0.1.0
 */
export const Row = Schema.Struct({
  seed: Schema.Int,
  goal: Goal.Goal,
  world: Schema.optionalKey(World.Spec),
  maxSteps: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)))
})
export type Row = typeof Row.Type

/**
 * The tasks' options.
 *
 * @category models
 * @since 0.1.0
 */
export const Options = Schema.Struct({
  maxObservation: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(40))),
  maxSteps: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
  validCommands: Schema.optionalKey(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 0.5 })))
})
export type Options = typeof Options.Type

/**
 * The step limit of rows that set none.
 *
 * @category constants
 * @since 0.1.0
 */
export const defaultMaxSteps = 30

/**
 * The system prompts (every byte of them is paid for in every sequence).
 *
 * @category constants
 * @since 0.1.0
 */
export const systemPrompts = {
  household: "Reply with one command.",
  science: "Reply with one command."
} as const

// ===== Parts =====

/**
 * The opening of an episode: the room the agent starts in, then the task.
 *
 * @category getters
 * @since 0.1.0
 */
export const opening = (row: Row, question?: string): string =>
  `${World.describeRoom(World.generate(row))}\nYour task is to: ${question ?? Goal.text(row.goal)}`

/**
 * The command of an assistant turn: the last non-empty line of its text, without a `>` or `Action:` prefix.
 *
 * @category getters
 * @since 0.1.0
 */
export const commandOf = (assistant: typeof Message.AssistantMessage.Type): string => {
  const content = assistant.content
  const text = typeof content === "string" ? content : (content ?? []).map((p) => ("text" in p ? p.text : "")).join("")
  const lines = text.split("\n").map((l) => l.trim()).filter((l) => l !== "")
  return (lines.at(-1) ?? "").replace(/^(?:action|act|command)\s*:\s*/i, "")
}

/**
 * 1 when the goal was reached, else 0.
 *
 * @category constructors
 * @since 0.1.0
 */
export const solved = Reward.make("solved", {
  dependencies: [Household],
  score: () =>
    Effect.map(Effect.flatMap(Household, (h) => h.snapshot), (s) => {
      const win = s.status === "solved" ? 1 : 0
      const refused = Object.values(s.refused).reduce((a, b) => a + b, 0)
      return {
        reward: win,
        metrics: { acc: win, steps: s.steps, refused, ...(s.type === undefined ? {} : { [`acc_${s.type}`]: win }) }
      }
    })
})

/**
 * How well-formed an episode's commands were: half a point a command in the engine's grammar, half a point one
 * the world accepted, averaged over the episode's steps (0 without any). The household's analogue of the other
 * tasks' tool-call format term, for a cold policy whose episodes all fail (0/1 success alone gives GRPO no signal).
 *
 * @category constructors
 * @since 0.1.0
 */
export const validCommands = Reward.make("validCommands", {
  dependencies: [Household],
  score: () =>
    Effect.map(Effect.flatMap(Household, (h) => h.snapshot), (s) => {
      if (s.steps === 0) return 0
      const refused = Object.values(s.refused).reduce((a, b) => a + b, 0)
      const parsed = s.steps - (s.refused.Unparsed ?? 0)
      return (parsed + s.steps - refused) / (2 * s.steps)
    })
})

/**
 * The task's reward: `solved`, or `solved + w·validCommands` (w ≤ 0.5, so that a solved episode always scores
 * more than any unsolved one).
 *
 * @category constructors
 * @since 0.1.0
 */
export const reward = (weight: number): Reward.Reward<Household> =>
  weight === 0 ? solved : Reward.combine(`solved + ${weight}·validCommands`, [
    { reward: solved, weight: 1 },
    { reward: validCommands, weight }
  ])

/**
 * The episode protocol: the world is built from the row; every turn's command is run and answered; the episode
 * ends when the goal is reached or lost, or the steps run out.
 *
 * @category constructors
 * @since 0.1.0
 */
export const episode = (maxSteps: number): Environment.Episode<Household, Row> => ({
  start: ({ row }) =>
    Effect.flatMap(Household, (h) =>
      Effect.asVoid(h.reset({ seed: row.seed, goal: row.goal, world: row.world, maxSteps: row.maxSteps ?? maxSteps }))),
  step: ({ assistant }) =>
    Effect.map(Effect.flatMap(Household, (h) => h.act(commandOf(assistant))), (step) => {
      if (step.status !== "open") return { messages: [step.text], end: step.status }
      if (step.outOfSteps) return { messages: [`${step.text} You are out of steps.`], end: "out_of_steps" }
      return { messages: [step.text] }
    })
})

/**
 * The conversation of a row: the system prompt, then the opening.
 *
 * @category getters
 * @since 0.1.0
 */
export const prompt = (row: Task.PromptRow<Row>, systemPrompt: string | undefined): Message.Conversation => {
  const user: Message.Message = { role: "user", content: opening(row.fields, row.question) }
  return systemPrompt === undefined ? [user] : [{ role: "system", content: systemPrompt }, user]
}

// ===== Tasks =====

/**
 * The task of a family: its name, system prompt and defaults; the rest is shared.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (family: "household" | "science", options: Options = {}): Task.Task =>
  Task.make(family, {
    description: family === "household"
      ? "ALFWorld's household tasks in a seeded text world, one command a turn"
      : "ScienceWorld-style experiments (phase change, thermometer, circuit, growth) in a seeded text world",
    row: Row,
    prompt,
    reward: reward(options.validCommands ?? 0),
    environment: Environment.perChain(Household.layer(options.maxObservation ?? 300)),
    episode: episode(options.maxSteps ?? defaultMaxSteps),
    defaults: {
      systemPrompt: systemPrompts[family],
      renderTools: false,
      maxTurns: (options.maxSteps ?? defaultMaxSteps) + 1,
      maxNewTokens: 48
    }
  })

/**
 * The household task as a config names it (`"task": "household"`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const household = Task.withOptions("household", Options, (options) => make("household", options))

/**
 * The science task as a config names it (`"task": "science"`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const science = Task.withOptions("science", Options, (options) => make("science", options))
