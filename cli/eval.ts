/**
 * `agentfly eval CONFIG [--checkpoint DIR] [--data FILE] [--size N] [--samples K] [--temperature T] [--seed N]
 * [--output FILE] [--episodes N] [--demos FILE]`: evaluates a policy on a config's held-out split (`data.eval`, or
 * `--data`, e.g. its validation or train split) with the config's task and agent settings, as a run's periodic
 * evaluation does (`Rollouts.evaluation`): the model folder's weights, or those of a run's checkpoint. With the
 * config's own evaluation settings, a checkpoint's figures repeat the run's evaluation at that step; the flags
 * override them (greedy figures of a run evaluated sampled, more answers per question, ...). Prints accuracy and
 * invalid tool-call rate; `--output` writes every figure as JSON; `--episodes N` prints the first N questions'
 * episodes as the model saw them (what a checkpoint does, not only how well); `--demos FILE` writes the episodes as
 * demonstrations (a teacher's samples for an SFT warm-up on them).
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Option, Schema } from "effect"
import type { Scope } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as ChainFormat from "../actors/ChainFormat.ts"
import { visionOf } from "../actors/internal/localVersions.ts"
import * as Journal from "../actors/Journal.ts"
import * as Metrics from "../actors/Metrics.ts"
import * as PolicyEngine from "../actors/PolicyEngine.ts"
import * as Progress from "../actors/Progress.ts"
import * as ResourceManager from "../actors/ResourceManager.ts"
import * as Train from "../actors/Train.ts"
import type { Figures } from "../actors/Learner.ts"
import * as Rollouts from "../actors/Rollouts.ts"
import * as RolloutSetup from "../actors/RolloutSetup.ts"
import * as Dataset from "../src/Dataset.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import { Sampler } from "../src/Sampler.ts"
import type * as Task from "../src/Task.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import * as Setup from "./setup.ts"
import { episodeText, failureSentence } from "./oracle.ts"
import * as Json from "./json.ts"
import { exitOnFailure } from "./train.ts"

/**
 * Options of an evaluation from the command line; unset ones come from the config.
 *
 * @category models
 * @since 0.1.0
 */
export interface EvalOptions {
  readonly config: string
  /** A run's checkpoint directory (`RUN/checkpoints/step-NNNNNN`); the model folder's weights when unset. */
  readonly checkpoint?: string | undefined
  /** Rows to evaluate on instead of the config's `data.eval` (relative to the working directory). */
  readonly data?: string | undefined
  readonly size?: number | undefined
  readonly samples?: number | undefined
  readonly temperature?: number | undefined
  readonly seed?: number | undefined
  readonly output?: string | undefined
  /** Episodes to print after the figures, as the model saw them (the first questions' first samples). */
  readonly episodes?: number | undefined
  /**
   * Write every sampled episode that ended without an error, and whose tool calls a warm-up accepts, as a
   * demonstration row (`{"messages": …}`, the warm-up's format) to this JSONL file: a teacher's samples for SFT.
   */
  readonly demos?: string | undefined
  readonly write?: ((text: string) => void) | undefined
}

/**
 * What `agentfly eval` measured and on what.
 *
 * @category models
 * @since 0.1.0
 */
export interface EvalResult {
  readonly weights: string
  /** The rows evaluated: the config's `data.eval`, or `--data`. */
  readonly data: string
  readonly questions: number
  readonly samples: number
  readonly temperature: number
  readonly seed: number
  readonly figures: Figures
  /** The error of the first trajectory that failed (an environment, a reward, a chain's defect), when one did. */
  readonly firstFailure?: string
}

const usage = (message: string) =>
  new TrainConfig.ConfigError({ source: "config", reason: "Invalid", issues: [message] })

/**
 * A run's checkpoint, checked against its run's journal (`Journal.verifiedCheckpoint`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const verifiedCheckpoint = Journal.verifiedCheckpoint

/** The held-out rows, checked against the task's row Schema and the fields its reward reads, as a run checks them. */
const loadHeldOut = (task: Task.Task, config: TrainConfig.TrainConfig, rows: string, from: string) =>
  Dataset.load(rows, { onInvalid: config.data.onInvalidRow, fields: task.row, from }).pipe(
    Effect.flatMap((ds) => Train.checkRewardFields(task, ds, config.data.onInvalidRow))
  )

/** The config's `eval` section with the flags over it, refused as the flags that gave it. */
const evalConfigOf = (section: TrainConfig.TrainConfig["eval"], options: EvalOptions) =>
  Schema.decodeUnknownEffect(TrainConfig.EvalConfig)({
    ...section,
    ...(options.size === undefined ? {} : { size: options.size }),
    ...(options.samples === undefined ? {} : { samples: options.samples }),
    ...(options.temperature === undefined ? {} : { temperature: options.temperature })
  }, TrainConfig.decodeOptions).pipe(Effect.mapError((e) =>
    new TrainConfig.ConfigError({
      source: "agentfly eval's flags",
      reason: "Invalid",
      // Named as the flags that gave them: `--size: Expected a value between 1 and 10000000, got 0`.
      issues: TrainConfig.formatIssues(TrainConfig.EvalConfig, e.issue).map((line) =>
        line.replace(/^(size|samples|temperature)\b/, "--$1")
      )
    })
  ))

/** The evaluation's line: its weights, accuracy, reward, tool calls and how it sampled, and its failures. */
const resultLine = (result: EvalResult, options: EvalOptions, failures: string | undefined): string => {
  const { figures } = result
  return `${options.checkpoint === undefined ? `${result.weights} (the model folder's own weights, not a run's: ` +
    `--checkpoint RUN/checkpoints/step-N for those)` : result.weights}: ` +
    `${options.data === undefined ? "held-out accuracy" : "accuracy"} ` +
    `${figures["eval/accuracy"]!.toFixed(3)}, mean reward ${figures["eval/reward_mean"]!.toFixed(3)}` +
    (Metrics.usesTools(figures, "eval")
      ? `, invalid tool-call rate ${figures["eval/invalid_tool_call_rate"]!.toFixed(3)}`
      : "") +
    ` (${result.questions} questions${options.data === undefined ? "" : ` of ${options.data}`} × ${result.samples}, ` +
    `${result.temperature === 0 ? "greedy" : `temperature ${result.temperature}`}, seed ${result.seed})` +
    // Greedy decoding gives a question the same answer every time: K samples are K copies.
    (result.temperature === 0 && result.samples > 1
      ? `; greedy answers repeat, so the ${result.samples} samples of a question are one answer ` +
        `(give --temperature)`
      : "") +
    (failures ?? "") +
    "\n"
}

/**
 * Episode `i` as the model saw it (`--episodes N`). A last turn cut inside a tool call lost its unreadable block from
 * the message view: it is said as what happened (`assistant: [cut by max tokens inside a tool call]`), not as an
 * empty line.
 *
 * @category getters
 * @since 0.1.0
 */
export const episodeOf = (i: number, t: Trajectory.Trajectory): string => {
  const cut = t.errorReason === "ParseFailed" ? /cut by (.+?) inside a tool call/.exec(t.error ?? "") : null
  const text = episodeText(t.messages)
  const body = cut !== null && text.endsWith("\nassistant: ")
    ? `${text}[cut by ${cut[1]} inside a tool call]`
    : text
  return `\nepisode ${i + 1} (reward ${t.reward.toFixed(3)}, ${t.termination}` +
    `${t.episodeEnd === undefined ? "" : ` ${t.episodeEnd}`}${t.error === undefined ? "" : `, ${t.error}`}):\n` +
    body + "\n"
}

/**
 * `--demos`: the episodes as demonstration rows (JSONL, `{"messages": …}`, the warm-up's format), right or wrong;
 * those that ended with an error and those a warm-up would refuse (a call of a tool the task lacks, arguments its
 * schema refuses: `Train.demonstrationProblem`) are left out.
 *
 * @category getters
 * @since 0.1.0
 */
export const demonstrationRows = (task: Task.Any, trajectories: ReadonlyArray<Trajectory.Trajectory>): string =>
  trajectories
    .filter((t) => t.error === undefined && Train.demonstrationProblem(task, t.messages) === undefined)
    .map((t) => JSON.stringify({ messages: t.messages }) + "\n")
    .join("")

/**
 * Runs `agentfly eval`: everything but argument parsing.
 *
 * @category constructors
 * @since 0.1.0
 */
export const run = Effect.fn("cli.eval")(function*(
  options: EvalOptions
): Effect.fn.Return<EvalResult, unknown, FileSystem.FileSystem | import("effect").Path.Path | Scope.Scope> {
  const fs = yield* FileSystem.FileSystem
  const { task, config: requested } = yield* Setup.load(options.config, { seed: options.seed })
  const rows = options.data ?? requested.data.eval
  if (rows === undefined) {
    return yield* usage("data.eval: the config names no held-out split (or give one with --data FILE)")
  }
  const heldOut = yield* loadHeldOut(task, requested, rows, options.data === undefined ? "data.eval" : "--data")
  const evalConfig = yield* evalConfigOf(requested.eval, options)
  // A folder not made yet: how to make it, rather than a missing file's name.
  const modelFile = `${requested.model.path}/config.json`
  if (!(yield* fs.exists(modelFile))) {
    const message = Train.missingModel(requested.model, options.config)
    return yield* ModelFolder.modelFolderError(modelFile, "NotFound", message)
  }
  const folder = yield* ModelFolder.load(requested.model.path)
  const config = TrainConfig.onModel({ ...requested, eval: evalConfig }, folder.config)
  const weights = options.checkpoint === undefined
    ? folder.weights
    : (yield* verifiedCheckpoint(options.checkpoint, ModelFolder.parameters(folder))).weights
  const questions = Math.min(config.eval.size ?? heldOut.rows.length, heldOut.rows.length)
  // A folder with a tower (`tiny-vl`) sees the task's images: its engine runs the tower.
  const vision = visionOf(folder)
  const engine = yield* PolicyEngine.make({
    config: folder.config,
    weights,
    maxBatchSize: 64,
    ...(vision === undefined ? {} : { vision })
  })
  // The task's environment lives (and its pools with it) for the evaluation only.
  const { figures, groups } = yield* Effect.scoped(
    Effect.flatMap(
      RolloutSetup.make({ task, config, format: ChainFormat.ofConfig(config, folder) }),
      (setup) => Rollouts.evaluation(setup, heldOut.rows)
    ).pipe(Progress.withBar({ label: "eval", unit: "questions", total: questions }))
  ).pipe(
    Effect.provideService(Sampler, Sampler.of({ generate: engine.generate, policyVersion: engine.policyVersion })),
    Effect.provide(ResourceManager.ResourceManager.layer)
  )
  // Failed trajectories score 0: said here, or a broken environment reads as a weak policy.
  const trajectories = groups.flatMap((g) => g.trajectories)
  const failed = failureSentence(trajectories)
  const firstFailure = failed?.first
  const result: EvalResult = {
    weights: options.checkpoint ?? folder.name,
    data: rows,
    questions: groups.length,
    samples: config.eval.samples,
    temperature: config.eval.temperature,
    seed: config.seed,
    figures,
    ...(firstFailure === undefined ? {} : { firstFailure })
  }
  const write = options.write ?? ((text: string) => void process.stdout.write(text))
  write(resultLine(result, options, failed?.sentence))
  for (const [i, group] of groups.slice(0, options.episodes ?? 0).entries()) {
    const t = group.trajectories[0]
    if (t !== undefined) write(episodeOf(i, t))
  }
  if (options.output !== undefined) yield* fs.writeFileString(options.output, JSON.stringify(result, null, 2) + "\n")
  if (options.demos !== undefined) {
    yield* fs.writeFileString(options.demos, demonstrationRows(task, trajectories))
  }
  return result
})

/**
 * @category commands
 * @since 0.1.0
 */
export const evaluate = Command.make(
  "eval",
  {
    config: Argument.String("config").pipe(Argument.withDescription("A train config: .json, .yaml or .ts")),
    checkpoint: Flag.Directory("checkpoint").pipe(
      Flag.withDescription("A run's checkpoint directory (default: the model folder's weights)"),
      Flag.optional
    ),
    data: Flag.String("data").pipe(
      Flag.withDescription("Evaluate on these rows (JSONL) instead of the config's data.eval"),
      Flag.optional
    ),
    size: Flag.Int("size").pipe(Flag.withDescription("Override eval.size (held-out questions)"), Flag.optional),
    samples: Flag.Int("samples").pipe(
      Flag.withDescription("Override eval.samples (answers per question)"),
      Flag.optional
    ),
    temperature: Flag.Finite("temperature").pipe(
      Flag.withDescription("Override eval.temperature (0: greedy)"),
      Flag.optional
    ),
    seed: Flag.Int("seed").pipe(Flag.withDescription("Override the config's seed"), Flag.optional),
    output: Flag.String("output").pipe(Flag.withDescription("Write the figures to this JSON file"), Flag.optional),
    episodes: Flag.Int("episodes").pipe(
      Flag.withDescription("Print this many episodes as the model saw them (default 0)"),
      Flag.withDefault(0),
      Flag.filter((n) => n >= 0, (n) => `--episodes must be at least 0, got ${n}`)
    ),
    demos: Flag.String("demos").pipe(
      Flag.withDescription("Write each episode that ended without an error as a demonstration row (JSONL) to FILE"),
      Flag.optional
    ),
    json: Json.flag
  },
  Effect.fn("eval")(function*(args) {
    yield* Effect.scoped(run({
      config: args.config,
      checkpoint: Option.getOrUndefined(args.checkpoint),
      data: Option.getOrUndefined(args.data),
      size: Option.getOrUndefined(args.size),
      samples: Option.getOrUndefined(args.samples),
      temperature: Option.getOrUndefined(args.temperature),
      seed: Option.getOrUndefined(args.seed),
      output: Option.getOrUndefined(args.output),
      episodes: args.episodes,
      demos: Option.getOrUndefined(args.demos),
      // With --json, stdout is the JSON object's alone.
      ...(args.json ? { write: (text: string) => void process.stderr.write(text) } : {})
    })).pipe(Json.printed(args.json, (result) => ({ command: "eval", ...result })), exitOnFailure)
  })
).pipe(Command.withDescription("Evaluate a model folder or a run's checkpoint on a config's held-out split"))
