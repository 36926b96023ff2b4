/** A `PolicyEngine` whose `generate` is a test's script, at policy version 9, for servers and rollouts under test. */
import { Effect } from "effect"
import { PolicyEngine } from "../../actors/PolicyEngine.ts"
import type * as ModelFolder from "../../src/ModelFolder.ts"

export const scriptedEngine = (
  folder: ModelFolder.ModelFolder,
  generate: PolicyEngine["Service"]["generate"]
): PolicyEngine["Service"] =>
  PolicyEngine.of({
    config: folder.config,
    generate,
    updateWeights: () => Effect.void,
    policyVersion: Effect.succeed(9),
    stats: Effect.succeed({ decodeSteps: 0, prefills: 0, prefillTokens: 0, reusedTokens: 0, generatedTokens: 0, largestBatch: 0, sessions: 1, running: {} })
  })
