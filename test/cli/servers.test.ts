/**
 * `agentfly train` with `engine.servers` and `rollout.workers`, as a user runs it: `agentfly serve --accept-weights`
 * processes sample the rollouts and follow the learner's weights, `agentfly rollout-worker` processes run the
 * training batches' chains. A server, then a worker, is killed with SIGKILL mid-run; the run still trains every step
 * on the others and says so. The Redis-queue chaos run (a worker SIGKILLed mid-share, Redis restarted, the trainer
 * SIGKILLed and resumed) runs with tokens on (`AGENTFLY_WORKER_TOKEN`, `AGENTFLY_WEIGHTS_TOKEN`); a worker with the
 * wrong token and a run whose task and agent match another's on the same Redis never train.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import type { ChildProcess } from "node:child_process"
import * as net from "node:net"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as Generate from "../../examples/calculator/generate.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { agentfly, calculatorRun, metricsOf, startCommand } from "../utils/agentfly.ts"
import { freePort, redisServer } from "../utils/redisServer.ts"

const root = resolve(import.meta.dirname, "../..")
const start = startCommand

/** The run's config: the calculator task on the tiny preset, `steps` RL steps, with `engine` and `rollout` keys. */
const configOf = (steps: number, engine: object, rollout: object = {}) =>
  calculatorRun({
    seed: 11,
    output: "run",
    // Every step moves the weights (an entropy bonus under a non-group-relative estimator), so that every push
    // is a new version.
    algorithm: { steps, groupsPerStep: 4, microBatchSize: 8, lr: 0.001, advantage: "reinforce++", entropyCoef: 0.01 },
    eval: { every: 4, size: 8 },
    engine,
    rollout
  })

/** SIGKILLs `child` once the run's `metrics.jsonl` holds `after` train records. */
const killAfter = (metrics: string, after: number, child: ChildProcess) => {
  let killedAt: number | undefined
  const watch = setInterval(() => {
    if (killedAt !== undefined || !existsSync(metrics)) return
    const trained = readFileSync(metrics, "utf8").split("\n").filter((l) => l.includes('"phase":"train"')).length
    if (trained >= after) {
      killedAt = trained
      child.kill("SIGKILL")
    }
  }, 20)
  return { killedAt: () => killedAt, stop: Effect.sync(() => clearInterval(watch)) }
}

/**
 * A TCP proxy on loopback to `port`: `cut()` drops its connections and refuses new ones (a dead server),
 * `switchTo(other)` takes connections again, to another port (the server restarted, empty).
 */
const switchingProxy = (port: number) =>
  Effect.acquireRelease(
    Effect.callback<{
      readonly url: string
      readonly cut: () => void
      readonly switchTo: (p: number) => void
      readonly server: net.Server
    }>(
      (resume) => {
        let upstream: number | undefined = port
        const open = new Set<net.Socket>()
        const server = net.createServer((client) => {
          if (upstream === undefined) return client.destroy()
          const target = net.connect(upstream, "127.0.0.1")
          open.add(client).add(target)
          client.pipe(target).pipe(client)
          const end = () => {
            client.destroy()
            target.destroy()
            open.delete(client)
            open.delete(target)
          }
          client.on("error", end).on("close", end)
          target.on("error", end).on("close", end)
        })
        server.listen(0, "127.0.0.1", () =>
          resume(Effect.succeed({
            url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}/v1`,
            cut: () => {
              upstream = undefined
              for (const socket of open) socket.destroy()
            },
            switchTo: (p: number) => void (upstream = p),
            server
          })))
      }
    ),
    ({ server }) => Effect.sync(() => server.close())
  )

/** Sets environment variables (spawned commands inherit them) for the life of the scope. */
const withEnv = (vars: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const before = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]))
      Object.assign(process.env, vars)
      return before
    }),
    (before) =>
      Effect.sync(() => {
        for (const [k, v] of Object.entries(before)) {
          if (v === undefined) delete process.env[k]
          else process.env[k] = v
        }
      })
  )

/** Runs `effect` (a command's start) with `vars` set, restoring them once it is done. */
const startingWith = <A, E, R>(vars: Record<string, string>, effect: Effect.Effect<A, E, R>) =>
  Effect.acquireUseRelease(
    Effect.sync(() => {
      const before = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]))
      Object.assign(process.env, vars)
      return before
    }),
    () => effect,
    (before) =>
      Effect.sync(() => {
        for (const [k, v] of Object.entries(before)) {
          if (v === undefined) delete process.env[k]
          else process.env[k] = v
        }
      })
  )

/** The learner steps a run's journal lists, in order. */
const journaledSteps = (output: string) =>
  readFileSync(join(output, "journal.jsonl"), "utf8").split("\n").filter((l) => l !== "")
    .map((l) => JSON.parse(l) as { kind: string; step?: number })
    .flatMap((e) => (e.kind === "step" ? [e.step!] : []))

/** A run's train records (none when it wrote no metrics). */
const trainedIn = (output: string) =>
  existsSync(join(output, "metrics.jsonl")) ? metricsOf(output).filter((m) => m.phase === "train") : []

/** A run's directory with the calculator's data and the model folder its servers serve. */
const runDir = Effect.gen(function*() {
  const dir = mkdtempSync(join(tmpdir(), "train-servers-"))
  yield* Generate.write({ dir: join(dir, "data"), seed: 5, train: 64, heldOut: 8, validation: 4, demos: 64, noise: 0 })
  // The servers serve the same model folder the run trains (its tokenizer and shapes); its weights are replaced.
  yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
  return dir
})

describe("agentfly train with inference servers and rollout workers", () => {
  it.live("two servers sample and follow the learner; one SIGKILLed mid-run, the run trains every step", () =>
    Effect.scoped(Effect.gen(function*() {
      const dir = yield* runDir
      const flags = ["--model-dir", join(dir, "model"), "--port", "0", "--accept-weights"]
      const a = yield* start("serve", flags)
      const b = yield* start("serve", flags)
      const steps = 8
      writeFileSync(join(dir, "config.json"), JSON.stringify(configOf(steps, { servers: [a.url, b.url] })))
      // Server b dies once the run has logged its second step.
      const killer = killAfter(join(dir, "run", "metrics.jsonl"), 2, b.child)
      const run = yield* agentfly(["train", join(dir, "config.json")]).pipe(Effect.ensuring(killer.stop))
      assert.strictEqual(run.code, 0, run.output)
      assert.isDefined(killer.killedAt(), "server b was never killed")
      assert.isBelow(killer.killedAt()!, steps)
      assert.include(run.output, `trained ${steps} of ${steps} steps`)
      assert.include(run.output, `inference server ${b.url} failed`)
      const trainSteps = metricsOf(join(dir, "run")).filter((m) => m.phase === "train")
      assert.strictEqual(trainSteps.length, steps)
      // The survivor holds the run's last version; every step's rollouts came from the servers.
      const models = yield* Effect.promise(() => fetch(`${a.url}/models`).then((r) => r.json()))
      assert.strictEqual((models as { data: Array<{ policy_version: number }> }).data[0]!.policy_version, steps)
      for (const m of trainSteps) assert.isAbove(m.figures["rollout/policy_tokens"]!, 0)
      // The metrics say it too: requests served every step, failures after the kill, one server up to date at the end.
      for (const m of trainSteps) assert.isAbove(m.figures["servers/requests"]!, 0)
      assert.isAbove(trainSteps.reduce((n, m) => n + m.figures["servers/failures"]!, 0), 0)
      assert.strictEqual(trainSteps[0]!.figures["servers/up_to_date"], 2)
      assert.strictEqual(trainSteps[steps - 1]!.figures["servers/up_to_date"], 1)
    }).pipe(Effect.provide(NodeServices.layer))), { timeout: 240_000 })

  it.live("a trainer server pushes the weights to the servers itself; a server replaced mid-run follows again", () =>
    Effect.scoped(Effect.gen(function*() {
      const dir = yield* runDir
      const trainer = yield* start("trainer", ["--port", String(yield* freePort)])
      const flags = ["--model-dir", join(dir, "model"), "--accept-weights", "--port", "0"]
      const a = yield* start("serve", flags)
      const b = yield* start("serve", flags)
      // b's replacement is started now (a server takes seconds to start on a busy machine): the run knows b by a
      // proxy's address, which is switched to the replacement half a second after b is killed.
      const replacement = yield* start("serve", flags)
      const proxy = yield* switchingProxy(Number(new URL(b.url).port))
      const steps = 8
      writeFileSync(
        join(dir, "config.json"),
        JSON.stringify({
          ...configOf(steps, { servers: [a.url, proxy.url] }),
          learner: { url: trainer.url },
          checkpoint: { every: 4 }
        })
      )
      const killer = killAfter(join(dir, "run", "metrics.jsonl"), 2, b.child)
      const switched = yield* Effect.forkChild(Effect.gen(function*() {
        while (killer.killedAt() === undefined) yield* Effect.sleep(20)
        proxy.cut()
        yield* Effect.sleep(500)
        proxy.switchTo(Number(new URL(replacement.url).port))
      }))
      const run = yield* agentfly(["train", join(dir, "config.json")]).pipe(Effect.ensuring(killer.stop))
      assert.strictEqual(run.code, 0, run.output)
      assert.include(run.output, `trained ${steps} of ${steps} steps`)
      assert.isDefined(killer.killedAt(), "server b was never killed")
      assert.isBelow(killer.killedAt()!, steps - 2)
      yield* Fiber.join(switched)
      assert.include(run.output, `inference server ${proxy.url} failed`)
      const trainSteps = metricsOf(join(dir, "run")).filter((m) => m.phase === "train")
      assert.strictEqual(trainSteps.length, steps)
      // The weights never came back to the run: a step's traffic from the trainer is its logprobs and figures
      // (≈ 5 KB), not the tiny preset's 2.7 MB. Two records carry more: the first (the warm-up's checkpoint, and the
      // weights handed from one trainer to the next) and the one after step 4's checkpoint (the run keeps its files).
      const received = trainSteps.map((m) => m.figures["trainer/received_mb"]!)
      assert.strictEqual(received.filter((mb) => mb < 0.1).length, steps - 2, String(received))
      for (const m of trainSteps) assert.isAbove(m.figures["servers/requests"]!, 0)
      // Both servers hold the last version at the end, the replacement too: the trainer pushed to it (or caught it up).
      assert.strictEqual(trainSteps[steps - 1]!.figures["servers/up_to_date"], 2, run.output.slice(-2000))
      for (const url of [a.url, replacement.url]) {
        const models = yield* Effect.promise(() => fetch(`${url}/models`).then((r) => r.json()))
        assert.strictEqual((models as { data: Array<{ policy_version: number }> }).data[0]!.policy_version, steps)
      }
      // The fingerprints the run journaled (the trainer's summaries) are those of the checkpoints' weights.
      const journal = readFileSync(join(dir, "run", "journal.jsonl"), "utf8").split("\n").filter((l) => l !== "")
        .map((l) => JSON.parse(l) as { kind: string; path?: string; weightsHash?: string })
      // (Those still on disk: a run keeps its last few.)
      const checkpoints = journal.filter((e) =>
        e.kind === "checkpoint" && existsSync(join(dir, "run", "checkpoints", e.path!))
      )
      assert.isAtLeast(checkpoints.length, 2)
      for (const c of checkpoints) {
        const state = JSON.parse(readFileSync(join(dir, "run", "checkpoints", c.path!, "trainer_state.json"), "utf8"))
        assert.strictEqual(c.weightsHash, state.weightsHash)
      }
    }).pipe(Effect.provide(NodeServices.layer))), { timeout: 240_000 })

  it.live("two rollout workers run the batches' chains; one SIGKILLed mid-run, its shares go to the other", () =>
    Effect.scoped(Effect.gen(function*() {
      const dir = yield* runDir
      const server = yield* start("serve", ["--model-dir", join(dir, "model"), "--port", "0", "--accept-weights"])
      const steps = 6
      // The workers load the run's config (their agent key does not depend on the workers list, written after).
      const config = join(dir, "config.json")
      writeFileSync(config, JSON.stringify(configOf(steps, { servers: [server.url] })))
      const w1 = yield* start("rollout-worker", [config, "--port", "0"])
      const w2 = yield* start("rollout-worker", [config, "--port", "0"])
      writeFileSync(config, JSON.stringify(configOf(steps, { servers: [server.url] }, { workers: [w1.url, w2.url] })))
      const killer = killAfter(join(dir, "run", "metrics.jsonl"), 2, w2.child)
      const run = yield* agentfly(["train", config]).pipe(Effect.ensuring(killer.stop))
      assert.strictEqual(run.code, 0, run.output)
      assert.isDefined(killer.killedAt(), "worker 2 was never killed")
      assert.include(run.output, `trained ${steps} of ${steps} steps`)
      assert.include(run.output, `rollout worker ${w2.url} failed`)
      const trainSteps = metricsOf(join(dir, "run")).filter((m) => m.phase === "train")
      assert.strictEqual(trainSteps.length, steps)
      for (const m of trainSteps) assert.isAbove(m.figures["rollout/policy_tokens"]!, 0)
      // Every batch in two shares (the survivor takes both once its peer is gone); the failed attempts are counted.
      for (const m of trainSteps) assert.strictEqual(m.figures["workers/shares"], 2)
      assert.isAbove(trainSteps.reduce((n, m) => n + m.figures["workers/failures"]!, 0), 0)
      // The workers' sampling requests are the run's: every step's batch was sampled on the server through them.
      for (const m of trainSteps) assert.isAbove(m.figures["servers/requests"]!, 0)

      // A worker started with another config is refused by the trainer before anything trains.
      const other = join(dir, "other.json")
      writeFileSync(other, JSON.stringify({
        ...configOf(steps, { servers: [server.url] }, { workers: [w1.url] }),
        agent: { systemPrompt: "Another prompt.", renderTools: false, maxContextTokens: 256 },
        output: "other"
      }))
      const refused = yield* agentfly(["train", other])
      assert.notStrictEqual(refused.code, 0)
      assert.include(refused.output, `rollout worker ${w1.url} runs task "calculator" with another config`)
      assert.include(refused.output, `agent.systemPrompt: "Another prompt." → "Use the calculator tool."`)
    }).pipe(Effect.provide(NodeServices.layer))), { timeout: 240_000 })

  it.live("rollout workers on a Redis queue, tokens on: one SIGKILLed mid-share, the other claims its share; Redis restarted mid-batch, lost shares sent again; the trainer SIGKILLed and resumed, every step once; no worker, a typed stop", () =>
    Effect.scoped(Effect.gen(function*() {
      // Authentication on: the workers sign their results, the servers want a token for every route.
      yield* withEnv({ AGENTFLY_WORKER_TOKEN: "chaos-worker-token", AGENTFLY_WEIGHTS_TOKEN: "chaos-serve-token" })
      const dir = yield* runDir
      const redis = yield* redisServer
      const server = yield* start("serve", ["--model-dir", join(dir, "model"), "--port", "0", "--accept-weights"])
      const steps = 6
      const config = join(dir, "config.json")
      writeFileSync(config, JSON.stringify(configOf(steps, { servers: [server.url] }, { queue: redis.url, shareRows: 1 })))
      const onQueue = /on the queue (\S+),/
      const worker = (file: string, concurrency = 2) =>
        start("rollout-worker", [file, "--queue", redis.url, "--claim-seconds", "2", "--concurrency", String(concurrency)], onQueue)
      const w1 = yield* worker(config)
      const w2 = yield* worker(config)
      // Worker 2 dies right after it takes a share, once the run has logged two steps.
      const metrics = join(dir, "run", "metrics.jsonl")
      const shareLines = () => (w2.output().match(/^share /gm) ?? []).length
      let killedAt: number | undefined
      let sharesThen: number | undefined
      const watch = setInterval(() => {
        if (killedAt !== undefined || !existsSync(metrics)) return
        const trained = readFileSync(metrics, "utf8").split("\n").filter((l) => l.includes('"phase":"train"')).length
        if (trained < 2) return
        if (sharesThen === undefined) sharesThen = shareLines()
        else if (shareLines() > sharesThen) {
          killedAt = trained
          w2.child.kill("SIGKILL")
        }
      }, 5)
      const run = yield* agentfly(["train", config]).pipe(Effect.ensuring(Effect.sync(() => clearInterval(watch))))
      assert.strictEqual(run.code, 0, run.output)
      assert.isDefined(killedAt, "worker 2 was never killed")
      assert.include(run.output, `trained ${steps} of ${steps} steps`)
      assert.include(w1.output(), "claimed from a worker that stopped")
      const trainSteps = metricsOf(join(dir, "run")).filter((m) => m.phase === "train")
      assert.strictEqual(trainSteps.length, steps)
      // The run counts and says the takeover too.
      assert.isAtLeast(trainSteps.reduce((n, m) => n + (m.figures["workers/reclaimed"] ?? 0), 0), 1)
      assert.include(run.output, "after the worker that took it stopped")
      // Every batch in 4 shares (a row each), every step's rollouts sampled.
      for (const m of trainSteps) {
        assert.strictEqual(m.figures["workers/shares"], 4)
        assert.isAbove(m.figures["rollout/policy_tokens"]!, 0)
        // The queue workers' sampling requests are the run's.
        assert.isAbove(m.figures["servers/requests"]!, 0)
      }
      // Both workers took shares before the kill.
      assert.isAbove(shareLines(), 0)
      assert.isAbove((w1.output().match(/^share /gm) ?? []).length, 0)

      // Redis restarts (no persistence) while a batch waits on the queue: the run sends the lost shares again. (A
      // worker serves one run: the one its config names, output folder included.)
      w1.child.kill("SIGKILL")
      const restart = join(dir, "restart.json")
      writeFileSync(restart, JSON.stringify({
        ...configOf(3, { servers: [server.url] }, { queue: redis.url, shareRows: 1 }),
        output: "restart"
      }))
      const w3 = yield* worker(restart, 1)
      const restartMetrics = join(dir, "restart", "metrics.jsonl")
      const w3Shares = () => (w3.output().match(/^share /gm) ?? []).length
      let restarted = false
      let w3Then: number | undefined
      const watchRestart = setInterval(() => {
        if (restarted || !existsSync(restartMetrics)) return
        if (!readFileSync(restartMetrics, "utf8").includes('"phase":"train"')) return
        if (w3Then === undefined) w3Then = w3Shares()
        else if (w3Shares() > w3Then) {
          restarted = true
          Effect.runFork(Effect.andThen(redis.kill, redis.start))
        }
      }, 5)
      const survived = yield* agentfly(["train", restart]).pipe(Effect.ensuring(Effect.sync(() => clearInterval(watchRestart))))
      assert.strictEqual(survived.code, 0, survived.output)
      assert.isTrue(restarted, "redis was never restarted")
      assert.include(survived.output, "trained 3 of 3 steps")
      assert.include(survived.output, "sending them again")
      const resent = metricsOf(join(dir, "restart")).filter((m) => m.phase === "train").map((m) => m.figures["workers/resent"]!)
      assert.isAbove(Math.max(...resent), 0)
      w3.child.kill("SIGKILL")

      // The trainer SIGKILLed once step 3 is journaled, then resumed, its worker running on: every step once.
      const resume = join(dir, "resume.json")
      writeFileSync(resume, JSON.stringify({
        ...configOf(6, { servers: [server.url] }, { queue: redis.url, shareRows: 1 }),
        checkpoint: { every: 2 },
        output: "resume"
      }))
      const w4 = yield* worker(resume)
      const journal = join(dir, "resume", "journal.jsonl")
      const killed = yield* agentfly(["train", resume], () =>
        existsSync(journal) && readFileSync(journal, "utf8").includes(`"kind":"step","step":3`))
      assert.strictEqual(killed.signal, "SIGKILL", killed.output)
      const partial = journaledSteps(join(dir, "resume"))
      assert.isTrue(partial.length >= 3 && partial.length < 6, `killed mid-run after steps ${partial}`)
      const resumed = yield* agentfly(["train", resume, "--resume"])
      assert.strictEqual(resumed.code, 0, resumed.output)
      assert.deepStrictEqual(journaledSteps(join(dir, "resume")), [1, 2, 3, 4, 5, 6], "every learner step exactly once")
      assert.isAbove((w4.output().match(/^share /gm) ?? []).length, 0)
      w4.child.kill("SIGKILL")

      // No worker of this config left, one of another config running: the run stops, naming what it saw.
      const otherConfig = join(dir, "other.json")
      writeFileSync(otherConfig, JSON.stringify({
        ...configOf(steps, { servers: [server.url] }, { queue: redis.url }),
        agent: { systemPrompt: "Another prompt.", renderTools: false, maxContextTokens: 256 },
        output: "other"
      }))
      const other = yield* worker(otherConfig)
      const alone = join(dir, "alone.json")
      writeFileSync(alone, JSON.stringify({
        ...configOf(steps, { servers: [server.url] }, { queue: redis.url, timeoutSeconds: 3 }),
        output: "alone"
      }))
      const stopped = yield* agentfly(["train", alone])
      assert.notStrictEqual(stopped.code, 0)
      assert.include(stopped.output, "got no result from the rollout queue")
      assert.match(stopped.output, /workers seen in the last 30 s: .*agent key/)
      // The worker of another config reads another stream: it never saw this run's shares.
      assert.notMatch(other.output(), /^share /m)
    }).pipe(Effect.provide(NodeServices.layer))), { timeout: 600_000 })

  it.live("on one Redis: a worker with the wrong token, and a run whose task and agent match another's, never train", () =>
    Effect.scoped(Effect.gen(function*() {
      yield* withEnv({ AGENTFLY_WORKER_TOKEN: "the-run-token" })
      const dir = yield* runDir
      const redis = yield* redisServer
      const server = yield* start("serve", ["--model-dir", join(dir, "model"), "--port", "0", "--accept-weights"])
      const configAt = (name: string, rollout: object = {}) => {
        const file = join(dir, `${name}.json`)
        writeFileSync(file, JSON.stringify({
          ...configOf(2, { servers: [server.url] }, { queue: redis.url, shareRows: 1, ...rollout }),
          output: name
        }))
        return file
      }
      const worker = (file: string) =>
        start("rollout-worker", [file, "--queue", redis.url], /on the queue (\S+),/)
      // Run x has a worker; run y (the same task and agent section, another output) has none; run z's only worker
      // was given another token.
      const x = configAt("x"), y = configAt("y", { timeoutSeconds: 20 }), z = configAt("z")
      const wx = yield* worker(x)
      const wz = yield* startingWith({ AGENTFLY_WORKER_TOKEN: "a-wrong-token" }, worker(z))
      const [runX, runY, runZ] = yield* Effect.all(
        [agentfly(["train", x]), agentfly(["train", y]), agentfly(["train", z])],
        { concurrency: "unbounded" }
      )
      assert.strictEqual(runX.code, 0, runX.output)
      assert.include(runX.output, "trained 2 of 2 steps")
      // x's worker took x's shares, never y's: y waited for a worker of its own in vain, and trained nothing.
      assert.isAbove((wx.output().match(/^share /gm) ?? []).length, 0)
      assert.notStrictEqual(runY.code, 0)
      assert.include(runY.output, "got no result from the rollout queue")
      assert.strictEqual(trainedIn(join(dir, "y")).length, 0)
      // z's worker answered with the wrong key: refused, typed, nothing trained.
      assert.isAbove((wz.output().match(/^share /gm) ?? []).length, 0)
      assert.notStrictEqual(runZ.code, 0)
      assert.include(runZ.output, "fails its authentication")
      assert.include(runZ.output, "nothing of it is trained on")
      assert.strictEqual(trainedIn(join(dir, "z")).length, 0)
    }).pipe(Effect.provide(NodeServices.layer))), { timeout: 300_000 })

  it.live("an agent function (the openai SDK example) rolled out by a queue worker through the worker's own gateway", () =>
    Effect.scoped(Effect.gen(function*() {
      const dir = yield* runDir
      const redis = yield* redisServer
      const server = yield* start("serve", ["--model-dir", join(dir, "model"), "--port", "0", "--accept-weights"])
      const config = join(dir, "sdk.json")
      writeFileSync(config, JSON.stringify({
        ...configOf(2, { servers: [server.url] }, { queue: redis.url, shareRows: 1 }),
        task: join(root, "examples", "sdk-agents", "openai.ts"),
        output: "sdk"
      }))
      const worker = yield* start("rollout-worker", [config, "--queue", redis.url], /on the queue (\S+),/)
      const run = yield* agentfly(["train", config])
      assert.strictEqual(run.code, 0, run.output)
      assert.include(run.output, "trained 2 of 2 steps")
      assert.include(worker.output(), "task calculator-openai")
      const trainSteps = metricsOf(join(dir, "sdk")).filter((m) => m.phase === "train")
      for (const m of trainSteps) {
        assert.strictEqual(m.figures["workers/shares"], 4)
        assert.isAbove(m.figures["rollout/policy_tokens"]!, 0)
        assert.strictEqual(m.figures["rollout/failure_share"], 0)
      }
    }).pipe(Effect.provide(NodeServices.layer))), { timeout: 240_000 })
})
