/**
 * `agentfly serve` as a distillation teacher: vLLM's `prompt_logprobs` on `/v1/completions` and `/tokenize`, read
 * by the project's own teacher client (`OpenAiCompatSampler.makePromptScorer` / `makeTokenize`), equal to the
 * engine's and the learner's logprobs of the same tokens under the same weights; the edge cases refused by name.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, FileSystem } from "effect"
import * as Teacher from "../../actors/internal/teacher.ts"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { make as makeEngine, PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as OpenAiCompatSampler from "../../src/backends/OpenAiCompatSampler.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { scriptedEngine } from "../utils/scriptedEngine.ts"

const setup = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-plp-" })}/tiny-test`
  yield* ModelFolder.init(dir, { preset: "tiny", seed: 3 })
  const folder = yield* ModelFolder.load(dir)
  const engine = yield* makeEngine({ config: folder.config, weights: folder.weights, maxBatchSize: 4 })
  const server = yield* OpenAiServer.make(folder).pipe(Effect.provideService(PolicyEngine, engine))
  return { folder, engine, server }
})

interface Body {
  readonly error?: { readonly message: string; readonly param: string | null }
  readonly choices?: ReadonlyArray<{
    readonly text: string
    readonly token_ids: ReadonlyArray<number>
    readonly prompt_logprobs?: ReadonlyArray<
      Record<string, { readonly logprob: number; readonly rank: number; readonly decoded_token: string }> | null
    >
  }>
  readonly tokens?: ReadonlyArray<number>
  readonly count?: number
}

const post = (url: string, body: unknown, method = "POST") =>
  Effect.promise(async () => {
    const response = await fetch(url, {
      method,
      headers: { "content-type": "application/json" },
      body: method === "GET" ? null : JSON.stringify(body)
    })
    return { status: response.status, json: (await response.json()) as Body }
  })

const live = Effect.provide([NodeServices.layer, NodeHttpClient.layerFetch])

describe("agentfly serve: prompt logprobs", () => {
  it.live("a sampled continuation scored back gets the engine's own logprobs, and the learner's", () =>
    live(Effect.gen(function*() {
      const { folder, engine, server } = yield* setup
      const prompt = folder.tokenizer.encode("Compute 12 * 7 with the calculator.")
      const sampled = yield* engine.generate({
        promptTokenIds: prompt,
        sampling: { temperature: 1, maxTokens: 10, seed: 11 }
      })
      const ids = [...prompt, ...sampled.tokenIds]
      const scorer = yield* OpenAiCompatSampler.makePromptScorer({ baseUrl: server.baseUrl, model: "tiny-test" })
      const served = yield* scorer(ids)
      assert.strictEqual(served.length, ids.length)
      assert.isNull(served[0])
      // the engine's logprob of each token it sampled at temperature 1
      sampled.logprobs.forEach((lp, i) => assert.approximately(served[prompt.length + i]!, lp, 1e-4, `token ${i}`))
      // the learner's forward pass over the same weights, every position
      const reference = yield* OnnxTrainer.makeReference(OnnxTrainer.qwen2(folder.config), folder.weights, {
        intraOpThreads: 1
      })
      const [learner] = yield* Teacher.fromMicroBatches("learner", reference, {
        tokenBudget: 64,
        maxLength: folder.config.maxPositionEmbeddings
      }).score([ids])
      for (let t = 1; t < ids.length; t++) assert.approximately(served[t]!, learner![t]!, 1e-4, `position ${t}`)
      // /tokenize as the teacher's tokenizer check asks it
      const tokenize = yield* OpenAiCompatSampler.makeTokenize({ baseUrl: server.baseUrl, model: "tiny-test" })
      const text = "Beispiel: 3 + 4 = 7 — 你好"
      assert.deepStrictEqual(yield* tokenize(text), folder.tokenizer.encode(text))
    })), 120_000)

  it.live("vLLM's shape: null first, the token keyed by id with its rank, k alternatives; sampling unchanged", () =>
    live(Effect.gen(function*() {
      const { server } = yield* setup
      const url = `${server.baseUrl}/completions`
      const base = { model: "tiny-test", prompt: [5, 17, 200, 31, 9], max_tokens: 6, seed: 4, ignore_eos: true }
      const plain = yield* post(url, base)
      const scored = yield* post(url, { ...base, prompt_logprobs: 2 })
      assert.strictEqual(scored.status, 200, JSON.stringify(scored.json))
      const choice = scored.json.choices![0]!
      assert.deepStrictEqual(choice.token_ids, plain.json.choices![0]!.token_ids, "the sample is the same")
      assert.isUndefined(plain.json.choices![0]!.prompt_logprobs, "nothing added unless asked")
      const entries = choice.prompt_logprobs!
      assert.strictEqual(entries.length, 5)
      assert.isNull(entries[0])
      for (let t = 1; t < 5; t++) {
        const entry = entries[t]!
        const own = entry[String(base.prompt[t])]!
        assert.isAtMost(own.logprob, 0)
        assert.isAtLeast(own.rank, 1)
        const keys = Object.keys(entry)
        assert.isAtMost(keys.length, 3)
        const ranks = Object.values(entry).map((e) => e.rank).sort((a, b) => a - b)
        assert.deepStrictEqual(ranks.slice(0, 2), [1, 2], "the two likeliest, ranked")
        const best = Object.values(entry).find((e) => e.rank === 1)!
        assert.isAtLeast(best.logprob, own.logprob)
        assert.isString(best.decoded_token)
      }
      // raw logprobs (vLLM's): the same whatever temperature the request samples with
      const cold = yield* post(url, { ...base, temperature: 0.3, prompt_logprobs: 0 })
      const warm = yield* post(url, { ...base, prompt_logprobs: 0 })
      assert.deepStrictEqual(cold.json.choices![0]!.prompt_logprobs, warm.json.choices![0]!.prompt_logprobs)
      assert.strictEqual(Object.keys(warm.json.choices![0]!.prompt_logprobs![1]!).length, 1, "k = 0: the token only")
      // a text prompt is scored as its tokens
      const text = yield* post(url, { model: "tiny-test", prompt: "two words", max_tokens: 1, prompt_logprobs: 0 })
      assert.strictEqual(text.json.choices![0]!.prompt_logprobs!.length, (yield* post(
        `${server.baseUrl.replace(/\/v1$/, "")}/tokenize`,
        { model: "tiny-test", prompt: "two words" }
      )).json.count)
    })), 120_000)

  it.live("refused by name: streamed, out of range, on chat, /tokenize of messages, an engine that cannot score", () =>
    live(Effect.gen(function*() {
      const { folder, server } = yield* setup
      const url = `${server.baseUrl}/completions`
      const base = { model: "tiny-test", prompt: [5, 17, 200], max_tokens: 2 }
      const refused = (r: { status: number; json: Body }, param: string, pattern: RegExp) => {
        assert.strictEqual(r.status, 400, JSON.stringify(r.json))
        assert.strictEqual(r.json.error!.param, param)
        assert.match(r.json.error!.message, pattern)
      }
      refused(yield* post(url, { ...base, prompt_logprobs: 1, stream: true }), "prompt_logprobs", /stream: true/)
      refused(yield* post(url, { ...base, prompt_logprobs: 21 }), "prompt_logprobs", /\[0, 20\].*got 21/)
      refused(yield* post(url, { ...base, prompt_logprobs: -1 }), "prompt_logprobs", /got -1/)
      refused(yield* post(url, { ...base, prompt_logprobs: "all" }), "prompt_logprobs", /prompt_logprobs/)
      const chat = yield* post(`${server.baseUrl}/chat/completions`, {
        model: "tiny-test",
        messages: [{ role: "user", content: "hi" }],
        prompt_logprobs: 0
      })
      assert.strictEqual(chat.status, 400)
      assert.match(chat.json.error!.message, /prompt_logprobs/)
      const root = server.baseUrl.replace(/\/v1$/, "")
      refused(yield* post(`${root}/tokenize`, { messages: [] }), "messages", /takes a prompt/)
      assert.strictEqual((yield* post(`${root}/tokenize`, {}, "GET")).status, 405)
      // An engine without `score` (one on another thread): a clear 400, which the teacher reads as Unsupported.
      const noScore = scriptedEngine(folder, () => Effect.die("not sampled"))
      const other = yield* OpenAiServer.make(folder).pipe(Effect.provideService(PolicyEngine, noScore))
      refused(
        yield* post(`${other.baseUrl}/completions`, { ...base, prompt_logprobs: 0 }),
        "prompt_logprobs",
        /cannot score prompts/
      )
    })), 120_000)

  it.live("a weight update while scoring: the scoring ends on its weights, then the old session is released", () =>
    live(Effect.gen(function*() {
      const { folder, engine } = yield* setup
      const ids = Array.from({ length: folder.config.maxPositionEmbeddings }, (_, i) => 10 + (i % 200))
      const before = yield* engine.score!(ids)
      const scoring = yield* Effect.forkChild(engine.score!(ids))
      const shifted = new Map([...folder.weights].map(([name, w]) => [name, w.map((x) => x * 0.5)]))
      yield* engine.updateWeights(1, shifted)
      // A request makes the decode loop take a turn, in which it releases old sessions nothing decodes on.
      yield* engine.generate({ promptTokenIds: [1, 2], sampling: { temperature: 0, maxTokens: 1 } })
      assert.isUndefined(scoring.pollUnsafe(), "still scoring (512 runs) while the loop took its turn")
      assert.strictEqual((yield* engine.stats).sessions, 2, "the scored version's session is kept")
      const during = yield* Fiber.join(scoring)
      // started on version 0: its scores are version 0's to the end; a new scoring uses version 1
      for (let t = 1; t < ids.length; t++) assert.approximately(during[t]!.logprob, before[t]!.logprob, 1e-6)
      const after = yield* engine.score!(ids.slice(0, 8))
      assert.isAbove(Math.abs(after[5]!.logprob - before[5]!.logprob), 1e-3)
      assert.strictEqual((yield* engine.stats).sessions, 1, "released when its scoring ended")
    })), 120_000)
})
