/**
 * `npm run bench -- webshop`
 *
 * The web shop as a rollout uses it, against the same shop driven directly:
 *
 * - `runtime`: the oracle plays `ROWS` held-out instructions through `Rollout.runTaskChat` (the task's tools in
 *   the tool actor, a visit per chain from the provider, the episode, the `webshop` reward, Qwen2.5's template on
 *   the byte-level tokenizer), 64 chains at once; environment steps (tool calls) per second;
 * - `bare`: the same oracle on the same instructions in a plain loop over `Shop.act` (`ShopOracle.playDirect`,
 *   plus the score of each purchase): no template, tokenizer, actors or fibers;
 * - `latency`: each action of the bare runs replayed alone and timed, by kind (p50/p99, ms), and the search over
 *   the 10,000-product catalogue on `QUERIES` instructions' queries.
 *
 * Both paths share one catalogue and index, built before the timed rounds (the task's layer is replaced by the
 * built catalogue, so the runtime rounds do not rebuild it). Headline: runtime steps/s ÷ bare steps/s (target
 * ≥ 0.67: the runtime costs at most half again what the shop itself costs). Medians of `ROUNDS` rounds, the two
 * paths alternating; the load average is reported because the machine is shared.
 */
import { Effect, Layer } from "effect"
import { loadavg } from "node:os"
import * as Catalog from "../environments/webshop/Catalog.ts"
import * as Goal from "../environments/webshop/Goal.ts"
import * as Score from "../environments/webshop/Score.ts"
import * as Shop from "../environments/webshop/Shop.ts"
import * as ShopOracle from "../environments/webshop/ShopOracle.ts"
import * as WebShopTask from "../environments/webshop/WebShopTask.ts"
import type * as Task from "../src/Task.ts"

const ROWS = 256
const ROUNDS = 5
const CHAINS = 64
const QUERIES = 2000

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const quantile = (xs: ReadonlyArray<number>, q: number) => {
  const sorted = [...xs].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!
}
const latency = (xs: ReadonlyArray<number>) => ({ p50: quantile(xs, 0.5), p99: quantile(xs, 0.99), n: xs.length })

export default async () => {
  const loadBefore = loadavg()[0]!
  const started = performance.now()
  const products = Catalog.generate(Catalog.defaultSource.seed, Catalog.defaultSource.size)
  const catalog = Catalog.make(products)
  const indexMs = performance.now() - started
  const { rows, queries } = Goal.splits(products, 4242, { rows: ROWS, queries: QUERIES })
  const settings = Shop.defaultSettings
  const policy = ShopOracle.policy()
  const task: Task.Task = { ...WebShopTask.make(), layer: Layer.succeed(Catalog.Catalog, catalog) }

  const bare = () => {
    const t0 = performance.now()
    let steps = 0
    let solved = 0
    const played = rows.map((row) => {
      const visit = ShopOracle.playDirect(policy, catalog, settings, row.question, {
        systemPrompt: WebShopTask.systemPrompt
      })
      steps += visit.actions
      const p = visit.state.purchase
      if (p !== undefined && Score.score(p.product, p.options, row.goal).score >= 1) solved++
      return visit
    })
    const seconds = (performance.now() - t0) / 1000
    return { stepsPerSecond: steps / seconds, steps, solved: solved / rows.length, played }
  }

  const runtime = async () => {
    const t0 = performance.now()
    const trajectories = await Effect.runPromise(ShopOracle.rollout({ task, rows, policy, concurrency: CHAINS }))
    const seconds = (performance.now() - t0) / 1000
    const steps = trajectories.reduce((n, t) => n + (t.metrics["tool_calls"] ?? 0), 0)
    const solved = trajectories.filter((t) => t.reward >= 1).length / rows.length
    return { stepsPerSecond: steps / seconds, steps, solved }
  }

  // Warm-up: the JIT, the template's first renders.
  bare()
  await runtime()
  const bareRounds: Array<number> = []
  const runtimeRounds: Array<number> = []
  let lastBare = bare()
  let lastRuntime = await runtime()
  for (let r = 0; r < ROUNDS; r++) {
    lastBare = bare()
    bareRounds.push(lastBare.stepsPerSecond)
    lastRuntime = await runtime()
    runtimeRounds.push(lastRuntime.stepsPerSecond)
  }

  // Each action of the bare visits replayed on a fresh visit, timed alone.
  const timings: Record<Shop.Action["_tag"], Array<number>> = { search: [], click: [], select: [], buy: [] }
  for (const visit of lastBare.played) {
    const state = Shop.initial()
    for (const m of visit.messages) {
      if (m.role !== "assistant") continue
      for (const call of m.tool_calls ?? []) {
        const args = call.function.arguments as Record<string, string>
        const action: Shop.Action = call.function.name === "search"
          ? { _tag: "search", q: args["q"]! }
          : call.function.name === "click"
          ? { _tag: "click", id: args["id"]! }
          : call.function.name === "select"
          ? { _tag: "select", o: args["o"]! }
          : { _tag: "buy" }
        const t0 = performance.now()
        Shop.act(state, catalog, settings, action)
        timings[action._tag].push(performance.now() - t0)
      }
    }
  }
  const searchMs = queries.map(({ question }) => {
    const q = question.replace(/^i want (an? )?/, "").replace(/, under \d+ dollars$/, "").replaceAll(",", "")
    const t0 = performance.now()
    catalog.search(q, settings.maxResults)
    return performance.now() - t0
  })

  const bareSps = median(bareRounds)
  const runtimeSps = median(runtimeRounds)
  return {
    headline: {
      metric: `webshop env steps/s: runtime (oracle, ${CHAINS} chains, runTaskChat) / bare loop`,
      value: runtimeSps / bareSps,
      target: 0.67,
      better: "higher"
    },
    runtime: { stepsPerSecond: runtimeSps, rounds: runtimeRounds, solved: lastRuntime.solved },
    bare: { stepsPerSecond: bareSps, rounds: bareRounds, solved: lastBare.solved },
    stepsPerVisit: lastBare.steps / ROWS,
    latencyMs: {
      search: latency(timings.search),
      click: latency(timings.click),
      select: latency(timings.select),
      buy: latency(timings.buy),
      searchOver10k: latency(searchMs)
    },
    catalog: { products: catalog.size, buildMs: indexMs },
    settings: { rows: ROWS, rounds: ROUNDS, chains: CHAINS, queries: QUERIES },
    loadAverage: { before: loadBefore, after: loadavg()[0]! }
  } as const
}
