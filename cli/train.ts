/**
 * `agentfly train CONFIG [--resume] [--seed N] [--output DIR] [--steps N]`: the main job. Loads the config, the
 * model folder (initialising it from `model.preset` when missing), the datasets, tools and reward; runs the SFT
 * warm-up and the RL loop (`actors/Trainer.ts`) on the local policy (`actors/LocalPolicy.ts`); shows a progress bar
 * on a terminal (plain lines otherwise); writes `metrics.jsonl`, `samples.jsonl`, the journal, checkpoints and
 * `report.html` in the output directory; and ends with held-out accuracy and invalid tool-call rate before and
 * after RL.
 *
 * @since 0.1.0
 */
import { Console, Context, Effect, FileSystem, Option } from "effect"
import type { Scope } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as ChainFormat from "../actors/ChainFormat.ts"
import * as LocalPolicy from "../actors/LocalPolicy.ts"
import * as Metrics from "../actors/Metrics.ts"
import * as RewardActor from "../actors/RewardActor.ts"
import type * as RolloutChain from "../actors/RolloutChain.ts"
import * as ToolActor from "../actors/ToolActor.ts"
import * as Trainer from "../actors/Trainer.ts"
import * as Answer from "../environments/answer/Answer.ts"
import * as Calculator from "../environments/calculator/Calculator.ts"
import * as MathEqual from "../environments/math/MathEqual.ts"
import * as Qa from "../environments/rewards/Qa.ts"
import * as ToolCallFormat from "../environments/rewards/ToolCallFormat.ts"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import * as Dataset from "../src/Dataset.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Report from "../src/Report.ts"
import * as Reward from "../src/Reward.ts"
import * as RolloutError from "../src/RolloutError.ts"
import type * as Tool from "../src/Tool.ts"
import * as TrainConfig from "../src/TrainConfig.ts"

/**
 * Tools a config can name.
 *
 * @category registries
 * @since 0.1.0
 */
export const tools: Readonly<Record<string, Tool.Any>> = {
  calculator: Calculator.calculator,
  answer: Answer.answer
}

/**
 * Rewards a config can name.
 *
 * @category registries
 * @since 0.1.0
 */
export const rewards = {
  mathEqual: MathEqual.mathEqual,
  exactMatch: Qa.exactMatch,
  f1: Qa.f1,
  toolCallFormat: ToolCallFormat.toolCallFormat
} as const

/**
 * The reward a config names: one of {@link rewards}, or a weighted sum of them (`Reward.combine`), or why not.
 *
 * @category constructors
 * @since 0.1.0
 */
export const rewardOf = (spec: TrainConfig.TrainConfig["reward"]) => {
  const parts = typeof spec === "string" ? [[spec, 1] as const] : Object.entries(spec)
  const unknown = parts.filter(([name]) => !(name in rewards)).map(([name]) => name)
  if (unknown.length > 0) return `reward: unknown ${unknown.join(", ")} (known: ${Object.keys(rewards).join(", ")})`
  if (parts.length === 0) return "reward: name at least one reward"
  if (typeof spec === "string") return rewards[spec as keyof typeof rewards]
  return Reward.combine(
    parts.map(([name, weight]) => `${weight}·${name}`).join(" + "),
    parts.map(([name, weight]) => ({ reward: rewards[name as keyof typeof rewards], weight }))
  )
}

const usage = (message: string) =>
  new TrainConfig.ConfigError({ source: "config", reason: "Invalid", issues: [message] })

/** The tool actor as the rollout chain's tool port. */
const toolPort = (actor: ToolActor.Service<any>): RolloutChain.Tools => ({
  schemas: actor.functionSchemas,
  executeTurn: (calls, context) =>
    actor.executeTurn(calls, { context: context as Context.Context<any> }).pipe(
      Effect.map((turn) => ({ messages: turn.messages, terminal: turn.terminal })),
      Effect.mapError((e) => new RolloutError.RolloutError({ reason: "ToolFailed", message: e.message }))
    )
})

/** The reward actor as the rollout chain's reward port. */
const rewardPort = (actor: RewardActor.RewardActor<any>): RolloutChain.Reward => (trajectory, context) =>
  Effect.map(actor.score(trajectory, { context: context as Context.Context<any> }), ({ trajectory: t }) => ({
    reward: t.reward,
    status: t.rewardStatus,
    metrics: t.metrics
  }))

/**
 * A config's agent on a loaded model folder: the rollout format (the template and tool-call parser it names) and its
 * tools and reward as the rollout chain's ports. Unknown tool or reward names fail with the known ones.
 *
 * @category constructors
 * @since 0.1.0
 */
export const agentOf = Effect.fn("cli.agentOf")(function*(config: TrainConfig.TrainConfig, folder: ModelFolder.ModelFolder) {
  const unknownTools = config.tools.filter((name) => !(name in tools))
  if (unknownTools.length > 0) {
    return yield* usage(`tools: unknown ${unknownTools.join(", ")} (known: ${Object.keys(tools).join(", ")})`)
  }
  const reward = rewardOf(config.reward)
  if (typeof reward === "string") return yield* usage(reward)
  const toolActor = yield* ToolActor.make(config.tools.map((name) => tools[name]!))
  const rewardActor = yield* RewardActor.make(reward as never, { onError: "zero" })
  const template = config.agent.template === "model"
    ? folder.template
    : ChatTemplate.builtinTemplate(config.agent.template as ChatTemplate.BuiltinName)
  const format = ChainFormat.fromTemplate({
    tokenizer: folder.tokenizer,
    template,
    toolCallFormat: config.agent.parser as ChatTemplate.ToolCallFormat
  })
  return { format, tools: toolPort(toolActor), reward: rewardPort(rewardActor) }
})

/**
 * Options of a training run from the command line.
 *
 * @category models
 * @since 0.1.0
 */
export interface RunOptions {
  readonly config: string
  readonly resume?: boolean
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
  const loaded = yield* TrainConfig.load(options.config)
  const requested: TrainConfig.TrainConfig = {
    ...loaded,
    ...(options.seed === undefined ? {} : { seed: options.seed }),
    ...(options.output === undefined ? {} : { output: options.output }),
    algorithm: { ...loaded.algorithm, ...(options.steps === undefined ? {} : { steps: options.steps }) }
  }
  const write = options.write ?? ((text: string) => void process.stderr.write(text))
  const tty = options.tty ?? process.stderr.isTTY === true
  const say = (text: string) => Effect.sync(() => write(text + "\n"))

  // Datasets first: a bad row stops the run before anything is written.
  const onInvalid = requested.data.onInvalidRow
  const train = yield* Dataset.load(requested.data.train, { onInvalid })
  const evalSet = requested.data.eval === undefined ? undefined : yield* Dataset.load(requested.data.eval, { onInvalid })
  const demos = requested.warmup === undefined
    ? undefined
    : yield* Dataset.load(requested.warmup.data, { onInvalid, kind: "conversation" })
  const validation = requested.warmup?.stopAt === undefined
    ? undefined
    : yield* Dataset.load(requested.warmup.stopAt.data, { onInvalid })
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

  const agent = yield* agentOf(config, folder)

  yield* fs.makeDirectory(config.output, { recursive: true })
  const display = Metrics.display({ write, tty, columns: process.stderr.columns ?? 100, everySteps: 5 })
  yield* say(
    `training ${folder.name} on ${train.rows.length} rows (${config.mode}, ${config.algorithm.steps} steps, ` +
      `seed ${config.seed}) → ${config.output}`
  )
  const summary = yield* Trainer.run({
    config,
    train,
    eval: evalSet,
    demos,
    validation,
    ...agent,
    resume: options.resume === true,
    tokenText: (id) => folder.tokenizer.decode([id]),
    display
  }).pipe(Effect.provide(LocalPolicy.layer(folder, config)), Effect.ensuring(display.done))
  const report = yield* Report.write(config.output)
  // The whole run's evaluations (a resumed run's summary holds only its own).
  const evals = (yield* Report.read(config.output)).metrics.filter((m) => m.phase === "eval")
  const first = evals[0]
  const last = evals.at(-1)
  if (first !== undefined && last !== undefined) {
    const f = (x: number | undefined) => (x === undefined ? "–" : x.toFixed(3))
    yield* say(
      `held-out accuracy ${f(first.figures["eval/accuracy"])} (step ${first.step}) → ` +
        `${f(last.figures["eval/accuracy"])}` +
        ` (step ${last.step}); invalid tool-call rate ${f(first.figures["eval/invalid_tool_call_rate"])} → ` +
        `${f(last.figures["eval/invalid_tool_call_rate"])}`
    )
  }
  yield* say(`report: ${report}`)
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
    config: Argument.String("config").pipe(Argument.withDescription("The run's config: .json, .yaml or .ts")),
    resume: Flag.Boolean("resume").pipe(
      Flag.withDescription("Continue from the last checkpoint in the output directory"),
      Flag.withDefault(false)
    ),
    seed: Flag.Int("seed").pipe(Flag.withDescription("Override the config's seed"), Flag.optional),
    output: Flag.String("output").pipe(Flag.withDescription("Override the output directory"), Flag.optional),
    steps: Flag.Int("steps").pipe(Flag.withDescription("Override algorithm.steps"), Flag.optional)
  },
  Effect.fn("train")(function*(args) {
    yield* Effect.scoped(run({
      config: args.config,
      resume: args.resume,
      seed: Option.getOrUndefined(args.seed),
      output: Option.getOrUndefined(args.output),
      steps: Option.getOrUndefined(args.steps)
    })).pipe(exitOnFailure)
  })
).pipe(Command.withDescription("Train an agent by RL (optional SFT warm-up), with checkpoints, resume and a report"))
