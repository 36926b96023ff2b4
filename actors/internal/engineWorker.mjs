// Worker-thread entry of the engine thread: loads the TypeScript worker through tsx (see
// `src/backends/internal/trainerWorker.mjs` for why not `execArgv`).
import { tsImport } from "tsx/esm/api"

await tsImport("./engineWorker.ts", import.meta.url)
