/**
 * Time to load a model folder into the learner: `node --import tsx bench/realShapes/learnerLoad.ts FOLDER` prints
 * one JSON line: reading the folder (`ModelFolder.load`: tokenizer, template, BF16 weights widened) and building the
 * learner over its weights (`OnnxTrainer.make`: shared weight buffers, AdamW state, worker threads).
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as Loss from "../../src/Loss.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Optimizer from "../../src/Optimizer.ts"

const program = Effect.gen(function*() {
  const t0 = performance.now()
  const folder = yield* ModelFolder.load(process.argv[2]!)
  const readS = (performance.now() - t0) / 1000
  const t1 = performance.now()
  yield* OnnxTrainer.make({
    model: OnnxTrainer.qwen2(folder.config),
    weights: folder.weights,
    loss: Loss.sft,
    optimizer: Optimizer.defaultConfig,
    schedule: LrSchedule.constant(1e-5),
    workers: 1
  })
  const makeS = (performance.now() - t1) / 1000
  return { readS, makeS, totalS: readS + makeS, peakGiB: process.resourceUsage().maxRSS / 1024 ** 2 }
}).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

console.log(JSON.stringify(await Effect.runPromise(program)))
