#!/usr/bin/env -S MALLOC_ARENA_MAX=2 node
// The `agentfly` command. In a clone it runs the TypeScript CLI through tsx, so no build step stands between a clone
// and a run; in an installed package (no `cli/` sources beside `dist/`) it runs the compiled CLI. tsx is registered
// in both: it loads a user's own TypeScript modules (a config's `task.ts`) on Node 20, which cannot strip types.
// MALLOC_ARENA_MAX=2: glibc gives each thread that allocates its own malloc arena and keeps what the learner's
// worker threads free in them (−60…−120 MB peak RSS on the tiny preset's RL run, no measured slowdown). glibc reads
// it once at start, hence the shebang; `env` execs node, so the command keeps its PID (`kill` reaches the trainer).
import { existsSync } from "node:fs"
import { register } from "tsx/esm/api"

register()
const source = new URL("../cli/main.ts", import.meta.url)
await import(existsSync(source) ? source.href : new URL("../dist/cli/main.js", import.meta.url).href)
