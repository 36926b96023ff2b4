// A trajectory from a rollout, read back inside an Effect program.
import * as Effect__ from "effect/Effect"
import type { Trajectory as Trajectory__ } from "../../../src/index.ts"
declare const trajectory: Trajectory__.Trajectory
