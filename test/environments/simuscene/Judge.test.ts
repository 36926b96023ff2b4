/**
 * SimuScene's `judge` option against a scripted judge on loopback that speaks OpenAI's chat-completions wire (its
 * request and answer typed with the `openai` SDK's own types): the request carries the agent's and the reference's
 * frames as `image_url` parts with `data:` URLs, beside the transcript and the rubric; the judge's score is mixed
 * into the reward by its weight; a malformed answer or a failing judge scores 0 (`judge_failed`) while the
 * simulation's own terms still count, and `Judge.grade` says why with a typed `ScoreFailed`. The same option through
 * the task's config and the rollout runtime (bubblewrap sandboxes). `JudgeServe.test.ts` asks a real server.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import type {
  ChatCompletion,
  ChatCompletionContentPart,
  ChatCompletionCreateParamsNonStreaming
} from "openai/resources/chat/completions"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Judge from "../../../environments/rewards/Judge.ts"
import * as Frames from "../../../environments/simuscene/Frames.ts"
import * as Scene from "../../../environments/simuscene/Scene.ts"
import * as SimuSceneOracle from "../../../environments/simuscene/SimuSceneOracle.ts"
import * as SimuSceneTask from "../../../environments/simuscene/SimuSceneTask.ts"
import * as Image from "../../../src/Image.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"

/** A judge on loopback: each request is kept; `answer` writes the reply's content (a 500 when it throws). */
const judgeServer = (answer: (request: ChatCompletionCreateParamsNonStreaming) => string) =>
  Effect.acquireRelease(
    Effect.callback<{
      readonly url: string
      readonly seen: Array<ChatCompletionCreateParamsNonStreaming>
      readonly server: Http.Server
    }>(
      (resume) => {
        const seen: Array<ChatCompletionCreateParamsNonStreaming> = []
        const server = Http.createServer((req, res) => {
          let body = ""
          req.on("data", (c) => (body += c))
          req.on("end", () => {
            const request = JSON.parse(body) as ChatCompletionCreateParamsNonStreaming
            seen.push(request)
            try {
              const reply: ChatCompletion = {
                id: `judge-${seen.length}`,
                object: "chat.completion",
                created: 0,
                model: request.model,
                choices: [{
                  index: 0,
                  message: { role: "assistant", content: answer(request), refusal: null },
                  finish_reason: "stop",
                  logprobs: null
                }]
              }
              res.writeHead(200, { "content-type": "application/json" })
              res.end(JSON.stringify(reply))
            } catch (e) {
              res.writeHead(500, { "content-type": "application/json" })
              res.end(JSON.stringify({ error: { message: String(e) } }))
            }
          })
        })
        server.listen(0, "127.0.0.1", () => {
          const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`
          resume(Effect.succeed({ url, seen, server }))
        })
      }
    ),
    ({ server }) =>
      Effect.callback<void>((resume) => {
        server.close(() => resume(Effect.void))
      })
  )

const scene = Scene.generate(21, 40).find((s) => s.balls.length === 2)!
const reference = Scene.simulate(scene)
/** The reference with the first ball's second half of the run shifted right by a fifth of the box. */
const offBy = (() => {
  const first = scene.balls[0]!.name
  const path = reference[first]!
  const shifted = path.map(([x, y], i): [number, number] => i < path.length / 2 ? [x, y] : [x + scene.width / 5, y])
  return { ...reference, [first]: shifted }
})()
/** The reward without a judge (frame weight 0.25), the term a judge's score is mixed with. */
const own = 0.75 * Scene.trajectoryScore(scene, offBy, reference) + 0.25 * Frames.overlap(scene, offBy, reference)

const trajectory: Trajectory.Trajectory = {
  trajectoryId: "t",
  groupId: "g",
  chainId: "c",
  messages: [
    { role: "user", content: Scene.describe(scene) },
    {
      role: "assistant",
      content: "",
      tool_calls: [{ id: "1", type: "function", function: { name: "simulate", arguments: { code: "print(1)" } } }]
    },
    { role: "tool", content: "Simulated 2 ball(s).", tool_call_id: "1" }
  ],
  segments: [],
  termination: "episode_end",
  reward: 0,
  rewardStatus: "pending",
  metrics: {},
  trainable: true,
  masked: false
}

/** The reward of `submitted` (none: nothing was simulated) with the chain's episode state. */
const scored = (judge: SimuSceneTask.JudgeOptions, submitted: Scene.Trajectories | undefined) =>
  Effect.gen(function*() {
    const sim = yield* SimuSceneTask.Simulation
    yield* sim.reset(scene)
    if (submitted !== undefined) yield* sim.submit(submitted)
    const outcome = yield* SimuSceneTask.reward(0.25, judge).evaluate({ trajectory })
    assert.strictEqual(outcome._tag, "Scored")
    return outcome as Extract<typeof outcome, { _tag: "Scored" }>
  }).pipe(Effect.provide(SimuSceneTask.simulationLayer))

const imageUrls = (request: ChatCompletionCreateParamsNonStreaming): Array<string> => {
  const content = request.messages.find((m) => m.role === "user")!.content as Array<ChatCompletionContentPart>
  return content.flatMap((part) => (part.type === "image_url" ? [part.image_url.url] : []))
}

describe("SimuScene's vision judge", () => {
  it.live("the judge sees both strips as image_url data: URLs beside the transcript; its score is mixed in", () =>
    Effect.gen(function*() {
      const { url, seen } = yield* judgeServer(() => `The balls fall as described. {"explanation": "ok", "score": 0.8}`)
      const outcome = yield* scored({ baseUrl: url, model: "vision-judge", weight: 0.4 }, offBy)
      assert.isBelow(own, 0.99)
      assert.approximately(outcome.reward, 0.6 * own + 0.4 * 0.8, 1e-9)
      assert.strictEqual(outcome.metrics["reward/simuscene/judge"], 0.8)
      assert.strictEqual(outcome.metrics["reward/simuscene/judge_failed"], 0)
      assert.strictEqual(seen.length, 1)
      const request = seen[0]!
      assert.strictEqual(request.model, "vision-judge")
      assert.include(request.messages[0]!.content as string, SimuSceneTask.judgeRubric)
      const urls = imageUrls(request)
      assert.deepStrictEqual(urls, [Frames.dataUrl(scene, offBy), Frames.dataUrl(scene, reference)])
      for (const u of urls) {
        assert.match(u, /^data:image\/png;base64,/)
        const image = yield* Image.fromUrl(u)
        assert.deepStrictEqual([image.ref.width, image.ref.height], [Frames.side * 4, Frames.side])
      }
      const texts = (request.messages[1]!.content as Array<ChatCompletionContentPart>).flatMap((p) =>
        p.type === "text" ? [p.text] : []
      )
      assert.include(texts[0]!, Scene.describe(scene))
      assert.include(texts[0]!, "simulate(")
      assert.deepStrictEqual(texts.slice(1), ["The agent's simulation:", "The reference simulation:"])
    }).pipe(Effect.scoped))

  it.live("a malformed answer or a failing judge scores 0 with judge_failed; the simulation's terms still count", () =>
    Effect.gen(function*() {
      let reply = "Looks lovely."
      const { url, seen } = yield* judgeServer(() => {
        if (reply === "fail") throw new Error("the judge is down")
        return reply
      })
      const judge = { baseUrl: url, model: "vision-judge", weight: 0.4, retries: 0 }
      const malformed = yield* scored(judge, offBy)
      assert.approximately(malformed.reward, 0.6 * own, 1e-9)
      assert.strictEqual(malformed.metrics["reward/simuscene/judge"], 0)
      assert.strictEqual(malformed.metrics["reward/simuscene/judge_failed"], 1)
      reply = "fail"
      const failed = yield* scored(judge, offBy)
      assert.approximately(failed.reward, 0.6 * own, 1e-9)
      assert.strictEqual(failed.metrics["reward/simuscene/judge_failed"], 1)
      assert.strictEqual(seen.length, 2)
      // The judge's own error says why, typed, as the text judge's does.
      const figures = SimuSceneTask.judgeFigures(scene, offBy, reference)
      const down = yield* Effect.flip(Judge.grade({ ...judge, rubric: "r" }, trajectory, figures))
      assert.strictEqual(down.reason._tag, "ScoreFailed")
      assert.match(down.message, /the judge failed/)
      reply = "Looks lovely."
      const unreadable = yield* Effect.flip(Judge.grade({ ...judge, rubric: "r" }, trajectory, figures))
      assert.strictEqual(unreadable.reason._tag, "ScoreFailed")
      assert.match(unreadable.message, /no readable score: "Looks lovely\."/)
    }).pipe(Effect.scoped))

  it.live("nothing simulated, no judge call; a text judge without figures sends plain text as before", () =>
    Effect.gen(function*() {
      const { url, seen } = yield* judgeServer(() => `{"score": 1}`)
      const none = yield* scored({ baseUrl: url, model: "vision-judge", weight: 0.5 }, undefined)
      assert.strictEqual(none.reward, 0)
      assert.strictEqual(none.metrics["reward/simuscene/judge_failed"], 0)
      assert.strictEqual(seen.length, 0)
      const score = yield* Judge.grade({ baseUrl: url, model: "text-judge", rubric: "r" }, trajectory)
      assert.strictEqual(score, 1)
      assert.isString(seen[0]!.messages[1]!.content)
    }).pipe(Effect.scoped))

  it.live("Judge.make with figures: a text task's judge sees the transcript's own images", () =>
    Effect.gen(function*() {
      const { url, seen } = yield* judgeServer(() => `{"score": 0.25}`)
      const strip = Frames.dataUrl(scene, reference)
      const shown: Trajectory.Trajectory = {
        ...trajectory,
        messages: [
          ...trajectory.messages,
          { role: "user", content: [{ type: "image_url", image_url: { url: strip } }] }
        ]
      }
      const judge = Judge.make({ baseUrl: url, model: "j", rubric: "r", figures: Judge.transcriptImages })
      const outcome = yield* judge.evaluate({ trajectory: shown })
      assert.strictEqual(outcome._tag === "Scored" ? outcome.reward : -1, 0.25)
      assert.deepStrictEqual(imageUrls(seen[0]!), [strip])
      assert.deepStrictEqual(Judge.transcriptImages(shown), [{ caption: "An image of message 4 (user):", url: strip }])
    }).pipe(Effect.scoped))

  it.effect("the option is checked where the config names it: a weight beyond 1 or an unknown key is refused", () =>
    Effect.gen(function*() {
      const judge = { baseUrl: "http://127.0.0.1:1/v1", model: "j", weight: 1.5 }
      const heavy = yield* Effect.flip(SimuSceneTask.task({ sandbox: "bubblewrap", judge }))
      assert.match(heavy.message, /judge.*weight/s)
      const typo = yield* Effect.flip(
        SimuSceneTask.task({ sandbox: "bubblewrap", judge: { ...judge, weight: 1, wieght: 1 } })
      )
      assert.match(typo.message, /wieght/)
      const fine = yield* Effect.exit(SimuSceneTask.task({ sandbox: "bubblewrap", judge: { ...judge, weight: 0.3 } }))
      assert.isTrue(Exit.isSuccess(fine))
    }))

  it.live("through the task's config and the rollout runtime, every submitted episode is judged on its frames", () =>
    Effect.gen(function*() {
      const { url, seen } = yield* judgeServer(() => `{"score": 0.5}`)
      const task = yield* SimuSceneTask.task({
        sandbox: "bubblewrap",
        pool: 2,
        judge: { baseUrl: url, model: "vision-judge", weight: 0.2 }
      })
      const rows = Scene.generate(22, 2).map((s) => ({ question: Scene.describe(s), scene: s }))
      const played = yield* Oracle.rollout({ task, rows, policy: SimuSceneOracle.oracle, concurrency: 2 })
      // The oracle's simulation is the reference: 0.8 · 1 + 0.2 · 0.5.
      assert.deepStrictEqual(played.map((t) => t.reward), [0.9, 0.9])
      assert.isTrue(played.every((t) => t.metrics["reward/simuscene/judge"] === 0.5))
      assert.strictEqual(seen.length, 2)
      assert.isTrue(seen.every((request) => imageUrls(request).length === 2))
    }).pipe(Effect.scoped), { timeout: 300_000 })
})
