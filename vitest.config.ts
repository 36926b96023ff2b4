import { defineConfig } from "vitest/config"

/** What every test file gets. */
const common = {
  // Generous: a limit for a hung test, never a measure of speed (the suite passes beside a CPU hog).
  testTimeout: 300_000,
  hookTimeout: 300_000,
  // 2-core machines: a few forks keep CPU-bound ONNX tests from starving each other.
  pool: "forks"
} as const

/**
 * Files that get a fresh process each: `vi.mock` replaces modules that other files would have loaded already, and the
 * parity tests hold llama.cpp and models at published shapes in the test process itself.
 */
const isolated = ["test/actors/LocalPolicyWeights.test.ts", "test/parity/**/*.test.ts"]

export default defineConfig({
  test: {
    // Starts Redis, Docker and the rest on a fresh machine (idempotent): the test command needs nothing running.
    // and gives the run one scratch folder under /tmp, removed at its end (test/setup/scratch.ts); the commands the
    // tests run are compiled first (test/setup/cli.ts). The projects do not extend this config (vitest 4's inline
    // projects do not by default), so these run once, not once a project.
    globalSetup: ["test/setup/services.ts", "test/setup/scratch.ts", "test/setup/cli.ts"],
    maxWorkers: 2,
    projects: [
      // Every other file runs in one of the forks it shares with the files before it: their modules (effect,
      // onnxruntime, the runtime's own) are loaded once a fork, not once a file (≈ 2 s a file on 2 cores).
      { test: { ...common, name: "shared", include: ["test/**/*.test.ts"], exclude: isolated, isolate: false } },
      { test: { ...common, name: "isolated", include: isolated } }
    ]
  }
})
