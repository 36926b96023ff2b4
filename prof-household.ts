import { Effect } from "effect"
import * as Data from "./environments/household/Data.ts"
import * as HouseholdTask from "./environments/household/HouseholdTask.ts"
import * as Solver from "./environments/household/Solver.ts"
const rows = Data.rows({ ...Data.defaults, heldOut: 64, train: 0, validation: 0, demos: 0 }).heldOut
const task = HouseholdTask.make("household")
for (let r = 0; r < Number(process.env.REPS ?? 8); r++) {
  const t = performance.now()
  const tr = await Effect.runPromise(Data.rollout(task, Solver.oracle, rows))
  const ms = performance.now() - t
  const steps = tr.reduce((n, t) => n + t.metrics["reward/solved/steps"]!, 0)
  console.log(`round ${r}: ${steps} steps ${ms.toFixed(0)} ms ${(ms * 1000 / steps).toFixed(0)} us/step turns/ep ${(steps/tr.length).toFixed(1)}`)
}
