/**
 * SimuScene's vision judge against a real server: `agentfly serve` on a fresh `tiny-vl` folder (its tower runs the
 * frames). The server takes the judge's request with both strips and turns each into image tokens (the prompt is
 * longer than the text alone by the strips' tokens). A prompt beyond the tiny model's context is the server's 400,
 * and the untrained model's answer holds no score: the judge reports each as a typed `ScoreFailed` saying which, and
 * the reward scores the judge 0 (`judge_failed`), without a crash.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import OpenAI from "openai"
import * as Judge from "../../../environments/rewards/Judge.ts"
import * as Scene from "../../../environments/simuscene/Scene.ts"
import * as SimuSceneTask from "../../../environments/simuscene/SimuSceneTask.ts"
import * as Image from "../../../src/Image.ts"
import * as VisionTower from "../../../src/model/VisionTower.ts"
import * as ModelFolder from "../../../src/ModelFolder.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"
import { cli } from "../../utils/agentfly.ts"

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../../..")

/** Starts `agentfly serve ARGS…`, runs `use` with its API root, then stops it. */
const serving = <A>(args: ReadonlyArray<string>, use: (baseUrl: string) => Effect.Effect<A, unknown>) =>
  Effect.acquireUseRelease(
    Effect.sync(() => spawn(process.execPath, [cli, "serve", ...args], { cwd: repoRoot })),
    (child) =>
      Effect.flatMap(
        Effect.callback<string, Error>((resume) => {
          let text = ""
          const onData = (chunk: Buffer) => {
            text += chunk.toString()
            const url = /at (http:\/\/\S+\/v1)/.exec(text)?.[1]
            if (url !== undefined) {
              child.stdout.off("data", onData)
              resume(Effect.succeed(url))
            }
          }
          child.stdout.on("data", onData)
          child.stderr.on("data", (chunk: Buffer) => (text += chunk.toString()))
          child.on("exit", (code) => resume(Effect.fail(new Error(`serve exited with ${code}: ${text}`))))
        }),
        use
      ),
    (child) => Effect.sync(() => child.kill("SIGTERM"))
  )

const scene = Scene.generate(21, 1)[0]!
const reference = Scene.simulate(scene)
const figures = SimuSceneTask.judgeFigures(scene, reference, reference)

const trajectory: Trajectory.Trajectory = {
  trajectoryId: "t",
  groupId: "g",
  chainId: "c",
  messages: [{ role: "user", content: "Two balls fall." }, { role: "assistant", content: "done" }],
  segments: [],
  termination: "episode_end",
  reward: 0,
  rewardStatus: "pending",
  metrics: {},
  trainable: true,
  masked: false
}

const described: Trajectory.Trajectory = {
  ...trajectory,
  messages: [{ role: "user", content: Scene.describe(scene) }, { role: "assistant", content: "done" }]
}
const judgeRubric = SimuSceneTask.judgeRubric

describe("SimuScene's vision judge on agentfly serve (tiny-vl)", () => {
  it.live("the server reads both strips as image tokens; an answer without a score is a typed ScoreFailed", () => {
    const root = mkdtempSync(join(tmpdir(), "agentfly-judge-serve-"))
    const dir = join(root, "tiny-vl")
    return Effect.gen(function*() {
      yield* ModelFolder.init(dir, { preset: "tiny-vl", seed: 4 }).pipe(Effect.provide(NodeServices.layer))
      yield* serving(["--model-dir", dir, "--port", "0"], (baseUrl) =>
        Effect.gen(function*() {
          const client = new OpenAI({ baseURL: baseUrl, apiKey: "unused", maxRetries: 0 })
          const ask = (content: OpenAI.Chat.ChatCompletionUserMessageParam["content"]) =>
            Effect.promise(() =>
              client.chat.completions.create({ model: "tiny-vl", max_tokens: 1, messages: [{ role: "user", content }] })
            )
          const text = yield* ask([{ type: "text", text: "Score?" }])
          const framed = yield* ask([
            { type: "text", text: "Score?" },
            ...figures.map((f) => ({ type: "image_url" as const, image_url: { url: f.url } }))
          ])
          // Each strip costs its tower tokens plus its two delimiters.
          const strip = yield* Image.fromUrl(figures[0]!.url)
          const geometry = VisionTower.geometry(VisionTower.presets["tiny-vl"].vision)
          const perStrip = Image.visionTokenCount(strip.ref.width, strip.ref.height, geometry) + 2
          assert.strictEqual(framed.usage!.prompt_tokens - text.usage!.prompt_tokens, 2 * perStrip)

          const judge = { baseUrl, model: "tiny-vl", maxTokens: 8, retries: 0 }
          // The scene's words, the rubric and both strips overflow the tiny model's 512 positions: the server's 400.
          const tooLong = yield* Effect.flip(Judge.grade({ ...judge, rubric: judgeRubric }, described, figures))
          assert.strictEqual(tooLong.reason._tag, "ScoreFailed")
          assert.match(tooLong.message, /the judge failed: HTTP 400: .*the context holds 512/)
          // A short transcript fits: the untrained model answers, and its answer holds no score.
          const failure = yield* Effect.flip(Judge.grade({ ...judge, rubric: "r" }, trajectory, figures))
          assert.strictEqual(failure.reason._tag, "ScoreFailed")
          assert.match(failure.message, /the judge's answer has no readable score/)
          // The reward: the simulation (the reference itself) scores 1, the judge's unreadable answer 0.
          const outcome = yield* Effect.gen(function*() {
            const sim = yield* SimuSceneTask.Simulation
            yield* sim.reset(scene)
            yield* sim.submit(reference)
            return yield* SimuSceneTask.reward(0.25, { ...judge, weight: 0.5 }).evaluate({ trajectory })
          }).pipe(Effect.provide(SimuSceneTask.simulationLayer))
          assert.strictEqual(outcome._tag, "Scored")
          assert.strictEqual(outcome.metrics["reward/simuscene/judge_failed"], 1)
          assert.strictEqual(outcome._tag === "Scored" ? outcome.reward : -1, 0.5)
        }))
    }).pipe(Effect.ensuring(Effect.sync(() => rmSync(root, { recursive: true, force: true }))))
  }, { timeout: 300_000 })
})
