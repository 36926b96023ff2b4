/**
 * On-policy distillation in the learner: the teacher is given each segment's exact token ids and its scores land on
 * the same tokens as the sampler's logprobs (prompt, tool and template tokens never count); a local teacher's
 * positions line up with the trainer's own logprobs; a server that cannot score or tokenize refuses at the start.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, Path, Ref } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import * as Teacher from "../../actors/internal/teacher.ts"
import * as Learner from "../../actors/Learner.ts"
import {
  Distillation,
  GradientBackend,
  Loss,
  LrSchedule,
  OnnxTrainer,
  Optimizer,
  Packing,
  Qwen2
} from "../../src/index.ts"
import type { Trajectory } from "../../src/index.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { tinyConfig } from "../utils/tinyModel.ts"

/** A two-segment trajectory: prompt, policy, tool, policy | a rewritten prompt, policy. */
const trajectory = (id: string, reward: number, base: number): Trajectory.Trajectory => ({
  trajectoryId: id,
  groupId: "g",
  chainId: id,
  messages: [],
  segments: [
    {
      spans: [
        { source: "prompt", tokenIds: [1, 2] },
        { source: "policy", tokenIds: [base, base + 1], logprobs: [-1, -2], policyVersion: 0 },
        { source: "tool", tokenIds: [3] },
        { source: "policy", tokenIds: [base + 2], logprobs: [-3], policyVersion: 0 }
      ],
      messageCount: 0
    },
    {
      spans: [
        { source: "prompt", tokenIds: [4] },
        { source: "policy", tokenIds: [base + 3], logprobs: [-4], policyVersion: 0 }
      ],
      messageCount: 0
    }
  ],
  termination: "answer",
  reward,
  rewardStatus: "scored",
  metrics: {},
  trainable: true,
  masked: false
})

describe("Learner.update with a teacher", () => {
  it.effect("each policy token's advantage is rewardWeight·A + β·(teacher − sampler) for that very token", () =>
    Effect.gen(function*() {
      const recording = yield* GradientBackend.RecordingRef
      const asked: Array<ReadonlyArray<number>> = []
      // The teacher's logprob of token id x at position j: −x/10 − j/100 (position-dependent, to catch shifts).
      const teacher: Distillation.Teacher = {
        name: "fake",
        score: (sequences) =>
          Effect.sync(() =>
            sequences.map((ids) => {
              asked.push(Array.from(ids))
              return Float64Array.from(ids, (x, j) => (j === 0 ? Number.NaN : -x / 10 - j / 100))
            })
          )
      }
      const group = { groupId: "g", rowIndex: 0, trajectories: [trajectory("a", 1, 10), trajectory("b", 0, 20)] }
      const result = yield* Learner.update([group], {
        estimator: "grpo-no-std",
        loss: Loss.grpo,
        tokenBudget: 64,
        distillation: { teacher, coef: 0.5, rewardWeight: 2 }
      })
      assert.strictEqual(result.outcome, "applied")
      // the exact token ids of every segment, in order
      assert.deepStrictEqual(asked, [[1, 2, 10, 11, 3, 12], [4, 13], [1, 2, 20, 21, 3, 22], [4, 23]])
      const { microBatches } = yield* Ref.get(recording)
      const seen = new Map<number, number>()
      for (const mb of microBatches) {
        for (let i = 0; i < mb.mask.length; i++) if (mb.mask[i]) seen.set(mb.targets[i]!, mb.advantages[i]!)
      }
      // policy tokens only: prompt (1, 2, 4) and tool (3) tokens are not trained
      assert.deepStrictEqual([...seen.keys()].sort((x, y) => x - y), [10, 11, 12, 13, 20, 21, 22, 23])
      // token → (its position in its segment, its sampler logprob); grpo-no-std: A = ±0.5 around the mean reward
      const where: Record<number, [number, number]> = { 0: [2, -1], 1: [3, -2], 2: [5, -3], 3: [1, -4] }
      for (const [base, a] of [[10, 0.5], [20, -0.5]] as const) {
        for (let k = 0; k < 4; k++) {
          const [j, sampler] = where[k]!
          const teacherLp = -(base + k) / 10 - j / 100
          assert.approximately(seen.get(base + k)!, 2 * a + 0.5 * (teacherLp - sampler), 1e-6, `token ${base + k}`)
        }
      }
      // the reverse KL's estimate: mean of sampler − teacher over the 8 policy tokens
      const expected = [10, 20].flatMap((base) =>
        [0, 1, 2, 3].map((k) => where[k]![1] - (-(base + k) / 10 - where[k]![0] / 100))
      ).reduce((x, y) => x + y, 0) / 8
      assert.approximately(result.figures["learner/teacher_kl"]!, expected, 1e-9)
    }).pipe(Effect.provide(GradientBackend.layerRecording())))

  it.effect("equal rewards still train (the teacher scores every token); a teacher that fails fails the step", () =>
    Effect.gen(function*() {
      const flat: Distillation.Teacher = {
        name: "flat",
        score: (sequences) => Effect.succeed(sequences.map((ids) => new Float64Array(ids.length).fill(-0.1)))
      }
      const group = { groupId: "g", rowIndex: 0, trajectories: [trajectory("a", 1, 10), trajectory("b", 1, 20)] }
      const options: Learner.Options = { estimator: "grpo", loss: Loss.grpo, tokenBudget: 64 }
      assert.strictEqual((yield* Learner.update([group], options)).outcome, "empty")
      const distilled = { teacher: flat, coef: 1, rewardWeight: 1 }
      assert.strictEqual((yield* Learner.update([group], { ...options, distillation: distilled })).outcome, "applied")
      const broken: Distillation.Teacher = {
        name: "broken",
        score: () => Effect.fail(Distillation.distillationError("TeacherFailed", "connection refused"))
      }
      const error = yield* Effect.flip(
        Learner.update([group], { ...options, distillation: { ...distilled, teacher: broken } })
      )
      assert.strictEqual(error.reason._tag, "Trainer")
      assert.include(error.message, "teacher: connection refused")
    }).pipe(Effect.provide(GradientBackend.layerRecording())))
})

describe("a local teacher", () => {
  const config = tinyConfig({
    vocabSize: 32,
    hiddenSize: 16,
    numAttentionHeads: 2,
    numKeyValueHeads: 1,
    intermediateSize: 32,
    numHiddenLayers: 1
  })

  it.effect("scores token j with the model's logprob of it after tokens < j, sequences of any length", () =>
    Effect.gen(function*() {
      const weights = Qwen2.initWeights(config, 5)
      const score = yield* OnnxTrainer.makeReference(OnnxTrainer.qwen2(config), weights)
      const teacher = Teacher.fromMicroBatches("local", score, { tokenBudget: 24, maxLength: 64 })
      const sequences = [[3, 9, 4, 1, 7], [8, 2], [5, 5, 5, 6, 30, 31, 2, 9, 11]]
      const scores = yield* teacher.score(sequences)
      // the same logprobs from the trainer itself, one sequence at a time, every token a target
      const trainer = yield* OnnxTrainer.make({
        model: OnnxTrainer.qwen2(config),
        weights,
        loss: Loss.sft,
        optimizer: Optimizer.defaultConfig,
        schedule: LrSchedule.constant(0)
      })
      for (const [k, ids] of sequences.entries()) {
        assert.strictEqual(scores[k]!.length, ids.length)
        assert.isTrue(Number.isNaN(scores[k]![0]!))
        const mb = Packing.packUnsafe([{
          tokenIds: Int32Array.from(ids),
          lossMask: Uint8Array.from(ids, (_, i) => (i === 0 ? 0 : 1))
        }], { tokenBudget: 64, aggregation: "token-mean" }).microBatches[0]!
        const { tokenLogprobs } = yield* trainer.logprobs(mb)
        for (let j = 1; j < ids.length; j++) {
          assert.approximately(scores[k]![j]!, tokenLogprobs[j - 1]!, 1e-5, `sequence ${k} token ${j}`)
        }
      }
    }).pipe(Effect.provide(NodeServices.layer)), 120_000)

  it.effect("a model folder with the student's tokenizer is accepted; a missing folder is TeacherFailed", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const path = yield* Path.Path
      const dir = yield* fs.makeTempDirectoryScoped()
      yield* ModelFolder.init(path.join(dir, "teacher"), { preset: "tiny", seed: 2 })
      yield* ModelFolder.init(path.join(dir, "student"), { preset: "tiny", seed: 3 })
      const student = yield* ModelFolder.load(path.join(dir, "student"))
      const options = { tokenBudget: 256, intraOpThreads: 1 }
      const teacher = yield* Teacher.make({ path: path.join(dir, "teacher") }, student, options)
      const [scores] = yield* teacher.score([student.tokenizer.encode("7*6=42")])
      assert.isTrue(scores!.subarray(1).every((lp) => Number.isFinite(lp) && lp < 0))
      const missing = yield* Effect.flip(Teacher.make({ path: path.join(dir, "nothing") }, student, options))
      assert.strictEqual(missing.reason._tag, "TeacherFailed")
      assert.include(missing.message, "cannot load the teacher's model folder")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 120_000)
})

/** A loopback server: `/tokenize` answers `tokens(text)`, `/v1/completions` answers `completion(ids)`. */
const server = (
  tokens: (text: string) => ReadonlyArray<number> | undefined,
  completion: (ids: ReadonlyArray<number>) => { readonly status: number; readonly json: unknown }
) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly url: string; readonly close: () => void }>((resume) => {
      const s = createServer((req, res) => {
        let raw = ""
        req.on("data", (chunk) => (raw += chunk))
        req.on("end", () => {
          const body = JSON.parse(raw)
          const ids = req.url === "/tokenize" ? tokens(body.prompt) : undefined
          const notFound = { status: 404, json: { detail: "Not Found" } }
          const answer = req.url === "/tokenize"
            ? (ids === undefined ? notFound : { status: 200, json: { tokens: ids } })
            : completion(body.prompt)
          res.writeHead(answer.status, { "content-type": "application/json" })
          res.end(JSON.stringify(answer.json))
        })
      })
      s.listen(0, "127.0.0.1", () => {
        const { port } = s.address() as AddressInfo
        resume(Effect.succeed({
          url: `http://127.0.0.1:${port}/v1`,
          close: () => {
            s.closeAllConnections()
            s.close()
          }
        }))
      })
    }),
    (s) => Effect.sync(s.close)
  )

describe("a teacher behind an OpenAI-compatible server", () => {
  const vllm = (ids: ReadonlyArray<number>) => ({
    status: 200,
    json: { choices: [{ prompt_logprobs: ids.map((id, i) => (i === 0 ? null : { [String(id)]: { logprob: -1 } })) }] }
  })

  it.effect("one that tokenizes as the student and answers prompt logprobs is a teacher", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      yield* ModelFolder.init(`${dir}/student`, { preset: "tiny", seed: 3 })
      const student = yield* ModelFolder.load(`${dir}/student`)
      const s = yield* server((text) => student.tokenizer.encode(text), vllm)
      const teacher = yield* Teacher.make({ url: s.url, model: "big" }, student, { tokenBudget: 64, intraOpThreads: 1 })
      const [scores] = yield* teacher.score([[5, 6, 7]])
      assert.deepStrictEqual([...scores!.subarray(1)], [-1, -1])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.effect("refusals at the start: another tokenizer, no /tokenize, no prompt logprobs", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      yield* ModelFolder.init(`${dir}/student`, { preset: "tiny", seed: 3 })
      const student = yield* ModelFolder.load(`${dir}/student`)
      const options = { tokenBudget: 64, intraOpThreads: 1 }
      const other = yield* server((text) => student.tokenizer.encode(text).map((id) => id + 1), vllm)
      const mismatch = yield* Effect.flip(Teacher.make({ url: other.url, model: "big" }, student, options))
      assert.strictEqual(mismatch.reason._tag, "TokenizerMismatch")
      const noTokenize = yield* server(() => undefined, vllm)
      const unchecked = yield* Effect.flip(Teacher.make({ url: noTokenize.url, model: "big" }, student, options))
      assert.strictEqual(unchecked.reason._tag, "Unsupported")
      assert.include(unchecked.message, "cannot tokenize")
      const openAiLike = yield* server(
        (text) => student.tokenizer.encode(text),
        () => ({ status: 200, json: { choices: [{ text: "!" }] } })
      )
      const noLogprobs = yield* Effect.flip(Teacher.make({ url: openAiLike.url, model: "big" }, student, options))
      assert.strictEqual(noLogprobs.reason._tag, "Unsupported")
      assert.include(noLogprobs.message, "answered without prompt_logprobs")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
})
