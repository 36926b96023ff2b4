/**
 * Vitest's global setup: one scratch folder per test run, removed when the run ends. Every test that writes under
 * `os.tmpdir()` (which reads `TMPDIR` on each call) writes inside it, and so do the processes the tests start, which
 * inherit the variable: a test that forgets its `afterAll` leaves nothing behind (runs used to leave gigabytes of
 * exported models and run folders in /tmp).
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

export default function setup(): () => void {
  const scratch = mkdtempSync(join(tmpdir(), "agentfly-tests-"))
  const previous = process.env["TMPDIR"]
  process.env["TMPDIR"] = scratch
  return () => {
    if (previous === undefined) delete process.env["TMPDIR"]
    else process.env["TMPDIR"] = previous
    rmSync(scratch, { recursive: true, force: true, maxRetries: 3 })
  }
}
