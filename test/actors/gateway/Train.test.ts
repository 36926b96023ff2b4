/**
 * An agent function written with the `openai` SDK, trained by `TrainLoop.run` on the real parts (the tiny Qwen2 policy
 * on onnxruntime, its byte tokenizer and template): every step's groups come from the gateway, the learner trains on
 * them, the new weights serve the next step's requests (their policy version is in every policy span), and what the
 * SDK was answered is exactly what the trajectories hold as the policy's tokens.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import OpenAI from "openai"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as Journal from "../../../actors/Journal.ts"
import * as LocalPolicy from "../../../actors/LocalPolicy.ts"
import * as AgentTask from "../../../src/AgentTask.ts"
import * as Dataset from "../../../src/Dataset.ts"
import * as ModelFolder from "../../../src/ModelFolder.ts"
import * as TrainConfig from "../../../src/TrainConfig.ts"
import * as Trajectory from "../../../src/Trajectory.ts"
import * as TrainLoop from "../../../actors/TrainLoop.ts"
import * as Rollouts from "../../../actors/Rollouts.ts"
import * as RolloutSetup from "../../../actors/RolloutSetup.ts"

/** What each episode's SDK saw: the sampled ids of every answer, by episode. */
const answered = new Map<string, Array<ReadonlyArray<number>>>()

const task = AgentTask.make("digits", {
  description: "Answer with digits (a signal a random policy sometimes hits)",
  agent: async (input, client) => {
    const openai = new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey, maxRetries: 0 })
    const messages: Array<OpenAI.Chat.Completions.ChatCompletionMessageParam> = input.messages.map((m) =>
      ({ role: m.role, content: m.content }) as OpenAI.Chat.Completions.ChatCompletionMessageParam
    )
    let text = ""
    for (let turn = 0; turn < 2; turn++) {
      const reply = await openai.chat.completions.create({ model: client.model, messages }, { signal: client.signal })
      const choice = reply.choices[0]! as OpenAI.Chat.Completions.ChatCompletion.Choice & { token_ids: Array<number> }
      answered.set(client.episodeId, [...(answered.get(client.episodeId) ?? []), choice.token_ids])
      text = choice.message.content ?? ""
      messages.push(choice.message, { role: "user", content: "Again, in digits." })
    }
    return /\d/.test(text) ? 1 : 0
  },
  defaults: { systemPrompt: "Answer in digits." }
})

const rows = (n: number) =>
  Dataset.parse(
    "train",
    Array.from({ length: n }, (_, i) => JSON.stringify({ question: `What is ${i} + ${i}?` })).join("\n")
  )

describe("training an agent function", () => {
  it.live(
    "TrainLoop.run trains the tiny policy on the gateway's episodes; the policy spans are what the SDK was sent",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "agent-train-"))
        yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
        const folder = yield* ModelFolder.load(join(dir, "model"))
        const config = TrainConfig.onModel(
          yield* TrainConfig.decode({
            output: join(dir, "run"),
            seed: 5,
            model: { path: join(dir, "model") },
            data: { train: "unused" },
            agent: { numChains: 4, maxNewTokens: 24, maxContextTokens: 256, systemPrompt: "Answer in digits." },
            algorithm: {
              steps: 3,
              groupsPerStep: 2,
              microBatchSize: 8,
              lr: 0.002,
              advantage: "reinforce++",
              entropyCoef: 0.01
            },
            eval: { every: 100, size: 2 },
            checkpoint: { every: 100 }
          }),
          folder.config
        )
        const format = ChainFormat.fromTemplate({ tokenizer: folder.tokenizer, template: folder.template })
        const train = yield* rows(6)
        const { summary, groups } = yield* Effect.scoped(Effect.gen(function*() {
          const summary = yield* TrainLoop.run({ task, config, format, train, eval: yield* rows(2) })
          const agent = yield* RolloutSetup.make({ task, config, format })
          answered.clear()
          const groups = yield* Rollouts.collectGroups(agent, train.rows.slice(0, 2), {
            firstSeq: 0,
            chains: 4,
            temperature: 1,
            seed: 9
          })
          return { summary, groups }
        })).pipe(Effect.provide(Layer.provideMerge(Rollouts.inProcess, LocalPolicy.layer(folder, config))))

      assert.strictEqual(summary.steps, 3)
      assert.strictEqual(summary.trained, 3)
      const journal = yield* Journal.read(join(config.output, "journal.jsonl"))
      const hashes = journal.entries.flatMap((e) => (e.entry.kind === "step" ? [e.entry.weightsHash] : []))
      assert.strictEqual(new Set(hashes).size, 3, "every step changed the weights")
      const records = readFileSync(join(config.output, "metrics.jsonl"), "utf8").trim().split("\n").map((l) =>
        JSON.parse(l) as { phase: string; figures: Record<string, number> }
      )
      const steps = records.filter((r) => r.phase === "train")
      assert.strictEqual(steps.length, 3)
      for (const r of steps) {
        assert.strictEqual(r.figures["rollout/trajectories"], 8)
        assert.strictEqual(r.figures["rollout/failure_share"], 0)
        assert.isAbove(r.figures["rollout/policy_tokens"]!, 0)
      }

      // A batch after training: sampled by policy version 3, each trajectory's policy spans the ids the SDK got.
      const trajectories = groups.flatMap((g) => g.trajectories)
      assert.strictEqual(trajectories.length, 8)
      for (const t of trajectories) {
        assert.isFalse(t.masked, t.error)
        assert.strictEqual(t.rewardStatus, "scored")
        assert.strictEqual(t.metrics["reward/agent/returned"], 1)
        const policy = t.segments.flatMap((s) => s.spans).filter((s) => s.source === "policy")
        assert.deepStrictEqual(policy.map((s) => s.tokenIds), answered.get(t.chainId), t.chainId)
        assert.isTrue(policy.every((s) => s.policyVersion === 3 && s.logprobs!.length === s.tokenIds.length))
        for (const segment of t.segments) {
          const mask = Trajectory.lossMask(segment)
          const sources = Trajectory.sources(segment)
          sources.forEach((source, i) => assert.strictEqual(mask[i], source === "policy" ? 1 : 0))
          assert.strictEqual(sources[0], "prompt")
          // The user's follow-up is the environment's, never trained on.
          assert.isTrue(sources.includes("env") || t.segments.length > 1 || policy.length < 2)
        }
      }
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})
