/**
 * Rollout workers on the real parts: the calculator task's chains run by `RolloutWorker.serve` (two workers over
 * loopback HTTP) sampling on an `OpenAiServer` (tiny Qwen2 on onnxruntime) that the trainer's `InferenceServers`
 * pushed weights to. A batch split over the workers comes back as the groups one process rolls out (ids, row
 * indices, prompts, sampled tokens, rewards); a dead worker's share goes to the other; a worker of another config
 * is refused, and a batch no worker can take fails with a typed error. The same batch through the Redis queue
 * (`RolloutQueue.work` on a private redis-server) comes back the same too.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, FileSystem, Logger, Scope } from "effect"
import { TestClock } from "effect/testing"
import { Redis } from "ioredis"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as InferenceServers from "../../actors/InferenceServers.ts"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as RolloutQueue from "../../actors/RolloutQueue.ts"
import * as RolloutWorker from "../../actors/RolloutWorker.ts"
import { task as calculator } from "../../environments/calculator/CalculatorTask.ts"
import type * as Dataset from "../../src/Dataset.ts"
import * as Task from "../../src/Task.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import { Sampler, samplerError } from "../../src/Sampler.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import { redisServer } from "../utils/redisServer.ts"
import { randomWeights } from "../utils/tinyModel.ts"
import * as RolloutFigures from "../../src/RolloutFigures.ts"
import * as Rollouts from "../../actors/Rollouts.ts"
import * as RolloutSetup from "../../actors/RolloutSetup.ts"

const rows: ReadonlyArray<Dataset.Row> = Array.from({ length: 5 }, (_, i) => ({
  index: i,
  line: i + 1,
  question: `What is ${i + 2} + ${3 * i}?`,
  fields: { answer: String(i + 2 + 3 * i) }
}))

/** What a group is, as the learner and the journal see it. */
const view = (groups: ReadonlyArray<Trajectory.Group>) =>
  groups.map((g) => ({
    groupId: g.groupId,
    rowIndex: g.rowIndex,
    trajectories: g.trajectories.map((t) => ({
      id: t.trajectoryId,
      prompt: t.messages[1],
      tokens: t.segments.map((segment) => [...Trajectory.tokenIds(segment)]),
      reward: t.reward,
      termination: t.termination
    }))
  }))

/** A worker on its own scope (closing it is the worker dying). */
const startWorker = (
  agent: RolloutSetup.RolloutSetup,
  servers: InferenceServers.InferenceServers,
  options: RolloutWorker.WorkerOptions = {}
) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const worker = yield* RolloutWorker.serve(agent, servers, options).pipe(Scope.provide(scope))
    return { ...worker, close: Scope.close(scope, Exit.void) }
  })

/** The real parts both tests use: a tiny model served with pushed weights, the calculator agent, a worker side. */
const fixture = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-workers-" })}/tiny`
  yield* ModelFolder.init(dir, { preset: "tiny", seed: 3 })
  const folder = yield* ModelFolder.load(dir)
  const engine = yield* makeEngine({ config: folder.config, weights: folder.weights })
  const server = yield* OpenAiServer.make(folder, { acceptWeights: {} }).pipe(
    Effect.provideService(PolicyEngine, engine)
  )
  const task = yield* Task.instantiate("calculator", calculator, undefined)
  const parameters = Qwen2.parameters(folder.config)
  const trainerSide = yield* InferenceServers.make({ urls: [server.baseUrl], parameters })
  yield* trainerSide.push(1, randomWeights(folder.config, 7))

  const config = yield* TrainConfig.decode({
    output: `${dir}/run`,
    model: { path: dir },
    data: { train: "train.jsonl" },
    agent: {
      systemPrompt: "Use the calculator tool.",
      renderTools: false,
      numChains: 3,
      maxTurns: 2,
      maxNewTokens: 16,
      maxContextTokens: 256
    },
    algorithm: { steps: 1 },
    engine: { servers: [server.baseUrl] }
  })
  const agent = yield* RolloutSetup.make({ task, config, format: ChainFormat.ofConfig(config, folder) })
  const workerSide = yield* InferenceServers.make({ urls: [server.baseUrl], parameters, restMs: 50 })
  const key = RolloutWorker.agentKey(task.name, config)
  const runId = RolloutWorker.runId(task.name, config)
  return { runId, dir, folder, engine, server, task, agent, config, key, parameters, trainerSide, workerSide }
})

// Greedy, so that what is sampled does not depend on which requests share the server's batch.
const sampling = { firstSeq: 40, chains: 3, temperature: 0, seed: 1234 }

describe("RolloutWorker", () => {
  it.live("a batch split over two workers is the batch one process rolls out; a dead worker's share moves", () =>
    Effect.scoped(Effect.gen(function*() {
      const { runId, dir, folder, server, task, agent, key, trainerSide, workerSide } = yield* fixture
      // Each worker's environment reports its own pool figures, which the trainer's record merges.
      const withEnv = (figures: Record<string, number>) => ({
        ...agent,
        runtime: { ...agent.runtime, environmentStats: Effect.succeed(figures) }
      })
      const w1 = yield* startWorker(withEnv({ "env/box/leases": 3, "env/box/acquire_wait_p99_ms": 7, "env/box/in_use": 1 }), workerSide)
      const w2 = yield* startWorker(withEnv({ "env/box/leases": 5, "env/box/acquire_wait_p99_ms": 2, "env/box/in_use": 0 }), workerSide)
      const client = yield* RolloutWorker.client({ urls: [w1.baseUrl, w2.baseUrl], agentKey: key, runId, restMs: 50 })

      const here = yield* Rollouts.collectGroups(agent, rows, sampling).pipe(
        Effect.provideService(Sampler, trainerSide.sampler(1))
      )
      const there = yield* client.collect(rows, sampling, 1)
      assert.deepStrictEqual(view(there), view(here))
      assert.deepStrictEqual(there.map((g) => g.rowIndex), [0, 1, 2, 3, 4])
      assert.strictEqual(there[3]!.groupId, "s40-g3")
      // Every chain sampled (a prompt past the context would fail both ways alike, and prove nothing).
      for (const t of there.flatMap((g) => g.trajectories)) {
        assert.notStrictEqual(t.termination, "error")
        assert.isTrue(t.segments.some((segment) => segment.spans.some((span) => span.source === "policy")))
      }
      assert.deepStrictEqual(yield* client.shares, [1, 1])
      const figures = yield* client.figures!
      assert.deepStrictEqual(
        [figures["env/box/leases"], figures["env/box/acquire_wait_p99_ms"], figures["env/box/in_use"]],
        [8, 7, 1]
      )
      // The workers' requests to the servers reach the run's figures: one per sampled turn.
      const turns = there.flatMap((g) => g.trajectories).reduce(
        (n, t) => n + t.segments.filter((segment) => segment.spans.some((span) => span.source === "policy")).length,
        0
      )
      assert.isAbove(turns, 0)
      assert.deepStrictEqual([figures["servers/requests"], figures["servers/failures"]], [turns, 0])
      assert.strictEqual((yield* client.figures!)["servers/requests"], undefined)

      // A worker dies: its share goes to the other, and the batch is the same.
      yield* w2.close
      const again = yield* client.collect(rows, sampling, 1)
      assert.deepStrictEqual(view(again), view(here))
      const shares = yield* client.shares
      assert.strictEqual(shares[0]! + shares[1]!, 4)
      assert.strictEqual(shares[1], 1)

      // No worker left: a typed error naming them.
      yield* w1.close
      const none = yield* Effect.flip(client.collect(rows, sampling, 1))
      assert.strictEqual(none.reason._tag, "Workers")
      assert.include(none.message, "every rollout worker failed")
      assert.include(none.message, w1.baseUrl)
      assert.include(none.message, "agentfly train CONFIG --resume")

      // A worker started with another config is refused before anything runs.
      const other = yield* TrainConfig.decode({
        output: `${dir}/run`,
        model: { path: dir },
        data: { train: "train.jsonl" },
        agent: { systemPrompt: "Another prompt.", renderTools: false, numChains: 3, maxTurns: 2, maxContextTokens: 256 },
        algorithm: { steps: 1 },
        engine: { servers: [server.baseUrl] }
      })
      const otherAgent = yield* RolloutSetup.make({ task, config: other, format: ChainFormat.ofConfig(other, folder) })
      const stranger = yield* startWorker(otherAgent, workerSide)
      const refused = yield* Effect.flip(
        RolloutWorker.client({ urls: [stranger.baseUrl], agentKey: key, runId, agent: agent.config.agent })
      )
      assert.strictEqual(refused.reason._tag, "Workers")
      assert.match(refused.message, /runs task "calculator" with another config/)
      // The keys that differ are named, both sides given.
      assert.include(refused.message, `this run's → the worker's: `)
      assert.include(refused.message, `agent.systemPrompt: "Use the calculator tool." → "Another prompt."`)
      assert.include(refused.message, "agent.maxNewTokens: 16 → ")
      // A worker with a token serves only requests that bear it.
      const guarded = yield* startWorker(agent, workerSide, { token: "s3cret" })
      const unauthorized = yield* Effect.flip(RolloutWorker.client({ urls: [guarded.baseUrl], agentKey: key, runId }))
      assert.match(unauthorized.message, /refuses this run's token \(HTTP 401: .*\): set AGENTFLY_WORKER_TOKEN to the token/)
      assert.notInclude(unauthorized.message, "start it with")
      const rawShare = yield* Effect.promise(() =>
        fetch(`${guarded.baseUrl}/rollouts`, { method: "POST", body: "{}" }).then((r) => r.status)
      )
      assert.strictEqual(rawShare, 401)
      const authorized = yield* RolloutWorker.client({ urls: [guarded.baseUrl], agentKey: key, runId, token: "s3cret" })
      assert.deepStrictEqual(view(yield* authorized.collect(rows.slice(0, 2), sampling, 1)), view(here.slice(0, 2)))

      const absent = yield* Effect.flip(RolloutWorker.client({ urls: ["http://127.0.0.1:9/v1"], agentKey: key, runId }))
      assert.include(absent.message, "rollout worker http://127.0.0.1:9/v1 did not answer GET /worker")
    }).pipe(Effect.provide([NodeServices.layer, ResourceManager.ResourceManager.layer]))), { timeout: 300_000 })

  it.live("strangers: a token before any answer, a loopback-only worker without one, bounded shares, signed results", () =>
    Effect.scoped(Effect.gen(function*() {
      const { runId, agent, key, trainerSide, workerSide } = yield* fixture
      const token = "w0rker-s3cret"
      const guarded = yield* startWorker(agent, workerSide, { token, versionWaitMs: 0 })
      const raw = (path: string, init: RequestInit = {}) =>
        Effect.promise(() =>
          fetch(`${guarded.baseUrl}${path}`, init).then(async (r) => ({ status: r.status, text: await r.text() }))
        )
      const bearing = (t: string) => ({ authorization: `Bearer ${t}`, "content-type": "application/json" })

      // Without the token, or with another, nothing of the run is told: not the agent key, not the prompt.
      for (const headers of [{}, bearing("wrong"), { authorization: token }]) {
        const info = yield* raw("/worker", { headers })
        assert.strictEqual(info.status, 401)
        assert.notInclude(info.text, key)
        assert.notInclude(info.text, "Use the calculator tool.")
      }
      const info = yield* raw("/worker", { headers: bearing(token) })
      assert.strictEqual(info.status, 200)
      assert.include(info.text, runId)

      // Beyond loopback without a token, the worker refuses to start; with one it may.
      const open = yield* Effect.flip(RolloutWorker.serve(agent, workerSide, { host: "0.0.0.0" }))
      assert.strictEqual(open._tag, "AuthConfigError")
      assert.include(open.message, "refusing to listen on 0.0.0.0 without a token")

      // Out-of-range numbers are refused before anything runs; so is a share of another run.
      const share = {
        runId,
        share: "s1",
        agentKey: key,
        rows: rows.slice(0, 1),
        firstSeq: 0,
        rowOffset: 0,
        chains: 1,
        temperature: 0,
        seed: 1,
        version: 1
      }
      const post = (body: unknown) =>
        raw("/rollouts", { method: "POST", headers: bearing(token), body: JSON.stringify(body) })
      for (
        const bad of [
          { temperature: 5 },
          { temperature: -1 },
          { rowOffset: -1 },
          { rowOffset: 1e9 },
          { chains: 0 },
          { chains: 100_000 },
          { rows: Array.from({ length: 70_000 }, (_, i) => ({ index: i, line: i + 1, fields: {} })) }
        ]
      ) {
        const refused = yield* post({ ...share, ...bad })
        assert.strictEqual(refused.status, 400, JSON.stringify(bad))
        assert.include(refused.text, "invalid_request")
      }
      const otherRun = yield* post({ ...share, runId: "another-run" })
      assert.strictEqual(otherRun.status, 409)
      assert.include(otherRun.text, "run_mismatch")
      // A body past the limit is refused (413) before it is all read.
      const small = yield* startWorker(agent, workerSide, { token, maxBodyBytes: 1024 })
      const big = yield* Effect.promise(() =>
        fetch(`${small.baseUrl}/rollouts`, { method: "POST", headers: bearing(token), body: "x".repeat(4096) })
          .then((r) => r.status)
      )
      assert.strictEqual(big, 413)

      // A share asking for a policy version far ahead of the servers' fails (here at once: versionWaitMs 0) instead
      // of holding its chains.
      const client = yield* RolloutWorker.client({ urls: [guarded.baseUrl], agentKey: key, runId, token, restMs: 0 })
      const ahead = yield* Effect.flip(client.collect(rows.slice(0, 1), sampling, 999_999))
      assert.strictEqual(ahead.reason._tag, "Workers")
      assert.include(ahead.message, "asks for policy version 999999")

      // Signed results: the worker's own answers pass; an answer rewritten on its way (a reward of 1, the HMAC
      // kept), or signed with another token, stops the run untrained.
      const here = yield* Rollouts.collectGroups(agent, rows.slice(0, 2), sampling).pipe(
        Effect.provideService(Sampler, trainerSide.sampler(1))
      )
      assert.deepStrictEqual(view(yield* client.collect(rows.slice(0, 2), sampling, 1)), view(here))
      const rewriting = (rewrite: (answer: Record<string, any>) => Record<string, any>) =>
        Effect.acquireRelease(
          Effect.promise(() => {
            const proxy = Http.createServer((req, res) => {
              const chunks: Array<Buffer> = []
              req.on("data", (c: Buffer) => chunks.push(c))
              req.on("end", () => {
                const body = chunks.length === 0 ? undefined : Buffer.concat(chunks)
                void fetch(`${guarded.baseUrl}${req.url!.replace(/^\/v1/, "")}`, {
                  method: req.method!,
                  headers: bearing(token),
                  ...(body === undefined ? {} : { body })
                }).then(async (r) => {
                  const text = await r.text()
                  const lines = text.split("\n").filter((l) => l !== "")
                  const last = JSON.parse(lines.at(-1)!) as Record<string, any>
                  const out = last["groups"] === undefined ? text : [...lines.slice(0, -1), JSON.stringify(rewrite(last))]
                    .join("\n") + "\n"
                  res.writeHead(r.status, { "content-type": r.headers.get("content-type") ?? "application/json" })
                  res.end(out)
                })
              })
            })
            return new Promise<Http.Server>((resolve) => proxy.listen(0, "127.0.0.1", () => resolve(proxy)))
          }),
          (proxy) => Effect.sync(() => void proxy.close())
        ).pipe(Effect.map((proxy) => `http://127.0.0.1:${(proxy.address() as AddressInfo).port}/v1`))
      const rewritten = yield* rewriting((answer) => ({
        ...answer,
        groups: answer["groups"].map((g: any) => ({
          ...g,
          trajectories: g.trajectories.map((t: any) => ({ ...t, reward: 1 }))
        }))
      }))
      const resigned = yield* rewriting((answer) => ({
        ...answer,
        mac: RolloutWorker.resultMac("another-token", runId, "s1", answer)
      }))
      const unsigned = yield* rewriting(({ mac: _mac, ...answer }) => answer)
      for (const url of [rewritten, resigned, unsigned]) {
        const victim = yield* RolloutWorker.client({ urls: [url], agentKey: key, runId, token })
        const forged = yield* Effect.flip(victim.collect(rows.slice(0, 2), sampling, 1))
        assert.strictEqual(forged.reason._tag, "Workers")
        assert.include(forged.message, "fails its authentication")
        assert.include(forged.message, "nothing of it is trained on")
      }
    }).pipe(Effect.provide([NodeServices.layer, ResourceManager.ResourceManager.layer]))), { timeout: 300_000 })

  it.live("a share longer than the silence limit lives on heartbeats; a silent worker's share moves; a failed share says why", () =>
    Effect.scoped(Effect.gen(function*() {
      const { runId, folder, engine, agent, key, parameters, trainerSide, workerSide } = yield* fixture
      const here = yield* Rollouts.collectGroups(agent, rows, sampling).pipe(
        Effect.provideService(Sampler, trainerSide.sampler(1))
      )
      // Every request waits 1 s first: a share lasts over 1 s, past the 750 ms silence limit, which the worker's
      // heartbeats (every 50 ms: fifteen to a silence, for a loaded machine's late timers) keep from firing.
      const slow: InferenceServers.InferenceServers = {
        ...workerSide,
        sampler: (version) => {
          const inner = workerSide.sampler(version)
          return { ...inner, generate: (request) => Effect.delay(inner.generate(request), 1_000) }
        }
      }
      const scope = yield* Scope.make()
      const slowWorker = yield* RolloutWorker.serve(agent, slow, { heartbeatMs: 50 }).pipe(Scope.provide(scope))
      const patient = yield* RolloutWorker.client({ urls: [slowWorker.baseUrl], agentKey: key, runId, silenceMs: 750 })
      const started = Date.now()
      const slowGroups = yield* patient.collect(rows.slice(0, 2), sampling, 1)
      assert.isAbove(Date.now() - started, 1_000)
      assert.deepStrictEqual(view(slowGroups), view(here.slice(0, 2)))

      // A worker that takes the share and says nothing more (hung, stopped): given up after the silence limit, its
      // share goes to the other worker.
      const heldOpen: Array<Http.ServerResponse> = []
      const silent = Http.createServer((req, res) => {
        if (req.method === "GET") {
          res.writeHead(200, { "content-type": "application/json" })
          res.end(JSON.stringify({ task: "calculator", agentKey: key }))
        } else heldOpen.push(res)
      })
      yield* Effect.acquireRelease(
        Effect.promise(() => new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve))),
        () => Effect.sync(() => silent.close())
      )
      const silentUrl = `http://127.0.0.1:${(silent.address() as AddressInfo).port}/v1`
      // The good worker's heartbeats keep it from seeming silent however long its chains take here.
      const good = yield* startWorker(agent, workerSide, { heartbeatMs: 50 })
      const failover = yield* RolloutWorker.client({
        urls: [silentUrl, good.baseUrl],
        agentKey: key, runId,
        silenceMs: 750,
        restMs: 50
      })
      const t0 = Date.now()
      const moved = yield* failover.collect(rows.slice(0, 2), sampling, 1)
      assert.deepStrictEqual(view(moved), view(here.slice(0, 2)))
      // Far below a share's 30-minute limit: the silence limit moved it (a generous bound, for a loaded machine).
      assert.isBelow(Date.now() - t0, 60_000)
      assert.strictEqual(heldOpen.length, 1)
      // Two shares: the good worker's own, and the silent one's after 0.75 s.
      assert.deepStrictEqual(yield* failover.shares, [0, 2])
      assert.strictEqual((yield* failover.figures!)["workers/failures"], 1)
      // Alone, the silent worker fails the batch with the reason.
      const alone = yield* RolloutWorker.client({ urls: [silentUrl], agentKey: key, runId, silenceMs: 300 })
      const silence = yield* Effect.flip(alone.collect(rows.slice(0, 1), sampling, 1))
      assert.include(silence.message, `${silentUrl} (no answer and no heartbeat for 0.3 s (hung, stopped, or cut off))`)
      // A share's time limit, on a clock the test moves: a worker silent for less than its silence limit but past the
      // share's limit is given up with that reason.
      const late = yield* Effect.gen(function*() {
        const timed = yield* RolloutWorker.client({ urls: [silentUrl], agentKey: key, runId, timeoutMs: 60_000, silenceMs: 120_000 })
        const waiting = yield* Effect.forkChild(Effect.flip(timed.collect(rows.slice(0, 1), sampling, 1)))
        while (waiting.pollUnsafe() === undefined) {
          yield* TestClock.adjust("1 minute")
          yield* TestClock.withLive(Effect.sleep("50 millis"))
        }
        return yield* Fiber.join(waiting)
      }).pipe(Effect.provide(TestClock.layer()))
      assert.include(late.message, `${silentUrl} (no groups within 60 s (rollout.timeoutSeconds))`)
      // Two workers failing one share: the second's warning says that none is left (not that another takes it).
      const logs: Array<string> = []
      const collector = Logger.make((o) => void logs.push((o.message as ReadonlyArray<unknown>).map(String).join(" ")))
      const pair = yield* RolloutWorker.client({ urls: [silentUrl, silentUrl], agentKey: key, runId, silenceMs: 300 })
      yield* Effect.flip(pair.collect(rows.slice(0, 1), sampling, 1)).pipe(
        Effect.provideService(Logger.CurrentLoggers, new Set([collector]))
      )
      assert.deepStrictEqual(logs.map((l) => l.slice(l.indexOf("); ") + 3)), [
        "its share goes to another worker",
        "no other worker is left to take its share"
      ])
      for (const res of heldOpen) res.destroy()

      // A share that fails after its answer began (here a sampler that cannot give token ids: the run's chains
      // abort) reaches the run as the worker's own error.
      const unusable: InferenceServers.InferenceServers = {
        ...workerSide,
        sampler: (version) => ({
          ...workerSide.sampler(version),
          generate: () => Effect.fail(samplerError("NoTokenIds", "this backend returns no token ids"))
        })
      }
      const broken = yield* startWorker(agent, unusable)
      const failing = yield* RolloutWorker.client({ urls: [broken.baseUrl], agentKey: key, runId })
      const failed = yield* Effect.flip(failing.collect(rows.slice(0, 1), sampling, 1))
      assert.strictEqual(failed.reason._tag, "Workers")
      assert.include(failed.message, `${broken.baseUrl} (failed the share: `)
      assert.include(failed.message, "this backend returns no token ids")

      // Every inference server down: the worker still answers, its chains failed for the servers' reason (what the
      // run's maxFailureShare check then names), not a silent worker.
      const doomedScope = yield* Scope.make()
      const doomed = yield* OpenAiServer.make(folder, { acceptWeights: {} }).pipe(
        Effect.provideService(PolicyEngine, engine),
        Scope.provide(doomedScope)
      )
      const noServers = yield* InferenceServers.make({
        urls: [doomed.baseUrl],
        parameters,
        pushes: false,
        giveUpMs: 200,
        restMs: 50
      })
      yield* Scope.close(doomedScope, Exit.void)
      const stranded = yield* RolloutWorker.serve(agent, noServers, { heartbeatMs: 100 }).pipe(Scope.provide(scope))
      const asked = yield* RolloutWorker.client({ urls: [stranded.baseUrl], agentKey: key, runId, silenceMs: 2_000 })
      const strandedGroups = yield* asked.collect(rows.slice(0, 1), sampling, 1)
      const failures = RolloutFigures.infrastructureFailures(strandedGroups.flatMap((g) => g.trajectories))
      assert.deepStrictEqual([failures.share, failures.reason, failures.total], [1, "SamplerTransient", 3])
      assert.include(RolloutFigures.firstFailure(strandedGroups.flatMap((g) => g.trajectories)), doomed.baseUrl)
      yield* Scope.close(scope, Exit.void)
    }).pipe(Effect.provide([NodeServices.layer, ResourceManager.ResourceManager.layer]))), { timeout: 300_000 })

  it.live("a queue worker rolls a batch out as one process does; it answers an unreadable share, drops a gone trainer's", () =>
    Effect.scoped(Effect.gen(function*() {
      const { runId, agent, key, trainerSide, workerSide } = yield* fixture
      const server = yield* redisServer
      const redis = new Redis(server.url)
      yield* Effect.addFinalizer(() => Effect.sync(() => redis.disconnect()))
      const here = yield* Rollouts.collectGroups(agent, rows, sampling).pipe(
        Effect.provideService(Sampler, trainerSide.sampler(1))
      )
      const taken: Array<number> = []
      yield* RolloutQueue.work(agent, workerSide, key, {
        url: server.url,
        name: "w1",
        onShare: (_id, count) => Effect.sync(() => void taken.push(count))
      }).pipe(Effect.forkScoped)
      const queue = yield* RolloutQueue.client({ url: server.url, agentKey: key, runId, shareRows: 2 })
      const there = yield* queue.collect(rows, sampling, 1)
      assert.deepStrictEqual(view(there), view(here))
      assert.deepStrictEqual([...taken].sort(), [1, 2, 2])
      const figures = yield* queue.figures!
      assert.deepStrictEqual(
        [figures["workers/shares"], figures["workers/duplicates"], figures["workers/resent"]],
        [3, 0, 0]
      )
      // The worker's requests to the servers reach the run's figures: one per sampled turn.
      const turns = there.flatMap((g) => g.trajectories).reduce(
        (n, t) => n + t.segments.filter((segment) => segment.spans.some((span) => span.source === "policy")).length,
        0
      )
      assert.deepStrictEqual([figures["servers/requests"], figures["servers/failures"]], [turns, 0])

      // Written by hand: a share the worker cannot read goes back to its (alive) trainer as a failure; a share of a
      // trainer that is gone is dropped unrun; a share replying anywhere but this run's results streams (here a key
      // of someone else's, marked alive) is dropped without a write or an expiry on that key.
      const shares = `agentfly:rollouts:${runId}:shares`
      const alive = `agentfly:rollouts:${runId}:results:00000000-0000-4000-8000-000000000001`
      const gone = `agentfly:rollouts:${runId}:results:00000000-0000-4000-8000-000000000002`
      yield* Effect.promise(() => redis.set(`${alive}:alive`, "1"))
      yield* Effect.promise(() => redis.set("victim:alive", "1"))
      yield* Effect.promise(() =>
        redis.xadd(shares, "*", "p", JSON.stringify({ id: "stray", replyTo: "victim", request: { rows: [] } }))
      )
      yield* Effect.promise(() =>
        redis.xadd(shares, "*", "p", JSON.stringify({ id: "bad", replyTo: alive, request: { rows: 1 } }))
      )
      yield* Effect.promise(() =>
        redis.xadd(shares, "*", "p", JSON.stringify({ id: "orphan", replyTo: gone, request: { rows: [] } }))
      )
      const replies = yield* Effect.promise(() =>
        redis.xread("BLOCK", 30_000, "STREAMS", alive, "0-0") as Promise<Array<[string, Array<[string, Array<string>]>]>>
      )
      const reply = JSON.parse(replies[0]![1][0]![1][1]!) as { id: string; error: string }
      assert.strictEqual(reply.id, "bad")
      assert.match(reply.error, /^the share could not be read: /)
      // All taken off the stream (acknowledged and deleted), the orphan's trainer never answered.
      yield* Effect.promise(async () => {
        while ((await redis.xlen(shares)) > 0) await new Promise((resolve) => setTimeout(resolve, 50))
      })
      assert.strictEqual(yield* Effect.promise(() => redis.exists(gone)), 0)
      assert.strictEqual(yield* Effect.promise(() => redis.exists("victim")), 0)
      assert.strictEqual(yield* Effect.promise(() => redis.ttl("victim:alive")), -1)
      assert.deepStrictEqual([...taken].sort(), [1, 2, 2])
    }).pipe(Effect.provide([NodeServices.layer, ResourceManager.ResourceManager.layer]))), { timeout: 300_000 })
})
