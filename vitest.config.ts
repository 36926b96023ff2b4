import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Starts Redis, Docker and the rest on a fresh machine (idempotent): the test command needs nothing running.
    globalSetup: ["test/setup/services.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // 2-core machines: a few forks keep CPU-bound ONNX tests from starving each other.
    pool: "forks",
    maxWorkers: 2
  }
})
