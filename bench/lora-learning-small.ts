/**
 * `npm run bench -- lora-learning-small`: `bench/lora-learning.ts` on the `small` preset (the figure), its
 * results in `bench/results/lora-learning-small.json`. `LORA_STEPS`, `LORA_EVAL`, `LORA_LRS`, `LORA_SEEDS`,
 * `LORA_FULL_LR`, `LORA_ARMS`, `LORA_BASE` / `LORA_MODEL` (an existing warm-up) as there.
 */
import type { BenchResult } from "./run.ts"

export default async (): Promise<BenchResult> => {
  process.env["LORA_PRESET"] ??= "small"
  const bench = await import("./lora-learning.ts")
  return bench.default()
}
