import { assert, describe, it } from "@effect/vitest"
import { execFileSync } from "node:child_process"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
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
})
