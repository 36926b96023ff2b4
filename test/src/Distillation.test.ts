/**
 * On-policy distillation's pure parts, and the prompt-logprob calls of the OpenAI-compatible backend against a real
 * HTTP server started by the test (127.0.0.1, port 0) playing vLLM, one without prompt logprobs, and one refusing them.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import * as OpenAiCompatSampler from "../../src/backends/OpenAiCompatSampler.ts"
import * as Distillation from "../../src/Distillation.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"

describe("Distillation maths", () => {
  it("reverseKlAdvantages: −β·(log π_student − log π_teacher) on sampled tokens only; mix weighs the task's", () => {
    const student = Float64Array.of(-1, -2, -0.5, -3)
    const teacher = Float64Array.of(-9, -1, -0.25, -4)
    const mask = Uint8Array.of(0, 1, 1, 1)
    const kl = Distillation.reverseKlAdvantages(student, teacher, mask, 0.5)
    // a token the teacher likes more than the student gains, one it likes less loses; unsampled tokens get nothing
    assert.deepStrictEqual([...kl], [0, 0.5, 0.125, -0.5])
    assert.deepStrictEqual([...Distillation.mix(Float64Array.of(1, 1, 1, 1), kl, 0.25)], [0.25, 0.75, 0.375, -0.25])
    assert.deepStrictEqual([...Distillation.mix(Float64Array.of(1, 1, 1, 1), kl, 0)], [0, 0.5, 0.125, -0.5])
  })

  it.effect("fromPromptLogprobs: one logprob per token, NaN for the first; a short or holey answer is Misaligned", () =>
    Effect.gen(function*() {
      const answers: Record<string, ReadonlyArray<number | null>> = {
        "1,2,3": [null, -0.5, -0.25],
        "4,5": [null],
        "6,7": [null, null]
      }
      const teacher = Distillation.fromPromptLogprobs("t", (ids) => Effect.succeed(answers[ids.join(",")]!))
      const [scores] = yield* teacher.score([Int32Array.of(1, 2, 3)])
      assert.isTrue(Number.isNaN(scores![0]!))
      assert.deepStrictEqual([...scores!.subarray(1)], [-0.5, -0.25])
      const short = yield* Effect.flip(teacher.score([[1, 2, 3], [4, 5]]))
      assert.strictEqual(short.reason._tag, "Misaligned")
      assert.include(short.message, "answered 1 prompt logprobs for 2 tokens")
      const holey = yield* Effect.flip(teacher.score([[6, 7]]))
      assert.strictEqual(holey.reason._tag, "Misaligned")
      assert.include(holey.message, "no logprob for token 1 (id 7)")
    }))

  it.effect("checkTokenizers: the same ids pass; the first probe that differs is a TokenizerMismatch naming it", () =>
    Effect.gen(function*() {
      const bytes = (text: string) => [...new TextEncoder().encode(text)]
      yield* Distillation.checkTokenizers(bytes, (text) => Effect.succeed(bytes(text)))
      const other = (text: string) => Effect.succeed(text.includes("7*6") ? bytes(text).slice(1) : bytes(text))
      const error = yield* Effect.flip(Distillation.checkTokenizers(bytes, other))
      assert.strictEqual(error.reason._tag, "TokenizerMismatch")
      assert.include(error.reason._tag === "TokenizerMismatch" ? error.reason.probe : "", "7*6")
      assert.include(error.message, "on-policy distillation needs one tokenizer")
    }))
})

/** A throwaway loopback server answering `answer(path, body)`. */
const testServer = (answer: (path: string, body: any) => { readonly status: number; readonly json: unknown }) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly baseUrl: string; readonly seen: Array<any>; readonly close: () => void }>((resume) => {
      const seen: Array<any> = []
      const server = createServer((req, res) => {
        let raw = ""
        req.on("data", (chunk) => (raw += chunk))
        req.on("end", () => {
          const body = JSON.parse(raw)
          seen.push({ path: req.url, body })
          const { status, json } = answer(req.url ?? "", body)
          res.writeHead(status, { "content-type": "application/json" })
          res.end(JSON.stringify(json))
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo
        resume(Effect.succeed({
          baseUrl: `http://127.0.0.1:${port}/v1`,
          seen,
          close: () => {
            server.closeAllConnections()
            server.close()
          }
        }))
      })
    }),
    (server) => Effect.sync(server.close)
  )

const live = <A, E>(effect: Effect.Effect<A, E, any>) =>
  effect.pipe(Effect.provide(NodeHttpClient.layerNodeHttp), Effect.scoped) as Effect.Effect<A, E>

/** vLLM's `prompt_logprobs` for `ids`: null first, then `{ "<id>": { logprob } }` with logprob −id/100. */
const vllmPromptLogprobs = (ids: ReadonlyArray<number>) =>
  ids.map((id, i) => (i === 0 ? null : { [String(id)]: { logprob: -id / 100, rank: 1, decoded_token: "x" } }))

describe("OpenAiCompatSampler prompt logprobs (a teacher's scores)", () => {
  it.live("asks for prompt_logprobs of the given ids and reads each token's own entry", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer((_, body) => ({
        status: 200,
        json: { choices: [{ text: "!", prompt_logprobs: vllmPromptLogprobs(body.prompt) }] }
      }))
      const score = yield* OpenAiCompatSampler.makePromptScorer({ baseUrl: server.baseUrl, model: "teacher" })
      assert.deepStrictEqual(yield* score([5, 17, 230]), [null, -0.17, -2.3])
      const body = server.seen[0]!.body
      assert.strictEqual(server.seen[0]!.path, "/v1/completions")
      assert.deepStrictEqual([body.prompt, body.prompt_logprobs, body.max_tokens], [[5, 17, 230], 0, 1])
    })))

  it.live("a server answering without prompt logprobs is NoPromptLogprobs; one refusing the field is BadRequest", () =>
    live(Effect.gen(function*() {
      const plain = yield* testServer(() => ({ status: 200, json: { choices: [{ text: "!", logprobs: null }] } }))
      const score = yield* OpenAiCompatSampler.makePromptScorer({ baseUrl: plain.baseUrl, model: "m" })
      const none = yield* Effect.flip(score([1, 2]))
      assert.strictEqual(none.reason._tag, "NoPromptLogprobs")
      assert.include(none.message, "answered without prompt_logprobs")
      const refusing = yield* testServer(() => ({ status: 400, json: { error: { message: "unknown field" } } }))
      const refused = yield* Effect.flip(
        (yield* OpenAiCompatSampler.makePromptScorer({ baseUrl: refusing.baseUrl, model: "m" }))([1, 2])
      )
      assert.strictEqual(refused.reason._tag, "BadRequest")
    })))

  it.live("tokenize posts the text to the server's root /tokenize without special tokens", () =>
    live(Effect.gen(function*() {
      const server = yield* testServer(() => ({ status: 200, json: { tokens: [9, 8, 7], count: 3 } }))
      const tokenize = yield* OpenAiCompatSampler.makeTokenize({ baseUrl: server.baseUrl, model: "m" })
      assert.deepStrictEqual(yield* tokenize("hi"), [9, 8, 7])
      assert.strictEqual(server.seen[0]!.path, "/tokenize")
      assert.deepStrictEqual(server.seen[0]!.body, { model: "m", prompt: "hi", add_special_tokens: false })
    })))
})

describe("algorithm.distillation in a config", () => {
  const minimal = {
    output: "runs/x",
    model: { path: "model", preset: "tiny" },
    data: { train: "data/train.jsonl" },
    task: "calculator"
  }

  it.effect("a folder teacher's path and checkpoint resolve as the model's; a server teacher is left as given", () =>
    Effect.gen(function*() {
      const local = yield* TrainConfig.decode({
        ...minimal,
        algorithm: {
          steps: 1,
          distillation: { teacher: { path: "teacher", checkpoint: "run/checkpoints/step-000020" } }
        }
      })
      const resolved = TrainConfig.resolvePaths(local, (p) => `/configs/${p}`)
      assert.deepStrictEqual(resolved.algorithm.distillation, {
        teacher: { path: "/configs/teacher", checkpoint: "/configs/run/checkpoints/step-000020" }
      })
      const server = yield* TrainConfig.decode({
        ...minimal,
        algorithm: { steps: 1, distillation: { teacher: { url: "http://10.0.0.2:8000/v1", model: "big" }, coef: 0.5 } }
      })
      assert.deepStrictEqual(TrainConfig.resolvePaths(server, (p) => `/configs/${p}`).algorithm.distillation, {
        teacher: { url: "http://10.0.0.2:8000/v1", model: "big" },
        coef: 0.5
      })
      // no distillation: the algorithm section is the decoded one, untouched
      const plain = yield* TrainConfig.decode({ ...minimal, algorithm: { steps: 1 } })
      assert.strictEqual(TrainConfig.resolvePaths(plain, (p) => p).algorithm, plain.algorithm)
    }))

  it.effect("a bad teacher or weight is rejected with its path", () =>
    Effect.gen(function*() {
      const url = yield* Effect.flip(TrainConfig.decode({
        ...minimal,
        algorithm: { steps: 1, distillation: { teacher: { url: "10.0.0.2:8000", model: "big" } } }
      }))
      assert.match(url.issues.join("\n"), /algorithm\.distillation\.teacher/)
      const coef = yield* Effect.flip(TrainConfig.decode({
        ...minimal,
        algorithm: { steps: 1, distillation: { teacher: { path: "t" }, coef: -1 } }
      }))
      assert.match(coef.issues.join("\n"), /^algorithm\.distillation\.coef/m)
    }))
})
