/**
 * GRPO-style rollouts from a local model: 2 calculator questions × 4 chains, with tools and a reward.
 * Run: npx tsx examples/02_rollout_local_model.ts
 *
 * The weights are random, so the replies are gibberish and the reward is 0: what this shows is the machinery
 * (token-level loss masks, groups of chains per question, why each chain ended).
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Effect, FileSystem, Layer, Stream } from "effect"
import * as ChainFormat from "../actors/ChainFormat.ts"
import * as PolicyEngine from "../actors/PolicyEngine.ts"
import * as Rollout from "../actors/Rollout.ts"
import * as RewardActor from "../actors/RewardActor.ts"
import * as ToolActor from "../actors/ToolActor.ts"
import * as Answer from "../environments/answer/Answer.ts"
import * as Calculator from "../environments/calculator/Calculator.ts"
import * as MathEqual from "../environments/math/MathEqual.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Trajectory from "../src/Trajectory.ts"

const config = {
  preset: "tiny" as const, // 2 layers, width 128, random weights
  seed: 1,
  questions: [["What is 17 * 23?", "391"], ["What is 2^10 - 24?", "1000"]],
  rollout: { numChains: 4, maxTurns: 2, sampling: { temperature: 1, maxTokens: 24, seed: 7 } } // 4 chains a group
}

const program = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-example-" })}/tiny`
  yield* ModelFolder.init(dir, { preset: config.preset, seed: config.seed })
  const folder = yield* ModelFolder.load(dir)
  const tools = ToolActor.toPort(yield* ToolActor.make([Calculator.calculator, Answer.answer]))
  const reward = RewardActor.toPort(yield* RewardActor.make(MathEqual.mathEqual, { onError: "zero" }))
  const engine = PolicyEngine.PolicyEngine.layer({ config: folder.config, weights: folder.weights })
  const events = yield* Rollout.run({
    ...config.rollout,
    rows: config.questions.map(([question, answer]) => ({
      messages: [{ role: "system", content: "Use the calculator tool." }, { role: "user", content: question! }],
      answer
    })),
    format: ChainFormat.fromTemplate({ tokenizer: folder.tokenizer, template: folder.template }),
    maxContextTokens: folder.config.maxPositionEmbeddings,
    tools: { ...tools, schemas: [] }, // tool specs take ~1,200 byte tokens > 512 positions (`renderTools: false`)
    reward
  }).pipe(Stream.runCollect, Effect.provide(PolicyEngine.layerSampler.pipe(Layer.provide(engine))))
  for (const event of events) {
    if (event._tag === "Trajectory") {
      const t = event.trajectory
      // The loss mask is 1 on tokens the policy sampled (incl. its end-of-turn token), 0 on prompt and tool output.
      const policy = t.segments.reduce((n, s) => n + Trajectory.lossMask(s).reduce((a, b) => a + b, 0), 0)
      const total = t.segments.reduce((n, s) => n + Trajectory.tokenIds(s).length, 0)
      console.log(`trajectory ${t.chainId} row=${event.rowIndex} termination=${t.termination} reward=${t.reward}` +
        ` policyTokens=${policy} totalTokens=${total} segments=${t.segments.length}`)
    } else if (event._tag === "Group") {
      const rewards = event.group.trajectories.map((t) => t.reward)
      console.log(`group ${event.group.groupId} row=${event.group.rowIndex} rewards=${JSON.stringify(rewards)}`)
    } else {
      console.log(`group ${event.groupId} dropped: ${event.reasons.join("; ")}`)
    }
  }
})

Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
