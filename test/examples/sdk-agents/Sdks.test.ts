/**
 * The calculator agent of `examples/sdk-agents/`, written with each real SDK (`openai`, the Vercel AI SDK,
 * `@openai/agents`; and in the two wire formats beside chat completions: the `openai` SDK's Responses API, whole
 * history and chained by `previous_response_id`, and `@anthropic-ai/sdk`'s Messages API), plain and streamed, rolled out through the gateway against a scripted token policy that calls
 * the calculator (twice in parallel for "both" questions) and then answers: every episode is scored by `mathEqual`
 * on its final transcript, the SDK ran the tool calls (their results are `tool` spans), and the loss mask is exactly
 * the policy's sampled tokens (prompt, tool results and template text are never trained on).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Stream } from "effect"
import * as AgentRollout from "../../../actors/gateway/AgentRollout.ts"
import * as Agents from "../../../examples/sdk-agents/agents.ts"
import * as Anthropic from "../../../examples/sdk-agents/anthropic.ts"
import * as Calculator from "../../../examples/sdk-agents/calculator.ts"
import * as OpenAi from "../../../examples/sdk-agents/openai.ts"
import * as Responses from "../../../examples/sdk-agents/responses.ts"
import * as Vercel from "../../../examples/sdk-agents/vercel.ts"
import * as Sampler from "../../../src/Sampler.ts"
import * as Trajectory from "../../../src/Trajectory.ts"
import { format, scriptedSampler, tokenizer } from "../../actors/gateway/fixtures.ts"

const rows = [
  { question: "What is 17*23?", answer: "391" },
  { question: "Compute both 2+3 and 4*5.", answer: "20" }
]

const sdks = [
  ["openai", OpenAi.agent],
  ["vercel", Vercel.agent],
  ["agents", Agents.agent],
  ["responses", (o: { readonly stream: boolean }) => Responses.agent(o)],
  ["responses-chained", (o: { readonly stream: boolean }) => Responses.agent({ ...o, chain: true })],
  ["anthropic", (o: { readonly stream: boolean }) => Anthropic.agent(o)]
] as const

const rollout = (name: string, agent: Parameters<typeof Calculator.task>[1]) =>
  Effect.gen(function*() {
    const sampler = yield* scriptedSampler(7)
    const groups = yield* AgentRollout.runTask({
      task: Calculator.task(name, agent),
      rows,
      numChains: 2,
      sampling: { temperature: 1, maxTokens: 256, seed: 3 },
      format,
      systemPrompt: Calculator.systemPrompt,
      runId: name
    }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, sampler))
    return groups.flatMap((g) => g.trajectories)
  })

describe("examples/sdk-agents", () => {
  for (const [sdk, agent] of sdks) {
    for (const stream of [false, true]) {
      it.live(`${sdk} SDK${stream ? ", streamed" : ""}: tool calls and parallel tool calls, scored, masks`, () =>
        Effect.gen(function*() {
          const trajectories = yield* rollout(`${sdk}${stream ? "-s" : ""}`, agent({ stream }))
          assert.strictEqual(trajectories.length, 4)
          for (const t of trajectories) {
            assert.isFalse(t.masked, `${t.chainId}: ${t.error}`)
            assert.strictEqual(t.reward, 1, `${t.chainId}: ${Trajectory.lastAssistantText(t)}`)
            assert.strictEqual(t.segments.length, 1, `${t.chainId}: the SDK sent its history back unchanged`)
            const spans = t.segments[0]!.spans
            const tools = spans.filter((s) => s.source === "tool").map((s) => tokenizer.decode(s.tokenIds).trim())
            const policy = spans.filter((s) => s.source === "policy")
            if (t.groupId.endsWith("g0")) {
              assert.deepStrictEqual(tools, ["391"])
              assert.strictEqual(t.metrics["tool_calls"], 1)
            } else {
              assert.deepStrictEqual(tools, ["5", "20"], "both parallel calls ran and were sent back")
              assert.strictEqual(t.metrics["tool_calls"], 2)
            }
            assert.strictEqual(policy.length, 2)
            assert.isTrue(policy.every((s) => s.policyVersion === 7 && s.logprobs?.length === s.tokenIds.length))
            const mask = Trajectory.lossMask(t.segments[0]!)
            Trajectory.sources(t.segments[0]!).forEach((source, i) =>
              assert.strictEqual(mask[i], source === "policy" ? 1 : 0)
            )
          }
        }))
    }
  }
})
