/**
 * Decoding tokens/s of a LoRA run's engine, the adapter merged (`W + s·B·A` as initializers: what LoRA engines did
 * before) against unmerged (the base's arrays fed as inputs, the adapter beside them: what they do now), in one
 * process, the two alternated round after round so that both see the same machine load:
 *
 *   npx tsx scripts/lora-engine-bench.ts (--preset small | --folder DIR) [--rounds 3] [--tokens 32] [--rank 16]
 *
 * Rank `--rank` on all seven projections, `B` random (non-zero). Batch 1: one greedy sequence, a 16-token prompt,
 * `--tokens` new tokens; batch 8: eight at once. Tokens/s count new tokens over the wall time including the prefill.
 * Also times a new version (`updateWeights`: merged, the merge and a session; unmerged, the adapter's feeds) and
 * checks that both engines sample the same tokens. Prints one JSON line per round and a summary.
 */
import { NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import * as PolicyEngine from "../actors/PolicyEngine.ts"
import * as DecodeRounds from "./decodeRounds.ts"
import * as Lora from "../src/Lora.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Sampling from "../src/Sampling.ts"

const arg = (name: string) => {
  const i = process.argv.indexOf(`--${name}`)
  return i < 0 ? undefined : process.argv[i + 1]
}
const rounds = Number(arg("rounds") ?? 3)
const newTokens = Number(arg("tokens") ?? 32)
const rank = Number(arg("rank") ?? 16)
const seconds = (t0: number) => (performance.now() - t0) / 1000

const adapterOf = (c: ModelConfig.ModelConfig, lora: Lora.Config, seed: number) => {
  const out = Lora.init(c, { ...lora, seed })
  const r = Sampling.rng(seed + 100)
  for (const [name, data] of out) {
    if (name.endsWith("lora_B.weight")) for (let i = 0; i < data.length; i++) data[i] = Sampling.normal(r) * 0.01
  }
  return out
}

const main = Effect.gen(function*() {
  const folder = arg("folder")
  const { config: c, weights: base } = folder !== undefined
    ? yield* ModelFolder.load(folder)
    : { config: ModelConfig.presets[arg("preset") as keyof typeof ModelConfig.presets], weights: undefined }
  const baseWeights: Qwen2.Weights = base ?? Qwen2.initWeights(c, 1)
  const lora: Lora.Config = { rank, alpha: 2 * rank, targets: [...Lora.moduleNames] }
  const threads = PolicyEngine.defaultThreads(c)
  const engines: Record<string, PolicyEngine.PolicyEngine["Service"]> = {}
  const build: Record<string, number> = {}
  const version: Record<string, number> = {}
  for (const mode of ["merged", "unmerged"] as const) {
    const a = adapterOf(c, lora, 1)
    const t0 = performance.now()
    engines[mode] = yield* PolicyEngine.make({
      config: c,
      weights: mode === "merged" ? Lora.merge(c, lora, baseWeights, a) : new Map([...baseWeights, ...a]),
      maxBatchSize: 8,
      intraOpNumThreads: threads,
      ...(mode === "unmerged" ? { lora } : {})
    })
    build[mode] = seconds(t0)
    const a2 = adapterOf(c, lora, 2)
    const t1 = performance.now()
    yield* engines[mode].updateWeights(
      1,
      mode === "merged" ? Lora.merge(c, lora, baseWeights, a2) : new Map([...baseWeights, ...a2])
    )
    version[mode] = seconds(t1)
  }
  const { same, results } = yield* DecodeRounds.alternate(engines, ["merged", "unmerged"], {
    rounds,
    newTokens,
    vocabSize: c.vocabSize
  })
  const best = (mode: string, key: "batch1" | "batch8") =>
    Math.max(...results.filter((r) => r.mode === mode).map((r) => r[key]))
  console.log(JSON.stringify({
    model: folder ?? arg("preset"),
    threads,
    rank,
    newTokens,
    sameGreedyTokens: same,
    buildS: build,
    newVersionS: version,
    best: Object.fromEntries(
      ["merged", "unmerged"].map((m) => [m, { batch1: best(m, "batch1"), batch8: best(m, "batch8") }])
    ),
    peakRssGiB: +(process.resourceUsage().maxRSS / 1024 ** 2).toFixed(2)
  }))
}).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

Effect.runPromise(main).catch((e) => {
  console.error(e)
  process.exit(1)
})
