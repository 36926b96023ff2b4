// Groups from a rollout, and an engine to publish to.
import type * as Learner__ from "../../../actors/Learner.ts"
import type * as PolicyEngine__ from "../../../actors/PolicyEngine.ts"
declare const groups: Parameters<typeof Learner__.update>[0]
declare const engine: PolicyEngine__.PolicyEngine["Service"]
