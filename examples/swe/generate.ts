/**
 * Writes the SWE task's data: seeded bug-fix tasks as Harbor folders under `OUT_DIR/tasks/`, the rows of each
 * split (`train.jsonl`, `heldout.jsonl`, `validation.jsonl`: `{ question, task }`, `task` relative to `OUT_DIR`)
 * and `demos.jsonl` (the oracle's solved tasks, rolled out through the task's own tools, containers and verifier
 * by `Oracle.rollout`, for the SFT warm-up). Needs the Docker engine and the `agentfly/python:1` image
 * (`.ci/setup-services` starts one and builds the other). Seeded: the same options write the same bytes.
 *
 *   npx tsx examples/swe/generate.ts [OUT_DIR] [SEED] [NOISE] [--train N] [--heldOut N] [--validation N] [--demos N]
 *
 * A run must pass `OUT_DIR` as the task's `root` option (as the shipped configs do, from the repository root).
 * `NOISE` is the share of the demonstrations' bugs (drawn per row, decided per instruction: the oracle sees only the
 * conversation) whose demonstrations read `textutil.py` before fixing it.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import * as Oracle from "../../actors/Oracle.ts"
import * as BugFix from "../../environments/swe/BugFix.ts"
import * as HarborOracle from "../../environments/swe/HarborOracle.ts"
import * as HarborTask from "../../environments/swe/HarborTask.ts"
import * as SweTask from "../../environments/swe/SweTask.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as Sampling from "../../src/Sampling.ts"
import { main } from "../generator.ts"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly dir: string
  readonly seed: number
  readonly noise: number
  readonly train: number
  readonly heldOut: number
  readonly validation: number
  readonly demos: number
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Options, "dir"> = {
  seed: 2026,
  noise: 0,
  train: 64,
  heldOut: 32,
  validation: 16,
  demos: 32
}

/**
 * Writes the task folders and the four files under `options.dir`; returns the rows written per file.
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("swe.generate.write")(function*(options: Options) {
  const split = (name: string, count: number, salt: number) =>
    BugFix.generate(options.seed * 4 + salt, count, name)
  const sets = {
    train: split("train", options.train, 0),
    heldOut: split("heldout", options.heldOut, 1),
    validation: split("validation", options.validation, 2),
    demos: split("demo", options.demos, 3)
  }
  const all = [...sets.train, ...sets.heldOut, ...sets.validation, ...sets.demos]
  yield* BugFix.write(`${options.dir}/tasks`, all)
  const rows = (tasks: ReadonlyArray<BugFix.Generated>) =>
    tasks.map((t) => ({ question: t.instruction, task: `tasks/${t.name}` }))
  const demoTasks = yield* Effect.forEach(sets.demos, (t) => HarborTask.load(`${options.dir}/tasks/${t.name}`))
  const task = SweTask.make({ root: options.dir })
  const next = Sampling.mulberry32(options.seed)
  const looks = sets.demos.map(() => next() < options.noise)
  // Two oracles, one reading the module first: each demonstration row goes to one of them.
  const [plain, looking] = [HarborOracle.oracle(demoTasks), HarborOracle.oracle(demoTasks, { look: "textutil.py" })]
  const lookRows = new Set(sets.demos.filter((_, i) => looks[i]).map((t) => t.instruction))
  const policy: Oracle.Policy = (messages) =>
    (lookRows.has(Oracle.text(messages.find((m) => m.role === "user")).trim()) ? looking : plain)(messages)
  const played = yield* Oracle.rollout({ task, rows: rows(sets.demos), policy, concurrency: 8 })
  return yield* Dataset.writeSplits(options.dir, {
    train: rows(sets.train),
    heldOut: rows(sets.heldOut),
    validation: rows(sets.validation),
    demos: Oracle.demonstrations(played)
  })
})

main(import.meta.url, { ...defaults, dir: "data" }, write)
