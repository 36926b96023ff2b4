#!/usr/bin/env node
// The `agentfly` command: loads the TypeScript CLI through tsx, so no build step stands between a clone and a run.
import { register } from "tsx/esm/api"

register()
await import("../cli/main.ts")
