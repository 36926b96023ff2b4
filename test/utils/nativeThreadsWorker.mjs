// A worker thread reporting `NativeKernels.threads` as a learner worker sees it (loaded through tsx, as
// `trainerWorker.mjs` loads the worker).
import { parentPort } from "node:worker_threads"
import { tsImport } from "tsx/esm/api"

const nativeKernels = await tsImport("../../src/internal/nativeKernels.ts", import.meta.url)
parentPort.postMessage(nativeKernels.threads)
