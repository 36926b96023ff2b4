import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Starts Redis, Docker and the rest on a fresh machine (idempotent): the test command needs nothing running.
    // and gives the run one scratch folder under /tmp, removed at its end (test/setup/scratch.ts); the commands the
    // tests run are compiled first (test/setup/cli.ts).
    globalSetup: ["test/setup/services.ts", "test/setup/scratch.ts", "test/setup/cli.ts"],
    // Generous: a limit for a hung test, never a measure of speed (the suite passes beside a CPU hog).
    testTimeout: 300_000,
    hookTimeout: 300_000,
    // 2-core machines: a few forks keep CPU-bound ONNX tests from starving each other.
    pool: "forks",
    maxWorkers: 2
  }
})
