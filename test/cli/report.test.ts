import { assert, describe, it } from "@effect/vitest"
import { execFileSync, spawnSync } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"

const root = resolve(import.meta.dirname, "../..")

describe("agentfly report", () => {
  it("regenerates report.html from a run directory's files", () => {
    const dir = mkdtempSync(join(tmpdir(), "report-cli-"))
    const metrics = [0, 1, 2].map((step) => ({
      phase: "train",
      step,
      elapsed: step,
      figures: { "rollout/reward_mean": step / 4 }
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
