/**
 * `npm run bench -- server`
 *
 * Fair scheduling in `agentfly serve` (`actors/OpenAiServer.ts`): the latency of a small request (one prompt of 8
 * token ids, 16 new tokens) sent while one large request (20,000 such prompts in one `/v1/completions`) is being
 * served, against the same small request on an idle server, over loopback HTTP on the tiny preset (engine batch 32,
 * one onnxruntime thread). Every completion is exactly 16 tokens (`ignore_eos`).
 *
 * - `alone`: median latency of `SMALL` small requests sent one after another on an idle server, measured right before
 *   and right after the headline's beside round (the baseline is their mean: the machine is shared and drifts).
 * - `beside.defaults`: the same small requests while the large request runs, on a server with the default options
 *   (`maxRunning` 32 and `maxRunningPerRequest` from `OpenAiServer.defaults`); `beside.firstCome`: what the server
 *   did before (every sequence handed to the engine at once, first come first served), one small request, its wait
 *   cut at `FIRST_COME_CUTOFF_S`.
 * - `perRequestCap`: for `maxRunningPerRequest` 4, 6, 8 and 32 (32: turns only, the large request may fill the batch),
 *   the small request's latency beside the large one, and the engine's tokens/s with the large request alone over
 *   `LARGE_WINDOW_S` (what the cap costs a lone many-prompt request). The large request is cut off (the client
 *   disconnects, which cancels its sequences) once a round has what it measures.
 *
 * Headline: small-beside-large ÷ small alone with the default options (target ≤ 2: one large request may not
 * starve a small one). The load average is reported because the machine is shared.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Effect, FileSystem } from "effect"
import { loadavg } from "node:os"
import * as OpenAiServer from "../actors/OpenAiServer.ts"
import * as PolicyEngine from "../actors/PolicyEngine.ts"
import * as ModelFolder from "../src/ModelFolder.ts"

const LARGE = 20_000
const SMALL = 15
const NEW_TOKENS = 16
const LARGE_WINDOW_S = 3
const FIRST_COME_CUTOFF_S = 20

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const prompt = (i: number) => Array.from({ length: 8 }, (_, k) => 20 + ((i * 7 + k * 13) % 200))
const body = (prompts: ReadonlyArray<ReadonlyArray<number>>, seed: number) =>
  JSON.stringify({ prompt: prompts, max_tokens: NEW_TOKENS, ignore_eos: true, temperature: 1, seed })

/** One small request's latency in ms, or `cutoff` (censored) if it takes longer. */
const small = (baseUrl: string, i: number, cutoffMs = 60_000) =>
  Effect.promise(async () => {
    const start = performance.now()
    const response = await fetch(`${baseUrl}/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: body([prompt(100_000 + i)], i),
      signal: AbortSignal.timeout(cutoffMs)
    }).catch(() => undefined)
    if (response === undefined) return cutoffMs
    const json = (await response.json()) as { choices: Array<{ token_ids: Array<number> }> }
    if (json.choices[0]!.token_ids.length !== NEW_TOKENS) throw new Error(`bad small response ${JSON.stringify(json)}`)
    return performance.now() - start
  })

/** Sends the large request; `stop()` disconnects it (the server then cancels its sequences). */
const startLarge = (baseUrl: string) => {
  const controller = new AbortController()
  const done = fetch(`${baseUrl}/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: body(Array.from({ length: LARGE }, (_, i) => prompt(i)), 1),
    signal: controller.signal
  }).then((r) => r.status, () => "aborted" as const)
  return { stop: () => controller.abort(), done }
}

const tokens = (engine: PolicyEngine.PolicyEngine["Service"]) =>
  Effect.map(engine.stats, (s) => s.generatedTokens)

/** Waits until the engine has sequences of the large request running, or until it is idle again. */
const until = (engine: PolicyEngine.PolicyEngine["Service"], busy: boolean) =>
  Effect.gen(function*() {
    for (;;) {
      const running = Object.values((yield* engine.stats).running).reduce((a, b) => a + b, 0)
      if (busy ? running > 0 : running === 0) return
      yield* Effect.sleep("20 millis")
    }
  })

const aloneRound = (baseUrl: string, offset: number) =>
  Effect.gen(function*() {
    const xs: Array<number> = []
    for (let i = 0; i < SMALL; i++) xs.push(yield* small(baseUrl, offset + i))
    return median(xs)
  })

/** Small requests one after another beside the large one; the large one's share of the engine meanwhile. */
const besideRound = (engine: PolicyEngine.PolicyEngine["Service"], baseUrl: string, count: number, cutoffMs?: number) =>
  Effect.gen(function*() {
    const large = startLarge(baseUrl)
    yield* until(engine, true)
    yield* Effect.sleep("300 millis")
    const before = yield* tokens(engine), start = performance.now()
    const xs: Array<number> = []
    for (let i = 0; i < count; i++) xs.push(yield* small(baseUrl, 1000 + i, cutoffMs))
    const tokensPerSecond = ((yield* tokens(engine)) - before) / ((performance.now() - start) / 1000)
    large.stop()
    yield* Effect.promise(() => large.done)
    yield* until(engine, false)
    return { medianMs: median(xs), latenciesMs: xs, engineTokensPerSecond: tokensPerSecond }
  })

/** The engine's tokens/s with the large request alone. */
const largeRound = (engine: PolicyEngine.PolicyEngine["Service"], baseUrl: string) =>
  Effect.gen(function*() {
    const large = startLarge(baseUrl)
    yield* until(engine, true)
    yield* Effect.sleep("300 millis")
    const before = yield* tokens(engine), start = performance.now()
    yield* Effect.sleep(`${LARGE_WINDOW_S} seconds`)
    const tokensPerSecond = ((yield* tokens(engine)) - before) / ((performance.now() - start) / 1000)
    large.stop()
    yield* Effect.promise(() => large.done)
    yield* until(engine, false)
    return tokensPerSecond
  })

const figures = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-bench-server-" })}/tiny`
  yield* ModelFolder.init(dir, { preset: "tiny", seed: 1 })
  const folder = yield* ModelFolder.load(dir)
  const engine = yield* PolicyEngine.make({ config: folder.config, weights: folder.weights, maxBatchSize: 32 })
  const serve = (options: OpenAiServer.Options) =>
    Effect.map(
      OpenAiServer.make(folder, options).pipe(Effect.provideService(PolicyEngine.PolicyEngine, engine)),
      (s) => s.baseUrl
    )
  const caps = [4, 6, 8, 32]
  const servers = yield* Effect.forEach(caps, (cap) => serve({ maxRunningPerRequest: cap }))
  const fair = yield* serve({})
  // Before fair scheduling every sequence went to the engine's first-come queue at once.
  const firstCome = yield* serve({ maxRunning: 1e9, maxRunningPerRequest: 1e9 })

  yield* aloneRound(fair, 0) // warm-up: sessions, JIT
  // Each beside round is compared with alone rounds measured right next to it: the machine is shared and drifts.
  const aloneBefore = yield* aloneRound(fair, 0)
  const besideFair = yield* besideRound(engine, fair, SMALL)
  const aloneAfter = yield* aloneRound(fair, 0)
  const alone = (aloneBefore + aloneAfter) / 2
  const sweep: Array<{ cap: number; aloneMs: number; besideMs: number; largeTokensPerSecond: number }> = []
  for (const [k, cap] of caps.entries()) {
    const aloneMs = yield* aloneRound(servers[k]!, 0)
    const beside = yield* besideRound(engine, servers[k]!, SMALL)
    const largeTokensPerSecond = yield* largeRound(engine, servers[k]!)
    sweep.push({ cap, aloneMs, besideMs: beside.medianMs, largeTokensPerSecond })
  }
  const firstComeAlone = yield* aloneRound(firstCome, 0)
  const besideFirstCome = yield* besideRound(engine, firstCome, 1, FIRST_COME_CUTOFF_S * 1000)
  const wholeBatch = sweep.at(-1)!.largeTokensPerSecond
  return {
    ratio: besideFair.medianMs / alone,
    alone: { medianMs: alone, beforeMs: aloneBefore, afterMs: aloneAfter },
    beside: {
      defaults: { ...besideFair, ratio: besideFair.medianMs / alone },
      firstCome: {
        ...besideFirstCome,
        aloneMs: firstComeAlone,
        ratio: besideFirstCome.medianMs / firstComeAlone,
        censored: besideFirstCome.medianMs >= FIRST_COME_CUTOFF_S * 1000
      }
    },
    // Per maxRunningPerRequest: the small request's latency beside the large one (÷ alone, measured just before), and
    // the large request's tokens/s alone (÷ with the whole batch, cap 32).
    perRequestCap: sweep.map((r) => ({
      ...r,
      besideRatio: r.besideMs / r.aloneMs,
      largeThroughputRatio: r.largeTokensPerSecond / wholeBatch
    })),
    settings: {
      largePrompts: LARGE,
      smallRequests: SMALL,
      newTokens: NEW_TOKENS,
      promptTokens: 8,
      engineBatch: 32,
      defaults: OpenAiServer.defaults
    }
  }
})

export default () =>
  Effect.runPromise(
    Effect.scoped(Effect.gen(function*() {
      const loadBefore = loadavg()[0]!
      const result = yield* figures
      return {
        headline: {
          metric: `small request latency beside a ${LARGE}-prompt request / alone (tiny preset, defaults)`,
          value: result.ratio,
          target: 2,
          better: "lower"
        },
        ...result,
        loadAverage: { before: loadBefore, after: loadavg()[0]! }
      } as const
    })).pipe(Effect.provide(NodeServices.layer))
  )
