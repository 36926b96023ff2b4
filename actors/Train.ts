/**
 * A whole training run in one call: what `agentfly train` does, without its command line. From a task and its config
 * (a plain object, as a config file holds it): the task's `defaults` fill the agent keys the config leaves out; the
 * datasets are loaded and checked against the task's row Schema; the model folder is loaded (initialised from
 * `model.preset` when missing); the SFT warm-up and the RL loop run (`TrainLoop.run`) on the local learner
 * and policy versions (`LocalPolicy`), with the rollouts the config names (`Rollouts`); `metrics.jsonl`, samples, the
 * journal, checkpoints and `report.html` go to the output directory.
 *
 * ```ts
 * import { Effect } from "effect"
 * import * as Train from "agentfly/actors/Train.ts"
 * import { task } from "./task.ts"
 *
 * const { summary, report } = await Effect.runPromise(Train.run({
 *   task,
 *   config: {
 *     model: { path: "runs/models/mine", preset: "tiny" },
 *     data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
 *     algorithm: { steps: 20 },
 *     output: "runs/mine"
 *   }
 * }))
 * ```
 *
 * A run fails, with a typed error and nothing lost, when the config or a dataset row is invalid, when the output
 * directory already holds a run (`resume` continues it, `overwrite` starts over), and when no step trained (every
 * group's rewards were equal: a run that learned nothing does not look like a success).
 *
 * @since 0.1.0
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Effect, FileSystem, Layer, Path, Schema } from "effect"
import type { PlatformError } from "effect"
import type { Scope } from "effect"
import * as AgentTask from "../src/AgentTask.ts"
import * as Dataset from "../src/Dataset.ts"
import type * as Message from "../src/Message.ts"
import * as DiskFull from "../src/internal/diskFull.ts"
import * as SchemaIssues from "../src/internal/schemaIssues.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Report from "../src/Report.ts"
import * as Task from "../src/Task.ts"
import * as Tool from "../src/Tool.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import * as ChainFormat from "./ChainFormat.ts"
import * as Journal from "./Journal.ts"
import * as LocalPolicy from "./LocalPolicy.ts"
import * as Metrics from "./Metrics.ts"
import * as ResourceManager from "./ResourceManager.ts"
import * as RolloutQueue from "./RolloutQueue.ts"
import * as RolloutWorker from "./RolloutWorker.ts"
import * as Resume from "./Resume.ts"
import * as Rollouts from "./Rollouts.ts"
import * as RunError from "./RunError.ts"
import * as Telemetry from "./Telemetry.ts"
import * as TrainLoop from "./TrainLoop.ts"

// ===== Config =====

/**
 * What a caller may set over a config: the command line's `--seed`, `--output` (relative to the working directory)
 * and `--steps`.
 *
 * @category models
 * @since 0.1.0
 */
export interface Overrides {
  readonly seed?: number | undefined
  readonly output?: string | undefined
  readonly steps?: number | undefined
}

const asRecord = (u: unknown): Record<string, unknown> =>
  typeof u === "object" && u !== null && !Array.isArray(u) ? (u as Record<string, unknown>) : {}

/** The agent settings a task's `defaults` may fill. */
const defaultKeys: ReadonlyArray<keyof Task.Defaults> = [
  "systemPrompt",
  "renderTools",
  "maxTurns",
  "numChains",
  "maxNewTokens",
  "maxContextTokens",
  "temperature",
  "toolTimeout",
  "context"
]

/** A task's `defaults` keys that are no agent setting (a JavaScript task's typo), each named where it was written. */
const unknownDefaults = (task: Task.Any): Array<string> =>
  Object.keys(task.defaults).filter((key) => !(defaultKeys as ReadonlyArray<string>).includes(key)).map((key) =>
    `task ${task.name}'s defaults.${key}: unknown key${SchemaIssues.suggestion(key, defaultKeys)} (its defaults fill ` +
    `the config's agent keys: ${defaultKeys.join(", ")})`
  )

/**
 * Decodes a task's config as read (`TrainConfig.Source`): the task's defaults under the unset agent keys, then the
 * overrides; relative paths resolved against the source's directory (`--output` against the working directory).
 *
 * @category constructors
 * @since 0.1.0
 */
export const configOf = (
  task: Task.Any,
  source: TrainConfig.Source,
  overrides: Overrides = {}
): Effect.Effect<TrainConfig.TrainConfig, TrainConfig.ConfigError, Path.Path> =>
  overrides.steps !== undefined && !(Number.isInteger(overrides.steps) && overrides.steps >= 1)
    ? Effect.fail(
      new TrainConfig.ConfigError({
        source: "--steps",
        reason: "Invalid",
        issues: [
          `algorithm.steps: the override (--steps, or steps in code) must be a whole number ≥ 1, got ${overrides.steps}`
        ]
      })
    )
    // The override's own error, as for --steps: the config file does not hold the value refused.
    : overrides.seed !== undefined &&
        !(Number.isInteger(overrides.seed) && overrides.seed >= 0 && overrides.seed <= 0xffff_ffff)
    ? Effect.fail(
      new TrainConfig.ConfigError({
        source: "--seed",
        reason: "Invalid",
        issues: [
          `seed: the override (--seed, or seed in code) must be a whole number from 0 to 4294967295, got ` +
          overrides.seed
        ]
      })
    )
    : unknownDefaults(task).length > 0
    ? Effect.fail(
      new TrainConfig.ConfigError({ source: `task ${task.name}`, reason: "Invalid", issues: unknownDefaults(task) })
    )
    : Effect.flatMap(Path.Path, (path) =>
    TrainConfig.fromSource(source, (raw) => {
      const withDefaults = asRecord(Task.withDefaults(task, raw))
      // A module run directly (`agentfly train task.ts`) records itself as the task: the run's config.json then
      // names it, for `agentfly eval RUN/config.json` and the resume that names that file.
      const itself = source.exports["task"] !== undefined && withDefaults["task"] === undefined
      // Its path options too (the SWE task folders' root, a catalogue): the task read them relative to this config.
      const ref = withDefaults["task"]
      const withPaths = Schema.is(Task.Ref)(ref)
        ? { task: Task.resolvePathOptions(ref, task, (p) => path.resolve(source.dir, p)) }
        : {}
      return {
        ...withDefaults,
        ...withPaths,
        ...(itself ? { task: path.resolve(source.file) } : {}),
        ...(overrides.seed === undefined ? {} : { seed: overrides.seed }),
        ...(overrides.output === undefined ? {} : { output: path.resolve(overrides.output) }),
        ...(overrides.steps === undefined
          ? {}
          : { algorithm: { ...asRecord(withDefaults["algorithm"]), steps: overrides.steps } })
      }
    }))

// ===== Run =====

/**
 * How a run reports and where it may write.
 *
 * @category models
 * @since 0.1.0
 */
export interface RunOptions {
  /** Continue from the newest intact checkpoint in the output directory. */
  readonly resume?: boolean | undefined
  /** With `resume`: continue although the config differs from the run's recorded one (the changes are printed). */
  readonly forceResume?: boolean | undefined
  /** Start over in an output directory that holds an earlier run (its files are replaced). */
  readonly overwrite?: boolean | undefined
  /** Where progress lines go (default: stderr, as a bar on a terminal). */
  readonly write?: ((text: string) => void) | undefined
  readonly tty?: boolean | undefined
  /** What a config error names as its source (`agentfly train` gives the config file; default `config`). */
  readonly source?: string | undefined
}

/**
 * The options of {@link run}: a task, its config as a config file holds it, and the directory its relative paths
 * start from (default: the working directory).
 *
 * @category models
 * @since 0.1.0
 */
export interface Options extends RunOptions, Overrides {
  /** The task: a `Task<never>`, since a run provides nothing to its environment beyond the task's own `layer`. */
  readonly task: Task.Task
  /** The config as a config file holds it (type-checked: a misspelt key does not compile). */
  readonly config: TrainConfig.Input
  readonly dir?: string | undefined
}

/**
 * What a run returns: the training loop's summary, the report's path and the config it ran with.
 *
 * @category models
 * @since 0.1.0
 */
export interface Result {
  readonly summary: TrainLoop.Summary
  readonly report: string
  readonly config: TrainConfig.TrainConfig
}

/**
 * Why a run stops: a config that cannot be used, a bad dataset row, a model folder that cannot be read or made, a
 * trainer failure (rollouts, the learner, a checkpoint, the journal, no step trained, ...), a file system failure
 * around them (an output directory that cannot be written).
 *
 * @category errors
 * @since 0.1.0
 */
export type Failure =
  | TrainConfig.ConfigError
  | Dataset.DatasetError
  | ModelFolder.ModelFolderError
  | RunError.RunError
  | PlatformError.PlatformError

/**
 * Trains a task from its config, in one call (see the module docs).
 *
 * @category constructors
 * @since 0.1.0
 */
export const run = (options: Options): Effect.Effect<Result, Failure> =>
  Effect.gen(function*() {
    const path = yield* Path.Path
    const config = yield* configOf(options.task, {
      file: "config",
      dir: path.resolve(options.dir ?? "."),
      raw: options.config,
      exports: {}
    }, options)
    return yield* runConfig(options.task, config, options)
  }).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

/**
 * What to say of a config's model folder that holds no model yet (no `config.json`): how to create it. `agentfly
 * train` initialises it from a known `model.preset`; `agentfly init-model` writes one with random weights.
 *
 * @category getters
 * @since 0.1.0
 */
export const missingModel = (
  model: { readonly path: string; readonly preset?: string | undefined },
  config: string
): string => {
  const known = Object.keys(ModelConfig.presets)
  const preset = model.preset !== undefined && known.includes(model.preset) ? model.preset : undefined
  const initModel = `agentfly init-model --out ${model.path} --preset ${preset ?? "tiny"}`
  return `model.path ${model.path}: the model folder does not exist yet (no config.json): ` + (preset === undefined
    ? `set model.preset (${known.join(", ")}; ${model.preset === undefined ? "unset" : `"${model.preset}" is none`}) ` +
      `for agentfly train to initialise it, or create it with ${initModel}`
    : `train first (agentfly train ${config} initialises it from model.preset "${preset}"), or create it with ` +
      initModel)
}

/**
 * What to say when `model.preset` names another architecture than the existing model folder's: the preset only
 * initialises a missing folder, so a preset changed from `tiny` to `small` would otherwise train the old tiny model
 * without a word. `undefined` when they agree (the vocabulary is the tokenizer's, not the preset's).
 *
 * @category getters
 * @since 0.1.0
 */
export const presetMismatch = (
  model: { readonly path: string; readonly preset?: string | undefined },
  folder: ModelConfig.ModelConfig
): string | undefined => {
  const preset = model.preset === undefined ? undefined : ModelConfig.presets[model.preset as ModelConfig.PresetName]
  if (preset === undefined) return undefined
  const keys = ["hiddenSize", "numHiddenLayers", "numAttentionHeads", "numKeyValueHeads", "intermediateSize"] as const
  if (keys.every((key) => preset[key] === folder[key])) return undefined
  return `model.preset "${model.preset}" is not used: ${model.path} already holds a model of another architecture ` +
    `(${folder.numHiddenLayers} layers, width ${folder.hiddenSize}), which this run trains; for a ${model.preset} ` +
    `model give another model.path (a missing folder is initialised from the preset)`
}

/**
 * A dataset's bad row, with the config key that skips such rows instead of stopping (`data.onInvalidRow`).
 *
 * @category getters
 * @since 0.1.0
 */
export const withSkipHint = <E>(error: E): E =>
  error instanceof Dataset.DatasetError && error.reason._tag === "InvalidRow"
    ? Dataset.datasetError(
      error.dataset,
      "InvalidRow",
      `${error.message} (fix the row, or skip such rows: "data": { "onInvalidRow": "skip" })`,
      { line: error.reason.line }
    ) as E
    : error

/**
 * A dataset's rows checked against the fields its task's reward reads (`Reward.rows`, every part of a combined one),
 * as the task's own `row` Schema checks them: a row without a field the reward needs is `FILE:LINE: reward "name"
 * reads …` (or skipped, with `onInvalid: "skip"`), instead of every trajectory of it scoring 0 from the first
 * rollout on. The rows keep their fields as the task's Schema decoded them.
 *
 * @category constructors
 * @since 0.1.0
 */
export const checkRewardFields = (
  task: Task.Any,
  dataset: Dataset.Dataset,
  onInvalid: "skip" | "stop" | undefined
): Effect.Effect<Dataset.Dataset, Dataset.DatasetError> =>
  Effect.gen(function*() {
    let kept = dataset
    for (const { reward, row } of task.reward?.rows ?? []) {
      const at = (line: number | undefined) => `${dataset.name}:${line}: `
      const checked = yield* Dataset.refine(kept, row, { onInvalid }).pipe(
        Effect.mapError((e) =>
          e.reason._tag === "InvalidRow"
            ? Dataset.datasetError(
              e.dataset,
              "InvalidRow",
              e.message.replace(at(e.reason.line), `${at(e.reason.line)}reward "${reward}" reads `),
              { line: e.reason.line }
            )
            : e
        )
      )
      const lines = new Set(checked.rows.map((r) => r.line))
      kept = {
        ...kept,
        rows: kept.rows.filter((r) => lines.has(r.line)).map((r, index) => ({ ...r, index })),
        skipped: [
          ...kept.skipped,
          ...checked.skipped.slice(kept.skipped.length).map((issue) => ({
            ...issue,
            message: `reward "${reward}" reads ${issue.message}`
          }))
        ]
      }
    }
    return kept
  })

/**
 * The files whose presence says that a directory holds a run.
 */
const runFiles = ["metrics.jsonl", "journal.jsonl", "checkpoints"]

/**
 * Trains a task from a decoded config (`agentfly train` decodes its file first): {@link run} after decoding.
 *
 * @category constructors
 * @since 0.1.0
 */
export const runConfig = Effect.fn("Train.runConfig")(function*(
  task: Task.Task,
  requested: TrainConfig.TrainConfig,
  options: RunOptions = {}
): Effect.fn.Return<Result, Failure, FileSystem.FileSystem | Path.Path | Scope.Scope> {
  const fs = yield* FileSystem.FileSystem
  const write = options.write ?? ((text: string) => void process.stderr.write(text))
  const tty = options.tty ?? process.stderr.isTTY === true
  const say = (text: string) => Effect.sync(() => write(text + "\n"))
  yield* checkOutputFree(requested.output, options)
  const data = yield* loadData(task, requested, say)
  const folder = yield* loadModel(requested, options, say)
  const config = TrainConfig.onModel(requested, folder.config)
  yield* fs.makeDirectory(config.output, { recursive: true })
  // A refused resume says only why: checked before the header announces a run that would not start.
  const checked = options.resume === true ? yield* Resume.check(config, options) : Resume.fresh
  const display = Metrics.display({ write, tty, columns: process.stderr.columns ?? 100, everySteps: 5 })
  yield* say(headerLine(task, folder, config, data.train))
  // A resume with a checkpoint starts from that checkpoint's weights (said by the resume), not from model.from's.
  const resumesCheckpoint = checked.existing.entries.some((e) => e.entry.kind === "checkpoint")
  if (config.model.from !== undefined && !resumesCheckpoint) {
    yield* say(`starting from the weights of ${config.model.from} (model.from)`)
  }
  const rollouts = yield* rolloutsLayer(task, config)
  const telemetry = yield* Telemetry.settings(config.telemetry)
  const summary = yield* TrainLoop.run({
    task,
    config,
    format: ChainFormat.ofConfig(config, folder),
    ...data,
    resume: options.resume === true,
    forceResume: options.forceResume === true,
    checked,
    notice: say,
    tokenText: (id) => folder.tokenizer.decode([id]),
    display
  }).pipe(
    // The run reads the folder's weights for nothing else: the learner's copy replaces them (`releaseFolderWeights`).
    Effect.provide(Layer.provideMerge(rollouts, LocalPolicy.layer(folder, config, { releaseFolderWeights: true }))),
    // What a task's environment may need from the run: pools of sandboxes and other leased resources.
    Effect.provide(ResourceManager.ResourceManager.layer),
    Telemetry.exported(telemetry, Telemetry.runAttributes(task.name, config)),
    Effect.ensuring(display.done)
  )
  const report = yield* finish(config, summary, say)
  return { summary, report, config }
})

/** An earlier run in the output directory is continued or replaced on request only, never silently. */
const checkOutputFree = Effect.fnUntraced(function*(output: string, options: RunOptions) {
  if (options.resume === true || options.overwrite === true) return
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  for (const file of runFiles) {
    if (yield* fs.exists(path.join(output, file))) {
      // Not the config's fault: the directory it names is taken.
      return yield* new TrainConfig.ConfigError({
        source: output,
        reason: "OutputInUse",
        issues: [
          `${file} is there: resume it (--resume; in code resume: true), start over in it (--overwrite; ` +
          `overwrite: true; its files are replaced), or give another output directory (--output DIR)`
        ]
      })
    }
  }
})

/**
 * The run's datasets, each decoded once by the task's row Schema and checked against the fields its reward reads; a
 * bad row stops the run before anything is written. Demonstrations that call a tool the task lacks, or with arguments
 * it refuses, would teach the policy calls that fail: they stop the run here (or are skipped, with
 * `data.onInvalidRow: "skip"`) instead of after the warm-up.
 */
const loadData = Effect.fnUntraced(function*(
  task: Task.Task,
  requested: TrainConfig.TrainConfig,
  say: (text: string) => Effect.Effect<void>
) {
  const onInvalid = requested.data.onInvalidRow
  const fields = task.row
  // A file that cannot be read is named with the config key that gave it (`from`); a bad row, with the way past it.
  const load = (file: string, options: Dataset.Options) =>
    Dataset.load(file, { onInvalid, ...options }).pipe(
      // A set of rows (not demonstrations) is scored by the reward: the fields it reads are checked too.
      Effect.flatMap((ds) =>
        options.kind === "conversation" ? Effect.succeed(ds) : checkRewardFields(task, ds, onInvalid)
      ),
      Effect.mapError(withSkipHint)
    )
  const train = yield* load(requested.data.train, { fields, from: "data.train" })
  const evalSet = requested.data.eval === undefined
    ? undefined
    : yield* load(requested.data.eval, { fields, from: "data.eval" })
  const demos = requested.warmup === undefined
    ? undefined
    : yield* load(requested.warmup.data, { kind: "conversation", from: "warmup.data" })
  const validation = requested.warmup?.stopAt === undefined
    ? undefined
    : yield* load(requested.warmup.stopAt.data, { fields, from: "warmup.stopAt.data" })
  for (const ds of [train, evalSet, demos, validation]) {
    for (const issue of ds?.skipped ?? []) yield* say(`skipped ${ds!.name}:${issue.line}: ${issue.message}`)
  }
  // A size above the split's rows evaluates on all of them: said, since the figures' questions are fewer than asked.
  const evalSize = requested.eval.size
  if (evalSet !== undefined && evalSize !== undefined && evalSize > evalSet.rows.length) {
    yield* say(
      `eval.size ${evalSize} is more than the ${evalSet.rows.length} rows of data.eval (${evalSet.name}): ` +
        `every evaluation uses all ${evalSet.rows.length}`
    )
  }
  const usable = demos === undefined ? undefined : yield* checkDemonstrations(task, demos, onInvalid, say)
  return { train, eval: evalSet, demos: usable, validation }
})

/** Demonstrations without calls that fail; with any, the run stops (or skips them, with `onInvalid: "skip"`). */
const checkDemonstrations = Effect.fnUntraced(function*(
  task: Task.Task,
  demos: Dataset.Dataset,
  onInvalid: "skip" | "stop" | undefined,
  say: (text: string) => Effect.Effect<void>
) {
  const demoProblems = demos.rows.flatMap((row) => {
    const problem = demonstrationProblem(task, row.messages ?? [])
    return problem === undefined ? [] : [{ row, problem }]
  })
  if (demoProblems.length > 0 && onInvalid !== "skip") {
    // A dataset's bad rows, as a training file's are (`FILE:LINE: why`), not an "invalid config".
    return yield* Effect.fail(withSkipHint(
      Dataset.datasetError(
        demos.name,
        "InvalidRow",
        [
          ...demoProblems.slice(0, 5).map(({ problem, row }) => `${demos.name}:${row.line}: ${problem}`),
          ...(demoProblems.length > 5 ? [`… and ${demoProblems.length - 5} more demonstrations`] : [])
        ].join("\n"),
        { line: demoProblems[0]!.row.line }
      )
    ))
  }
  for (const { problem, row } of demoProblems) yield* say(`skipped ${demos.name}:${row.line}: ${problem}`)
  return demoProblems.length === 0 ? demos : {
    ...demos,
    rows: demos.rows.filter((row) => !demoProblems.some((p) => p.row === row))
  }
})

/**
 * The run's model folder: initialised from `model.preset` when missing, loaded, and with `model.from` another run's
 * checkpoint (a shared warm-up, say) over its weights.
 */
const loadModel = Effect.fnUntraced(function*(
  requested: TrainConfig.TrainConfig,
  options: RunOptions,
  say: (text: string) => Effect.Effect<void>
) {
  const fs = yield* FileSystem.FileSystem
  if (!(yield* fs.exists(`${requested.model.path}/config.json`))) {
    const preset = requested.model.preset
    if (preset === undefined || !(preset in ModelConfig.presets || preset === "tiny-vl")) {
      return yield* new TrainConfig.ConfigError({
        source: options.source ?? "config",
        reason: "Invalid",
        issues: [missingModel(requested.model, options.source ?? "CONFIG")]
      })
    }
    yield* say(`initialising ${requested.model.path} from preset ${preset} (seed ${requested.model.initSeed})`)
    yield* ModelFolder.init(requested.model.path, {
      preset,
      seed: requested.model.initSeed
    })
  }
  const loaded = yield* ModelFolder.load(requested.model.path)
  const mismatch = presetMismatch(requested.model, loaded.config)
  if (mismatch !== undefined) yield* say(mismatch)
  const from = requested.model.from
  if (from === undefined) return loaded
  const checkpoint = yield* Journal.verifiedCheckpoint(from, ModelFolder.parameters(loaded)).pipe(
    Effect.mapError((e) =>
      new TrainConfig.ConfigError({
        source: options.source ?? "config",
        reason: "Invalid",
        issues: [`model.from: ${e.message}`]
      })
    )
  )
  return { ...loaded, weights: checkpoint.weights }
})

/** The line a run starts with: the model, the task, its rows and how it trains. */
const headerLine = (
  task: Task.Task,
  folder: ModelFolder.ModelFolder,
  config: TrainConfig.TrainConfig,
  train: Dataset.Dataset
): string =>
  `training ${folder.name} on task ${task.name}, ${train.rows.length} rows (${config.mode}, ` +
  `${config.algorithm.steps} step${config.algorithm.steps === 1 ? "" : "s"}, seed ${config.seed}, ` +
  `${estimatorName(config.algorithm.advantage)}${
    config.algorithm.dynamicSampling === undefined
      ? ""
      : `, dynamic sampling (≤ ${config.algorithm.dynamicSampling.maxBatches} batches a step)`
  }) → ` +
  config.output

/**
 * After the loop: the report written, and the whole run's figures said from its summary (a resumed run's earlier
 * steps included); a run in which no step trained fails.
 */
const finish = Effect.fnUntraced(function*(
  config: TrainConfig.TrainConfig,
  summary: TrainLoop.Summary,
  say: (text: string) => Effect.Effect<void>
) {
  const report = yield* Report.write(config.output).pipe(
    Effect.mapError((e) =>
      DiskFull.isDiskFull(e)
        ? RunError.runError(
          "DiskFull",
          `${DiskFull.marker}: could not write the report under ${config.output}; free space, then ` +
            `\`agentfly report\` or --resume`,
          e
        )
        : e
    )
  )
  // The whole run's figures, from its journal (a resumed run's earlier steps included).
  const heldOut = heldOutLine(summary.evals[0], summary.evals.at(-1))
  if (heldOut !== undefined) yield* say(heldOut)
  const { trained, skipped, criticOnly } = summary
  const steps = trained + skipped + criticOnly
  const notTrained = [
    ...(criticOnly > 0 ? [`${criticOnly} training the critic alone: critic.warmupSteps`] : []),
    // Every advantage was 0: a group-relative estimator's groups each had equal rewards; another's whole step did.
    ...(skipped > 0 ? [`${skipped} skipped: no learning signal, ${
      TrainConfig.isGroupRelative(config.algorithm.advantage) ? "every group's rewards equal" : "every reward equal"
    }`] : [])
  ]
  const why = notTrained.length > 0 ? ` (${notTrained.join("; ")})` : ""
  yield* say(`trained ${trained} of ${steps} step${steps === 1 ? "" : "s"}${why}`)
  yield* say(`report: ${report}`)
  if (trained === 0 && steps > 0) {
    return yield* RunError.runError(
      "Learner",
      `no step trained: every group's rewards were equal in ${
        steps === 1 ? "its one step" : `all ${steps} steps`
      } (see ${report})`
    )
  }
  return report
})

/**
 * Where a run's training batches roll out, as its config says: on rollout workers (`rollout.workers`), through the
 * Redis queue (`rollout.queue`), or in this process. Workers sample on the run's inference servers.
 */
const rolloutsLayer = (task: Task.Task, config: TrainConfig.TrainConfig) =>
  Effect.gen(function*() {
    const { workers, queue } = config.rollout
    if ((workers !== undefined || queue !== undefined) && config.engine.servers === undefined) {
      return yield* RunError.runError(
        "Workers",
        `rollout.${workers !== undefined ? "workers" : "queue"} workers sample on inference servers: list ` +
          "them in engine.servers (agentfly serve --accept-weights), which every worker and this run reach"
      )
    }
    if (workers !== undefined && queue !== undefined) {
      return yield* RunError.runError(
        "Workers",
        "rollout.workers and rollout.queue are two ways to reach rollout workers: give one"
      )
    }
    const agentKey = RolloutWorker.agentKey(task.name, config)
    const runId = RolloutWorker.runId(task.name, config)
    const token = process.env["AGENTFLY_WORKER_TOKEN"] || undefined
    const timeoutSeconds = config.rollout.timeoutSeconds
    return workers !== undefined
      ? RolloutWorker.layer({
        urls: workers,
        agentKey,
        runId,
        agent: config.agent,
        token,
        timeoutMs: timeoutSeconds === undefined ? undefined : timeoutSeconds * 1000
      })
      : queue !== undefined
      ? RolloutQueue.layer({ url: queue, agentKey, runId, token, shareRows: config.rollout.shareRows, timeoutSeconds })
      : Rollouts.inProcess
  })

/** The advantage estimator as the start of a run names it. */
const estimatorName = (advantage: TrainConfig.AdvantageEstimator): string =>
  advantage === "gae" ? "PPO with a critic (gae)" : advantage === "grpo-no-std" ? "Dr.GRPO (grpo-no-std)" : advantage

type EvalRecord = { readonly step: number; readonly figures: Readonly<Record<string, number>> }

/** Held-out accuracy and invalid tool-call rate at the first and last evaluations, with the gain in SE. */
const heldOutLine = (first: EvalRecord | undefined, last: EvalRecord | undefined): string | undefined => {
  if (first === undefined || last === undefined) return undefined
  const f = (x: number | undefined) => (x === undefined ? "–" : x.toFixed(3))
  const se = (x: number | undefined) => (x === undefined ? "" : ` ± ${x.toFixed(3)}`)
  const before = first.figures["eval/accuracy"]
  const after = last.figures["eval/accuracy"]
  const afterSe = last.figures["eval/accuracy_se"]
  // The gain in standard errors of the final figure: what tells a real gain from evaluation noise.
  const gain = before === undefined || after === undefined || afterSe === undefined || afterSe === 0 ||
      last === first
    ? ""
    : ` (gain ${after >= before ? "+" : ""}${(after - before).toFixed(3)}, ` +
      `${((after - before) / afterSe).toFixed(1)} SE)`
  const tools = Metrics.usesTools(first.figures, "eval") || Metrics.usesTools(last.figures, "eval")
  return `held-out accuracy ${f(before)}${se(first.figures["eval/accuracy_se"])} (step ${first.step}) → ` +
    `${f(after)}${se(afterSe)} (step ${last.step})${gain}; mean reward ${f(first.figures["eval/reward_mean"])} → ` +
    `${f(last.figures["eval/reward_mean"])}` +
    (tools
      ? `; invalid tool-call rate ${f(first.figures["eval/invalid_tool_call_rate"])} → ` +
        f(last.figures["eval/invalid_tool_call_rate"])
      : "")
}

/**
 * Why a demonstration would teach failing calls: an assistant turn calling a tool the task does not have, or with
 * arguments the tool refuses (as the tool actor would refuse them in a rollout). Undefined when every call is good.
 *
 * @category getters
 * @since 0.1.0
 */
export const demonstrationProblem = (task: Task.Any, messages: ReadonlyArray<Message.Message>): string | undefined => {
  // An agent function's tools live in its own code (its SDK's), which the run cannot see.
  if (AgentTask.isAgentTask(task)) return undefined
  const tools = new Map(task.tools.map((t) => [t.name, t]))
  for (const [i, m] of messages.entries()) {
    if (m.role !== "assistant") continue
    for (const call of m.tool_calls ?? []) {
      const tool = tools.get(call.function.name)
      if (tool === undefined) {
        return `messages[${i}] calls "${call.function.name}", which task ${task.name} does not have (its tools: ` +
          `${[...tools.keys()].join(", ") || "none"})`
      }
      const problem = Tool.argumentsProblem(tool, call.function.arguments)
      if (problem !== undefined) return `messages[${i}]: invalid arguments for tool "${tool.name}": ${problem}`
    }
  }
  return undefined
}
