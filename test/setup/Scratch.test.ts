import { spawnSync } from "node:child_process"
import { tmpdir } from "node:os"
import { basename, dirname } from "node:path"
import { describe, expect, it } from "vitest"

describe("the test run's scratch folder", () => {
  it("is what os.tmpdir() gives tests and the processes they start", () => {
    expect(basename(tmpdir())).toMatch(/^agentfly-tests-/)
    const child = spawnSync(process.execPath, ["-e", "process.stdout.write(require('node:os').tmpdir())"], {
      encoding: "utf8"
    })
    expect(child.stdout).toBe(tmpdir())
    expect(dirname(tmpdir())).not.toBe(tmpdir())
  })
})
