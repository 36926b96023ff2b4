/**
 * The SimuScene-style task: a scene described in words (balls in a box, gravity, a wind, bouncing walls); the agent
 * writes a Python program that simulates it and prints each ball's positions; `simulate {code}` runs the program in
 * the chain's Python sandbox (a fresh interpreter a call), checks the output's shape, and draws the frames of the
 * agent's simulation (shown to a vision policy with `showFrames`). The reward compares the simulation with the
 * reference's: the share of positions within 2 % of the box (`Scene.trajectoryScore`) and the overlap of the frames'
 * ball pixels with the reference frames' (`Frames.overlap`), weighted 0.75 / 0.25 by default.
 *
 * The episode ends at the first well-formed simulation (`submitted`); a program that fails or prints the wrong shape
 * gets the reason and another turn, up to `maxTurns`. Rows: `{ question, scene }` (`examples/simuscene/generate.ts`).
 * Options: `sandbox` (`docker`, the default, or `bubblewrap`), `pool` (sandboxes at once, default 64),
 * `frameWeight` (default 0.25), `showFrames` (default false: the frames of the agent's simulation close the episode
 * as an image, for a vision policy; a text-only policy cannot take an image part), `judge` (default none: a judge
 * model behind any OpenAI-compatible vision endpoint also scores the frames, `Judge.grade` with the agent's and the
 * reference's strips as images, mixed in by its `weight`; {@link reward}).
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer, Schema } from "effect"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as Docker from "../../actors/resources/Docker.ts"
import * as Environment from "../../src/Environment.ts"
import type * as Message from "../../src/Message.ts"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import * as Tool from "../../src/Tool.ts"
import type * as Trajectory from "../../src/Trajectory.ts"
import * as PythonSandbox from "../python/PythonSandbox.ts"
import * as Judge from "../rewards/Judge.ts"
import * as Frames from "./Frames.ts"
import * as Scene from "./Scene.ts"

// ===== State =====

/**
 * A chain's episode: its scene and the latest well-formed simulation, if any.
 *
 * @category models
 * @since 0.1.0
 */
export interface Episode {
  readonly scene: Scene.Scene
  readonly submitted: Scene.Trajectories | undefined
  readonly attempts: number
}

/**
 * The chain's episode as a service.
 *
 * @category services
 * @since 0.1.0
 */
export class Simulation extends Context.Service<Simulation, {
  readonly reset: (scene: Scene.Scene) => Effect.Effect<void>
  readonly submit: (paths: Scene.Trajectories | undefined) => Effect.Effect<Episode | undefined>
  readonly state: Effect.Effect<Episode | undefined>
}>()("agentfly/environments/simuscene/Simulation") {}

/**
 * One episode per build (use with `Environment.perChain`).
 *
 * @category layers
 * @since 0.1.0
 */
export const simulationLayer: Layer.Layer<Simulation> = Layer.sync(Simulation, () => {
  let episode: Episode | undefined
  return Simulation.of({
    reset: (scene) => Effect.sync(() => void (episode = { scene, submitted: undefined, attempts: 0 })),
    submit: (paths) =>
      Effect.sync(() =>
        episode === undefined ? undefined : (episode = {
          ...episode,
          attempts: episode.attempts + 1,
          submitted: paths ?? episode.submitted
        })
      ),
    state: Effect.sync(() => episode)
  })
})

// ===== Tool =====

/** The last line of stdout that parses as JSON, or the reason none does. */
const lastJson = (stdout: string): { readonly value: unknown } | { readonly error: string } => {
  const lines = stdout.split("\n").map((l) => l.trim()).filter((l) => l !== "")
  for (let i = lines.length - 1; i >= 0; i--) {
    try {
      return { value: JSON.parse(lines[i]!) }
    } catch {
      continue
    }
  }
  return { error: "the program printed no JSON" }
}

/**
 * What `simulate` tells the agent for a program's run: the reason it cannot be scored, or what was simulated.
 *
 * @category getters
 * @since 0.1.0
 */
export const judgeRun = (scene: Scene.Scene, result: PythonSandbox.RunResult) => {
  if (result.error !== null) {
    return { text: `Error: the program failed: ${result.stderr.trim().split("\n").slice(-1)[0] ?? result.error}` }
  }
  const printed = lastJson(result.stdout)
  if ("error" in printed) return { text: `Error: ${printed.error}.` }
  const wrong = Scene.checkShape(scene, printed.value)
  if (wrong !== undefined) return { text: `Error: ${wrong}.` }
  const paths = printed.value as Scene.Trajectories
  return { text: `Simulated ${scene.balls.length} ball(s) for ${scene.steps} steps.`, paths }
}

/**
 * `simulate {code}`: runs the program in a fresh interpreter of the chain's sandbox and checks what it printed.
 *
 * @category tools
 * @since 0.1.0
 */
export const simulate = Tool.make("simulate", {
  description: "Run a Python program that simulates the scene and prints JSON {ball: [[x, y], ...]}",
  parameters: Schema.Struct({ code: Schema.String }),
  success: Schema.String,
  failure: Schema.Union([PythonSandbox.PythonError, Environment.EnvError]),
  dependencies: [PythonSandbox.PythonSandbox, Simulation],
  handler: ({ code }) =>
    Effect.gen(function*() {
      const sim = yield* Simulation
      const episode = yield* sim.state
      if (episode === undefined) {
        const message = "no scene: the episode was not started"
        return yield* Environment.envError("simuscene", "simulate", "InvalidAction", message)
      }
      const result = yield* Effect.flatMap(PythonSandbox.PythonSandbox, (s) => s.run(code, { fresh: true }))
      const judged = judgeRun(episode.scene, result)
      yield* sim.submit(judged.paths)
      return judged.text
    })
})

// ===== Reward and episode =====

/**
 * A judge of the frames: where it is (`Judge.Options`; `rubric` defaults to {@link judgeRubric}) and its `weight` in
 * the reward.
 *
 * @category models
 * @since 0.1.0
 */
export const JudgeOptions = Schema.Struct({
  ...Judge.Config.fields,
  rubric: Schema.optionalKey(Schema.String),
  weight: Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1 }))
})
export type JudgeOptions = typeof JudgeOptions.Type

/**
 * What the judge grades by default: the agent's frames against the scene's words and the reference's frames.
 *
 * @category constants
 * @since 0.1.0
 */
export const judgeRubric = "The transcript states a scene in words and holds the agent's simulation program. The " +
  "first image shows the agent's simulation at four moments (a quarter, half, three quarters and all of its steps, " +
  "left to right; balls are black discs, the box's floor is the bottom edge); the second shows the reference " +
  "simulation at the same moments. 1 if the agent's frames show the motion the words describe and match the " +
  "reference's, 0.5 if the motion is plausible but the balls are elsewhere, 0 if they do not move as described."

/**
 * The images a judge sees for a scored simulation: the agent's strip, then the reference's.
 *
 * @category getters
 * @since 0.1.0
 */
export const judgeFigures = (
  scene: Scene.Scene,
  submitted: Scene.Trajectories,
  reference: Scene.Trajectories
): ReadonlyArray<Judge.Figure> => [
  { caption: "The agent's simulation:", url: Frames.dataUrl(scene, submitted) },
  { caption: "The reference simulation:", url: Frames.dataUrl(scene, reference) }
]

/**
 * The judge's score of a simulation, and whether it failed: a judge that is down or answers without a readable
 * score (`Judge.grade`'s `ScoreFailed`) scores 0 here and is logged, so the simulation's own terms still count.
 */
const judged = (judge: JudgeOptions, trajectory: Trajectory.Trajectory, figures: ReadonlyArray<Judge.Figure>) =>
  Judge.grade({ ...judge, rubric: judge.rubric ?? judgeRubric }, trajectory, figures).pipe(
    Effect.map((score) => ({ score, failed: 0 })),
    Effect.catch((error) =>
      Effect.as(
        Effect.logWarning(`simuscene: the judge's verdict is scored 0: ${error.message}`),
        { score: 0, failed: 1 }
      )
    )
  )

/**
 * The reward of a frame weight: `(1 − w)·trajectory + w·frames` of the latest well-formed simulation, 0 without
 * one; metrics `reward/simuscene/{trajectory,frames,submitted,attempts}`. With a `judge`, that sum weighs
 * `1 − judge.weight` and the judge's score of the frames ({@link judgeFigures}) `judge.weight`; metrics
 * `reward/simuscene/{judge,judge_failed}` too (a failed judge scores 0: see `judge_failed`). No simulation, no call.
 *
 * @category rewards
 * @since 0.1.0
 */
export const reward = (frameWeight: number, judge?: JudgeOptions) =>
  Reward.make("simuscene", {
    dependencies: [Simulation],
    score: ({ trajectory }) =>
      Effect.gen(function*() {
        const episode = yield* Effect.flatMap(Simulation, (s) => s.state)
        const judging = judge === undefined ? {} : { judge: 0, judge_failed: 0 }
        if (episode?.submitted === undefined) {
          const metrics = { trajectory: 0, frames: 0, submitted: 0, attempts: episode?.attempts ?? 0, ...judging }
          return { reward: 0, metrics }
        }
        const reference = Scene.simulate(episode.scene)
        const trajectoryScore = Scene.trajectoryScore(episode.scene, episode.submitted, reference)
        const frames = Frames.overlap(episode.scene, episode.submitted, reference)
        const own = (1 - frameWeight) * trajectoryScore + frameWeight * frames
        const metrics = { trajectory: trajectoryScore, frames, submitted: 1, attempts: episode.attempts }
        if (judge === undefined) return { reward: own, metrics }
        const verdict = yield* judged(judge, trajectory, judgeFigures(episode.scene, episode.submitted, reference))
        return {
          reward: (1 - judge.weight) * own + judge.weight * verdict.score,
          metrics: { ...metrics, judge: verdict.score, judge_failed: verdict.failed }
        }
      })
  })

const framesMessage = (episode: Episode): Message.Message => ({
  role: "user",
  content: [{ type: "image_url", image_url: { url: Frames.dataUrl(episode.scene, episode.submitted!) } }]
})

/**
 * The task's options.
 *
 * @category models
 * @since 0.1.0
 */
export const Options = Schema.Struct({
  sandbox: Schema.optionalKey(Schema.Literals(["docker", "bubblewrap"])),
  pool: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
  frameWeight: Schema.optionalKey(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1 }))),
  showFrames: Schema.optionalKey(Schema.Boolean),
  judge: Schema.optionalKey(JudgeOptions)
})
export type Options = typeof Options.Type

/**
 * A row's fields besides its question.
 *
 * @category models
 * @since 0.1.0
 */
export const Fields = Schema.Struct({ scene: Scene.SceneSpec })

const spec = (kind: "docker" | "bubblewrap", max: number) =>
  PythonSandbox.spec({ kind, name: `simuscene-${kind}`, pool: { max }, timeouts: { acquireMillis: 60_000 } })

/** Each chain's sandbox (leased from the resource manager) beside its episode state. */
const withEpisode = <E, R, E2, R2>(
  python: Effect.Effect<Environment.Provider<PythonSandbox.PythonSandbox, E, R>, E2, R2>
) =>
  Effect.map(python, (p) => Environment.all([p, Environment.perChain(simulationLayer)]))

const episode = (showFrames: boolean): Environment.Episode<Simulation, typeof Fields.Type> => ({
  start: ({ row }) => Effect.flatMap(Simulation, (s) => s.reset(row.scene)),
  step: () =>
    Effect.map(Effect.flatMap(Simulation, (s) => s.state), (state): Environment.EpisodeStep | undefined =>
      state?.submitted === undefined
        ? undefined
        : { end: "submitted", ...(showFrames ? { messages: [framesMessage(state)] } : {}) })
})

const defaults: Task.Defaults = {
  systemPrompt: "Write Python that simulates the scene; run it with simulate.",
  renderTools: false,
  maxTurns: 2,
  // The oracle's program is ≈ 430 characters, ≈ 480–560 byte-level tokens as a call's JSON: 512 cut most calls.
  maxNewTokens: 640,
  maxContextTokens: 1536
}

const description = "Write a program that simulates a scene described in words, scored against the reference"

/**
 * The task with its options: sandboxes on Docker (the default; the engine layer removes the run's containers when it
 * ends) or on bubblewrap processes.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (options: Options = {}): Task.Task => {
  const max = options.pool ?? 64
  const score = reward(options.frameWeight ?? 0.25, options.judge)
  return options.sandbox === "bubblewrap"
    ? Task.make("simuscene", {
      description,
      row: Fields,
      tools: [simulate],
      reward: score,
      environment: withEpisode(
        Effect.flatMap(spec("bubblewrap", max), (s) => PythonSandbox.provider(PythonSandbox.bubblewrap(s)))
      ),
      layer: ResourceManager.ResourceManager.layer,
      episode: episode(options.showFrames ?? false),
      defaults
    })
    : Task.make("simuscene", {
      description,
      row: Fields,
      tools: [simulate],
      reward: score,
      environment: withEpisode(
        Effect.flatMap(spec("docker", max), (s) => Effect.flatMap(PythonSandbox.docker(s), PythonSandbox.provider))
      ),
      layer: Layer.mergeAll(ResourceManager.ResourceManager.layer, Docker.DockerEngine.layer),
      episode: episode(options.showFrames ?? false),
      defaults
    })
}

/**
 * The task as a config names it (`"task": "simuscene"`, with optional options).
 *
 * @category constructors
 * @since 0.1.0
 */
export const task = Task.withOptions("simuscene", Options, make)
