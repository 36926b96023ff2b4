// A worker thread reporting `OptimNative.threads` as a learner worker sees it (loaded through tsx, as
// `trainerWorker.mjs` loads the worker).
import { parentPort } from "node:worker_threads"
import { tsImport } from "tsx/esm/api"

const optimNative = await tsImport("../../src/internal/optimNative.ts", import.meta.url)
parentPort.postMessage(optimNative.threads)
