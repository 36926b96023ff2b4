/**
 * `agentfly serve` with image parts, through the `openai` SDK: a text-only model answers 400 naming the model and
 * why; a vision model's prompt holds one `<|image_pad|>` per merged patch between `<|vision_start|>` and
 * `<|vision_end|>`; a remote URL and corrupt bytes are 400s naming what was wrong.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect, FileSystem } from "effect"
import OpenAI from "openai"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import { PolicyEngine } from "../../actors/PolicyEngine.ts"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import type { GenerateRequest } from "../../src/Sampler.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import { scriptedEngine } from "../utils/scriptedEngine.ts"

const canvas = createCanvas(16, 8)
canvas.getContext("2d").fillRect(0, 0, 16, 8)
const dataUrl = `data:image/png;base64,${canvas.toBuffer("image/png").toString("base64")}`

/** A server over the tiny folder (text-only, or with the vision specials and template); the prompts it sampled. */
const setup = (vision: boolean) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-serve-images-" })}/tiny-test`
    yield* ModelFolder.init(dir, { preset: "tiny", seed: 3 })
    const folder = yield* ModelFolder.load(dir)
    const tokenizer = vision
      ? yield* Tokenizer.make(
        ByteTokenizer.tokenizerJson({ specialTokens: ByteTokenizer.visionSpecialTokens }),
        ByteTokenizer.tokenizerConfig("")
      )
      : folder.tokenizer
    const template = vision
      ? ChatTemplate.withVision(folder.template, {
        ...ChatTemplate.qwenVisionTokens,
        geometry: { patchSize: 4, mergeSize: 2, minPixels: 64, maxPixels: 32 * 32 }
      })
      : folder.template
    const prompts: Array<ReadonlyArray<number>> = []
    const end = tokenizer.tokenToId("<|im_end|>")!
    const scripted = scriptedEngine(folder, (request: GenerateRequest) =>
      Effect.sync(() => {
        prompts.push(request.promptTokenIds)
        return { tokenIds: [111, end], logprobs: [-0.5, -0.5], finishReason: "stop" as const, policyVersion: 9 }
      }))
    // The vision specials widen the vocabulary by three ids (a vision preset's embedding has them).
    const engine = { ...scripted, config: { ...scripted.config, vocabSize: tokenizer.vocabSize } }
    const server = yield* OpenAiServer.make({ ...folder, tokenizer, template }).pipe(
      Effect.provideService(PolicyEngine, engine)
    )
    return { client: new OpenAI({ baseURL: server.baseUrl, apiKey: "unused", maxRetries: 0 }), prompts, tokenizer }
  })

const ask = (client: OpenAI, url: string) =>
  Effect.promise(() =>
    client.chat.completions.create({
      model: "tiny-test",
      messages: [{
        role: "user",
        content: [{ type: "text", text: "How many?" }, { type: "image_url", image_url: { url } }]
      }]
    }).then((r) => r, (e: unknown) => e as Error)
  )

describe("OpenAiServer: images", () => {
  it.live("a text-only model answers 400 naming the model and why; nothing is sampled", () =>
    Effect.gen(function*() {
      const { client, prompts } = yield* setup(false)
      const error = yield* ask(client, dataUrl)
      assert.instanceOf(error, OpenAI.BadRequestError)
      assert.include((error as Error).message, "model tiny-test has no vision tower")
      assert.strictEqual(prompts.length, 0)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.live("a vision model's prompt holds the image tokens; remote URLs and corrupt bytes are 400s", () =>
    Effect.gen(function*() {
      const { client, prompts, tokenizer } = yield* setup(true)
      const reply = yield* ask(client, dataUrl)
      assert.notInstanceOf(reply, Error)
      const ids = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"].map((t) => tokenizer.tokenToId(t)!)
      const [start, pad, end] = ids
      const prompt = prompts[0]!
      const at = prompt.indexOf(start!)
      assert.deepStrictEqual(prompt.slice(at, at + 4), [start, pad, pad, end])
      assert.strictEqual(prompt.filter((id) => id === pad).length, 2)
      const remote = yield* ask(client, "http://127.0.0.1:9/x.png")
      assert.instanceOf(remote, OpenAI.BadRequestError)
      assert.include((remote as Error).message, "remote image URL http://127.0.0.1:9/x.png refused")
      const corrupt = yield* ask(client, dataUrl.slice(0, 90))
      assert.instanceOf(corrupt, OpenAI.BadRequestError)
      assert.include((corrupt as Error).message, "does not decode")
      assert.strictEqual(prompts.length, 1)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))
})
