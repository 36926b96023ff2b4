/**
 * Vitest's global setup: brings up what the integration tests need (Redis, a Docker engine, bubblewrap, Chromium
 * and the sandbox image) with `.ci/setup-services`, the same idempotent script CI runs, so that `npm test` passes
 * on a fresh machine with nothing started. It returns in well under a second when everything already runs.
 */
import { spawnSync } from "node:child_process"
import { dirname, resolve } from "node:path"
import { fileURLToPath } from "node:url"

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..")

export default function setup(): void {
  const started = Date.now()
  const run = spawnSync("bash", [resolve(root, ".ci/setup-services")], { cwd: root, encoding: "utf8" })
  if (run.status !== 0) {
    throw new Error(
      `.ci/setup-services failed (exit ${run.status}): the integration tests need Redis, Docker, bubblewrap and ` +
        `Chromium (it installs them with apt-get, as root). Its output:\n${run.stdout}${run.stderr}`
    )
  }
  const seconds = (Date.now() - started) / 1000
  if (seconds > 2) console.log(`test services ready in ${seconds.toFixed(1)} s (.ci/setup-services)`)
}
