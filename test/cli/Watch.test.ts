/**
 * `agentfly watch`: the live view of a run, checked in headless Chromium while a tiny-preset run writes its steps —
 * the open page shows each new step without a reload — and its file tailing and errors checked alone.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { appendFileSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
import * as Http from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { chromium } from "playwright-core"
import type { Browser } from "playwright-core"
import * as Train from "../../actors/Train.ts"
import * as Watch from "../../cli/watch.ts"
import * as Generate from "../../examples/guess/generate.ts"
import { task } from "../../examples/guess/task.ts"
import * as LiveReport from "../../src/LiveReport.ts"
import type * as Report from "../../src/Report.ts"

const browser = Effect.acquireRelease(
  Effect.promise(() =>
    chromium.launch({
      executablePath: "/usr/bin/chromium",
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    })
  ),
  (b: Browser) => Effect.promise(() => b.close())
)

const record = (step: number, phase: Report.MetricsRecord["phase"] = "train"): Report.MetricsRecord => ({
  phase,
  step,
  elapsed: step,
  figures: { "rollout/reward_mean": step / 10, "learner/kl": 0.001 * step, "time/learn_s": 0.5 }
})

const sample = (step: number, groupId: string): Report.SampleRecord => ({
  phase: "train",
  step,
  groupId,
  reward: 1,
  termination: "no_tool_call",
  spans: [{ source: "prompt", tokens: ["Q", "?"] }, { source: "policy", tokens: ["A", "!"], logprobs: [-0.1, -0.2] }]
})

const line = (value: unknown) => JSON.stringify(value) + "\n"

describe("agentfly watch", () => {
  it.live(
    "the page shows each new step of a tiny-preset run as it is written, without a reload",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "watch-run-"))
        yield* Generate.write(
          { dir: join(dir, "data"), seed: 3, train: 16, heldOut: 2, validation: 0, demos: 0, noise: 0 },
          task.defaults.systemPrompt!
        ).pipe(Effect.provide(NodeServices.layer))
        const out = join(dir, "run")
        mkdirSync(out) // watched before the run writes anything
        const served = yield* Watch.serve(out, { port: 0, pollMs: 100 }).pipe(Effect.provide(NodeServices.layer))
        assert.match(served.url, /^http:\/\/127\.0\.0\.1:\d+\/$/)

        const b = yield* browser
        const page = yield* Effect.promise(() => b.newPage())
        const errors: Array<string> = []
        const requests: Array<string> = []
        let navigations = 0
        page.on("console", (m) => {
          if (m.type() === "error" || m.type() === "warning") errors.push(m.text())
        })
        page.on("pageerror", (e) => errors.push(String(e)))
        page.on("request", (r) => requests.push(r.url()))
        page.on("framenavigated", (f) => {
          if (f === page.mainFrame()) navigations++
        })
        yield* Effect.promise(() => page.goto(served.url, { waitUntil: "load" }))
        const waiting = yield* Effect.promise(() => page.textContent("#run-status"))
        assert.include(waiting, "Waiting for the run's first record")
        // Every step the page shows, as it shows it (and a mark that a reload would lose).
        yield* Effect.promise(() =>
          page.evaluate(() => {
            const w = window as unknown as { seen: Array<string>; mark: number }
            w.seen = []
            w.mark = 42
            new MutationObserver(() => {
              const s = document.getElementById("run-status")
              const key = `${s?.dataset.phase} ${s?.dataset.step}`
              if (w.seen.at(-1) !== key) w.seen.push(key)
            }).observe(document.getElementById("live")!, { childList: true, subtree: true })
          })
        )

        const steps = 4
        const training = yield* Effect.forkChild(Train.run({
          task,
          dir,
          config: {
            seed: 1,
            output: "run",
            model: { path: "model", preset: "tiny", initSeed: 1 },
            data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
            agent: { numChains: 2 },
            algorithm: { steps, groupsPerStep: 2, microBatchSize: 4, advantage: "reinforce++", entropyCoef: 0.01 },
            eval: { every: 100, size: 2 }
          },
          write: () => {},
          tty: false
        }))
        // A step in the middle of the run, then the last one: both arrive in the open page.
        yield* Effect.promise(() =>
          page.waitForFunction(() => {
            const s = document.getElementById("run-status")
            return s?.dataset.phase === "train" && Number(s.dataset.step) >= 1
          }, undefined, { timeout: 180_000 })
        )
        const chainsMidRun = yield* Effect.promise(() => page.locator("table.chains tr.chain").count())
        assert.strictEqual(chainsMidRun, 2, "the current step's two sampled chains")
        yield* Fiber.join(training)
        const finished = () => document.querySelector("#run-status .state")?.textContent === "finished"
        yield* Effect.promise(() => page.waitForFunction(finished, undefined, { timeout: 30_000 }))

        const seen = yield* Effect.promise(() =>
          page.evaluate(() => (window as unknown as { seen: Array<string> }).seen)
        )
        const trainSteps = [...new Set(seen.filter((s) => s.startsWith("train ")).map((s) => Number(s.slice(6))))]
        assert.isAtLeast(trainSteps.length, 2, `the page showed the steps one after another: ${seen.join(", ")}`)
        // The last step reached the open page: as its train record, or with the final evaluation when both were
        // written between two updates (then the page shows them in one update: "eval 4").
        assert.isTrue(seen.some((s) => s === `train ${steps}` || s === `eval ${steps}`), seen.join(", "))
        const mark = yield* Effect.promise(() => page.evaluate(() => (window as unknown as { mark: number }).mark))
        assert.strictEqual(mark, 42, "the page was not reloaded")
        assert.strictEqual(navigations, 1, "no reload")

        // The finished view: the charts, the last step's chains, the latest trajectories token by token.
        assert.isAtLeast(yield* Effect.promise(() => page.locator("svg.chart").count()), 8)
        assert.include(yield* Effect.promise(() => page.textContent("h2:has-text('Current step')")), `${steps}`)
        const cards = page.locator("#viewer .card")
        assert.isAbove(yield* Effect.promise(() => cards.count()), 0)
        assert.include(yield* Effect.promise(() => cards.first().getAttribute("data-step")), `${steps}`)
        assert.isAbove(yield* Effect.promise(() => page.locator("#viewer .tok.src-policy").count()), 0)
        assert.strictEqual(yield* Effect.promise(() => page.textContent("#connection")), "live")
        assert.deepStrictEqual(errors, [])
        // Nothing but its own origin: the page and its event stream.
        for (const url of requests) assert.isTrue(url.startsWith(served.url), url)
      }).pipe(Effect.scoped),
    300_000
  )

  it.live("tails appended records, starts over when a file is rewritten shorter, and keeps the step filter", () =>
    Effect.gen(function*() {
      const out = mkdtempSync(join(tmpdir(), "watch-tail-"))
      writeFileSync(join(out, "config.json"), JSON.stringify({ algorithm: { steps: 9 } }))
      writeFileSync(join(out, "metrics.jsonl"), line(record(1)) + line(record(2)))
      writeFileSync(join(out, "samples.jsonl"), line(sample(1, "g0")) + line(sample(2, "g1")))
      const served = yield* Watch.serve(out, { port: 0, pollMs: 50 }).pipe(Effect.provide(NodeServices.layer))
      const b = yield* browser
      const page = yield* Effect.promise(() => b.newPage())
      yield* Effect.promise(() => page.goto(served.url, { waitUntil: "load" }))
      const step = () => Effect.promise(() => page.getAttribute("#run-status", "data-step"))
      assert.strictEqual(yield* step(), "2")
      assert.include(yield* Effect.promise(() => page.textContent("#run-status")), "of 9")
      // The viewer's step filter survives updates.
      yield* Effect.promise(() => page.selectOption("#step-filter", "train 1"))
      // A torn line (no newline yet) waits for its end.
      const third = line(record(3))
      appendFileSync(join(out, "metrics.jsonl"), third.slice(0, 20))
      yield* Effect.sleep("300 millis")
      assert.strictEqual(yield* step(), "2")
      appendFileSync(join(out, "metrics.jsonl"), third.slice(20))
      appendFileSync(join(out, "samples.jsonl"), line(sample(3, "g2")))
      yield* Effect.promise(() => page.waitForSelector(`#run-status[data-step="3"]`, { timeout: 10_000 }))
      assert.strictEqual(yield* Effect.promise(() => page.inputValue("#step-filter")), "train 1")
      const shown = yield* Effect.promise(() =>
        page.locator("#viewer .card").evaluateAll((cards) =>
          cards.filter((c) => (c as HTMLElement).style.display !== "none").map((c) => (c as HTMLElement).dataset.step)
        )
      )
      assert.deepStrictEqual(shown, ["train 1"])
      // A resumed run rewrites its metrics shorter: read again from the start.
      writeFileSync(join(out, "metrics.jsonl"), line(record(1)))
      yield* Effect.promise(() => page.waitForSelector(`#run-status[data-step="1"]`, { timeout: 10_000 }))
    }).pipe(Effect.scoped), 60_000)

  it.live("a missing folder and a port in use are said plainly; only this machine's names are served", () =>
    Effect.gen(function*() {
      const missing = yield* Effect.flip(Watch.serve("/nonexistent/run", { port: 0 }))
      assert.include(missing.message, "/nonexistent/run does not exist")
      const out = mkdtempSync(join(tmpdir(), "watch-port-"))
      const first = yield* Watch.serve(out, { port: 0 })
      // Another name for this machine (a rebound DNS name) is refused on loopback.
      const status = (host: string) =>
        Effect.callback<number | undefined>((resume) => {
          Http.get({ host: "127.0.0.1", port: first.port, path: "/", headers: { host } }, (res) => {
            res.resume()
            resume(Effect.succeed(res.statusCode))
          })
        })
      assert.strictEqual(yield* status(`evil.example:${first.port}`), 403)
      assert.strictEqual(yield* status(`localhost:${first.port}`), 200)
      assert.strictEqual(yield* status(`127.0.0.1:${first.port}`), 200)
      const taken = yield* Effect.flip(Watch.serve(out, { port: first.port }))
      assert.strictEqual(taken._tag, "WatchError")
      assert.include(taken.message, `port ${first.port} on 127.0.0.1 is in use`)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it("the fragment says a run that has not started, is running, or finished", () => {
    assert.include(LiveReport.status({ metrics: [], samples: [], finished: false }), "Waiting")
    const config = { algorithm: { steps: 5 } }
    const running = LiveReport.status({ metrics: [record(3)], samples: [], finished: false, config })
    assert.include(running, `data-step="3"`)
    assert.include(running, "running")
    assert.include(running, "of 5")
    assert.include(LiveReport.status({ metrics: [record(5)], samples: [], finished: true }), "finished")
    const warmup = { metrics: [record(7, "warmup")], samples: [], finished: false, config: { warmup: { steps: 600 } } }
    assert.include(LiveReport.status(warmup), "warmup step <b id=\"current-step\">7</b> of 600")
    const quiet = LiveReport.status({ metrics: [record(5)], samples: [], finished: false, quietFor: 600 })
    assert.include(quiet, "no record for 10 min")
    assert.deepStrictEqual(
      LiveReport.recentSamples([sample(1, "a"), sample(2, "b"), sample(3, "c"), sample(4, "d")], 2).map((s) => s.step),
      [4, 3]
    )
  })
})
