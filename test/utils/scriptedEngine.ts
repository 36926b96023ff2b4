/**
 * A `PolicyEngine` whose `generate` is a test's script, at policy version 9, for servers and rollouts under test.
 * A script computes no positions, so its config holds a 32,768-token context (the server checks prompts against the
 * engine's config before it calls `generate`): a rendered conversation with tools fits, as on a real model.
 */
import { Effect } from "effect"
import { PolicyEngine } from "../../actors/PolicyEngine.ts"
import type * as ModelFolder from "../../src/ModelFolder.ts"

export const scriptedEngine = (
  folder: ModelFolder.ModelFolder,
  generate: PolicyEngine["Service"]["generate"]
): PolicyEngine["Service"] =>
  PolicyEngine.of({
    config: { ...folder.config, maxPositionEmbeddings: 32_768 },
    generate,
    updateWeights: () => Effect.void,
    policyVersion: Effect.succeed(9),
    stats: Effect.succeed({
      decodeSteps: 0,
      prefills: 0,
      prefillTokens: 0,
      reusedTokens: 0,
      generatedTokens: 0,
      largestBatch: 0,
      sessions: 1,
      running: {}
    })
  })
