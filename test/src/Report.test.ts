import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as fc from "fast-check"
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { chromium } from "playwright-core"
import type { Page } from "playwright-core"
import * as Report from "../../src/Report.ts"

/**
 * A plausible run: warm-up, then RL steps with evaluations every 5 steps, and a few samples. Some steps have failed
 * trajectories and tool errors (logged only when non-zero, as the trainer does); every step has episode ends and the
 * figures of two environment pools.
 */
const run = () => {
  const metrics: Array<Report.MetricsRecord> = []
  for (let step = 1; step <= 20; step++) {
    metrics.push({
      phase: "warmup",
      step,
      elapsed: step,
      figures: { "warmup/loss": 3 / step, "perf/tokens_per_s": 4e4, "perf/peak_rss_mb": 700 + step }
    })
  }
  for (let step = 1; step <= 30; step++) {
    metrics.push({
      phase: "train",
      step,
      elapsed: 20 + step,
      figures: {
        "rollout/reward_mean": 0.2 + step / 100,
        "rollout/accuracy": 0.2 + step / 100,
        "rollout/invalid_tool_call_rate": 0.3 - step / 200,
        "rollout/turns_mean": 2,
        "rollout/tool_calls/calculator": 1 - step / 100,
        "rollout/tool_calls/search": step / 100,
        "learner/kl": step * 1e-4,
        "learner/entropy": 0.8 - step / 100,
        "learner/clip_frac": 0.01,
        "learner/loss": -0.01,
        "learner/lr": 3e-4 * (1 + Math.cos((Math.PI * (step - 1)) / 30)) / 2,
        "learner/grad_norm": 0.3,
        "learner/groups_with_signal": 8 - (step % 3),
        "rollout/groups_sampled": 8 * (1 + (step % 3)),
        "critic/value_mean": 0.2 + step / 120,
        "critic/return_mean": 0.2 + step / 100,
        "critic/loss": 0.3 / step,
        "critic/explained_variance": step / 100,
        "perf/tokens_per_s": 3000 + step,
        "perf/peak_rss_mb": 900 + step,
        "rollout/failure_share": step % 7 === 0 ? 0.125 : 0,
        ...(step % 7 === 0 ? { "rollout/failures/EnvFailed": 1 } : {}),
        ...(step === 10 ? { "rollout/failures/LeaseFailed": 2 } : {}),
        ...(step % 3 === 0 ? { "rollout/tool_errors/Timeout": 1 } : {}),
        ...(step === 5 ? { "rollout/tool_errors/DecodeError": 2 } : {}),
        "rollout/episode_end/solved": 0.2 + step / 100,
        "rollout/episode_end/out_of_guesses": 0.5 - step / 100,
        ...Object.fromEntries(["sandbox", "docker/calc"].flatMap((pool, i) => [
          [`env/${pool}/leases`, step * 8],
          [`env/${pool}/acquire_wait_p50_ms`, 2 + i],
          [`env/${pool}/acquire_wait_p99_ms`, 40 + step + i],
          [`env/${pool}/crashes`, Math.floor(step / 10)],
          [`env/${pool}/resets`, step * 8 - 1]
        ]))
      }
    })
    if (step % 5 === 0 || step === 1) {
      metrics.push({
        phase: "eval",
        step: step === 1 ? 0 : step,
        elapsed: 20 + step,
        figures: {
          "eval/accuracy": 0.3 + step / 100,
          "eval/invalid_tool_call_rate": 0.2 - step / 300,
          "eval/reward_mean": 0.3,
          "perf/peak_rss_mb": 800
        }
      })
    }
  }
  const samples: Array<Report.SampleRecord> = [1, 2, 3].map((step) => ({
    phase: "train",
    step: step * 10,
    groupId: `g-${step}`,
    reward: step === 2 ? 0 : 1,
    termination: "no_tool_call",
    spans: [
      { source: "prompt", tokens: ["<|im_start|>", "user", "\n", "What is 2+2?</script><b>"] },
      { source: "template", tokens: ["<|im_start|>", "assistant\n"] },
      { source: "policy", tokens: ["<tool_call>", "{\"name\"", ": 4"], logprobs: [-0.1, -0.5, -2] },
      { source: "tool", tokens: ["<tool_response>", "4", "</tool_response>"] }
    ]
  }))
  return { metrics, samples }
}

/** The points of the series named `name` in rendered SVG. */
const pointsOf = (html: string, name: string): Array<Array<number>> =>
  /points="([^"]+)"/.exec(html.slice(html.indexOf(`data-name="${name}"`)))![1]!.split(" ").map((p) =>
    p.split(",").map(Number)
  )

/**
 * Opens `path` in headless Chromium and runs `look` on the page; also returns what the page logged as an error or
 * warning and every URL it requested.
 */
const inChromium = <A>(path: string, look: (page: Page) => Promise<A>) =>
  Effect.acquireUseRelease(
    Effect.promise(() =>
      chromium.launch({
        executablePath: "/usr/bin/chromium",
        args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync"]
      })
    ),
    (browser) =>
      Effect.promise(async () => {
        const page = await browser.newPage()
        const errors: Array<string> = []
        const requests: Array<string> = []
        page.on("console", (m) => {
          if (m.type() === "error" || m.type() === "warning") errors.push(m.text())
        })
        page.on("pageerror", (e) => errors.push(String(e)))
        page.on("request", (r) => requests.push(r.url()))
        await page.goto(pathToFileURL(path).href, { waitUntil: "load" })
        return { errors, requests, ...(await look(page)) }
      }),
    (browser) => Effect.promise(() => browser.close())
  )

describe("Report", () => {
  it("ticks are nice, cover the range and are evenly spaced", () => {
    assert.deepStrictEqual(Report.ticks(0, 1, 5), [0, 0.2, 0.4, 0.6, 0.8, 1])
    assert.deepStrictEqual(Report.ticks(3, 97, 4), [20, 40, 60, 80])
    fc.assert(
      fc.property(
        fc.double({ min: -1e5, max: 1e5, noNaN: true }),
        fc.double({ min: 1e-3, max: 1e6, noNaN: true }),
        (lo, w) => {
          const t = Report.ticks(lo, lo + w, 5)
          assert.isTrue(t.length >= 1 && t.length <= 12, `${t.length} ticks`)
          for (const x of t) {
            assert.isTrue(x >= lo - w * 1e-6 && x <= lo + w * (1 + 1e-6))
          }
        }
      )
    )
  })

  it("a chart with no finite point says so; series scale into the plot area", () => {
    assert.include(Report.lineChart({ title: "Empty", series: [{ name: "a", points: [[1, Number.NaN]] }] }), "no data")
    const svg = Report.lineChart({
      title: "T",
      series: [{ name: "a", points: [[0, 0], [10, 1]] }],
      width: 400,
      height: 200
    })
    const points = /points="([^"]+)"/.exec(svg)![1]!.split(" ").map((p) => p.split(",").map(Number))
    for (const [x, y] of points) assert.isTrue(x! >= 0 && x! <= 400 && y! >= 0 && y! <= 200)
    assert.isTrue(points[0]![1]! > points[1]![1]!, "a rising series goes up the page")
  })

  it("a fraction chart's y axis stays within [0, 1]; the other charts keep the range of their points", () => {
    const yTicks = (svg: string) =>
      [...svg.matchAll(/text-anchor="end" class="tick">([^<]+)</g)].map((m) => m[1]!).filter((t) => t !== "step")
        .map(Number)
    const flat = (y: number) => [{ name: "a", points: [[1, y], [2, y], [3, y]] as const }]
    const zero = Report.lineChart({ title: "Accuracy", series: flat(0), fraction: true })
    assert.strictEqual(Math.min(...yTicks(zero)), 0, yTicks(zero).join(" "))
    const xAxis = zero.slice(zero.indexOf("class=\"axis\"") + 1) // the second axis line is the x axis
    const [, axisY] = /<line x1="52" x2="\d+" y1="([\d.]+)"[^>]*class="axis"/.exec(xAxis)!
    assert.isTrue(pointsOf(zero, "a").every(([, y]) => Math.abs(y! - Number(axisY)) < 0.1), "0 sits on the x axis")
    const one = Report.lineChart({ title: "Accuracy", series: flat(1), fraction: true })
    assert.strictEqual(Math.max(...yTicks(one)), 1, yTicks(one).join(" "))
    const rising = Report.lineChart({
      title: "Rate",
      series: [{ name: "a", points: [[0, 0], [5, 0.02]] }],
      fraction: true
    })
    assert.isTrue(yTicks(rising).every((t) => t >= 0 && t <= 0.02), `auto range kept inside [0, 1]: ${yTicks(rising)}`)
    // Not a fraction: a flat loss of 0 keeps its symmetric range, a negative one goes below 0.
    assert.isBelow(Math.min(...yTicks(Report.lineChart({ title: "Loss", series: flat(0) }))), 0)
    assert.isBelow(Math.max(...yTicks(Report.lineChart({ title: "Loss", series: flat(-0.5) }))), 0)
    const fractions = Report.charts.filter((c) => c.fraction === true).map((c) => c.title)
    assert.deepStrictEqual(fractions, [
      "Accuracy",
      "Invalid tool-call rate",
      "Episode ends",
      "Clip fraction",
      "Warm-up validation accuracy"
    ])
  })

  it("a legend too long for one row wraps and makes the chart taller", () => {
    const series = ["EnvFailed", "LeaseFailed", "RewardFailed", "SamplerTransient", "ChainDefect"].map((name) => ({
      name,
      points: [[1, 1], [2, 0]] as const
    }))
    const one = Report.lineChart({ title: "T", series: series.slice(0, 1), width: 400, height: 200 })
    const five = Report.lineChart({ title: "T", series, width: 400, height: 200 })
    assert.include(one, `height="200"`)
    assert.notInclude(five, `height="200"`)
    const shifts = [...five.matchAll(/<g transform="translate\(([\d.]+),([\d.]+)\)">/g)]
      .map((m) => [Number(m[1]), Number(m[2])])
    assert.strictEqual(shifts.length, 5)
    for (const [x] of shifts) assert.isTrue(x! < 400 - 60, `legend entry at x = ${x}`)
    assert.isAbove(new Set(shifts.map(([, y]) => y)).size, 1, "more than one row")
  })

  it("a run with failures, tool errors, episode ends and pool figures gets their charts, one series each", () => {
    const html = Report.render({ title: "t", ...run() })
    for (
      const title of ["Failures by reason (train)", "Tool errors by reason", "Episode ends", "Acquire wait (ms)",
        "Crashes (since start)", "Resets for reuse (since start)"]
    ) assert.include(html, `<title>${title}</title>`)
    for (
      const name of ["EnvFailed", "LeaseFailed", "Timeout", "DecodeError", "solved", "out_of_guesses", "sandbox p50",
        "sandbox p99", "docker/calc p50", "docker/calc p99"]
    ) assert.include(html, `data-name="${name}"`)
    for (const pool of ["sandbox", "docker/calc"]) {
      assert.strictEqual(html.split(`data-name="${pool}"`).length - 1, 2, "one series per pool in crashes and resets")
    }
    assert.include(html, "<h2>Environment pools</h2>")
    assert.notInclude(html, `data-name="sandbox leases"`, "only the figures a chart asks for")
    // A failure count absent from a step's record is a zero there, not a gap.
    const envFailed = pointsOf(html, "EnvFailed")
    assert.strictEqual(envFailed.length, 30, "a point at every training step")
    assert.strictEqual(new Set(envFailed.map(([, y]) => y)).size, 2, "ones at steps 7, 14, …; zeros elsewhere")
  })

  it("the learning rate and the gradient norm are charted at every training step", () => {
    const html = Report.render({ title: "t", ...run() })
    assert.include(html, "<title>Learning rate</title>")
    assert.include(html, "<title>Gradient norm</title>")
    const lr = pointsOf(html, "learning rate")
    assert.strictEqual(lr.length, 30)
    assert.isAbove(lr.at(-1)![1]!, lr[0]![1]!, "the cosine schedule falls (SVG y grows downwards)")
    assert.strictEqual(pointsOf(html, "before clipping").length, 30)
  })

  it("peak RSS is charted per phase: RL steps and evaluations together, the warm-up on its own steps", () => {
    const html = Report.render({ title: "t", ...run() })
    assert.include(html, "<h2>Memory</h2>")
    assert.include(html, "<title>Peak RSS (MB)</title>")
    assert.include(html, "<title>Peak RSS, warm-up (MB)</title>")
    assert.strictEqual(pointsOf(html, "RL step").length, 30)
    assert.strictEqual(pointsOf(html, "evaluation").length, 7)
    assert.strictEqual(pointsOf(html, "warm-up step").length, 20)
  })

  it("a run without those figures leaves their charts out; the charts every run has say \"no data\"", () => {
    const optional =
      /^(rollout\/(failures|tool_errors|episode_end)\/|env\/|critic\/|perf\/peak_rss_mb$|learner\/groups_with_signal$|rollout\/groups_sampled$)/
    const metrics = run().metrics.map((r) => ({
      ...r,
      figures: Object.fromEntries(Object.entries(r.figures).filter(([k]) => !optional.test(k)))
    }))
    const html = Report.render({ title: "t", metrics, samples: [] })
    const titles = ["Failures by reason", "Tool errors by reason", "Episode ends", "Acquire wait", "Crashes", "Resets",
      "Peak RSS", "Values and returns", "Critic loss", "Groups with a learning signal"]
    for (const title of titles) assert.notInclude(html, title)
    assert.notInclude(html, "Environment pools", "an empty section is left out too")
    assert.notInclude(html, "<h2>Memory</h2>")
    assert.include(html, "<title>Warm-up validation accuracy</title>")
    assert.include(html, "no data")
    assert.strictEqual(html.split(`<svg `).length - 1, Report.charts.filter((c) => !c.optional).length)
  })

  it("the viewer keeps the samples of at most 12 steps per phase, first and last included", () => {
    const sample = (phase: "train" | "eval", step: number): Report.SampleRecord => ({
      phase,
      step,
      groupId: "g",
      reward: 0,
      termination: "stop",
      spans: []
    })
    const all = [...Array.from({ length: 100 }, (_, i) => [sample("train", i + 1), sample("train", i + 1)]).flat(),
      sample("eval", 0), sample("eval", 50)]
    const kept = Report.selectSamples(all)
    const trainSteps = [...new Set(kept.filter((s) => s.phase === "train").map((s) => s.step))]
    assert.strictEqual(trainSteps.length, 12)
    assert.deepStrictEqual([trainSteps[0], trainSteps.at(-1)], [1, 100])
    assert.strictEqual(kept.filter((s) => s.step === 1).length, 2, "every sample of a kept step")
    assert.strictEqual(kept.filter((s) => s.phase === "eval").length, 2)
  })

  it("shows a token's control characters as their control pictures: no raw control byte reaches the HTML", () => {
    const { metrics, samples } = run()
    const sample = { ...samples[0]!, spans: [{ source: "policy" as const, tokens: ["\u001b", "a\u0000b", "\u007f"] }] }
    const html = Report.render({ title: "t", metrics, samples: [sample] })
    assert.notMatch(html, /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/)
    assert.include(html, "␛")
    assert.include(html, "a␀b")
    assert.include(html, "␡")
  })

  it("escapes token text so a trajectory cannot inject markup", () => {
    const html = Report.render({ title: "t<x>", ...run() })
    assert.notInclude(html, "</script><b>")
    assert.include(html, "&lt;/script&gt;&lt;b&gt;")
    assert.include(html, "<title>t&lt;x&gt;</title>")
  })

  it.effect(
    "renders in headless Chromium with no console errors, no network, all charts and the viewer",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "report-"))
        const { metrics, samples } = run()
        // Greedy validation accuracy stuck at 0 in the warm-up: its fraction chart's axis must not dip below 0.
        const checked = metrics.map((m) =>
          m.phase === "warmup" ? { ...m, figures: { ...m.figures, "warmup/validation_accuracy": 0 } } : m
        )
        writeFileSync(join(dir, "metrics.jsonl"), checked.map((m) => JSON.stringify(m)).join("\n") + "\n")
        writeFileSync(join(dir, "samples.jsonl"), samples.map((m) => JSON.stringify(m)).join("\n") + "\n{\"torn")
        writeFileSync(join(dir, "config.json"), JSON.stringify({ seed: 1 }))
        const path = yield* Report.write(dir, { title: "demo" })
        const seen = yield* inChromium(path, async (page) => {
          const charts = await page.locator("svg.chart").count()
          const polylines = await page.locator("svg.chart polyline.series").count()
          const toolSeries = await page.locator("svg.chart polyline[data-name='search']").count()
          const failureSeries = await page.locator("svg.chart polyline[data-name='LeaseFailed']").count()
          const poolSeries = await page.locator("svg.chart polyline[data-name='docker/calc p99']").count()
          const sections = await page.locator("h2").allInnerTexts()
          const cards = await page.locator("#viewer .card").count()
          const policyTokens = await page.locator("#viewer .src-policy").count()
          const box = await page.locator("svg.chart").first().boundingBox()
          // The warm-up's validation accuracy, 0 throughout: drawn on the x axis, with no tick below 0.
          const validation = page.locator("svg.chart", {
            has: page.locator("title", { hasText: "Warm-up validation accuracy" })
          })
          const zeroLine = await validation.locator("polyline.series").boundingBox()
          const xAxis = await validation.locator("line.axis").nth(1).boundingBox()
          const validationTicks = await validation.locator("text.tick").allTextContents()
          await page.selectOption("#step-filter", "train 20")
          const visible = await page.locator("#viewer .card:visible").count()
          const summary = await page.locator("table.summary").innerText()
          return {
            charts,
            polylines,
            toolSeries,
            failureSeries,
            poolSeries,
            sections,
            cards,
            policyTokens,
            box,
            zeroLine,
            xAxis,
            validationTicks,
            visible,
            summary
          }
        })
        assert.deepStrictEqual(seen.errors, [])
        assert.deepStrictEqual(seen.requests, [pathToFileURL(path).href], "the page loads nothing but itself")
        assert.strictEqual(seen.charts, Report.charts.length)
        assert.isTrue(seen.polylines >= 14, `${seen.polylines} series drawn`)
        assert.strictEqual(seen.toolSeries, 1, "one series per tool")
        assert.strictEqual(seen.failureSeries, 1, "one series per failure reason")
        assert.strictEqual(seen.poolSeries, 1, "one series per pool and figure")
        assert.deepStrictEqual(seen.sections, [
          "Training curves",
          "Critic",
          "Memory",
          "Environment pools",
          "Sampled trajectories"
        ])
        assert.strictEqual(seen.cards, 3, "the torn sample line is skipped")
        assert.strictEqual(seen.policyTokens, 9)
        assert.isTrue((seen.box?.width ?? 0) > 100 && (seen.box?.height ?? 0) > 100, "charts have a size")
        assert.isBelow(
          Math.abs(seen.zeroLine!.y + seen.zeroLine!.height / 2 - (seen.xAxis!.y + seen.xAxis!.height / 2)),
          1.5,
          `validation accuracy 0 is drawn on the x axis: ${JSON.stringify([seen.zeroLine, seen.xAxis])}`
        )
        assert.isFalse(
          seen.validationTicks.some((t) => t.startsWith("-") || t.startsWith("−")),
          seen.validationTicks.join(" ")
        )
        assert.strictEqual(seen.visible, 1, "the step filter works")
        assert.include(seen.summary, "accuracy")
        assert.include(seen.summary, "+0.290")
      }).pipe(Effect.provide(NodeServices.layer)),
    60_000
  )

  it.effect(
    "a comparison of runs renders in headless Chromium: its table, what each config changes, one series per run",
    () =>
      Effect.gen(function*() {
        const parent = mkdtempSync(join(tmpdir(), "compare-"))
        const dirs = [["seed-1", 1, 0], ["seed-2", 2, 0.05], ["seed-3", 3, -0.05]] as const
        for (const [name, seed, shift] of dirs) {
          const dir = join(parent, name)
          mkdirSync(dir)
          const { metrics } = run()
          const moved = metrics.map((m) =>
            m.phase === "eval"
              ? { ...m, figures: { ...m.figures, "eval/accuracy": m.figures["eval/accuracy"]! + shift } }
              : m
          )
          writeFileSync(join(dir, "metrics.jsonl"), moved.map((m) => JSON.stringify(m)).join("\n") + "\n")
          writeFileSync(join(dir, "config.json"), JSON.stringify({ seed, mode: "sync", output: dir }))
        }
        const path = yield* Report.writeComparison(
          dirs.map(([name]) => join(parent, name)),
          join(parent, "compare.html")
        )
        const seen = yield* inChromium(path, async (page) => {
          const accuracy = page.locator("svg.chart", {
            has: page.locator("title", { hasText: "Held-out accuracy over time" })
          })
          return {
            charts: await page.locator("svg.chart").count(),
            accuracySeries: await accuracy.locator("polyline.series").evaluateAll((ps) =>
              ps.map((p) => p.getAttribute("data-name"))
            ),
            rows: await page.locator("table.summary tr").count(),
            changes: await page.locator("ul.changes li").allInnerTexts(),
            sections: await page.locator("h2").allInnerTexts()
          }
        })
        assert.deepStrictEqual(seen.errors, [])
        assert.deepStrictEqual(seen.requests, [pathToFileURL(path).href], "the page loads nothing but itself")
        assert.deepStrictEqual(seen.accuracySeries, ["seed-1", "seed-2", "seed-3"])
        assert.strictEqual(seen.rows, 4, "a header and a row per run")
        assert.deepStrictEqual(seen.changes, ["seed-2: seed: 1 → 2", "seed-3: seed: 1 → 3"])
        // The two charts over time, then every fixed series of the run report that the runs logged.
        const logged = Report.comparedSeries.filter((c) =>
          run().metrics.some((m) => m.phase === c.phase && m.figures[c.key] !== undefined)
        )
        assert.strictEqual(seen.charts, 2 + logged.length)
        assert.strictEqual(seen.sections[0], "Over time")
      }).pipe(Effect.provide(NodeServices.layer)),
    60_000
  )
})
