/**
 * The training loop: a run of a task, top to bottom. {@link run} prepares the run (datasets decoded, the rollout
 * setup, the resume point, the journal and metrics opened), warms up, then for each step takes a batch from the
 * `Rollouts` service (in process, HTTP workers or the Redis queue: a layer, not an `if`), learns through the
 * `Learner`, publishes the weights through `PolicyVersions`, evaluates and checkpoints when due.
 *
 * **Honest runs.** Every step's figures count failed trajectories by reason (`rollout/failures/<Reason>`) and
 * failed tool calls by reason (`rollout/tool_errors/<Reason>`). A step (or an evaluation) where more than
 * `maxFailureShare` of the trajectories failed for infrastructure reasons (environment, lease, reward, sampler,
 * chain defects) stops the run with `RunError` (`Failures`) naming the main reason, its count and its first
 * failure's message, after its figures are logged and before the learner trains on it. A record whose trajectories
 * failed carries the first one's error (`firstFailure`), so the message outlives the console.
 *
 * **One pipeline for both modes.** Learner step `s` trains on batch `s - 1`: the `groupsPerStep` rows at
 * positions `[(s - 1)·B, s·B)` of the run's row order (a seeded shuffle per epoch). Every token of batch `s - 1` is
 * sampled by one policy version, `RunSchedule.samplingVersion`: `s - 1` in `sync` mode (generate, update, publish,
 * repeat); in `async` mode `s - 1 - maxStaleness`, so the next batches roll out while the learner trains (their
 * sampler logprobs and policy versions travel in the trajectories for the learner's importance-weight
 * correction), but never older than the last checkpoint before step `s`, so that a run resumed from that
 * checkpoint has the weights its next batches need (a pipeline bubble of one rollout per checkpoint).
 *
 * **Rollouts that depend on nothing else.** Each batch, each evaluation and each warm-up check samples from a
 * sampler of its own (`PolicyVersions.sampler`), pinned to its version, whose engine batches only its own requests:
 * its tokens and logprobs depend on its rows, seeds and weights, not on what else was running beside it. Groups
 * within a batch are ordered by row, so a run is deterministic in both modes and resumes bit for bit.
 *
 * **Warm-up.** SFT steps on demonstrations, then policy version 0. With `warmup.stopAt` the warm-up ends at the
 * first check where greedy accuracy on a validation split reaches a target; a check publishes the weights as a
 * negative version (`RunSchedule.warmupVersion`) for its rollouts.
 *
 * **Exact resume** (`Resume`). Policy version `v` is the weights after step `v` (0 after the warm-up). Every
 * finished group, learner step and evaluation is journaled (fsync'ed) and every `checkpoint.every` steps the
 * learner's state is saved to a fresh directory that is renamed into place, then journaled with its weights'
 * fingerprint. A resume loads the newest intact checkpoint, rolls the journal back to it and replays the following
 * steps: the row order and every chain's sampling seed are functions of the run seed and the row position, so the
 * replayed steps are the ones lost. The run's summary is read from the journal, so it covers the whole run.
 *
 * @since 0.1.0
 */
import { Clock, Deferred, Effect, Fiber, FileSystem, Queue } from "effect"
import type { Scope } from "effect"
import * as BatchCheck from "../src/BatchCheck.ts"
import * as Dataset from "../src/Dataset.ts"
import * as DiskFull from "../src/internal/diskFull.ts"
import * as RolloutFigures from "../src/RolloutFigures.ts"
import * as RunSchedule from "../src/RunSchedule.ts"
import type * as Task from "../src/Task.ts"
import type * as TrainConfig from "../src/TrainConfig.ts"
import * as Trajectory from "../src/Trajectory.ts"
import type * as ChainPorts from "../src/ChainPorts.ts"
import * as PeakRss from "./internal/peakRss.ts"
import * as Journal from "./Journal.ts"
import { type Figures, Learner } from "./Learner.ts"
import * as Metrics from "./Metrics.ts"
import { PolicyVersions } from "./PolicyVersions.ts"
import * as Resume from "./Resume.ts"
import * as Rollouts from "./Rollouts.ts"
import * as RolloutSetup from "./RolloutSetup.ts"
import * as RunError from "./RunError.ts"
import * as Telemetry from "./Telemetry.ts"

// ===== Models =====

/**
 * What a run needs besides its services: the task, its config, the datasets and the model's format (chat template
 * and tool-call parser: `ChainFormat.fromTemplate`). `RE` is what the task's environment needs from the run (e.g. a
 * `ResourceManager`). Datasets are decoded by the task's row Schema here unless they already were (`Dataset.load`
 * with the task's fields): never twice.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options<RE = never> extends Resume.Request {
  readonly task: Task.Task<RE>
  readonly config: TrainConfig.TrainConfig
  readonly train: Dataset.Dataset
  readonly eval?: Dataset.Dataset | undefined
  readonly demos?: Dataset.Dataset | undefined
  /** The validation split of `warmup.stopAt` (required with it). */
  readonly validation?: Dataset.Dataset | undefined
  readonly format: ChainPorts.Format
  readonly maxConcurrentChains?: number | undefined
  /** What `Resume.check` already found, when the caller checked before the run (default: checked here). */
  readonly checked?: Resume.Checked | undefined
  /** Where the run says what the user should know: a checkpoint refused on resume, a forced resume (default: log). */
  readonly notice?: ((message: string) => Effect.Effect<void>) | undefined
  /** The text of a token, for the trajectory viewer (default: its id). */
  readonly tokenText?: ((id: number) => string) | undefined
  readonly display?: { readonly update: (status: Metrics.Status) => Effect.Effect<void> } | undefined
}

/**
 * What a run did, read from its journal (a resumed run's earlier steps included): its steps (`fromStep` + 1 …
 * `steps` in this process), how many of all its steps trained, how many were skipped for lack of signal (every
 * group's rewards equal under a group-relative estimator) and how many trained the critic alone; its evaluations.
 *
 * @category models
 * @since 0.1.0
 */
export interface Summary {
  readonly fromStep: number
  readonly steps: number
  readonly trained: number
  readonly skipped: number
  readonly criticOnly: number
  readonly evals: ReadonlyArray<{ readonly step: number; readonly figures: Figures }>
  readonly fingerprint: string
}

/** A group of a training batch, with its seq (its place among everything the run sampled) and its dataset row. */
interface SampledGroup {
  readonly group: Trajectory.Group
  readonly seq: number
  readonly row: number
}

/** A step's batch: every group sampled (dynamic sampling's extra batches too) and the ones the learner gets. */
interface Batch {
  readonly sampled: ReadonlyArray<SampledGroup>
  readonly kept: ReadonlyArray<SampledGroup>
  readonly batches: number
  /** Wall seconds its sampling took: it may run beside an evaluation or the previous step, so not the step's. */
  readonly seconds: number
}

/** A run, prepared: its inputs, services and open files, and the functions every step shares. */
interface Run {
  readonly config: TrainConfig.TrainConfig
  readonly setup: RolloutSetup.RolloutSetup
  readonly train: Dataset.Dataset
  readonly eval: Dataset.Dataset | undefined
  readonly demos: Dataset.Dataset | undefined
  readonly validation: Dataset.Dataset | undefined
  readonly learner: Learner["Service"]
  readonly versions: PolicyVersions["Service"]
  readonly rollouts: Rollouts.Rollouts["Service"]
  readonly fs: FileSystem.FileSystem
  readonly point: Resume.Point
  /** Journals entries (one write and fsync for several) and keeps them: the run's summary is read from them. */
  readonly record: (...entries: ReadonlyArray<Journal.Entry>) => Effect.Effect<void, RunError.RunError>
  /** The journal's entries: those kept at the resume point, then this process's. */
  readonly entries: ReadonlyArray<Journal.Entry>
  readonly metrics: Metrics.Metrics
  readonly notice: (message: string) => Effect.Effect<void>
  /** Says `text` the first time `key` comes up in the run. */
  readonly once: (key: string, text: string) => Effect.Effect<void>
  readonly display: { readonly update: (status: Metrics.Status) => Effect.Effect<void> }
  readonly tokenText: (id: number) => string
  readonly elapsed: Effect.Effect<number>
  /** Versions to publish or published, awaited by the batches they sample (see `RunSchedule.samplingVersion`). */
  readonly published: Map<number, Deferred.Deferred<void>>
  /** The newest version published: no batch can hold tokens of a newer one. */
  readonly newest: { version: number }
  readonly checkpoints: string
}

const io = RunError.wrap("Journal")

// ===== The loop =====

/**
 * Runs (or resumes) a training run to `config.algorithm.steps` learner steps.
 *
 * @category constructors
 * @since 0.1.0
 */
export const run: <RE = never>(
  options: Options<RE>
) => Effect.Effect<
  Summary,
  RunError.RunError,
  Learner | PolicyVersions | Rollouts.Rollouts | FileSystem.FileSystem | Scope.Scope | RE
> = Effect.fn("TrainLoop.run")(function*(options: Options<any>) {
  const run = yield* prepare(options)
  const { config, point } = run
  const warmupRuns = config.warmup !== undefined && run.demos !== undefined && !point.warmupDone && point.step === 0
  // Versions only increase: with a warm-up, version 0 is its result, published when it ends.
  if (warmupRuns) yield* warmup(run)
  else yield* publish(run, point.step)
  const lastStep = config.algorithm.steps
  const batches = yield* startBatches(run, lastStep)
  // Every evaluation precedes its step's checkpoint, so a run resumed from a checkpoint kept that step's evaluation.
  if (point.checkpoint === undefined || options.resume !== true) yield* evaluate(run, point.step)
  if (warmupRuns) yield* checkpoint(run, 0)
  for (let step = point.step + 1; step <= lastStep; step++) {
    yield* trainStep(run, step, lastStep, Queue.take(batches))
    if (RunSchedule.isDue(step, config.eval.every, lastStep)) yield* evaluate(run, step)
    if (RunSchedule.isDue(step, config.checkpoint.every, lastStep)) yield* checkpoint(run, step)
  }
  yield* run.record({ kind: "finished", step: lastStep })
  return yield* summaryOf(run, lastStep)
})

// ===== Preparing a run =====

/**
 * The run's inputs and files, before its first step: datasets decoded (a bad row stops the run before anything is
 * written), the task's runtime built and its prompts checked, old checkpoints of a run started over removed, the
 * resume point loaded, the journal and metrics opened and the config recorded.
 */
const prepare = Effect.fnUntraced(function*(options: Options<any>) {
  const { config } = options
  const fs = yield* FileSystem.FileSystem
  const learner = yield* Learner
  const versions = yield* PolicyVersions
  const rollouts = yield* Rollouts.Rollouts
  const decode = (ds: Dataset.Dataset | undefined) =>
    ds === undefined || options.task.row === undefined
      ? Effect.succeed(ds)
      : Dataset.refine(ds, options.task.row, { onInvalid: config.data.onInvalidRow }).pipe(
        Effect.mapError(RunError.wrap("Data"))
      )
  const train = (yield* decode(options.train))!
  const evalSet = yield* decode(options.eval)
  const validation = yield* decode(options.validation)
  const setup = yield* RolloutSetup.make(options)
  const notice = options.notice ?? ((message: string) => Effect.logWarning(message))
  yield* RolloutSetup.checkPromptsFit(setup, train.rows, notice)
  const out = config.output
  const checkpoints = `${out}/checkpoints`
  yield* fs.makeDirectory(checkpoints, { recursive: true }).pipe(Effect.mapError(io))
  // A run that starts over (not a resume: `--overwrite`) replaces an earlier run's checkpoints: kept, they would be
  // "newer" than this run's own, which the pruning would then delete as they are written.
  if (options.resume !== true) {
    for (const name of yield* fs.readDirectory(checkpoints).pipe(Effect.mapError(io))) {
      if (/^\.?step-/.test(name)) {
        yield* fs.remove(`${checkpoints}/${name}`, { recursive: true, force: true }).pipe(Effect.mapError(io))
      }
    }
  }
  const checked = options.checked ?? (yield* Resume.check(config, options))
  const point = yield* Resume.load(learner, config, checked, notice)
  const journal = yield* Journal.open(`${out}/journal.jsonl`, { cutAt: point.cutAt }).pipe(Effect.mapError(io))
  const metrics = yield* openMetrics(fs, out, point)
  yield* fs.writeFileString(`${out}/config.json`, JSON.stringify(config, null, 2)).pipe(Effect.mapError(io))
  const entries = point.existing.entries.filter((e) => e.end <= point.cutAt).map((e) => e.entry)
  const record = (...added: ReadonlyArray<Journal.Entry>) =>
    journal.appendAll(added).pipe(
      Effect.mapError(io),
      Effect.andThen(Effect.sync(() => void entries.push(...added)))
    )
  yield* record({ kind: "start", fromStep: point.step, seed: config.seed, mode: config.mode })
  const startedAt = yield* Clock.currentTimeMillis
  const said = new Set<string>()
  const once = (key: string, text: string) =>
    Effect.suspend(() => {
      if (said.has(key)) return Effect.void
      said.add(key)
      return notice(text)
    })
  return {
    config,
    setup,
    train,
    eval: evalSet,
    demos: options.demos,
    validation,
    learner,
    versions,
    rollouts,
    fs,
    point,
    record,
    entries,
    metrics,
    notice,
    once,
    display: options.display ?? { update: () => Effect.void },
    tokenText: options.tokenText ?? ((id: number) => String(id)),
    elapsed: Effect.map(Clock.currentTimeMillis, (now) => (now - startedAt) / 1000),
    published: new Map(),
    newest: { version: -Infinity },
    checkpoints
  } satisfies Run
})

/**
 * The run's metrics files, every record carrying the process's peak RSS since the previous record (so per phase:
 * warm-up step, RL step, evaluation) and its RSS when written. Metrics errors keep only their message: the
 * annotated file system makes it say ENOSPC on a full disk.
 */
const openMetrics = Effect.fnUntraced(function*(fs: FileSystem.FileSystem, out: string, point: Resume.Point) {
  const files = yield* Metrics.open(out, point.checkpoint === undefined ? {} : { resumeFrom: point.step })
    .pipe(Effect.provideService(FileSystem.FileSystem, DiskFull.annotate(fs)), Effect.mapError(io))
  const memory = yield* PeakRss.make()
  return {
    ...files,
    log: (record) =>
      Effect.flatMap(memory.take, (read) =>
        files.log({ ...record, figures: { ...record.figures, ...PeakRss.figures(read) } }))
  } satisfies Metrics.Metrics
})

// ===== Versions =====

const publishedDeferred = (run: Run, version: number) => {
  const existing = run.published.get(version)
  if (existing !== undefined) return existing
  const made = Deferred.makeUnsafe<void>()
  run.published.set(version, made)
  return made
}

/** Publishes the learner's weights as `version`, releasing the batches that wait for it. */
const publish = (run: Run, version: number) =>
  run.versions.publish(version).pipe(
    Effect.andThen(Effect.sync(() => (run.newest.version = Math.max(run.newest.version, version)))),
    Effect.andThen(Deferred.succeed(publishedDeferred(run, version), undefined))
  )

// ===== Warm-up (SFT) =====

/**
 * The SFT warm-up on demonstrations, with its validation checks when `warmup.stopAt` asks for them; journaled and
 * published as version 0 when it ends.
 */
const warmup = Effect.fn("TrainLoop.warmup")(function*(run: Run) {
  const { config } = run
  const warmup = config.warmup!
  const demos = run.demos!.rows
  yield* RolloutSetup.checkDemosFit(run.setup, demos, run.notice)
  const stopAt = warmup.stopAt
  if (stopAt !== undefined && run.validation === undefined) {
    return yield* RunError.runError("Learner", "warmup.stopAt needs its validation split")
  }
  let done = warmup.steps
  let reached = false
  let best: { readonly step: number; readonly accuracy: number } | undefined
  for (let step = 1; step <= warmup.steps; step++) {
    const t0 = yield* Clock.currentTimeMillis
    const rows = RunSchedule.warmupRows(step, { rows: demos.length, seed: config.seed, batchSize: warmup.batchSize })
    const figures = yield* run.learner.sft(step, rows.map((i) => demos[i]!))
    yield* finite(`warm-up step ${step}`, "warmup/loss", figures["warmup/loss"])
    const seconds = ((yield* Clock.currentTimeMillis) - t0) / 1000
    const check = stopAt !== undefined && RunSchedule.isCheckStep(step, warmup.steps, stopAt)
      ? yield* validate(run, step, warmup.steps, stopAt)
      : undefined
    const record = {
      phase: "warmup" as const,
      step,
      elapsed: yield* run.elapsed,
      figures: {
        ...figures,
        ...check,
        "time/step_s": seconds,
        "perf/tokens_per_s": (figures["perf/row_tokens"] ?? 0) / Math.max(1e-3, seconds)
      }
    }
    yield* run.metrics.log(record).pipe(Effect.mapError(io))
    yield* run.display.update({ ...record, total: warmup.steps })
    const accuracy = check?.["warmup/validation_accuracy"]
    if (accuracy !== undefined && (best === undefined || accuracy > best.accuracy)) best = { step, accuracy }
    if (accuracy !== undefined && accuracy >= stopAt!.accuracy) {
      done = step
      reached = true
      break
    }
  }
  if (stopAt !== undefined && !reached) yield* missedTarget(run, stopAt, best)
  yield* run.record({ kind: "warmup", steps: done })
  yield* publish(run, 0)
})

/** A warm-up that ran its steps short of its target: the run stops (`onMiss: "fail"`) or says so and goes on. */
const missedTarget = (
  run: Run,
  stopAt: TrainConfig.WarmupStopConfig,
  best: { readonly step: number; readonly accuracy: number } | undefined
) => {
  const steps = run.config.warmup!.steps
  if (stopAt.onMiss === "fail") {
    return Effect.fail(RunError.runError(
      "Warmup",
      `the warm-up ran its ${steps} steps short of its target validation accuracy ${stopAt.accuracy}: ${
        best === undefined ? "no check ran" : `best ${best.accuracy} at step ${best.step}`
      } (warmup.stopAt.onMiss: "fail"; try more steps or another model.initSeed)`
    ))
  }
  return run.notice(
    `the warm-up ran its ${steps} steps short of its target validation accuracy ${stopAt.accuracy} (` +
      `${best === undefined ? "no check ran" : `best ${best.accuracy.toFixed(3)} at step ${best.step}`}); going ` +
      `on to RL from its last step (warmup.stopAt.onMiss: "fail" stops a run here instead)`
  )
}

/** A warm-up check: the current weights, published as a warm-up version, answer the validation rows greedily. */
const validate = Effect.fnUntraced(function*(
  run: Run,
  step: number,
  steps: number,
  stopAt: TrainConfig.WarmupStopConfig
) {
  const version = RunSchedule.warmupVersion(step, steps)
  yield* publish(run, version)
  const groups = yield* Rollouts.collectGroups(run.setup, run.validation!.rows.slice(0, stopAt.size), {
    firstSeq: 0,
    chains: 1,
    temperature: 0,
    seed: 8_000_000 + run.config.seed
  }).pipe(Rollouts.sampledBy(run.versions, version))
  yield* checkFailures(run, groups, `warm-up check at step ${step}`)
  const figures = RolloutFigures.rolloutFigures(groups, {
    prefix: "validation",
    correct: run.setup.runtime.correct,
    tools: RolloutSetup.toolNames(run.setup)
  })
  return {
    "warmup/validation_accuracy": figures["validation/accuracy"]!,
    "warmup/validation_invalid_tool_call_rate": figures["validation/invalid_tool_call_rate"]!
  }
})

// ===== Batches =====

/**
 * Starts the pipeline of training batches: step `s`'s batch rolls out once its sampling version is published, at most
 * `maxStaleness + 1` batches ahead of the learner (none ahead in sync mode).
 */
const startBatches = Effect.fnUntraced(function*(run: Run, lastStep: number) {
  const { config, point } = run
  const ahead = config.mode === "sync" ? 0 : config.maxStaleness
  const schedule = { ahead, checkpointEvery: config.checkpoint.every, from: point.step }
  const batches = yield* Queue.bounded<Fiber.Fiber<Batch, RunError.RunError>>(ahead + 1)
  yield* Effect.gen(function*() {
    for (let step = point.step + 1; step <= lastStep; step++) {
      const version = RunSchedule.samplingVersion(step, schedule)
      yield* Deferred.await(publishedDeferred(run, version))
      yield* Queue.offer(batches, yield* Effect.forkScoped(batchFor(run, step, version)))
    }
  }).pipe(Effect.forkScoped)
  return batches
})

/**
 * Groups of `rows` (dataset indices) at seqs from `firstSeq`, sampled by `version` through the `Rollouts` service,
 * checked against what was asked (`BatchCheck`) before anything else reads them.
 */
const rolledOut = Effect.fnUntraced(function*(
  run: Run,
  rows: ReadonlyArray<number>,
  firstSeq: number,
  version: number
) {
  const { config } = run
  const numChains = config.agent.numChains
  const sampling = {
    firstSeq,
    chains: numChains,
    temperature: config.agent.temperature,
    seed: config.seed * 1_000_000 + firstSeq * numChains
  }
  const groups = yield* run.rollouts.collect(run.setup, rows.map((i) => run.train.rows[i]!), sampling, version)
  const problems = BatchCheck.problems(groups, {
    rows: rows.length,
    chains: numChains,
    firstSeq,
    versions: { from: version, to: run.newest.version },
    vocabSize: run.setup.format.vocabSize
  })
  if (problems.length > 0) {
    return yield* RunError.runError(
      "Mismatch",
      `the rollouts of rows ${firstSeq}… (policy version ${version}) do not answer their request, so none of them ` +
        `is trained on: ${problems.join("; ")}`
    )
  }
  return groups.map((group): SampledGroup => ({ group, seq: firstSeq + group.rowIndex, row: rows[group.rowIndex]! }))
})

/**
 * A training batch, sampled by `version`: the run's row order at `(step − 1) · B`, then, with dynamic sampling,
 * further batches (`RunSchedule.extraBatchRows`) until `B` groups have signal or `maxBatches` ran.
 */
const batchFor = Effect.fn("TrainLoop.batch")(function*(run: Run, step: number, version: number) {
  yield* Effect.annotateCurrentSpan({ step, "policy.version": version })
  const start = yield* Clock.currentTimeMillis, since = Effect.map(Clock.currentTimeMillis, (t) => (t - start) / 1000)
  const { config } = run
  const B = config.algorithm.groupsPerStep
  const order = { rows: run.train.rows.length, seed: config.seed, groupsPerStep: B }
  const first = RunSchedule.batchRows(step, order)
  const sampled = [...yield* rolledOut(run, first.rows, first.firstSeq, version)]
  const dynamic = config.algorithm.dynamicSampling
  if (dynamic === undefined) return { sampled, kept: sampled, batches: 1, seconds: yield* since } satisfies Batch
  const kept = sampled.filter((s) => Trajectory.rewardsDiffer(s.group))
  let batches = 1
  while (batches < dynamic.maxBatches && kept.length < B) {
    const extra = RunSchedule.extraBatchRows(step, batches, { ...order, maxBatches: dynamic.maxBatches })
    const more = yield* rolledOut(run, extra.rows, extra.firstSeq, version)
    sampled.push(...more)
    kept.push(...more.filter((s) => Trajectory.rewardsDiffer(s.group)))
    batches++
  }
  return { sampled, kept: kept.slice(0, B), batches, seconds: yield* since } satisfies Batch
})

// ===== A training step =====

/**
 * Learner step `step`: its batch journaled, its rollout figures and notices, the failure gate, the update, the
 * weights published as version `step`, and the step journaled and logged.
 */
const trainStep = Effect.fn("TrainLoop.step")(function*(
  run: Run,
  step: number,
  lastStep: number,
  nextBatch: Effect.Effect<Fiber.Fiber<Batch, RunError.RunError>>
) {
  const t0 = yield* Clock.currentTimeMillis
  const batch = yield* Fiber.join(yield* nextBatch)
  const t1 = yield* Clock.currentTimeMillis
  yield* journalGroups(run, step, batch)
  const groups = batch.sampled.map((s) => s.group)
  const rollout = rolloutFiguresOf(run, step, batch)
  const B = run.config.algorithm.groupsPerStep
  const dynamic = run.config.algorithm.dynamicSampling === undefined
    ? undefined
    : { kept: batch.kept.length, wanted: B, batches: batch.batches }
  const notices = RolloutFigures.stepNotices(step, rollout, groups, {
    agent: run.config.agent,
    task: run.setup.runtime.task,
    dynamic
  })
  for (const n of notices) yield* run.once(n.key, n.text)
  if (RolloutFigures.infrastructureFailures(groups.flatMap((g) => g.trajectories)).share > run.config.maxFailureShare) {
    const failed = { phase: "train" as const, step, elapsed: yield* run.elapsed, figures: rollout }
    yield* run.metrics.log({ ...failed, ...RolloutFigures.failureNote(groups) }).pipe(Effect.mapError(io))
    yield* Telemetry.observe({ ...failed, ...RolloutFigures.failureNote(groups) })
    yield* checkFailures(run, groups, `step ${step}`)
  }
  const outcome = yield* run.learner.learn(step, batch.kept.map((s) => s.group)).pipe(Telemetry.learning(step))
  if (outcome._tag === "Applied") yield* finite(`step ${step}`, "learner/loss", outcome.loss)
  yield* publish(run, step)
  const t2 = yield* Clock.currentTimeMillis
  const figures: Record<string, number> = {
    ...rollout,
    ...outcome.figures,
    ...(yield* run.setup.runtime.environmentStats),
    ...(yield* stepCounts(run)),
    "perf/tokens_per_s": rollout["rollout/policy_tokens"]! / Math.max(1e-3, batch.seconds),
    "time/step_s": (t2 - t0) / 1000,
    "time/wait_rollout_s": (t1 - t0) / 1000,
    "time/learn_s": (t2 - t1) / 1000
  }
  yield* run.record({
    kind: "step",
    step,
    seqs: batch.kept.map((s) => s.seq),
    policyVersion: step,
    weightsHash: yield* run.learner.fingerprint,
    outcome: outcome._tag === "Applied" ? "applied" : outcome._tag === "Skipped" ? "skipped" : "critic_only"
  })
  const elapsed = yield* run.elapsed
  const record = { phase: "train" as const, step, elapsed, figures, ...RolloutFigures.failureNote(groups) }
  yield* run.metrics.log(record).pipe(Effect.mapError(io))
  yield* Telemetry.observe(record)
  for (const g of groups.slice(0, run.config.sampleTrajectories)) {
    const sample = Metrics.sampleOf(g.trajectories[0]!, "train", step, run.tokenText)
    yield* run.metrics.sample(sample, g.trajectories[0]!).pipe(Effect.mapError(io))
  }
  yield* run.display.update({ ...record, total: lastStep })
})

/** Every group sampled is journaled (one fsync for the batch), the ones dynamic sampling left out too. */
const journalGroups = (run: Run, step: number, batch: Batch) =>
  run.record(...batch.sampled.map(({ group, row, seq }) => ({
    kind: "group" as const, seq, groupId: group.groupId, rowIndex: row,
    policyVersion: Math.min(...group.trajectories.map((t) => Trajectory.oldestPolicyVersion(t) ?? step - 1)),
    // Finite by construction (rewards are checked where they are made); a guard keeps the journal readable anyway.
    meanReward: finiteOr0(RolloutFigures.mean(group.trajectories.map((t) => t.reward)))
  })))

/** The rollout figures are the policy's, over everything it sampled; the learner gets the kept groups. */
const rolloutFiguresOf = (run: Run, step: number, batch: Batch): Figures => ({
  ...RolloutFigures.rolloutFigures(batch.sampled.map((s) => s.group), {
    prefix: "rollout",
    correct: run.setup.runtime.correct,
    policyVersion: step - 1,
    tools: RolloutSetup.toolNames(run.setup)
  }),
  ...(run.config.algorithm.dynamicSampling === undefined ? {} : {
    "rollout/dynamic_batches": batch.batches,
    "rollout/groups_sampled": batch.sampled.length,
    "rollout/groups_kept": batch.kept.length
  })
})

/**
 * A step's figures from the machinery behind the services (inference servers, a trainer server, rollout workers); a
 * count two of them report (`servers/requests`: this process's evaluations and the workers' batches) is their sum.
 */
const stepCounts = Effect.fnUntraced(function*(run: Run) {
  const own: Record<string, number> = {
    ...(run.versions.figures === undefined ? {} : yield* run.versions.figures),
    ...(run.learner.figures === undefined ? {} : yield* run.learner.figures)
  }
  const remote = run.rollouts.figures === undefined ? {} : yield* run.rollouts.figures
  const out: Record<string, number> = { ...own, ...remote }
  for (const key of Object.keys(remote)) if (key in own) out[key] = own[key]! + remote[key]!
  return out
})

const finiteOr0 = (x: number) => (Number.isFinite(x) ? x : 0)

/** Stops the run when a step's loss is not finite (whatever the learner behind it checks itself). */
const finite = (what: string, key: string, loss: number | undefined) =>
  loss === undefined || Number.isFinite(loss)
    ? Effect.void
    : Effect.fail(RunError.runError("NonFinite", `${what}: ${key} is ${loss}; nothing was saved after it`))

/** Stops the run when more than `maxFailureShare` of these groups' trajectories failed for infrastructure reasons. */
const checkFailures = (run: Run, groups: ReadonlyArray<Trajectory.Group>, what: string) => {
  const trajectories = groups.flatMap((g) => g.trajectories)
  const failures = RolloutFigures.infrastructureFailures(trajectories)
  const share = run.config.maxFailureShare
  return failures.share > share && failures.reason !== undefined
    ? Effect.fail(RunError.runError(
      "Failures",
      `${what}: ${failures.count} of ${failures.total} trajectories failed with ${failures.reason} ` +
        `(${(failures.share * 100).toFixed(0)}% infrastructure failures, more than maxFailureShare ${share}); ` +
        `first: ${RolloutFigures.firstFailure(trajectories, failures.reason)}`
    ))
    : Effect.void
}

// ===== Evaluation and checkpoints =====

/** The held-out evaluation at `step`, on the weights published as `step`: logged, journaled and shown. */
const evaluate = Effect.fn("TrainLoop.evaluate")(function*(run: Run, step: number) {
  if (run.eval === undefined) return
  const { groups, figures } = yield* Rollouts.evaluation(run.setup, run.eval.rows).pipe(
    Rollouts.sampledBy(run.versions, step)
  )
  const elapsed = yield* run.elapsed
  const record = { phase: "eval" as const, step, elapsed, figures, ...RolloutFigures.failureNote(groups) }
  yield* run.record({ kind: "eval", step, figures: finiteFigures(figures) })
  yield* Telemetry.observe(record)
  yield* run.metrics.log(record).pipe(Effect.mapError(io))
  yield* checkFailures(run, groups, `evaluation at step ${step}`)
  for (const g of groups.slice(0, Math.min(2, run.config.sampleTrajectories))) {
    const sample = Metrics.sampleOf(g.trajectories[0]!, "eval", step, run.tokenText)
    yield* run.metrics.sample(sample, g.trajectories[0]!).pipe(Effect.mapError(io))
  }
  yield* run.display.update({ ...record, total: run.config.algorithm.steps })
})

/** Figures as JSON keeps them: a non-finite one would read back as `null`. */
const finiteFigures = (figures: Figures): Record<string, number> =>
  Object.fromEntries(Object.entries(figures).filter(([, x]) => Number.isFinite(x)))

/**
 * Saves the learner's state as step `step`'s checkpoint: into a fresh directory renamed into place, then journaled
 * with its weights' fingerprint; the oldest beyond `checkpoint.keep` are removed.
 */
const checkpoint = Effect.fn("TrainLoop.checkpoint")(function*(run: Run, step: number) {
  const { fs, checkpoints } = run
  const name = RunSchedule.checkpointName(step)
  const tmp = `${checkpoints}/.${name}.tmp`
  const ck = RunError.wrap("Checkpoint")
  const removeTmp = fs.remove(tmp, { recursive: true, force: true })
  yield* removeTmp.pipe(Effect.mapError(ck))
  // A save that fails (a full disk) leaves no half-written directory behind: it would only fill the disk more.
  yield* fs.makeDirectory(tmp, { recursive: true }).pipe(
    Effect.mapError(ck),
    Effect.andThen(run.learner.save(tmp)),
    Effect.onError(() => Effect.ignore(removeTmp))
  )
  yield* fs.remove(`${checkpoints}/${name}`, { recursive: true, force: true }).pipe(Effect.mapError(ck))
  yield* fs.rename(tmp, `${checkpoints}/${name}`).pipe(Effect.mapError(ck))
  yield* run.record({ kind: "checkpoint", step, path: name, weightsHash: yield* run.learner.fingerprint })
  const all = (yield* fs.readDirectory(checkpoints).pipe(Effect.mapError(ck))).filter((n) => n.startsWith("step-"))
    .sort()
  for (const old of all.slice(0, Math.max(0, all.length - run.config.checkpoint.keep))) {
    yield* fs.remove(`${checkpoints}/${old}`, { recursive: true, force: true }).pipe(Effect.mapError(ck))
  }
})

// ===== The summary =====

/**
 * The run's summary from its journal, as kept in memory: the entries kept at the resume point and those this process
 * wrote (the file's, without reading it again).
 */
const summaryOf = Effect.fnUntraced(function*(run: Run, lastStep: number) {
  const steps = new Map<number, typeof Journal.StepDone.Type>()
  const evals = new Map<number, Figures>()
  for (const e of run.entries) {
    if (e.kind === "step") steps.set(e.step, e)
    if (e.kind === "eval") evals.set(e.step, e.figures)
  }
  const count = (outcome: string) => [...steps.values()].filter((s) => (s.outcome ?? "applied") === outcome).length
  return {
    fromStep: run.point.step,
    steps: lastStep,
    trained: count("applied"),
    skipped: count("skipped"),
    criticOnly: count("critic_only"),
    evals: [...evals].map(([step, figures]) => ({ step, figures })),
    fingerprint: yield* run.learner.fingerprint
  } satisfies Summary
})
