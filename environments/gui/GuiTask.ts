/**
 * The GUI task: the environment draws a screen (buttons, a text field, a menu) as an image; the agent acts with
 * `click {x, y}` and `type {text}`; after every turn the new screen is shown (an image part of an environment
 * message, never trained on); the episode ends when the goal is met, when a wrong button is pressed, or at the
 * row's step limit. Scored 1 when solved, else 0 (`reward/gui/{solved,steps,missed}`).
 *
 * Rows: `{ question, layout, goal, maxSteps }` (`Generator.Row`), from `examples/gui/generate.ts`. Options
 * (`{ "name": "gui", "options": { … } }`): `toolCallFormat`, the weight of a tool-call format term (default 0);
 * `screenFirst`, the first screen in the question's message before its text (default false: a message of its own
 * after the question), so that its image tokens sit at the same positions whatever the question's length;
 * `alignment`, the weight (at most 1/2) of a shaping term that credits a click in the target's columns or rows
 * (`aligned`, default 0; the run's accuracy stays the success rate).
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer, Schema } from "effect"
import type { Scope } from "effect"
import * as Environment from "../../src/Environment.ts"
import type * as Message from "../../src/Message.ts"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import * as Tool from "../../src/Tool.ts"
import * as ToolCallFormat from "../rewards/ToolCallFormat.ts"
import * as Generator from "./Generator.ts"
import * as Render from "./Render.ts"
import * as Screen from "./Screen.ts"

// ===== Service =====

/**
 * A chain's screen as a service: reset with a row, the tools' actions, and the state (read by the reward and the
 * episode).
 *
 * @category services
 * @since 0.1.0
 */
export class Gui extends Context.Service<Gui, {
  readonly reset: (row: Generator.Fields) => Effect.Effect<Screen.State>
  readonly act: (action: Screen.Action) => Effect.Effect<string, Environment.EnvError>
  readonly state: Effect.Effect<Screen.State | undefined>
}>()("agentfly/environments/gui/Gui") {}

/**
 * One screen per build (use with `Environment.perChain`).
 *
 * @category layers
 * @since 0.1.0
 */
export const layer: Layer.Layer<Gui> = Layer.sync(Gui, () => {
  let state: Screen.State | undefined
  return Gui.of({
    reset: (row) => Effect.sync(() => (state = Screen.start(row.layout, row.goal, row.maxSteps))),
    act: (action) =>
      Effect.suspend(() => {
        if (state === undefined) {
          const message = "no screen: the episode was not started"
          return Effect.fail(Environment.envError("gui", action._tag, "InvalidAction", message))
        }
        const outcome = Screen.act(state, action)
        state = outcome.state
        return Effect.succeed(outcome.text)
      }),
    state: Effect.sync(() => state)
  })
})

/**
 * The task's provider: a fresh screen per chain, counted in a run's metrics (`env/gui/screens`, `env/gui/open`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const provider = (): Effect.Effect<Environment.Provider<Gui, never, never>, never, Scope.Scope> =>
  Effect.sync(() =>
    Environment.counted(Environment.perChain(layer), { started: "env/gui/screens", open: "env/gui/open" })
  )

// ===== Tools =====

const act = (action: Screen.Action) => Effect.flatMap(Gui, (gui) => gui.act(action))

/**
 * `click {x, y}`: a click at a pixel of the screen (0, 0 is the top-left corner).
 *
 * @category tools
 * @since 0.1.0
 */
export const click = Tool.make("click", {
  description: "Click at pixel (x, y) of the screen; (0, 0) is the top-left corner",
  parameters: Schema.Struct({ x: Schema.Int, y: Schema.Int }),
  failure: Environment.EnvError,
  dependencies: [Gui],
  handler: ({ x, y }) => act({ _tag: "click", x, y })
})

/**
 * `type {text}`: types into the field that has the focus.
 *
 * @category tools
 * @since 0.1.0
 */
export const type = Tool.make("type", {
  description: "Type text into the focused field",
  parameters: Schema.Struct({ text: Schema.String }),
  failure: Environment.EnvError,
  dependencies: [Gui],
  handler: ({ text }) => act({ _tag: "type", text })
})

/**
 * The two tools.
 *
 * @category constants
 * @since 0.1.0
 */
export const tools = [click, type] as const

// ===== Reward and episode =====

/**
 * The screen's score (`Screen.score`) with `reward/gui/{solved,steps,missed}`.
 *
 * @category rewards
 * @since 0.1.0
 */
export const solved = Reward.make("gui", {
  dependencies: [Gui],
  score: () =>
    Effect.map(Effect.flatMap(Gui, (g) => g.state), (state) =>
      state === undefined
        ? { reward: 0, metrics: { solved: 0, steps: 0, missed: 0 } }
        : {
          reward: Screen.score(state),
          metrics: { solved: Screen.score(state), steps: state.steps, missed: state.missed }
        })
})

/**
 * The best alignment of the episode's clicks with a click goal's target (`Screen.alignment`: 1/2 per coordinate
 * within the target's span), as `reward/gui_aligned/aligned`: a shaping term, weighted by the task's `alignment`
 * option, that credits the right column or row of a missed click.
 *
 * @category rewards
 * @since 0.1.0
 */
export const aligned = Reward.make("gui_aligned", {
  dependencies: [Gui],
  score: () =>
    Effect.map(Effect.flatMap(Gui, (g) => g.state), (state) => {
      const value = state?.aligned ?? 0
      // `acc`: a run's accuracy is the episode's success, not a reward of at least 1 (`Trajectory.isCorrect`).
      return { reward: value, metrics: { aligned: value, acc: state === undefined ? 0 : Screen.score(state) } }
    })
})

/**
 * The task's reward: solved, plus the weighted format and alignment terms when their weights are positive.
 *
 * @category rewards
 * @since 0.1.0
 */
export const reward = (toolCallFormat: number, alignment: number) =>
  alignment === 0 ? ToolCallFormat.withFormat(solved, toolCallFormat) : Reward.combine(
    `gui + ${toolCallFormat}·toolCallFormat + ${alignment}·aligned`,
    [
      { reward: solved, weight: 1 },
      { reward: ToolCallFormat.toolCallFormat, weight: toolCallFormat },
      { reward: aligned, weight: alignment }
    ]
  )

/**
 * The screen as an environment message: one image part.
 *
 * @category getters
 * @since 0.1.0
 */
export const screenMessage = (state: Screen.State): Message.Message => ({
  role: "user",
  content: [{ type: "image_url", image_url: { url: Render.dataUrl(state) } }]
})

/**
 * A row's conversation with its first screen before the question, in one user message.
 *
 * @category getters
 * @since 0.1.0
 */
export const screenFirstPrompt = (
  row: { readonly question?: string | undefined; readonly fields: Generator.Fields },
  system: string | undefined
): Message.Conversation => {
  const { layout, goal, maxSteps } = row.fields
  const screen = screenMessage(Screen.start(layout, goal, maxSteps)).content
  return [
    ...(system === undefined ? [] : [{ role: "system" as const, content: system }]),
    { role: "user", content: [...(typeof screen === "string" ? [] : screen), { type: "text", text: row.question ?? "" }] }
  ]
}

/**
 * The one-line system prompt.
 *
 * @category constants
 * @since 0.1.0
 */
export const systemPrompt = "Use the screen: click {x, y} or type {text}."

/**
 * The task with its options.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (
  options: {
    readonly toolCallFormat?: number | undefined
    readonly screenFirst?: boolean | undefined
    readonly alignment?: number | undefined
  } = {}
): Task.Task =>
  Task.make("gui", {
    description: "Operate a drawn screen (buttons, a text field, a menu) by clicking and typing",
    row: Generator.Fields,
    ...(options.screenFirst === true ? { prompt: screenFirstPrompt } : {}),
    tools,
    reward: reward(options.toolCallFormat ?? 0, options.alignment ?? 0),
    environment: provider(),
    episode: {
      start: ({ row }) =>
        Effect.flatMap(
          Gui,
          (g) => Effect.map(g.reset(row), (state) => (options.screenFirst === true ? [] : [screenMessage(state)]))
        ),
      // A turn without an action ends the episode: the screen would not change, so showing it again only costs.
      step: ({ assistant }) =>
        Effect.flatMap(Gui, (g) =>
          Effect.map(g.state, (state): Environment.EpisodeStep | undefined => {
            if (state === undefined) return undefined
            if (state.outcome !== undefined) return { end: state.outcome }
            if ((assistant.tool_calls ?? []).length === 0) return { end: "no_action" }
            return { messages: [screenMessage(state)] }
          }))
    },
    defaults: {
      systemPrompt,
      renderTools: false,
      maxTurns: 5,
      maxNewTokens: 48,
      maxContextTokens: 512
    }
  })

/**
 * The task as a config names it (`"task": "gui"`, with optional options).
 *
 * @category constructors
 * @since 0.1.0
 */
export const task = Task.withOptions(
  "gui",
  Schema.Struct({
    toolCallFormat: Schema.optionalKey(Schema.Number.check(Schema.isGreaterThanOrEqualTo(0))),
    screenFirst: Schema.optionalKey(Schema.Boolean),
    alignment: Schema.optionalKey(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 0.5 })))
  }),
  make
)
