/**
 * `bench/losses.ts` off-policy: each RL step split into 4 optimiser steps (`algorithm.miniBatches: 4`), so that all
 * but the first train on samples of an older policy and the ratios the losses clip move away from 1. Every loss of
 * a seed starts from that seed's warm-up checkpoint (run `npm run bench -- losses` with `LOSSES=grpo` first).
 *
 * `nice -n 10 npm run bench -- losses-offpolicy` (env `LOSSES`, `SEEDS` as for `losses`).
 */
import type { BenchResult } from "./run.ts"
import losses from "./losses.ts"

export default (): Promise<BenchResult> => losses(4)
