#!/usr/bin/env -S MALLOC_ARENA_MAX=2 node
// The `agentfly` command: loads the TypeScript CLI through tsx, so no build step stands between a clone and a run.
// MALLOC_ARENA_MAX=2: glibc gives each thread that allocates its own malloc arena and keeps what the learner's
// worker threads free in them (−60…−120 MB peak RSS on the tiny preset's RL run, no measured slowdown). glibc reads
// it once at start, hence the shebang; `env` execs node, so the command keeps its PID (`kill` reaches the trainer).
import { register } from "tsx/esm/api"

register()
await import("../cli/main.ts")
