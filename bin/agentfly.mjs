#!/usr/bin/env -S MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=1048576 node
// The `agentfly` command. In a clone it runs the TypeScript CLI through tsx, so no build step stands between a clone
// and a run; in an installed package (no `cli/` sources beside `dist/`) it runs the compiled CLI. tsx is registered
// in both: it loads a user's own TypeScript modules (a config's `task.ts`) on Node 20, which cannot strip types.
// MALLOC_ARENA_MAX=2: glibc gives each thread that allocates its own malloc arena and keeps what the learner's
// worker threads free in them (−60…−120 MB peak RSS on the tiny preset's RL run, no measured slowdown). glibc reads
// it once at start, hence the shebang; `env` execs node, so the command keeps its PID (`kill` reaches the trainer).
// MALLOC_MMAP_THRESHOLD_=1048576: blocks of 1 MiB and more come from mmap and go back to the system when freed. By
// default glibc raises the threshold to the largest block freed (up to 32 MiB), after which a learner step's
// activations stay resident once freed and the end-of-run gradient copies land on top of them: the peak is then at
// the run's end, where activation recompute (`learner.recompute`) cannot lower it (BENCHMARKS.md, "real shapes").
// In the shebang rather than a re-exec: one process, the same PID, and glibc reads it only at start.
import { existsSync } from "node:fs"
import { register } from "tsx/esm/api"

register()
const source = new URL("../cli/main.ts", import.meta.url)
await import(existsSync(source) ? source.href : new URL("../dist/cli/main.js", import.meta.url).href)
