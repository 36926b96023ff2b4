/**
 * The LLM-as-judge rewards (`environments/rewards/Judge.ts`) against a judge server started by the test (an
 * OpenAI-compatible `/chat/completions` that grades what it is sent): the rubric and the transcript reach the judge;
 * a verdict wrapped in prose is read; an unreadable or failed judge is a typed `ScoreFailed`; the group-relative
 * judge scores a group's attempts in one call, as the group reward of an agent task rolled out through the gateway.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Stream } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as AgentRollout from "../../../actors/gateway/AgentRollout.ts"
import * as Judge from "../../../environments/rewards/Judge.ts"
import * as Sampler from "../../../src/Sampler.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"
import * as Calculator from "../../../examples/sdk-agents/calculator.ts"
import * as OpenAi from "../../../examples/sdk-agents/openai.ts"
import { format, scriptedSampler } from "./fixtures.ts"

interface Seen {
  readonly system: string
  readonly user: string
}

/** A judge server: `grade(system, user)` writes the answer; 500 when it throws. */
const judgeServer = (grade: (system: string, user: string) => string) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly url: string; readonly seen: Array<Seen>; readonly server: Http.Server }>((resume) => {
      const seen: Array<Seen> = []
      const server = Http.createServer((req, res) => {
        let body = ""
        req.on("data", (c) => (body += c))
        req.on("end", () => {
          const messages = (JSON.parse(body) as { messages: Array<{ role: string; content: string }> }).messages
          const system = messages.find((m) => m.role === "system")?.content ?? ""
          const user = messages.find((m) => m.role === "user")?.content ?? ""
          seen.push({ system, user })
          try {
            const content = grade(system, user)
            res.writeHead(200, { "content-type": "application/json" })
            res.end(JSON.stringify({ choices: [{ message: { role: "assistant", content }, finish_reason: "stop" }] }))
          } catch (e) {
            res.writeHead(500, { "content-type": "application/json" })
            res.end(JSON.stringify({ error: { message: String(e) } }))
          }
        })
      })
      server.listen(0, "127.0.0.1", () => {
        resume(Effect.succeed({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, seen, server }))
      })
    }),
    ({ server }) =>
      Effect.callback<void>((resume) => {
        server.close(() => resume(Effect.void))
      })
  )

const trajectory = (answer: string): Trajectory.Trajectory => ({
  trajectoryId: "t",
  groupId: "g",
  chainId: "c",
  messages: [
    { role: "user", content: "What is 17*23?" },
    {
      role: "assistant",
      content: "",
      tool_calls: [{ id: "1", type: "function", function: { name: "calculator", arguments: { expression: "17*23" } } }]
    },
    { role: "tool", content: "391", tool_call_id: "1" },
    { role: "assistant", content: answer }
  ],
  segments: [],
  termination: "no_tool_call",
  reward: 0,
  rewardStatus: "pending",
  metrics: {},
  trainable: true,
  masked: false
})

const rubric = "1 if the final answer matches the calculator's result, else 0."

describe("Judge", () => {
  it.live("a judge reads the rubric and the transcript (tool calls written out) and its score in prose is read", () =>
    Effect.gen(function*() {
      const { url, seen } = yield* judgeServer((_system, user) =>
        user.includes("ASSISTANT: The answer is 391.")
          ? "Looks right.\n```json\n{\"explanation\": \"matches\", \"score\": 1}\n```"
          : "The score: 0.25"
      )
      const judge = Judge.make({ baseUrl: url, model: "judge", rubric })
      const good = yield* judge.evaluate({ trajectory: trajectory("The answer is 391.") })
      const bad = yield* judge.evaluate({ trajectory: trajectory("The answer is 400.") })
      assert.deepStrictEqual([good._tag, good._tag === "Scored" ? good.reward : NaN], ["Scored", 1])
      assert.deepStrictEqual([bad._tag, bad._tag === "Scored" ? bad.reward : NaN], ["Scored", 0.25])
      assert.strictEqual(good.metrics["reward/judge/reward"], 1)
      assert.include(seen[0]!.system, rubric)
      assert.include(seen[0]!.user, `ASSISTANT: \n[tool calls: calculator({"expression":"17*23"})]`)
      assert.include(seen[0]!.user, "TOOL: 391")
    }))

  it.live("an unreadable verdict and a failing judge are ScoreFailed errors; scores are clamped to [0, 1]", () =>
    Effect.gen(function*() {
      let answer = "I cannot decide."
      const { url } = yield* judgeServer(() => {
        if (answer === "fail") throw new Error("overloaded")
        return answer
      })
      const judge = Judge.make({ baseUrl: url, model: "judge", rubric, name: "strict", retries: 0 })
      const unreadable = yield* Effect.exit(judge.evaluate({ trajectory: trajectory("x") }))
      assert.isTrue(Exit.isFailure(unreadable))
      assert.include(JSON.stringify(unreadable), "ScoreFailed")
      answer = "fail"
      const failed = yield* Effect.flip(judge.evaluate({ trajectory: trajectory("x") }))
      assert.strictEqual(failed.reason._tag, "ScoreFailed")
      assert.strictEqual(failed.reward, "strict")
      answer = `{"score": 7}`
      const clamped = yield* judge.evaluate({ trajectory: trajectory("x") })
      assert.strictEqual(clamped._tag === "Scored" ? clamped.reward : NaN, 1)
    }))

  it("group verdicts are read by trajectory id, and only when every attempt got a score", () => {
    assert.deepStrictEqual(
      Judge.parseScores(`{"scores": [{"trajectory_id": "2", "score": 0.1}, {"trajectory_id": "1", "score": 0.9}]}`, 2),
      [0.9, 0.1]
    )
    assert.isUndefined(Judge.parseScores(`{"scores": [{"trajectory_id": "1", "score": 0.9}]}`, 2))
    assert.isUndefined(Judge.parseScores(`no json here`, 1))
    assert.strictEqual(Judge.parseScore(`{"explanation": "a {nested} brace", "score": "0.5"}`), 0.5)
  })

  it.live(
    "RULER: one judge call per group scores its attempts relative to each other (an agent task's group reward)",
    () =>
      Effect.gen(function*() {
        // The judge ranks attempts by whether their final answer is the tool's result.
        const { url, seen } = yield* judgeServer((_system, user) => {
          const attempts = [...user.matchAll(/<trajectory id="(\d+)">([\s\S]*?)<\/trajectory>/g)]
          return JSON.stringify({
            scores: attempts.map(([, id, body]) => ({
              trajectory_id: id,
              explanation: "-",
              score: /ASSISTANT: The answer is (\d+)\./.exec(body!)?.[1] === /TOOL: (\d+)/.exec(body!)?.[1] ? 0.9 : 0.1
            }))
          })
        })
        const task = {
          ...Calculator.task("judged", OpenAi.agent()),
          groupReward: Judge.ruler({ baseUrl: url, model: "judge", rubric })
        }
        const groups = yield* AgentRollout.runTask({
          task,
          rows: [{ question: "What is 17*23?", answer: "391" }, { question: "What is 2+2?", answer: "4" }],
          numChains: 3,
          sampling: { temperature: 1, maxTokens: 256, seed: 1 },
          format,
          systemPrompt: Calculator.systemPrompt,
          runId: "j"
        }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, yield* scriptedSampler()))
        assert.strictEqual(seen.length, 2, "one call per group")
        assert.strictEqual([...seen[0]!.user.matchAll(/<trajectory id=/g)].length, 3)
        for (const t of groups.flatMap((g) => g.trajectories)) {
          assert.strictEqual(t.reward, 0.9)
          assert.strictEqual(t.metrics["reward/ruler/reward"], 0.9)
          assert.strictEqual(t.metrics["reward/mathEqual/reward"], 1, "the task's own reward scored it first")
        }
      })
  )
})
