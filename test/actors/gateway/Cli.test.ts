/**
 * `agentfly gateway` in a child process, in front of the tiny local model: an episode opens with its first request
 * (chat through the `openai` SDK, then `/v1/completions` with a text prompt), a posted reward ends it and appends
 * its scored trajectory to the output file; an episode left idle is abandoned after `--idle-timeout` (appended
 * masked, `interrupted`) and its id is free again.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import OpenAI from "openai"
import * as ModelFolder from "../../../src/ModelFolder.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"
import { cli } from "../../utils/agentfly.ts"

const root = resolve(import.meta.dirname, "../../..")

/** Starts the CLI; resolves with its URL once it printed it. Interrupting the effect kills the child. */
const startCli = (args: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly url: string; readonly kill: () => void }, Error>((resume) => {
      const child = spawn(process.execPath, [cli, "gateway", ...args], {
        cwd: root,
        stdio: ["ignore", "pipe", "pipe"]
      })
      let output = ""
      const onData = (d: Buffer) => {
        output += d.toString()
        const m = /at (http:\/\/127\.0\.0\.1:\d+)/.exec(output)
        if (m !== null) resume(Effect.succeed({ url: m[1]!, kill: () => child.kill("SIGKILL") }))
      }
      child.stdout.on("data", onData)
      child.stderr.on("data", onData)
      child.on("exit", (code) => resume(Effect.fail(new Error(`agentfly gateway exited (${code}): ${output}`))))
    }),
    ({ kill }) => Effect.sync(kill)
  )

const lines = (file: string) =>
  existsSync(file)
    ? readFileSync(file, "utf8").trim().split("\n").filter((l) => l !== "").map((l) =>
      JSON.parse(l) as { trajectory: Trajectory.Trajectory; threads: Array<unknown> }
    )
    : []

const waitFor = (check: () => boolean, ms: number) =>
  Effect.promise(async () => {
    const until = Date.now() + ms
    while (!check() && Date.now() < until) await new Promise((r) => setTimeout(r, 50))
    return check()
  })

describe("agentfly gateway", () => {
  it.live(
    "serving mode: episodes open on first use, end with a posted reward or when abandoned, go to the output",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "gateway-cli-"))
        yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 2 })
        const output = join(dir, "episodes.jsonl")
        const { url } = yield* startCli([
          "--model-dir",
          join(dir, "model"),
          "--port",
          "0",
          "--output",
          output,
          "--idle-timeout",
          "3",
          "--max-new-tokens",
          "16"
        ])
        const openai = new OpenAI({ baseURL: `${url}/episodes/first/v1`, apiKey: "x", maxRetries: 0 })
        const chat = yield* Effect.promise(() =>
          openai.chat.completions.create({ model: "whatever", messages: [{ role: "user", content: "Hello" }], seed: 1 })
        )
        assert.strictEqual(chat.choices[0]!.finish_reason, "length")
        assert.strictEqual(chat.usage?.completion_tokens, 16)
        const text = yield* Effect.promise(() =>
          openai.completions.create({ model: "x", prompt: "Once upon", max_tokens: 8, seed: 1 })
        )
        assert.strictEqual((text.choices[0] as unknown as { token_ids: Array<number> }).token_ids.length, 8)
        // A text prompt's ids, as the model read them (the byte tokenizer: one id per byte).
        const promptIds = (text.choices[0] as unknown as { prompt_token_ids: Array<number> }).prompt_token_ids
        assert.deepStrictEqual(promptIds, [..."Once upon"].map((c) => c.charCodeAt(0)))
        // An idle episode beside it.
        yield* Effect.promise(() =>
          new OpenAI({ baseURL: `${url}/episodes/idle/v1`, apiKey: "x", maxRetries: 0 }).chat.completions.create({
            model: "x",
            messages: [{ role: "user", content: "Hi" }]
          })
        )
        const posted = yield* Effect.promise(() =>
          fetch(`${url}/episodes/first/reward`, { method: "POST", body: JSON.stringify({ reward: 0.75 }) }).then((r) =>
            r.status
          )
        )
        assert.strictEqual(posted, 200)
        assert.isTrue(yield* waitFor(() => lines(output).length === 2, 15_000), "both episodes were written")
        const [first, idle] = lines(output)
        assert.strictEqual(first!.trajectory.chainId, "first")
        assert.strictEqual(first!.trajectory.reward, 0.75)
        assert.strictEqual(first!.trajectory.rewardStatus, "scored")
        assert.strictEqual(first!.threads.length, 2, "a chat thread and a completions thread")
        assert.strictEqual(first!.trajectory.metrics["gateway/requests"], 2)
        assert.strictEqual(idle!.trajectory.chainId, "idle")
        assert.isTrue(idle!.trajectory.masked)
        assert.strictEqual(idle!.trajectory.termination, "interrupted")
        assert.include(idle!.trajectory.error, "abandoned")
        // A finished episode's id is not opened again (two records would share a trajectory id): 409, named.
        const gone = yield* Effect.promise(() => fetch(`${url}/episodes/first`).then((r) => r.status))
        assert.strictEqual(gone, 404)
        const again = yield* Effect.promise(() =>
          fetch(`${url}/episodes/first/v1/chat/completions`, {
            method: "POST",
            body: JSON.stringify({ model: "x", messages: [{ role: "user", content: "Hi" }] })
          }).then(async (r) => ({
            status: r.status,
            body: await r.json() as { error: { code: string; message: string } }
          }))
        )
        assert.strictEqual(again.status, 409)
        assert.strictEqual(again.body.error.code, "episode_ended")
        assert.include(again.body.error.message, `episode "first" has ended`)
        // `/end` takes no body (as `curl -X POST …/end` sends none).
        yield* Effect.promise(() =>
          new OpenAI({ baseURL: `${url}/episodes/short/v1`, apiKey: "x", maxRetries: 0 }).chat.completions.create({
            model: "x",
            messages: [{ role: "user", content: "Hi" }]
          })
        )
        const ended = yield* Effect.promise(() =>
          fetch(`${url}/episodes/short/end`, { method: "POST" }).then((r) => r.status)
        )
        assert.strictEqual(ended, 200)
        assert.isTrue(yield* waitFor(() => lines(output).length === 3, 15_000), "the ended episode was written")
        assert.strictEqual(lines(output)[2]!.trajectory.chainId, "short")
      }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)),
    60_000
  )

  it.live(
    "--omit-tool-schemas leaves the requests' tools out of the prompt; a --checkpoint that is none is refused, named",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "gateway-cli-"))
        yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 2 })
        const base = [
          "--model-dir",
          join(dir, "model"),
          "--port",
          "0",
          "--output",
          join(dir, "e.jsonl"),
          "--max-new-tokens",
          "4"
        ]
        const tool = {
          type: "function" as const,
          function: { name: "convert", description: "Convert units", parameters: { type: "object", properties: {} } }
        }
        const promptTokens = (url: string, id: string, tools: boolean) =>
          Effect.promise(() =>
            new OpenAI({ baseURL: `${url}/episodes/${id}/v1`, apiKey: "x", maxRetries: 0 }).chat.completions.create({
              model: "x",
              messages: [{ role: "user", content: "2 km in m?" }],
              ...(tools ? { tools: [tool] } : {})
            })
          ).pipe(Effect.map((r) => r.usage!.prompt_tokens))
        const omitting = yield* startCli([...base, "--omit-tool-schemas"])
        assert.strictEqual(yield* promptTokens(omitting.url, "a", true), yield* promptTokens(omitting.url, "b", false))
        omitting.kill()
        // Without it the tiny model's 512 positions cannot hold Qwen2.5's tool preamble.
        const rendering = yield* startCli(base)
        const refused = yield* Effect.flip(
          promptTokens(rendering.url, "a", true).pipe(Effect.orDie, Effect.catchDefect(Effect.fail))
        )
        assert.include(String(refused), "this episode's context holds 512")
        rendering.kill()
        const missing = yield* Effect.flip(startCli([...base, "--checkpoint", join(dir, "nope")]))
        assert.include(missing.message, `${join(dir, "nope")}: no such checkpoint`)
      }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)),
    60_000
  )
})
