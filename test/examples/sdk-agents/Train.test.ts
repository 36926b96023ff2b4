/**
 * Each SDK example's task module trains unchanged on the tiny local policy (`TrainLoop.run`, two steps on the
 * calculator questions, through the gateway): every step trains on the SDK's episodes, none fails, and the episodes'
 * trajectories are masked by provenance (the policy's sampled tokens, with their logprobs and policy version, are
 * the only trainable ones; the prompt never is).
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as LocalPolicy from "../../../actors/LocalPolicy.ts"
import * as Agents from "../../../examples/sdk-agents/agents.ts"
import * as OpenAi from "../../../examples/sdk-agents/openai.ts"
import * as Vercel from "../../../examples/sdk-agents/vercel.ts"
import type * as AgentTask from "../../../src/AgentTask.ts"
import * as Dataset from "../../../src/Dataset.ts"
import * as ModelFolder from "../../../src/ModelFolder.ts"
import * as Task from "../../../src/Task.ts"
import * as TrainConfig from "../../../src/TrainConfig.ts"
import * as Trajectory from "../../../src/Trajectory.ts"
import * as TrainLoop from "../../../actors/TrainLoop.ts"
import * as Rollouts from "../../../actors/Rollouts.ts"
import * as RolloutSetup from "../../../actors/RolloutSetup.ts"

const questions = [
  ["What is 12+30?", "42"],
  ["Compute 7*8.", "56"],
  ["What is 90-17?", "73"],
  ["Calculate 6*6+1.", "37"]
]

const train = Dataset.parse(
  "train",
  questions.map(([question, answer]) => JSON.stringify({ question, answer })).join("\n"),
  { fields: undefined }
)

const trains = (task: AgentTask.AgentTask) =>
  Effect.gen(function*() {
    const dir = mkdtempSync(join(tmpdir(), `sdk-${task.name}-`))
    yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 1 })
    const folder = yield* ModelFolder.load(join(dir, "model"))
    // The task's defaults (system prompt, budgets, no tool list in the prompt) under a two-step run.
    const config = TrainConfig.onModel(
      yield* TrainConfig.decode(Task.withDefaults(task, {
        output: join(dir, "run"),
        seed: 2,
        model: { path: join(dir, "model") },
        data: { train: "unused" },
        agent: { numChains: 2, maxNewTokens: 32 },
        algorithm: {
          steps: 2,
          groupsPerStep: 2,
          microBatchSize: 4,
          lr: 0.002,
          advantage: "reinforce++",
          entropyCoef: 0.01
        },
        eval: { every: 100, size: 1 },
        checkpoint: { every: 100 }
      })),
      folder.config
    )
    const format = ChainFormat.fromTemplate({ tokenizer: folder.tokenizer, template: folder.template })
    const data = yield* train
    const { summary, groups } = yield* Effect.scoped(Effect.gen(function*() {
      const summary = yield* TrainLoop.run({ task, config, format, train: data })
      const agent = yield* RolloutSetup.make({ task, config, format })
      const groups = yield* Rollouts.collectGroups(agent, data.rows.slice(0, 2), {
        firstSeq: 0,
        chains: 2,
        temperature: 1,
        seed: 4
      })
      return { summary, groups }
    })).pipe(Effect.provide(Layer.provideMerge(Rollouts.inProcess, LocalPolicy.layer(folder, config))))
    assert.strictEqual(summary.trained, 2, "both steps trained")
    const steps = readFileSync(join(config.output, "metrics.jsonl"), "utf8").trim().split("\n").map((l) =>
      JSON.parse(l) as { phase: string; figures: Record<string, number> }
    ).filter((r) => r.phase === "train")
    assert.strictEqual(steps.length, 2)
    for (const r of steps) {
      assert.strictEqual(r.figures["rollout/trajectories"], 4)
      assert.strictEqual(r.figures["rollout/failure_share"], 0, JSON.stringify(r.figures))
    }
    const trajectories = groups.flatMap((g) => g.trajectories)
    assert.strictEqual(trajectories.length, 4)
    for (const t of trajectories) {
      assert.isFalse(t.masked, t.error)
      assert.strictEqual(t.rewardStatus, "scored")
      assert.isDefined(t.metrics["reward/mathEqual/reward"], "the task's reward scored the final transcript")
      for (const segment of t.segments) {
        const sources = Trajectory.sources(segment)
        const mask = Trajectory.lossMask(segment)
        assert.strictEqual(sources[0], "prompt")
        sources.forEach((source, i) => assert.strictEqual(mask[i], source === "policy" ? 1 : 0))
        for (const span of segment.spans) {
          if (span.source === "policy") {
            assert.strictEqual(span.policyVersion, 2)
            assert.strictEqual(span.logprobs?.length, span.tokenIds.length)
          } else assert.isUndefined(span.logprobs)
        }
      }
      assert.isAbove(Trajectory.policyTokenCount(t), 0)
    }
  }).pipe(Effect.provide(NodeServices.layer))

describe("examples/sdk-agents train on the tiny policy", () => {
  it.live("the openai SDK agent", () => trains(OpenAi.task), 60_000)
  it.live("the Vercel AI SDK agent", () => trains(Vercel.task), 60_000)
  it.live("the OpenAI Agents SDK agent", () => trains(Agents.task), 60_000)
})
