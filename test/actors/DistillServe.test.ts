/**
 * On-policy distillation whose teacher is `agentfly serve` (the OpenAI-compatible server in front of a policy
 * engine, started here on loopback): the run checks the teacher's tokenizer (`/tokenize`) and prompt logprobs at
 * its start, trains, and reports `learner/teacher_kl`, equal to the same run's with the teacher's model folder
 * scored here (the served scores are the learner's forward pass's, to float tolerance).
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as LocalPolicy from "../../actors/LocalPolicy.ts"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as RolloutSetup from "../../actors/RolloutSetup.ts"
import * as Rollouts from "../../actors/Rollouts.ts"
import * as RunError from "../../actors/RunError.ts"
import * as CalculatorTask from "../../environments/calculator/CalculatorTask.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { Sampler } from "../../src/Sampler.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"

const fixture = Effect.gen(function*() {
  const dir = mkdtempSync(join(tmpdir(), "distill-serve-"))
  yield* Generate.write({ dir, seed: 5, train: 8, heldOut: 2, validation: 1, demos: 1, noise: 0 })
  yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
  yield* ModelFolder.init(join(dir, "teacher"), { preset: "tiny", seed: 8 })
  const folder = yield* ModelFolder.load(join(dir, "model"))
  const train = yield* Dataset.load(join(dir, "train.jsonl"), { onInvalid: "stop" })
  const configOf = (teacher: unknown) =>
    Effect.map(
      TrainConfig.decode({
        output: join(dir, "run"),
        model: { path: join(dir, "model") },
        data: { train: join(dir, "train.jsonl") },
        task: "calculator",
        agent: { renderTools: false, maxTurns: 2, numChains: 3, maxNewTokens: 32, maxContextTokens: 384 },
        algorithm: { steps: 2, groupsPerStep: 2, distillation: { teacher, coef: 1, rewardWeight: 1 } }
      }),
      (config) => TrainConfig.onModel(config, folder.config)
    )
  return { dir, folder, train, configOf }
})

/** Two steps of a run with the given teacher: each step samples two groups with the student, then learns. */
const twoSteps = (f: Effect.Success<typeof fixture>, teacher: unknown) =>
  Effect.scoped(Effect.gen(function*() {
    const config = yield* f.configOf(teacher)
    const { learner, versions, sampler } = yield* LocalPolicy.make(f.folder, config)
    const agent = yield* RolloutSetup.make({
      task: CalculatorTask.make(),
      config,
      format: ChainFormat.ofConfig(config, f.folder)
    })
    const outcomes = []
    for (const step of [1, 2]) {
      yield* versions.publish(step - 1)
      const groups = yield* Effect.provideService(
        Rollouts.collectGroups(agent, f.train.rows.slice(2 * step - 2, 2 * step), {
          firstSeq: 0,
          chains: 3,
          temperature: 1,
          seed: 77 + step
        }),
        Sampler,
        sampler
      )
      outcomes.push(yield* learner.learn(step, groups))
    }
    return outcomes
  }))

describe("distillation from agentfly serve", () => {
  it.live("the served teacher trains a run and reports learner/teacher_kl, as the same teacher scored here", () =>
    Effect.gen(function*() {
      const f = yield* fixture
      const teacherDir = join(f.dir, "teacher")
      const teacherFolder = yield* ModelFolder.load(teacherDir)
      const served = yield* Effect.scoped(Effect.gen(function*() {
        const engine = yield* makeEngine({ config: teacherFolder.config, weights: teacherFolder.weights })
        const server = yield* OpenAiServer.make(teacherFolder).pipe(Effect.provideService(PolicyEngine, engine))
        return yield* twoSteps(f, { url: server.baseUrl, model: teacherFolder.name })
      }))
      const local = yield* twoSteps(f, { path: teacherDir })
      for (const [i, outcome] of served.entries()) {
        assert.strictEqual(outcome._tag, "Applied", JSON.stringify(outcome))
        const kl = outcome.figures["learner/teacher_kl"]!
        assert.isTrue(Number.isFinite(kl), `step ${i + 1} reports the teacher's KL`)
        // another model's samples: the student's tokens are likelier under itself than under the teacher
        assert.isAbove(kl, 0.01)
        assert.approximately(kl, local[i]!.figures["learner/teacher_kl"]!, 1e-3, `step ${i + 1}: served = local`)
      }
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.live("a server that cannot score (an engine on another thread) refuses the run at its start", () =>
    Effect.gen(function*() {
      const f = yield* fixture
      const teacherFolder = yield* ModelFolder.load(join(f.dir, "teacher"))
      const error = yield* Effect.scoped(Effect.gen(function*() {
        const engine = yield* makeEngine({ config: teacherFolder.config, weights: teacherFolder.weights })
        const { score: _score, ...noScore } = engine
        const server = yield* OpenAiServer.make(teacherFolder).pipe(
          Effect.provideService(PolicyEngine, PolicyEngine.of(noScore))
        )
        return yield* Effect.flip(twoSteps(f, { url: server.baseUrl, model: teacherFolder.name }))
      }))
      assert.instanceOf(error, RunError.RunError)
      assert.match(error.message, /^algorithm\.distillation: .*cannot score prompts/)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})
