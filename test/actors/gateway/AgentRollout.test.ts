/**
 * Agent-function tasks rolled out through the gateway (`AgentRollout.runTask`), with an agent written with the real
 * `openai` SDK against a scripted token sampler: groups of `numChains` concurrent episodes with the chains' seeds;
 * rewards returned, posted to `/episodes/ID/reward`, or scored by the task's reward on the final transcript; crashes,
 * timeouts and missing rewards follow the error policies (a crashed or abandoned episode is masked and freed); a
 * group reward rescores a group together.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Logger, Schema, Stream } from "effect"
import OpenAI from "openai"
import * as AgentRollout from "../../../actors/gateway/AgentRollout.ts"
import * as AgentTask from "../../../src/AgentTask.ts"
import * as Reward from "../../../src/Reward.ts"
import * as Sampler from "../../../src/Sampler.ts"
import * as Trajectory from "../../../src/Trajectory.ts"
import { calculatorTool, evaluate, format, scriptedSampler } from "./fixtures.ts"
import * as RolloutFigures from "../../../src/RolloutFigures.ts"

type Msg = OpenAI.Chat.Completions.ChatCompletionMessageParam

/** A calculator agent written with the openai SDK: its own tool loop, then the final text. */
const calculatorAgent = async (input: AgentTask.Input<unknown>, client: AgentTask.Client): Promise<string> => {
  const openai = new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey, maxRetries: 0 })
  const messages: Array<Msg> = input.messages.map((m) => ({ role: m.role, content: m.content }) as Msg)
  for (let step = 0; step < 4; step++) {
    const reply = await openai.chat.completions.create({ model: client.model, messages, tools: [calculatorTool] }, {
      signal: client.signal
    })
    const message = reply.choices[0]!.message
    messages.push(message)
    const calls = message.tool_calls ?? []
    if (calls.length === 0) return message.content ?? ""
    for (const c of calls) {
      if (c.type !== "function") continue
      messages.push({
        role: "tool",
        tool_call_id: c.id,
        content: evaluate(JSON.parse(c.function.arguments).expression)
      })
    }
  }
  return ""
}

const answerOf = (text: string) => /The answer is (-?\d+)/.exec(text)?.[1]

const exact = Reward.make("exact", {
  row: Schema.Struct({ answer: Schema.String }),
  score: ({ trajectory, row }) =>
    Effect.succeed(answerOf(Trajectory.lastAssistantText(trajectory)) === row.answer ? 1 : 0)
})

const rows = [
  { question: "What is 17*23?", answer: "391" },
  { question: "What is 6*7?", answer: "41" }
]

const run = (task: AgentTask.AgentTask, sampler?: Sampler.Sampler["Service"], numChains = 3) =>
  Effect.gen(function*() {
    const s = sampler ?? (yield* scriptedSampler(5))
    return yield* AgentRollout.runTask({
      task,
      rows,
      numChains,
      sampling: { temperature: 1, maxTokens: 256, seed: 100 },
      format,
      systemPrompt: "Use the calculator tool.",
      runId: "r"
    }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, s))
  })

describe("AgentRollout", () => {
  it.live("groups of concurrent episodes with the chains' ids and seeds, scored by the task's reward", () =>
    Effect.gen(function*() {
      const seeds: Array<number | undefined> = []
      const base = yield* scriptedSampler(5)
      const sampler = Sampler.Sampler.of({
        ...base,
        generate: (r) => Effect.suspend(() => {
          seeds.push(r.sampling.seed)
          return base.generate(r)
        })
      })
      let inFlight = 0
      let most = 0
      const task = AgentTask.make("calc", {
        row: Schema.Struct({ answer: Schema.String }),
        agent: async (input, client) => {
          most = Math.max(most, ++inFlight)
          await new Promise((r) => setTimeout(r, 20))
          await calculatorAgent(input, client)
          inFlight--
        },
        reward: exact
      })
      const groups = yield* run(task, sampler)
      assert.deepStrictEqual(groups.map((g) => g.groupId), ["r-g0", "r-g1"])
      assert.deepStrictEqual(groups[0]!.trajectories.map((t) => t.chainId), ["r-g0-c0", "r-g0-c1", "r-g0-c2"])
      assert.isAbove(most, 1, "episodes run concurrently")
      // Every request of episode k of row i samples with seed + i·numChains + k, as a chain does.
      assert.deepStrictEqual([...new Set(seeds)].sort((a, b) => a! - b!), [100, 101, 102, 103, 104, 105])
      const [g0, g1] = groups
      assert.deepStrictEqual(g0!.trajectories.map((t) => t.reward), [1, 1, 1])
      assert.deepStrictEqual(g1!.trajectories.map((t) => t.reward), [0, 0, 0], "6*7 is not 41")
      for (const t of groups.flatMap((g) => g.trajectories)) {
        assert.strictEqual(t.rewardStatus, "scored")
        assert.isFalse(t.masked)
        assert.isTrue(t.trainable)
        assert.strictEqual(t.termination, "no_tool_call")
        assert.deepStrictEqual(t.row, { answer: t.groupId === "r-g0" ? "391" : "41" })
        const sources = new Set(t.segments.flatMap((s) => s.spans.map((span) => span.source)))
        assert.deepStrictEqual([...sources].sort(), ["policy", "prompt", "template", "tool"])
        assert.strictEqual(t.metrics["reward/exact/reward"], t.reward)
      }
    }))

  it.live(
    "a batch split in shares (rowOffset, as rollout workers get it) has the whole batch's ids, rows and seeds",
    () =>
      Effect.gen(function*() {
        const task = AgentTask.make("calc", {
          row: Schema.Struct({ answer: Schema.String }),
          agent: async (input, client) => void (await calculatorAgent(input, client)),
          reward: exact
        })
        const recorded = (share: ReadonlyArray<typeof rows[number]>, rowOffset: number) =>
          Effect.gen(function*() {
            const seeds: Array<number | undefined> = []
            const base = yield* scriptedSampler(5)
            const sampler = Sampler.Sampler.of({
              ...base,
              generate: (r) => Effect.suspend(() => (seeds.push(r.sampling.seed), base.generate(r)))
            })
            const groups = yield* AgentRollout.runTask({
              task,
              rows: share,
              numChains: 3,
              sampling: { temperature: 1, maxTokens: 256, seed: 100 },
              format,
              systemPrompt: "Use the calculator tool.",
              runId: "r",
              rowOffset
            }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, sampler))
            return { groups, seeds: [...new Set(seeds)].sort((a, b) => a! - b!) }
          })
        const whole = yield* recorded(rows, 0)
        const first = yield* recorded(rows.slice(0, 1), 0)
        const second = yield* recorded(rows.slice(1), 1)
        const shape = (gs: ReadonlyArray<Trajectory.Group>) =>
          gs.map((g) => ({
            groupId: g.groupId,
            rowIndex: g.rowIndex,
            chains: g.trajectories.map((t) => t.chainId),
            rewards: g.trajectories.map((t) => t.reward)
          }))
        assert.deepStrictEqual(shape([...first.groups, ...second.groups]), shape(whole.groups))
        assert.deepStrictEqual([...first.seeds, ...second.seeds], whole.seeds)
        assert.deepStrictEqual(second.seeds, [103, 104, 105])
        assert.deepStrictEqual(second.groups.map((g) => g.groupId), ["r-g1"])
      })
  )

  it.live(
    "a returned reward wins, a posted one comes next; with neither and no task reward the reward is missing",
    () =>
      Effect.gen(function*() {
        const returning = AgentTask.make("returns", {
          agent: async (input, client) => ({
            reward: (await calculatorAgent(input, client)).length / 100,
            metrics: { chars: 1 }
          })
        })
        const posting = AgentTask.make("posts", {
          agent: async (input, client) => {
            await calculatorAgent(input, client)
            const r = await fetch(client.rewardURL, { method: "POST", body: JSON.stringify({ reward: 0.25 }) })
            if (!r.ok) throw new Error(`reward: ${r.status}`)
          }
        })
        const silent = AgentTask.make("silent", {
          agent: async (input, client) => void (await calculatorAgent(input, client))
        })
        const a = (yield* run(returning, undefined, 1)).flatMap((g) => g.trajectories)
        assert.deepStrictEqual(a.map((t) => t.reward), [0.18, 0.17])
        assert.strictEqual(a[0]!.metrics["reward/agent/returned"], 1)
        assert.strictEqual(a[0]!.metrics["chars"], 1)
        const b = (yield* run(posting, undefined, 1)).flatMap((g) => g.trajectories)
        assert.deepStrictEqual(b.map((t) => [t.reward, t.metrics["reward/agent/posted"]]), [[0.25, 1], [0.25, 1]])
        // RewardFailed's default policy: scored 0 and kept, with the reason named (it counts as a failure).
        const c = (yield* run(silent, undefined, 1)).flatMap((g) => g.trajectories)
        assert.deepStrictEqual(c.map((t) => [t.reward, t.rewardStatus, t.masked, t.errorReason]), [
          [0, "scored", false, "RewardFailed"],
          [0, "scored", false, "RewardFailed"]
        ])
      })
  )

  it.live(
    "a returned reward that is not a finite number fails the trajectory's reward, naming the agent; " +
      "nothing NaN reaches it",
    () =>
      Effect.gen(function*() {
        const returning = (name: string, value: (text: string) => unknown) =>
          AgentTask.make(name, {
            // What a JavaScript function may return whatever its declared type.
            agent: (async (input, client) => value(await calculatorAgent(input, client))) as AgentTask.AgentFunction<
              unknown
            >
          })
        for (
          const [name, value, says] of [
            [
              "nan",
              () => NaN,
              `the agent function of task "nan" returned NaN as its reward (expected a finite number)`
            ],
            ["inf", () => ({ reward: Infinity }), `returned Infinity as its reward`],
            ["metric", () => ({ reward: 1, metrics: { chars: NaN } }), `returned metric "chars" = NaN`]
          ] as const
        ) {
          const all = (yield* run(returning(name, value), undefined, 1)).flatMap((g) => g.trajectories)
          for (const t of all) {
            assert.strictEqual(t.errorReason, "RewardFailed", name)
            assert.include(t.error, says)
            assert.isTrue(Number.isFinite(t.reward) && Object.values(t.metrics).every(Number.isFinite), name)
          }
        }
        // Its answer text is no score: the task's reward scores the episode.
        const text = AgentTask.make("text", {
          agent: calculatorAgent as unknown as AgentTask.AgentFunction<unknown>,
          reward: exact
        })
        const scored = (yield* run(text, undefined, 1)).flatMap((g) => g.trajectories)
        assert.deepStrictEqual(scored.map((t) => [t.rewardStatus, t.errorReason]), [
          ["scored", undefined],
          ["scored", undefined]
        ])
      })
  )

  it.live("a call of a tool the request did not declare counts as an invalid tool call (tool_errors/UnknownTool)", () =>
    Effect.gen(function*() {
      // The agent declares `calc`, the policy calls `calculator`; this loop runs the call anyway, as some do.
      const calc = { ...calculatorTool, function: { ...calculatorTool.function, name: "calc" } }
      const misnamed = AgentTask.make("misnamed", {
        agent: async (input, client) => {
          const openai = new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey, maxRetries: 0 })
          const messages: Array<Msg> = input.messages.map((m) => ({ role: m.role, content: m.content }) as Msg)
          for (let step = 0; step < 4; step++) {
            const reply = await openai.chat.completions.create({ model: client.model, messages, tools: [calc] })
            const message = reply.choices[0]!.message
            messages.push(message)
            const calls = (message.tool_calls ?? []).flatMap((c) => (c.type === "function" ? [c] : []))
            if (calls.length === 0) return 1
            for (const c of calls) {
              messages.push({
                role: "tool",
                tool_call_id: c.id,
                content: evaluate(JSON.parse(c.function.arguments).expression)
              })
            }
          }
          return 0
        }
      })
      const all = (yield* run(misnamed, undefined, 1)).flatMap((g) => g.trajectories)
      for (const t of all) {
        assert.strictEqual(t.metrics["tool_calls"], 1)
        assert.strictEqual(t.metrics["tool_errors/UnknownTool"], 1)
      }
      const figures = RolloutFigures.rolloutFigures([{ groupId: "g", rowIndex: 0, trajectories: all }], {
        prefix: "rollout"
      })
      assert.strictEqual(figures["rollout/invalid_tool_call_rate"], 1)
      // An agent asking for fewer tokens than its turn needs: the cut is the request's, and the trajectory says so.
      const terse = AgentTask.make("terse", {
        agent: async (input, client) => {
          const openai = new OpenAI({ baseURL: client.baseURL, apiKey: client.apiKey, maxRetries: 0 })
          const messages = input.messages.map((m) => ({ role: m.role, content: m.content }) as Msg)
          await openai.chat.completions.create({
            model: client.model,
            messages,
            tools: [calculatorTool],
            max_tokens: 5
          })
          return 0
        }
      })
      const cut = (yield* run(terse, undefined, 1)).flatMap((g) => g.trajectories)
      assert.deepStrictEqual(cut.map((t) => [t.termination, t.metrics["gateway/cut_at_request_max_tokens"]]), [
        ["stop", 5],
        ["stop", 5]
      ])
      // Declared, the same calls are valid.
      const right =
        (yield* run(
          AgentTask.make("right", { agent: async (i, c) => void (await calculatorAgent(i, c)) }),
          undefined,
          1
        ))
          .flatMap((g) => g.trajectories)
      assert.isTrue(
        right.every((t) => t.metrics["tool_errors/UnknownTool"] === undefined && t.metrics["tool_calls"] === 1)
      )
    }))

  it.live(
    "a crash is masked (EnvFailed); a drop_group policy drops the group; a request refused first names the reason",
    () =>
      Effect.gen(function*() {
        const flaky = (policies?: AgentTask.Options<unknown>["policies"]) =>
          AgentTask.make("flaky", {
            agent: async (input, client) => {
              const text = await calculatorAgent(input, client)
              if (client.episodeId.endsWith("-c1")) throw new Error("the agent's own bug")
              return text.length > 0 ? 1 : 0
            },
            ...(policies === undefined ? {} : { policies })
          })
        const logs: Array<string> = []
        const collector = Logger.make((o) =>
          void logs.push((o.message as ReadonlyArray<unknown>).map(String).join(" "))
        )
        const groups = yield* run(flaky()).pipe(Effect.provideService(Logger.CurrentLoggers, new Set([collector])))
        // The first crash is logged with where it threw; the second is only counted.
        assert.strictEqual(logs.length, 1, logs.join("\n"))
        assert.include(logs[0], `the agent function of task "flaky" failed: Error: the agent's own bug\n    at `)
        assert.include(logs[0], "AgentRollout.test.ts")
        const all = groups.flatMap((g) => g.trajectories)
        const crashed = all.filter((t) => t.masked)
        assert.strictEqual(crashed.length, 2)
        for (const t of crashed) {
          assert.strictEqual(t.termination, "error")
          assert.strictEqual(t.errorReason, "EnvFailed")
          assert.strictEqual(t.rewardStatus, "failed")
          assert.include(t.error, "the agent's own bug")
          assert.isAbove(t.segments.length, 0, "what it sampled is kept, masked")
        }
        const dropped = yield* run(flaky({ overrides: { EnvFailed: "drop_group" } }))
        assert.strictEqual(dropped.length, 0, "both groups had a crash")

        // The sampler refuses every request: the agent's SDK throws, and the episode's reason is the sampler's.
        const refusing = Sampler.Sampler.of({
          generate: () => Effect.fail(Sampler.samplerError("BadRequest", "no")),
          policyVersion: Effect.succeed(0)
        })
        const refused =
          (yield* run(
            AgentTask.make("refused", { agent: async (i, c) => void (await calculatorAgent(i, c)) }),
            refusing,
            1
          )).flatMap((g) => g.trajectories)
        assert.deepStrictEqual(refused.map((t) => [t.errorReason, t.masked]), [
          ["SamplerRejected", true],
          ["SamplerRejected", true]
        ])
      })
  )

  it.live(
    "a request past the context budget ends the episode as context_length (scored); no request at all is masked",
    () =>
      Effect.gen(function*() {
        const task = AgentTask.make("long", {
          row: Schema.Struct({ answer: Schema.String }),
          agent: async (input, client) => void (await calculatorAgent(input, client)),
          reward: exact
        })
        const groups = yield* AgentRollout.runTask({
          task,
          rows,
          numChains: 1,
          maxContextTokens: 100,
          sampling: { temperature: 1, maxTokens: 256, seed: 1 },
          format
        }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, yield* scriptedSampler()))
        for (const t of groups.flatMap((g) => g.trajectories)) {
          assert.deepStrictEqual(
            [t.termination, t.masked, t.rewardStatus, t.reward],
            ["context_length", false, "scored", 0]
          )
          assert.deepStrictEqual(
            t.segments.flatMap((s) => s.spans.map((span) => span.source)),
            ["prompt"],
            "the prompt, as a chain keeps it"
          )
        }
        const idle = (yield* run(AgentTask.make("idle", { agent: async () => 1 }), undefined, 1)).flatMap((g) =>
          g.trajectories
        )
        assert.deepStrictEqual(idle.map((t) => [t.masked, t.errorReason]), [[true, "EnvFailed"], [true, "EnvFailed"]])
        assert.include(idle[0]!.error, "no request")
      })
  )

  it.live(
    "an abandoned episode (the agent hangs past its timeout): masked, its signal aborted, its requests refused",
    () =>
      Effect.gen(function*() {
        const seen: Array<{ aborted: boolean; later: number }> = []
        const releases = new Map<string, () => void>()
        const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))
        // One episode at a time: chain 0 of a group hangs (its client abandoned it) and is released, as a zombie, by
        // chain 1 while the gateway still serves.
        const task = AgentTask.make("hangs", {
          timeout: "400 millis",
          agent: async (input, client) => {
            await calculatorAgent(input, client)
            const group = client.episodeId.slice(0, -3)
            if (client.episodeId.endsWith("-c1")) {
              releases.get(group)?.()
              await sleep(100)
              return 1
            }
            await new Promise<void>((r) => releases.set(group, r))
            const aborted = client.signal.aborted
            const later = await fetch(`${client.baseURL}/chat/completions`, {
              method: "POST",
              body: JSON.stringify({ messages: [{ role: "user", content: "still there?" }] })
            }).then((r) => r.status, () => -1)
            seen.push({ aborted, later })
          }
        })
        const groups = yield* AgentRollout.runTask({
          task,
          rows,
          numChains: 2,
          maxConcurrentChains: 1,
          sampling: { temperature: 1, maxTokens: 256, seed: 1 },
          format,
          runId: "r"
        }).pipe(Stream.runCollect, Effect.provideService(Sampler.Sampler, yield* scriptedSampler()))
        const all = groups.flatMap((g) => g.trajectories)
        assert.deepStrictEqual(all.map((t) => [t.chainId, t.masked, t.errorReason ?? null, t.rewardStatus]), [
          ["r-g0-c0", true, "EnvFailed", "failed"],
          ["r-g0-c1", false, null, "scored"],
          ["r-g1-c0", true, "EnvFailed", "failed"],
          ["r-g1-c1", false, null, "scored"]
        ])
        assert.include(all[0]!.error, "timeout")
        // The abandoned episodes were closed and freed while the gateway kept serving the others.
        assert.deepStrictEqual(seen, [{ aborted: true, later: 404 }, { aborted: true, later: 404 }])
      })
  )

  it.live("a group reward rescores each group's scored trajectories together; masked ones are left out", () =>
    Effect.gen(function*() {
      const calls: Array<number> = []
      const ranking: AgentTask.GroupReward = {
        name: "rank",
        score: (ts) =>
          Effect.sync(() => {
            calls.push(ts.length)
            return ts.map((_, i) => ({ reward: i / ts.length, metrics: { size: ts.length } }))
          })
      }
      let n = 0
      const task = AgentTask.make("ranked", {
        agent: async (input, client) => {
          await calculatorAgent(input, client)
          if (n++ === 0) throw new Error("crash")
          return 1
        },
        groupReward: ranking
      })
      const groups = yield* run(task)
      assert.deepStrictEqual(calls, [2, 3])
      const [g0, g1] = groups
      assert.deepStrictEqual(g0!.trajectories.map((t) => t.reward), [0, 0, 0.5])
      assert.deepStrictEqual(g1!.trajectories.map((t) => t.reward), [0, 1 / 3, 2 / 3])
      assert.strictEqual(g1!.trajectories[2]!.metrics["reward/rank/size"], 3)
    }))
})
