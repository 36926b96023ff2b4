import { assert, describe, it } from "@effect/vitest"
import { execFileSync, spawnSync } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { cli } from "../utils/agentfly.ts"

const root = resolve(import.meta.dirname, "../..")

describe("agentfly report", () => {
  it("regenerates report.html from a run directory's files; fraction charts keep their y axis within [0, 1]", () => {
    const dir = mkdtempSync(join(tmpdir(), "report-cli-"))
    // A policy that never answers right: accuracy 0 at every step (its axis was -0.1 to 0.1), and a loss of 0.
    const metrics = [0, 1, 2].map((step) => ({
      phase: "train",
      step,
      elapsed: step,
      figures: { "rollout/reward_mean": step / 4, "rollout/accuracy": 0, "learner/loss": 0 }
    }))
    writeFileSync(join(dir, "metrics.jsonl"), metrics.map((m) => JSON.stringify(m)).join("\n") + "\n")
    const out = execFileSync(process.execPath, [cli, "report", dir], {
      cwd: root,
      encoding: "utf8",
      timeout: 300_000
    })
    assert.include(out, "3 metric records, 0 sampled trajectories")
    const html = readFileSync(join(dir, "report.html"), "utf8")
    assert.include(html, "<svg")
    assert.include(html, "No sampled trajectories were recorded.")
    const yTicks = (title: string) => {
      const svg = html.split("<svg ").find((c) => c.includes(`<title>${title}</title>`))!
      return [...svg.matchAll(/text-anchor="end" class="tick">([^<]+)</g)].map((m) => m[1]!).filter((t) => t !== "step")
        .map(Number)
    }
    assert.strictEqual(Math.min(...yTicks("Accuracy")), 0, `Accuracy: ${yTicks("Accuracy")}`)
    assert.isAtMost(Math.max(...yTicks("Accuracy")), 1)
    assert.isBelow(Math.min(...yTicks("Policy loss")), 0, "not a fraction: its own range")
  })

  it("a folder without a run, or no folder, is refused with a sentence and exit code 1", () => {
    const empty = mkdtempSync(join(tmpdir(), "report-empty-"))
    for (const [dir, says] of [[empty, "holds no training run"], [join(empty, "nope"), "does not exist"]] as const) {
      const result = spawnSync(process.execPath, [cli, "report", dir], {
        cwd: root,
        encoding: "utf8",
        timeout: 300_000
      })
      assert.strictEqual(result.status, 1)
      assert.include(result.stderr, says)
      assert.notInclude(result.stderr, "PlatformError")
    }
    assert.isFalse(existsSync(join(empty, "report.html")))
    // A config given for its run: the folder it writes is named, not the command's help.
    const config = join(root, "examples/calculator/demo.json")
    const file = spawnSync(process.execPath, [cli, "report", config], {
      cwd: root,
      encoding: "utf8",
      timeout: 300_000
    })
    assert.strictEqual(file.status, 1)
    assert.include(
      file.stderr,
      `${config} is a file: give a run's output directory ` +
        `(this config's run writes to ${join(root, "runs/calculator-demo")})`
    )
    assert.notInclude(file.stdout + file.stderr, "USAGE")
  })

  it("several run directories make one comparison page (--out); a folder without a run among them is refused", () => {
    const parent = mkdtempSync(join(tmpdir(), "report-compare-"))
    const runDir = (name: string, seed: number, mode: string, gain: number) => {
      const dir = join(parent, name)
      mkdirSync(dir)
      const records = [
        { phase: "eval", step: 0, elapsed: 10, figures: { "eval/accuracy": 0.4, "eval/accuracy_se": 0.02 } },
        ...[1, 2, 3].map((step) => ({
          phase: "train",
          step,
          elapsed: 10 + step * (mode === "async" ? 2 : 3),
          figures: { "rollout/reward_mean": step / 4, "rollout/accuracy": step / 5, "learner/loss": 0.1 }
        })),
        { phase: "eval", step: 3, elapsed: 30, figures: { "eval/accuracy": 0.4 + gain, "eval/accuracy_se": 0.02 } }
      ]
      writeFileSync(join(dir, "metrics.jsonl"), records.map((m) => JSON.stringify(m)).join("\n") + "\n")
      writeFileSync(
        join(dir, "config.json"),
        JSON.stringify({ seed, mode, output: dir, algorithm: { advantage: "grpo" } })
      )
      return dir
    }
    const sync = runDir("sync-1", 1, "sync", 0.2)
    const async = runDir("async-1", 1, "async", 0.25)
    const out = join(parent, "both.html")
    const said = execFileSync(
      process.execPath,
      [cli, "report", sync, async, "--out", out],
      {
        cwd: root,
        encoding: "utf8",
        timeout: 300_000
      }
    )
    assert.include(said, `wrote ${out} (2 runs compared)`)
    const html = readFileSync(out, "utf8")
    assert.include(html, "<title>agentfly runs: sync-1 · async-1</title>")
    // The table: RL time from the first evaluation to the last RL step (9 s and 6 s), the held-out change.
    assert.match(html, /<td class="name">sync-1<\/td><td>1<\/td><td>sync<\/td><td>grpo<\/td><td>3<\/td><td>9\.0<\/td>/)
    assert.match(
      html,
      /<td class="name">async-1<\/td><td>1<\/td><td>async<\/td><td>grpo<\/td><td>3<\/td><td>6\.0<\/td>/
    )
    assert.include(html, "<td>+0.250</td>")
    assert.include(html, `<b>async-1</b>: mode: &quot;sync&quot; → &quot;async&quot;`)
    // One series per run in each chart.
    const accuracy = html.split("<svg ").find((c) => c.includes("<title>Held-out accuracy over time</title>"))!
    assert.strictEqual(accuracy.split('class="series"').length - 1, 2)
    assert.include(html, "<title>Reward: train (sampled)</title>")

    const empty = mkdtempSync(join(tmpdir(), "report-empty-"))
    const refused = spawnSync(process.execPath, [cli, "report", sync, empty], {
      cwd: root,
      encoding: "utf8",
      timeout: 300_000
    })
    assert.strictEqual(refused.status, 1)
    assert.include(refused.stderr, `${empty} holds no training run`)
    const one = spawnSync(process.execPath, [cli, "report", sync, "--out", out], {
      cwd: root,
      encoding: "utf8",
      timeout: 300_000
    })
    assert.strictEqual(one.status, 1)
    assert.include(one.stderr, "--out is where a comparison of several runs goes")
  })
})
