#!/usr/bin/env -S MALLOC_ARENA_MAX=2 node
// The `agentfly` command. In a clone it runs the TypeScript CLI through tsx, so no build step stands between a clone
// and a run; in an installed package (no `cli/` sources beside `dist/`) it runs the compiled CLI, which registers
// tsx only when it loads a user's own module (a config's `task.ts`; src/internal/userModule.ts): Node 20 cannot strip
// types, and tsx's loader hooks, registered here, would cost every command ≈ 1.4 s of start-up.
// MALLOC_ARENA_MAX=2: glibc gives each thread that allocates its own malloc arena and keeps what the learner's
// worker threads free in them (−60…−120 MB peak RSS on the tiny preset's RL run, no measured slowdown). glibc reads
// it once at start, hence the shebang; `env` execs node, so the command keeps its PID (`kill` reaches the trainer).
// MALLOC_MMAP_THRESHOLD_ is not set here, though activation recompute (`learner.recompute`) needs it (1048576: blocks
// of 1 MiB and more then go back to the system when freed; glibc's default keeps a learner step's freed activations
// resident under its peak): fixed for every run, it made the demo's learner steps 1.4× slower (the tiny preset,
// micro-batches of 16 × 256 on 2 workers, BENCHMARKS.md "real shapes"). Node 20 cannot exec itself with it, and a
// child process would change the PID that `kill` reaches, so a large run sets it in its environment:
// `MALLOC_MMAP_THRESHOLD_=1048576 agentfly train …` (a run with `learner.recompute` and without it is warned).
import { existsSync } from "node:fs"

const source = new URL("../cli/main.ts", import.meta.url)
if (existsSync(source)) {
  const { register } = await import("tsx/esm/api")
  register()
  await import(source.href)
} else {
  await import(new URL("../dist/cli/main.js", import.meta.url).href)
}
