/**
 * Writes the search task's data: `corpus.jsonl` (the seeded world's passages, the format a user's own corpus
 * takes), `train.jsonl` (RL questions), `heldout.jsonl`, `validation.jsonl` (the warm-up's stopping check) and
 * `demos.jsonl` (the oracle's conversations through the task's real tools, for the SFT warm-up). A row is a
 * `question` and its `answer`, with its `kind` and `hops`. Seeded: the same options always write the same bytes.
 *
 *   npx tsx examples/search/generate.ts [OUT_DIR] [SEED] [NOISE] [--kind mixed|born|…] [--passages N] [--train N] …
 *
 * `SEED` builds the world and draws the questions: a run must name the same world (task options `seed` and
 * `passages`; the defaults match) or read this `corpus.jsonl` (`corpus`). `NOISE` is the share of demonstrations
 * whose final answer is a slip of the oracle (see `SearchOracle.noisy`). `--kind` asks one kind of question only
 * (`World.Kind`; default `mixed`, all five): `born` ("Where was Kavo Meli born?") is the fixed-shape variant the
 * tiny policy learns in minutes (`lookup.json`): the name always at the same place, its two passages in the same
 * order (the birthplace first), the answer copied from the first line, and the noisy slip the job on the second.
 *
 * @since 0.1.0
 */
import { Effect, Stream } from "effect"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as Oracle from "../../actors/Oracle.ts"
import * as Rollout from "../../actors/Rollout.ts"
import * as SearchOracle from "../../environments/search/SearchOracle.ts"
import * as SearchTask from "../../environments/search/SearchTask.ts"
import * as World from "../../environments/search/World.ts"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import { main } from "../generator.ts"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly dir: string
  readonly seed: number
  /** The least number of passages of the world. */
  readonly passages: number
  readonly train: number
  readonly heldOut: number
  readonly validation: number
  readonly demos: number
  /** The share of two-hop questions in every split. */
  readonly twoHop: number
  readonly noise: number
  /** The kind of question asked (`World.Kind`), or `mixed` (the default) for all five by `twoHop`. */
  readonly kind: string
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Options, "dir"> = {
  seed: World.defaults.seed,
  passages: World.defaults.passages,
  train: 2000,
  heldOut: 300,
  validation: 100,
  demos: 1000,
  twoHop: 0.3,
  noise: 0,
  kind: "mixed"
}

/** The byte-level tokenizer and Qwen2.5 template the demonstrations are rolled out with (as the tiny policy's). */
const format = () =>
  Effect.map(
    Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig("")),
    (tokenizer) => ChainFormat.fromTemplate({ tokenizer, template: ChatTemplate.builtinTemplate("qwen2.5") })
  )

/**
 * The oracle's (or, with `noise`, the noisy oracle's) conversations on `rows`, through the task's tools, in row
 * order.
 *
 * @category constructors
 * @since 0.1.0
 */
export const demonstrations = Effect.fn("search.generate.demonstrations")(function*(
  options: Pick<Options, "seed" | "passages" | "noise">,
  rows: ReadonlyArray<World.Question>
) {
  const task = SearchTask.make({ seed: options.seed, passages: options.passages })
  const events = yield* Rollout.runTaskChat({
    task,
    rows: rows.map(({ question, answer }) => ({ question, answer })),
    numChains: 1,
    maxTurns: task.defaults.maxTurns!,
    sampling: { temperature: 1, maxTokens: task.defaults.maxNewTokens!, seed: options.seed },
    format: yield* format()
  }).pipe(
    Stream.runCollect,
    Effect.provide(Oracle.layer(options.noise > 0 ? SearchOracle.noisy(options.noise) : SearchOracle.oracle))
  )
  const trajectories = events.flatMap((e) => (e._tag === "Trajectory" ? [e] : []))
    .sort((a, b) => a.rowIndex - b.rowIndex)
    .map((e) => e.trajectory)
  // Noisy demonstrations keep their slips (reward 0); gold ones are the oracle's solved episodes.
  return Oracle.demonstrations(trajectories, options.noise > 0 ? 0 : 1)
})

/**
 * Generates and writes the five files under `options.dir` (created if missing).
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("search.generate.write")(function*(options: Options) {
  const kinds = Object.keys(World.hops) as Array<World.Kind>
  const kind = kinds.find((k) => k === options.kind)
  if (kind === undefined && options.kind !== "mixed") {
    return yield* Effect.fail(new Error(`unknown kind ${options.kind} (known: mixed, ${kinds.join(", ")})`))
  }
  const world = World.make({ seed: options.seed, passages: options.passages })
  // Held-out first: it does not change when the other splits grow.
  const splits = yield* World.questions(world, {
    seed: options.seed + 1,
    twoHop: options.twoHop,
    kinds: kind === undefined ? undefined : [kind],
    counts: { heldOut: options.heldOut, validation: options.validation, train: options.train, demos: options.demos }
  })
  const row = ({ question, answer, kind, hops }: World.Question) => ({ question, answer, kind, hops })
  return yield* Dataset.writeSplits(options.dir, {
    corpus: World.passages(world),
    train: splits.train.map(row),
    heldOut: splits.heldOut.map(row),
    validation: splits.validation.map(row),
    demos: yield* demonstrations(options, splits.demos)
  })
})

main(import.meta.url, { ...defaults, dir: "data" }, write)
