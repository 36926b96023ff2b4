#!/usr/bin/env node
/**
 * Builds the native kernels (`native/kernels.c` → `native/build/kernels.node`) with the machine's C compiler and
 * Node's own headers, at `npm install` (the package's `install` script). Optional: where there is no compiler or no
 * headers it says so and exits 0, and the loops and the WebAssembly kernel run instead (`nativeKernels.ts`).
 * `AGENTFLY_NATIVE=0` skips the build. No node-gyp: one C file, one compiler call, nothing downloaded.
 */
import { spawnSync } from "node:child_process"
import { existsSync, mkdirSync, renameSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const here = dirname(fileURLToPath(import.meta.url))
const out = join(here, "build", "kernels.node")

const say = (line) => console.error(`agentfly: ${line}`)

if (process.env.AGENTFLY_NATIVE === "0") {
  say("AGENTFLY_NATIVE=0: the native kernels are not built (the JavaScript and WebAssembly loops run instead)")
  process.exit(0)
}
if (process.platform === "win32") {
  say("no native optimiser addon on Windows (the JavaScript and WebAssembly loops run instead)")
  process.exit(0)
}

// Node's headers: beside the running node (official builds, Debian's /usr), or npm's `nodedir`.
const includes = [
  join(dirname(process.execPath), "..", "include", "node"),
  ...(process.env.npm_config_nodedir ? [join(process.env.npm_config_nodedir, "include", "node")] : [])
].filter((dir) => existsSync(join(dir, "node_api.h")))
if (includes.length === 0) {
  say("Node's headers (node_api.h) not found: the native kernels are not built (the JavaScript loops run)")
  process.exit(0)
}

mkdirSync(join(here, "build"), { recursive: true })
const compiler = process.env.CC ?? "cc"
const args = [
  "-O3",
  "-std=c11",
  "-fPIC",
  "-shared",
  // Bit-identical to the JavaScript loops: no fused multiply-adds, no reassociation.
  "-ffp-contract=off",
  "-fno-fast-math",
  "-pthread",
  `-I${includes[0]}`,
  ...(process.platform === "darwin" ? ["-undefined", "dynamic_lookup"] : []),
  join(here, "kernels.c"),
  "-o",
  `${out}.tmp`,
  "-lm"
]
const result = spawnSync(compiler, args, { stdio: ["ignore", "inherit", "inherit"] })
if (result.error !== undefined || result.status !== 0) {
  const why = result.error?.message ?? `${compiler} exited with ${result.status}`
  say(`the native kernels were not built (${why}); the JavaScript and WebAssembly loops run instead`)
  process.exit(0)
}
renameSync(`${out}.tmp`, out)
say(`built ${out}`)
