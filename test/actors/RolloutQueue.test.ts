/**
 * The trainer's side of the rollout queue against a real redis-server, with a scripted worker reading the streams
 * directly: groups gathered in row order whatever the order of the replies, a share answered twice used once, shares
 * the queue lost sent again, a worker's failure and a batch nobody takes stopped with typed errors.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Logger, Schema } from "effect"
import { TestClock } from "effect/testing"
import { Redis } from "ioredis"
import * as RolloutQueue from "../../actors/RolloutQueue.ts"
import { resultMac, RolloutResponse } from "../../actors/RolloutWorker.ts"
import type * as Dataset from "../../src/Dataset.ts"
import { redisServer } from "../utils/redisServer.ts"
import { trajectoryOf } from "../utils/trajectories.ts"

const shares = "agentfly:rollouts:k1:shares"
const rows: ReadonlyArray<Dataset.Row> = Array.from({ length: 5 }, (_, i) => ({
  index: i,
  line: i + 1,
  question: `q${i}`,
  fields: {}
}))
const sampling = { firstSeq: 0, chains: 2, temperature: 1, seed: 7 }

interface Share {
  readonly entry: string
  readonly id: string
  readonly replyTo: string
  readonly request: { readonly rows: ReadonlyArray<Dataset.Row>; readonly rowOffset: number; readonly version: number }
}

/** The shares waiting on the stream (read as a worker of the group would). */
const take = (redis: Redis, count: number, stream = shares) =>
  Effect.promise(async () => {
    const out: Array<Share> = []
    while (out.length < count) {
      const raw = await redis.xreadgroup("GROUP", "workers", "test", "COUNT", 10, "BLOCK", 500, "STREAMS", stream, ">") as
        | Array<[string, Array<[string, Array<string>]>]>
        | null
      for (const [entry, fields] of raw?.[0]?.[1] ?? []) out.push({ entry, ...JSON.parse(fields[1]!) })
    }
    return out
  })

/** A share's groups, one per row, as a worker encodes them. */
const answer = (share: Share) => {
  const groups = share.request.rows.map((_, r) => ({
    groupId: `s0-g${share.request.rowOffset + r}`,
    rowIndex: share.request.rowOffset + r,
    trajectories: [trajectoryOf([{ role: "assistant", content: `v${share.request.version}` }])]
  }))
  const encoded = Schema.encodeSync(RolloutResponse)({ groups }) as { groups: unknown }
  // Its worker's environment figures after the share (two workers here, by the share's parity).
  const worker = share.request.rowOffset % 4 === 0 ? "even" : "odd"
  return JSON.stringify({ id: share.id, worker, groups: encoded.groups, env: { "env/box/leases": share.request.rowOffset + 1 } })
}

const reply = (redis: Redis, share: Share, payload: string) => Effect.promise(() => redis.xadd(share.replyTo, "*", "p", payload))

/** Log lines, collected. */
const collecting = () => {
  const logs: Array<string> = []
  const logger = Logger.make((o) => void logs.push((o.message as ReadonlyArray<unknown>).map(String).join(" ")))
  return { logs, loggers: new Set([logger]) }
}

/** Waits (in real time, however long it takes: the test's own timeout bounds it) until `done()` holds. */
const until = (done: () => boolean) =>
  Effect.promise(async () => {
    while (!done()) await new Promise((resolve) => setTimeout(resolve, 50))
  })

describe("RolloutQueue (trainer's side)", () => {
  it.live("gathers a batch's groups in row order, keeps one answer per share, sends lost shares again", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const redis = new Redis(server.url)
      yield* Effect.addFinalizer(() => Effect.sync(() => redis.disconnect()))
      const queue = yield* RolloutQueue.client({ url: server.url, agentKey: "k1", shareRows: 2, checkMillis: 300 })

      // Three shares (rows 0–1, 2–3, 4), answered last first, the middle one twice.
      const fiber = yield* Effect.forkChild(queue.collect(rows, sampling, 3))
      const taken = yield* take(redis, 3)
      assert.deepStrictEqual(taken.map((s) => s.request.rowOffset), [0, 2, 4])
      assert.deepStrictEqual(taken.map((s) => s.request.version), [3, 3, 3])
      for (const share of [taken[2]!, taken[1]!, taken[1]!, taken[0]!]) yield* reply(redis, share, answer(share))
      const groups = yield* Fiber.join(fiber)
      assert.deepStrictEqual(groups.map((g) => g.rowIndex), [0, 1, 2, 3, 4])
      assert.deepStrictEqual(groups.map((g) => g.groupId), ["s0-g0", "s0-g1", "s0-g2", "s0-g3", "s0-g4"])
      const first = yield* queue.figures!
      assert.strictEqual(first["workers/shares"], 3)
      assert.strictEqual(first["workers/resent"], 0)
      // The latest figures of each worker, summed: "even" last answered rows 0–1 (1), "odd" rows 2–3 (3).
      assert.strictEqual(first["env/box/leases"], 1 + 3)

      // The queue forgets the shares (a Redis restarted without persistence): they come again.
      const again = yield* Effect.forkChild(queue.collect(rows.slice(0, 2), sampling, 4))
      const lost = yield* take(redis, 1)
      yield* Effect.promise(() => redis.del(shares))
      yield* Effect.promise(() => redis.xgroup("CREATE", shares, "workers", "$", "MKSTREAM").catch(() => undefined))
      const resent = yield* take(redis, 1)
      assert.strictEqual(resent[0]!.id, lost[0]!.id)
      assert.notStrictEqual(resent[0]!.entry, lost[0]!.entry)
      yield* reply(redis, resent[0]!, answer(resent[0]!))
      assert.deepStrictEqual((yield* Fiber.join(again)).map((g) => g.rowIndex), [0, 1])
      const second = yield* queue.figures!
      assert.strictEqual(second["workers/resent"], 1)
      // The first batch's duplicate was counted when it arrived.
      assert.strictEqual(first["workers/duplicates"] + second["workers/duplicates"], 1)
    }).pipe(Effect.scoped), 300_000)

  it.live("a worker's failure and a batch nobody takes stop the run with typed errors", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const redis = new Redis(server.url)
      yield* Effect.addFinalizer(() => Effect.sync(() => redis.disconnect()))
      const { logs, loggers } = collecting()
      const queue = yield* RolloutQueue.client({ url: server.url, agentKey: "k1", shareRows: 5 })
      const fiber = yield* Effect.forkChild(Effect.flip(queue.collect(rows, sampling, 0)))
      const [share] = yield* take(redis, 1)
      yield* reply(redis, share!, JSON.stringify({ id: share!.id, error: "the sampler is gone" }))
      const failed = yield* Fiber.join(fiber)
      assert.strictEqual(failed.reason._tag, "Workers")
      assert.include(failed.message, "the sampler is gone")

      // A batch nobody takes, on a clock the test moves: the 10-minute wait passes in moments, whatever the speed.
      const alone = yield* Effect.gen(function*() {
        const idle = yield* RolloutQueue.client({
          url: server.url,
          agentKey: "k1",
          shareRows: 5,
          timeoutSeconds: 600,
          quietMillis: 30_000
        })
        const waiting = yield* Effect.forkChild(Effect.flip(idle.collect(rows, sampling, 0)))
        yield* take(redis, 1)
        // A minute of the batch's clock for each 50 ms of ours, until it gives up.
        while (waiting.pollUnsafe() === undefined) {
          yield* TestClock.adjust("1 minute")
          yield* TestClock.withLive(Effect.sleep("50 millis"))
        }
        return yield* Fiber.join(waiting)
      }).pipe(Effect.provide(TestClock.layer()), Effect.provideService(Logger.CurrentLoggers, loggers))
      // Said while it waited, before the deadline stopped it.
      assert.isTrue(logs.some((l) => l.startsWith("no rollout worker answered a share of this batch in")), logs.join("\n"))
      assert.isTrue(logs.some((l) => l.includes("workers seen in the last 30 s: none")))
      assert.strictEqual(alone.reason._tag, "Workers")
      assert.include(alone.message, "1 of 1 shares of a batch got no result from the rollout queue")
      assert.include(alone.message, "within 600 s")
      assert.include(alone.message, "workers seen in the last 30 s: none")
      // An unreachable queue at start is typed too.
      const nowhere = yield* Effect.flip(RolloutQueue.client({ url: "redis://127.0.0.1:1", agentKey: "k1" }))
      assert.include(nowhere.message, "cannot be reached")
    }).pipe(Effect.scoped), 300_000)

  it.live("a queue lost mid-batch stops the run within about 10 s, saying so at once and how to go on; one back in time is not", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const redis = new Redis(server.url, { maxRetriesPerRequest: null })
      redis.on("error", () => undefined)
      yield* Effect.addFinalizer(() => Effect.sync(() => redis.disconnect()))
      const { logs, loggers } = collecting()
      const queue = yield* RolloutQueue.client({ url: server.url, agentKey: "k1", shareRows: 5, checkMillis: 300 }).pipe(
        Effect.provideService(Logger.CurrentLoggers, loggers)
      )

      // Down for 3 s, then back: the batch goes on (its share is sent again to the restarted, empty queue).
      const survives = yield* Effect.forkChild(queue.collect(rows, sampling, 0))
      yield* take(redis, 1)
      yield* server.kill
      // Said as soon as it is gone (its check runs every second).
      yield* until(() => logs.some((l) => l.includes("is unreachable")))
      yield* server.start
      // As a worker does after a restart: its consumer group again (from the start: the resent share may come first).
      yield* Effect.promise(() => redis.xgroup("CREATE", shares, "workers", "0", "MKSTREAM").catch(() => undefined))
      const [again] = yield* take(redis, 1)
      yield* reply(redis, again!, answer(again!))
      assert.strictEqual((yield* Fiber.join(survives)).length, 5)
      assert.isTrue(logs.some((l) => l.includes("is unreachable") && l.includes("waits 10 s for it, then stops")), logs.join("\n"))
      yield* until(() => logs.some((l) => l.includes("is back")))

      // Gone for good: the run stops after about 10 s (a batch waits up to 30 minutes for its workers), naming what
      // to do. The lower bound is the queue's reconnection attempts (20, 0.5 s apart); the upper one is generous.
      const fiber = yield* Effect.forkChild(Effect.flip(queue.collect(rows, sampling, 1)))
      yield* take(redis, 1)
      const killedAt = Date.now()
      yield* server.kill
      const lost = yield* Fiber.join(fiber)
      const waited = (Date.now() - killedAt) / 1000
      assert.strictEqual(lost.reason._tag, "Workers")
      assert.include(lost.message, `lost the rollout queue ${server.url}`)
      assert.include(lost.message, "agentfly train CONFIG --resume")
      assert.isTrue(waited >= 9 && waited < 60, `stopped after ${waited} s`)
    }).pipe(Effect.scoped), 300_000)

  it.live("with a token, a reply without the run's HMAC stops the run untrained; runs whose agent keys match never mix", () =>
    Effect.gen(function*() {
      const server = yield* redisServer
      const redis = new Redis(server.url)
      yield* Effect.addFinalizer(() => Effect.sync(() => redis.disconnect()))
      const token = "queue-s3cret"
      const signedAnswer = (share: Share, key: string, runId: string) => {
        const body = JSON.parse(answer(share)) as { groups: unknown; env: unknown }
        const mac = resultMac(key, runId, share.id, { groups: body.groups, env: body.env })
        return JSON.stringify({ ...body, mac })
      }
      // Two runs of one task and agent section (agent key k1), told apart by their run ids.
      const runA = yield* RolloutQueue.client({ url: server.url, agentKey: "k1", runId: "ra", token, shareRows: 5 })
      const runB = yield* RolloutQueue.client({ url: server.url, agentKey: "k1", runId: "rb", token, shareRows: 5 })
      const streamA = "agentfly:rollouts:ra:shares", streamB = "agentfly:rollouts:rb:shares"

      // Answered with the right key: trained on.
      const fiberA = yield* Effect.forkChild(runA.collect(rows, sampling, 2))
      const [shareA] = yield* take(redis, 1, streamA)
      assert.strictEqual(shareA!.replyTo.startsWith("agentfly:rollouts:ra:results:"), true)
      // Nothing of run A's batch sits on run B's stream.
      assert.strictEqual(yield* Effect.promise(() => redis.exists(streamB)), 1)
      assert.strictEqual(yield* Effect.promise(() => redis.xlen(streamB)), 0)
      yield* reply(redis, shareA!, signedAnswer(shareA!, token, "ra"))
      assert.deepStrictEqual((yield* Fiber.join(fiberA)).map((g) => g.rowIndex), [0, 1, 2, 3, 4])

      // Run B's share answered by someone without the key (no HMAC), then with another token, then signed for run
      // A: each is refused, typed, before anything of it is used.
      for (const forged of [
        (share: Share) => answer(share),
        (share: Share) => signedAnswer(share, "another-token", "rb"),
        (share: Share) => signedAnswer(share, token, "ra")
      ]) {
        const fiberB = yield* Effect.forkChild(Effect.flip(runB.collect(rows, sampling, 3)))
        const [shareB] = yield* take(redis, 1, streamB)
        yield* reply(redis, shareB!, forged(shareB!))
        const refused = yield* Fiber.join(fiberB)
        assert.strictEqual(refused.reason._tag, "Workers")
        assert.include(refused.message, "fails its authentication")
        assert.include(refused.message, "nothing of it is trained on")
      }
      assert.strictEqual((yield* runB.figures!)["workers/shares"], 0)

      // A queue beyond loopback without a token is refused before it is reached.
      const open = yield* Effect.flip(RolloutQueue.client({ url: "redis://10.1.2.3:6379", agentKey: "k1", runId: "ra" }))
      assert.strictEqual(open.reason._tag, "Workers")
      assert.include(open.message, "without a token")
    }).pipe(Effect.scoped), 300_000)
})
