/**
 * `agentfly tokens --recorded`: the viewer of recorded episodes shows the ids as recorded (never a re-render), from
 * `agentfly gateway --output`'s JSONL and from a run's `samples.jsonl`, whose lines carry the episode id and the ids.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawnSync } from "node:child_process"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import OpenAI from "openai"
import * as Gateway from "../../actors/Gateway.ts"
import * as Metrics from "../../actors/Metrics.ts"
import type { Finished } from "../../actors/Gateway.ts"
import { recordedJson } from "../../cli/tokens.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import { calculatorTool, evaluate, format, scriptedSampler, tokenizer } from "../actors/gateway/fixtures.ts"
import { repoRoot } from "../utils/qwen.ts"
import { cli } from "../utils/agentfly.ts"

const agentfly = (...args: Array<string>) =>
  spawnSync(process.execPath, [cli, ...args], {
    cwd: repoRoot,
    encoding: "utf8",
    env: { ...process.env, NO_COLOR: "1" },
    timeout: 300_000
  })

describe("agentfly tokens --recorded", () => {
  it.live("shows a gateway episode's recorded ids by its id, and a samples.jsonl line's", () =>
    Effect.gen(function*() {
      const finished: Array<Finished> = []
      const gateway = yield* Gateway.make({
        autoOpen: {
          episode: {
            format,
            sampler: yield* scriptedSampler(2),
            sampling: { temperature: 1, maxTokens: 128 },
            requestSampling: "honour"
          },
          onEnd: (f) => Effect.sync(() => void finished.push(f))
        }
      })
      for (const id of ["first", "second"]) {
        yield* Effect.promise(async () => {
          const openai = new OpenAI({ baseURL: `${gateway.url}/episodes/${id}/v1`, apiKey: "k", maxRetries: 0 })
          const messages: Array<OpenAI.Chat.Completions.ChatCompletionMessageParam> = [
            { role: "user", content: id === "first" ? "What is 2+3?" : "What is 6*7?" }
          ]
          const request = { model: "m", messages, tools: [calculatorTool] }
          const reply = (await openai.chat.completions.create(request)).choices[0]!.message
          messages.push(reply)
          for (const c of reply.tool_calls ?? []) {
            if (c.type !== "function") continue
            const content = evaluate(JSON.parse(c.function.arguments).expression)
            messages.push({ role: "tool", tool_call_id: c.id, content })
          }
          await openai.chat.completions.create({ model: "m", messages, tools: [calculatorTool] })
          await fetch(`${gateway.url}/episodes/${id}/reward`, { method: "POST", body: JSON.stringify({ reward: 1 }) })
        })
      }
      yield* Effect.sleep(50)
      assert.strictEqual(finished.length, 2)
      const dir = mkdtempSync(join(tmpdir(), "agentfly-recorded-"))
      const episodes = join(dir, "episodes.jsonl")
      writeFileSync(episodes, finished.map((f) => JSON.stringify(f)).join("\n") + "\n")
      const second = finished.find((f) => f.trajectory.trajectoryId === "second")!.trajectory

      const run = agentfly("tokens", "--recorded", episodes, "--episode", "second", "--json")
      assert.strictEqual(run.status, 0, run.stderr)
      const printed = JSON.parse(run.stdout) as ReturnType<typeof recordedJson>
      assert.strictEqual(printed.episode, "second")
      assert.deepStrictEqual(printed.ids, second.segments.flatMap((s) => [...Trajectory.tokenIds(s)]))
      assert.deepStrictEqual(printed.sources, second.segments.flatMap((s) => Trajectory.sources(s)))
      assert.isTrue(printed.sources.includes("tool") && printed.mask.includes(1))

      // samples.jsonl: the line carries the episode id and the ids; the viewer shows them with the stored text.
      const sample = Metrics.sampleOf(second, "train", 3, (id) => tokenizer.decode([id]))
      assert.strictEqual(sample.trajectoryId, "second")
      assert.deepStrictEqual(sample.spans.flatMap((s) => s.ids ?? []), printed.ids)
      const samples = join(dir, "samples.jsonl")
      writeFileSync(samples, JSON.stringify(Metrics.sampleOf(finished[0]!.trajectory, "train", 3, String)) + "\n" +
        JSON.stringify(sample) + "\n")
      const shown = agentfly("tokens", "--recorded", samples, "--episode", "second")
      assert.strictEqual(shown.status, 0, shown.stderr)
      assert.include(shown.stdout, "episode second: 1 segment(s), the ids as recorded")
      const firstPolicy = second.segments[0]!.spans.find((s) => s.source === "policy")!.tokenIds[0]!
      const text = JSON.stringify(tokenizer.decode([firstPolicy]))
      assert.isTrue(
        shown.stdout.split("\n").some((l) =>
          /\spolicy\s+1\s/.test(l) && l.includes(` ${firstPolicy} `) && l.endsWith(text)
        ),
        "the policy's first id with its stored text"
      )

      const missing = agentfly("tokens", "--recorded", episodes, "--episode", "third")
      assert.notStrictEqual(missing.status, 0)
      assert.include(missing.stderr + missing.stdout, "no recorded episode \"third\" (2 recorded: first, second)")
    }), 120_000)
})
