/**
 * The seeded data of the household and science tasks: rows (a world's seed, a goal, the world's size and step
 * limit; the task types in turn) in train / held-out / validation splits with disjoint seeds, and SFT
 * demonstrations: the conversations of the oracle (`Solver.ts`) where it solved its row, rolled out through the
 * task itself (`Rollout.runTaskChat`, the byte tokenizer and the Qwen2.5 template, so a demonstration that would
 * not fit `maxContextTokens` is not written).
 *
 * `noise` is the chance that a demonstration's step is a detour (going to a receptacle of the room drawn at random)
 * instead of the oracle's command: such episodes take longer and some run out of context, so a warm-up on them
 * leaves RL something to shorten. Seeded throughout: the same options write the same bytes.
 *
 * @since 0.1.0
 */
import { Effect, Stream } from "effect"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as Oracle from "../../actors/Oracle.ts"
import * as Rollout from "../../actors/Rollout.ts"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as Sampling from "../../src/Sampling.ts"
import type * as Task from "../../src/Task.ts"
import type * as Trajectory from "../../src/Trajectory.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import * as Goal from "./Goal.ts"
import * as HouseholdTask from "./HouseholdTask.ts"
import * as Solver from "./Solver.ts"
import * as World from "./World.ts"

// ===== Models =====

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly dir: string
  readonly family: "household" | "science"
  /** The task types to draw (default: all of the family's), in turn. */
  readonly types?: ReadonlyArray<Goal.TaskType> | undefined
  readonly seed: number
  readonly train: number
  readonly heldOut: number
  readonly validation: number
  readonly demos: number
  readonly noise: number
  /** The size of every row's world (default: the family's, `World.defaultSpec`). */
  readonly world?: World.Spec | undefined
  readonly maxSteps: number
  /** The context a demonstration must fit, in byte-tokenizer tokens with the Qwen2.5 template. */
  readonly maxContextTokens: number
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Options, "dir"> = {
  family: "household",
  seed: 2026,
  train: 2000,
  heldOut: 200,
  validation: 100,
  demos: 2000,
  noise: 0,
  maxSteps: HouseholdTask.defaultMaxSteps,
  maxContextTokens: 1024
}

/**
 * A data row, as written.
 *
 * @category models
 * @since 0.1.0
 */
export interface Row extends Rollout.TaskRow {
  readonly question: string
  readonly seed: number
  readonly goal: Goal.Goal
  readonly world: World.Spec
  readonly maxSteps: number
}

// ===== Rows =====

/**
 * The four row sets (demonstrations are rolled out on the last), with seeds drawn without repeats so that no
 * world appears in two of them.
 *
 * @category constructors
 * @since 0.1.0
 */
export const rows = (options: Omit<Options, "dir">) => {
  const next = Sampling.mulberry32(options.seed)
  const types = options.types ?? (options.family === "household" ? Goal.householdTypes : Goal.scienceTypes)
  const world = { ...World.defaultSpec[options.family], ...options.world }
  const used = new Set<number>()
  let k = 0
  const draw = (n: number): Array<Row> =>
    Array.from({ length: n }, () => {
      let seed = Math.floor(next() * 2 ** 31)
      while (used.has(seed)) seed = Math.floor(next() * 2 ** 31)
      used.add(seed)
      const goal = Goal.sample(types[k++ % types.length]!, next)
      return { question: Goal.text(goal), seed, goal, world, maxSteps: options.maxSteps }
    })
  return {
    train: draw(options.train),
    heldOut: draw(options.heldOut),
    validation: draw(options.validation),
    demos: draw(options.demos)
  }
}

// ===== Demonstrations =====

const tokenizer = Effect.runSync(Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig("")))

/**
 * The rollout format of demonstrations and tests: the byte-level tokenizer and the Qwen2.5 template (what the
 * tiny policy uses), so that context budgets count what training will see.
 *
 * @category constants
 * @since 0.1.0
 */
export const format = ChainFormat.fromTemplate({ tokenizer, template: ChatTemplate.builtinTemplate("qwen2.5") })

/**
 * The oracle with detours: with probability `noise` a step goes to a receptacle of the room drawn at random
 * (seeded by the conversation, so a row's demonstration is the same every run).
 *
 * @category constructors
 * @since 0.1.0
 */
export const noisy = (noise: number): Oracle.Policy => (messages) => {
  const { opening, pairs } = Solver.history(messages)
  const beliefs = Solver.beliefs(opening, pairs)
  const next = Sampling.mulberry32(opening.length * 7919 + pairs.length * 104729 + (opening.charCodeAt(40) || 0))
  const here = beliefs.rooms.get(beliefs.room) ?? []
  if (noise > 0 && next() < noise && here.length > 0) {
    return { content: `go to ${here[Math.floor(next() * here.length)]}` }
  }
  return { content: Solver.decide(beliefs) }
}

/**
 * Rolls a policy out on a task's rows through the rollout machinery and returns the trajectories in row order
 * (chain order within a row).
 *
 * @category constructors
 * @since 0.1.0
 */
export const rollout = (
  task: Task.Task,
  policy: Oracle.Policy,
  rows: ReadonlyArray<Rollout.TaskRow>,
  options: { readonly maxContextTokens?: number | undefined; readonly numChains?: number | undefined } = {}
) =>
  Rollout.runTaskChat({
    task,
    rows,
    numChains: options.numChains ?? 1,
    maxTurns: task.defaults.maxTurns ?? HouseholdTask.defaultMaxSteps + 1,
    maxContextTokens: options.maxContextTokens,
    sampling: { temperature: 1, maxTokens: 48, seed: 1 },
    format
  }).pipe(
    Stream.runCollect,
    Effect.map((events) =>
      events.flatMap((e) => (e._tag === "Trajectory" ? [e] : [])).sort((a, b) =>
        a.rowIndex - b.rowIndex || a.trajectory.chainId.localeCompare(b.trajectory.chainId)
      ).map((e) => e.trajectory)
    ),
    Effect.provide(Oracle.layer(policy))
  )

/**
 * The tokens of a trajectory (every segment's spans).
 *
 * @category getters
 * @since 0.1.0
 */
export const tokens = (t: Trajectory.Trajectory): number =>
  t.segments.reduce((n, s) => n + s.spans.reduce((m, span) => m + span.tokenIds.length, 0), 0)

/**
 * Generates and writes `train.jsonl`, `heldout.jsonl`, `validation.jsonl` and `demos.jsonl` under `options.dir`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("household.Data.write")(function*(options: Options) {
  // Options from a command line are checked here: a misspelt family or type would otherwise write other data.
  if (options.family !== "household" && options.family !== "science") {
    return yield* Effect.fail(
      new Error(`family must be "household" or "science", got ${JSON.stringify(options.family)}`)
    )
  }
  const allowed: ReadonlyArray<string> = options.family === "household" ? Goal.householdTypes : Goal.scienceTypes
  const unknown = (options.types ?? []).filter((type) => !allowed.includes(type))
  if (unknown.length > 0) {
    return yield* Effect.fail(
      new Error(`types ${unknown.join(", ")} are not ${options.family} types (${allowed.join(", ")})`)
    )
  }
  const sets = rows(options)
  const task = HouseholdTask.make(options.family, { maxSteps: options.maxSteps })
  // Rolled out without a budget (a cut transcript keeps its whole messages), then kept when the whole
  // conversation fits the policy's positions.
  const trajectories = yield* rollout(task, noisy(options.noise), sets.demos)
  const demos = Oracle.demonstrations(trajectories.filter((t) => tokens(t) <= options.maxContextTokens))
  return yield* Dataset.writeSplits(options.dir, {
    train: sets.train,
    heldOut: sets.heldOut,
    validation: sets.validation,
    demos
  })
})
