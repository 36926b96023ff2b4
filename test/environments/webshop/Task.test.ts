/**
 * The web-shop task through the rollout runtime (`Rollout.runTaskChat`, the task's own tools, per-chain visits,
 * episode and reward; Qwen2.5's template on the byte-level tokenizer, no tool schemas): the oracle solves ≥ 95 % of
 * held-out instructions within the task's turn and context budgets, a random shopper scores ≈ 0, malformed and
 * refused actions come back as typed error observations while the episode goes on, 64 concurrent chains never see
 * each other's visits, and no visit outlives its chain, interrupted or not. The task resolves by name with options.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Stream } from "effect"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Rollout from "../../../actors/Rollout.ts"
import * as TaskRuntime from "../../../actors/TaskRuntime.ts"
import * as Tasks from "../../../environments/Tasks.ts"
import * as Catalog from "../../../environments/webshop/Catalog.ts"
import * as Goal from "../../../environments/webshop/Goal.ts"
import * as ShopOracle from "../../../environments/webshop/ShopOracle.ts"
import * as WebShopTask from "../../../environments/webshop/WebShopTask.ts"
import type { Conversation } from "../../../src/Message.ts"
import * as Sampling from "../../../src/Sampling.ts"
import * as Task from "../../../src/Task.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"

const products = Catalog.generate(Catalog.defaultSource.seed, Catalog.defaultSource.size)
const { heldOut } = Goal.splits(products, 99, { heldOut: 200 })
const task = WebShopTask.make()

const mean = (ts: ReadonlyArray<Trajectory.Trajectory>, f: (t: Trajectory.Trajectory) => number) =>
  ts.reduce((a, t) => a + f(t), 0) / ts.length
const observations = (t: Trajectory.Trajectory) => t.messages.filter((m) => m.role === "tool").map(Oracle.text)

/** A shopper acting at random on what it sees: random searches, clicks, options, purchases. */
const randomShopper = (messages: Conversation) => {
  const question = Oracle.text(messages.find((m) => m.role === "user"))
  let seed = messages.length
  for (let i = 0; i < question.length; i++) seed = Math.imul(seed ^ question.charCodeAt(i), 0x01000193)
  const next = Sampling.mulberry32(seed >>> 0)
  const page = Oracle.text(Oracle.last(messages, "tool"))
  const any = <A>(xs: ReadonlyArray<A>) => xs[Math.floor(next() * xs.length)]!
  const words = products[Math.floor(next() * products.length)]!.title.split(" ")
  const ids = [...page.matchAll(/\[([A-Z0-9]{5})\]/g)].map((m) => m[1]!)
  const values = [...page.matchAll(/^\w+: (.*)$/gm)].flatMap((m) => m[1]!.split(", "))
  const action = any(["search", "click", "click", "select", "buy"] as const)
  const args = action === "search"
    ? { q: words.slice(1).join(" ") }
    : action === "click"
    ? { id: ids.length > 0 && next() < 0.7 ? any(ids) : any(["next", "prev", "back"]) }
    : action === "select"
    ? { o: values.length > 0 ? any(values) : "m" }
    : {}
  return { toolCalls: [Oracle.call(messages, action, args)] }
}

describe("webshop task", () => {
  it.effect("the oracle buys what ≥ 95 % of held-out instructions ask for, within the turn and context budgets", () =>
    Effect.gen(function*() {
      const solved = yield* ShopOracle.rollout({ task, rows: heldOut, policy: ShopOracle.policy() })
      assert.strictEqual(solved.length, heldOut.length)
      // Solved, and the whole visit (the purchase's observation too) fits the policy's 1,024-token context.
      const length = ShopOracle.contextLength()
      const rate = solved.filter((t) => t.reward >= 1 && length(t.messages) <= 1024).length / solved.length
      assert.isAtLeast(rate, 0.95, `solve rate ${rate}`)
      for (const t of solved.filter((t) => t.reward >= 1)) {
        assert.strictEqual(t.termination, "episode_end")
        assert.strictEqual(t.episodeEnd, "bought")
        assert.strictEqual(t.metrics["reward/webshop/acc"], 1)
        // 64 chains ran at once: what each bought is what its own visit opened.
        const bought = /^bought (B[A-Z0-9]{4})/.exec(observations(t).at(-1)!)![1]!
        assert.isTrue(observations(t).some((o) => o.startsWith(`[${bought}] `)), "bought the item its visit opened")
      }
      // The misses ran out of context (a wrong first click costs ≈ 300 bytes), never bought something else.
      for (const t of solved.filter((t) => t.reward < 1)) assert.strictEqual(t.termination, "context_length")
    }), { timeout: 240_000 })

  it.effect("a random shopper scores ≈ 0", () =>
    Effect.gen(function*() {
      const played = yield* ShopOracle.rollout({ task, rows: heldOut.slice(0, 100), policy: randomShopper })
      assert.strictEqual(played.length, 100)
      const reward = mean(played, (t) => t.reward)
      assert.isBelow(reward, 0.1, `mean reward ${reward}`)
      assert.isAtMost(Oracle.solveRate(played), 0.01)
      assert.isAbove(mean(played, (t) => t.metrics["reward/webshop/bought"] ?? 0), 0.02, "it does buy things")
    }), { timeout: 240_000 })

  it.effect("malformed and refused actions are typed error observations; the episode goes on", () =>
    Effect.gen(function*() {
      const script: ReadonlyArray<readonly [string, unknown]> = [
        ["click", { id: "B0000" }],
        ["checkout", {}],
        ["search", { q: 5 }],
        ["select", { o: "m" }],
        ["buy", {}],
        ["search", { q: "wireless mouse" }],
        ["click", { id: "BNOPE" }]
      ]
      const policy = (messages: Conversation) => {
        const step = script[messages.filter((m) => m.role === "assistant").length]
        if (step === undefined) return { content: "done" }
        return { toolCalls: [Oracle.call(messages, step[0], step[1] as Record<string, unknown>)] }
      }
      const [t] = yield* ShopOracle.rollout({ task, rows: heldOut.slice(0, 1), policy })
      const tools = t!.messages.filter((m) => m.role === "tool")
      assert.lengthOf(tools, 7)
      const seen = observations(t!)
      assert.match(seen[0]!, /^Error: nothing to click yet: search first/)
      assert.match(seen[1]!, /^Error: unknown tool "checkout"/)
      assert.match(seen[2]!, /^Error: invalid arguments for tool "search": Expected string at \["q"\]/)
      assert.match(seen[3]!, /^Error: no item open/)
      assert.match(seen[4]!, /^Error: no item open/)
      assert.match(seen[5]!, /^page 1\/\d+\n\[B/)
      assert.match(seen[6]!, /^Error: "BNOPE" is not on this page/)
      assert.deepStrictEqual(tools.map((m) => m.is_error === true), [true, true, true, true, true, false, true])
      // Seven calls of errors fill most of the 1,024-token budget: the chain ends there or on the reply without a call.
      assert.include(["no_tool_call", "context_length"], t!.termination)
      assert.strictEqual(t!.reward, 0)
      // The format errors never reached the shop: 5 of the 7 calls were shop actions.
      assert.strictEqual(t!.metrics["reward/webshop/steps"], 5)
    }), { timeout: 300_000 })

  it.effect("no visit outlives its chain: every chain's visit is closed when it ends or is interrupted", () =>
    Effect.gen(function*() {
      const runtime = yield* TaskRuntime.make(task, { renderTools: false })
      const rows = heldOut.slice(0, 40).map((row) => ({
        goal: row.goal,
        messages: [
          { role: "system" as const, content: WebShopTask.systemPrompt },
          { role: "user" as const, content: row.question }
        ]
      }))
      const options = {
        rows,
        numChains: 1,
        maxTurns: 8,
        maxContextTokens: 1024,
        maxConcurrentChains: 16,
        sampling: { temperature: 1, maxTokens: 96, seed: 1 },
        format: ShopOracle.format(),
        tools: runtime.tools,
        reward: runtime.reward,
        environment: runtime.environment,
        episode: runtime.episode
      }
      const events = yield* Stream.runCollect(Rollout.runChat(options))
      assert.strictEqual(events.filter((e) => e._tag === "Trajectory").length, 40)
      // The start check's probe chain is the one extra visit.
      assert.deepStrictEqual(yield* runtime.environmentStats, { "env/webshop/visits": 41, "env/webshop/open": 0 })
      // Stop after 5 trajectories: the chains still running are interrupted, and their visits closed.
      yield* Stream.runCollect(Stream.take(Rollout.runChat(options), 5))
      const after = yield* runtime.environmentStats
      assert.isAbove(after["env/webshop/visits"]!, 46)
      assert.strictEqual(after["env/webshop/open"], 0)
    }).pipe(Effect.provide(Oracle.layer(ShopOracle.policy()))), { timeout: 300_000 })

  it.effect("resolves as the built-in task webshop, with options checked strictly", () =>
    Effect.gen(function*() {
      const resolve = (ref: Task.Ref) => Task.resolve(ref, { builtins: Tasks.builtins, resolvePath: (p) => p })
      const named = yield* resolve({ name: "webshop", options: { pageSize: 5, toolCallFormat: 0.2 } })
      assert.strictEqual(named.name, "webshop")
      assert.strictEqual(named.reward?.name, "webshop + 0.2·toolCallFormat")
      assert.deepStrictEqual(named.tools.map((t) => t.name), ["search", "click", "select", "buy"])
      assert.strictEqual((yield* resolve("webshop")).defaults.maxContextTokens, 1024)
      const bad = yield* Effect.flip(resolve({ name: "webshop", options: { pageSize: 0 } }))
      assert.strictEqual(bad.reason._tag, "Options")
      const unknown = yield* Effect.flip(resolve({ name: "webshop", options: { pages: 3 } }))
      assert.strictEqual(unknown.reason._tag, "Options")
    }))
})
