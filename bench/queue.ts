/**
 * `npm run bench -- queue`: what the Redis rollout queue (`actors/RolloutQueue.ts`) costs per share, apart from the
 * rollouts themselves. A private `redis-server` on loopback; the trainer's side (`RolloutQueue.client`) puts batches
 * of 64 one-row shares on the queue and gathers their groups, while `WORKERS` scripted workers take shares from the
 * consumer group and answer each at once with one group of 8 small trajectories (as a worker encodes them), so the
 * figure is the queue's own work: two stream writes, two blocking reads, acknowledgement and JSON both ways.
 *
 * Headline: shares a second through the queue (our own target ≥ 200: a batch of 64 shares then costs ≤ 0.3 s of
 * coordination against seconds of rollouts; no issue sets one). Also: a batch's time, and a share's round trip
 * with one share in flight.
 */
import { Effect, Schema } from "effect"
import { spawn } from "node:child_process"
import { Redis } from "ioredis"
import { mkdtempSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { loadavg, tmpdir } from "node:os"
import { join } from "node:path"
import * as RolloutQueue from "../actors/RolloutQueue.ts"
import { RolloutResponse } from "../actors/RolloutWorker.ts"
import type * as Dataset from "../src/Dataset.ts"
import type * as Trajectory from "../src/Trajectory.ts"
import type { BenchResult } from "./run.ts"

const WORKERS = 2
const BATCHES = 10
const SHARES = 64
const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

const freePort = () =>
  new Promise<number>((resolve) => {
    const s = createServer()
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port
      s.close(() => resolve(port))
    })
  })

const trajectory = (i: number): Trajectory.Trajectory => ({
  trajectoryId: `t${i}`,
  groupId: "g",
  chainId: `c${i}`,
  messages: [{ role: "user", content: "What is 6*7?" }, { role: "assistant", content: "The answer is 42." }],
  segments: [],
  termination: "no_tool_call",
  reward: 1,
  rewardStatus: "scored",
  metrics: {},
  trainable: true,
  masked: false
})

/** A scripted worker: takes shares and answers each with one group of 8 trajectories, until `stop`. */
const worker = async (url: string, name: string, stop: { done: boolean }) => {
  const redis = new Redis(url)
  const stream = "agentfly:rollouts:bench:shares"
  while (!stop.done) {
    const raw = await redis.xreadgroup("GROUP", "workers", name, "COUNT", 1, "BLOCK", 200, "STREAMS", stream, ">") as
      | Array<[string, Array<[string, Array<string>]>]>
      | null
    for (const [entry, fields] of raw?.[0]?.[1] ?? []) {
      const share = JSON.parse(fields[1]!) as { id: string; replyTo: string; request: { rowOffset: number } }
      const groups = [{
        groupId: `s0-g${share.request.rowOffset}`,
        rowIndex: share.request.rowOffset,
        trajectories: Array.from({ length: 8 }, (_, i) => trajectory(i))
      }]
      const encoded = Schema.encodeSync(RolloutResponse)({ groups, env: {} }) as { groups: unknown }
      await redis.multi()
        .xadd(share.replyTo, "*", "p", JSON.stringify({ id: share.id, worker: name, groups: encoded.groups, env: {} }))
        .xack(stream, "workers", entry)
        .xdel(stream, entry)
        .exec()
    }
  }
  redis.disconnect()
}

const rows = (n: number): Array<Dataset.Row> =>
  Array.from({ length: n }, (_, i) => ({ index: i, line: i + 1, question: `q${i}`, fields: {} }))

export default async (): Promise<BenchResult> => {
  const loadBefore = loadavg()[0]!
  const port = await freePort()
  const dir = mkdtempSync(join(tmpdir(), "bench-queue-"))
  const server = spawn("/usr/bin/redis-server", [
    "--port",
    String(port),
    "--bind",
    "127.0.0.1",
    "--dir",
    dir,
    "--save",
    "",
    "--appendonly",
    "no"
  ], { stdio: "ignore" })
  const url = `redis://127.0.0.1:${port}`
  for (let i = 0; i < 200; i++) {
    try {
      const r = new Redis(url, { lazyConnect: true, retryStrategy: () => null })
      r.on("error", () => undefined)
      await r.connect()
      r.disconnect()
      break
    } catch {
      await new Promise((r) => setTimeout(r, 20))
    }
  }
  const stop = { done: false }
  try {
    return await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
      const queue = yield* RolloutQueue.client({ url, agentKey: "bench", shareRows: 1 })
      const workers = Array.from({ length: WORKERS }, (_, i) => worker(url, `w${i}`, stop))
      const sampling = { firstSeq: 0, chains: 8, temperature: 1, seed: 1 }
      // One share in flight at a time: a share's round trip.
      const single: Array<number> = []
      for (let i = 0; i < 30; i++) {
        const t0 = performance.now()
        yield* queue.collect(rows(1), sampling, 0)
        single.push(performance.now() - t0)
      }
      // Whole batches of SHARES one-row shares.
      yield* queue.collect(rows(SHARES), sampling, 0)
      const batches: Array<number> = []
      for (let i = 0; i < BATCHES; i++) {
        const t0 = performance.now()
        const groups = yield* queue.collect(rows(SHARES), sampling, 0)
        batches.push(performance.now() - t0)
        if (groups.length !== SHARES || groups.some((g, k) => g.rowIndex !== k)) {
          return yield* Effect.die(new Error("a batch came back incomplete or out of order"))
        }
      }
      stop.done = true
      yield* Effect.promise(() => Promise.all(workers))
      const sharesPerSecond = SHARES / (median(batches) / 1000)
      console.log(
        `  ${SHARES}-share batch ${median(batches).toFixed(1)} ms ` +
          `(${sharesPerSecond.toFixed(0)} shares/s, ${WORKERS} ` +
          `workers); one share alone ${median(single).toFixed(2)} ms`
      )
      return {
        headline: {
          metric: `shares a second through the Redis rollout queue (${WORKERS} scripted workers, 64-share batches)`,
          value: sharesPerSecond,
          target: 200,
          better: "higher" as const
        },
        batchMs: { median: median(batches), rounds: batches },
        singleShareMs: { median: median(single), rounds: single },
        loadAverage: { before: loadBefore, after: loadavg()[0]! }
      }
    })))
  } finally {
    stop.done = true
    server.kill("SIGKILL")
    rmSync(dir, { recursive: true, force: true })
  }
}
