/**
 * What the gateway trial found (issue 46, point 6), each fixed: `invalid_tool_call_rate` counts only the calls'
 * own errors (not a crashed agent, a hung tool or an unknown episode); a reward or `end` for a never-opened episode
 * is a 404 naming it; a `tool` message answering no call is refused as OpenAI refuses it; a request cut mid-way
 * says so in the trajectory's `error`; an episode closed with `/end` is `not_applicable`, not `pending`; a 400
 * refusal fails the episode as `SamplerRejected` (the failure table's reason), not `EnvFailed`.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, type Duration, Effect, Fiber, Stream } from "effect"
import OpenAI from "openai"
import * as AgentRollout from "../../../actors/gateway/AgentRollout.ts"
import * as Gateway from "../../../actors/Gateway.ts"
import * as Recorder from "../../../actors/gateway/Recorder.ts"
import * as AgentTask from "../../../src/AgentTask.ts"
import * as RolloutFigures from "../../../src/RolloutFigures.ts"
import * as Sampler from "../../../src/Sampler.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"
import { calculatorTool, format, scriptedSampler } from "./fixtures.ts"

const sampling = { temperature: 1, maxTokens: 128 }

const rollOut = (agent: AgentTask.AgentFunction<unknown>, timeout?: Duration.Input) =>
  Effect.gen(function*() {
    const task = AgentTask.make("trial", { agent, ...(timeout === undefined ? {} : { timeout }) })
    const rows = [{ question: "What is 2+3?" }]
    const groups = yield* AgentRollout.runTask({ task, rows, numChains: 1, sampling, format, runId: "t" })
      .pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, yield* scriptedSampler(1)))
    return groups
  })

type Msg = OpenAI.Chat.Completions.ChatCompletionMessageParam

const ask = (baseURL: string, messages: ReadonlyArray<unknown>) =>
  new OpenAI({ baseURL, apiKey: "k", maxRetries: 0 }).chat.completions.create({
    model: "m",
    messages: messages as Array<Msg>,
    tools: [calculatorTool]
  })

describe("the gateway trial's findings", () => {
  it.live("invalid_tool_call_rate is 0 for an agent that threw after a valid call, hung, or named no episode", () =>
    Effect.gen(function*() {
      const threw = yield* rollOut(async (input, client) => {
        const reply = await ask(client.baseURL, input.messages)
        assert.strictEqual(reply.choices[0]!.message.tool_calls?.length, 1, "a valid call")
        throw new Error("the harness broke after the call")
      })
      const hung = yield* rollOut(async (input, client) => {
        await ask(client.baseURL, input.messages)
        await new Promise((resolve) => setTimeout(resolve, 5_000)) // a tool that hangs
      }, "300 millis")
      const unknownEpisode = yield* rollOut(async (input, client) => {
        // A harness that names another episode: a 404, no request recorded.
        await ask(client.baseURL.replace(/episodes\/[^/]+/, "episodes/someone-else"), input.messages)
      })
      for (const groups of [threw, hung, unknownEpisode]) {
        const t = groups[0]!.trajectories[0]!
        assert.strictEqual(t.termination, "error")
        assert.strictEqual(t.errorReason, "EnvFailed")
        const figures = RolloutFigures.rolloutFigures(groups, { prefix: "rollout" })
        assert.strictEqual(figures["rollout/invalid_tool_call_rate"], 0)
        assert.strictEqual(figures["rollout/failures/EnvFailed"], 1)
      }
      // A call's own failure still counts.
      const parse = { ...threw[0]!.trajectories[0]!, errorReason: "ParseFailed" } as Trajectory.Trajectory
      const figures = RolloutFigures.rolloutFigures([{ groupId: "g", rowIndex: 0, trajectories: [parse] }], {
        prefix: "rollout"
      })
      assert.strictEqual(figures["rollout/invalid_tool_call_rate"], 1)
    }))

  it.live("a 400 refusal fails the episode as SamplerRejected, not EnvFailed", () =>
    Effect.gen(function*() {
      const groups = yield* rollOut(async (input, client) => {
        // A tool result answering no call: OpenAI refuses it, the SDK throws, the function gives up.
        await ask(client.baseURL, [
          ...input.messages,
          { role: "tool", tool_call_id: "call_7", content: "5" }
        ])
      })
      const t = groups[0]!.trajectories[0]!
      assert.strictEqual(t.errorReason, "SamplerRejected", t.error)
      assert.include(t.error!, "must be a response to a preceeding message with 'tool_calls'")
      assert.isTrue(t.masked)
    }))

  it.live("a tool message with no matching call is refused as OpenAI refuses it, naming the message", () =>
    Effect.gen(function*() {
      const gateway = yield* Gateway.make()
      const episode = yield* gateway.open({
        id: "orphans",
        groupId: "g",
        format,
        sampler: yield* scriptedSampler(1),
        sampling,
        requestSampling: "cap"
      })
      const refused = (messages: Array<Msg>) =>
        Effect.promise(() =>
          ask(episode.baseURL, messages).then(
            () => undefined,
            (e: InstanceType<typeof OpenAI.APIError>) => ({
              status: e.status,
              param: (e.error as { param?: string }).param,
              message: e.message
            })
          )
        )
      const noCall = yield* refused([
        { role: "user", content: "hi" },
        { role: "tool", tool_call_id: "call_0", content: "1" }
      ])
      assert.deepStrictEqual(noCall?.status, 400)
      assert.strictEqual(noCall?.param, "messages.[1].role")
      const wrongId = yield* refused([
        { role: "user", content: "hi" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "call_0", type: "function", function: { name: "calculator", arguments: "{}" } }]
        },
        { role: "tool", tool_call_id: "call_0", content: "1" },
        { role: "tool", tool_call_id: "call_9", content: "2" }
      ])
      assert.strictEqual(wrongId?.param, "messages.[3].tool_call_id")
      assert.include(wrongId!.message, "'tool_call_id' of 'call_9' not found in 'tool_calls' of previous message.")
      assert.strictEqual(episode.recorder.threads.length, 0, "nothing recorded")
    }))

  it.live("reward and end for a never-opened episode are 404s naming its id; /end leaves not_applicable", () =>
    Effect.gen(function*() {
      const ended: Array<Trajectory.Trajectory> = []
      const gateway = yield* Gateway.make({
        autoOpen: {
          episode: { format, sampler: yield* scriptedSampler(1), sampling, requestSampling: "honour" },
          onEnd: (finished) => Effect.sync(() => void ended.push(finished.trajectory))
        }
      })
      const post = (path: string, body: unknown = {}) =>
        Effect.promise(() =>
          fetch(`${gateway.url}${path}`, { method: "POST", body: JSON.stringify(body) }).then(async (r) => ({
            status: r.status,
            body: await r.json() as { error?: { message: string; code: string } }
          }))
        )
      const reward = yield* post("/episodes/typo-42/reward", { reward: 1 })
      assert.strictEqual(reward.status, 404)
      assert.include(reward.body.error!.message, "\"typo-42\"")
      const end = yield* post("/episodes/typo-43/end")
      assert.strictEqual(end.status, 404)
      assert.include(end.body.error!.message, "\"typo-43\"")
      yield* Effect.promise(() => ask(`${gateway.url}/episodes/real/v1`, [{ role: "user", content: "What is 1+1?" }]))
      assert.strictEqual((yield* post("/episodes/real/end")).status, 200)
      yield* Effect.sleep(50)
      assert.deepStrictEqual(ended.map((t) => [t.trajectoryId, t.rewardStatus, t.reward]), [[
        "real",
        "not_applicable",
        0
      ]])
      assert.strictEqual((yield* post("/episodes/real/reward", { reward: 1 })).status, 409, "ended: not reopened")
    }))

  it.live("a request cut mid-way (its episode closed while it sampled) sets the trajectory's error", () =>
    Effect.gen(function*() {
      const started = yield* Deferred.make<void>()
      const hanging = Sampler.Sampler.of({
        generate: () => Effect.andThen(Deferred.succeed(started, undefined), Effect.never),
        policyVersion: Effect.succeed(0)
      })
      const gateway = yield* Gateway.make()
      const episode = yield* gateway.open({
        id: "cut",
        groupId: "g",
        format,
        sampler: hanging,
        sampling,
        requestSampling: "cap"
      })
      const request = yield* Effect.forkChild(Effect.promise(() =>
        ask(episode.baseURL, [{ role: "user", content: "hi" }]).then(() => 200, (e: { status: number }) => e.status)
      ))
      yield* Deferred.await(started)
      yield* episode.close
      assert.strictEqual(yield* Fiber.join(request), 410)
      const t = yield* Recorder.trajectory(episode.recorder, { _tag: "Returned" })
      assert.include(t.error ?? "", "request 1 was cut mid-way")
      assert.strictEqual(t.metrics["gateway/cut_requests"], 1)
    }))
})


