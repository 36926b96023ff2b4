/**
 * `npm run bench -- rollout`
 *
 * (a) Runtime overhead per turn: `Rollout.run` (scoped chain fibers, policies, stats, group collector, bounded
 *     stream) against a bare loop doing the same work in the same process: the same scripted sampler, the same
 *     agent format (tokenize, parse) and the same no-op tool, as plain `Effect.forEach` loops with the same
 *     concurrency. Headline: `run time per turn / bare time per turn` (target ≤ 3).
 * (b) 10,000 concurrent chains idle on a sampler that does not answer until released: retained heap per idle
 *     chain (after a full GC, minus the heap before the run), time to bring all chains up, and wall time to
 *     finish all of them once the sampler answers (target < 50 KB per idle chain).
 */
import { Deferred, Effect, Exit, Fiber, Stream } from "effect"
import { runInNewContext } from "node:vm"
import { setFlagsFromString } from "node:v8"
import * as Rollout from "../actors/Rollout.ts"
import * as RolloutChain from "../actors/RolloutChain.ts"
import type * as ChainPorts from "../src/ChainPorts.ts"
import * as Sampler from "../src/Sampler.ts"
import { charFormat, turn } from "../test/actors/fixtures/charFormat.ts"

setFlagsFromString("--expose-gc")
const gc = runInNewContext("gc") as () => void

const heapUsed = (): number => {
  gc()
  gc()
  return process.memoryUsage().heapUsed
}

const sampling: Sampler.SamplingParams = { temperature: 1, maxTokens: 256 }

// ===== (a) overhead per turn =====

const TURNS = 4
const CHAINS = 2000
const CONCURRENCY = 64
const toolTurn = turn(`Working on it.\nCALL noop {"step":1}`)
const finalTurn = turn("Done.")

/** Turns 1..TURNS-1 call the no-op tool; the last turn ends without a call. */
const script: Sampler.Script = (request) => {
  const turns = countHeaders(request.promptTokenIds)
  return turns < TURNS ? toolTurn : finalTurn
}
const HEADER = Array.from("<assistant>", (c) => c.charCodeAt(0))
const countHeaders = (ids: ReadonlyArray<number>): number => {
  let n = 0
  for (let i = 0; i + HEADER.length <= ids.length; i++) {
    let match = true
    for (let j = 0; j < HEADER.length && match; j++) match = ids[i + j] === HEADER[j]
    if (match) n++
  }
  return n
}

const noopTools: ChainPorts.ToolRunner = {
  schemas: [{ type: "function", function: { name: "noop" } }],
  executeTurn: (calls) =>
    Effect.succeed({
      messages: calls.map((c) => ({ role: "tool" as const, content: "ok", tool_call_id: c.id })),
      terminal: false
    })
}

const rows = (n: number) =>
  Array.from({ length: n }, (_, i) => ({ messages: [{ role: "user" as const, content: `task ${i}` }] }))

const runtimeRun = Effect.gen(function*() {
  const stats = RolloutChain.makeStats()
  const count = yield* Rollout.run({
    rows: rows(CHAINS),
    numChains: 1,
    maxTurns: TURNS + 1,
    maxConcurrentChains: CONCURRENCY,
    bufferSize: 256,
    sampling,
    format: charFormat,
    tools: noopTools,
    runId: "bench",
    stats
  }).pipe(Stream.runCount)
  return { events: count, turns: stats.turns }
})

/** The same work without the runtime: sample, append, parse, run the tool, append; no scopes, policies or stream. */
const bareRun = Effect.gen(function*() {
  const sampler = yield* Sampler.Sampler
  let turns = 0
  yield* Effect.forEach(rows(CHAINS), (row) =>
    Effect.gen(function*() {
      const transcript = yield* charFormat.start(row.messages, noopTools.schemas)
      for (let t = 0; t < TURNS + 1; t++) {
        const result = yield* sampler.generate({
          promptTokenIds: transcript.promptTokenIds(),
          sampling: { ...sampling, stopTokenIds: charFormat.stopTokenIds }
        })
        const parsed = yield* transcript.appendSampled(result)
        turns++
        if (parsed.toolCalls.length === 0) return
        const executed = yield* noopTools.executeTurn(parsed.toolCalls, undefined as never)
        yield* transcript.appendObservations(executed.messages)
      }
    }), { concurrency: CONCURRENCY, discard: true })
  return { turns }
})

const time = <A, E>(effect: Effect.Effect<A, E, Sampler.Sampler>) =>
  Effect.gen(function*() {
    const start = performance.now()
    const value = yield* effect
    return { value, ms: performance.now() - start }
  }).pipe(Effect.provide(Sampler.layerScripted(script)))

// ===== (b) 10,000 idle chains =====

const IDLE_CHAINS = 10_000

const idleChains = Effect.gen(function*() {
  const release = yield* Deferred.make<void>()
  let waiting = 0
  const allWaiting = yield* Deferred.make<void>()
  const layer = Sampler.layerScripted(() =>
    Effect.suspend(() => {
      if (++waiting === IDLE_CHAINS) Deferred.doneUnsafe(allWaiting, Exit.void)
      return Deferred.await(release).pipe(Effect.as(finalTurn))
    })
  )
  const input = rows(IDLE_CHAINS)
  const before = heapUsed()
  const rssBefore = process.memoryUsage().rss
  const t0 = performance.now()
  const stats = RolloutChain.makeStats()
  const fiber = yield* Rollout.run({
    rows: input,
    numChains: 1,
    maxTurns: 2,
    maxConcurrentChains: IDLE_CHAINS,
    bufferSize: 1024,
    sampling,
    format: charFormat,
    tools: noopTools,
    runId: "idle",
    stats
  }).pipe(Stream.runCount, Effect.provide(layer), Effect.forkChild)
  yield* Deferred.await(allWaiting)
  const upMs = performance.now() - t0
  const during = heapUsed()
  const rssIdle = process.memoryUsage().rss
  const inFlight = stats.chainsInFlight
  const t1 = performance.now()
  yield* Deferred.succeed(release, undefined)
  const events = yield* Fiber.join(fiber)
  const finishMs = performance.now() - t1
  return {
    chains: IDLE_CHAINS,
    chainsInFlightWhileIdle: inFlight,
    bytesPerIdleChain: (during - before) / IDLE_CHAINS,
    rssBytesPerIdleChain: (rssIdle - rssBefore) / IDLE_CHAINS,
    heapBeforeMiB: before / 2 ** 20,
    heapIdleMiB: during / 2 ** 20,
    startAllMs: upMs,
    finishAllAfterReleaseMs: finishMs,
    events
  }
})

export default async () => {
  // Warm up both paths (JIT), then measure alternately and keep the medians.
  await Effect.runPromise(time(runtimeRun))
  await Effect.runPromise(time(bareRun))
  const runtimeMs: Array<number> = []
  const bareMs: Array<number> = []
  let turns = 0
  for (let i = 0; i < 5; i++) {
    const r = await Effect.runPromise(time(runtimeRun))
    const b = await Effect.runPromise(time(bareRun))
    if (r.value.turns !== b.value.turns) throw new Error(`turn counts differ: ${r.value.turns} vs ${b.value.turns}`)
    turns = r.value.turns
    runtimeMs.push(r.ms)
    bareMs.push(b.ms)
  }
  const median = (xs: Array<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
  const runtimeUsPerTurn = (median(runtimeMs) * 1000) / turns
  const bareUsPerTurn = (median(bareMs) * 1000) / turns
  const idle = await Effect.runPromise(idleChains)
  return {
    headline: {
      metric: "overhead per turn (Rollout.run / bare loop)",
      value: runtimeUsPerTurn / bareUsPerTurn,
      target: 3,
      better: "lower" as const
    },
    overhead: {
      chains: CHAINS,
      turnsPerRun: turns,
      concurrency: CONCURRENCY,
      runtimeUsPerTurn,
      bareUsPerTurn,
      ratio: runtimeUsPerTurn / bareUsPerTurn,
      runtimeMs,
      bareMs
    },
    idle: { ...idle, kbPerIdleChain: idle.bytesPerIdleChain / 1024, targetKb: 50 }
  }
}
