/**
 * Our Tinker client against our Tinker server killed mid-future: the learner's `optim_step` is pending when the
 * server dies; the client's polls lose their connection and back off; the server started again on the same port and
 * state directory completes the step once, and the client gets its result. The weights afterwards are those of one
 * in-process step (two steps would differ).
 */
import { NodeServices } from "@effect/platform-node"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, FileSystem, Layer, Scope } from "effect"
import * as TinkerServer from "../../../actors/tinker/TinkerServer.ts"
import * as TinkerClient from "../../../src/backends/TinkerClient.ts"
import * as TinkerTrainer from "../../../src/backends/TinkerTrainer.ts"
import * as Loss from "../../../src/Loss.ts"
import * as LrSchedule from "../../../src/LrSchedule.ts"
import type * as Packing from "../../../src/Packing.ts"
import * as Datums from "../../../src/tinker/Datums.ts"
import { adam, base, client, forwardLogprobs, inProcess, sftData } from "../../tinker/utils.ts"

describe("TinkerClient across a server restart", () => {
  it.live("a step pending when the server dies completes once after it restarts; the client waits it out", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const stateDir = yield* fs.makeTempDirectoryScoped({ prefix: "tinker-client-restart-" })
      const first = yield* Scope.make()
      const held = yield* Deferred.make<void>()
      const before = yield* TinkerServer.serve({
        bases: [base],
        stateDir,
        pollMillis: 100,
        // The optimiser step never runs on the first server: it is pending when the server dies.
        beforeRun: (route) =>
          route === "optim_step" ? Deferred.succeed(held, undefined).pipe(Effect.andThen(Effect.never)) : Effect.void
      }).pipe(Scope.provide(first))
      const port = new URL(before.baseUrl).port
      const tinker = yield* TinkerClient.make({ baseUrl: before.baseUrl, initialRetryMs: 50, maxRetryMs: 200 })
      const trainer = yield* TinkerTrainer.make({
        baseModel: base.name,
        loss: Loss.sft,
        optimizer: { beta1: adam.beta1, beta2: adam.beta2, eps: adam.eps, weightDecay: 0, maxGradNorm: 1 },
        schedule: LrSchedule.constant(adam.learning_rate)
      }).pipe(Effect.provideService(TinkerClient.TinkerClient, tinker))
      yield* trainer.forwardBackward(Datums.toMicroBatch(sftData(), "cross_entropy") as Packing.MicroBatch)
      const step = yield* Effect.forkChild(trainer.optimStep)
      yield* Deferred.await(held)
      yield* Scope.close(first, Exit.void)
      // The client is polling a server that is gone; a new one comes up on the same port and state.
      yield* Effect.sleep(300)
      const after = yield* TinkerServer.serve({ bases: [base], stateDir, port: Number(port), pollMillis: 100 })
      const result = yield* Fiber.join(step)
      assert.strictEqual(result.step, 1)
      assert.isAbove(tinker.traffic.retries + tinker.traffic.polls, 2)
      // One step's weights: the in-process learner's after one step, to the bit.
      const expected = yield* inProcess([sftData()], 1)
      const logprobs = yield* forwardLogprobs(client(after.baseUrl), yield* trainer.modelId, sftData())
      assert.deepStrictEqual(logprobs, expected.logprobs)
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(NodeServices.layer, NodeHttpClient.layerNodeHttp))), 300_000)
})
