/**
 * The retrieval QA task (Search-R1): questions of one and two hops over a corpus of short passages, answered by
 * calling `search` (BM25 over the corpus) and then `answer`; scored by exact match (or token F1) of the answer
 * against the row's `answer`.
 *
 * - **The corpus** is the seeded world of `World.ts` (options `seed` and `passages`: the run rebuilds exactly the
 *   corpus its questions were generated from), or a user's own `corpus.jsonl` (option `corpus`, a path relative to
 *   the config file; see `Corpus.ts` for the format). It is indexed once per run, in the task's `layer`, and
 *   every chain searches that one index.
 * - **Each chain** has its own search session (`SearchSession`): its budget of searches and its queries.
 * - **The reward** counts only an answer given with the `answer` tool (an episode that runs out of turns scores 0,
 *   even when its last search result contains the answer): `exactMatch` by default, `f1` with `{ "reward": "f1" }`,
 *   optionally plus a weighted `toolCallFormat` term. Metrics: `reward/exactMatch/em` (the task's accuracy),
 *   `reward/answer/answered`, `reward/answer/searches`.
 *
 * A config names it `"task": "search"` or `{ "name": "search", "options": { … } }` (see {@link Options}); the data
 * comes from `examples/search/generate.ts`.
 *
 * @since 0.1.0
 */
import { NodeFileSystem } from "@effect/platform-node"
import { Effect, Schema } from "effect"
import type { Layer } from "effect"
import * as Answer from "../answer/Answer.ts"
import * as Qa from "../rewards/Qa.ts"
import * as ToolCallFormat from "../rewards/ToolCallFormat.ts"
import * as Environment from "../../src/Environment.ts"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import * as Corpus from "./Corpus.ts"
import * as SearchIndex from "./SearchIndex.ts"
import * as SearchSession from "./SearchSession.ts"
import * as SearchTool from "./SearchTool.ts"
import * as World from "./World.ts"

// ===== Models =====

const Count = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

/**
 * The task's options: the corpus (a world's `seed` and least `passages`, or a `corpus` file), how searches are
 * answered (`k`, `maxK`, `maxSearches`, `passageChars`, `observationChars`: see `SearchSession.Options`), the QA
 * reward (`em` or `f1`) and the weight of a `toolCallFormat` term (default 0).
 *
 * @category models
 * @since 0.1.0
 */
export const Options = Schema.Struct({
  seed: Schema.optionalKey(Schema.Int),
  passages: Schema.optionalKey(Count),
  corpus: Schema.optionalKey(Task.PathOption),
  k: Schema.optionalKey(Count),
  maxK: Schema.optionalKey(Count),
  maxSearches: Schema.optionalKey(Count),
  passageChars: Schema.optionalKey(Count),
  observationChars: Schema.optionalKey(Count),
  reward: Schema.optionalKey(Schema.Literals(["em", "f1"])),
  toolCallFormat: Schema.optionalKey(Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)))
})
export type Options = typeof Options.Type

/**
 * The system prompt (every byte of it is in every sequence of a byte-level policy).
 *
 * @category constants
 * @since 0.1.0
 */
export const systemPrompt = "Search, then answer."

// ===== Constructors =====

/**
 * The passages of the options: the `corpus` file's, or the seeded world's.
 *
 * @category constructors
 * @since 0.1.0
 */
export const passagesOf = (options: Options) =>
  options.corpus !== undefined
    ? Corpus.read(options.corpus).pipe(Effect.provide(NodeFileSystem.layer))
    : Effect.sync(() =>
      World.passages(World.make({
        seed: options.seed ?? World.defaults.seed,
        passages: options.passages ?? World.defaults.passages
      }))
    )

/**
 * A QA reward that counts only the `answer` tool's answer: the part scores the answer when the episode ended with
 * it and the empty string otherwise (so an episode cut short scores 0 whatever its last observation holds).
 * Metrics: `answered` (0/1) and `searches` (the chain's session).
 *
 * @category constructors
 * @since 0.1.0
 */
export const answered = (qa: Reward.Reward<never>) =>
  Reward.make("answer", {
    dependencies: [SearchSession.SearchSession],
    score: ({ trajectory }) =>
      Effect.gen(function*() {
        const done = trajectory.termination === "answer"
        const outcome = yield* qa.evaluate({ trajectory, response: done ? Trajectory.finalResponse(trajectory) : "" })
        const { queries } = yield* (yield* SearchSession.SearchSession).state
        const metrics = { ...outcome.metrics, answered: done ? 1 : 0, searches: queries.length }
        return outcome._tag === "Scored" ? { reward: outcome.reward, metrics } : Reward.notApplicable(outcome.reason)
      })
  })

/**
 * The reward of the options: {@link answered} exact match (or F1), plus `w · toolCallFormat` when `w > 0`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const reward = (options: Pick<Options, "reward" | "toolCallFormat">) => {
  const qa = answered(options.reward === "f1" ? Qa.f1 : Qa.exactMatch)
  const w = options.toolCallFormat ?? 0
  return ToolCallFormat.withFormat(qa, w, "qa")
}

/** A trajectory is correct when its answer matches a reference exactly (under either QA reward). */
const correct = (t: Trajectory.Trajectory): boolean =>
  (t.metrics["reward/exactMatch/em"] ?? t.metrics["reward/f1/em"]) === 1

/**
 * The task on the options' corpus, or on the index `index` builds (a corpus built in code, a prebuilt index); it
 * is the task's layer, built once per run.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (
  options: Options = {},
  index: Layer.Layer<SearchIndex.SearchIndex, Corpus.CorpusError> = SearchIndex.layer(passagesOf(options))
) => {
  const session: SearchSession.Options = {
    k: options.k ?? SearchSession.defaults.k,
    maxK: options.maxK ?? SearchSession.defaults.maxK,
    maxSearches: options.maxSearches ?? SearchSession.defaults.maxSearches,
    passageChars: options.passageChars ?? SearchSession.defaults.passageChars,
    observationChars: options.observationChars ?? SearchSession.defaults.observationChars
  }
  return Task.make("search", {
    description: "Questions of one and two hops answered by searching a corpus of passages",
    row: Schema.Struct({ answer: Schema.Union([Schema.String, Schema.NonEmptyArray(Schema.String)]) }),
    tools: [SearchTool.make(session.maxK), Answer.answer],
    reward: reward(options),
    // The index is built once per run (the task's layer); each chain gets its own session over it.
    layer: index,
    environment: Environment.perChain(SearchSession.layer(session)),
    correct,
    defaults: { systemPrompt, renderTools: false, maxTurns: 4, maxNewTokens: 64, maxContextTokens: 768 }
  })
}

/**
 * The task as a config names it (`"task": "search"`, with optional options).
 *
 * @category constructors
 * @since 0.1.0
 */
export const task = Task.withOptions("search", Options, (options) => make(options)) // make's 2nd parameter: an index
