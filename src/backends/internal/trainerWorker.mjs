// Worker-thread entry of the data-parallel trainer: loads the TypeScript worker through tsx, which works the same
// under the CLI (tsx), vitest and plain node (a worker's `execArgv: ["--import", "tsx"]` does not reach the worker's
// own module loader on Node 20).
import { tsImport } from "tsx/esm/api"

await tsImport("./trainerWorker.ts", import.meta.url)
