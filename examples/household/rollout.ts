/**
 * Rolls the oracle out on a data file through the task (`Rollout.runTaskChat`) and prints the solve rate per task
 * type and one episode, as the model would see it.
 *
 *   npx tsx examples/household/rollout.ts [ROWS_JSONL] [household|science]
 *
 * @since 0.1.0
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Console, Effect } from "effect"
import * as Oracle from "../../actors/Oracle.ts"
import * as Data from "../../environments/household/Data.ts"
import type * as Goal from "../../environments/household/Goal.ts"
import * as HouseholdTask from "../../environments/household/HouseholdTask.ts"
import * as Solver from "../../environments/household/Solver.ts"
import * as Dataset from "../../src/Dataset.ts"

const file = process.argv[2] ?? "examples/household/data/heldout.jsonl"
const family = (process.argv[3] ?? "household") as "household" | "science"

Effect.gen(function*() {
  const task = HouseholdTask.make(family)
  const data = yield* Dataset.load(file, { fields: task.row })
  const rows = data.rows.map((r) => ({ question: r.question, ...r.fields }))
  const trajectories = yield* Data.rollout(task, Solver.oracle, rows)
  const types = new Map<string, Array<number>>()
  for (const t of trajectories) {
    const type = (t.row?.["goal"] as Goal.Goal).type
    types.set(type, [...(types.get(type) ?? []), t.reward])
  }
  for (const [type, rewards] of types) {
    yield* Console.log(`${type.padEnd(8)} solved ${rewards.filter((r) => r >= 1).length}/${rewards.length}`)
  }
  yield* Console.log(`all      ${(Oracle.solveRate(trajectories) * 100).toFixed(1)} %\n`)
  for (const m of trajectories[0]!.messages) yield* Console.log(`${m.role}: ${Oracle.text(m)}`)
}).pipe(Effect.provide(NodeServices.layer), NodeRuntime.runMain)
