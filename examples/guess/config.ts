/**
 * The run config of `examples/guess/task.ts` (paths relative to this folder; `agentfly train examples/guess/task.ts
 * --seed N --output DIR` overrides seed and output). The task's defaults fill the agent settings.
 *
 * @since 0.1.0
 */
import type { TrainConfig } from "../../src/index.ts"

export const config = {
  name: "guess",
  seed: 1,
  output: "../../runs/guess",
  model: { path: "../../runs/models/guess-tiny", preset: "tiny", initSeed: 1 },
  data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
  agent: { numChains: 8, maxContextTokens: 512, temperature: 1 },
  warmup: {
    data: "data/demos.jsonl",
    steps: 800,
    lr: 0.002,
    warmupSteps: 50,
    batchSize: 16,
    stopAt: { data: "data/validation.jsonl", accuracy: 0.5, every: 25, from: 100, size: 100 }
  },
  algorithm: { steps: 150, groupsPerStep: 8, lr: 0.0003, lrSchedule: "cosine", microBatchSize: 16 },
  eval: { every: 50, size: 300, temperature: 1 },
  checkpoint: { every: 50 },
  learner: { workers: 2, sharePrefix: false }
} satisfies TrainConfig.Input
