import { assert, describe, it } from "@effect/vitest"
import { execFileSync, spawnSync } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"

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
    const out = execFileSync(process.execPath, ["--import", "tsx", "cli/main.ts", "report", dir], {
      cwd: root,
      encoding: "utf8",
      timeout: 60_000
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
      const result = spawnSync(process.execPath, ["--import", "tsx", "cli/main.ts", "report", dir], {
        cwd: root,
        encoding: "utf8",
        timeout: 60_000
      })
      assert.strictEqual(result.status, 1)
      assert.include(result.stderr, says)
      assert.notInclude(result.stderr, "PlatformError")
    }
    assert.isFalse(existsSync(join(empty, "report.html")))
  })
})
