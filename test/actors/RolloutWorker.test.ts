/**
 * Rollout workers on the real parts: the calculator task's chains run by `RolloutWorker.serve` (two workers over
 * loopback HTTP) sampling on an `OpenAiServer` (tiny Qwen2 on onnxruntime) that the trainer's `InferenceServers`
 * pushed weights to. A batch split over the workers comes back as the groups one process rolls out (ids, row
 * indices, prompts, sampled tokens, rewards); a dead worker's share goes to the other; a worker of another config
 * is refused, and a batch no worker can take fails with a typed error.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, FileSystem, Scope } from "effect"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as InferenceServers from "../../actors/InferenceServers.ts"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as RolloutWorker from "../../actors/RolloutWorker.ts"
import * as Trainer from "../../actors/Trainer.ts"
import { task as calculator } from "../../environments/calculator/CalculatorTask.ts"
import type * as Dataset from "../../src/Dataset.ts"
import * as Task from "../../src/Task.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import { Sampler } from "../../src/Sampler.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import { randomWeights } from "../utils/tinyModel.ts"

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
const startWorker = (agent: Trainer.Agent, servers: InferenceServers.InferenceServers, token?: string) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const worker = yield* RolloutWorker.serve(agent, servers, { token }).pipe(Scope.provide(scope))
    return { ...worker, close: Scope.close(scope, Exit.void) }
  })

describe("RolloutWorker", () => {
  it.live("a batch split over two workers is the batch one process rolls out; a dead worker's share moves", () =>
    Effect.scoped(Effect.gen(function*() {
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
      const agent = yield* Trainer.agent({ task, config, format: ChainFormat.ofConfig(config, folder) })
      const workerSide = yield* InferenceServers.make({ urls: [server.baseUrl], parameters, restMs: 50 })
      // Each worker's environment reports its own pool figures, which the trainer's record merges.
      const withEnv = (figures: Record<string, number>) => ({
        ...agent,
        runtime: { ...agent.runtime, environmentStats: Effect.succeed(figures) }
      })
      const w1 = yield* startWorker(withEnv({ "env/box/leases": 3, "env/box/acquire_wait_p99_ms": 7, "env/box/in_use": 1 }), workerSide)
      const w2 = yield* startWorker(withEnv({ "env/box/leases": 5, "env/box/acquire_wait_p99_ms": 2, "env/box/in_use": 0 }), workerSide)
      const key = RolloutWorker.agentKey(task.name, config)
      const client = yield* RolloutWorker.client({ urls: [w1.baseUrl, w2.baseUrl], agentKey: key, restMs: 50 })

      // Greedy, so that what is sampled does not depend on which requests share the server's batch.
      const sampling = { firstSeq: 40, chains: 3, temperature: 0, seed: 1234 }
      const here = yield* Trainer.collectGroups(agent, rows, sampling).pipe(
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
      assert.strictEqual(none.reason, "Workers")
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
      const otherAgent = yield* Trainer.agent({ task, config: other, format: ChainFormat.ofConfig(other, folder) })
      const stranger = yield* startWorker(otherAgent, workerSide)
      const refused = yield* Effect.flip(RolloutWorker.client({ urls: [stranger.baseUrl], agentKey: key }))
      assert.strictEqual(refused.reason, "Workers")
      assert.match(refused.message, /runs task "calculator" with another config/)
      // A worker with a token serves only requests that bear it.
      const guarded = yield* startWorker(agent, workerSide, "s3cret")
      const unauthorized = yield* Effect.flip(RolloutWorker.client({ urls: [guarded.baseUrl], agentKey: key }))
      assert.match(unauthorized.message, /refuses this run's token \(HTTP 401: .*\): set AGENTFLY_WORKER_TOKEN to the token/)
      assert.notInclude(unauthorized.message, "start it with")
      const rawShare = yield* Effect.promise(() =>
        fetch(`${guarded.baseUrl}/rollouts`, { method: "POST", body: "{}" }).then((r) => r.status)
      )
      assert.strictEqual(rawShare, 401)
      const authorized = yield* RolloutWorker.client({ urls: [guarded.baseUrl], agentKey: key, token: "s3cret" })
      assert.deepStrictEqual(view(yield* authorized.collect(rows.slice(0, 2), sampling, 1)), view(here.slice(0, 2)))

      const absent = yield* Effect.flip(RolloutWorker.client({ urls: ["http://127.0.0.1:9/v1"], agentKey: key }))
      assert.include(absent.message, "rollout worker http://127.0.0.1:9/v1 did not answer GET /worker")
    }).pipe(Effect.provide([NodeServices.layer, ResourceManager.ResourceManager.layer]))), { timeout: 120_000 })
})
