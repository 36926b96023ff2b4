/**
 * Token-in/token-out does not depend on how rollouts are batched: on the real engine (tiny Qwen2 policy on
 * onnxruntime, calculator tool), the same rows with the same chain seeds give the same tokens (and logprobs to
 * float32 rounding) whether they are rolled out a training step at a time or in one pass whose chains start as
 * others finish (an evaluation's shape, where new prompts join sequences already decoding). Continued turns are
 * checked against fresh ones in `PolicyEngine.test.ts`.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as PolicyEngine from "../../actors/PolicyEngine.ts"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as CalculatorTask from "../../environments/calculator/CalculatorTask.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { Sampler } from "../../src/Sampler.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import * as Rollouts from "../../actors/Rollouts.ts"
import * as RolloutSetup from "../../actors/RolloutSetup.ts"

describe("batch invariance", () => {
  it.live("training-shaped and evaluation-shaped rollouts of the same chains sample the same tokens", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "batch-invariance-"))
      yield* Generate.write({ dir, seed: 9, train: 12, heldOut: 1, validation: 1, demos: 1, noise: 0 })
      yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 4 })
      const folder = yield* ModelFolder.load(join(dir, "model"))
      const config = yield* TrainConfig.decode({
        output: join(dir, "run"),
        model: { path: join(dir, "model") },
        data: { train: join(dir, "train.jsonl") },
        task: "calculator",
        agent: { renderTools: false, maxTurns: 2, numChains: 3, maxNewTokens: 20, maxContextTokens: 256 },
        algorithm: { steps: 1 }
      })
      const rows = (yield* Dataset.load(join(dir, "train.jsonl"), { onInvalid: "stop" })).rows
      const engine = yield* PolicyEngine.make({ config: folder.config, weights: folder.weights, maxBatchSize: 8 })
      const agent = yield* RolloutSetup.make({
        task: CalculatorTask.make(),
        config,
        format: ChainFormat.ofConfig(config, folder)
      })
      const collect = (from: number, to: number, maxConcurrentChains: number) =>
        Rollouts.collectGroups({ ...agent, maxConcurrentChains }, rows.slice(from, to), {
          firstSeq: from,
          chains: 3,
          temperature: 1,
          seed: 500 + from * 3
        }).pipe(
          Effect.provideService(Sampler, Sampler.of({ generate: engine.generate, policyVersion: engine.policyVersion }))
        )
      const steps: Array<Trajectory.Group> = []
      for (let from = 0; from < rows.length; from += 4) steps.push(...(yield* collect(from, from + 4, 64)))
      const staggered = yield* collect(0, rows.length, 5)

      const sampled = (groups: ReadonlyArray<Trajectory.Group>) =>
        groups.flatMap((g) =>
          g.trajectories.map((t) => ({
            tokens: Array.from(t.segments.flatMap((s) => Array.from(Trajectory.tokenIds(s)))),
            logprobs: Array.from(t.segments.flatMap((s) => Array.from(Trajectory.logprobs(s)))),
            termination: t.termination
          }))
        )
      const a = sampled(steps)
      const b = sampled(staggered)
      assert.strictEqual(a.length, 36)
      assert.deepStrictEqual(b.map((x) => x.tokens), a.map((x) => x.tokens))
      assert.deepStrictEqual(b.map((x) => x.termination), a.map((x) => x.termination))
      // Logprobs agree to float32 rounding: another batch size blocks the matrix products differently.
      for (let i = 0; i < a.length; i++) {
        a[i]!.logprobs.forEach((lp, j) => {
          const other = b[i]!.logprobs[j]!
          if (Number.isNaN(lp)) {
            assert.isTrue(Number.isNaN(other), "a token the policy did not sample has no logprob in either")
          } else {
            assert.approximately(other, lp, 1e-5)
          }
        })
      }
      // The comparison means something: the chains of a group sampled different answers.
      assert.isTrue(new Set(a.map((x) => x.tokens.join(","))).size > 12, "distinct samples")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)
})
