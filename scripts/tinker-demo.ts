/**
 * `npm run demo` through the Tinker API: the README's demo config (`examples/calculator/demo.json`, its data as
 * `npm run demo` generates it) with `learner.backend: "tinker"`, against our Tinker server (`actors/tinker/`) on
 * loopback in this process, serving the demo's model folder with the config's `learner.workers` (the learner's
 * threads: data parallelism sums in another order). Prints the held-out figures, as `npm run demo` does.
 *
 *   npx tsx scripts/tinker-demo.ts          # after `npm run demo` (its data and model folder), or on its own
 *   npx tsx scripts/tinker-demo.ts --local  # the run to compare with: the same config in this process with
 *                                           # `learner.sharePrefix: false` (a Tinker run's packing: whole rows)
 *
 * Output: `runs/calculator-demo-tinker` (the run), `runs/calculator-demo-tinker-state` (the server's state);
 * `--local`: `runs/calculator-demo-local-whole-rows`.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { execFileSync } from "node:child_process"
import { existsSync, readFileSync, rmSync } from "node:fs"
import { resolve } from "node:path"
import * as Models from "../actors/tinker/Models.ts"
import * as TinkerServer from "../actors/tinker/TinkerServer.ts"
import * as Train from "../actors/Train.ts"
import { task } from "../environments/calculator/CalculatorTask.ts"
import * as ModelFolder from "../src/ModelFolder.ts"

const root = resolve(import.meta.dirname, "..")
const dir = resolve(root, "examples/calculator")
const demo = JSON.parse(readFileSync(resolve(dir, "demo.json"), "utf8"))
const modelPath = resolve(dir, demo.model.path)
const stateDir = resolve(root, "runs/calculator-demo-tinker-state")
const local = process.argv.includes("--local")

// The demo's data, exactly as `npm run demo` writes it (left as it is when `npm run demo` wrote it already).
if (!existsSync(resolve(dir, "data/train.jsonl"))) {
  execFileSync(process.execPath, [
    "--import",
    "tsx",
    "examples/calculator/generate.ts",
    "examples/calculator/data",
    "12345",
    "0.5",
    "--kind",
    "sums"
  ], { cwd: root, stdio: "inherit" })
}
if (!local) rmSync(stateDir, { recursive: true, force: true })

const program = Effect.gen(function*() {
  if (!existsSync(resolve(modelPath, "config.json"))) {
    yield* ModelFolder.init(modelPath, { preset: demo.model.preset, seed: demo.model.initSeed })
  }
  const folder = yield* ModelFolder.load(modelPath)
  const workers = demo.learner.workers
  const server = local ? undefined : yield* TinkerServer.serve({
    bases: [Models.baseOf("calculator-demo-tiny", folder)],
    stateDir,
    workers
  })
  const calculator = yield* task(demo.task.options)
  const started = performance.now()
  const learner = server === undefined ?
    { ...demo.learner, sharePrefix: false } :
    { ...demo.learner, backend: "tinker", tinker: { baseUrl: server.baseUrl, baseModel: "calculator-demo-tiny" } }
  const result = yield* Train.run({
    task: calculator,
    dir,
    config: {
      ...demo,
      output: local ? "../../runs/calculator-demo-local-whole-rows" : "../../runs/calculator-demo-tinker",
      learner
    },
    overwrite: true,
    write: (text: string) => void process.stdout.write(text),
    tty: false
  })
  const evals = result.summary.evals.map(({ step, figures }) => `step ${step}: ${figures["eval/accuracy"]}`)
  const seconds = ((performance.now() - started) / 1000).toFixed(0)
  const how = local ? "in this process, whole rows" : `through the Tinker API, ${workers} learner workers`
  console.log(`held-out accuracy ${how}: ${evals.join(", ")} (${seconds} s)`)
})

Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(NodeServices.layer))).catch((e) => {
  console.error(e)
  process.exit(1)
})
