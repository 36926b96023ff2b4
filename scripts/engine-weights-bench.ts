/**
 * Decoding tokens/s of the full fine-tuning engine with its weights as pre-packed initializers (onnxruntime's copy:
 * `engine.weights: "initializers"`) against fed as inputs (the published version's arrays, `FusedMatMul` with
 * `transB`: `"inputs"`), in one process, the two alternated round after round so that both see the same load:
 *
 *   npx tsx scripts/engine-weights-bench.ts (--preset small | --folder DIR) [--rounds 3] [--tokens 32]
 *
 * Batch 1: one greedy sequence, a 16-token prompt, `--tokens` new tokens; batch 8: eight at once. Tokens/s count new
 * tokens over the wall time including the prefill. Also times building each engine and a new version
 * (`updateWeights`: initializers, a new session; inputs, new feeds), checks that both sample the same greedy tokens,
 * and reads the process's RSS after each engine is built. Prints one JSON line per round and a summary.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { readFileSync } from "node:fs"
import * as PolicyEngine from "../actors/PolicyEngine.ts"
import * as DecodeRounds from "./decodeRounds.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"

const arg = (name: string) => {
  const i = process.argv.indexOf(`--${name}`)
  return i < 0 ? undefined : process.argv[i + 1]
}
const rounds = Number(arg("rounds") ?? 3)
const newTokens = Number(arg("tokens") ?? 32)
const seconds = (t0: number) => (performance.now() - t0) / 1000
const rssGiB = () => +(Number(/VmRSS:\s+(\d+)/.exec(readFileSync("/proc/self/status", "utf8"))![1]) / 1024 ** 2)
  .toFixed(2)
const modes = ["initializers", "inputs"] as const

/** A second version: every weight scaled a little (a new array each: what a learner publishes). */
const nextVersion = (w: Qwen2.Weights): Qwen2.Weights =>
  new Map([...w].map(([name, data]) => [name, data.map((x) => x * 1.001)]))

const main = Effect.gen(function*() {
  const folder = arg("folder")
  const { config: c, weights: loaded } = folder !== undefined
    ? yield* ModelFolder.load(folder)
    : { config: ModelConfig.presets[arg("preset") as keyof typeof ModelConfig.presets], weights: undefined }
  const weights: Qwen2.Weights = loaded ?? Qwen2.initWeights(c, 1)
  const threads = PolicyEngine.defaultThreads(c)
  const engines: Record<string, PolicyEngine.PolicyEngine["Service"]> = {}
  const build: Record<string, number> = {}
  const version: Record<string, number> = {}
  const rss: Record<string, number> = { weights: rssGiB() }
  const next = nextVersion(weights)
  rss["twoVersions"] = rssGiB()
  for (const mode of modes) {
    const t0 = performance.now()
    engines[mode] = yield* PolicyEngine.make({
      config: c,
      weights,
      weightsAs: mode,
      maxBatchSize: 8,
      intraOpNumThreads: threads
    })
    build[mode] = seconds(t0)
    rss[mode] = rssGiB()
    const t1 = performance.now()
    yield* engines[mode].updateWeights(1, next)
    version[mode] = seconds(t1)
  }
  const { same, results } = yield* DecodeRounds.alternate(engines, modes, { rounds, newTokens, vocabSize: c.vocabSize })
  const of = (mode: string, key: "batch1" | "batch8") => results.filter((r) => r.mode === mode).map((r) => r[key])
  const median = (xs: Array<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
  const ratios = (key: "batch1" | "batch8") =>
    of("inputs", key).map((x, i) => +(x / of("initializers", key)[i]!).toFixed(3))
  console.log(JSON.stringify({
    model: folder ?? arg("preset"),
    threads,
    newTokens,
    sameGreedyTokens: same,
    buildS: build,
    newVersionS: version,
    rssGiBAfter: rss,
    best: Object.fromEntries(modes.map((m) => [m, { batch1: Math.max(...of(m, "batch1")), batch8: Math.max(...of(m, "batch8")) }])),
    ratioPerRound: { batch1: ratios("batch1"), batch8: ratios("batch8") },
    medianRatio: { batch1: median(ratios("batch1")), batch8: median(ratios("batch8")) },
    peakRssGiB: +(process.resourceUsage().maxRSS / 1024 ** 2).toFixed(2)
  }))
}).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

Effect.runPromise(main).catch((e) => {
  console.error(e)
  process.exit(1)
})
