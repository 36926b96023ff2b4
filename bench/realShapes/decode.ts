/**
 * Decoding tokens/s of one model folder, our engine beside llama.cpp on the same weights, one process per call (its
 * peak RSS its own): `node --import tsx bench/realShapes/decode.ts FOLDER THREADS ours|llama [GGUF]` prints one
 * JSON line. Batch 1: one greedy sequence, a 16-token prompt, 64 new tokens; batch 8: eight such sequences at once.
 * Tokens/s count new tokens over the wall time including the prompts' prefill (the same for both engines). `ours`
 * also times loading the folder and building the engine.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { getLlama, LlamaLogLevel, type Token } from "node-llama-cpp"
import * as PolicyEngine from "../../actors/PolicyEngine.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"

const [folder, threadsArg, engine, gguf] = process.argv.slice(2)
const threads = Number(threadsArg)
const newTokens = 64
const prompt = (i: number) => Array.from({ length: 16 }, (_, k) => 1000 + 37 * i + 11 * k)
const peakGiB = () => process.resourceUsage().maxRSS * 1024 / 1024 ** 3
const seconds = (t0: number) => (performance.now() - t0) / 1000

const ours = Effect.gen(function*() {
  const t0 = performance.now()
  const model = yield* ModelFolder.load(folder!)
  const loadS = seconds(t0)
  const t1 = performance.now()
  const policy = yield* PolicyEngine.make({
    config: model.config,
    weights: model.weights,
    maxBatchSize: 8,
    intraOpNumThreads: threads
  })
  const generate = (i: number) =>
    policy.generate({ promptTokenIds: prompt(i), sampling: { temperature: 0, maxTokens: newTokens, stopTokenIds: [] } })
  yield* generate(99) // the first step of a new session is slow everywhere
  const engineS = seconds(t1)
  const t2 = performance.now()
  yield* generate(0)
  const batch1 = newTokens / seconds(t2)
  const t3 = performance.now()
  yield* Effect.all(Array.from({ length: 8 }, (_, i) => generate(i)), { concurrency: "unbounded" })
  const batch8 = 8 * newTokens / seconds(t3)
  return { engine: "ours", loadS, engineS, batch1, batch8, peakGiB: peakGiB() }
}).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

const llama = async () => {
  const engine = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: threads })
  const model = await engine.loadModel({ modelPath: gguf!, gpuLayers: 0 })
  const context = await model.createContext({ contextSize: 8 * 256, sequences: 8, threads, batchSize: 512 })
  const run = async (i: number) => {
    const sequence = context.getSequence()
    let n = 0
    for await (const _ of sequence.evaluate(prompt(i) as Array<Token>, { temperature: 0 })) {
      if (++n >= newTokens) break
    }
    sequence.dispose()
  }
  await run(99)
  const t2 = performance.now()
  await run(0)
  const batch1 = newTokens / seconds(t2)
  const t3 = performance.now()
  await Promise.all(Array.from({ length: 8 }, (_, i) => run(i)))
  const batch8 = 8 * newTokens / seconds(t3)
  await context.dispose()
  await model.dispose()
  return { engine: "llama.cpp", batch1, batch8, peakGiB: peakGiB() }
}

const result = engine === "ours" ? await Effect.runPromise(ours) : await llama()
console.log(JSON.stringify(result))
