// The guess task and its rows, inside an Effect program.
import * as Effect__ from "effect/Effect"
import { task } from "../../../examples/guess/task.ts"
declare const rows: ReadonlyArray<{ readonly secret: number; readonly question: string }>
